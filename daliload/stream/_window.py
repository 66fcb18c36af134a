"""One window of a remote video in one request: the header from a cache, the packets from the byte index.

:func:`open_window` gives PyAV a :class:`WindowFile`: the video's bytes as a
seekable file that holds the ranges a window needs
(:meth:`~daliload.stream.byteindex.ByteIndex.window` and the header), fetched
up front, concurrently (one request each; the header only when this process
has not kept it). A read inside them costs nothing; a read outside (an index
that was wrong, a demuxer that looks further than expected) is fetched then,
up to the next range held and at least 64 KiB, so the frames are always the
file's and only requests are lost.

Headers are kept per process (:data:`HEADER_CACHE_BYTES`, least recently
used first out), keyed by the object, its byte range and its size: a video
decoded again (views, a second epoch, evaluation) costs its window only.
"""

from __future__ import annotations

import bisect
import errno
import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from daliload.stream._members import member_of
from daliload.stream._remote import (DEFAULT_POLICY, RANGE_BLOCK_BYTES, RangeReader, ReadPolicy, RemoteReadError,
                                     fetch)
from daliload.stream._uri import is_remote
from daliload.stream.byteindex import ByteIndex

#: Bytes of headers a process keeps (about 30-60 KB a Kinetics clip: its index and first packet).
HEADER_CACHE_BYTES = 32 * 1024 * 1024
#: Bytes after the position FFmpeg reaches opening a file over which its I/O layer reads on rather than seek
#: (its buffer, 32 KiB, and its short-seek threshold, 32 KiB).
READ_FORWARD = 64 * 1024
#: Requests of one window fetched at once (the header's ranges and the window's), and windows read ahead.
_FETCH_THREADS = 4
#: Windows read ahead (:func:`prefetch_window`) and not yet opened, at most.
_AHEAD = 4

_headers: OrderedDict[tuple, tuple[tuple[int, bytes], ...]] = OrderedDict()
_headers_bytes = 0
_lock = threading.Lock()
_pools: dict[str, tuple[int, ThreadPoolExecutor]] = {}
_ahead: OrderedDict[tuple, Future] = OrderedDict()


def open_window(uri: str | os.PathLike, hint, frames, *, policy: ReadPolicy = DEFAULT_POLICY,
                deadline: float | None = None) -> WindowFile | None:
    """A :class:`WindowFile` holding what ``frames`` of the remote ``uri`` need, or ``None``.

    What :func:`prefetch_window` started for the same window is taken over (waited for up to ``deadline``).

    Args:
        uri: the video (a URI, or a member of a shard in a store).
        hint: its :class:`~daliload.stream.numbering.StreamHint` (``reads``, its byte index, follows
            its ``keyframe_indices``; frames past its ``num_frames`` count as the last), or ``None``.
        frames: the window's frames.
        policy, deadline: as for every remote read.

    Returns:
        ``None`` for a local video, one without a byte index, or one to decode from its start (read as before).

    Raises:
        RemoteReadError: a range cannot be read, or the object is shorter than when scanned.
    """
    plan = _plan(uri, hint, frames)
    if plan is None:
        return None
    with _lock:
        started = _ahead.pop(plan[0], None)
    if started is None or started.cancel():  # none, or not begun (its threads busy): read it now, timed
        return _fetch_window(*plan, policy=policy, deadline=deadline)
    try:
        window = started.result(timeout=None if deadline is None else max(deadline - time.monotonic(), 0))
    except FutureTimeout:
        raise RemoteReadError(plan[0][0], "read failed: the store did not answer in time (the window was being "
                                          "read ahead)", number=errno.ETIMEDOUT, transient=True) from None
    window.deadline = deadline
    return window


def prefetch_window(uri: str | os.PathLike, hint, frames, *, policy: ReadPolicy = DEFAULT_POLICY) -> None:
    """Start reading what :func:`open_window` will need for ``frames`` of ``uri``, in a thread; return at once.

    A worker calls this for the task queued behind the one it runs
    (:class:`daliload.runtime.WithPrefetch`), so a store's latency overlaps
    decoding. At most :data:`_AHEAD` windows are kept waiting; an error is
    raised when the window is opened, as it would be without this.
    """
    plan = _plan(uri, hint, frames)
    if plan is None:
        return
    executor = _executor("ahead")
    with _lock:
        if plan[0] in _ahead:
            return
        _ahead[plan[0]] = executor.submit(_fetch_window, *plan, policy=policy, deadline=None)
        while len(_ahead) > _AHEAD:
            _ahead.popitem(last=False)[1].cancel()


