"""The PyAV fallback as a clip source: supervised worker processes that write clips into shared memory.

:class:`FallbackSource` implements :class:`daliload.clips.ClipSource` for
every file DALI cannot decode (and for whatever an epoch pass sends it:
replacements, DALI's culprits). A submitted group of samples gets one buffer
of shared memory (an anonymous ``memfd``), shaped as the group's clips; each
video of the group is one task of a :class:`daliload.runtime.WorkerPool`
(its samples decode in one pass over the file: the views of a multi-view
sample, the clips of repeated sampling), and the worker writes its clips
straight into their rows of that buffer. Only the buffer's file descriptor
and a few numbers cross the pipe; the buffer is the batch the training loop
gets (no copy when the group is the whole batch). The workers live as long
as the source, so a new epoch starts no process::

    source = FallbackSource(output, FallbackOptions(timeout_s=60), workers=2, hint_of=hints.get)
    ticket = source.submit(samples)
    decoded = source.collect(ticket)       # Decoded(videos, failures, frames_decoded)

What a broken file costs, whichever way it breaks:

- a file that does not decode (``DecodeError``): its rows fail, with the reason;
- a file that decodes fewer frames now than the manifest counted
  (``frames_of``: truncated or replaced since the scan), when a window needs
  one it lacks: its rows fail ("decoded only N of M frames") instead of
  repeating its last frame; windows past the manifest's count are padded
  as the plan means;
- a decode past ``timeout_s``: the decoder's own deadline (checked between
  packets) fails it; one stuck inside FFmpeg gets its worker killed at
  :func:`hard_limit` and fails as ``"timeout"``;
- a worker killed by a signal while decoding (a segfault in FFmpeg, the OOM
  killer): the video is tried once more on a fresh worker, and fails as
  ``"crash"`` only when it kills that one too; a worker killed while idle is
  replaced (:class:`~daliload.runtime.WorkerPool`).

``workers=0`` decodes in the calling process when a group is collected: the
debugging mode, in which a crash inside FFmpeg ends the process and a hang
inside it is not cut.

Where the clips are normalised is the source's ``normalize_on``, one choice
for all its groups (replacements and DALI's culprits included): ``"worker"``
(the default) writes finished clips; ``"device"`` writes the uint8 pixels of
:func:`fallback.transform.pixel_spec` (cropped, resized, flipped, laid out;
``Decoded.normalized`` false) and leaves the float math to the merge, on the
batch's device (:func:`fallback.transform.normalize_pixels`). The loader
chooses ``"device"`` when its batches go to a GPU
(:func:`daliload.epoch.fallback_normalizes_on`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import mmap
import os
import sys
import tempfile
import time
import weakref
from dataclasses import dataclass, field
from typing import Callable, Literal, Protocol, Sequence

import torch

from daliload.failures import Failure, FailureKind
from daliload.plan import OutputSpec, Sample, clamp_frame_indices
from daliload.clips import TASKS_AHEAD_PER_WORKER, Decoded, LoadMeter, SourceLoad
from daliload.runtime import TaskOutcome, WithPrefetch, WorkerPool
from fallback.decode import DecodeError, decode_window
from daliload.stream import DEFAULT_POLICY, ReadPolicy, prefetch_window
from daliload.stream.numbering import StreamHint
from fallback.options import FallbackOptions
from fallback.transform import apply_plan, clip_shape, output_dtype, pixel_spec
from fallback.views import decode_views

logger = logging.getLogger(__name__)

#: Where a source's clips are normalised: in its workers, or by the merge on the batch's device.
NormalizeOn = Literal["worker", "device"]

class Lease(Protocol):
    """A buffer lent by a :class:`BufferSource`: called, it goes back for reuse; discarded, it is freed."""

    def __call__(self) -> None: ...

    def discard(self) -> None: ...


class BufferSource(Protocol):
    """Where a source's shared buffers come from when they are reused (``FallbackSource(buffers=...)``).

    ``take(shape, dtype)`` gives a tensor of that shape in shared memory, the
    descriptor a worker maps it by (owned by the lease, open until it ends) and
    the :class:`Lease`.
    """

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, int, Lease]: ...


#: Decodes of one file per task: a group's samples of the same video (its views, its clips).
_Task = tuple  # (rows, samples, hint, shape, dtype name, the manifest's frame count or None)


def hard_limit(timeout_s: float) -> float:
    """When a worker still decoding is killed: after the decoder's own deadline had its chance."""
    return timeout_s * 1.25 + 0.5


