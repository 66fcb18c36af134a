"""The manifest: an SQLite file with one row per video, what the loaders read.

(About 560 lines for one concept, the SQLite store: its schema, the queries
that read routes per target, and the writes of a scan; what a row holds lives
in :mod:`.rows`.)

Schema (version :data:`SCHEMA_VERSION`; a version-2 manifest is read as it
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
(:class:`ManifestDamagedError`, ``OSError(ENOSPC)``); what was committed
before a full disk is kept.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, NamedTuple, Sequence

import numpy as np
from daliload.prescreen.rows import (
    FACT_COLUMNS,
    META_COLUMNS,
    FileRecord,
    KnownFile,
    Probed,
    facts_from_row,
)
from daliload.prescreen.gpus import DEFAULT_GPU_GENERATION
from daliload.prescreen.rules import DEVICES, RULES_VERSION, Device, Route, check_device, nvdec_class, route_for
from daliload.prescreen.sqlite_file import Connection, ManifestDamagedError, Transaction, reads
from daliload.videoindex import IndexBuilder, VideoIndex

logger = logging.getLogger(__name__)

#: Bump on any change to the tables below (or to the columns :mod:`.rows` fills). 3 added ``video_index``
#: and meta ``generation``: a daliload that does not bump it must not write a manifest that has them.
SCHEMA_VERSION = 3
#: Versions :meth:`Manifest._prepare_schema` upgrades in place, and readers read as they are (their tables
#: are a subset of this one's; without stored columns, a reader reads the rows).
_UPGRADABLE = ("2",)

#: Probe facts a ManifestEntry carries under the same name.
_ENTRY_FACTS = (
    "num_frames", "fps", "width", "height", "codec", "profile", "pix_fmt", "bit_depth", "chroma",
    "rotation", "interlaced", "duration_s", "keyframes", "vfr", "base_fps", "container",
    "num_packets", "unsafe_seek",
)  # fmt: skip
_FILE_COLUMNS = ("path", "size_bytes", "mtime_ns") + META_COLUMNS + FACT_COLUMNS
#: What a :class:`~daliload.videoindex.VideoIndex` row holds, in its order (route and reason come from ``routes``).
_INDEX_COLUMNS = ("path", "label", "num_frames", "fps", "width", "height", "route", "reason", "keyframes", "vfr",
                  "unsafe_seek")
#: A video index holds the displayed frame size (the coded one turned by the display rotation), what the fallback
#: outputs once it turns a rotated file upright (a quarter turn swaps the sides): the plan's crops are of that.
_DISPLAYED = {"width": "CASE WHEN f.rotation % 180 != 0 THEN f.height ELSE f.width END",
              "height": "CASE WHEN f.rotation % 180 != 0 THEN f.width ELSE f.height END"}
_ROTATION_AT = _FILE_COLUMNS.index("rotation")
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

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS classes (label INTEGER PRIMARY KEY, name TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS files (
    path TEXT PRIMARY KEY,
    size_bytes INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    split TEXT NOT NULL,
    label INTEGER NOT NULL,
    class_name TEXT NOT NULL,
    youtube_id TEXT,
    time_start REAL,
    time_end REAL,
    probe_reason TEXT NOT NULL,
    container TEXT,
    codec TEXT,
    profile TEXT,
    pix_fmt TEXT,
    bit_depth INTEGER,
    chroma TEXT,
    width INTEGER,
    height INTEGER,
    rotation INTEGER NOT NULL,
    interlaced INTEGER NOT NULL,
    fps REAL,
    base_fps REAL,
    num_frames INTEGER NOT NULL,
    duration_s REAL,
    keyframes TEXT NOT NULL,
    vfr INTEGER NOT NULL,
    has_video INTEGER NOT NULL,
    num_packets INTEGER NOT NULL,
    unsafe_seek INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS files_by_split ON files (split);
CREATE TABLE IF NOT EXISTS routes (
    path TEXT NOT NULL,
    device TEXT NOT NULL,
    route TEXT NOT NULL,
    reason TEXT NOT NULL,
    deep INTEGER NOT NULL,
    PRIMARY KEY (path, device)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS nvdec_classes (
    target TEXT NOT NULL,
    class TEXT NOT NULL,
    ok INTEGER NOT NULL,
    reason TEXT NOT NULL,
    PRIMARY KEY (target, class)
);
CREATE TABLE IF NOT EXISTS video_index (
    target TEXT NOT NULL,
    name TEXT NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (target, name)
);
"""
#: Blobs of a stored index that hold routes (per target); the others hold facts (target '').
_ROUTE_BLOBS = ("route", "reason", "reasons")



