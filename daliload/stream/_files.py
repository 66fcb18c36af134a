"""Opening a video file without ever blocking on something that is not one.

A path that held a video at scan time can hold anything later: a FIFO put
in its place blocks ``open()`` (and every read after it) until a writer
comes, which may be never; a character device such as ``/dev/zero`` never
ends. DALI's whole-file feed reads in a thread of the training process, where
no time limit can interrupt a blocked system call and where the interpreter's
exit waits for the thread. So every open here is non-blocking and the file's
type is checked on the open descriptor (no race with a rename) before the
first read; what is not a regular file fails at once, naming the path and
what it is. PyAV opens paths itself (FFmpeg's file protocol, a blocking
``open()``): :func:`require_regular_file` is its check beforehand (a ``stat``;
such opens run in worker processes, where a time limit catches what slips
through).
"""

from __future__ import annotations

import errno
import os
import stat

import numpy as np

_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


class NotARegularFile(OSError):
    """The path is a FIFO, a device, a socket or a directory, not a video file."""


def _check(mode: int, path: str) -> None:
    if stat.S_ISREG(mode):
        return
    what = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    raise NotARegularFile(errno.EINVAL, f"not a regular file: it is {what}", path)


def require_regular_file(path: str | os.PathLike) -> None:
    """Raise unless ``path`` is a regular file (symbolic links followed).

    Raises:
        NotARegularFile: a FIFO, a device, a socket or a directory.
        OSError: the path cannot be reached (missing, no permission).
    """
    _check(os.stat(path).st_mode, os.fspath(path))


def read_video_file(path: str | os.PathLike) -> np.ndarray:
    """The bytes of the regular file at ``path``, as a 1-d ``uint8`` array.

    Raises:
        NotARegularFile: ``path`` is not a regular file (checked before any read).
        OSError: it cannot be opened or read, or is empty (``"file is empty"``).
    """
    name = os.fspath(path)
    fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        _check(info.st_mode, name)
        # O_NONBLOCK changes nothing for a regular file; read it whole, tolerating one that changes size.
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read()
    finally:
        os.close(fd)
    if not data:
        raise OSError(0, "file is empty", name)
    return np.frombuffer(data, dtype=np.uint8)
