"""Derived wheels for the transfer: the locked wheel's files that one Python loads, stored, then xz-compressed.

Standard library only, like wheelhouse.py and pieces.py beside it (it runs on the GPU host to decompress).

A visit carries at most 64 MiB a call, so every MiB of the stream is a call's
share. DALI's wheel (198 MB, deflate) holds, besides what the host needs, the
Python bindings of seven other CPython ABIs (``backend_impl`` and
``python_function_plugin`` for 3.10, 3.11, 3.13, 3.14, 3.14t, 3.15, 3.15t:
about 40 MiB unpacked) and 14 MiB of C++ headers (``nvidia/dali/include``)
that nothing imports. Every shared library stays: ``readelf -d`` shows
``libdali_operators.so`` needing the avcodec, AWS, Google Cloud and CV-CUDA
libraries of ``nvidia_dali_cuda130.libs`` and ``libdali.so`` the AWS and GCS
ones. And deflate is a weak compressor for those libraries: xz at preset 6
makes ``libdali_operators.so`` 26 % smaller than the wheel's own deflate.

So :func:`derive` writes a wheel with the locked wheel's files in their order,
less what :func:`_dropped` names for the target Python, its ``RECORD``
rewritten to match and ``WHEEL``'s tag narrowed to that Python when ABI files
were dropped; members are stored uncompressed (``ZIP_STORED``) with a fixed
time stamp, so the same locked wheel always gives the same bytes. Its name
carries a build tag (``0slim``, or ``0stored`` when nothing was dropped), so it
never overwrites the locked file beside it, and pip installs it as the same
package and version. :func:`compress` then xz-compresses it (``lzma``,
preset 6, CRC64, one thread: deterministic, so the transfer plan can commit
the sha256 of both the ``.xz`` and the wheel). The locked sha256 in
wheels.lock stays the check of the downloaded original; the derived wheel's
sha256 (in the transfer plan) is checked on the host after
:func:`decompress`.
"""

from __future__ import annotations

import base64
import hashlib
import lzma
import os
import re
import shutil
import zipfile
from pathlib import Path

#: Wheels at least this big are derived and xz-compressed; smaller ones travel as they are (little to gain).
COMPRESS_OVER = 8 << 20
#: xz settings: fixed, single-threaded (Python's lzma has no threads), so the output is reproducible.
XZ_PRESET = 6
#: The zip time stamp of every member of a derived wheel (the earliest a zip can hold).
FIXED_TIME = (1980, 1, 1, 0, 0, 0)
_ABI_MODULE = re.compile(r"\.cpython-(?P<abi>3\d+t?)-[^/]*\.so$")


def _dropped(name: str, python: str) -> bool:
    """Whether a wheel member is left out for CPython ``python`` (``"312"``): another ABI's module, or headers."""
    match = _ABI_MODULE.search(name)
    if match is not None and match["abi"] != python:
        return True
    return "/include/" in f"/{name}" and name.startswith("nvidia/")


def derived_name(original: str, *, slim: bool, python: str) -> str:
    """The derived wheel's file name: the original's with a build tag, and a ``cpXXX`` tag once slimmed."""
    parts = original.removesuffix(".whl").split("-")
    name, version, platform = parts[0], parts[1], parts[-1]
    if slim:
        return f"{name}-{version}-0slim-cp{python}-none-{platform}.whl"
    return f"{name}-{version}-0stored-{'-'.join(parts[-3:])}.whl"


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def derive(original: Path, folder: Path, *, python: str = "312") -> Path:
    """Write the derived (stored, and for ABI-specific wheels slimmed) wheel of ``original`` into ``folder``.

    Args:
        original: a wheel, as downloaded (its sha256 checked against wheels.lock by the caller).
        folder: where the derived wheel goes (a file of that name is replaced).
        python: the CPython ABI kept (``"312"`` for the GPU host, ``"311"`` to test it here).

    Returns:
        The derived wheel's path (:func:`derived_name`).
    """
    with zipfile.ZipFile(original) as source:
        infos = source.infolist()
        keep = [i for i in infos if not _dropped(i.filename, python)]
        slim = len(keep) < len(infos)
        target = folder / derived_name(original.name, slim=slim, python=python)
        dist_info = next(i.filename.split("/")[0] for i in infos if i.filename.endswith(".dist-info/RECORD"))
        replaced: dict[str, bytes] = {}
        if slim:
            wheel_text = source.read(f"{dist_info}/WHEEL").decode("utf-8")
            platform = original.name.removesuffix(".whl").split("-")[-1]
            replaced[f"{dist_info}/WHEEL"] = re.sub(r"(?m)^Tag: .*$", f"Tag: cp{python}-none-{platform}",
                                                    wheel_text).encode("utf-8")
        kept = {i.filename for i in keep}
        lines = []
        for line in source.read(f"{dist_info}/RECORD").decode("utf-8").splitlines():
            path = line.rsplit(",", 2)[0]
            if not line.strip() or path not in kept:
                continue
            if path in replaced:
                line = f"{path},{_record_hash(replaced[path])},{len(replaced[path])}"
            lines.append(line)
        replaced[f"{dist_info}/RECORD"] = "".join(f"{line}\n" for line in lines).encode("utf-8")
        partial = target.with_name(target.name + ".partial")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_STORED) as out:
            for info in keep:
                entry = zipfile.ZipInfo(info.filename, date_time=FIXED_TIME)
                entry.external_attr, entry.create_system = info.external_attr, 3
                entry.compress_type = zipfile.ZIP_STORED
                if info.filename in replaced:
                    out.writestr(entry, replaced[info.filename])
                    continue
                entry.file_size = info.file_size
                with source.open(info) as data, out.open(entry, "w") as sink:
                    shutil.copyfileobj(data, sink, 1 << 20)
    os.replace(partial, target)
    return target


def compress(path: Path) -> Path:
    """``path`` xz-compressed into ``path.xz`` (:data:`XZ_PRESET`; the same bytes on every run)."""
    target = path.with_name(path.name + ".xz")
    partial = target.with_name(target.name + ".partial")
    compressor = lzma.LZMACompressor(format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=XZ_PRESET)
    with open(path, "rb") as source, open(partial, "wb") as sink:
        while block := source.read(1 << 20):
            sink.write(compressor.compress(block))
        sink.write(compressor.flush())
    os.replace(partial, target)
    return target


def decompress(data: bytes, target: Path) -> str:
    """Write the xz ``data`` decompressed to ``target``; returns the written file's sha256.

    Raises:
        lzma.LZMAError: the data is not a whole xz stream (the caller checked its sha256 first, so this means
            the transfer plan and the pieces disagree).
    """
    digest = hashlib.sha256()
    decompressor = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
    partial = target.with_name(target.name + ".partial")
    view = memoryview(data)
    with open(partial, "wb") as sink:
        for start in range(0, len(view), 1 << 22):
            block = decompressor.decompress(view[start:start + (1 << 22)])
            digest.update(block)
            sink.write(block)
    if not decompressor.eof:
        partial.unlink()
        raise lzma.LZMAError(f"{target.name}: the xz stream ends early")
    os.replace(partial, target)
    return digest.hexdigest()
