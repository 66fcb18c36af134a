"""``daliload pack ROOT OUT``: a dataset's videos packed into tar shards, one member per video.

What it writes, for each split (``train``, then ``val``, ...)::

    OUT/
      classes.txt                    the class map, one name per line in label order
      train-000000.tar               members  <class name>/<file name>, in path order
      train-000001.tar               ... a new shard once this one would pass --shard-size
      val-000000.tar

The shards are uncompressed (video is compressed already, and a member must be
one contiguous byte range, so a loader reads only the members, or the parts of
them, it needs), written the same way every time (names, sizes and order
only: no owner, a fixed mode and time), each to a temporary name first and
renamed when whole, so an interrupted pack leaves no shard that looks done.
Files the dataset's layout does not index (not videos) are not packed.
"""

from __future__ import annotations

import argparse
import os
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from daliload.dataset import SPLITS, DatasetIndex, load_index, save_classes

HELP = "pack a dataset's videos into uncompressed tar shards (<split>-NNNNNN.tar, members <class>/<file>)"

#: Default largest shard, bytes (webdataset's guides suggest 100 MB to a few GB per shard).
DEFAULT_SHARD_BYTES = 1 << 30


@dataclass
class PackSummary:
    """What :func:`pack_dataset` wrote: shard paths and member counts per split, and the bytes packed."""

    shards: dict[str, list[str]] = field(default_factory=dict)
    members: dict[str, int] = field(default_factory=dict)
    bytes_packed: int = 0


def parse_size(text: str) -> int:
    """``"500M"``, ``"2G"``, ``"1048576"`` -> bytes (K, M, G, T are powers of 1024).

    Raises:
        ValueError: not a positive size.
    """
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    value = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = units.get(value[-1:], 1)
    number = value[:-1] if value[-1:] in units else value
    try:
        size = int(float(number) * scale)
    except ValueError:
        size = 0
    if size < 1:
        raise ValueError(f"shard size {text!r} is not a positive size such as 500M or 2G")
    return size


def member_names(index: DatasetIndex) -> list[str]:
    """``<class>/<file name>`` for each record of ``index``, in its order.

    Raises:
        ValueError: two videos of one class have the same file name (names both files).
    """
    names: dict[str, str] = {}
    out = []
    for record in index.records:
        name = f"{record.class_name}/{os.path.basename(record.path)}"
        if name in names:
            raise ValueError(f"two videos would be packed as {name!r}: {names[name]} and {record.path}; "
                             "rename one (members are <class>/<file name>)")
        names[name] = record.path
        out.append(name)
    return out


def pack_dataset(root: str | os.PathLike, out: str | os.PathLike, *, splits: tuple[str, ...] = (),
                 shard_bytes: int = DEFAULT_SHARD_BYTES, progress: bool = True) -> PackSummary:
    """Pack each split of the dataset at ``root`` into shards under ``out``.

    Args:
        root: dataset root, in any layout the loader reads.
        out: output folder (created); it must not be inside ``root``, and must
            hold no shard of a split being packed.
        splits: the splits to pack; default every one of ``train``, ``val``,
            ``test`` that ``root`` has.
        shard_bytes: a shard closes before a member would take it past this
            size (a member larger than it gets a shard of its own).
        progress: a progress bar on stderr.

    Raises:
        FileNotFoundError: ``root`` does not exist, or has none of the splits asked for.
        FileExistsError: ``out`` already holds a shard of a split to pack.
        ValueError: ``out`` is inside ``root``; two members would share a name.
    """
    root, out = Path(root).resolve(), Path(out).resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"dataset root not found: {root}")
    if out == root or root in out.parents:
        raise ValueError(f"output folder {out} is inside the dataset root {root}: pack elsewhere, or the next "
                         "scan of the root would index the shards' folder")
    indexes = _indexes(root, splits)
    out.mkdir(parents=True, exist_ok=True)
    for split in indexes:
        existing = sorted(out.glob(f"{split}-*.tar"))
        if existing:
            raise FileExistsError(f"{out} already holds shards of split {split!r} ({existing[0].name}, ...): "
                                  "remove them or pack to another folder")
    summary = PackSummary()
    first = next(iter(indexes.values()))
    save_classes(first.classes, out / "classes.txt")
    sizes = {split: [os.path.getsize(r.path) for r in index.records] for split, index in indexes.items()}
    total = sum(map(sum, sizes.values()))
    with tqdm(total=total, unit="B", unit_scale=True, desc="pack", disable=not progress) as bar:
        for split, index in indexes.items():
            summary.shards[split] = _write_split(index, member_names(index), sizes[split], out, split, shard_bytes,
                                                 bar)
            summary.members[split] = len(index.records)
    summary.bytes_packed = total
    return summary


def _indexes(root: Path, splits: tuple[str, ...]) -> dict[str, DatasetIndex]:
    indexes = {}
    for split in splits or SPLITS:
        try:
            indexes[split] = load_index(root, split)
        except FileNotFoundError:
            if splits:  # asked for by name: its absence is an error
                raise
    if not indexes:
        raise FileNotFoundError(f"{root} has none of the splits {', '.join(SPLITS)} in a layout daliload reads")
    return indexes


def _write_split(index: DatasetIndex, names: list[str], sizes: list[int], out: Path, split: str, shard_bytes: int,
                 bar: tqdm) -> list[str]:
    shards: list[str] = []
    tar: tarfile.TarFile | None = None
    try:
        for record, name, size in zip(index.records, names, sizes):
            # tar.offset: the shard's bytes so far, headers and padding included; a member adds a header and
            # padding (up to 1024 bytes) to its own.
            if tar is not None and tar.offset + size + 1024 > shard_bytes:
                shards.append(_close(tar))
                tar = None
            if tar is None:
                final = out / f"{split}-{len(shards):06d}.tar"
                tar = tarfile.open(final.with_suffix(".tar.partial"), "w", format=tarfile.PAX_FORMAT)
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = size, 0o644, 0
            with open(record.path, "rb") as data:
                tar.addfile(info, data)
            bar.update(size)
        if tar is not None:
            shards.append(_close(tar))
            tar = None
    finally:
        if tar is not None:  # interrupted: the partial shard goes, no shard looks whole that is not
            tar.close()
            os.unlink(tar.name)
    return shards


def _close(tar: tarfile.TarFile) -> str:
    tar.close()
    partial = str(tar.name)
    final = partial.removesuffix(".partial")
    os.replace(partial, final)
    return final


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("root", metavar="ROOT", help="dataset root (class folders, CSVs or list files)")
    parser.add_argument("out", metavar="OUT", help="output folder for the shards, outside ROOT (created)")
    parser.add_argument("--split", action="append", default=[], metavar="NAME",
                        help="split to pack (repeatable; default every one of train, val, test that ROOT has)")
    parser.add_argument("--shard-size", default="1G", metavar="SIZE",
                        help="largest shard, e.g. 500M or 2G (default 1G)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    """Exit status: 0 when every split asked for was packed, 2 for bad arguments or input."""
    try:
        summary = pack_dataset(args.root, args.out, splits=tuple(args.split), shard_bytes=parse_size(args.shard_size),
                               progress=not args.no_progress)
    except (ValueError, FileNotFoundError, FileExistsError) as err:
        print(f"daliload pack: error: {err}", file=sys.stderr)
        return 2
    for split, shards in summary.shards.items():
        print(f"{split}: {summary.members[split]} video(s) in {len(shards)} shard(s), {shards[0]} ...")
    print(f"{summary.bytes_packed / 1e6:.1f} MB packed into {args.out}")
    return 0
