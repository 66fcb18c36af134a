"""A video inside a tar shard, named by where its bytes lie: ``SHARD#OFFSET:SIZE:NAME``.

A shard's member is one contiguous range of the shard, so it is named by
the shard's path or URI and that range, plus the member's name (for people,
and for the label): ::

    /data/k700/train-000003.tar#000000001536:000001048576:abseiling/abc_000001_000011.mp4
    s3://bucket/k700/train-000003.tar#000000001536:000001048576:abseiling/abc_000001_000011.mp4

Such a name is what the manifest stores as the video's path: every reader
opens it like a file (:func:`member_of` says whether a name is one), reading
only ``SIZE`` bytes from ``OFFSET`` (one ranged request for a remote shard,
``pread`` for a local one), so no shard is ever unpacked or read whole, and
nothing is written under a member's name whatever it holds (``..``, ``/``).
Its size is the member's, its modification time the shard's
(:func:`stat_video`): a shard rewritten since the scan changes every member's.
"""

from __future__ import annotations

import os
import re
import threading
from typing import NamedTuple

from daliload.stream._remote import RangeReader
from daliload.stream._tar import TarMember

#: ``<shard ending .tar>#<offset>:<size>:<member name>``
_MEMBER = re.compile(r"^(?P<shard>.+?\.tar)#(?P<offset>\d+):(?P<size>\d+):(?P<name>.+)$", re.S)


class MemberAddress(NamedTuple):
    """Where a shard member's bytes lie: ``shard`` (a path or URI), ``offset`` and ``size`` in bytes, its ``name``."""

    shard: str
    offset: int
    size: int
    name: str


def member_address(shard: str, member: TarMember) -> str:
    """The name of ``member`` of ``shard`` as the manifest keeps it (see the module doc).

    Offset and size are written with 12 digits at least, so that the names of
    one shard's members sort as the members lie in it: a split's videos are in
    path order, and the plan shuffles that order, so a shard packed from a
    folder in path order gives the same samples as the folder.
    """
    return f"{shard}#{member.offset:012d}:{member.size:012d}:{member.name}"


def member_of(uri: str | os.PathLike) -> MemberAddress | None:
    """The shard and range ``uri`` names, or ``None`` when it names a whole file or object."""
    name = os.fspath(uri)
    if not isinstance(name, str) or ".tar#" not in name:
        return None
    found = _MEMBER.match(name)
    if found is None:
        return None
    return MemberAddress(found["shard"], int(found["offset"]), int(found["size"]), found["name"])


def object_of(uri: str | os.PathLike) -> tuple[str, int]:
    """``(object, offset)``: the file or object holding the video ``uri`` names, and where its bytes start in it
    (a shard's member: the shard and the member's offset; else ``uri`` itself and 0)."""
    member = member_of(uri)
    return (member.shard, member.offset) if member is not None else (os.fspath(uri), 0)


class LocalSlice(RangeReader):
    """A member of a local shard as a seekable binary file: reads are ``pread`` s within its range.

    Args:
        fd: the shard, open for reading (this object closes it).
        member: its range.
        where: the member's name for messages.
    """

    def __init__(self, fd: int, member: MemberAddress, where: str) -> None:
        super().__init__()
        self._fd, self._member, self.name, self.size = fd, member, where, member.size

    def read(self, n: int = -1) -> bytes:
        n = self._wanted(n)
        if n <= 0:
            return b""
        data = os.pread(self._fd, n, self._member.offset + self._pos)
        if not data:
            self._failed = True
            raise OSError(f"{self.name}: shard is shorter than its index says (rewritten since the scan?)")
        self._pos += len(data)
        return data

    def close(self) -> None:
        if not self.closed:
            os.close(self._fd)
        super().close()


#: (shard path, its st_mtime_ns) of local shards already stat'ed by this process: 650k members, a few hundred shards.
_shard_mtimes: dict[str, tuple[int, int]] = {}
_lock = threading.Lock()


def shard_stat(shard: str) -> tuple[int, int]:
    """``(st_size, st_mtime_ns)`` of a local shard, looked up once per process and shard."""
    with _lock:
        found = _shard_mtimes.get(shard)
    if found is None:
        st = os.stat(shard)
        found = (st.st_size, st.st_mtime_ns)
        with _lock:
            _shard_mtimes[shard] = found
    return found


def forget_shard_stats() -> None:
    """Drop the cached shard facts (a scan starts from what the disk says now)."""
    with _lock:
        _shard_mtimes.clear()
