"""The manifest's byte indexes, read one video at a time, for the loader's remote reads.

A byte index (:mod:`daliload.stream.byteindex`) is a few hundred bytes a
video: held in memory for Kinetics-700's 650k videos it would cost every rank
hundreds of megabytes, and only the videos a rank decodes this epoch need one,
each once, when it is sent to a decoder. :class:`ByteIndexes` reads it then:
one point query of the manifest (tens of microseconds), from whichever of
the loader's threads sends the video.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from daliload.prescreen.sqlite_file import raw_bound
from daliload.stream.byteindex import ByteIndex


class ByteIndexes:
    """``path -> ByteIndex | None`` over a manifest (``None``: none recorded, or a manifest older than them),
    and a video's display rotation (:meth:`rotation`), one point query each.

    Args:
        manifest: the manifest's SQLite file.
    """

    def __init__(self, manifest: str | Path) -> None:
        self.manifest = Path(manifest)
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._absent = False  # a manifest written before byte indexes (schema 3): no table

    def __call__(self, path: str) -> ByteIndex | None:
        row = self._one("SELECT data FROM byte_index WHERE path = ?", path)
        return ByteIndex.decode(row[0]) if row is not None else None

    def rotation(self, path: str) -> int | None:
        """The display rotation the scan recorded for ``path`` (degrees), or ``None`` (not scanned, unreadable)."""
        row = self._one("SELECT rotation FROM files WHERE path = ?", path, table_optional=False)
        return int(row[0]) if row is not None and row[0] is not None else None

    def _one(self, query: str, path: str, *, table_optional: bool = True) -> tuple | None:
        with self._lock:
            if self._absent and table_optional:
                return None
            try:
                if self._conn is None:
                    self._conn = sqlite3.connect(f"{self.manifest.as_uri()}?mode=ro", uri=True,
                                                 check_same_thread=False)
                try:
                    path.encode("utf-8")
                    return self._conn.execute(query, (path,)).fetchone()
                except UnicodeEncodeError:  # a file name that is not UTF-8: the manifest holds its bytes
                    return self._conn.execute(*raw_bound(query, [path], [0])).fetchone()
            except sqlite3.OperationalError:
                if table_optional:
                    self._absent = True  # no such table, or the file cannot be read: read as without an index
                return None

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
