"""The manifest: an SQLite file with one row per video, what the loaders read.

(About 560 lines for one concept, the SQLite store: its schema, the queries
that read routes per target, and the writes of a scan; what a row holds lives
in :mod:`.rows`.)

Schema (version :data:`SCHEMA_VERSION`; a manifest of another version is
rebuilt by the next scan and refused by readers)::

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

Probe facts are stored once per file; routes are stored per device, so one
manifest serves a GPU job and a CPU job. A ``--deep`` scan on one device
overwrites that device's route with what the deep check found.

Every write happens in a transaction, in chunks, and the database runs in WAL
mode while a scan writes, so a scan killed at any point (Ctrl-C, SIGKILL,
power) leaves a valid manifest that holds every chunk committed so far. When a
scan completes, the file is switched back to a single self-contained file
(rollback journal), which read-only and network file systems handle best.

Readers (:class:`Manifest` with ``writable=False``, the default) open the file
read-only and never probe. What a scan hands over to be stored (a file's
index record, its facts as column values) is defined in :mod:`.rows`.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence
from urllib.parse import quote

from daliload.prescreen.rows import (
    FACT_COLUMNS,
    META_COLUMNS,
    FileRecord,
    KnownFile,
    Probed,
    facts_from_row,
)
from daliload.prescreen.rules import DEVICES, RULES_VERSION, Device, Route, check_device, nvdec_class, route_for

logger = logging.getLogger(__name__)

#: Bump on any change to the tables below (or to the columns :mod:`.rows` fills).
SCHEMA_VERSION = 2

#: Probe facts a ManifestEntry carries under the same name.
_ENTRY_FACTS = (
    "num_frames", "fps", "width", "height", "codec", "profile", "pix_fmt", "bit_depth", "chroma",
    "rotation", "interlaced", "duration_s", "keyframes", "vfr", "base_fps", "container",
    "num_packets", "unsafe_seek",
)  # fmt: skip
_FILE_COLUMNS = ("path", "size_bytes", "mtime_ns") + META_COLUMNS + FACT_COLUMNS

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
"""


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
            folder if needed, and rebuilds a manifest of another schema version.
            Readers leave it ``False``: the file is opened read-only.

    Raises:
        FileNotFoundError: reading a manifest that does not exist.
        ValueError: reading a manifest of another schema version.

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
            self._conn = sqlite3.connect(str(self.path), isolation_level=None, timeout=60.0)
            try:
                self._conn.execute("PRAGMA journal_mode=WAL")
            except sqlite3.DatabaseError as err:
                self._conn.close()
                raise ValueError(
                    f"{self.path} exists but is not an SQLite manifest ({err}); "
                    "delete it or pick another manifest path"
                ) from err
            # NORMAL in WAL mode: a kill never corrupts; a power cut may lose the last chunks.
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._prepare_schema()
        else:
            if not self.path.is_file():
                raise FileNotFoundError(
                    f"no manifest at {self.path}; create it with "
                    f"`daliload scan ROOT --manifest {self.path}`"
                )
            uri = f"file:{quote(str(self.path))}?mode=ro"
            self._conn = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=60.0)
            version = self._meta("schema_version")
            if version != str(SCHEMA_VERSION):
                self._conn.close()
                raise ValueError(
                    f"manifest {self.path} has schema version {version}, this daliload reads "
                    f"version {SCHEMA_VERSION}: re-run `daliload scan` to rebuild it"
                )

    # -- context manager ---------------------------------------------------------------------

    def __enter__(self) -> "Manifest":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._conn.close()

    def __repr__(self) -> str:
        return f"Manifest({str(self.path)!r}, files={len(self)})"

    def __len__(self) -> int:
        return self._conn.execute("SELECT COUNT(*) FROM files").fetchone()[0]

    # -- reading -------------------------------------------------------------------------------

    def _meta(self, key: str) -> str | None:
        try:
            row = self._conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        except sqlite3.DatabaseError as err:  # not an SQLite file, or no meta table
            raise ValueError(f"{self.path} is not a daliload manifest ({err})") from err
        return row[0] if row else None

    @property
    def last_scan(self) -> dict:
        """What the last completed scan did (device, deep, counts, time), or ``{}``."""
        text = self._meta("last_scan")
        return json.loads(text) if text else {}

    def classes(self) -> tuple[str, ...]:
        """Class names in label order: ``classes()[entry.label] == entry.class_name``."""
        return tuple(
            name for (name,) in self._conn.execute("SELECT name FROM classes ORDER BY label")
        )

    def splits(self) -> tuple[str, ...]:
        """The splits the manifest holds, sorted."""
        return tuple(
            s for (s,) in self._conn.execute("SELECT DISTINCT split FROM files ORDER BY split")
        )

    def entries(self, split: str | None = None, *, device: Device) -> list[ManifestEntry]:
        """Every file of ``split`` (all splits if ``None``), routed for ``device``, sorted by path.

        Raises:
            ValueError: unknown ``device``.
        """
        return [self._entry(row) for row in self._routed_rows(device, split)]

    def _routed_rows(self, device: Device, split: str | None) -> list[tuple]:
        """File columns plus ``(route, reason, deep)`` on ``device``, sorted by path.

        Targets stored for every file (:data:`~daliload.prescreen.rules.DEVICES`)
        are read; another GPU generation is routed here from the stored probe
        facts (no re-probe), with the rows a deep check stored for it winning.
        """
        check_device(device)
        columns = ", ".join(f"f.{c}" for c in _FILE_COLUMNS)
        join = "JOIN" if device in DEVICES else "LEFT JOIN"
        query = (f"SELECT {columns}, r.route, r.reason, r.deep FROM files f "
                 f"{join} routes r ON r.path = f.path AND r.device = ?")
        params: list = [device]
        if split is not None:
            query += " WHERE f.split = ?"
            params.append(split)
        rows = self._conn.execute(query + " ORDER BY f.path", params).fetchall()
        facts_at = len(_FILE_COLUMNS) - len(FACT_COLUMNS)
        if device not in DEVICES:
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

    def _transaction(self) -> "_Transaction":
        return _Transaction(self._conn)

    def _prepare_schema(self) -> None:
        try:
            version = self._conn.execute(
                "SELECT value FROM meta WHERE key = 'schema_version'"
            ).fetchone()
        except sqlite3.OperationalError:
            version = None  # new file
        with self._transaction() as conn:
            if version is not None and version[0] != str(SCHEMA_VERSION):
                logger.warning(
                    "manifest %s has schema version %s, rebuilding it as version %s",
                    self.path,
                    version[0],
                    SCHEMA_VERSION,
                )
                for table in ("meta", "classes", "files", "routes", "nvdec_classes"):
                    conn.execute(f"DROP TABLE IF EXISTS {table}")
            conn.executescript_in_transaction(_SCHEMA)
            conn.execute(
                "INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
            )
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

    def transient_failures(self) -> set[str]:
        """Paths marked ``bad`` only because their probe hung, crashed or raised.

        Those verdicts say more about the machine at the time (overload, a
        flaky mount) than about the file, so a re-scan probes them again even
        when size and mtime are unchanged.
        """
        rows = self._conn.execute(
            "SELECT DISTINCT path FROM routes WHERE route = 'bad' AND "
            "(reason IN ('timeout', 'crash') OR reason LIKE 'probe error:%')")
        return {path for (path,) in rows}

    def known_files(self) -> dict[str, KnownFile]:
        """Every stored file, keyed by path: size, mtime, index metadata, deep-checked devices."""
        deep: dict[str, set[str]] = {}
        for path, device in self._conn.execute("SELECT path, device FROM routes WHERE deep = 1"):
            deep.setdefault(path, set()).add(device)
        columns = ", ".join(("path", "size_bytes", "mtime_ns") + META_COLUMNS)
        return {
            row[0]: KnownFile(row[1], row[2], tuple(row[3:]), frozenset(deep.get(row[0], ())))
            for row in self._conn.execute(f"SELECT {columns} FROM files")
        }

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
        with self._transaction() as conn:
            for chunk in _chunks(stale, 500):
                marks = ", ".join("?" * len(chunk))
                conn.execute(f"DELETE FROM files WHERE path IN ({marks})", chunk)
                conn.execute(f"DELETE FROM routes WHERE path IN ({marks})", chunk)
        return len(stale)

    def set_classes(self, classes: Sequence[str]) -> None:
        """Replace the class map (label ``i`` is ``classes[i]``)."""
        self._require_writable()
        with self._transaction() as conn:
            conn.execute("DELETE FROM classes")
            conn.executemany("INSERT INTO classes VALUES (?, ?)", enumerate(classes))

    def finish_scan(self, summary: dict) -> None:
        """Record the completed scan and fold the WAL back into one self-contained file."""
        self._require_writable()
        with self._transaction() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO meta VALUES ('last_scan', ?)", (json.dumps(summary),)
            )
        try:
            self._conn.execute("PRAGMA journal_mode=DELETE")
        except (
            sqlite3.OperationalError
        ) as err:  # another connection holds it open: stays WAL, still valid
            logger.info("manifest %s stays in WAL mode: %s", self.path, err)


class _Transaction:
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on error) on an autocommit connection."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def __enter__(self) -> "_Transaction":
        self._conn.execute("BEGIN IMMEDIATE")
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._conn.execute("ROLLBACK" if exc_type is not None else "COMMIT")

    def execute(self, sql: str, params: Sequence = ()) -> sqlite3.Cursor:
        return self._conn.execute(sql, params)

    def executemany(self, sql: str, rows: Iterable) -> sqlite3.Cursor:
        return self._conn.executemany(sql, rows)

    def executescript_in_transaction(self, script: str) -> None:
        # executescript() would COMMIT first; run the statements one by one inside the transaction.
        for statement in script.split(";"):
            if statement.strip():
                self._conn.execute(statement)


def _chunks(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
