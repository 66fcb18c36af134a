"""A Dataset over plan samples and a DataLoader that survives broken files, hangs and dead workers.

The blog post this project starts from decoded whole files in ``__getitem__``,
forked workers next to threaded libraries, and dropped broken samples as
``None`` in ``collate_fn`` (shrinking batches and putting DDP ranks out of
step). Here:

* :class:`ClipDataset` decodes only each sample's window
  (:func:`fallback.decode.decode_window`) and applies the plan
  (:func:`fallback.transform.apply_plan`). A sample whose file fails is
  replaced, deterministically, by the next sample of the plan that decodes
  (wrapping around), and the failure ``(path, reason)`` travels with the item.
* :func:`make_fallback_loader` builds a :class:`FallbackLoader`: DataLoader
  workers started with ``forkserver`` or ``spawn`` (never ``fork``, so a
  decoder thread pool can never be copied mid-lock into a child), pinned
  memory, persistent workers and prefetching. A worker that dies (segfault,
  OOM kill) or a decode that hangs past ``timeout_s`` costs the sample it was
  decoding, not the epoch: the loader records it, restarts its workers and
  resumes at the first batch it has not yet yielded. Past a failure threshold
  it raises :class:`TooManyFailuresError` listing the failures.

Worked example, batch size 4, plan positions 0..7, the file of position 2 is
truncated and position 5's decode hangs::

    batch 0: positions [0, 1, 3, 3]    slot 2 replaced by the next good sample, 3
    batch 1: positions [4, 6, 6, 7]    slot 5 cut after timeout_s, replaced by 6
    loader.failures == [Failure(path2, "decode failed: ...", 2),
                        Failure(path5, "timeout: ...", 5)]

Each batch keeps its size and order; a consumer that knows the plan sees which
slots were replaced (their position differs from the slot's).

Test-only fault hooks: with ``fault_injection=True``, a sample whose path is
``fault:kill`` (SIGKILL), ``fault:segv`` (a real segmentation fault),
``fault:exit`` (``os._exit(3)``) or ``fault:hang`` (sleeps for an hour) does
that inside the worker instead of decoding, so tests can kill or hang a worker
at a chosen sample. Off by default; any other path is decoded normally.
"""

from __future__ import annotations

import ctypes
import logging
import math
import multiprocessing
import os
import re
import signal
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Iterator, Literal, NamedTuple, Sequence

import torch
import torch.utils.data
from torch.utils.data import DataLoader, Dataset

from daliload.plan import OutputSpec, Sample
from fallback.decode import DecodeError, StreamHint, decode_window
from fallback.transform import apply_plan

logger = logging.getLogger(__name__)

MultiprocessingContext = Literal["forkserver", "spawn"]

#: Reasons recorded for failures the worker itself cannot report.
REASON_TIMEOUT = "timeout"
REASON_WORKER_DIED = "worker died"

_FAULT_PREFIX = "fault:"
#: Module the forkserver imports once so every worker starts with torch and PyAV loaded.
FORKSERVER_PRELOAD = "fallback.dataset"
#: How long a lost connection to a worker may wait for that worker's death to show.
_DEATH_GRACE_S = 2.0
#: Failure limit of :func:`make_fallback_loader` when none is given.
DEFAULT_MAX_FAILURE_FRACTION = 0.05
#: Worker deaths between samples tolerated in one pass before giving up.
_MAX_UNEXPLAINED_RESTARTS = 2


# --------------------------------------------------------------------------------------
# results


@dataclass(frozen=True)
class Failure:
    """A sample that could not be decoded.

    Attributes:
        path: the file.
        reason: why, starting with ``"timeout"`` or ``"worker died"`` for
            failures the loader detected from outside the worker.
        position: the sample's plan position (``None`` if unknown).
    """

    path: str
    reason: str
    position: int | None = None


@dataclass(frozen=True)
class DecodeOptions:
    """How :class:`ClipDataset` decodes (see :func:`fallback.decode.decode_window`).

    Attributes:
        threads: FFmpeg threads per decode; 1 is right with several workers.
        skip_nonref: skip non-reference frames the clip does not use.
        timeout_s: per-sample decode time limit in seconds (``None``: none).
        hints: optional ``path -> StreamHint`` from the pre-screen.
    """

    threads: int = 1
    skip_nonref: bool = True
    timeout_s: float | None = None
    hints: dict[str, StreamHint] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 or None, got {self.timeout_s}")