def decode_sample(sample: Sample, output: OutputSpec, decode: FallbackOptions = FallbackOptions(), *,
                  out: torch.Tensor | None = None, num_frames: int | None = None) -> torch.Tensor:
    """Decode one plan sample and apply its plan: ``decode_window`` + ``apply_plan`` (into ``out`` if given).

    Args:
        sample, output, decode: what to decode, what it becomes, how.
        out: where to write the clip.
        num_frames: the file's frame count in the manifest the plan was made
            from (default: its seek hint's, if any); a window needing a frame
            past what the file decodes now then fails instead of being padded.

    Raises:
        DecodeError: the sample's file cannot be decoded, or decodes fewer
            frames than ``num_frames`` and the window needs one of those.
    """
    hint = decode.hint(sample.path)
    if num_frames is None and hint is not None:
        num_frames = hint.num_frames
    return _decode_one(sample, output, decode, hint, out, num_frames)[0]


def _decode_one(sample: Sample, output: OutputSpec, decode: FallbackOptions, hint: StreamHint | None,
                out: torch.Tensor | None = None, num_frames: int | None = None) -> tuple[torch.Tensor, int]:
    clip = decode_window(sample.path, sample.frame_indices(), threads=decode.threads,
                         skip_nonref=decode.skip_nonref, timeout_s=decode.timeout_s, hint=hint,
                         num_frames=num_frames, policy=decode.read_policy)
    return apply_plan(clip.frames, sample, output, out=out), clip.num_frames_decoded


def decode_rows(task: _Task, fds: Sequence[int] = (), *, output: OutputSpec, decode: FallbackOptions,
                videos: torch.Tensor | None = None) -> list[tuple[int, tuple[str, FailureKind] | None]]:
    """Decode one video's samples of a group into their rows; a worker runs this (or the source, ``workers=0``).

    Args:
        task: ``(rows, samples, hint, shape, dtype, num_frames)``: the rows of
            the group's buffer the samples fill, the samples (one video's), its
            seek hint, the buffer's shape and dtype, and the video's frame
            count in the manifest (``None``: unknown).
        fds: the group buffer's file descriptor (in a worker).
        output, decode: what every clip is turned into; how it is decoded.
        videos: the group buffer itself (in the calling process).

    Returns:
        Per sample, ``(frames_decoded, None)`` or ``(0, (reason, kind))``.
    """
    rows, samples, hint, shape, dtype, num_frames = task
    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)  # one decode per worker process; the workers are the parallelism
    if videos is None:
        videos = map_rows(fds[0], shape, getattr(torch, dtype), rows)
    try:
        if len(samples) == 1:
            _, frames = _decode_one(samples[0], output, decode, hint, videos[rows[0]], num_frames)
            return [(frames, None)]
        _, frames = decode_views(samples, output, decode if hint is None else _with_hint(decode, samples, hint),
                                 out=[videos[row] for row in rows], num_frames=num_frames)
        return [(frames, None)] + [(0, None)] * (len(samples) - 1)
    except DecodeError as err:
        logger.info("%s", err)
        return [(0, (err.reason, err.kind))] * len(samples)


def prefetch_rows(task: _Task, policy: ReadPolicy = DEFAULT_POLICY) -> None:
    """Start reading the window a :func:`decode_rows` task will decode, when it is a remote video with a byte
    index (:func:`daliload.stream.prefetch_window`); returns at once."""
    _, samples, hint, _, _, num_frames = task
    if hint is not None and hint.reads is not None:
        wanted = [i for sample in samples for i in sample.frame_indices()]  # only its first and last count
        prefetch_window(samples[0].path, hint, clamp_frame_indices(wanted, num_frames) if num_frames else wanted,
                        policy=policy)


def _with_hint(decode: FallbackOptions, samples: Sequence[Sample], hint: StreamHint) -> FallbackOptions:
    return dataclasses.replace(decode, hints={samples[0].path: hint})


#: madvise's MADV_POPULATE_WRITE: 23 in Linux's uapi ``mman-common.h`` (5.14 and later), which Python 3.11's
#: mmap module does not name; elsewhere none (the number may mean something else there)
_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23 if sys.platform.startswith("linux") else None)