@dataclass(frozen=True)
class ManifestEntry:
    """One video as the manifest records it, routed for one device.

    Attributes:
        path: absolute path of the file.
        label: class index; ``class_name`` is its name.
        split: ``"train"``, ``"val"``, ...
        route: ``"dali"``, ``"fallback"`` or ``"bad"`` on the device asked for.
        reason: why the route is not ``dali`` (``""`` if it is).
        num_frames: frames a full sequential decode outputs (counted from
            packets by the rule of :mod:`fallback.numbering`).
        fps: average frame rate (frames per second); ``base_fps`` the container's base rate.
        width, height: coded frame size in pixels, before ``rotation`` (degrees).
        codec, profile, pix_fmt, bit_depth, chroma, container: stream format.
        duration_s: duration in seconds.
        keyframes: presentation-order frame indices where a decode may start.
        vfr: variable-frame-rate hint (timestamps do not step evenly).
        interlaced: the stream is interlaced.
        deep_checked: the ``--deep`` check decoded it on this device.
        size_bytes: file size when probed.
        youtube_id, time_start, time_end: from the dataset index, if known.
        num_packets: non-empty video packets (DALI numbers frames by packet).
        unsafe_seek: the ``--deep`` check found that decoding from a keyframe
            after the start gives wrong frames: the fallback should decode this
            file from its start (``StreamHint(unsafe_seek=True)``).
    """

    path: str
    label: int
    class_name: str
    split: str
    route: Route
    reason: str
    num_frames: int
    fps: float | None
    width: int | None
    height: int | None
    codec: str | None
    profile: str | None
    pix_fmt: str | None
    bit_depth: int | None
    chroma: str | None
    rotation: int
    interlaced: bool
    duration_s: float | None
    keyframes: tuple[int, ...]
    vfr: bool
    base_fps: float | None
    container: str | None
    deep_checked: bool
    size_bytes: int
    youtube_id: str | None = None
    time_start: float | None = None
    time_end: float | None = None
    num_packets: int = 0
    unsafe_seek: bool = False