class ClipItem(NamedTuple):
    """What :class:`ClipDataset` returns for one plan slot.

    Attributes:
        video: the clip tensor (layout and dtype from the ``OutputSpec``).
        label: class index of the sample actually decoded.
        position: plan position of the sample actually decoded.
        slot_position: plan position of the slot this item fills; differs
            from ``position`` when the slot's own sample failed.
        frames_decoded: frames the decoder produced (GOP waste included).
        failures: failures met while filling this slot (the slot's own sample
            and any replacement candidates that failed too).
    """

    video: torch.Tensor
    label: int
    position: int
    slot_position: int
    frames_decoded: int
    failures: tuple[Failure, ...]

    @property
    def replaced(self) -> bool:
        return self.position != self.slot_position


class ClipBatch(NamedTuple):
    """A collated batch of :class:`ClipItem` (see :func:`collate_clips`)."""

    videos: torch.Tensor
    labels: torch.Tensor
    positions: torch.Tensor
    slot_positions: torch.Tensor
    frames_decoded: torch.Tensor
    failures: tuple[Failure, ...]


class FallbackBatch(NamedTuple):
    """What :class:`FallbackLoader` yields: ``videos, labels, positions = batch``.

    ``positions[k]`` is the plan position of the sample in row ``k``; a row
    whose position differs from its slot's was a replacement.
    """

    videos: torch.Tensor
    labels: torch.Tensor
    positions: torch.Tensor


@dataclass(frozen=True)
class FallbackStats:
    """Counters of the last (or current) pass over the plan.

    Attributes:
        num_samples: samples in the plan.
        num_batches: batches yielded.
        num_clips: clips yielded.
        num_failures: distinct samples that failed.
        num_replaced: slots filled with a replacement.
        num_timeouts: failures cut by the time limit.
        num_worker_deaths: failures that killed their worker.
        num_restarts: times the workers were restarted after a death or hang.
        frames_decoded: frames the decoders produced for the yielded clips.
        frames_used: frames the yielded clips hold (``clip_len`` each).
    """

    num_samples: int
    num_batches: int
    num_clips: int
    num_failures: int
    num_replaced: int
    num_timeouts: int
    num_worker_deaths: int
    num_restarts: int
    frames_decoded: int
    frames_used: int

    @property
    def frames_wasted(self) -> int:
        """Decoded frames the clips did not use (GOP waste)."""
        return self.frames_decoded - self.frames_used


class NoReplacementError(RuntimeError):
    """No decodable replacement was found for a failed sample."""

    def __init__(self, slot_position: int | str, failures: Sequence[Failure] = ()) -> None:
        if isinstance(slot_position, str):
            # Raised in a DataLoader worker, torch re-raises it in the main process as
            # exc_type(message): keep the type (callers catch it), the details are in the text.
            self.slot_position, self.failures = None, tuple(failures)
            super().__init__(slot_position)
            return
        self.slot_position = slot_position
        self.failures = tuple(failures)
        super().__init__(f"plan position {slot_position}: no decodable replacement among the next "
                         f"{len(self.failures) - 1} samples; failures: "
                         + "; ".join(f"{f.path}: {f.reason}" for f in self.failures[:5]))

    def __reduce__(self):
        return (type(self), (self.slot_position, self.failures))


class TooManyFailuresError(RuntimeError):
    """More samples failed than the loader's threshold allows; lists them."""

    def __init__(self, failures: Sequence[Failure], num_samples: int, limit: str) -> None:
        self.failures = tuple(failures)
        lines = [f"  {f.path} (position {f.position}): {f.reason}" for f in self.failures[:20]]
        if len(self.failures) > 20:
            lines.append(f"  ... and {len(self.failures) - 20} more (see .failures)")
        super().__init__(f"{len(self.failures)} of {num_samples} samples failed to decode, more than "
                         f"{limit}:\n" + "\n".join(lines))


# --------------------------------------------------------------------------------------
# progress board: what each worker is decoding, shared with the main process

_IDLE, _BUSY, _TIMED_OUT = 0.0, 1.0, 2.0
_FIELDS = 4  # pid, slot index, start time (time.monotonic, system-wide on Linux), state


