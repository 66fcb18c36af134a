"""Wheels for a GPU machine that cannot reach a package registry: pack, receive piece by piece, check, install.

Standard library only: it runs on the GPU machine before anything is installed.
``run_gpu_bench.sh`` beside it drives it; it also runs on its own::

    python3 wheelhouse.py prepare --wheels DIR [--flavour cuda13]   # here: download, check, pack (if missing)
    python3 wheelhouse.py pack --wheels DIR [--flavour cuda13]   # here: the pieces + transfer-FLAVOUR.tsv
    python3 wheelhouse.py split FILE [--piece-bytes N]   # here: any other file in pieces + FILE.sha256
    python3 wheelhouse.py receive --wheels DIR --site SITE   # there, each call: new pieces in, wheels installed
    python3 wheelhouse.py check --wheels DIR [--flavour cuda13|cuda12]   # changes nothing
    python3 wheelhouse.py install --wheels DIR --site SITE   # receive, join other split files, install the rest
    python3 wheelhouse.py assemble --wheels DIR          # join FILE.part-aa, -ab, ... of split files

``pack`` puts the wheels the GPU host lacks (the lock's required ones, less
:data:`visit.HOST_PACKAGES`) into one tar stream, smallest first, cut into
pieces that each fill one call (:data:`visit.PIECE_BYTES`), and writes
``transfer-FLAVOUR.tsv`` (tracked in git, it travels with the checkout). The
big wheels (DALI, PyAV) travel derived and xz-compressed (:mod:`slim`: only
what CPython 3.12 loads, stored, then xz; three pieces instead of four). On
the host, ``receive`` checks each piece as it arrives and installs every wheel
the arrived pieces hold whole (:mod:`pieces`; an ``.xz`` member decompressed
and its wheel's sha256 checked first), so by the last piece only DALI is left
to install, and the calls after it only test and measure.

``wheels.lock`` beside this file lists every package the GPU run needs, with
the exact file (for CPython 3.12 on x86-64) and its sha256. A package already
installed (at any version) is used as is; the others are installed with
``pip install --no-index --no-deps --target`` into a staging folder that is
then merged into SITE, a separate folder put first on ``PYTHONPATH``: the
machine's own packages (torch, numpy) are never replaced. (Installing each
wheel with ``--target SITE`` directly would replace SITE's whole ``nvidia``
folder with the newest wheel's, or skip it: pip moves top-level folders.)
Other ``*.whl`` files in the folder that the lock does not name (a torchcodec
build matching the machine's torch, say) are installed the same way when
their package is not installed yet.

``SITE/nvidia`` gets an ``__init__.py`` that extends its path over every
``nvidia`` folder on ``sys.path``: SITE comes first, so it is the package
imported, and the machine's own ``nvidia.cudnn``, ``nvidia.cublas``, ... stay
importable beside the carried ``nvidia.dali``, even where one of the machine's
wheels made its ``nvidia`` a regular package (which, left alone, would hide the
carried namespace portion).

Exit codes: 0 fine, 2 pieces that do not add up, 3 required wheels missing,
4 pip or the import check failed.

Test hooks: ``DALILOAD_BENCH_IGNORE_INSTALLED=name,name`` treats those packages
as not installed; ``DALILOAD_BENCH_LOCK=FILE`` reads another lock file;
``DALILOAD_BENCH_TRANSFER=FILE`` another transfer plan.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from pieces import (_PIECE, TransferRow, _bad_pieces, _plan_rows, _suffix, arrived, complete_members,
                    extract_complete, file_rows, read_transfer, sha256_of, split, stream_name, transfer_path,
                    wheel_of, write_rows, write_stream)
from slim import COMPRESS_OVER, XZ_PRESET, compress, derive, derived_name
from visit import HOST_PACKAGES, PIECE_BYTES, pieces_and_members
from visit import short_name as _short

HERE = Path(__file__).resolve().parent
#: manylinux tags pip download needs to pick the x86-64 wheels of wheels.lock
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux_2_12_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64")
_IMAGE_LIBS = "DALI loads it only for image decoders and compression, which daliload does not use"
WHY_OPTIONAL = {
    "psutil": "peak RSS and CPU of DataLoader workers (without it: the main process only)",
    "decord": "the decord-cpu peer",
    "nvidia-nvimgcodec-cu13": _IMAGE_LIBS, "nvidia-nvimgcodec-cu12": _IMAGE_LIBS,
    "nvidia-libnvcomp-cu13": _IMAGE_LIBS, "nvidia-libnvcomp-cu12": _IMAGE_LIBS,
    "nvidia-nvjpeg": _IMAGE_LIBS, "nvidia-nvjpeg-cu12": _IMAGE_LIBS,
    "nvidia-nvjpeg2k-cu13": _IMAGE_LIBS, "nvidia-nvjpeg2k-cu12": _IMAGE_LIBS,
    "nvidia-nvtiff-cu13": _IMAGE_LIBS, "nvidia-nvtiff-cu12": _IMAGE_LIBS,
}
NAMESPACE_INIT = '''\
# Written by daliload's benchmarks/gpu/wheelhouse.py. This folder comes first on sys.path, so this
# regular package is the "nvidia" imported; extend_path adds every other "nvidia" folder on
# sys.path to it (the machine's nvidia.cudnn, nvidia.cublas, ...), also one whose own __init__.py
# would otherwise hide the packages carried here.
__path__ = __import__("pkgutil").extend_path(__path__, __name__)
'''


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class LockEntry:
    flavour: str
    name: str
    version: str
    need: str
    file: str
    sha256: str


def read_lock(path: Path | None = None) -> list[LockEntry]:
    """The entries of wheels.lock (or of the file ``DALILOAD_BENCH_LOCK`` names)."""
    path = path or Path(os.environ.get("DALILOAD_BENCH_LOCK") or HERE / "wheels.lock")
    entries = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            entries.append(LockEntry(*line.split("\t")))
    return entries


def carried_entries(flavour: str, host: frozenset[str] = HOST_PACKAGES) -> tuple[list[LockEntry], list[str]]:
    """The lock entries a visit carries (required, not on the host), and why each other one is left out."""
    carried, left_out = [], []
    for entry in read_lock():
        if entry.flavour not in ("any", flavour):
            continue
        if normalize(entry.name) in host:
            left_out.append(f"{entry.name}: the host's image has it")
        elif entry.need != "required":
            left_out.append(f"{entry.name}: optional ({WHY_OPTIONAL.get(entry.name, 'see README')})")
        else:
            carried.append(entry)
    return carried, left_out


def _derived(wheel: Path, work: Path, known: dict[str, str]) -> tuple[Path, Path]:
    """The derived wheel of ``wheel`` and its ``.xz`` (:mod:`slim`), made in ``work``.

    Both are kept when already there with the sha256 ``known`` (the committed
    transfer plan) names: xz-compressing DALI takes minutes on one core.
    """
    work.mkdir(parents=True, exist_ok=True)
    made = work / derived_name(wheel.name, slim=False, python="312")
    for name in (derived_name(wheel.name, slim=True, python="312"), made.name):
        xz = work / f"{name}.xz"
        if (work / name).is_file() and xz.is_file() and known.get(name) == sha256_of(work / name) \
                and known.get(xz.name) == sha256_of(xz):
            return work / name, xz
    made = derive(wheel, work, python="312")
    return made, compress(made)


def pack(folder: Path, flavour: str, piece_bytes: int = PIECE_BYTES,
         host: frozenset[str] = HOST_PACKAGES, plan_path: Path | None = None) -> list[TransferRow]:
    """Put the wheels a visit carries, smallest first, into one stream cut into pieces; write the transfer plan.

    Every carried wheel of wheels.lock must be in ``folder`` with its locked
    sha256 (ValueError names the ones that are not). A wheel of
    :data:`slim.COMPRESS_OVER` or more travels derived and xz-compressed
    (:mod:`slim`: only what CPython 3.12 loads, stored, then xz), made in
    ``folder/derived``; the transfer plan records the ``.xz`` member and the
    wheel it unpacks to. The plan goes to ``plan_path`` (default: the
    flavour's ``transfer-FLAVOUR.tsv``).
    """
    carried, left_out = carried_entries(flavour, host)
    known = {r.name: r.sha256 for r in read_transfer(flavour) or []}
    absent = [e.file for e in carried if not (folder / e.file).is_file()]
    if absent:
        raise ValueError(f"not in {folder}: {', '.join(absent)} (download them first, see README.md)")
    wrong = [e.file for e in carried if sha256_of(folder / e.file) != e.sha256]
    if wrong:
        raise ValueError(f"sha256 differs from wheels.lock: {', '.join(wrong)} (download them again)")
    travel, unpacked, derived_from = [], [], []
    for entry in carried:
        wheel = folder / entry.file
        if wheel.stat().st_size < COMPRESS_OVER:
            travel.append(wheel)
            continue
        made, xz = _derived(wheel, folder / "derived", known)
        travel.append(xz)
        unpacked.append(TransferRow("unpacked", made.name, made.stat().st_size, sha256_of(made), xz.name))
        derived_from.append(f"#   {xz.name}: {made.name} (xz preset {XZ_PRESET}) from the locked {entry.file}\n")
    travel.sort(key=lambda p: (p.stat().st_size, p.name))
    stream, members = write_stream(folder, travel, stream_name(flavour))
    rows = file_rows(stream, piece_bytes) + members + unpacked
    header = (f"# Transfer plan for the {flavour} wheels (written by wheelhouse.py pack; see README.md).\n"
              "# 'piece' rows, in order: one call each, into benchmarks/gpu/wheels/; 'member' rows: the wheels\n"
              "# in the stream, smallest first, with the offset of their bytes; 'unpacked' rows: the wheel an\n"
              "# .xz member decompresses to on the host (slim.py), with the sha256 checked there. Derived:\n"
              + "".join(derived_from) + "# Left out:\n"
              + "".join(f"#   {why}\n" for why in left_out)
              + "#kind\tname\tbytes\tsha256\tpart_of\toffset\n")
    write_rows(plan_path or transfer_path(flavour), rows, header)
    return rows


#: The Python the lock's files are for (the GPU host's).
LOCK_PYTHON = "3.12"


def prepare(folder: Path, flavour: str, piece_bytes: int = PIECE_BYTES) -> int:
    """Here, where PyPI is reachable: the pieces of the committed transfer plan, made when they are missing.

    Pieces already in ``folder`` with the plan's sizes and sha256 are kept.
    Otherwise the wheels a visit carries are downloaded with pip (those not
    already there with their locked sha256), each checked against
    wheels.lock, and packed; packing is deterministic, so the pieces must
    come out with the sha256 the committed plan names (without a committed
    plan, the new one is written: commit it).

    Returns:
        0 ready; 2 the packed pieces differ from the committed plan; 3 a
        download failed or a wheel differs from wheels.lock.
    """
    committed = read_transfer(flavour)
    if committed is not None and folder.is_dir():
        arrival = arrived(folder, committed)
        if not arrival.missing and not arrival.bad:
            print(f"{len(arrival.have)} pieces of {transfer_path(flavour).name} are in {folder}, as planned: "
                  "nothing to do")
            return 0
    carried, _ = carried_entries(flavour)
    folder.mkdir(parents=True, exist_ok=True)

    def locked(entry: LockEntry) -> bool:
        path = folder / entry.file
        return path.is_file() and sha256_of(path) == entry.sha256

    need = [e for e in carried if not locked(e)]
    if need:
        platforms = [flag for p in PLATFORMS for flag in ("--platform", p)]
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
                   LOCK_PYTHON, "--implementation", "cp", *platforms, "--disable-pip-version-check", "-d",
                   str(folder), *(f"{e.name}=={e.version}" for e in need)]
        print(f"  downloading {len(need)} wheel(s): {', '.join(f'{e.name}=={e.version}' for e in need)}", flush=True)
        if subprocess.call(command) != 0:
            print("pip download failed (see above): is PyPI reachable from here?", file=sys.stderr)
            return 3
    wrong = [e.file for e in carried if not locked(e)]
    if wrong:
        print(f"not as wheels.lock says (missing, or another sha256): {', '.join(wrong)}", file=sys.stderr)
        return 3
    print(f"  {len(carried)} wheels match wheels.lock; packing", flush=True)
    scratch = folder / f"transfer-{flavour}.packed.tsv"
    rows = pack(folder, flavour, piece_bytes, plan_path=scratch)
    if committed is None:
        os.replace(scratch, transfer_path(flavour))
        print(f"no committed plan: wrote {transfer_path(flavour)}; commit it (it travels with the checkout)")
    else:
        scratch.unlink()
        if rows != committed:
            differ = sorted({r.name for r in rows} ^ {r.name for r in committed}
                            | {a.name for a, b in zip(rows, committed) if a != b})
            print(f"the pieces packed now differ from {transfer_path(flavour).name} ({', '.join(differ)}): the "
                  f"committed plan is from other wheels or another piece size; run --pack and commit it",
                  file=sys.stderr)
            return 2
    _print_pack(rows, flavour)
    print("ready: the pieces are the committed plan's, sha256 checked")
    return 0


def transfer_status(folder: Path, flavour: str) -> tuple[list[str], list[str]]:
    """Lines saying, piece by piece in sending order, what is here and what it completes; the missing pieces."""
    rows = read_transfer(flavour)
    if rows is None:
        return [f"No transfer plan {transfer_path(flavour).name}: pieces cannot be named "
                f"(make one with: wheelhouse.py pack --flavour {flavour})"], []
    arrival = arrived(folder, rows)
    pieces, completes = pieces_and_members(rows)
    have = {p.name for p in arrival.have}
    bad = dict((p.name, why) for p, why in arrival.bad)
    lines = [f"Transfer pieces ({transfer_path(flavour).name}: {len(pieces)}, one per call, in this order, "
             f"into {folder}):"]
    for number, piece in enumerate(pieces, 1):
        state = "have" if piece.name in have else "BAD" if piece.name in bad else "MISSING"
        note = f": {bad[piece.name]}" if piece.name in bad else ""
        done = f"; completes {', '.join(_short(w) for w in completes[piece.name])}" if completes[piece.name] else ""
        lines.append(f"  {number:2d} {state:<7} {piece.name} ({piece.size / (1 << 20):.1f} MiB){done}{note}")
    missing = [p.name for p in arrival.missing] + list(bad)
    lines.append(f"{len(missing)} of {len(pieces)} pieces missing" + (f": {', '.join(missing)}" if missing else ""))
    return lines, missing


def extend_nvidia_namespace(site: Path) -> list[str]:
    """Give ``SITE/nvidia`` an ``__init__.py`` that extends its path over every ``nvidia`` on ``sys.path``.

    See the module docstring. Returns what was done, for the log ([] when
    there is no ``SITE/nvidia`` or it is already in place).
    """
    package = site / "nvidia"
    init = package / "__init__.py"
    if not package.is_dir() or (init.is_file() and init.read_text(encoding="utf-8") == NAMESPACE_INIT):
        return []
    shipped = init.is_file()
    init.write_text(NAMESPACE_INIT, encoding="utf-8")
    for cached in (package / "__pycache__").glob("__init__.*.pyc"):
        cached.unlink()
    return [f"{init}: {'replaced the one a wheel ships' if shipped else 'written'}; it extends nvidia's path over "
            f"every nvidia folder on sys.path, so the machine's nvidia.* packages stay importable"]


def _lock_hashes() -> dict[str, str]:
    known = {row.name: row.sha256 for row in _plan_rows() if row.kind in ("file", "piece", "member", "unpacked")}
    return known | {entry.file: entry.sha256 for entry in read_lock()}


def expected_sha256(target: Path) -> tuple[str | None, str]:
    """The sha256 ``target`` must have and where that comes from (its .sha256 file, or wheels.lock)."""
    sidecar = target.with_name(target.name + ".sha256")
    if sidecar.exists():
        text = sidecar.read_text(encoding="utf-8").split()
        if not text or not re.fullmatch(r"[0-9a-fA-F]{64}", text[0]):
            raise ValueError(f"{sidecar}: expected '<64 hex digits>  {target.name}', got {' '.join(text)[:80]!r}")
        return text[0].lower(), sidecar.name
    known = _lock_hashes().get(target.name)
    return (known, "wheels.lock") if known else (None, "")


def assemble(folder: Path) -> tuple[list[Path], list[str]]:
    """Join every ``NAME.part-aa, -ab, ...`` in ``folder`` into ``NAME``, except a transfer plan's streams.

    Returns:
        ``(files assembled or already complete, error messages)``. A file is
        only written when its pieces run ``aa, ab, ...`` without a gap and its
        sha256 matches (``NAME.sha256``, else wheels.lock); without a known
        hash, a ``.whl`` must at least pass a zip integrity test. The pieces of
        a transfer plan's stream are left to :func:`receive`, which reads the
        wheels out of them without joining them.
    """
    streams = {row.name for row in _plan_rows() if row.kind == "file"}
    groups: dict[Path, list[tuple[str, Path]]] = {}
    for entry in sorted(folder.iterdir()):
        match = _PIECE.match(entry.name)
        if match and entry.is_file() and match["base"] not in streams:
            groups.setdefault(folder / match["base"], []).append((match["suffix"], entry))
    done, errors = [], []
    for target, pieces in sorted(groups.items()):
        suffixes = [s for s, _ in pieces]
        wanted = [_suffix(i) for i in range(len(pieces))]
        if suffixes != wanted:
            gap = next(w for w, s in zip(wanted + ["??"], suffixes + ["zz"]) if w != s)
            errors.append(f"{target.name}: piece {target.name}.part-{gap} is missing "
                          f"(have {', '.join('.part-' + s for s in suffixes)})")
            continue
        try:
            want, source = expected_sha256(target)
        except ValueError as err:
            errors.append(str(err))
            continue
        if target.exists() and want and sha256_of(target) == want:
            done.append(target)
            continue
        partial = target.with_name(target.name + ".assembling")
        with open(partial, "wb") as out:
            for _, piece in pieces:
                with open(piece, "rb") as f:
                    while block := f.read(1 << 20):
                        out.write(block)
        if want:
            got = sha256_of(partial)
            if got != want:
                partial.unlink()
                errors.append(f"{target.name}: the {len(pieces)} pieces add up to sha256 {got}, {source} says {want}: "
                              f"a piece is missing, truncated or from another file; copy the pieces again"
                              + _bad_pieces([piece for _, piece in pieces]))
                continue
        elif target.suffix == ".whl":
            try:
                with zipfile.ZipFile(partial) as archive:
                    bad = archive.testzip()
            except zipfile.BadZipFile as err:
                bad = str(err)
            if bad is not None:
                partial.unlink()
                errors.append(f"{target.name}: the {len(pieces)} pieces do not make a valid wheel ({bad}); "
                              f"a piece is missing or truncated (no {target.name}.sha256 to say which)")
                continue
        os.replace(partial, target)
        done.append(target)
    return done, errors


def _supported_tags() -> set[str] | None:
    try:
        from packaging.tags import sys_tags
    except ImportError:
        try:
            from pip._vendor.packaging.tags import sys_tags
        except ImportError:
            return None
    return {str(tag) for tag in sys_tags()}


def wheel_fits(filename: str, supported: set[str] | None) -> bool:
    """Whether a wheel file name's tags fit this interpreter (True when tags cannot be checked)."""
    if supported is None:
        return True
    parts = filename[:-4].split("-")
    if len(parts) < 5:
        return False
    python, abi, platform = parts[-3], parts[-2], parts[-1]
    return any(f"{p}-{a}-{q}" in supported
               for p in python.split(".") for a in abi.split(".") for q in platform.split("."))


def _wheel_name(filename: str) -> tuple[str, str]:
    parts = filename[:-4].split("-")
    return normalize(parts[0]), parts[1] if len(parts) > 1 else ""


def _installed(name: str) -> str | None:
    ignored = {normalize(n) for n in os.environ.get("DALILOAD_BENCH_IGNORE_INSTALLED", "").split(",") if n}
    if normalize(name) in ignored:
        return None
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class CheckResult:
    to_install: tuple[Path, ...]
    missing_required: tuple[LockEntry, ...]
    missing_optional: tuple[LockEntry, ...]
    lines: tuple[str, ...]


def check(folder: Path, flavour: str, pending: set[str] = frozenset()) -> CheckResult:  # type: ignore[assignment]
    """What is installed, what the folder provides, what is missing (see the module docstring).

    ``pending`` names wheels that are not in the folder yet but that pieces
    already here hold whole (they count as provided).
    """
    supported = _supported_tags()
    wheels = {}
    present = sorted(folder.glob("*.whl")) if folder.is_dir() else []
    for entry in sorted(set(present) | {folder / name for name in pending if name.endswith(".whl")}):
        if wheel_fits(entry.name, supported):
            wheels.setdefault(_wheel_name(entry.name)[0], []).append(entry)
    carried = {e.file for e in carried_entries(flavour)[0]}
    lines, to_install, missing_req, missing_opt = [], [], [], []
    named = set()
    for entry in read_lock():
        if entry.flavour not in ("any", flavour):
            continue
        key = normalize(entry.name)
        named.add(key)
        version = _installed(entry.name)
        if version is not None:
            lines.append(f"  ok        {entry.name} {version} (installed)")
            continue
        found = sorted(wheels.get(key, []), key=lambda p: p.name != entry.file)  # the locked file first
        if found:
            to_install.append(found[0])
            later = " (in the pieces here; taken out when installing)" if not found[0].exists() else ""
            lines.append(f"  to install {entry.name} from {found[0].name}{later}")
            continue
        on_its_way = " (its piece has not arrived)" if entry.file in carried else ""
        host = " (the transfer plan leaves it out: the GPU host's image has it)" \
            if normalize(entry.name) in HOST_PACKAGES else ""
        if entry.need == "required":
            missing_req.append(entry)
            lines.append(f"  MISSING   {entry.name} {entry.version} (required): {entry.file}{on_its_way}{host}")
        else:
            missing_opt.append(entry)
            lines.append(f"  missing   {entry.name} {entry.version} (optional: "
                         f"{WHY_OPTIONAL.get(entry.name, 'see README')}): {entry.file}")
    for key, files in sorted(wheels.items()):
        if key not in named and _installed(key) is None:
            to_install.append(files[0])
            lines.append(f"  to install {key} from {files[0].name} (not in wheels.lock; installed with --no-deps)")
    return CheckResult(tuple(to_install), tuple(missing_req), tuple(missing_opt), tuple(lines))


def missing_message(result: CheckResult, folder: Path) -> str:
    """Exactly which files to bring, and the command that fetches them where PyPI is reachable."""
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    entries = list(result.missing_required) + list(result.missing_optional)
    lines = [f"Needed in {folder} (each file whole, or as FILE.part-aa, FILE.part-ab, ... plus FILE.sha256):"]
    for entry in entries:
        tag = "required" if entry.need == "required" else "optional"
        lines.append(f"  {entry.file}    ({entry.name}=={entry.version}, {tag}, sha256 {entry.sha256[:16]}...)")
    if python != "3.12":
        lines.append(f"  (file names are those for CPython 3.12; this is {python}: "
                     f"any wheel of the same name that fits CPython {python} will do)")
    platforms = " ".join(f"--platform {p}" for p in PLATFORMS)
    specs = " ".join(f"{e.name}=={e.version}" for e in entries)
    lines += ["Fetch them where PyPI is reachable, and cut files over a call's size into pieces:",
              f"  python3 -m pip download --no-deps --only-binary=:all: --python-version {python} "
              f"--implementation cp {platforms} -d wheels {specs}",
              f"  for f in wheels/*.whl; do [ $(stat -c %s \"$f\") -gt {PIECE_BYTES} ] && "
              "benchmarks/gpu/run_gpu_bench.sh --split \"$f\" && rm \"$f\"; done"]
    return "\n".join(lines)


def merge_tree(source: Path, target: Path) -> None:
    """Move everything under ``source`` into ``target``, merging folders that both have (files replaced)."""
    target.mkdir(parents=True, exist_ok=True)
    for entry in source.iterdir():
        dest = target / entry.name
        if entry.is_dir() and not entry.is_symlink() and dest.is_dir() and not dest.is_symlink():
            merge_tree(entry, dest)
            continue
        if dest.is_dir() and not dest.is_symlink():
            shutil.rmtree(dest)
        elif dest.exists() or dest.is_symlink():
            dest.unlink()
        shutil.move(str(entry), str(dest))


def install(paths: list[Path], site: Path) -> int:
    """Install ``paths`` (wheels) into ``site`` beside what is there (module docstring); pip's exit code."""
    if not paths:
        return 0
    site.mkdir(parents=True, exist_ok=True)
    stage = site.with_name(site.name + ".stage")
    shutil.rmtree(stage, ignore_errors=True)
    command = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--no-compile",
               "--disable-pip-version-check", "--target", str(stage)] + [str(p) for p in paths]
    print(f"  pip install --no-index --no-deps --target {stage} ({len(paths)} wheels: "
          f"{', '.join(_short(p.name) for p in paths)})", flush=True)
    code = subprocess.call(command)
    if code == 0:
        merge_tree(stage, site)
        for note in extend_nvidia_namespace(site):
            print(f"  {note}", flush=True)
    shutil.rmtree(stage, ignore_errors=True)
    importlib.invalidate_caches()  # so _installed() sees what just went into SITE
    return code


