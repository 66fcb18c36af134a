"""The manifest: an SQLite file with one row per video, what the loaders read.

This module holds the public :class:`Manifest`: the writes of a scan and the
numpy columns a loader reads (:meth:`Manifest.video_index`). Its bases hold the
rest: :mod:`.manifest_store` the SQLite file itself (the tables below, opening
it, meta, upgrades, the per-file lists a scan compares with), and
:mod:`.manifest_routes` the routes read per target (:class:`ManifestEntry`,
route totals, the NVDEC classes confirmed on a GPU).

Schema (version :data:`SCHEMA_VERSION`; a version-2 or -3 manifest is read as it
is and upgraded in place by the next scan, one of another version is rebuilt
by it and refused by readers)::

    meta(key PRIMARY KEY, value)         schema_version, rules_version, last_scan (JSON)
    classes(label PRIMARY KEY, name)     the class map: label -> class name
    files(path PRIMARY KEY,              absolute path of the video
          size_bytes, mtime_ns,          what a re-scan compares to skip unchanged files
          split, label, class_name, youtube_id, time_start, time_end,
          probe_reason,                  '' if the file decodes, else why not
          container, codec, profile, pix_fmt, bit_depth, chroma, width, height,
          rotation, interlaced, fps, base_fps, num_frames, duration_s,
          keyframes,                     comma-separated frame indices where a decode may start, e.g. '0,250'
          vfr, has_video,
          num_packets,                   non-empty video packets (DALI's frame count)
          unsafe_seek)                   1 if the --deep check found seeking to keyframes gives wrong frames
    routes(path, device,                 PRIMARY KEY (path, device); device 'gpu' | 'cpu'
           route,                        'dali' | 'fallback' | 'bad'
           reason,                       why not 'dali' ('' if dali)
           deep)                         1 if the --deep check decoded it on this device

    byte_index(path PRIMARY KEY, data)   where each video's packets lie (daliload.stream.byteindex): a remote
                                         window read in one request; read one video at a time (ByteIndexes)

    video_index(target, name, data)      every file's facts and routes as columns (zlib-compressed
                                         numpy arrays), what loaders read: target '' for the facts,
                                         a route target for its routes; valid while meta
                                         'video_index' names the current 'generation'

Probe facts are stored once per file; routes are stored per device, so one
manifest serves a GPU job and a CPU job. A ``--deep`` scan on one device
overwrites that device's route with what the deep check found.

Every write happens in a transaction, in chunks, with SQLite's rollback
journal, so a scan killed at any point (Ctrl-C, SIGKILL, power) leaves a valid
manifest that holds every chunk committed so far. The file is never left in
WAL mode, which SQLite does not support across hosts on a network file system
(NFS, Lustre). Each committed write bumps meta ``generation``; a scan that
changed anything ends by storing every file's facts and routes again as
columns (``video_index``), which a loader reads in a fraction of a second
instead of a row per file.

Readers (:class:`Manifest` with ``writable=False``, the default) open the file
``immutable``: no locks, nothing written next to it, so a manifest on
read-only or network storage reads as it is. A reader checks that the file did
not change while it read and reads again if it did. What a scan hands over to
be stored (a file's index record, its facts as column values) is defined in
:mod:`.rows`.

A damaged file or a full disk raises one line naming the manifest and the fix
(:class:`~.sqlite_file.ManifestDamagedError`, ``OSError(ENOSPC)``); what was committed
before a full disk is kept.
"""

from __future__ import annotations

import zlib
from typing import Iterable, Iterator, Sequence

import numpy as np
from daliload.prescreen.gpus import DEFAULT_GPU_GENERATION
from daliload.prescreen.manifest_routes import FILE_COLUMNS, ManifestEntry, RoutedManifest
from daliload.prescreen.manifest_store import SCHEMA_VERSION
from daliload.prescreen.rows import FACT_COLUMNS, META_COLUMNS, FileRecord, Probed, facts_from_row
from daliload.prescreen.rules import DEVICES, Device, check_device, route_for
from daliload.prescreen.sqlite_file import reads
from daliload.dataset import IndexBuilder, VideoIndex

