"""The manifest's SQLite store: its tables, opening it to read or write, its meta, and the plain reads.

:class:`ManifestStore` is the base of :class:`~daliload.prescreen.manifest.Manifest`
(what the tables hold is drawn in :mod:`daliload.prescreen.manifest`). It
owns the connection: a writer in the rollback journal (never WAL), a reader
``immutable``; it creates the tables, upgrades a version-2 manifest in place
or rebuilds one of another version, and re-routes every stored file when the
capability rules changed. It reads meta (``generation``, the records stamped
with it, the ``part`` a shard holds) and the per-file lists a scan compares
with what it listed (:meth:`ManifestStore.known_files`, the files marked
``bad``, a sample to check). Routes per target are read in
:mod:`.manifest_routes`; the writes of a scan and the stored columns are in
:mod:`.manifest`.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
from pathlib import Path

from daliload.dataset import decoded_path, printable_path
from daliload.prescreen.rows import FACT_COLUMNS, META_COLUMNS, KnownFile, facts_from_row
from daliload.prescreen.rules import DEVICES, RULES_VERSION, route_for
from daliload.prescreen.sqlite_file import Connection, ManifestDamagedError, Transaction, reads

#: The manifest's messages keep one logger, whichever of its modules they come from.
logger = logging.getLogger("daliload.prescreen.manifest")

#: Bump on any change to the tables below (or to the columns :mod:`.rows` fills). 3 added ``video_index``
#: and meta ``generation``: a daliload that does not bump it must not write a manifest that has them.
#: 4 added ``byte_index`` (files probed before have no row: their remote windows are read without one).
SCHEMA_VERSION = 4
#: Versions :meth:`ManifestStore._prepare_schema` upgrades in place, and readers read as they are (their tables
#: are a subset of this one's; without stored columns, a reader reads the rows).
_UPGRADABLE = ("2", "3")

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
CREATE TABLE IF NOT EXISTS byte_index (
    path TEXT PRIMARY KEY,
    data BLOB NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS video_index (
    target TEXT NOT NULL,
    name TEXT NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (target, name)
);
"""


class ManifestStore:
    """The SQLite file under a :class:`~daliload.prescreen.manifest.Manifest`, whose docstring gives its use.

    Attributes:
        path: the SQLite file (absolute).
        writable: opened for writing (the scanner).
    """

    def __init__(self, path: str | bytes | os.PathLike, *, writable: bool = False) -> None:
        self.path = Path(os.path.abspath(decoded_path(path)))
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
        logger.info("manifest %s changed while it was read; reading it again", printable_path(self.path))
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

    def close(self) -> None:
        self._conn.close()

    def __repr__(self) -> str:
        return f"Manifest({str(self.path)!r}, files={len(self)})"

    @reads
    def __len__(self) -> int:
        return self._conn.execute("SELECT COUNT(*) FROM files").fetchone()[0]

    # -- meta ------------------------------------------------------------------------------------

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

    def generation(self) -> int:
        """Bumped by every committed write: what a stored index is checked against."""
        return int(self._meta("generation") or 0)

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

    # -- the classes, the splits and the files stored -----------------------------------------

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

    # -- the schema and the rules --------------------------------------------------------------

    def _require_writable(self) -> None:
        if not self.writable:
            raise ValueError(f"manifest {self.path} is open read-only; open it with writable=True")

    def _transaction(self) -> Transaction:
        return Transaction(self._conn)

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
                logger.info("manifest %s: upgrading schema version %s to %s in place", printable_path(self.path),
                            version[0],
                            SCHEMA_VERSION)
            elif version is not None and version[0] != str(SCHEMA_VERSION):
                logger.warning(
                    "manifest %s has schema version %s, rebuilding it as version %s",
                    printable_path(self.path),
                    version[0],
                    SCHEMA_VERSION,
                )
                for table in ("meta", "classes", "files", "routes", "nvdec_classes", "video_index", "byte_index"):
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
            "capability rules changed: re-routing every file of %s from its stored facts", printable_path(self.path)
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
