"""Opening a video, local or remote, without ever blocking on something that is not one.

A video is named by a local path or a URI (:mod:`._uri`). A remote one is
read through :mod:`._remote` (exact ranges, time limits, retries); a local
one as follows.

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

from daliload.stream._members import LocalSlice, MemberAddress, member_of, object_of, shard_stat
from daliload.stream._remote import DEFAULT_POLICY, RangeFile, ReadPolicy, RemoteReadError, fetch, size_of
from daliload.stream._uri import SecretInURIError, is_remote, local_path, refuse_secrets

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
    member = member_of(path)
    name = local_path(member.shard if member else path)
    _check(os.stat(name).st_mode, name)


def stat_video(uri: str | os.PathLike) -> tuple[int, int]:
    """``(size, mtime_ns)`` of a local video, or of a member of a local shard (its size, the shard's mtime).

    Raises:
        OSError: it cannot be reached.
    """
    member = member_of(uri)
    if member is not None and not is_remote(member.shard):
        return member.size, shard_stat(local_path(member.shard))[1]
    st = os.stat(local_path(uri))
    return st.st_size, st.st_mtime_ns


def read_video_file(uri: str | os.PathLike, *, policy: ReadPolicy = DEFAULT_POLICY,
                    deadline: float | None = None) -> np.ndarray:
    """The bytes of the video at ``uri`` (a path, ``file://`` or an fsspec URL), as a 1-d ``uint8`` array.

    Args:
        uri: where the video is.
        policy: time limit and retries of a remote read (one request for the whole object).
        deadline: ``time.monotonic()`` past which a remote read gives up.

    Raises:
        NotARegularFile: a local ``uri`` that is not a regular file (checked before any read).
        RemoteReadError: a remote read failed (named, redacted, with the cause).
        OSError: it cannot be opened or read, or is empty (``"file is empty"``); a URI with a
            credential in it (refused, shown redacted).
    """
    member = member_of(uri)
    if member is not None:
        return _read_member(member, os.fspath(uri), policy, deadline)
    if is_remote(uri):
        _refuse(uri)
        data = fetch(os.fspath(uri), policy=policy, deadline=deadline)
        if not data:
            raise RemoteReadError(os.fspath(uri), "object is empty")
        return np.frombuffer(data, dtype=np.uint8)
    name = local_path(uri)
    fd = _open_regular(name)
    try:
        # O_NONBLOCK changes nothing for a regular file; read it whole, tolerating one that changes size.
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read()
    finally:
        os.close(fd)
    if not data:
        raise OSError(0, "file is empty", name)
    return np.frombuffer(data, dtype=np.uint8)


def open_video(uri: str | os.PathLike, *, policy: ReadPolicy = DEFAULT_POLICY,
               deadline: float | None = None) -> str | RangeFile:
    """What to give ``av.open`` for the video at ``uri``: a checked local path, or a :class:`RangeFile`.

    A local path (or ``file://``) is checked to be a regular file first
    (PyAV's own ``open()`` would block on a FIFO). A remote URI becomes a
    file object whose every read is one ranged request with a time limit and
    retries (one request for its size first); close it after the container.

    Raises:
        NotARegularFile: a local path that is not a regular file.
        RemoteReadError: the remote object's size cannot be read (missing, credentials, the store failing).
        OSError: a local path that cannot be reached; a URI with a credential in it.
    """
    member = member_of(uri)
    if member is not None:
        if is_remote(member.shard):
            _refuse(member.shard)
            return RangeFile(member.shard, policy=policy, deadline=deadline, base=member.offset, size=member.size)
        return LocalSlice(_open_regular(local_path(member.shard)), member, os.fspath(uri))
    if is_remote(uri):
        _refuse(uri)
        return RangeFile(os.fspath(uri), policy=policy, deadline=deadline)
    name = local_path(uri)
    require_regular_file(name)
    return name


def _open_regular(name: str) -> int:
    """A read-only descriptor of the regular file ``name`` (non-blocking open, type checked on the descriptor)."""
    fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        _check(os.fstat(fd).st_mode, name)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_member(member: MemberAddress, where: str, policy: ReadPolicy, deadline: float | None) -> np.ndarray:
    """A shard member's bytes: one ranged request (remote shard) or one ``pread`` (local)."""
    if is_remote(member.shard):
        _refuse(member.shard)
        data = fetch(member.shard, member.offset, member.offset + member.size, policy=policy, deadline=deadline)
    else:
        fd = _open_regular(local_path(member.shard))
        try:
            data = os.pread(fd, member.size, member.offset)
        finally:
            os.close(fd)
    if len(data) != member.size:
        raise OSError(errno.EIO, f"shard is shorter than its index says: {len(data)} of the member's "
                                 f"{member.size} bytes (rewritten since the scan?)", where)
    if not data:
        raise OSError(0, "file is empty", where)
    return np.frombuffer(data, dtype=np.uint8)


def _refuse(uri) -> None:
    try:
        refuse_secrets(uri)
    except SecretInURIError as err:
        raise RemoteReadError(os.fspath(uri), str(err).split(": ", 1)[1], number=errno.EINVAL) from None


def check_stores(uris, *, policy: ReadPolicy = DEFAULT_POLICY) -> int:
    """Refuse URIs with credentials in them, and reach each remote store once before any training starts.

    For each store (protocol and bucket or host) among ``uris``, the size of
    its first object is read: a bucket that does not exist, credentials the
    store refuses, an endpoint that does not answer then fail here, once,
    rather than as every sample failing later.

    Args:
        uris: the videos (local paths are passed over).
        policy: time limit and retries of each look-up.

    Returns:
        The number of stores reached.

    Raises:
        SecretInURIError: a URI carries a credential (shown redacted).
        RemoteReadError: a store cannot be read: the message names the (redacted) URI, the cause and the fix.
    """
    packed = getattr(uris, "data", None)  # a StringColumn's bytes: a local dataset of 650k paths costs one search
    if isinstance(packed, bytes) and b"://" not in packed:
        return 0
    may_hold_secrets = not isinstance(packed, bytes) or b"@" in packed or b"?" in packed
    firsts: dict[tuple[str, str], str] = {}
    for uri in uris:
        if not is_remote(uri):
            continue
        uri = object_of(uri)[0]  # a shard's member: the shard is the object
        if may_hold_secrets:
            refuse_secrets(uri)
        rest = uri.split("://", 1)[1]
        firsts.setdefault((uri.split("://", 1)[0].lower(), rest.split("/", 1)[0]), uri)
    for uri in firsts.values():
        try:
            size_of(uri, policy=policy)
        except RemoteReadError as err:
            if err.errno == errno.ENOENT:
                fix = ("check the bucket's name, and AWS_ENDPOINT_URL if the store is not AWS"
                       if err.code == "NoSuchBucket" else "scan the dataset again (`daliload scan`)")
                raise RemoteReadError(uri, f"{err.strerror}: {fix}", number=err.errno, code=err.code) from err
            raise
    return len(firsts)