__all__ = ["SCHEMA_VERSION", "Manifest", "ManifestEntry"]

#: What a :class:`~daliload.dataset.VideoIndex` row holds, in its order (route and reason come from ``routes``).
_INDEX_COLUMNS = ("path", "label", "num_frames", "fps", "width", "height", "route", "reason", "keyframes", "vfr",
                  "unsafe_seek")
#: A video index holds the displayed frame size (the coded one turned by the display rotation), what the fallback
#: outputs once it turns a rotated file upright (a quarter turn swaps the sides): the plan's crops are of that.
_DISPLAYED = {"width": "CASE WHEN f.rotation % 180 != 0 THEN f.height ELSE f.width END",
              "height": "CASE WHEN f.rotation % 180 != 0 THEN f.width ELSE f.height END"}
_ROTATION_AT = FILE_COLUMNS.index("rotation")
_SIDES_AT = (_INDEX_COLUMNS.index("width"), _INDEX_COLUMNS.index("height"))


def _displayed(row: tuple, rotation: int | None) -> tuple:
    """An index row with its width and height swapped when ``rotation`` is a quarter turn (as :data:`_DISPLAYED`)."""
    if not (rotation or 0) % 180:
        return row
    w, h = _SIDES_AT
    values = list(row)
    values[w], values[h] = row[h], row[w]
    return tuple(values)


#: Rows fetched at a time when a split is read as columns: bounds the Python objects alive at once.
_INDEX_CHUNK = 50_000
#: Blobs of a stored index that hold routes (per target); the others hold facts (target '').
_ROUTE_BLOBS = ("route", "reason", "reasons")