def receive(folder: Path, flavour: str, site: Path) -> int:
    """Check the pieces here, take out every wheel they hold whole, install those not installed yet.

    Returns 0, or 2 when a piece is not as planned (named: send it again) or
    4 when pip fails. Safe to run again: what is done is skipped.
    """
    rows = read_transfer(flavour)
    if rows is None:
        print(f"  no transfer plan {transfer_path(flavour).name}: nothing to receive")
        return 0
    lines, _ = transfer_status(folder, flavour)
    print("\n".join(lines), flush=True)
    arrival = arrived(folder, rows)
    if arrival.bad:
        for piece, why in arrival.bad:
            print(f"piece {piece.name}: {why}", file=sys.stderr)
        return 2
    written, errors = extract_complete(folder, rows, arrival)
    for error in errors:
        print(error, file=sys.stderr)
    if errors:
        return 2
    complete = complete_members(rows, arrival.prefix_bytes)
    ready = [folder / wheel_of(rows, m.name) for m in complete]
    # By package name: a derived wheel (slim.py) is not the lock's file, but the same package and version.
    todo = [p for p in ready if _installed(_wheel_name(p.name)[0]) is None]
    if written:
        print(f"  taken out of the pieces: {', '.join(_short(p.name) for p in written)}")
    if install(todo, site) != 0:
        print("pip install failed (see above)", file=sys.stderr)
        return 4
    waiting = [m.name for m in rows if m.kind == "member" and m not in complete]
    print(f"  installed now: {len(todo)}; waiting for pieces: {', '.join(map(_short, waiting)) or 'none'}")
    return 0


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("split", help="cut a file into pieces of a call's size plus a .sha256")
    p.add_argument("file", type=Path)
    p.add_argument("--piece-bytes", type=int, default=PIECE_BYTES)
    for name in ("pack", "prepare", "assemble", "check", "receive", "install"):
        p = sub.add_parser(name)
        p.add_argument("--wheels", type=Path, default=HERE / "wheels")
        p.add_argument("--flavour", choices=("cuda13", "cuda12"), default="cuda13")
        if name in ("install", "receive"):
            p.add_argument("--site", type=Path, required=True)
        if name in ("pack", "prepare"):
            p.add_argument("--piece-bytes", type=int, default=PIECE_BYTES)
    return parser.parse_args(argv)


