"""Joining the manifests of a scan spread over machines into one.

``daliload scan ROOT --shard I/N --manifest PART_I`` on N machines (or an
array job) probes share ``I`` of the files each (:mod:`daliload.dataset._shard`), into
a manifest of its own; ``daliload scan --merge PART_0 ... PART_N-1 --manifest
OUT`` (:func:`merge_manifests`) joins them. Every part must be a share of the
same root, of the same N, routed by the same rules; together they must be
every share once. Rows are copied by SQLite itself (``ATTACH``), so a merge of
650k files takes seconds. The merged manifest is a whole scan of the root: a
later ``daliload scan ROOT --manifest OUT`` probes only what changed since.
"""

from __future__ import annotations

import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from daliload.prescreen.manifest import SCHEMA_VERSION, Manifest
from daliload.prescreen.rules import RULES_VERSION
from daliload.prescreen.sqlite_file import RAW_TEXT_KEY


@dataclass(frozen=True)
class MergeSummary:
    """What :func:`merge_manifests` wrote: the manifest, its root, how many parts and files."""

    manifest_path: Path
    root: str
    parts: int
    files: int
    elapsed_s: float

    def format(self) -> str:
        return (f"manifest: {self.manifest_path}\nmerged {self.parts} shard(s) of the scan of {self.root}: "
                f"{self.files} files in {self.elapsed_s:.1f} s")


def merge_manifests(parts: Sequence[str | os.PathLike], out: str | os.PathLike) -> MergeSummary:
    """Join the shards' manifests ``parts`` into one manifest at ``out`` (replaced if it exists).

    Raises:
        ValueError: no part; ``out`` is one of the parts; a part that is not a
            shard of a scan of a root, or of another root, N, schema or rules;
            shards missing or given twice; class maps that differ; a file in two parts.
        FileNotFoundError: a part does not exist.
    """
    started = time.monotonic()
    parts = [Path(os.path.abspath(p)) for p in parts]
    out = Path(os.path.abspath(out))
    if not parts:
        raise ValueError("nothing to merge: give the manifests of every shard (daliload scan --merge PART...)")
    if out in parts:
        raise ValueError(f"--manifest {out} is one of the parts: write the merged manifest to another file")
    root, count, classes = _check_parts(parts)
    partial = out.with_name(out.name + ".merging")
    partial.unlink(missing_ok=True)
    with Manifest(partial, writable=True) as merged:
        for part in parts:
            _copy_rows(merged, part)
        merged.set_classes(classes)
        merged.set_part("0/1", root)
        files = len(merged)
        merged.finish_scan({"merged": [str(p) for p in parts], "shards": count, "total": files, "probed": 0,
                            "splits": merged.splits(), "finished_at": time.time()})
    os.replace(partial, out)
    return MergeSummary(out, root, len(parts), files, time.monotonic() - started)


def _check_parts(parts: list[Path]) -> tuple[str, int, tuple[str, ...]]:
    """``(root, N, class map)`` shared by every part, which together hold shards 0..N-1 once each."""
    seen: dict[int, Path] = {}
    root = count = classes = None
    for path in parts:
        if not path.is_file():
            raise FileNotFoundError(f"no manifest at {path} (a part to merge)")
        with Manifest(path) as manifest:
            part, rules = manifest.part, manifest._meta("rules_version")
            schema, names = manifest._meta("schema_version"), manifest.classes()
        if part is None or "/" not in part["shard"]:
            raise ValueError(f"{path} is not a shard of a scan of a root (`daliload scan ROOT --shard I/N "
                             "--manifest PART` writes those)")
        if schema != str(SCHEMA_VERSION) or rules != str(RULES_VERSION):
            raise ValueError(f"{path} was written by another daliload (schema {schema}, rules {rules}; this one: "
                             f"{SCHEMA_VERSION}, {RULES_VERSION}): scan its shard again with this one")
        index, n = (int(v) for v in part["shard"].split("/"))
        if root is None:
            root, count, classes = part["root"], n, names
        if part["root"] != root:
            raise ValueError(f"{path} is a scan of {part['root']}, the first part one of {root}: merge the shards "
                             "of one root")
        if n != count:
            raise ValueError(f"{path} is shard {part['shard']}, the first part is of {count} shards: merge the "
                             "shards of one scan")
        if names != classes:
            raise ValueError(f"{path} has another class map than the first part (the dataset changed between the "
                             "shards' scans?): scan every shard again")
        if index in seen:
            raise ValueError(f"shard {index}/{n} is given twice: {seen[index]} and {path}")
        seen[index] = path
    missing = sorted(set(range(count)) - set(seen))
    if missing:
        raise ValueError(f"shard(s) {', '.join(f'{i}/{count}' for i in missing)} of the scan of {root} are missing: "
                         "give every shard's manifest")
    return root, count, classes


def _copy_rows(merged: Manifest, part: Path) -> None:
    """Copy ``part``'s files, routes and test-decode verdicts into ``merged`` (in SQLite, one transaction)."""
    merged._conn.execute("ATTACH DATABASE ? AS part", (str(part),))
    try:
        with merged._transaction() as conn:
            # A part whose file names are not all UTF-8 says so (sqlite_file.RAW_TEXT_KEY); so must the merged file.
            conn.execute("INSERT OR IGNORE INTO meta SELECT * FROM part.meta WHERE key = ?", (RAW_TEXT_KEY,))
            merged._conn.decode_raw_text()
            try:
                conn.execute("INSERT INTO files SELECT * FROM part.files")
            except sqlite3.IntegrityError as err:
                (path,) = conn.execute("SELECT path FROM part.files WHERE path IN (SELECT path FROM main.files) "
                                       "LIMIT 1").fetchone()
                raise ValueError(f"{path} is in {part} and in another part: the parts are not the shards of one "
                                 "scan") from err
            conn.execute("INSERT INTO routes SELECT * FROM part.routes")
            if conn.execute("SELECT 1 FROM part.sqlite_master WHERE name = 'byte_index'").fetchone():
                conn.execute("INSERT OR REPLACE INTO byte_index SELECT * FROM part.byte_index")
            conn.execute("INSERT OR REPLACE INTO nvdec_classes SELECT * FROM part.nvdec_classes")
    finally:
        merged._conn.execute("DETACH DATABASE part")