def map_buffer(fd: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A tensor over the shared buffer ``fd`` (it keeps the mapping alive; the fd may be closed after)."""
    return torch.frombuffer(mmap.mmap(fd, math.prod(shape) * dtype.itemsize), dtype=dtype).view(shape)


def map_rows(fd: int, shape: tuple[int, ...], dtype: torch.dtype, rows: Sequence[int]) -> torch.Tensor:
    """:func:`map_buffer` for a worker that writes ``rows`` (consecutive), their pages mapped first, in one call.

    ``MADV_POPULATE_WRITE`` (Linux 5.14) on the rows' pages instead of a
    fault per 4 KiB as the clips are written: it allocates the pages of a
    fresh buffer and maps those of a reused one (:class:`fallback.buffers.ReusedBuffers`),
    where it saves most. Only the rows' pages: another task's rows are left to
    the worker that writes them. Where the kernel cannot, ``posix_fallocate``
    allocates the rows' pages (faults map them), and failing that the faults
    do both, as before.
    """
    row_bytes = math.prod(shape[1:]) * dtype.itemsize
    start, end = rows[0] * row_bytes, (rows[-1] + 1) * row_bytes
    mapping = mmap.mmap(fd, math.prod(shape) * dtype.itemsize)
    page = start - start % mmap.PAGESIZE
    try:
        if _MADV_POPULATE_WRITE is None:
            raise OSError("no MADV_POPULATE_WRITE here")
        mapping.madvise(_MADV_POPULATE_WRITE, page, end - page)
    except (AttributeError, OSError, ValueError):
        try:
            os.posix_fallocate(fd, start, end - start)
        except (AttributeError, OSError):
            pass
    return torch.frombuffer(mapping, dtype=dtype).view(shape)


def shared_buffer(shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, int]:
    """A new tensor in shared memory, and the file descriptor that shares it with a worker.

    An anonymous ``memfd`` (Linux): nothing is left behind in ``/dev/shm``
    whoever dies, and the memory goes with the last tensor and descriptor.
    """
    size = math.prod(shape) * dtype.itemsize
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("daliload-clips", os.MFD_CLOEXEC)
    else:  # not Linux: an unlinked temporary file serves the same way
        with tempfile.TemporaryFile() as anonymous:
            fd = os.dup(anonymous.fileno())
    os.ftruncate(fd, size)
    return map_buffer(fd, shape, dtype), fd


def _video_tasks(samples: Sequence[Sample]) -> list[tuple[list[int], list[Sample]]]:
    """The group's samples by video: runs of samples of one file and one video group (``position - view``)."""
    tasks: list[tuple[list[int], list[Sample]]] = []
    for row, sample in enumerate(samples):
        last = tasks[-1][1][-1] if tasks else None
        if last is not None and last.path == sample.path and \
                last.position - last.view == sample.position - sample.view:
            tasks[-1][0].append(row)
            tasks[-1][1].append(sample)
        else:
            tasks.append(([row], [sample]))
    return tasks


@dataclass
class _Group:
    """A submitted group: its buffer, its samples, the tasks still out and the rows settled."""

    videos: torch.Tensor
    fd: int | None  # the buffer's descriptor, kept open for a task sent again to a fresh worker
    samples: list[Sample]
    lease: Lease | None = None  # the buffer's, when it came from a BufferSource (which owns fd)
    waiting: dict[int, list[int]] = field(default_factory=dict)  # task id -> its rows
    local: list[_Task] = field(default_factory=list)  # workers=0: decoded at collect
    results: dict[int, tuple[int, tuple[str, FailureKind] | None]] = field(default_factory=dict)  # by row


class FallbackSource:
    """The PyAV fallback as a :class:`~daliload.clips.ClipSource` (see the module docstring).

    Args:
        output: what every clip is turned into.
        decode: FFmpeg threads, non-reference skipping and the time limit.
        workers: decoding processes (started at the first group, kept until
            :meth:`close`); 0 decodes in this process (debugging only).
        hint_of: ``path -> StreamHint | None``, the pre-screen's seek hints.
        frames_of: ``path -> frames | None``, the manifest's frame counts (the
            ones the plan was made from): a window that needs a frame the file
            no longer decodes fails. Default: the count in the file's hint.
        normalize_on: ``"worker"`` (default): the workers write finished
            clips of ``output``; ``"device"``: they write uint8 pixels
            (:func:`~fallback.transform.pixel_spec`) and the merge normalises
            them (see the module docstring). With a uint8 ``output`` there is
            nothing to normalise: the workers write it either way.
        task_fn: what a worker runs for a task (default :func:`decode_rows`);
            a test double can fail on command (:mod:`daliload.testing`).
        buffers: where groups' buffers come from when they are reused (the
            loader's page-locked ring on a GPU host,
            :class:`daliload.epoch.RegisteredBuffers`): each collected group's
            ``Decoded.recycle`` gives its buffer back once the batch's copies
            have read it, a cancelled group's is freed (a worker may still be
            writing into it). ``None`` (default): a fresh buffer per group,
            which is what lets a CPU batch be the buffer itself.

    Raises:
        ValueError: ``workers`` is not an integer >= 0, or ``normalize_on``
            is neither ``"worker"`` nor ``"device"``.
    """

    def __init__(self, output: OutputSpec, decode: FallbackOptions = FallbackOptions(), *, workers: int = 2,
                 hint_of: Callable[[str], StreamHint | None] | None = None,
                 frames_of: Callable[[str], int | None] | None = None,
                 normalize_on: NormalizeOn = "worker", task_fn: Callable[..., list] = decode_rows,
                 buffers: BufferSource | None = None) -> None:
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 0:
            raise ValueError(f"workers must be an integer >= 0, got {workers!r}")
        if normalize_on not in ("worker", "device"):
            raise ValueError(f"normalize_on must be 'worker' or 'device', got {normalize_on!r}")
        self.output = output.sized()
        #: where the clips are normalised (``"worker"`` for a uint8 output, whatever was asked)
        self.normalize_on: NormalizeOn = "worker" if self.output.dtype == "uint8" else normalize_on
        #: what the workers write: ``output``, or its uint8 pixels when the merge normalises
        self.written = self.output if self.normalize_on == "worker" else pixel_spec(self.output)
        self.decode = dataclasses.replace(decode, hints=None)  # hints: hint_of
        self.workers = workers
        #: ``path -> StreamHint | None``: the seek hint a video's task carries (looked up when it is sent)
        self.hint_of = hint_of or decode.hint
        self._frames_of = frames_of
        self._limit = None if decode.timeout_s is None else hard_limit(decode.timeout_s)
        # A worker reads the task behind the one it runs ahead (a remote window's bytes) while it decodes.
        self._task_fn = WithPrefetch(functools.partial(task_fn, output=self.written, decode=self.decode),
                                     functools.partial(prefetch_rows, policy=self.decode.read_policy))
        self._pool: WorkerPool | None = None
        self._groups: dict[int, _Group] = {}
        self._group_of: dict[int, int] = {}  # task id -> ticket
        self._next_ticket = 0
        self._meter = LoadMeter(workers)
        self.buffers = buffers

    def use_task_fn(self, task_fn: Callable[..., list]) -> None:
        """Run ``task_fn`` in the workers from now on (a test double); restarts them."""
        self.close()
        self._task_fn = functools.partial(task_fn, output=self.written, decode=self.decode)

    def start(self) -> list[int]:
        """Start the workers now, not with the first group (``workers=0``: none); their pids."""
        return self._workers().start() if self.workers else []

    @property
    def worker_pids(self) -> list[int]:
        """Pids of the running workers (empty before the first group and after :meth:`close`)."""
        return self._pool.pids if self._pool is not None else []

    def submit(self, samples: Sequence[Sample], *, urgent: bool = False) -> int:
        """Queue ``samples`` (same ``clip_len``); returns the ticket for :meth:`collect`. Never waits."""
        samples = list(samples)
        if not samples:
            raise ValueError("a group needs at least one sample")
        shape = (len(samples), *clip_shape(samples[0].clip_len, self.written))
        dtype = output_dtype(self.written)
        ticket, self._next_ticket = self._next_ticket, self._next_ticket + 1
        if self.workers == 0:
            group = _Group(torch.empty(shape, dtype=dtype), None, samples)
        elif self.buffers is not None:
            videos, fd, lease = self.buffers.take(shape, dtype)
            group = _Group(videos, fd, samples, lease)
        else:
            group = _Group(*shared_buffer(shape, dtype), samples)
        for rows, video in _video_tasks(samples):
            hint = self.hint_of(video[0].path)
            num_frames = self._frames_of(video[0].path) if self._frames_of is not None else \
                (hint.num_frames if hint is not None else None)
            task = (rows, video, hint, shape, str(dtype).removeprefix("torch."), num_frames)
            if self.workers == 0:
                group.local.append(task)
                continue
            task_id = self._workers().submit(task, fds=(group.fd,), urgent=urgent)
            group.waiting[task_id] = rows
            self._group_of[task_id] = ticket
        self._groups[ticket] = group
        self._meter.submitted(ticket, len(samples))
        return ticket

    def collect(self, ticket: int) -> Decoded:
        """Wait for the group of ``ticket``; its clips, and a failure for each row that has none."""
        group = self._groups[ticket]
        asked = time.perf_counter()
        for task in group.local:  # workers=0
            group.results.update(zip(task[0], self._task_fn(task, videos=group.videos)))
        while group.waiting:
            for outcome in self._pool.wait():
                self._settle(outcome)
        del self._groups[ticket]
        self._meter.collected(ticket, asked)
        if group.fd is not None and group.lease is None:
            os.close(group.fd)
        failures = {}
        for row, (_, failed) in group.results.items():
            if failed is not None:
                sample = group.samples[row]
                failures[row] = Failure(sample.path, failed[0], sample.position, failed[1])
        return Decoded(group.videos, failures, sum(frames for frames, _ in group.results.values()),
                       normalized=self.normalize_on == "worker", recycle=group.lease)

    def cancel(self) -> None:
        """Drop every group not collected yet (running decodes finish; their results are ignored)."""
        if self._pool is not None:
            self._pool.cancel(self._group_of)
        for group in self._groups.values():
            if group.lease is not None:
                group.lease.discard()  # never reused: a running decode may still write into it
            elif group.fd is not None:
                os.close(group.fd)
        self._groups.clear()
        self._group_of.clear()
        self._meter.dropped()

    def load(self) -> SourceLoad:
        """Clips in flight, recent clips/s and the workers (:class:`~daliload.clips.LoadMeter`)."""
        return self._meter.load()

    def close(self) -> None:
        """Drop what is pending and stop the workers (the next group starts new ones)."""
        self.cancel()
        if self._pool is not None:
            self._stop_pool()  # the finalizer: it runs once, and not again when this object goes
            self._pool = None

    # -- internals --------------------------------------------------------------------------

    def _workers(self) -> WorkerPool:
        if self._pool is None:
            self._pool = WorkerPool(self._task_fn, workers=self.workers, timeout_s=self._limit, retry_crashed=True,
                                    tasks_per_worker=TASKS_AHEAD_PER_WORKER)
            # Not __del__: when the source dies in a reference cycle, the garbage collector may finalize the
            # pool's pipes first, and a __del__ would then close their descriptors a second time (perhaps a
            # number reused meanwhile). A finalizer holds the pool, so it runs while the pipes are intact.
            self._stop_pool = weakref.finalize(self, self._pool.close)
        return self._pool

    def _settle(self, outcome: TaskOutcome) -> None:
        """Store a task's outcome with its group's rows: frames decoded, or why each failed."""
        ticket = self._group_of.pop(outcome.task_id, None)
        group = self._groups.get(ticket) if ticket is not None else None
        if group is None:
            return  # a cancelled group's task
        rows = group.waiting.pop(outcome.task_id)
        if outcome.ok:
            group.results.update(zip(rows, outcome.value))
            return
        if outcome.status == "timeout":
            failed = (f"timeout: decode still running after {self._limit:g} s; worker killed", "timeout")
        elif outcome.status == "crash":
            how = outcome.error.removeprefix("worker died with ").replace("worker exited with code", "exit code")
            failed = (f"worker died ({how}) while decoding this sample", "crash")
        else:
            failed = (f"decode raised {outcome.error}", "decode")
        group.results.update((row, (0, failed)) for row in rows)

    def __repr__(self) -> str:
        return (f"FallbackSource(workers={self.workers}, timeout_s={self.decode.timeout_s}, "
                f"normalize_on={self.normalize_on!r}, pending_groups={len(self._groups)})")
