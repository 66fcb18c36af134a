"""The SQLite file under a manifest: connections, transactions, and the errors a user can act on.

(One concept, how the manifest's file is opened, written and read safely;
what the tables hold is :mod:`.manifest`.)

- Writers use SQLite's rollback journal: each :class:`Transaction` commits
  whole or not at all, so a scan killed at any point leaves a valid file.
  Every commit bumps meta ``generation`` (what stored columns are checked
  against).
- Readers open the file ``immutable``: no locks, no ``-journal``/``-wal``/
  ``-shm`` file written beside it, so a manifest on read-only storage or on
  NFS/Lustre reads as it is. Immutable means SQLite trusts that nothing
  writes the file meanwhile; a reader therefore checks that the file did not
  change under a read (size, mtime, inode) and raises :class:`ReadRace` if it
  did, which :func:`reads` turns into a fresh connection and a second read.
- SQLite's errors that mean a damaged file or a full disk become one line
  naming the file and the fix (:func:`translated`): :class:`ManifestDamagedError`,
  or ``OSError(ENOSPC)``.
- A POSIX file name is any bytes; Python decodes one that is not UTF-8 with
  ``surrogateescape`` (``os.fsdecode``), and Python's ``sqlite3`` refuses
  such a ``str``. A :class:`Connection` binds it as its own bytes cast to
  TEXT (:func:`raw_bound`), so the column holds the name's bytes, sorts
  by them (as :class:`~daliload.dataset.StringColumn` expects) and
  compares equal to them; it first records meta :data:`RAW_TEXT_KEY`, and
  every connection to a file with that record decodes TEXT with
  ``surrogateescape``, which gives back the ``str`` ``os.scandir`` gave.
  Files without it keep ``sqlite3``'s own decoding, about twice as fast
  (0.15 us a value: 0.4 s a listing of 650k files' paths and labels).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import sqlite3
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence, TypeVar
from urllib.parse import quote

#: How long a writer waits for another connection's lock before giving up, seconds.
BUSY_TIMEOUT_S = 60.0
#: Times a read is tried when the file keeps changing under it.
READ_ATTEMPTS = 3
#: Meta key present once a value that is not UTF-8 (a file name's bytes) was stored: TEXT is read with
#: ``surrogateescape`` from then on (see the module docstring).
RAW_TEXT_KEY = "raw_text"
#: Rows a :meth:`Connection.executemany` hands to SQLite at a time (bounds the rows alive at once).
_ROWS_AT_ONCE = 10_000

T = TypeVar("T")


class ManifestDamagedError(ValueError):
    """The manifest file is damaged or not an SQLite file: delete it and scan again."""


class ReadRace(Exception):
    """The file changed while an ``immutable`` reader read it: what was read may mix two states."""


@contextlib.contextmanager
def translated(path: Path) -> Iterator[None]:
    """SQLite errors that mean a damaged file or a full disk, as one line naming ``path`` and the fix."""
    try:
        yield
    except sqlite3.DatabaseError as err:
        name, text = getattr(err, "sqlite_errorname", ""), str(err)
        if name == "SQLITE_NOTADB" or "not a database" in text:
            raise ManifestDamagedError(f"{path} is not an SQLite manifest ({text}): pass a manifest written by "
                                       "`daliload scan`, or delete it and scan again") from err
        if name == "SQLITE_CORRUPT" or "malformed" in text:
            raise ManifestDamagedError(f"manifest {path} is damaged ({text}): delete it and run `daliload scan` "
                                       "again to rebuild it (its files are probed anew)") from err
        if name == "SQLITE_FULL" or "disk is full" in text:
            raise OSError(errno.ENOSPC, f"no space left to write the manifest {path} ({text}): free space on its "
                          "file system or keep the manifest on another one (`daliload scan --manifest PATH`, "
                          "ScanSpec(manifest_path=...)) and run again; what was stored before is kept") from err
        raise


def stamp(path: Path) -> tuple[int, int, int]:
    """What changes when a file is written: size, mtime, inode."""
    st = path.stat()
    return st.st_size, st.st_mtime_ns, st.st_ino


class Connection:
    """A manifest's SQLite connection, its errors :func:`translated`.

    A reader's (``opened`` given: the file's :func:`stamp` when it was opened)
    raises :class:`ReadRace` when the file has changed since.
    """

    def __init__(self, conn: sqlite3.Connection, path: Path, opened: tuple | None = None) -> None:
        self._raw = conn
        self.path = path
        self.opened = opened
        self.decode_raw_text()

    @classmethod
    def writer(cls, path: Path) -> Connection:
        return cls(sqlite3.connect(str(path), isolation_level=None, timeout=BUSY_TIMEOUT_S), path)

    @classmethod
    def reader(cls, path: Path, *, immutable: bool = True) -> Connection:
        """A read-only connection: ``immutable`` unless a writer left a journal or WAL beside the file
        (SQLite must see those to read the last committed state)."""
        opened = stamp(path)
        pending = any(path.with_name(path.name + suffix).exists() for suffix in ("-journal", "-wal"))
        mode = "mode=ro" if pending or not immutable else "immutable=1"
        conn = sqlite3.connect(f"file:{file_uri_path(path)}?{mode}", uri=True, isolation_level=None,
                               timeout=BUSY_TIMEOUT_S)
        return cls(conn, path, opened)

    def check(self) -> None:
        """Raise :class:`ReadRace` if this reader's file changed since it was opened."""
        if self.opened is not None and stamp(self.path) != self.opened:
            raise ReadRace(str(self.path))

    def decode_raw_text(self) -> None:
        """Read TEXT with ``surrogateescape`` if the file records that it holds some that is not UTF-8."""
        try:
            stored = self._raw.execute("SELECT 1 FROM meta WHERE key = ?", (RAW_TEXT_KEY,)).fetchone()
        except sqlite3.Error:
            return  # a new file (no meta yet), or not a manifest: the caller's first read says which
        if stored:
            self._raw.text_factory = _decode_text

    def execute(self, sql: str, params: Sequence = ()) -> Cursor:
        self.check()
        raw = _raw_at(params)
        if raw:
            sql, params = self._bind_raw(sql, params, raw)
        try:
            with translated(self.path):
                return Cursor(self._raw.execute(sql, params), self)
        except ManifestDamagedError:
            self.check()  # damaged, or changed while read
            raise

    def executemany(self, sql: str, rows: Iterable) -> None:
        with translated(self.path):
            plain: list = []
            for row in rows:
                raw = _raw_at(row)
                if raw:  # rare (a file name's bytes): this row on its own, in order with the others
                    if plain:
                        self._raw.executemany(sql, plain)
                        plain = []
                    self._raw.execute(*self._bind_raw(sql, row, raw))
                    continue
                plain.append(row)
                if len(plain) >= _ROWS_AT_ONCE:
                    self._raw.executemany(sql, plain)
                    plain = []
            if plain:
                self._raw.executemany(sql, plain)

    def _bind_raw(self, sql: str, params: Sequence, raw: list[int]) -> tuple[str, list]:
        """``sql`` and ``params`` with the values at ``raw`` bound as their bytes cast to TEXT; a writer first
        records :data:`RAW_TEXT_KEY` (before the value, in its transaction: no reader meets such text without it)."""
        if self.opened is None:
            self._raw.execute("INSERT OR IGNORE INTO meta VALUES (?, '1')", (RAW_TEXT_KEY,))
        self._raw.text_factory = _decode_text
        return raw_bound(sql, params, raw)

    def close(self) -> None:
        self._raw.close()