class _ProgressBoard:
    """A shared array of ``(pid, slot, started, state)`` per worker.

    Workers write it before and after every decode; the main process reads it
    to cut hung decodes and to name the sample a dead worker was decoding.
    """

    def __init__(self, ctx, num_workers: int) -> None:
        self.num_workers = num_workers
        self.array = ctx.RawArray("d", [-1.0] * (num_workers * _FIELDS))

    # worker side
    def register(self, worker_id: int) -> None:
        self.array[worker_id * _FIELDS + 3] = _IDLE
        self.array[worker_id * _FIELDS + 0] = float(os.getpid())

    def start(self, worker_id: int, slot: int) -> None:
        base = worker_id * _FIELDS
        self.array[base + 3] = _IDLE
        self.array[base + 1] = float(slot)
        self.array[base + 2] = time.monotonic()
        self.array[base + 3] = _BUSY

    def finish(self, worker_id: int) -> None:
        self.array[worker_id * _FIELDS + 3] = _IDLE

    # main side
    def read(self, worker_id: int) -> tuple[int, int, float, float]:
        base = worker_id * _FIELDS
        pid, slot, started, state = self.array[base:base + _FIELDS]
        return int(pid), int(slot), started, state

    def mark_timed_out(self, worker_id: int) -> None:
        self.array[worker_id * _FIELDS + 3] = _TIMED_OUT

    def reset(self) -> None:
        for i in range(len(self.array)):
            self.array[i] = -1.0


# --------------------------------------------------------------------------------------
# dataset


class ClipDataset(Dataset):
    """Map-style dataset: item ``i`` is plan slot ``i``, decoded and transformed.

    Args:
        samples: the plan (one rank, one epoch), in order.
        output: what every clip is turned into.
        decode: decode options (threads, skip_nonref, timeout, hints).
        max_replacement_tries: failed candidates tolerated while looking for a
            replacement before :class:`NoReplacementError`.
        fault_injection: honour the test-only ``fault:*`` paths (see module
            docstring). Never set it in training.

    ``dataset[i]`` returns a :class:`ClipItem`. Batch items with
    :func:`collate_clips` (the default collate cannot batch ``failures``).
    """

    def __init__(
        self,
        samples: Sequence[Sample],
        output: OutputSpec,
        *,
        decode: DecodeOptions = DecodeOptions(),
        max_replacement_tries: int = 16,
        fault_injection: bool = False,
    ) -> None:
        if not samples:
            raise ValueError("samples is empty: nothing to load")
        if max_replacement_tries < 1:
            raise ValueError(f"max_replacement_tries must be >= 1, got {max_replacement_tries}")
        self.samples = list(samples)
        self.output = output
        self.decode = decode
        self.max_replacement_tries = max_replacement_tries
        self.fault_injection = fault_injection
        #: slot index -> reason, for samples that killed or hung a worker: never decoded again.
        self.known_bad: dict[int, str] = {}
        self._board: _ProgressBoard | None = None
        #: pid of the process that iterates the loader; its workers exit when it is gone.
        self._owner_pid: int | None = None

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> ClipItem:
        if not 0 <= index < len(self.samples):
            raise IndexError(f"slot {index} out of range for a plan of {len(self.samples)} samples")
        failures: list[Failure] = []
        n = len(self.samples)
        for step in range(n):
            candidate = (index + step) % n
            sample = self.samples[candidate]
            if candidate in self.known_bad:
                failures.append(Failure(sample.path, self.known_bad[candidate], sample.position))
                continue
            try:
                video, frames_decoded = self._decode(candidate, sample)
            except DecodeError as err:
                failures.append(Failure(sample.path, err.reason, sample.position))
                logger.info("slot %d: %s", index, err)
                if len(failures) > self.max_replacement_tries:
                    break
                continue
            return ClipItem(video, sample.label, sample.position, self.samples[index].position,
                            frames_decoded, tuple(failures))
        raise NoReplacementError(self.samples[index].position, failures)

    def _decode(self, slot: int, sample: Sample) -> tuple[torch.Tensor, int]:
        board, worker_id = self._board, _worker_id()
        if board is not None and worker_id is not None:
            board.start(worker_id, slot)
        try:
            if self.fault_injection and sample.path.startswith(_FAULT_PREFIX):
                _inject_fault(sample.path)
            hint = self.decode.hints.get(sample.path) if self.decode.hints else None
            clip = decode_window(sample.path, sample.frame_indices(), threads=self.decode.threads,
                                 skip_nonref=self.decode.skip_nonref, timeout_s=self.decode.timeout_s,
                                 hint=hint)
            return apply_plan(clip.frames, sample, self.output), clip.num_frames_decoded
        finally:
            if board is not None and worker_id is not None:
                board.finish(worker_id)