class Manifest(RoutedManifest):
    """An open manifest. Use as a context manager.

    Args:
        path: the SQLite file.
        writable: open for writing (the scanner); creates the file and its
            folder if needed, upgrades a version-2 manifest in place and
            rebuilds one of another schema version. Readers leave it ``False``:
            the file is opened ``immutable`` (no locks, nothing written beside
            it; read-only and network storage read it as it is).

    Raises:
        FileNotFoundError: reading a manifest that does not exist.
        ValueError: reading a manifest of another schema version, or a file
            that is not a manifest.
        ManifestDamagedError: the file is damaged (a ``ValueError``).
        OSError: ``ENOSPC`` when the disk is full while writing.

    Example::

        with Manifest(path) as manifest:
            train = [e for e in manifest.entries("train", device="gpu") if e.route != "bad"]
            classes = manifest.classes()
    """

    def __enter__(self) -> "Manifest":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @reads
    def video_index(self, split: str | None, *, device: Device) -> VideoIndex:
        """Every file of ``split`` (all splits if ``None``), routed for ``device``, as columns sorted by path.

        What a loader keeps (:class:`~daliload.dataset.VideoIndex`), with
        the same files and routes as :meth:`entries`: the columns the last
        scan stored when they are current and hold ``device``'s routes (a
        fraction of a second for 650k files), else the rows, a chunk at a time,
        so that no Python object per file outlives its chunk (a few us a file).

        Raises:
            ValueError: unknown ``device``.
        """
        check_device(device)
        index = self._read_stored_index(split, device)
        return index if index is not None else self._index_from_rows(split, device)[0]

    def _index_from_rows(self, split: str | None, device: Device,
                         with_splits: dict[str, int] | None = None) -> tuple[VideoIndex, np.ndarray | None]:
        """:meth:`video_index` from the rows; with ``with_splits`` (split -> code, filled in as met),
        also each file's split code."""
        builder = IndexBuilder()
        codes: list[np.ndarray] = []
        sql = self._route_sql(device)
        if not sql.complete or self.failed_classes(device):
            # Routed here from the stored facts, a file at a time (a GPU generation no scan routed for).
            at = [len(FILE_COLUMNS) + ("route", "reason").index(c) if c in ("route", "reason")
                  else FILE_COLUMNS.index(c) for c in _INDEX_COLUMNS + ("split",)]
            rows: Iterable = _chunks([_displayed(tuple(row[i] for i in at), row[_ROTATION_AT])
                                      for row in self._routed_rows(device, split)], _INDEX_CHUNK)
        else:
            columns = ", ".join(sql.route if c == "route" else sql.reason if c == "reason"
                                else _DISPLAYED.get(c, f"f.{c}") for c in _INDEX_COLUMNS + ("split",))
            cursor = self._conn.execute(*self._files_query(columns, sql, split))
            rows = iter(lambda: cursor.fetchmany(_INDEX_CHUNK), [])
        for chunk in rows:
            if with_splits is not None:
                codes.append(np.array([with_splits.setdefault(row[-1], len(with_splits)) for row in chunk], np.int16))
            builder.add(chunk)
        split_codes = (np.concatenate(codes) if codes else np.zeros(0, np.int16)) if with_splits is not None else None
        return builder.build(), split_codes

    # -- writing (the scanner) -----------------------------------------------------------------

    def write_probed(self, probed: Sequence[Probed]) -> None:
        """Store probed files (facts, routes per device) in one transaction."""
        self._require_writable()
        files = [(p.record.path, p.record.size_bytes, p.record.mtime_ns, *p.record.meta(),
                  *p.rows.facts) for p in probed]  # fmt: skip
        routes = [(p.record.path, *row) for p in probed for row in p.rows.routes]
        marks = ", ".join("?" * len(FILE_COLUMNS))
        with self._transaction() as conn:
            conn.executemany(f"INSERT OR REPLACE INTO files VALUES ({marks})", files)
            conn.executemany("INSERT OR REPLACE INTO routes VALUES (?, ?, ?, ?, ?)", routes)
            conn.executemany("DELETE FROM byte_index WHERE path = ?",
                             [(p.record.path,) for p in probed if p.rows.byte_index is None])
            conn.executemany("INSERT OR REPLACE INTO byte_index VALUES (?, ?)",
                             [(p.record.path, p.rows.byte_index) for p in probed if p.rows.byte_index is not None])

    def update_meta(self, records: Iterable[FileRecord]) -> int:
        """Rewrite the index metadata (split, label, class, ...) of unchanged files; count them."""
        self._require_writable()
        rows = [(*rec.meta(), rec.path) for rec in records]
        if rows:
            with self._transaction() as conn:
                assignments = ", ".join(c + " = ?" for c in META_COLUMNS)
                conn.executemany(
                    f"UPDATE files SET {assignments} WHERE path = ?",
                    rows,
                )
        return len(rows)

    def remove_missing(self, keep: set[str], splits: Iterable[str]) -> int:
        """Delete files of ``splits`` whose path is not in ``keep`` (gone from the dataset)."""
        self._require_writable()
        splits = list(splits)
        placeholders = ", ".join("?" * len(splits))
        stale = [
            path
            for (path,) in self._conn.execute(
                f"SELECT path FROM files WHERE split IN ({placeholders})", splits
            )
            if path not in keep
        ]
        if not stale:
            return 0
        with self._transaction() as conn:
            for chunk in _chunks(stale, 500):
                marks = ", ".join("?" * len(chunk))
                conn.execute(f"DELETE FROM files WHERE path IN ({marks})", chunk)
                conn.execute(f"DELETE FROM routes WHERE path IN ({marks})", chunk)
                conn.execute(f"DELETE FROM byte_index WHERE path IN ({marks})", chunk)
        return len(stale)

    def set_classes(self, classes: Sequence[str]) -> None:
        """Replace the class map (label ``i`` is ``classes[i]``)."""
        self._require_writable()
        if self.classes() == tuple(classes):
            return
        with self._transaction() as conn:
            conn.execute("DELETE FROM classes")
            conn.executemany("INSERT INTO classes VALUES (?, ?)", enumerate(classes))

    def finish_scan(self, summary: dict, *, listing: dict | None = None) -> None:
        """Record the completed scan; store the files as columns again if anything changed.

        Args:
            summary: what the scan did (meta ``last_scan``).
            listing: what the scan listed (a digest; see :func:`.scan.scan`), kept
                as meta ``listing`` while nothing else is written.
        """
        self._require_writable()
        if self.current_meta("video_index") is None:
            self.store_video_index()
        stored = self.current_meta("video_index")
        with self._transaction() as conn:
            # The summary changes no file: the columns stored a moment ago stay current.
            conn.stamps = {"last_scan": summary, "video_index": {k: stored[k] for k in ("targets", "named")}}
            if listing is not None:
                conn.stamps["listing"] = listing

    def route_every_file_for(self, device: Device) -> int:
        """Store the rules' route on ``device`` for every file that has none there; count them.

        A scan does this for the GPU generation it routes for, so loaders on
        that GPU read stored routes instead of routing every file at start.
        """
        self._require_writable()
        if device in DEVICES or self._route_sql(device).complete:
            return 0
        rows = self._conn.execute(
            f"SELECT f.path, {', '.join('f.' + c for c in FACT_COLUMNS)} FROM files f "
            "LEFT JOIN routes r ON r.path = f.path AND r.device = ? WHERE r.path IS NULL", (device,)).fetchall()
        with self._transaction() as conn:
            conn.executemany("INSERT INTO routes VALUES (?, ?, ?, ?, 0)",
                             ((row[0], device, *route_for(facts_from_row(row[0], row[1:]), device))
                              for row in rows))
        return len(rows)

    def store_video_index(self) -> None:
        """Store every file's facts, and routes for each target with a route for every file, as columns.

        About 4 us per file (a query and zlib); a scan that changed nothing keeps the stored ones.
        """
        self._require_writable()
        devices = {d for (d,) in self._conn.execute("SELECT DISTINCT device FROM routes")}
        targets = [t for t in sorted(set(DEVICES) | devices) if self._route_sql(t).complete]
        facts: VideoIndex | None = None
        blobs: list[tuple[str, str, bytes]] = []
        splits: dict[str, int] = {}
        for target in targets:
            index, split_codes = self._index_from_rows(None, target, with_splits=splits)
            if facts is None:
                facts = index
                blobs += [("", name, data) for name, data in index.to_blobs().items() if name not in _ROUTE_BLOBS]
                blobs.append(("", "split", split_codes.tobytes()))
                blobs.append(("", "splits", "\0".join(splits).encode("utf-8", "surrogateescape")))
            blobs += [(target, name, data) for name, data in index.to_blobs().items() if name in _ROUTE_BLOBS]
        with self._transaction() as conn:
            conn.execute("DELETE FROM video_index")
            conn.executemany("INSERT INTO video_index VALUES (?, ?, ?)",
                             [(target, name, zlib.compress(data, 1)) for target, name, data in blobs])
            conn.stamps["video_index"] = {"targets": targets, "named": sorted(devices)}

    def _stored_target(self, device: Device, stored: dict) -> str | None:
        """The stored routes that are ``device``'s: its own, or ``gpu``'s for the default generation."""
        if device in stored["targets"]:
            return device
        if device == f"gpu:{DEFAULT_GPU_GENERATION}" and "gpu" in stored["targets"] and device not in stored["named"]:
            return "gpu"
        return None

    def _read_stored_index(self, split: str | None, device: Device) -> VideoIndex | None:
        """The stored columns of ``split`` routed for ``device``, or ``None`` if they do not hold them."""
        stored = self.current_meta("video_index")
        target = self._stored_target(device, stored) if stored is not None else None
        if target is None or self.failed_classes(device):
            return None
        blobs = {name: zlib.decompress(data) for target_, name, data in self._conn.execute(
            "SELECT target, name, data FROM video_index WHERE target IN ('', ?)", (target,)).fetchall()
            if target_ == "" or name in _ROUTE_BLOBS}
        index = VideoIndex.from_blobs(blobs)
        if split is None:
            return index
        names = blobs["splits"].decode("utf-8", "surrogateescape").split("\0")
        codes = np.frombuffer(blobs["split"], np.int16)
        return index.compress(codes == (names.index(split) if split in names else -1))


def _chunks(items: Sequence, size: int) -> Iterator[Sequence]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
