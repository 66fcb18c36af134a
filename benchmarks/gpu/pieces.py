"""The transfer plan: the wheels a GPU host lacks, as one tar stream cut into pieces that each fill a call.

Standard library only, like wheelhouse.py, which imports it from beside itself.
``transfer-FLAVOUR.tsv`` holds :class:`TransferRow` lines:

- ``file``: the stream, ``wheels-FLAVOUR.tar`` (its size and sha256);
- ``piece``: one transfer, in sending order (``part_of``: the stream);
- ``member``: a wheel in the stream, with the ``offset`` of its first byte; a
  ``NAME.whl.xz`` member is a derived wheel, xz-compressed (:mod:`slim`);
- ``unpacked``: the wheel such a member decompresses to (``part_of``: the
  member), with its size and sha256, checked on the host after decompressing.

The stream holds the wheels smallest first, so most of them are complete early:
a wheel can be taken out and installed as soon as the pieces up to the one that
holds its last byte have arrived (:func:`extract_complete`), long before the
last piece lands. The pieces are never joined into the stream on the host.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
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


def split(path: Path, piece_bytes: int) -> list[Path]:
    """Cut ``path`` into ``path.part-aa``, ``-ab``, ... of at most ``piece_bytes`` bytes (the callers pass
    :data:`visit.PIECE_BYTES`, a call's size; visit.py imports this module, so it is not imported back here).

    Also writes ``path.sha256`` (``sha256sum`` format) for the reassembly check.
    """
    if piece_bytes < 1:
        raise ValueError(f"piece_bytes must be >= 1, got {piece_bytes}")
    pieces = []
    with open(path, "rb") as f:
        for index in range(26 * 26):
            block = f.read(piece_bytes)
            if not block:
                break
            piece = path.with_name(f"{path.name}.part-{_suffix(index)}")
            piece.write_bytes(block)
            pieces.append(piece)
        else:
            raise ValueError(f"{path}: more than {26 * 26} pieces of {piece_bytes} bytes; use bigger pieces")
    path.with_name(path.name + ".sha256").write_text(f"{sha256_of(path)}  {path.name}\n", encoding="utf-8")
    return pieces


@dataclass(frozen=True)
class TransferRow:
    """One line of ``transfer-FLAVOUR.tsv`` (see the module docstring).

    ``offset`` is where a member's bytes start in the stream (-1 for other rows).
    """

    kind: str
    name: str
    size: int
    sha256: str
    part_of: str
    offset: int = -1


def stream_name(flavour: str) -> str:
    return f"wheels-{flavour}.tar"


def transfer_path(flavour: str) -> Path:
    return Path(os.environ.get("DALILOAD_BENCH_TRANSFER") or HERE / f"transfer-{flavour}.tsv")


def _read_rows(path: Path) -> list[TransferRow]:
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            kind, name, size, sha, part_of, *offset = line.split("\t")
            rows.append(TransferRow(kind, name, int(size), sha, part_of, int(offset[0]) if offset else -1))
    return rows


def read_transfer(flavour: str) -> list[TransferRow] | None:
    """The rows of the flavour's transfer plan, or None when there is none."""
    path = transfer_path(flavour)
    return _read_rows(path) if path.is_file() else None


def write_rows(path: Path, rows: list[TransferRow], header: str) -> None:
    path.write_text(header + "".join(f"{r.kind}\t{r.name}\t{r.size}\t{r.sha256}\t{r.part_of}\t{r.offset}\n"
                                     for r in rows), encoding="utf-8")


def write_stream(folder: Path, wheels: list[Path], name: str) -> tuple[Path, list[TransferRow]]:
    """A tar of ``wheels`` in this order (flat names, fixed owner/mode/time: the same bytes on every run).

    Returns the stream and a ``member`` row per wheel, with the offset of its bytes.
    """
    path = folder / name
    members = []
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as archive:
        for wheel in wheels:
            info = tarfile.TarInfo(wheel.name)
            info.size, info.mode, info.mtime = wheel.stat().st_size, 0o644, 0
            with open(wheel, "rb") as f:
                archive.addfile(info, f)
            # The archive's position is now past the data, padded to a 512-byte block.
            offset = archive.offset - -(-info.size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
            members.append(TransferRow("member", wheel.name, info.size, sha256_of(wheel), name, offset))
    return path, members


def file_rows(path: Path, piece_bytes: int) -> list[TransferRow]:
    """The ``file`` row of ``path`` and its ``piece`` rows (cut when over ``piece_bytes``)."""
    rows = [TransferRow("file", path.name, path.stat().st_size, sha256_of(path), "-")]
    pieces = split(path, piece_bytes) if path.stat().st_size > piece_bytes else [path]
    return rows + [TransferRow("piece", p.name, p.stat().st_size, sha256_of(p), path.name) for p in pieces]


@dataclass(frozen=True)
class Arrival:
    """What of the stream is on this machine (:func:`arrived`).

    Attributes:
        have: the pieces present, whole and with their sha256, from the first
            on without a gap.
        prefix_bytes: how many bytes of the stream those pieces make.
        missing: the pieces not (yet) here, in sending order.
        bad: ``(piece, why)`` for a piece present but not as planned.
    """

    have: tuple[TransferRow, ...]
    prefix_bytes: int
    missing: tuple[TransferRow, ...]
    bad: tuple[tuple[TransferRow, str], ...]


def arrived(folder: Path, rows: list[TransferRow], *, verify: bool = True) -> Arrival:
    """Which pieces of the stream are in ``folder``; ``verify`` checks each one's sha256."""
    have, missing, bad = [], [], []
    prefix, gap = 0, False
    for piece in (r for r in rows if r.kind == "piece"):
        path = folder / piece.name
        if not path.is_file():
            missing.append(piece)
            gap = True
            continue
        size = path.stat().st_size
        if size != piece.size:
            why = f"{size} bytes, not {piece.size}" + (" (still arriving?)" if size < piece.size else "")
            bad.append((piece, why))
            gap = True
            continue
        if verify and sha256_of(path) != piece.sha256:
            bad.append((piece, "sha256 differs from the transfer plan: it is from another pack; send it again"))
            gap = True
            continue
        have.append(piece)
        if not gap:
            prefix += piece.size
    return Arrival(tuple(have), prefix, tuple(missing), tuple(bad))


def complete_members(rows: list[TransferRow], prefix_bytes: int) -> list[TransferRow]:
    """The members whose bytes all lie in the first ``prefix_bytes`` bytes of the stream."""
    return [r for r in rows if r.kind == "member" and r.offset >= 0 and r.offset + r.size <= prefix_bytes]


def wheel_of(rows: list[TransferRow], member: str) -> str:
    """The wheel file a member gives on the host: its ``unpacked`` row's name, or the member itself."""
    return next((r.name for r in rows if r.kind == "unpacked" and r.part_of == member), member)


def _read_span(folder: Path, pieces: list[TransferRow], offset: int, size: int) -> bytes:
    """Bytes ``offset .. offset + size`` of the stream, read from its pieces."""
    out, start = bytearray(), 0
    for piece in pieces:
        end = start + piece.size
        if end > offset and start < offset + size:
            with open(folder / piece.name, "rb") as f:
                f.seek(max(0, offset - start))
                out += f.read(min(end, offset + size) - max(start, offset))
        start = end
    return bytes(out)


def extract_complete(folder: Path, rows: list[TransferRow], arrival: Arrival) -> tuple[list[Path], list[str]]:
    """Write every member wheel the arrived pieces hold whole into ``folder`` (skipping those already there).

    An ``.xz`` member is decompressed straight into the wheel its
    ``unpacked`` row names (the ``.xz`` is not kept), and that wheel's sha256
    checked against the row.

    Returns:
        ``(wheels written, errors)``; a wheel whose bytes do not match its
        sha256 is not written (its pieces passed their own check, so the
        transfer plan and the pieces disagree: pack again).
    """
    from slim import decompress

    pieces = [r for r in rows if r.kind == "piece"]
    unpacked = {r.part_of: r for r in rows if r.kind == "unpacked"}
    written, errors = [], []
    for member in complete_members(rows, arrival.prefix_bytes):
        wheel = unpacked.get(member.name, member)
        target = folder / wheel.name
        if target.is_file() and target.stat().st_size == wheel.size and sha256_of(target) == wheel.sha256:
            continue
        data = _read_span(folder, pieces, member.offset, member.size)
        if hashlib.sha256(data).hexdigest() != member.sha256:
            errors.append(f"{member.name}: its bytes in the pieces do not match its sha256 in the transfer plan "
                          f"(the plan and the pieces come from different packs)")
            continue
        if wheel is not member:
            try:
                got = decompress(data, target)
            except lzma.LZMAError as err:
                errors.append(f"{member.name}: does not decompress ({err}): the plan and the pieces disagree")
                continue
            if got != wheel.sha256:
                target.unlink()
                errors.append(f"{wheel.name}: decompressed from {member.name}, its sha256 is {got}, the transfer "
                              f"plan says {wheel.sha256}: pack again")
                continue
        else:
            partial = target.with_name(target.name + ".partial")
            partial.write_bytes(data)
            os.replace(partial, target)
        written.append(target)
    return written, errors


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