def decode_sample(sample: Sample, output: OutputSpec, **decode_opts) -> torch.Tensor:
    """Decode one plan sample and apply its plan: ``decode_window`` + ``apply_plan``.

    Args:
        sample: the plan item.
        output: what the clip is turned into.
        **decode_opts: ``threads``, ``skip_nonref``, ``timeout_s``, ``hint``
            for :func:`fallback.decode.decode_window`.

    Raises:
        DecodeError: the sample's file cannot be decoded.
    """
    clip = decode_window(sample.path, sample.frame_indices(), **decode_opts)
    return apply_plan(clip.frames, sample, output)


def collate_clips(items: Sequence[ClipItem]) -> ClipBatch:
    """Batch :class:`ClipItem` s (stacking videos into shared memory inside workers)."""
    videos = torch.utils.data.default_collate([item.video for item in items])
    return ClipBatch(
        videos=videos,
        labels=torch.tensor([item.label for item in items], dtype=torch.int64),
        positions=torch.tensor([item.position for item in items], dtype=torch.int64),
        slot_positions=torch.tensor([item.slot_position for item in items], dtype=torch.int64),
        frames_decoded=torch.tensor([item.frames_decoded for item in items], dtype=torch.int64),
        failures=tuple(f for item in items for f in item.failures),
    )


def _worker_id() -> int | None:
    info = torch.utils.data.get_worker_info()
    return None if info is None else info.id


def _worker_init(worker_id: int) -> None:
    info = torch.utils.data.get_worker_info()
    board = getattr(info.dataset, "_board", None)
    if board is not None:
        board.register(worker_id)
    owner = getattr(info.dataset, "_owner_pid", None)
    if owner is not None:
        threading.Thread(target=_exit_when_gone, args=(owner,), name="daliload-owner-watch",
                         daemon=True).start()


def _exit_when_gone(pid: int, poll_s: float = 1.0) -> None:
    """Worker side: exit once the process iterating the loader has died.

    torch's own watchdog compares ``os.getppid()`` with the pid it saw at
    start, but a forkserver worker's parent is the forkserver, which outlives a
    killed training process; without this, a ``kill -9`` of the trainer left
    its decoding workers running (seen on 2 cores, several minutes later).
    """
    while True:
        time.sleep(poll_s)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            os._exit(0)
        except PermissionError:  # the pid was reused by another user's process
            os._exit(0)


def _inject_fault(path: str) -> None:
    """Test-only: misbehave as ``path`` says (see the module docstring)."""
    action = path[len(_FAULT_PREFIX):]
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "segv":
        import resource
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core dump to wait for
        ctypes.string_at(0)  # reads address 0: a genuine SIGSEGV
    elif action == "exit":
        os._exit(3)
    elif action == "hang":
        time.sleep(3600)
    raise DecodeError(path, f"unknown test fault {action!r} (kill, segv, exit, hang)")


# --------------------------------------------------------------------------------------
# loader


class _ResumableBatches:
    """Batch sampler over plan slots that can resume at a given batch.

    Iterated in the main process only, so changing ``start`` between
    iterations redirects persistent workers too.
    """

    def __init__(self, num_samples: int, batch_size: int) -> None:
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.start = 0

    def __len__(self) -> int:
        return math.ceil(self.num_samples / self.batch_size) - self.start

    def __iter__(self) -> Iterator[list[int]]:
        for b in range(self.start, math.ceil(self.num_samples / self.batch_size)):
            yield list(range(b * self.batch_size, min(self.num_samples, (b + 1) * self.batch_size)))


class _WorkerLost(Exception):
    """Internal: the DataLoader lost a worker; carries the torch error."""


