"""Where a video's bytes come from: the one place that opens a file for a decoder.

* :mod:`._files`: :func:`read_video_file` (a whole file's bytes, for DALI's
  whole-file feed) and :func:`require_regular_file` (checked before PyAV opens
  a path); both refuse what is not a regular file (a FIFO, a device, a socket)
  before any read can block on it.

Imports neither torch nor a decoder.
"""

from daliload.stream._files import NotARegularFile, read_video_file, require_regular_file

__all__ = ["NotARegularFile", "read_video_file", "require_regular_file"]
