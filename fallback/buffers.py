"""The fallback's shared buffers on a CPU host, reused once the batch handed out over one is gone.

A group's clips are written by the workers into a shared-memory buffer
(:func:`fallback.source.shared_buffer`), and on the CPU a group that is the
whole batch is handed out as the batch itself: no copy. A fresh buffer for
every batch costs the kernel a zeroed page for every 4 KiB the workers write
and a fault in each process that touches it: on the 2-core VM about 4 ms of
system time per 224x224x16 float32 clip, a tenth of what decoding and
transforming such a clip costs (the stage profile of ``python -m benchmarks``
times it as part of ``normalise``; ``tests/test_buffers.py`` checks the
reuse, not the time).

:class:`ReusedBuffers` keeps the pages instead. Each :meth:`~ReusedBuffers.take`
maps a buffer afresh, and that mapping is what every tensor over the batch
holds: when the last of them goes (the batch, its views, a numpy array over
it), the mapping goes and the buffer comes back for the next group. A batch a
training loop keeps (a list of batches, a view stored for later) keeps its
buffer; the ring then makes new ones, as before. A buffer that comes back
already has its pages, so the worker asks for them in one call
(:func:`fallback.source.map_rows`) and this process maps them with the
mapping (``MAP_POPULATE``), instead of a fault per page in each.
"""

from __future__ import annotations

import collections
import math
import mmap
import os
import threading
import weakref

import torch

__all__ = ["ReusedBuffers"]


class ReusedBuffers:
    """A ring of shared buffers for :class:`fallback.FallbackSource` (its ``buffers``) on a CPU host.

    A buffer holds the largest group asked for so far, so a smaller group fits
    any; up to ``keep`` wait for reuse, the rest are freed when they come back.
    The finalizers that bring buffers back may run in any thread (garbage
    collection), so they only append to a queue that :meth:`take` drains (and, once the ring is closed, free
    what they bring).

    Args:
        keep: buffers kept for reuse (the batches a pass has ahead, and the one
            the training loop holds).

    Raises:
        ValueError: ``keep`` is below 1.
    """

    def __init__(self, *, keep: int) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep!r}")
        self._keep = keep
        # Re-entrant: a finalizer that brings a buffer back after close() takes it, and garbage collection may
        # run one in this thread while the lock is held (an unrelated cycle holding a batch).
        self._lock = threading.RLock()
        self._free: list[tuple[int, int]] = []  # (descriptor, bytes), for take only
        self._back: collections.deque[tuple[int, int]] = collections.deque()  # from finalizers, any thread
        self._bytes = 0  # the largest group asked for so far
        self._closed = False
        self.made = 0  # buffers made so far: what reuse saves
        self.reused = 0  # takes served by a buffer that came back

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, int, "_Lease"]:
        """A tensor of ``shape`` in a shared buffer, its descriptor (the ring's) and its :class:`_Lease`."""
        from fallback.source import shared_buffer

        need = math.prod(shape) * dtype.itemsize
        with self._lock:
            self._closed = False  # a closed ring serves again (a loader stays usable after close())
            self._drain()
            fits = [i for i, (_, size) in enumerate(self._free) if size >= need]
            if fits:
                fd, size = self._free.pop(min(fits, key=lambda i: self._free[i][1]))
                self.reused += 1
                populate = mmap.MAP_POPULATE if hasattr(mmap, "MAP_POPULATE") else 0
            else:
                self._bytes = max(self._bytes, need)
                _, fd = shared_buffer((self._bytes,), torch.uint8)  # its pages come as the workers write
                size, populate = self._bytes, 0
                self.made += 1
        mapping = mmap.mmap(fd, need, flags=mmap.MAP_SHARED | populate)
        lease = _Lease(self, fd, size)
        weakref.finalize(mapping, lease.came_back).atexit = False  # at exit the memory goes anyway
        return torch.frombuffer(mapping, dtype=dtype).view(shape), fd, lease

    def close(self) -> None:
        """Free the buffers waiting for reuse; those still lent are freed when they come back (unless a
        :meth:`take` has made the ring serve again by then)."""
        with self._lock:
            self._closed = True
            self._drain()
            while self._free:
                os.close(self._free.pop()[0])

    def _came_back(self, fd: int, size: int) -> None:
        self._back.append((fd, size))
        if self._closed:  # close() may have drained just before this append
            with self._lock:
                self._drain()
                while self._free:
                    os.close(self._free.pop()[0])

    def _drain(self) -> None:
        """Move the buffers that came back to the free list, keeping the ``keep`` largest (under the lock)."""
        while self._back:
            self._free.append(self._back.popleft())
        self._free.sort(key=lambda item: item[1], reverse=True)
        while len(self._free) > (0 if self._closed else self._keep):
            os.close(self._free.pop()[0])


class _Lease:
    """One buffer of :class:`ReusedBuffers`, lent until the mapping over it goes.

    Called (the pass is done with the batch's copies) it does nothing: on the
    CPU the batch may be the buffer itself, so it comes back only when the last
    tensor over it goes. :meth:`discard` (a group dropped while a decode may
    still write into it) frees it instead when it comes back.
    """

    def __init__(self, ring: ReusedBuffers, fd: int, size: int) -> None:
        self._ring, self._fd, self._size = ring, fd, size
        self._discarded = False

    def __call__(self) -> None:
        pass

    def discard(self) -> None:
        self._discarded = True

    def came_back(self) -> None:
        if self._discarded:
            os.close(self._fd)
        else:
            self._ring._came_back(self._fd, self._size)