class FallbackLoader:
    """Iterate the plan in batches: ``for videos, labels, positions in loader``.

    Build it with :func:`make_fallback_loader`. Each pass yields
    ``ceil(len(samples) / batch_size)`` :class:`FallbackBatch` es in plan order;
    every batch but a short last one has ``batch_size`` rows whatever fails.
    After (or during) a pass, :attr:`failures` lists what failed and
    :meth:`stats` counts it; a pass that had failures warns once with totals.
    """

    def __init__(self, dataset: ClipDataset, *, batch_size: int, num_workers: int,
                 multiprocessing_context: MultiprocessingContext, pin_memory: bool,
                 persistent_workers: bool, prefetch_factor: int, timeout_s: float | None,
                 max_failures: int | None, max_failure_fraction: float | None) -> None:
        self.dataset = dataset
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.persistent_workers = persistent_workers and num_workers > 0
        self.prefetch_factor = prefetch_factor
        self.timeout_s = timeout_s
        self.max_failures = max_failures
        self.max_failure_fraction = max_failure_fraction
        self._ctx = multiprocessing.get_context(multiprocessing_context) if num_workers > 0 else None
        if num_workers > 0 and multiprocessing_context == "forkserver":
            # Workers are forked from one forkserver per process; with torch and PyAV
            # imported there once, a new epoch's workers start in ~0.1 s instead of
            # ~3.5 s (measured on 2 cores). Only takes effect if the server is not
            # running yet; daliload's scan preloads the same module for that reason.
            self._ctx.set_forkserver_preload([FORKSERVER_PRELOAD])
        if num_workers > 0:
            dataset._board = _ProgressBoard(self._ctx, num_workers)
            dataset._owner_pid = os.getpid()
        self._batches = _ResumableBatches(len(dataset), batch_size)
        self._loader: DataLoader | None = None
        self._failures: dict[int, Failure] = {}
        self._replacements: list[tuple[int, int]] = []
        self._counts = dict.fromkeys(
            ("batches", "clips", "restarts", "unexplained", "frames_decoded", "frames_used"), 0)
        self._clip_lens = {s.position: s.clip_len for s in dataset.samples}

    # -- public -----------------------------------------------------------------------

    def __len__(self) -> int:
        return math.ceil(len(self.dataset) / self.batch_size)

    @property
    def failures(self) -> list[Failure]:
        """Distinct failed samples of the current/last pass, in the order found."""
        return list(self._failures.values())

    @property
    def replacements(self) -> list[tuple[int, int]]:
        """``(slot_position, position_used)`` for every replaced slot of the pass."""
        return list(self._replacements)

    def stats(self) -> FallbackStats:
        c = self._counts
        return FallbackStats(
            num_samples=len(self.dataset), num_batches=c["batches"], num_clips=c["clips"],
            num_failures=len(self._failures), num_replaced=len(self._replacements),
            num_timeouts=sum(f.reason.startswith(REASON_TIMEOUT) for f in self._failures.values()),
            num_worker_deaths=sum(f.reason.startswith(REASON_WORKER_DIED) for f in self._failures.values()),
            num_restarts=c["restarts"],
            frames_decoded=c["frames_decoded"], frames_used=c["frames_used"])

    def close(self) -> None:
        """Stop the workers (persistent ones included)."""
        self._drop_loader()

    def __iter__(self) -> Iterator[FallbackBatch]:
        self._failures = {}
        self._replacements = []
        self._counts = dict.fromkeys(self._counts, 0)
        next_batch = 0
        try:
            while next_batch < len(self):
                self._batches.start = next_batch
                watchdog = _Watchdog(self, iter(self._get_loader()))
                try:
                    while True:
                        batch = watchdog.next()
                        next_batch += 1
                        yield self._account(batch)
                except StopIteration:
                    watchdog.stop()
                except _WorkerLost as lost:
                    watchdog.stop()
                    self._recover(watchdog, lost.__cause__)
                except GeneratorExit:
                    watchdog.stop()  # the consumer stopped early; persistent workers can resume
                    raise
                except BaseException:
                    watchdog.stop()
                    self._drop_loader(watchdog.iterator)
                    raise
        finally:
            if self._failures:
                s = self.stats()
                warnings.warn(
                    f"fallback loader: {s.num_failures} of {s.num_samples} samples failed to decode and "
                    f"were replaced ({s.num_timeouts} timeouts, {s.num_worker_deaths} worker deaths, "
                    f"{s.num_restarts} worker restarts); see loader.failures", stacklevel=2)

    # -- internals --------------------------------------------------------------------

    def _get_loader(self) -> DataLoader:
        if self._loader is None:
            if self.dataset._board is not None:
                self.dataset._board.reset()
            workers = self.num_workers > 0
            self._loader = DataLoader(
                self.dataset, batch_sampler=self._batches, num_workers=self.num_workers,
                collate_fn=collate_clips, pin_memory=self.pin_memory,
                persistent_workers=self.persistent_workers,
                prefetch_factor=self.prefetch_factor if workers else None,
                multiprocessing_context=self._ctx, worker_init_fn=_worker_init if workers else None)
        return self._loader

    def _drop_loader(self, iterator=None) -> None:
        """Forget the DataLoader and stop its workers (``iterator``'s too)."""
        loader, self._loader = self._loader, None
        for it in {id(i): i for i in (iterator, getattr(loader, "_iterator", None)) if i is not None}.values():
            # torch's own cleanup of a multi-process iterator (also run by its __del__).
            shutdown = getattr(it, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()

    def _account(self, batch: ClipBatch) -> FallbackBatch:
        for failure in batch.failures:
            if failure.position not in self._failures:
                self._failures[failure.position] = failure
        for slot, used in zip(batch.slot_positions.tolist(), batch.positions.tolist()):
            if slot != used:
                self._replacements.append((slot, used))
        c = self._counts
        c["batches"] += 1
        c["clips"] += len(batch.labels)
        c["frames_decoded"] += int(batch.frames_decoded.sum())
        c["frames_used"] += sum(self._clip_lens[p] for p in batch.positions.tolist())
        self._check_threshold()
        return FallbackBatch(batch.videos, batch.labels, batch.positions)

    def _check_threshold(self) -> None:
        n, total = len(self._failures), len(self.dataset)
        if self.max_failures is not None and n > self.max_failures:
            raise TooManyFailuresError(self.failures, total, f"max_failures={self.max_failures}")
        if self.max_failure_fraction is not None and n > self.max_failure_fraction * total:
            raise TooManyFailuresError(self.failures, total,
                                       f"max_failure_fraction={self.max_failure_fraction:g} "
                                       f"({self.max_failure_fraction * total:g} samples)")

    def _record_hard_failure(self, slot: int, reason: str) -> None:
        sample = self.dataset.samples[slot]
        self.dataset.known_bad[slot] = reason
        if sample.position not in self._failures:
            self._failures[sample.position] = Failure(sample.path, reason, sample.position)

    def _recover(self, watchdog: "_Watchdog", error: BaseException | None) -> None:
        """A worker died: charge the sample it was decoding, then restart the workers."""
        culprits = watchdog.culprits(error)  # before shutdown, which ends the healthy workers too
        self._drop_loader(watchdog.iterator)
        if not culprits:
            # Died between samples (collate, IPC, an outside kill): nothing to charge.
            self._counts["unexplained"] += 1
            if self._counts["unexplained"] > _MAX_UNEXPLAINED_RESTARTS:
                raise RuntimeError(f"fallback loader workers died {self._counts['unexplained']} times "
                                   f"while not decoding; giving up: {error}") from error
            logger.warning("a fallback loader worker died between samples (%s); restarting", error)
        for slot, reason in culprits:
            self._record_hard_failure(slot, reason)
            logger.warning("%s: %s; restarting the loader workers",
                           self.dataset.samples[slot].path, reason)
        self._counts["restarts"] += 1
        self._check_threshold()


class _Watchdog:
    """Runs one DataLoader iterator: cuts hung decodes, names what a dead worker held.

    A daemon thread polls the progress board and SIGKILLs a worker whose
    current decode is older than the loader's ``timeout_s`` (with a margin, so
    the decoder's own cooperative deadline usually fires first and no worker
    is lost). The death is then seen by the DataLoader like any other.

    torch raises a worker's death from its SIGCHLD handler, which would land in
    the consumer's code between batches; the worker pids are registered with
    that handler only while this class waits inside ``next``.
    """

    def __init__(self, owner: FallbackLoader, iterator) -> None:
        self.owner = owner
        self.iterator = iterator
        self.board = owner.dataset._board
        self._timed_out: dict[int, tuple[int, float]] = {}  # worker id -> (slot, seconds)
        self._stop = threading.Event()
        self._thread = None
        self._unregister()
        if self.board is not None and owner.timeout_s is not None:
            self._thread = threading.Thread(target=self._watch, name="fallback-watchdog", daemon=True)
            self._thread.start()

    def next(self) -> ClipBatch:
        self._register()
        try:
            return next(self.iterator)
        except RuntimeError as err:
            if self.board is not None and _is_worker_loss(err):
                raise _WorkerLost() from err
            raise
        except (ConnectionError, EOFError, FileNotFoundError) as err:
            # A worker that dies right after queueing a batch takes the batch's
            # shared-memory handle with it; that is a worker loss too.
            if self.board is not None and self._wait_for_a_death(_DEATH_GRACE_S):
                raise _WorkerLost() from err
            raise
        finally:
            self._unregister()

    def _wait_for_a_death(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while True:
            if any(p.exitcode is not None for p in getattr(self.iterator, "_workers", [])):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def culprits(self, error: BaseException | None) -> list[tuple[int, str]]:
        """``(slot, reason)`` for each sample whose worker died or was cut."""
        dead = self._dead_workers(error)
        found = []
        for worker_id in range(self.board.num_workers):
            pid, slot, started, state = self.board.read(worker_id)
            if worker_id in self._timed_out:
                slot, seconds = self._timed_out[worker_id]
                found.append((slot, f"{REASON_TIMEOUT}: decode still running after {seconds:.1f} s; "
                                    f"worker killed"))
            elif pid in dead and state == _BUSY and slot >= 0:
                found.append((slot, f"{REASON_WORKER_DIED} ({dead[pid]}) while decoding this sample"))
        return found

    # -- internals --------------------------------------------------------------------

    def _dead_workers(self, error: BaseException | None) -> dict[int, str]:
        dead: dict[int, str] = {}
        for process in getattr(self.iterator, "_workers", []):
            process.join(timeout=0)
            code = process.exitcode
            if code is not None:
                dead[process.pid] = (f"signal {signal.Signals(-code).name}" if code < 0
                                     else f"exit code {code}")
        for match in re.finditer(r"\d+", _pids_text(error)):
            dead.setdefault(int(match.group()), "exited unexpectedly")
        return dead

    def _watch(self) -> None:
        limit = self.owner.timeout_s * 1.25 + 0.5
        poll = min(0.5, max(0.05, self.owner.timeout_s / 10))
        while not self._stop.wait(poll):
            now = time.monotonic()
            for worker_id in range(self.board.num_workers):
                pid, slot, started, state = self.board.read(worker_id)
                if state != _BUSY or pid <= 0 or now - started <= limit or not _alive(pid):
                    continue  # a dead worker is the DataLoader's to report, not a timeout
                # Re-read: the worker may have moved on between the two reads.
                if self.board.read(worker_id)[1:] != (slot, started, state):
                    continue
                self._timed_out[worker_id] = (slot, now - started)
                self.board.mark_timed_out(worker_id)
                logger.warning("worker %d (pid %d) stuck on slot %d for %.1f s: killing it",
                               worker_id, pid, slot, now - started)
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass  # died on its own meanwhile

    def _register(self) -> None:
        # Only while waiting here may torch's SIGCHLD handler raise (see class docstring).
        workers = getattr(self.iterator, "_workers", None)
        if workers and not getattr(self.iterator, "_worker_pids_set", True):
            from torch.utils.data._utils import signal_handling
            signal_handling._set_worker_pids(id(self.iterator), tuple(w.pid for w in workers))
            self.iterator._worker_pids_set = True

    def _unregister(self) -> None:
        if getattr(self.iterator, "_worker_pids_set", False):
            from torch.utils.data._utils import signal_handling
            signal_handling._remove_worker_pids(id(self.iterator))
            self.iterator._worker_pids_set = False


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (not gone, not a zombie), without reaping it."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rsplit(b")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    except (OSError, IndexError):
        return True  # no procfs: assume alive, the timeout still applies
    return state not in (b"Z", b"X")


def _is_worker_loss(err: BaseException) -> bool:
    text = str(err)
    return "DataLoader worker" in text and ("exited unexpectedly" in text or "killed by signal" in text)


def _pids_text(error: BaseException | None) -> str:
    if error is None:
        return ""
    match = re.search(r"pid\(?s?\)? ([\d, ]+)", str(error))
    return match.group(1) if match else ""


def make_fallback_loader(
    samples: Sequence[Sample],
    output: OutputSpec,
    *,
    batch_size: int,
    num_workers: int = 2,
    multiprocessing_context: MultiprocessingContext = "forkserver",
    pin_memory: bool | None = None,
    persistent_workers: bool = True,
    prefetch_factor: int = 2,
    timeout_s: float | None = 60.0,
    max_failures: int | None = None,
    max_failure_fraction: float | None = None,
    threads: int = 1,
    skip_nonref: bool = True,
    hints: dict[str, StreamHint] | None = None,
    max_replacement_tries: int = 16,
    fault_injection: bool = False,
) -> FallbackLoader:
    """Build the PyAV loader for a plan.

    Args:
        samples: the plan (one rank, one epoch), in order.
        output: what every clip is turned into.
        batch_size: clips per batch; every batch but a short last one is full.
        num_workers: decoding processes. 0 decodes in the calling process,
            where a hang or a crash cannot be contained (debugging only).
        multiprocessing_context: ``"forkserver"`` (default) or ``"spawn"``.
            ``"fork"`` is refused: a child forked from this (threaded)
            process while an FFmpeg, OpenBLAS or torch thread holds a lock
            deadlocks. Forkserver workers start faster (the server has
            already imported the main module's imports); a dead spawn worker
            is noticed at once (SIGCHLD) rather than at torch's 5-second
            status check, as forkserver workers are not this process's
            children.
        pin_memory: page-lock batches for fast GPU copies; default: when CUDA
            is available.
        persistent_workers: keep workers between passes.
        prefetch_factor: batches each worker prepares ahead.
        timeout_s: per-sample decode limit in seconds; a decode past it fails
            as ``"timeout ..."`` (checked in the decoder, and a worker stuck
            inside FFmpeg is killed at ``1.25 * timeout_s + 0.5``). ``None``:
            no limit.
        max_failures: raise :class:`TooManyFailuresError` once more samples
            than this have failed in one pass.
        max_failure_fraction: same, as a fraction of ``len(samples)``. When
            both are given both apply; when neither is, the limit is
            :data:`DEFAULT_MAX_FAILURE_FRACTION` (5 %) of the plan. Pass
            ``max_failure_fraction=1.0`` to never raise.
        threads: FFmpeg threads per decode (1: see DESIGN.md measurements).
        skip_nonref: skip non-reference frames the clips do not use.
        hints: optional ``path -> StreamHint`` from the pre-screen.
        max_replacement_tries: failed candidates tolerated per slot.
        fault_injection: test-only ``fault:*`` paths (see module docstring).

    Returns:
        A :class:`FallbackLoader`.

    Raises:
        ValueError: an argument is out of range or ``multiprocessing_context``
            is not ``"forkserver"``/``"spawn"``.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0, got {num_workers}")
    if multiprocessing_context not in ("forkserver", "spawn"):
        raise ValueError(f"multiprocessing_context must be 'forkserver' or 'spawn', got "
                         f"{multiprocessing_context!r}: 'fork' can deadlock on FFmpeg/torch threads")
    if prefetch_factor < 1:
        raise ValueError(f"prefetch_factor must be >= 1, got {prefetch_factor}")
    if max_failures is not None and max_failures < 0:
        raise ValueError(f"max_failures must be >= 0 or None, got {max_failures}")
    if max_failure_fraction is not None and not 0 <= max_failure_fraction <= 1:
        raise ValueError(f"max_failure_fraction must be in [0, 1] or None, got {max_failure_fraction}")
    if max_failures is None and max_failure_fraction is None:
        max_failure_fraction = DEFAULT_MAX_FAILURE_FRACTION
    if pin_memory is None:
        pin_memory = torch.cuda.is_available()
    dataset = ClipDataset(samples, output,
                          decode=DecodeOptions(threads=threads, skip_nonref=skip_nonref,
                                               timeout_s=timeout_s, hints=hints),
                          max_replacement_tries=max_replacement_tries, fault_injection=fault_injection)
    return FallbackLoader(dataset, batch_size=batch_size, num_workers=num_workers,
                          multiprocessing_context=multiprocessing_context, pin_memory=pin_memory,
                          persistent_workers=persistent_workers, prefetch_factor=prefetch_factor,
                          timeout_s=timeout_s, max_failures=max_failures,
                          max_failure_fraction=max_failure_fraction)
