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

from daliload.stream.byteindex import ByteIndex


class ByteIndexes:
    """``path -> ByteIndex | None`` over a manifest (``None``: none recorded, or a manifest older than them).

    Args:
        manifest: the manifest's SQLite file.
    """

    def __init__(self, manifest: str | Path) -> None:
        self.manifest = Path(manifest)
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._absent = False  # a manifest written before byte indexes (schema 3): no table

    def __call__(self, path: str) -> ByteIndex | None:
        with self._lock:
            if self._absent:
                return None
            try:
                if self._conn is None:
                    self._conn = sqlite3.connect(f"{self.manifest.as_uri()}?mode=ro", uri=True,
                                                 check_same_thread=False)
                row = self._conn.execute("SELECT data FROM byte_index WHERE path = ?", (path,)).fetchone()
            except sqlite3.OperationalError:
                self._absent = True  # no such table, or the file cannot be read: read as without an index
                return None
        return ByteIndex.decode(row[0]) if row is not None else None

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
