"""A DataLoader over a plan that survives broken files, hangs and dead workers.

:class:`FallbackLoader` runs a :class:`~fallback.dataset.ClipDataset` in
DataLoader workers started with ``forkserver`` or ``spawn`` (never ``fork``, so
a decoder thread pool can never be copied mid-lock into a child), with pinned
memory, persistent workers and prefetching. The workers hold no plan: the
batch sampler sends each batch's samples (with their replacement candidates
and seek hints, :class:`~fallback.dataset.SlotTask`), so :meth:`FallbackLoader.set_plan`
gives the same running workers a new epoch's plan. A worker that dies (segfault, OOM
kill) or a decode that hangs past ``timeout_s`` costs the sample it was
decoding, not the epoch: the :mod:`fallback.watchdog` names it, the loader
records it, restarts its workers and resumes at the first batch it has not
yet yielded. Every failure goes to a :class:`~daliload.failures.FailureBudget`:
the loader's own when it is used alone (it then raises past the limit and
warns once per pass), or the one of the :class:`~daliload.KineticsDALILoader`
epoch it serves (which then does both, once, for the whole epoch).

Worked example, batch size 4, plan positions 0..7, the file of position 2 is
truncated and position 5's decode hangs::

    batch 0: positions [0, 1, 3, 3]    slot 2 replaced by the next good sample, 3
    batch 1: positions [4, 6, 6, 7]    slot 5 cut after timeout_s, replaced by 6
    loader.failures == [Failure(path2, "decode failed: ...", 2),
                        Failure(path5, "timeout: ...", 5)]

Each batch keeps its size and order; a consumer that knows the plan sees which
slots were replaced (their position differs from the slot's).
"""

from __future__ import annotations

import itertools
import logging
import os
from dataclasses import dataclass
from typing import Iterator, Literal, NamedTuple, Sequence

import torch
from torch.utils.data import DataLoader

from daliload.failures import (DEFAULT_MAX_FAILURE_FRACTION, REASON_TIMEOUT, REASON_WORKER_DIED, FailedVideo,
                               Failure, FailureBudget)
from daliload.plan import OutputSpec, Sample
from daliload.workerpool import mp_context
from daliload.workerpool import main_script_hidden, refuse_bootstrapping_main
from fallback import _torch_internals as internals
from fallback.dataset import ClipBatch, ClipDataset, DecodeOptions, SlotTask, collate_clips
from fallback.decode import StreamHint
from fallback.progress import ProgressBoard, worker_init
from fallback.watchdog import Watchdog, WorkerLost

logger = logging.getLogger(__name__)

MultiprocessingContext = Literal["forkserver", "spawn"]

#: Worker deaths between samples tolerated in one pass before giving up.
_MAX_UNEXPLAINED_RESTARTS = 2


@dataclass(frozen=True)
class WorkerOptions:
    """How :class:`FallbackLoader` batches and runs its workers.

    Attributes:
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
        pin_memory: page-lock batches for fast GPU copies; ``None`` (default):
            when CUDA is available.
        persistent_workers: keep workers between passes. Default True.
        prefetch_factor: batches each worker prepares ahead. Default 2.
    """

    batch_size: int
    num_workers: int = 2
    multiprocessing_context: MultiprocessingContext = "forkserver"
    pin_memory: bool | None = None
    persistent_workers: bool = True
    prefetch_factor: int = 2

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {self.num_workers}")
        if self.multiprocessing_context not in ("forkserver", "spawn"):
            raise ValueError(f"multiprocessing_context must be 'forkserver' or 'spawn', got "
                             f"{self.multiprocessing_context!r}: 'fork' can deadlock on FFmpeg/torch threads")
        if self.prefetch_factor < 1:
            raise ValueError(f"prefetch_factor must be >= 1, got {self.prefetch_factor}")


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
        num_failures: distinct videos that failed (in the failure budget the
            loader reports to).
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


