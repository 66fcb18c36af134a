"""Paths as the operating system has them: bytes, whatever a name holds.

A POSIX file name is any bytes but ``/`` and NUL. Python hands such a name
over as a ``str`` (``os.scandir``, ``os.fsdecode``): bytes that are not UTF-8
become ``surrogateescape`` surrogates (``b"\\xff"`` is ``"\\udcff"``), and
``os.fsencode`` gives the bytes back. daliload keeps every path in that form,
from the root a user passes to the manifest (:mod:`daliload.prescreen.sqlite_file`
stores such a name as its own bytes) and both decoders. Two places need care:

* a root given as ``bytes`` (``os.listdir(b"...")``, ``os.fsencode``), which
  :class:`~pathlib.Path` refuses: :func:`decoded_path`;
* text written for a person (a log line, a message, a summary on stdout): a
  surrogate has no UTF-8 encoding, and a stream or log file that encodes
  strictly raises ``UnicodeEncodeError`` on it: :func:`printable_path`.
"""

from __future__ import annotations

import os


def decoded_path(path: object) -> object:
    """``path`` with a ``bytes`` spelling made the ``str`` Python uses for it; anything else as it is.

    ``os.fsdecode`` gives the ``str`` that ``os.scandir`` would have given,
    which every part of daliload takes. Anything but ``bytes`` (or a path-like
    object that gives bytes) is returned unchanged, so that the caller's own
    check of ``None`` or a wrong type still speaks.

    >>> decoded_path(b"/data/k\\xff")
    '/data/k\\udcff'
    """
    if isinstance(path, bytes) or (isinstance(path, os.PathLike) and isinstance(os.fspath(path), bytes)):
        return os.fsdecode(path)
    return path


def printable_path(path: str | os.PathLike) -> str:
    """``path`` (or a text that holds one, an error's) for a person to read: bytes of a name that are not UTF-8
    as ``\\xff``, what a shell takes back with ``$'...'``; any other text as it is.

    A log file or a stream that encodes strictly (``logging.FileHandler``,
    ``PYTHONIOENCODING=utf-8:strict``) raises ``UnicodeEncodeError`` on the
    ``str`` itself.

    >>> printable_path(os.fsdecode(b"/data/k\\xff"))
    '/data/k\\\\xff'
    """
    text = os.fspath(path)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    return text if text.isascii() else os.fsencode(text).decode("utf-8", "backslashreplace")
