"""Where a video's bytes come from, and what both decoders need to know about them.

The layer under both clip sources (the DALI route and :mod:`fallback`) and
the pre-screen: everything that knows about containers and bytes.

* :mod:`._files`: :func:`read_video_file` (a whole file's bytes, for DALI's
  whole-file feed) and :func:`require_regular_file` (checked before PyAV opens
  a path); both refuse what is not a regular file (a FIFO, a device, a socket)
  before any read can block on it.
* :mod:`.numbering`: which packets become frames and where a decode may
  start (:class:`~daliload.stream.numbering.StreamHint`).
* :mod:`.cut`: the packets a window needs, as a small file for DALI.
* :mod:`.errors`: :class:`~daliload.stream.errors.DecodeError`, naming the file.

Imports neither torch nor DALI; :mod:`.numbering` and :mod:`.cut` import
PyAV, so they are imported by name, not here.
"""

from daliload.stream._files import NotARegularFile, read_video_file, require_regular_file

__all__ = ["NotARegularFile", "read_video_file", "require_regular_file"]
