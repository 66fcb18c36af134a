"""Where a video's bytes come from, and what both decoders need to know about them.

The layer under both clip sources (the DALI route and :mod:`fallback`) and
the pre-screen: everything that knows about containers and bytes.

* :mod:`._files`: :func:`read_video_file` (a whole file's bytes, for DALI's
  whole-file feed) and :func:`require_regular_file` (checked before PyAV opens
  a path); both refuse what is not a regular file (a FIFO, a device, a socket)
  before any read can block on it.
* :mod:`._uri`: a video's address (a path, ``file://`` or an fsspec URL such
  as ``s3://``, ``gs://``, ``http(s)://``, ``hf://``); :func:`redact`, the one
  way a URI is shown; credentials in a URI are refused.
* :mod:`._remote`: remote reads in exact ranges, with a time limit per request
  and retries (:class:`ReadPolicy`), counted per process
  (:func:`transfer_counts`); :func:`open_video` gives PyAV a path or a
  ranged file object, :func:`check_stores` reaches each store once up front.
* :mod:`.byteindex`: where a video's packets lie (recorded by the scan), and
  :mod:`._window`: :func:`open_window`, a remote window read in one request
  with the file's header cached per process.
* :mod:`.numbering`: which packets become frames and where a decode may
  start (:class:`~daliload.stream.numbering.StreamHint`).
* :mod:`.cut`: the packets a window needs, as a small file for DALI.
* :mod:`.errors`: :class:`~daliload.stream.errors.DecodeError`, naming the file.

* :mod:`._tar`: :func:`tar_members` (a tar shard's members and the byte range
  of each, from its headers alone) and :func:`read_member`.
* :mod:`._members`: a shard's member named as a video
  (``SHARD#OFFSET:SIZE:NAME``, :func:`member_address`), which
  :func:`open_video`, :func:`read_video_file` and :func:`stat_video` read as a
  range of its shard.

Imports neither torch nor DALI; :mod:`.numbering` and :mod:`.cut` import
PyAV, so they are imported by name, not here.
"""

from daliload.stream._files import (NotARegularFile, check_stores, open_video, read_video_file, require_regular_file,
                                    stat_video)
from daliload.stream._members import MemberAddress, member_address, member_of, object_of
from daliload.stream._remote import (DEFAULT_POLICY, RangeFile, ReadPolicy, RemoteObject, RemoteReadError,
                                     TransferCounts, add_transfer_counts, fetch, list_objects, transfer_counts)
from daliload.stream._tar import (NotAnUncompressedTar, TarMember, is_compressed_name, read_member, shard_paths,
                                  tar_members)
from daliload.stream._uri import SecretInURIError, is_remote, redact, refuse_secrets
from daliload.stream._window import (PacketsUntil, WindowFile, clear_header_cache, open_window, prefetch_window,
                                     remote_window)

__all__ = ["DEFAULT_POLICY", "MemberAddress", "NotARegularFile", "NotAnUncompressedTar", "PacketsUntil", "RangeFile",
           "ReadPolicy", "RemoteObject", "RemoteReadError", "SecretInURIError", "TarMember", "TransferCounts",
           "WindowFile", "add_transfer_counts", "check_stores", "clear_header_cache", "fetch", "is_compressed_name",
           "is_remote", "list_objects", "member_address", "member_of", "object_of", "open_video", "open_window",
           "prefetch_window", "read_member", "read_video_file", "redact", "refuse_secrets", "remote_window",
           "require_regular_file", "shard_paths", "stat_video", "tar_members", "transfer_counts"]
