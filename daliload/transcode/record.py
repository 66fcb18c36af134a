"""The record of what was transcoded: an SQLite file per share under ``DST/.daliload/transcode/``.

A row per source file says what became of it (written or bad), from which
source (size and mtime) and with which options (:meth:`TranscodeOptions.key`).
A re-run skips a file whose row matches the source and the options and whose
output still exists with the recorded size; a changed source, other options
or a missing output redo it. Failed files get no row, so they are retried.

The row is committed after the output's rename, so a run killed at any point
either left no row (the file is redone, overwriting the same output) or a row
for a complete output. Each share (``--shard I/N``) writes its own file, so
shares running at once on a shared file system never write to one SQLite file;
a lookup reads them all, so a later run with other shares still skips.

A disk that fills up while the record is written raises ``OSError(ENOSPC)``
naming the record file and the fix; the rows committed before are kept (a
file whose row was not written is redone by the next run).
"""

from __future__ import annotations

import contextlib
import errno
import sqlite3
from pathlib import Path
from typing import Iterator

from daliload.transcode.options import Shard
from daliload.transcode.summary import FileResult

#: Where the record lives, relative to the output root.
RECORD_DIR = Path(".daliload") / "transcode"
_COLUMNS = ("rel", "status", "reason", "out_rel", "src_size", "src_mtime_ns", "bytes_in", "bytes_out",
            "frames_in", "frames_out", "width", "height", "seconds", "options_key")
_SCHEMA = """CREATE TABLE IF NOT EXISTS files (
    rel TEXT PRIMARY KEY, status TEXT NOT NULL, reason TEXT, out_rel TEXT, src_size INTEGER,
    src_mtime_ns INTEGER, bytes_in INTEGER, bytes_out INTEGER, frames_in INTEGER, frames_out INTEGER,
    width INTEGER, height INTEGER, seconds REAL, options_key TEXT,
    finished REAL DEFAULT (julianday('now')))"""


def record_path(dst_root: str | Path, shard: Shard) -> Path:
    """The record file this share writes."""
    name = "record.sqlite" if shard.count == 1 else f"record-{shard.index}-of-{shard.count}.sqlite"
    return Path(dst_root) / RECORD_DIR / name


class Record:
    """Read every share's record, write this share's (use as a context manager)."""

    def __init__(self, dst_root: str | Path, shard: Shard) -> None:
        self.root = Path(dst_root)
        path = record_path(dst_root, shard)
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._own = sqlite3.connect(path)
        with self._writing():
            self._own.execute(_SCHEMA)
            self._own.commit()
        self._others = [sqlite3.connect(f"file:{p}?mode=ro", uri=True)
                        for p in sorted(path.parent.glob("record*.sqlite")) if p != path]

    def __enter__(self) -> "Record":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for connection in (self._own, *self._others):
            connection.close()
        self._others = []

    def lookup(self, rel: str) -> FileResult | None:
        """The newest row for ``rel`` in any share's record, or None."""
        rows = []
        for connection in (self._own, *self._others):
            try:
                row = connection.execute(f"SELECT {', '.join(_COLUMNS)}, finished FROM files WHERE rel = ?",
                                         (rel,)).fetchone()
            except sqlite3.OperationalError:  # a share's record being created right now
                row = None
            if row is not None:
                rows.append(row)
        if not rows:
            return None
        newest = max(rows, key=lambda r: r[-1])
        return FileResult(**dict(zip(_COLUMNS, newest[:-1])))

    def done(self, rel: str, src_size: int, src_mtime_ns: int, options_key: str) -> FileResult | None:
        """The recorded result if ``rel`` needs no work (same source, same options, output intact), else None."""
        previous = self.lookup(rel)
        if previous is None or (previous.src_size, previous.src_mtime_ns, previous.options_key) != (
                src_size, src_mtime_ns, options_key):
            return None
        if previous.status == "written":
            out = self.root / previous.out_rel
            if not out.is_file() or out.stat().st_size != previous.bytes_out:
                return None
        elif previous.status != "bad":
            return None
        return previous.replace(skipped=True)

    def put(self, result: FileResult) -> None:
        """Store a written or bad file's result (failed ones are not stored: the next run retries them).

        Raises:
            OSError: ``ENOSPC``, the record's disk is full (the message names the file and the fix).
        """
        with self._writing():
            if result.status == "failed":
                self._own.execute("DELETE FROM files WHERE rel = ?", (result.rel,))
            else:
                values = [getattr(result, column) for column in _COLUMNS]
                self._own.execute(f"INSERT OR REPLACE INTO files ({', '.join(_COLUMNS)}) "
                                  f"VALUES ({', '.join('?' * len(_COLUMNS))})", values)
            self._own.commit()

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """A full disk as one line naming the record (SQLite says only "database or disk is full")."""
        try:
            yield
        except sqlite3.OperationalError as err:
            if getattr(err, "sqlite_errorname", "") != "SQLITE_FULL" and "disk is full" not in str(err):
                raise
            with contextlib.suppress(sqlite3.Error):
                self._own.rollback()
            raise OSError(errno.ENOSPC, f"no space left to write the transcode record {self.path} ({err}): free "
                          "space on the output's file system and run the same command again; files already "
                          "recorded are skipped, the others are redone") from err