def remote_window(uri: str | os.PathLike, hint) -> bool:
    """Whether a window of ``uri`` is read by :func:`open_window` (a remote video with a byte index): then even a
    window that starts at the file's first keyframe is worth a cut or a seek, which save the rest of the file."""
    return _plan(uri, hint, (0,)) is not None


def _plan(uri, hint, frames):
    """``(key, index, start, end, stop_at)`` of a remote window with a byte index, else ``None``."""
    index = None if hint is None or hint.unsafe_seek else hint.reads
    if index is None:
        return None
    member = member_of(uri)
    obj, base = (member.shard, member.offset) if member is not None else (os.fspath(uri), 0)
    if not is_remote(obj) or (member is not None and member.size != index.size):
        return None
    start, end = index.window(hint.keyframe_indices, min(frames), max(frames))
    if 0 < start - index.head_end <= READ_FORWARD:
        start = index.head_end  # FFmpeg reads this gap rather than seek over it: fetch it with the window
    return (obj, base, start, end), index, index.last_packet_end(max(frames))


def _fetch_window(key: tuple, index: ByteIndex, stop_at: int, *, policy: ReadPolicy,
                  deadline: float | None) -> WindowFile:
    obj, base, start, end = key
    header = (obj, base, index.size)
    held = list(_cached_header(header) or ())
    wanted = _missing([(s, e) for s, e in index.header()] + [(start, end)], held)
    if wanted:
        fetched = _fetch_all(obj, base, wanted, policy, deadline)
        held += list(zip((s for s, _ in wanted), fetched))
    return WindowFile(obj, base, index.size, held, policy=policy, deadline=deadline, stop_at=stop_at,
                      header=(header, index))


class WindowFile(RangeReader):
    """A remote video as a file of ``size`` bytes, holding some of its ranges (see the module doc).

    Call :meth:`opened` once PyAV has opened it: what the open read is then kept as the file's header.

    Attributes:
        stop_at: where the window's last packet ends: a reader may stop demuxing at a packet ending there.
    """

    def __init__(self, uri: str, base: int, size: int, spans, *, policy: ReadPolicy = DEFAULT_POLICY,
                 deadline: float | None = None, stop_at: int | None = None, header=None) -> None:
        super().__init__()
        self.uri, self.base, self.size = uri, base, size
        self.policy, self.deadline, self.stop_at = policy, deadline, stop_at
        self._header = header  # (cache key, byte index): what opened() keeps
        self._reach = 0  # how far into the file reads went
        self._starts: list[int] = []
        self._spans: list[tuple[int, bytes]] = []
        for start, data in spans:
            self._hold(start, data)

    def _hold(self, start: int, data: bytes) -> None:
        """Hold ``data`` at ``start``; a range inside another held one is dropped (a header kept, and a window
        fetched from the file's start with it)."""
        end = start + len(data)
        if any(s <= start and end <= s + len(d) for s, d in self._spans):
            return
        kept = [(s, d) for s, d in self._spans if not (start <= s and s + len(d) <= end)]
        i = bisect.bisect_left([s for s, _ in kept], start)
        kept.insert(i, (start, data))
        self._spans, self._starts = kept, [s for s, _ in kept]

    def opened(self) -> None:
        """Keep what opening the file read (at least the index's head, and its tail) as its header, once per
        process: FFmpeg's open may read past the first packet (H.264 in Matroska: a few packets)."""
        if self._header is None:
            return
        key, index = self._header
        self._header = None
        head = max(index.head_end, min(self._reach, index.tail_start))
        ranges = [(0, head)] + ([(index.tail_start, index.size)] if index.tail_start < index.size else [])
        kept = [(start, self._held(start, end)) for start, end in ranges]
        if all(data is not None for _, data in kept):
            _keep_header(key, kept)

    def _held(self, start: int, end: int) -> bytes | None:
        """Bytes ``start .. end`` from the ranges held (joined where they meet), or ``None`` if one is missing."""
        parts, pos = [], start
        i = bisect.bisect_right(self._starts, start) - 1
        while pos < end and 0 <= i < len(self._spans):
            s, data = self._spans[i]
            if not s <= pos < s + len(data):
                return None
            parts.append(data[pos - s:end - s])
            pos = s + len(data)
            i += 1
        return b"".join(parts) if pos >= end else None

    def read(self, n: int = -1) -> bytes:
        start = self._pos
        out = self._read(n)
        if self._header is not None and start < self._header[1].tail_start:  # an index at the end is the tail's
            self._reach = max(self._reach, self._pos)
        return out

    def _read(self, n: int) -> bytes:
        n = self._wanted(n)
        if n <= 0:
            return b""
        pos = self._pos
        i = bisect.bisect_right(self._starts, pos) - 1
        if i >= 0:
            start, data = self._spans[i]
            if pos < start + len(data):
                out = data[pos - start:pos - start + n]  # a short read at a range's end: FFmpeg reads again
                self._pos += len(out)
                return out
        nxt = self._starts[i + 1] if i + 1 < len(self._starts) else self.size
        end = min(nxt, max(pos + n, min(pos + RANGE_BLOCK_BYTES, nxt)), self.size)
        try:
            data = fetch(self.uri, self.base + pos, self.base + end, policy=self.policy, deadline=self.deadline)
        except RemoteReadError:
            self._failed = True
            raise
        if not data:
            return b""
        self._hold(pos, data)
        out = data[:n]
        self._pos += len(out)
        return out