def file_uri_path(path: Path) -> str:
    """``path`` as the path of an SQLite ``file:`` URI: its own bytes, percent-quoted.

    ``quote(str(path))`` would encode the ``str`` as UTF-8, which a folder
    whose name is not UTF-8 (a ``surrogateescape`` str) refuses; SQLite
    unquotes ``%XX`` to the byte, so quoting the bytes opens that very file.
    """
    return quote(os.fsencode(path))


def _decode_text(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


def _raw_at(params: Sequence) -> list[int]:
    """Positions of the ``str`` values of ``params`` that are not UTF-8 (``surrogateescape``-decoded bytes)."""
    if isinstance(params, dict):
        return []  # named parameters: none of this package's statements
    return [i for i, value in enumerate(params)
            if type(value) is str and not value.isascii() and not _is_utf8(value)]


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def raw_bound(sql: str, params: Sequence, raw: Sequence[int]) -> tuple[str, list]:
    """``sql`` with its ``?`` at each of ``raw`` made ``CAST(? AS TEXT)``, and ``params`` with the value there
    as its bytes: SQLite stores the bytes as they are, as TEXT.

    Raises:
        ValueError: ``sql`` does not hold one plain ``?`` per parameter (a ``?`` in a literal, ``?NNN``).
    """
    parts = sql.split("?")
    if len(parts) != len(params) + 1 or any(part[:1].isdigit() for part in parts[1:]):
        raise ValueError(f"cannot store {params[raw[0]]!r} (not UTF-8) with a statement that does not hold one "
                         f"plain '?' per parameter: {sql}")
    cast = set(raw)
    text = "".join(part + ("CAST(? AS TEXT)" if i in cast else "?") for i, part in enumerate(parts[:-1]))
    return text + parts[-1], [value.encode("utf-8", "surrogateescape") if i in cast else value
                              for i, value in enumerate(params)]


class Cursor:
    """A cursor whose fetches are :func:`translated` and, on a reader, checked for a :class:`ReadRace`."""

    def __init__(self, cursor: sqlite3.Cursor, conn: Connection) -> None:
        self._cursor = cursor
        self._conn = conn

    def _fetch(self, fetch: Callable[[], T]) -> T:
        try:
            with translated(self._conn.path):
                rows = fetch()
        except ManifestDamagedError:
            self._conn.check()
            raise
        self._conn.check()
        return rows

    def fetchone(self):
        return self._fetch(self._cursor.fetchone)

    def fetchall(self) -> list:
        return self._fetch(self._cursor.fetchall)

    def fetchmany(self, size: int) -> list:
        return self._fetch(lambda: self._cursor.fetchmany(size))

    def __iter__(self) -> Iterator:
        while rows := self.fetchmany(4096):
            yield from rows


def reads(method: Callable[..., T]) -> Callable[..., T]:
    """A reading method of an object with ``_conn`` and ``_reopen(immutable)``, read again on a :class:`ReadRace`.

    Only the outermost reading method retries, so a retried read never mixes
    what an inner one read before the file changed with what it reads after.
    """
    @functools.wraps(method)
    def read(self, *args, **kwargs):
        if getattr(self, "_reading", False):
            return method(self, *args, **kwargs)
        self._reading = True
        try:
            for attempt in range(READ_ATTEMPTS):
                try:
                    return method(self, *args, **kwargs)
                except ReadRace:
                    self._reopen(immutable=attempt == 0)  # then mode=ro: SQLite's own locks
        finally:
            self._reading = False
        raise ValueError(f"manifest {self._conn.path} kept changing while it was read (is a scan writing it?); "
                         "run again once the scan is done")
    return read


class Transaction:
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on error) on an autocommit connection.

    Every commit bumps meta ``generation``. ``stamps`` (meta key -> a dict)
    are written as JSON with the generation this transaction commits: such a
    record describes the file only as long as nothing else was written since
    (see ``Manifest.current_meta``).
    """

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self.stamps: dict[str, dict] = {}

    def __enter__(self) -> Transaction:
        self._conn.execute("BEGIN IMMEDIATE")
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self._rollback()
            return
        try:
            self._conn.execute("INSERT INTO meta VALUES ('generation', '1') ON CONFLICT (key) "
                               "DO UPDATE SET value = CAST(value AS INTEGER) + 1")
            if self.stamps:
                (generation,) = self._conn.execute("SELECT value FROM meta WHERE key = 'generation'").fetchone()
                self._conn.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                                       [(key, json.dumps({**value, "generation": int(generation)}))
                                        for key, value in self.stamps.items()])
            self._conn.execute("COMMIT")
        except BaseException:
            self._rollback()  # e.g. the disk filled up: nothing of this transaction is kept, all before it is
            raise

    def _rollback(self) -> None:
        with contextlib.suppress(sqlite3.Error, ManifestDamagedError, OSError):  # SQLite may have rolled back
            self._conn.execute("ROLLBACK")

    def execute(self, sql: str, params: Sequence = ()) -> Cursor:
        return self._conn.execute(sql, params)

    def executemany(self, sql: str, rows: Iterable) -> None:
        self._conn.executemany(sql, rows)

    def executescript_in_transaction(self, script: str) -> None:
        # executescript() would COMMIT first; run the statements one by one inside the transaction.
        for statement in script.split(";"):
            if statement.strip():
                self._conn.execute(statement)