class _PlanBatches:
    """Batch sampler: the current plan's batches from ``start`` on, as lists of :class:`SlotTask`.

    Iterated in the main process only, when the DataLoader sends work to a
    worker: changing the plan or ``start`` between passes redirects persistent
    workers too, and a task built after a crash already skips what crashed.
    """

    def __init__(self) -> None:
        self.dataset: ClipDataset | None = None
        self.bounds: list[int] = [0]  # batch b is plan slots bounds[b] .. bounds[b + 1] - 1
        self.known_bad: dict[Sample, str] = {}
        self.start = 0

    def __len__(self) -> int:
        return len(self.bounds) - 1 - self.start

    def __iter__(self) -> Iterator[list[SlotTask]]:
        dataset, bounds = self.dataset, self.bounds
        for b in range(self.start, len(bounds) - 1):
            yield dataset.tasks(bounds[b], bounds[b + 1], self.known_bad)


class FallbackLoader:
    """Iterate the plan in batches: ``for videos, labels, positions in loader``.

    Build it with :func:`make_fallback_loader`, or from its parts. Each pass
    yields ``ceil(len(samples) / batch_size)`` :class:`FallbackBatch` es in plan
    order; every batch but a short last one has ``batch_size`` rows whatever
    fails. After (or during) a pass, :attr:`failures` lists what failed and
    :meth:`stats` counts it.

    The workers hold no plan: each batch's samples travel to them with the
    batch. :meth:`set_plan` gives the next passes another plan (a new epoch's)
    on the same, still running workers. They stop at :meth:`close`, when the
    loader is garbage-collected, and when a pass is abandoned before its end
    (its batches already sent would otherwise be decoded for nothing when the
    next pass starts).

    Args:
        dataset: the plan's samples and how to decode them.
        options: batching and workers.
        budget: the failure budget to report to; it belongs to the caller,
            who resets it per epoch and warns. ``None`` (default): the loader
            keeps its own, limited by ``max_failures`` and
            ``max_failure_fraction`` (see :class:`~daliload.failures.FailureBudget`),
            resets it every pass and warns once per pass that had failures.
        max_failures, max_failure_fraction: the limits of the loader's own
            budget (ignored when ``budget`` is given). Default: 5 % of the
            plan, at least one sample.
    """

    def __init__(self, dataset: ClipDataset, options: WorkerOptions, *,
                 budget: FailureBudget | None = None, max_failures: int | None = None,
                 max_failure_fraction: float | None = DEFAULT_MAX_FAILURE_FRACTION) -> None:
        refuse_bootstrapping_main("A daliload fallback loader")
        self.options = options
        self.batch_size = options.batch_size
        self.num_workers = options.num_workers
        self.pin_memory = torch.cuda.is_available() if options.pin_memory is None else options.pin_memory
        self.timeout_s = dataset.decode.timeout_s
        self._owns_budget = budget is None
        self.budget = budget if budget is not None else FailureBudget(
            dataset.num_videos, max_fraction=max_failure_fraction, max_count=max_failures)
        workers = options.num_workers > 0
        # Forkserver workers fork from one server per process, preloaded with torch and PyAV
        # (daliload.workerpool.mp_context): a restart after a crash takes ~0.1 s.
        self._ctx = mp_context(options.multiprocessing_context) if workers else None
        self._decoder = dataset.slot_decoder()  # what the workers hold, for the loader's life
        if workers:
            self._decoder.board = ProgressBoard(self._ctx, options.num_workers)
            self._decoder.owner_pid = os.getpid()
        self._batches = _PlanBatches()
        self._loader: DataLoader | None = None
        self._replaced = 0
        self._counts = dict.fromkeys(
            ("batches", "clips", "restarts", "unexplained", "frames_decoded", "frames_used"), 0)
        self._use(dataset)

    # -- public -----------------------------------------------------------------------

    @property
    def dataset(self) -> ClipDataset:
        """The plan of the next (or current) pass and how it is decoded."""
        return self._batches.dataset

    def set_plan(self, samples: Sequence[Sample], *, batch_sizes: Sequence[int] | None = None) -> None:
        """Use another plan from the next pass on, decoded as before, on the same workers.

        Args:
            samples: the plan, in order (not empty).
            batch_sizes: clips of each batch, summing to ``len(samples)``;
                default: ``batch_size`` each, the last one short.

        Raises:
            ValueError: empty ``samples``, or sizes that do not add up.
        """
        self._use(self.dataset.with_samples(samples), batch_sizes)

    def _use(self, dataset: ClipDataset, batch_sizes: Sequence[int] | None = None) -> None:
        samples = dataset.samples
        if batch_sizes is None:
            batch_sizes = [min(self.batch_size, len(samples) - i) for i in range(0, len(samples), self.batch_size)]
        if any(size < 1 for size in batch_sizes) or sum(batch_sizes) != len(samples):
            raise ValueError(f"batch_sizes must be >= 1 each and add up to the {len(samples)} samples, "
                             f"got {list(batch_sizes)[:10]}")
        self._batches.dataset = dataset
        self._batches.bounds = [0, *itertools.accumulate(batch_sizes)]

    def __len__(self) -> int:
        return len(self._batches.bounds) - 1

    @property
    def failures(self) -> list[FailedVideo]:
        """The failed videos of the current/last pass, each file once, in the order found."""
        return list(self.budget.failures)

    @property
    def replacements(self) -> list[tuple[int, int]]:
        """``(slot_position, position_used)`` for every replaced slot of the pass."""
        return list(self.budget.replacements)

    def stats(self) -> FallbackStats:
        c = self._counts
        return FallbackStats(
            num_samples=len(self.dataset), num_batches=c["batches"], num_clips=c["clips"],
            num_failures=len(self.budget.failures), num_replaced=self._replaced,
            num_timeouts=self.budget.count(REASON_TIMEOUT),
            num_worker_deaths=self.budget.count(REASON_WORKER_DIED),
            num_restarts=c["restarts"], frames_decoded=c["frames_decoded"], frames_used=c["frames_used"])

    @property
    def worker_pids(self) -> list[int]:
        """Pids of the running worker processes (empty when none runs)."""
        iterator = internals.persistent_iterator(self._loader)
        return [w.pid for w in internals.workers(iterator) if w.exitcode is None] if iterator is not None else []

    def close(self) -> None:
        """Stop the workers (persistent ones included)."""
        self._drop_loader()

    def __iter__(self) -> Iterator[FallbackBatch]:
        """A pass over the plan, whose first batches go to the workers now rather than at the first ``next``."""
        batches = self._pass()
        next(batches)  # runs up to the pass's first wait: the workers have its first batches
        return batches

    # -- internals --------------------------------------------------------------------

    def _pass(self) -> Iterator[FallbackBatch | None]:
        """Yields ``None`` once the workers have the first batches (for :meth:`__iter__`), then the batches."""
        if self._owns_budget:
            self.budget.reset(self.dataset.num_videos)
        self._replaced = 0
        self._counts = dict.fromkeys(self._counts, 0)
        next_batch = 0
        started = False
        try:
            while next_batch < len(self):
                self._batches.start = next_batch
                watchdog = Watchdog(self._start_workers(), self._decoder.board, self.timeout_s)
                try:
                    if not started:
                        started = True
                        yield None  # inside the try: closing the pass now stops what was sent
                    while True:
                        batch = watchdog.next()
                        next_batch += 1
                        yield self._account(batch)
                except StopIteration:
                    watchdog.stop()
                except WorkerLost as lost:
                    watchdog.stop()
                    self._recover(watchdog, lost.__cause__)
                except GeneratorExit:
                    watchdog.stop()
                    if next_batch < len(self):
                        # Abandoned: batches already sent would be decoded, then dropped, before the
                        # next pass's first. Stopping the workers costs a restart (~0.1 s) instead.
                        self._drop_loader(watchdog.iterator)
                    raise
                except BaseException:
                    watchdog.stop()
                    self._drop_loader(watchdog.iterator)
                    raise
        finally:
            if self._owns_budget:
                self.budget.warn(detail=f"{self._counts['restarts']} worker restarts")

    def _get_loader(self) -> DataLoader:
        if self._loader is None:
            if self._decoder.board is not None:
                self._decoder.board.reset()
            workers = self.num_workers > 0
            self._loader = DataLoader(
                self._decoder, batch_sampler=self._batches, num_workers=self.num_workers,
                collate_fn=collate_clips, pin_memory=self.pin_memory,
                persistent_workers=self.options.persistent_workers and workers,
                prefetch_factor=self.options.prefetch_factor if workers else None,
                multiprocessing_context=self._ctx, worker_init_fn=worker_init if workers else None)
        return self._loader

    def _start_workers(self) -> Iterator[ClipBatch]:
        """An iterator over the DataLoader, whose workers start (if not running) without the main script.

        Everything a worker unpickles (the slot decoder, collate, ``worker_init``)
        is importable by name, so the workers need not re-run the user's script
        (see :func:`~daliload.workerpool.main_script_hidden`): a training
        script without an ``if __name__ == "__main__":`` guard works, and
        workers start without importing what the script imports.
        """
        with main_script_hidden():
            return iter(self._get_loader())

    def _drop_loader(self, iterator=None) -> None:
        """Forget the DataLoader and stop its workers (``iterator``'s too)."""
        loader, self._loader = self._loader, None
        for it in {id(i): i for i in (iterator, internals.persistent_iterator(loader)) if i is not None}.values():
            internals.shutdown(it)

    def _account(self, batch: ClipBatch) -> FallbackBatch:
        for slot, position in zip(batch.slot_positions, batch.positions):
            if slot != position:
                self.budget.record_replacement(slot, position)
                self._replaced += 1
        c = self._counts
        c["batches"] += 1
        c["clips"] += len(batch.labels)
        c["frames_decoded"] += sum(batch.frames_decoded)
        c["frames_used"] += sum(batch.frames_used)
        for failure in batch.failures:
            self.budget.record(failure)
        return FallbackBatch(batch.videos, torch.tensor(batch.labels, dtype=torch.int64),
                             torch.tensor(batch.positions, dtype=torch.int64))

    def _recover(self, watchdog: Watchdog, error: BaseException | None) -> None:
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
        self._counts["restarts"] += 1
        for slot, reason in culprits:
            sample = self.dataset.samples[slot]
            self._batches.known_bad[sample] = reason
            logger.warning("%s: %s; restarting the loader workers", sample.path, reason)
            self.budget.record(Failure(sample.path, reason, sample.position))


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
    """Build the PyAV loader for a plan, for use on its own (keywords for every option).

    This is the flat convenience entry point; it packs the keywords once into
    :class:`~fallback.dataset.DecodeOptions` and :class:`WorkerOptions`. Code that already holds those
    objects builds ``FallbackLoader(ClipDataset(...), WorkerOptions(...))``.

    Args:
        samples: the plan (one rank, one epoch), in order.
        output: what every clip is turned into.
        batch_size, num_workers, multiprocessing_context, pin_memory,
            persistent_workers, prefetch_factor: see :class:`WorkerOptions`.
        timeout_s: per-sample decode limit in seconds; a decode past it fails
            as ``"timeout ..."`` (checked in the decoder, and a worker stuck
            inside FFmpeg is killed at ``1.25 * timeout_s + 0.5``). ``None``:
            no limit.
        max_failures: raise :class:`~daliload.failures.TooManyFailuresError`
            once more samples than this have failed in one pass.
        max_failure_fraction: same, as a fraction of ``len(samples)`` (at
            least one failure allowed). When both are given both apply; when
            neither is, the limit is 5 % of the plan. Pass
            ``max_failure_fraction=1.0`` to never raise.
        threads, skip_nonref, hints: see :class:`~fallback.dataset.DecodeOptions`.
        max_replacement_tries: failed candidates tolerated per slot.
        fault_injection: test-only ``fault:*`` paths (see :mod:`fallback.dataset`).

    Returns:
        A :class:`FallbackLoader` that owns its failure budget.

    Raises:
        ValueError: an argument is out of range or ``multiprocessing_context``
            is not ``"forkserver"``/``"spawn"``.
    """
    options = WorkerOptions(batch_size=batch_size, num_workers=num_workers,
                            multiprocessing_context=multiprocessing_context, pin_memory=pin_memory,
                            persistent_workers=persistent_workers, prefetch_factor=prefetch_factor)
    if max_failures is None and max_failure_fraction is None:
        max_failure_fraction = DEFAULT_MAX_FAILURE_FRACTION
    dataset = ClipDataset(samples, output,
                          decode=DecodeOptions(threads=threads, skip_nonref=skip_nonref, timeout_s=timeout_s,
                                               hints=hints),
                          max_replacement_tries=max_replacement_tries, fault_injection=fault_injection)
    return FallbackLoader(dataset, options, max_failures=max_failures, max_failure_fraction=max_failure_fraction)