class Manifest:
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

    def __init__(self, path: str | os.PathLike, *, writable: bool = False) -> None:
        self.path = Path(os.path.abspath(path))
        self.writable = writable
        if writable:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = Connection.writer(self.path)
            try:
                self._leave_wal()
            except ValueError:
                self._conn.close()
                raise
            # NORMAL: a kill never corrupts (the rollback journal), a power cut may lose the last chunks.
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._prepare_schema()
        else:
            if not self.path.is_file():
                raise FileNotFoundError(
                    f"no manifest at {self.path}; create it with "
                    f"`daliload scan ROOT --manifest {self.path}`"
                )
            self._conn = Connection.reader(self.path)
            version = self._meta("schema_version")
            if version != str(SCHEMA_VERSION) and version not in _UPGRADABLE:
                self._conn.close()
                raise ValueError(
                    f"manifest {self.path} has schema version {version}, this daliload reads "
                    f"version {SCHEMA_VERSION}: re-run `daliload scan` to rebuild it"
                )

    def _reopen(self, *, immutable: bool) -> None:
        """A fresh reader's connection, after the file changed under a read (:func:`.sqlite_file.reads`)."""
        logger.info("manifest %s changed while it was read; reading it again", self.path)
        self._conn.close()
        self._conn = Connection.reader(self.path, immutable=immutable)

    def _leave_wal(self) -> None:
        """Use the rollback journal, whatever an older daliload left (it ran scans in WAL mode).

        Switching out of WAL needs the only connection; SQLite's pragma then
        answers the mode it kept instead of failing, so the answer is checked.
        """
        try:
            mode = self._conn.execute("PRAGMA journal_mode=DELETE").fetchone()[0]
        except ManifestDamagedError as err:
            raise ValueError(f"{self.path} exists but is not an SQLite manifest ({err.__cause__}); "
                             "delete it or pick another manifest path") from err
        except sqlite3.OperationalError as err:  # "database is locked": another connection shares its WAL
            mode = f"WAL ({err})"
        if mode.lower() != "delete":
            raise ValueError(f"manifest {self.path} is in {mode} mode and another process holds it open, so it "
                             "cannot be made a self-contained file (WAL does not work across hosts on a network "
                             "file system): stop the process that has it open (a job of an older daliload) and "
                             "run again")

    # -- context manager ---------------------------------------------------------------------

    def __enter__(self) -> "Manifest":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._conn.close()

    def __repr__(self) -> str:
        return f"Manifest({str(self.path)!r}, files={len(self)})"

    @reads
    def __len__(self) -> int:
        return self._conn.execute("SELECT COUNT(*) FROM files").fetchone()[0]

    # -- reading -------------------------------------------------------------------------------

    @reads
    def _meta(self, key: str) -> str | None:
        try:
            row = self._conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        except sqlite3.OperationalError as err:  # no meta table: an SQLite file, but no manifest
            raise ValueError(f"{self.path} is not a daliload manifest ({err})") from err
        return row[0] if row else None

    @property
    def last_scan(self) -> dict:
        """What the last completed scan did (device, deep, counts, time), or ``{}``."""
        text = self._meta("last_scan")
        return json.loads(text) if text else {}

    @reads
    def classes(self) -> tuple[str, ...]:
        """Class names in label order: ``classes()[entry.label] == entry.class_name``."""
        return tuple(
            name for (name,) in self._conn.execute("SELECT name FROM classes ORDER BY label")
        )

    @reads
    def splits(self) -> tuple[str, ...]:
        """The splits the manifest holds, sorted."""
        return tuple(
            s for (s,) in self._conn.execute("SELECT DISTINCT split FROM files ORDER BY split")
        )

    @reads
    def entries(self, split: str | None = None, *, device: Device) -> list[ManifestEntry]:
        """Every file of ``split`` (all splits if ``None``), routed for ``device``, sorted by path.

        Raises:
            ValueError: unknown ``device``.
        """
        return [self._entry(row) for row in self._routed_rows(device, split)]

    @reads
    def video_index(self, split: str | None, *, device: Device) -> VideoIndex:
        """Every file of ``split`` (all splits if ``None``), routed for ``device``, as columns sorted by path.

        What a loader keeps (:class:`~daliload.videoindex.VideoIndex`), with
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
            at = [len(_FILE_COLUMNS) + ("route", "reason").index(c) if c in ("route", "reason")
                  else _FILE_COLUMNS.index(c) for c in _INDEX_COLUMNS + ("split",)]
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

    def _route_sql(self, device: Device) -> _RouteSql:
        """How to read ``device``'s routes beside the files (see :class:`_RouteSql`).

        ``gpu:<default generation>`` is what ``gpu`` means: its rules rows are
        ``gpu``'s, and rows stored for it by name (a deep check) win. Another
        generation is complete when a scan stored a route for it for every file.
        """
        if device in DEVICES:
            return _RouteSql("r.route", "r.reason", "r.deep", "JOIN routes r ON r.path = f.path AND r.device = ?",
                             (device,), True)
        if device == f"gpu:{DEFAULT_GPU_GENERATION}":
            joins = ("JOIN routes r ON r.path = f.path AND r.device = 'gpu' "
                     "LEFT JOIN routes o ON o.path = f.path AND o.device = ?")
            return _RouteSql("COALESCE(o.route, r.route)", "COALESCE(o.reason, r.reason)", "COALESCE(o.deep, r.deep)",
                             joins, (device,), True)
        stored = self._conn.execute("SELECT COUNT(*) FROM routes WHERE device = ?", (device,)).fetchone()[0]
        return _RouteSql("r.route", "r.reason", "r.deep", "LEFT JOIN routes r ON r.path = f.path AND r.device = ?",
                         (device,), stored == len(self))

    @staticmethod
    def _files_query(columns: str, sql: _RouteSql, split: str | None) -> tuple[str, list]:
        query = f"SELECT {columns} FROM files f {sql.joins}"
        params: list = list(sql.params)
        if split is not None:
            query += " WHERE f.split = ?"
            params.append(split)
        return query + " ORDER BY f.path", params

    def _routed_rows(self, device: Device, split: str | None) -> list[tuple]:
        """File columns plus ``(route, reason, deep)`` on ``device``, sorted by path.

        Targets stored for every file are read (:meth:`_route_sql`); another
        GPU generation is routed here from the stored probe facts (no
        re-probe), with the rows a deep check stored for it winning.
        """
        check_device(device)
        sql = self._route_sql(device)
        columns = ", ".join(f"f.{c}" for c in _FILE_COLUMNS) + f", {sql.route}, {sql.reason}, {sql.deep}"
        rows = self._conn.execute(*self._files_query(columns, sql, split)).fetchall()
        facts_at = len(_FILE_COLUMNS) - len(FACT_COLUMNS)
        if not sql.complete:
            rows = [row if row[-3] is not None else
                    (*row[:-3], *route_for(facts_from_row(row[0], row[facts_at:len(_FILE_COLUMNS)]), device), 0)
                    for row in rows]
        failed = self.failed_classes(device)
        if not failed:
            return rows
        # A class a test decode on this GPU could not decode goes to the fallback, whatever the table says.
        return [(*row[:-3], "fallback", failed[key], row[-1])
                if row[-3] == "dali" and (key := nvdec_class(facts_from_row(row[0], row[facts_at:len(_FILE_COLUMNS)])))
                in failed else row
                for row in rows]

    # -- NVDEC classes confirmed on a GPU ------------------------------------------------------

    @reads
    def class_verdicts(self, target: Device) -> dict[str, tuple[bool, str]]:
        """``class -> (decoded, reason)`` of the test decodes run for ``target`` (see :mod:`.confirm`)."""
        try:
            rows = self._conn.execute("SELECT class, ok, reason FROM nvdec_classes WHERE target = ?", (target,))
            return {key: (bool(ok), reason) for key, ok, reason in rows}
        except sqlite3.OperationalError:  # a manifest opened read-only from before the table existed
            return {}

    def failed_classes(self, target: Device) -> dict[str, str]:
        """``class -> reason`` of the classes a test decode for ``target`` failed on."""
        return {key: reason for key, (ok, reason) in self.class_verdicts(target).items() if not ok}

    def record_class(self, target: Device, key: str, ok: bool, reason: str) -> None:
        """Store the verdict of a test decode of ``key`` files for ``target``."""
        self._require_writable()
        with self._transaction() as conn:
            conn.execute("INSERT OR REPLACE INTO nvdec_classes VALUES (?, ?, ?, ?)", (target, key, int(ok), reason))

    @staticmethod
    def _entry(row: Sequence) -> ManifestEntry:
        file = dict(zip(_FILE_COLUMNS, row))
        facts = facts_from_row(file["path"], row[len(_FILE_COLUMNS) - len(FACT_COLUMNS) :])
        route, reason, deep = row[len(_FILE_COLUMNS) :]
        return ManifestEntry(
            path=file["path"], label=file["label"], class_name=file["class_name"],
            split=file["split"], route=route, reason=reason, deep_checked=bool(deep),
            size_bytes=file["size_bytes"], youtube_id=file["youtube_id"],
            time_start=file["time_start"], time_end=file["time_end"],
            **{name: getattr(facts, name) for name in _ENTRY_FACTS},
        )  # fmt: skip

    @reads
    def route_totals(
        self, device: Device, splits: Iterable[str] | None = None
    ) -> tuple[dict[str, int], dict[str, float], dict[tuple[str, str], int]]:
        """``(files per route, hours per route, files per (route, reason))`` on ``device``."""
        grouped = self._route_groups(device, splits)
        files: dict[str, int] = {}
        hours: dict[str, float] = {}
        reasons: dict[tuple[str, str], int] = {}
        for (route, reason), (count, seconds) in grouped.items():
            files[route] = files.get(route, 0) + count
            hours[route] = hours.get(route, 0.0) + seconds / 3600.0
            if reason:
                reasons[(route, reason)] = count
        return files, hours, reasons

    def _route_groups(self, device: Device, splits: Iterable[str] | None) -> dict[tuple[str, str], list]:
        """``(route, reason) -> [files, seconds]`` on ``device``: in SQL for stored targets."""
        check_device(device)
        wanted = None if splits is None else list(splits)
        if device in DEVICES and not self.failed_classes(device):
            where, params = "", [device]
            if wanted is not None:
                where = f" WHERE f.split IN ({', '.join('?' * len(wanted))})"
                params += wanted
            rows = self._conn.execute(
                "SELECT r.route, r.reason, COUNT(*), TOTAL(f.duration_s) FROM files f "
                f"JOIN routes r ON r.path = f.path AND r.device = ?{where} GROUP BY r.route, r.reason", params)
            return {(route, reason): [count, seconds] for route, reason, count, seconds in rows}
        grouped: dict[tuple[str, str], list] = {}
        for row in self._routed_rows(device, None):
            entry = self._entry(row)
            if wanted is None or entry.split in wanted:
                counts = grouped.setdefault((entry.route, entry.reason), [0, 0.0])
                counts[0] += 1
                counts[1] += entry.duration_s or 0.0
        return grouped

    # -- writing (the scanner) -----------------------------------------------------------------

    def _require_writable(self) -> None:
        if not self.writable:
            raise ValueError(f"manifest {self.path} is open read-only; open it with writable=True")

    def _transaction(self) -> Transaction:
        return Transaction(self._conn)

    def generation(self) -> int:
        """Bumped by every committed write: what a stored index is checked against."""
        return int(self._meta("generation") or 0)

    def _prepare_schema(self) -> None:
        try:
            version = self._conn.execute(
                "SELECT value FROM meta WHERE key = 'schema_version'"
            ).fetchone()
        except sqlite3.OperationalError:
            version = None  # new file
        if version is not None and version[0] == str(SCHEMA_VERSION):
            self._check_rules()
            return
        with self._transaction() as conn:
            if version is not None and version[0] in _UPGRADABLE:
                logger.info("manifest %s: upgrading schema version %s to %s in place", self.path, version[0],
                            SCHEMA_VERSION)
            elif version is not None and version[0] != str(SCHEMA_VERSION):
                logger.warning(
                    "manifest %s has schema version %s, rebuilding it as version %s",
                    self.path,
                    version[0],
                    SCHEMA_VERSION,
                )
                for table in ("meta", "classes", "files", "routes", "nvdec_classes", "video_index"):
                    conn.execute(f"DROP TABLE IF EXISTS {table}")
            conn.executescript_in_transaction(_SCHEMA)
            conn.execute(
                "INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
            )
        self._check_rules()

    def _check_rules(self) -> None:
        """Re-route every stored file if the capability rules changed since it was written."""
        rules = self._meta("rules_version")
        if rules != str(RULES_VERSION):
            if rules is not None:
                self._reroute_all()
            with self._transaction() as conn:
                conn.execute(
                    "INSERT OR REPLACE INTO meta VALUES ('rules_version', ?)", (str(RULES_VERSION),)
                )

    def _reroute_all(self) -> None:
        """Re-apply the (changed) capability rules to every stored file; drops deep results."""
        logger.info(
            "capability rules changed: re-routing every file of %s from its stored facts", self.path
        )
        query = f"SELECT path, {', '.join(FACT_COLUMNS)} FROM files"
        with self._transaction() as conn:
            rows = conn.execute(query).fetchall()
            conn.execute("DELETE FROM routes")
            conn.executemany(
                "INSERT INTO routes VALUES (?, ?, ?, ?, 0)",
                (
                    (row[0], device, *route_for(facts_from_row(row[0], row[1:]), device))
                    for row in rows
                    for device in DEVICES
                ),
            )

    @reads
    def transient_failures(self) -> set[str]:
        """Paths marked ``bad`` only because their probe hung, crashed or raised.

        Those verdicts may say more about the machine at the time (overload, a
        flaky mount) than about the file; they are kept until an explicit
        ``daliload scan --retry-bad``, so that two jobs on unchanged files see
        the same list of videos.
        """
        rows = self._conn.execute(
            "SELECT DISTINCT path FROM routes WHERE route = 'bad' AND "
            "(reason IN ('timeout', 'crash') OR reason LIKE 'probe error:%')")
        return {path for (path,) in rows}

    @reads
    def known_files(self, *, deep: bool = False) -> dict[str, tuple]:
        """Every stored file, keyed by path: ``(size_bytes, mtime_ns, index metadata)``, plus, with
        ``deep``, the devices it was deep-checked on (a :class:`KnownFile` each)."""
        columns = ", ".join(("path", "size_bytes", "mtime_ns") + META_COLUMNS)
        rows = self._conn.execute(f"SELECT {columns} FROM files")
        if not deep:
            return {row[0]: (row[1], row[2], row[3:]) for row in rows}
        checked: dict[str, set[str]] = {}
        for path, device in self._conn.execute("SELECT path, device FROM routes WHERE deep = 1"):
            checked.setdefault(path, set()).add(device)
        return {row[0]: KnownFile(row[1], row[2], tuple(row[3:]), frozenset(checked.get(row[0], ())))
                for row in rows}

    def write_probed(self, probed: Sequence[Probed]) -> None:
        """Store probed files (facts, routes per device) in one transaction."""
        self._require_writable()
        files = [(p.record.path, p.record.size_bytes, p.record.mtime_ns, *p.record.meta(),
                  *p.rows.facts) for p in probed]  # fmt: skip
        routes = [(p.record.path, *row) for p in probed for row in p.rows.routes]
        marks = ", ".join("?" * len(_FILE_COLUMNS))
        with self._transaction() as conn:
            conn.executemany(f"INSERT OR REPLACE INTO files VALUES ({marks})", files)
            conn.executemany("INSERT OR REPLACE INTO routes VALUES (?, ?, ?, ?, ?)", routes)

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

    @reads
    def current_meta(self, key: str) -> dict | None:
        """Meta ``key`` (a JSON record stamped with a generation) if nothing was written since, else ``None``."""
        text = self._meta(key)
        if not text:
            return None
        value = json.loads(text)
        return value if int(value.get("generation", -1)) == self.generation() else None

    def set_part(self, shard: str, root: str) -> None:
        """Mark this manifest as share ``shard`` (``"I/N"``) of the scan of ``root`` (``"0/1"``: all of it)."""
        self._require_writable()
        with self._transaction() as conn:
            conn.execute("INSERT OR REPLACE INTO meta VALUES ('part', ?)",
                         (json.dumps({"shard": shard, "root": root}),))

    @property
    def part(self) -> dict | None:
        """``{"shard": "I/N", "root": ROOT}`` of a manifest written by a scan of a root, else ``None``."""
        text = self._meta("part")
        return json.loads(text) if text else None

    @reads
    def paths_and_splits(self) -> list[tuple[str, str]]:
        """``(path, split)`` of every stored file."""
        return self._conn.execute("SELECT path, split FROM files").fetchall()

    @reads
    def bad_files(self) -> set[str]:
        """Paths the probe marked ``bad`` (what ``daliload scan --retry-bad`` probes again)."""
        return {path for (path,) in self._conn.execute("SELECT DISTINCT path FROM routes WHERE route = 'bad'")}

    @reads
    def sample(self, count: int) -> list[tuple[str, int, int]]:
        """``(path, size_bytes, mtime_ns)`` of about ``count`` files spread evenly over the table."""
        low, high = self._conn.execute("SELECT MIN(rowid), MAX(rowid) FROM files").fetchone()
        if low is None:
            return []
        rowids = sorted({low + (high - low) * k // max(1, count - 1) for k in range(count)})
        marks = ", ".join("?" * len(rowids))
        return self._conn.execute(f"SELECT path, size_bytes, mtime_ns FROM files WHERE rowid IN ({marks})",
                                  rowids).fetchall()

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

class _RouteSql(NamedTuple):
    """SQL that reads one route target's rows beside ``files f``: expressions, joins and their parameters.

    ``complete``: every file has a row, so no route is left to compute from the facts.
    """

    route: str
    reason: str
    deep: str
    joins: str
    params: tuple
    complete: bool


def _chunks(items: Sequence, size: int) -> Iterator[Sequence]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
