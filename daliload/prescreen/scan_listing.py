"""What a scan covers, and what changed: the listing of a dataset compared with its manifest.

:func:`list_source` lists a dataset root through its index
(:func:`daliload.dataset.load_index`, one split after another, with what the
index skipped and what it lists but is missing) or takes explicit records;
:func:`stat_records` calls ``stat`` on every file of the share scanned;
:func:`listing_digest` sums all that up, so that a scan whose digest equals
the one the last scan stored has nothing to do; :func:`find_changes` compares
the files with the manifest and picks those to probe (new, changed, due a deep
check or a retry) and those to relabel. :func:`check_changes` answers, from a
manifest on read-only storage, whether a scan would change anything. Where a
root's manifest goes by default is :func:`default_manifest_path`. The scan
itself is :func:`daliload.prescreen.scan.scan`.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Any, Iterable, NamedTuple, Sequence

import numpy as np

from daliload.prescreen.manifest import Manifest
from daliload.prescreen.rows import FileRecord
from daliload.prescreen.rules import RULES_VERSION, Device
from daliload.dataset import ALL_FILES, Shard, decoded_path, printable_path
from daliload.stream import stat_video
from daliload.prescreen.remote_root import mirrored_uri, to_uri

#: A scan's messages keep one logger, whichever of its modules they come from.
logger = logging.getLogger("daliload.prescreen.scan")


def manifest_name(fold: int | None = None) -> str:
    """The file name of a root's manifest: ``manifest.sqlite``, or ``manifest-fold2.sqlite`` for fold 2 of a
    layout with folds (whose splits differ from fold 1's: one manifest holds one split per file)."""
    return "manifest.sqlite" if fold in (None, 1) else f"manifest-fold{fold}.sqlite"


def default_manifest_path(root: str | bytes | os.PathLike, fold: int | None = None) -> Path:
    """Where the manifest of ``root`` (of ``fold``) lives by default (see :mod:`daliload.prescreen.scan`)."""
    root_path = Path(os.path.abspath(decoded_path(root)))
    local = root_path / ".daliload"
    if os.access(local if local.is_dir() else root_path, os.W_OK):
        return local / manifest_name(fold)
    return cache_manifest_path(root_path, fold)


def cache_manifest_path(root: str | bytes | os.PathLike, fold: int | None = None) -> Path:
    """The per-user cache file of ``root``'s manifest (of ``fold``; for roots on read-only storage)."""
    root_path = Path(os.path.abspath(decoded_path(root)))
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    # the path's own bytes: a root whose name is not UTF-8 (a surrogateescape str) has no UTF-8 encoding
    key = hashlib.sha256(os.fsencode(root_path)).hexdigest()[:16]
    tail = "" if fold in (None, 1) else f"-fold{fold}"
    return cache / "daliload" / "manifests" / f"{root_path.name or 'root'}-{key}{tail}.sqlite"


def check_root(root: str | bytes | os.PathLike) -> Path:
    """``root`` as an absolute path, if it is a folder (``bytes`` are read as :func:`os.fsdecode` reads them).

    Raises:
        FileNotFoundError: it does not exist.
        ValueError: it is a file (a video, say), with what to pass instead.
    """
    path = Path(os.path.abspath(decoded_path(root)))
    if path.is_dir():
        return path
    if path.exists():
        raise ValueError(f"dataset root {path} is a file, not a folder: pass the folder that holds train/ and val/ "
                         f"(or the annotation CSVs or list files), e.g. {path.parent}, or a manifest written by "
                         "`daliload scan` (a .sqlite file)")
    raise FileNotFoundError(f"dataset root {path} does not exist")


class Listing(NamedTuple):
    """What a scan covers, before any file is looked at."""

    records: list[Any]  # the dataset index's records of the scanned splits
    classes: tuple[str, ...]  # the class map: classes[label] = class name
    splits: list[str]  # the splits found (a root may lack some of those asked for)
    missing: int  # files the index lists that do not exist
    manifest_path: str | os.PathLike
    skipped: tuple[tuple[str, str], ...] = ()  # entries of split folders not scanned, with the reason
    root: str | None = None  # the dataset root (absolute), when the source is one


def list_source(source: str | bytes | os.PathLike | Iterable[Any], splits: Sequence[str],
                manifest_path: str | os.PathLike | None, *, layout: str | None = None,
                fold: int | None = None) -> Listing:  # fmt: skip
    """List a dataset root through its index (in ``layout``, of ``fold``), or take explicit records (see
    :func:`daliload.prescreen.scan.scan`)."""
    source = decoded_path(source)  # a root given as bytes, not records
    if isinstance(source, (str, os.PathLike)):
        root = check_root(source)
        return _records_from_root(root, splits, manifest_path if manifest_path is not None
                                  else default_manifest_path(root, fold), layout, fold)
    all_records = list(source)
    records = [r for r in all_records if r.split in splits]
    if all_records and not records:
        raise ValueError(
            f"none of the {len(all_records)} records is in splits {tuple(splits)}; "
            f"pass splits= with their split names"
        )
    if manifest_path is None:
        raise ValueError(
            "manifest_path is required when scanning a list of records (there is no root "
            "to put the manifest under)"
        )
    return Listing(records, _classes_from_records(records), sorted({r.split for r in records}), 0,
                   manifest_path)  # fmt: skip


def _records_from_root(root: Path, splits: Sequence[str], manifest_path: str | os.PathLike,
                       layout: str | None, fold: int | None) -> Listing:  # fmt: skip
    """What a scan of ``root`` covers, through the dataset index."""
    from daliload.dataset import load_index

    records: list[Any] = []
    classes: tuple[str, ...] | None = None
    found: list[str] = []
    missing = 0
    skipped: list[tuple[str, str]] = []
    first_error: FileNotFoundError | None = None
    for split in splits:
        try:
            index = load_index(root, split, layout=layout, fold=fold)
        except FileNotFoundError as err:
            first_error = first_error or err
            logger.info("split %r skipped: %s", split, printable_path(str(err)))
            continue
        if classes is not None and index.classes != classes:
            raise ValueError(
                f"split {split!r} of {root} has a different class map than the other splits"
            )
        classes = index.classes
        records.extend(index.records)
        found.append(index.split)
        missing += len(index.missing)
        skipped += index.skipped
    if not found:
        raise FileNotFoundError(
            f"none of the splits {list(splits)} found under {root}: {first_error}"
        ) from first_error
    return Listing(records, classes or (), found, missing, manifest_path, tuple(sorted(skipped)), str(root))


def _classes_from_records(records: Sequence[Any]) -> tuple[str, ...]:
    """The class map of explicit records: ``classes[label] = class_name`` ("" for unused labels)."""
    names: dict[int, str] = {}
    for rec in records:
        previous = names.setdefault(int(rec.label), rec.class_name)
        if previous != rec.class_name:
            raise ValueError(
                f"label {rec.label} names two classes: {previous!r} and {rec.class_name!r} "
                f"({rec.path})"
            )
    return tuple(names.get(i, "") for i in range(max(names) + 1)) if names else ()


class Listed(NamedTuple):
    """The files a scan covers, sorted by path, with what ``stat`` said of each (-1: it could not be read)."""

    records: list[Any]
    sizes: np.ndarray
    mtimes: np.ndarray

    def file_record(self, i: int) -> FileRecord:
        rec = self.records[i]
        return FileRecord(rec.path, int(self.sizes[i]), int(self.mtimes[i]), rec.split, int(rec.label),
                          rec.class_name, getattr(rec, "youtube_id", None), getattr(rec, "time_start", None),
                          getattr(rec, "time_end", None))

    def file_records(self) -> list[FileRecord]:
        return [self.file_record(i) for i in range(len(self.records))]


def stat_records(records: Sequence[Any], root: str | None, shard: Shard) -> Listed:
    """``stat`` each record of ``shard`` (files of a root are in a share by their path under it)."""
    if root is None:  # explicit records: make their paths absolute, as the manifest keeps them
        records = [rec._replace(path=os.path.abspath(rec.path)) if hasattr(rec, "_replace")
                   else _Record(os.path.abspath(rec.path), rec) for rec in records]
    elif shard.count > 1:
        records = [rec for rec in records if shard.holds(os.path.relpath(rec.path, root).replace(os.sep, "/"))]
    if any(records[i].path > records[i + 1].path for i in range(len(records) - 1)):
        records = sorted(records, key=lambda r: r.path)
    sizes, mtimes = np.empty(len(records), np.int64), np.empty(len(records), np.int64)
    for i, rec in enumerate(records):
        try:
            sizes[i], mtimes[i] = stat_video(rec.path)  # a shard's member: its size, the shard's mtime
        except OSError:
            sizes[i] = mtimes[i] = -1  # the probe will say why it cannot be opened
    uri = mirrored_uri(root) if root is not None else None
    if uri is not None:  # a mirror of a root in a store: what the manifest keeps, and the decoders read, is the URI
        records = [rec._replace(path=to_uri(rec.path, root, uri)) for rec in records]
    return Listed(list(records), sizes, mtimes)


class _Record:
    """A record given by the caller, with its path made absolute."""

    def __init__(self, path: str, rec: Any) -> None:
        self.path, self._rec = path, rec

    def __getattr__(self, name: str) -> Any:
        return getattr(self._rec, name)


def listing_digest(listed: Listed, *, splits: Sequence[str], shard: Shard, deep_device: str | None) -> str:
    """A digest of what a scan listed: every file's path, size, mtime and index metadata, and what was asked.

    Equal digests, with nothing written to the manifest since the scan that
    stored it, mean a scan has nothing to do. About 1 us a file.
    """
    records = listed.records
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{RULES_VERSION}|{sorted(splits)}|{shard}|{deep_device}|{len(records)}".encode())
    h.update("\0".join(r.path for r in records).encode("utf-8", "surrogateescape"))
    h.update(listed.sizes.tobytes())
    h.update(listed.mtimes.tobytes())
    h.update("\0".join(f"{r.split}\t{r.label}\t{r.class_name}\t{getattr(r, 'youtube_id', None)}\t"
                       f"{getattr(r, 'time_start', None)}\t{getattr(r, 'time_end', None)}"
                       for r in records).encode("utf-8", "surrogateescape"))
    return h.hexdigest()


class Changes(NamedTuple):
    """How the listed files compare with the manifest."""

    to_probe: list[FileRecord]  # new, changed, or due a (deep) probe again
    relabelled: list[FileRecord]  # unchanged files whose index metadata changed
    listed: set[str] | None  # absolute paths of every listed file (None: the listing did not change)


def find_changes(manifest: Manifest, listed: Listed, device: Device, deep: bool, retry_bad: bool) -> Changes:
    """Compare the ``stat``-ed files with the manifest and decide which ones to probe.

    A stored file is reused when its size and mtime are unchanged, it is
    deep-checked on ``device`` if ``deep`` asks for that, and (with
    ``retry_bad``) it is not marked ``bad``.
    """
    known = manifest.known_files(deep=deep)
    retry = manifest.bad_files() if retry_bad else set()
    changes = Changes([], [], set())
    sizes, mtimes = listed.sizes.tolist(), listed.mtimes.tolist()
    for i, rec in enumerate(listed.records):
        old = known.get(rec.path)
        if old is not None and old[0] == sizes[i] and old[1] == mtimes[i] \
                and (not deep or device in old.deep_devices) and rec.path not in retry:
            file_rec = listed.file_record(i)
            if tuple(old[2]) != file_rec.meta():
                changes.relabelled.append(file_rec)
            continue
        changes.to_probe.append(listed.file_record(i))
    return changes


def check_changes(source: str | os.PathLike, manifest_path: str | os.PathLike, *, device: Device,
                  splits: Sequence[str], deep: bool = False, layout: str | None = None,
                  fold: int | None = None) -> int:
    """How many files a scan of ``source`` into ``manifest_path`` would probe, relabel or remove (0: none).

    Reads the manifest only (it may be on read-only storage).
    """
    listing = list_source(source, splits, manifest_path, layout=layout, fold=fold)
    with Manifest(manifest_path) as manifest:
        part = manifest.part
        shard = Shard(*map(int, part["shard"].split("/"))) if part else ALL_FILES
        listed = stat_records(listing.records, listing.root, shard)
        digest = listing_digest(listed, splits=listing.splits, shard=shard, deep_device=device if deep else None)
        known = manifest.current_meta("listing")
        if known is not None and known.get("digest") == digest:
            return 0
        changes = find_changes(manifest, listed, device, deep, retry_bad=False)
        stored = {path for path, split in manifest.paths_and_splits() if split in listing.splits}
    return len(changes.to_probe) + len(changes.relabelled) + len(stored - {r.path for r in listed.records})