def _print_pack(rows: list[TransferRow], flavour: str) -> None:
    pieces, completes = pieces_and_members(rows)
    print(f"{transfer_path(flavour)}: {len(pieces)} pieces, to send in this order, one per call:")
    for number, piece in enumerate(pieces, 1):
        print(f"  {number:2d} {piece.name} ({piece.size / (1 << 20):.1f} MiB): completes "
              f"{', '.join(map(_short, completes[piece.name])) or 'nothing'}")


def _assemble_step(folder: Path) -> int:
    """Join other split files; 2 when their pieces do not add up."""
    done, errors = assemble(folder) if folder.is_dir() else ([], [])
    for path in done:
        print(f"  assembled {path.name}")
    if errors:
        print("Pieces that do not add up:", file=sys.stderr)
        for error in errors:
            print(f"  {error}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.command == "split":
        pieces = split(args.file, args.piece_bytes)
        print(f"{args.file.name}: {len(pieces)} pieces of at most {args.piece_bytes} bytes, sha256 in "
              f"{args.file.name}.sha256:")
        for piece in pieces:
            print(f"  {piece}")
        return 0
    if args.command == "pack":
        _print_pack(pack(args.wheels, args.flavour, args.piece_bytes), args.flavour)
        return 0
    if args.command == "prepare":
        return prepare(args.wheels, args.flavour, args.piece_bytes)
    if args.command == "assemble":
        return _assemble_step(args.wheels)
    if args.command == "receive":
        return receive(args.wheels, args.flavour, args.site)
    pending: set[str] = set()
    if args.command == "check":  # changes nothing: pieces are only looked at
        lines, _ = transfer_status(args.wheels, args.flavour)
        print("\n".join(lines))
        rows = read_transfer(args.flavour) or []
        pending = {wheel_of(rows, m.name) for m in complete_members(rows, arrived(args.wheels, rows).prefix_bytes)} \
            if args.wheels.is_dir() else set()
    else:
        if args.wheels.is_dir():
            code = receive(args.wheels, args.flavour, args.site) or _assemble_step(args.wheels)
            if code:
                return code
    result = check(args.wheels, args.flavour, pending)
    print(f"Wheels for the GPU benchmark (DALI flavour {args.flavour}, Python "
          f"{sys.version_info.major}.{sys.version_info.minor}, folder {args.wheels}):")
    print("\n".join(result.lines))
    if result.missing_required or result.missing_optional:
        stream = sys.stderr if result.missing_required else sys.stdout
        print(missing_message(result, args.wheels), file=stream)
    if result.missing_required:
        done = "nothing installed" if args.command == "check" else "the GPU run cannot start"
        print(f"{len(result.missing_required)} required wheel(s) missing: {done}.", file=sys.stderr)
        return 3
    if args.command == "check":
        return 0
    if install(list(result.to_install), args.site) != 0:
        print("pip install failed (see above)", file=sys.stderr)
        return 4
    return 0


if __name__ == "__main__":
    sys.exit(main())
