"""What a failed fallback decode raises: :class:`DecodeError`, naming the file, and FFmpeg's errors in words.

Every decode error names the file (STYLE: "errors people can act on"); its
``reason`` is what the loader's failure records and warnings quote.
"""

from __future__ import annotations

import os

import av.error

from daliload.stream._uri import redact


class DecodeError(RuntimeError):
    """A file (or the window asked of it) could not be decoded.

    Attributes:
        path: the file.
        reason: what went wrong, short and human readable.
        kind: ``"timeout"`` when the time limit cut the decode, else ``"decode"``.
    """

    def __init__(self, path: str | os.PathLike, reason: str, kind: str = "decode") -> None:
        self.path = os.fspath(path)
        self.reason = reason
        self.kind = kind
        super().__init__(f"{redact(self.path)}: {reason}")  # a URI is shown without its secrets

    def __reduce__(self):
        # Crosses process boundaries (worker processes) intact.
        return (type(self), (self.path, self.reason, self.kind))


def describe(err: BaseException, path: str = "") -> str:
    """``"InvalidDataError: Invalid data found when processing input (avcodec_send_packet())"``."""
    name = type(err).__name__
    if isinstance(err, (av.error.FFmpegError, OSError)) and err.strerror:  # FFmpegError is an OSError too
        shown = redact(err.filename) if isinstance(err.filename, str) else None
        where = shown if shown and shown != redact(path) else None
        return f"{name}: {err.strerror}" + (f" ({where})" if where else "")
    text = str(err).strip()
    return f"{name}: {text}" if text else name