class PacketsUntil:
    """Demuxed packets up to the one ending at ``stop_at`` (:attr:`WindowFile.stop_at`; ``None``: all of them).

    What follows is not needed for the window (the byte index says so), so it
    is neither demuxed nor fetched; a decoder is then drained for the frames
    still in it. :attr:`stopped` says the packets were ended here, not by the file.
    """

    def __init__(self, packets, stop_at: int | None) -> None:
        self._packets, self._stop_at = packets, stop_at
        self.stopped = False

    def __iter__(self):
        for packet in self._packets:
            yield packet
            if self._stop_at is not None and packet.pos >= 0 and packet.pos + packet.size >= self._stop_at:
                self.stopped = True
                return


def _missing(ranges, held) -> list[tuple[int, int]]:
    """``ranges`` (merged where they touch) less what ``held`` covers whole."""
    merged: list[list[int]] = []
    for start, end in sorted(r for r in ranges if r[1] > r[0]):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    covered = [(s, s + len(d)) for s, d in held]
    return [(s, e) for s, e in merged if not any(a <= s and e <= b for a, b in covered)]


def _fetch_all(uri: str, base: int, ranges, policy: ReadPolicy, deadline: float | None) -> list[bytes]:
    """Each range's bytes, fetched at once (one request each, retried as every read), checked for length."""
    calls = [lambda s=s, e=e: fetch(uri, base + s, base + e, policy=policy, deadline=deadline) for s, e in ranges]
    if len(calls) == 1:
        results = [calls[0]()]
    else:
        futures = [_executor().submit(call) for call in calls]
        results = [f.result() for f in futures]
    for (start, end), data in zip(ranges, results):
        if len(data) != end - start:
            raise RemoteReadError(uri, f"object is shorter than when scanned: bytes {start}..{end} gave "
                                       f"{len(data)} (replaced since the scan? run `daliload scan` again)",
                                  number=errno.EIO)
    return results


def _executor(kind: str = "ranges") -> ThreadPoolExecutor:
    """This process's threads for ``"ranges"`` (one window's requests at once) or ``"ahead"`` (windows read
    ahead, each of which waits on range threads: two pools, so that one never waits on itself)."""
    with _lock:
        pool = _pools.get(kind)
        if pool is None or pool[0] != os.getpid():  # a forked child has no threads of its parent's pool
            threads = _FETCH_THREADS if kind == "ranges" else _AHEAD
            pool = _pools[kind] = (os.getpid(), ThreadPoolExecutor(threads, thread_name_prefix=f"daliload-{kind}"))
        return pool[1]


def _cached_header(key: tuple):
    with _lock:
        spans = _headers.get(key)
        if spans is not None:
            _headers.move_to_end(key)
        return spans


def _keep_header(key: tuple, spans) -> None:
    """Keep a file's header ``spans`` (``(start, bytes)``), evicting the least recently used past the bound."""
    global _headers_bytes
    size = sum(len(d) for _, d in spans)
    if size > HEADER_CACHE_BYTES // 4:
        return
    with _lock:
        if key in _headers:
            return
        _headers[key] = tuple(spans)
        _headers_bytes += size
        while _headers_bytes > HEADER_CACHE_BYTES and _headers:
            _, dropped = _headers.popitem(last=False)
            _headers_bytes -= sum(len(d) for _, d in dropped)


def clear_header_cache() -> None:
    """Forget every kept header (tests; a process that wants its memory back)."""
    global _headers_bytes
    with _lock:
        _headers.clear()
        _headers_bytes = 0
