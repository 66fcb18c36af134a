"""Where a video's bytes come from: the one place that opens a file for a decoder.

* :mod:`._files`: :func:`read_video_file` (a whole file's bytes, for DALI's
  whole-file feed) and :func:`require_regular_file` (checked before PyAV opens
  a path); both refuse what is not a regular file (a FIFO, a device, a socket)
  before any read can block on it.

* :mod:`._tar`: :func:`tar_members` (a tar shard's members and the byte range
  of each, from its headers alone) and :func:`read_member`.

Imports neither torch nor a decoder.
"""

from daliload.stream._files import NotARegularFile, read_video_file, require_regular_file
from daliload.stream._tar import (NotAnUncompressedTar, TarMember, is_compressed_name, read_member, shard_paths,
                                  tar_members)

__all__ = ["NotARegularFile", "NotAnUncompressedTar", "TarMember", "is_compressed_name", "read_member",
           "read_video_file", "require_regular_file", "shard_paths", "tar_members"]
