"""Pieces of at most 60 MB, and the transfer plan that names them (see wheelhouse.py and README.md).

Standard library only, like wheelhouse.py, which imports it from beside itself.
``transfer-FLAVOUR.tsv`` holds :class:`TransferRow` lines: ``file`` (a file the
pieces make: a wheel or the tar bundle of the small wheels), ``piece`` (one
transfer, in the order to send them) and ``member`` (a wheel in the bundle).
"""

from __future__ import annotations

import hashlib
import os
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
PIECE_MB = 60
_PIECE = re.compile(r"^(?P<base>.+)\.part-(?P<suffix>[a-z]{2})$")
_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()



def _suffix(index: int) -> str:
    return _LETTERS[index // 26] + _LETTERS[index % 26]



def split(path: Path, piece_mb: int = PIECE_MB) -> list[Path]:
    """Cut ``path`` into ``path.part-aa``, ``-ab``, ... of at most ``piece_mb`` MB (10^6 bytes).

    Also writes ``path.sha256`` (``sha256sum`` format) for the reassembly check.
    """
    size = piece_mb * 1000 * 1000
    pieces = []
    with open(path, "rb") as f:
        for index in range(26 * 26):
            block = f.read(size)
            if not block:
                break
            piece = path.with_name(f"{path.name}.part-{_suffix(index)}")
            piece.write_bytes(block)
            pieces.append(piece)
        else:
            raise ValueError(f"{path}: more than {26 * 26} pieces of {piece_mb} MB; use bigger pieces")
    path.with_name(path.name + ".sha256").write_text(f"{sha256_of(path)}  {path.name}\n", encoding="utf-8")
    return pieces



@dataclass(frozen=True)
class TransferRow:
    """One line of ``transfer-FLAVOUR.tsv``.

    ``kind`` is ``file`` (a file the pieces make: a wheel or the bundle),
    ``piece`` (one transfer; ``part_of`` is the file it makes, itself when sent
    whole) or ``member`` (a wheel inside the bundle ``part_of``).
    """

    kind: str
    name: str
    size: int
    sha256: str
    part_of: str



def bundle_name(flavour: str) -> str:
    return f"wheels-small-{flavour}.tar"



def transfer_path(flavour: str) -> Path:
    return Path(os.environ.get("DALILOAD_BENCH_TRANSFER") or HERE / f"transfer-{flavour}.tsv")



def _read_rows(path: Path) -> list[TransferRow]:
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            kind, name, size, sha, part_of = line.split("\t")
            rows.append(TransferRow(kind, name, int(size), sha, part_of))
    return rows



def read_transfer(flavour: str) -> list[TransferRow] | None:
    """The rows of the flavour's transfer plan, or None when there is none."""
    path = transfer_path(flavour)
    return _read_rows(path) if path.is_file() else None



def _bundle(folder: Path, files: list[Path], name: str) -> Path:
    """A tar of ``files`` (flat names, fixed owner/mode/time: the same bytes on every run)."""
    path = folder / name
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as archive:
        for file in files:
            info = tarfile.TarInfo(file.name)
            info.size, info.mode, info.mtime = file.stat().st_size, 0o644, 0
            with open(file, "rb") as f:
                archive.addfile(info, f)
    return path



def _file_rows(path: Path, piece_mb: int) -> list[TransferRow]:
    """The ``file`` row of ``path`` and its ``piece`` rows (cut when over ``piece_mb``)."""
    rows = [TransferRow("file", path.name, path.stat().st_size, sha256_of(path), "-")]
    pieces = split(path, piece_mb) if path.stat().st_size > piece_mb * 1000 * 1000 else [path]
    return rows + [TransferRow("piece", p.name, p.stat().st_size, sha256_of(p), path.name) for p in pieces]



def pending_files(folder: Path, flavour: str) -> set[str]:
    """Files that ``assemble`` would make from complete pieces in ``folder`` (and the wheels of such a bundle)."""
    names = set()
    groups: dict[str, list[str]] = {}
    for entry in folder.iterdir() if folder.is_dir() else []:
        match = _PIECE.match(entry.name)
        if match:
            groups.setdefault(match["base"], []).append(match["suffix"])
    rows = read_transfer(flavour) or []
    planned = {r.name: sorted(p.name for p in rows if p.kind == "piece" and p.part_of == r.name)
               for r in rows if r.kind == "file"}
    for base, suffixes in groups.items():
        want = planned.get(base) or [f"{base}.part-{_suffix(i)}" for i in range(len(suffixes))]
        if all((folder / name).is_file() for name in want):
            names.add(base)
    for base in [n for n in planned if (folder / n).is_file() or n in names]:
        names |= {r.name for r in rows if r.kind == "member" and r.part_of == base}
    return names



def unpack_bundles(folder: Path, flavour: str) -> list[str]:
    """Extract the wheels of the flavour's bundle (when it is there); return the names extracted."""
    bundle = folder / bundle_name(flavour)
    if not bundle.is_file():
        return []
    extracted = []
    with tarfile.open(bundle) as archive:
        for member in archive.getmembers():
            target = folder / member.name
            if "/" in member.name or not member.isfile() or not member.name.endswith(".whl"):
                continue
            if target.is_file() and target.stat().st_size == member.size:
                continue
            source = archive.extractfile(member)
            assert source is not None
            target.write_bytes(source.read())
            extracted.append(member.name)
    return extracted



def _plan_rows() -> list[TransferRow]:
    """The rows of every transfer plan beside this file (or of ``DALILOAD_BENCH_TRANSFER``)."""
    override = os.environ.get("DALILOAD_BENCH_TRANSFER")
    paths = [Path(override)] if override else sorted(HERE.glob("transfer-*.tsv"))
    return [row for path in paths if path.is_file() for row in _read_rows(path)]



def _bad_pieces(pieces: list[Path]) -> str:
    """Which of ``pieces`` differ from the transfer plan's sha256, as text ('' when none is known)."""
    known = {row.name: row.sha256 for row in _plan_rows() if row.kind == "piece"}
    bad = [p.name for p in pieces if p.name in known and sha256_of(p) != known[p.name]]
    return f" (differing from the transfer plan: {', '.join(bad)})" if bad else ""
