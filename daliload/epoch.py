"""One pass over an epoch for one rank: routes, the DALI stage, the fallback stage, the merge.

(About 600 lines: the stages of one pass share its counters, its failure
budget and the batch rows each fills; apart, they would pass that state
around. The DALI stage's isolation of failed batches is the largest part.)

:class:`~daliload.KineticsDALILoader` is the public face; this module does the
work of one pass over the batches of its plan::

    batches of the plan (plan order)
      -> Routes: which files DALI decodes (route ``dali`` and DALI enabled,
         minus files that failed in DALI earlier in the run)
      -> DALI stage (_DaliStage): each batch's DALI share, decided when it is
         submitted, up to ``prefetch_batches`` ahead; collected in order with
         a time limit. A batch DALI fails is isolated: its halves go back to
         DALI until the files to blame are found, the good clips stay DALI's,
         the culprits move to the fallback from the next batch on.
      -> fallback stage (_FallbackStage): the samples whose route was the
         fallback when the pass began, in plan order, each batch's share in
         one transfer, from a supervised fallback.FallbackLoader whose
         workers the loader keeps across passes (FallbackWorkers): a new
         epoch sends them its plan, it starts no process
      -> decoded here (_DecodeHere): everything else (culprits, files moved
         off DALI mid-pass, the search once the fallback loader has nothing
         decodable left), in supervised worker processes (fallback.isolated)
      -> merge (_merge): the parts (rows that arrived together) in plan order
         into one ``(videos, labels)`` batch on the loader's device: one copy
         per run of rows, none when one part is the whole batch

Every failure, whichever path met it, goes to the epoch's one
:class:`~daliload.failures.FailureBudget`, which counts it once, raises past
the limit, and warns once when the pass ends. A failed slot is filled by the
replacement rule (:func:`~daliload.failures.replacement_order`); outside
training the replacement keeps the slot's shape but gets label
:data:`PADDING_LABEL`, so evaluation never scores a video twice.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
import warnings
from collections import deque
from dataclasses import dataclass
from typing import Callable, Hashable, Iterator, NamedTuple, Sequence

import torch

from daliload.failures import Failure, FailureBudget, NoReplacementError, replacement_order
from daliload.plan import OutputSpec, Sample
from fallback import ClipDataset, DecodeOptions, FallbackBatch, FallbackLoader, WorkerOptions
from fallback.isolated import IsolatedDecoder

logger = logging.getLogger(__name__)

#: Label given to padding samples when ``label_padding`` is on (validation default),
#: and to failed samples outside training.
PADDING_LABEL = -1
#: DALI batches in a row that fail with no single file to blame before DALI is given up for the run.
DALI_FAILURE_STREAK = 3


class Row(NamedTuple):
    """One decoded clip filling a plan slot: ``replaced`` when another sample filled it."""

    video: torch.Tensor
    label: int
    replaced: bool = False


class Part(NamedTuple):
    """Rows of one batch that arrived together: ``videos[j]`` fills batch row ``rows[j]``.

    The merge copies a part with one tensor copy per run of consecutive rows,
    not one per clip. ``owned``: nothing will reuse ``videos``' memory while
    it is referenced (a fallback transfer, a copy, a DALI output on the CPU),
    so a part that is the whole batch is handed out as it is, without a copy.
    """

    rows: Sequence[int]
    videos: torch.Tensor
    labels: Sequence[int]
    replaced: Sequence[bool]
    owned: bool = False

    @classmethod
    def of_row(cls, k: int, row: Row) -> Part:
        return cls((k,), row.video.unsqueeze(0), (row.label,), (row.replaced,))


class Routes:
    """Which files DALI decodes, for the whole run.

    Starts from the pre-screen's routes. A file that DALI alone fails on (found
    by isolating a failed batch) moves to the fallback from the next batch on;
    after :data:`DALI_FAILURE_STREAK` failed batches in a row with no single
    file to blame (a driver or library problem), DALI is given up for the run.

    Args:
        dali_paths: files of route ``dali`` (empty when DALI is not used).
    """

    def __init__(self, dali_paths: Sequence[str]) -> None:
        self._dali = set(dali_paths)
        self.rerouted: set[str] = set()
        self.dali_disabled: str | None = None  # why DALI was given up, once it was
        self._streak = 0

    @property
    def version(self) -> tuple[int, bool]:
        """Changes whenever a file changes route (the DALI set only shrinks): a fallback share computed
        under another version is stale."""
        return len(self._dali), self.dali_disabled is not None

    def uses_dali(self, sample: Sample) -> bool:
        return self.dali_disabled is None and sample.path in self._dali

    def reroute(self, paths: set[str]) -> None:
        """Send ``paths`` to the fallback from now on."""
        self._dali -= paths
        self.rerouted |= paths

    def note_batch(self, *, blamed: bool, reason: str = "") -> None:
        """Count a failed DALI batch: ``blamed`` when isolation found the files at fault."""
        self._streak = 0 if blamed else self._streak + 1
        if self._streak >= DALI_FAILURE_STREAK and self.dali_disabled is None:
            self.dali_disabled = (f"{self._streak} DALI batches in a row failed with no single file to blame "
                                  f"(last: {reason})")
            warnings.warn(f"{self.dali_disabled}; the rest of this run decodes every file with the PyAV "
                          "fallback (loader.stats().dali_disabled)", RuntimeWarning, stacklevel=2)


@dataclass
class EpochCounters:
    """What one pass did; :class:`~daliload.LoaderStats` reports them with the budget's failures."""

    batches: int = 0
    clips_dali: int = 0
    clips_fallback: int = 0
    clips_redecoded: int = 0
    clips_masked: int = 0
    clips_past_end: int = 0
    dali_wait_s: float = 0.0
    fallback_wait_s: float = 0.0
    isolation_s: float = 0.0


@dataclass(frozen=True)
class PassSetup:
    """What a pass needs from its loader, fixed for the run.

    Attributes:
        output: what every clip is turned into.
        decode: how the fallback decodes (threads, time limit, seek hints).
        workers: the fallback's workers (batches of 1 clip: rows are merged here).
        isolated_workers: processes for decodes outside the fallback loader
            (0: in the training process, unprotected).
        device: where batches are assembled (``cuda:N`` or the CPU).
        label_padding: give padding samples :data:`PADDING_LABEL`.
        mask_failed: give failed (replaced) samples :data:`PADDING_LABEL`
            (evaluation splits).
        dali_timeout_s: how long one clip may take in DALI; a batch may take
            this times its clips per DALI thread, plus one.
        dali_threads: DALI's threads (clips decoded at once).
        num_frames: frames of each video (``path -> count``), for counting
            clips that run past the end.
        faults: test-only ``path -> action`` (see :mod:`fallback.dataset`).
        views: clips per video of a multi-view plan (its views follow one
            another in each batch); the merge then gives ``(B, V, ...)``
            videos and one label per video. 0: single-view batches.
    """

    output: OutputSpec
    decode: DecodeOptions
    workers: WorkerOptions
    isolated_workers: int
    device: torch.device
    label_padding: bool
    mask_failed: bool
    dali_timeout_s: float
    dali_threads: int
    num_frames: dict[str, int]
    faults: dict[str, str] = dataclasses.field(default_factory=dict)
    views: int = 0


class EpochPass:
    """Iterate ``(videos, labels)`` over ``batches``, one per batch, in plan order.

    Args:
        setup: the loader's fixed settings.
        batches: the batches of this pass (an epoch's, or the rest of one).
        plan: every sample of the epoch, in order (replacements are searched there).
        routes: the run's routes (updated when a file fails in DALI).
        budget: the epoch's failure budget.
        counters: where this pass counts what it did.
        fallback: the fallback's workers, kept by the loader across passes.
        dali: a ``DaliClipDecoder`` when any sample may go to DALI, else ``None``.
        key: names this pass's plan and start for :meth:`FallbackWorkers.warm`
            (a pass started ahead under the same key is taken over); ``None``: none.
        on_last: called once the last batch is assembled, before it is yielded,
            with this pass's fallback iteration closed: the loader starts the
            next epoch there (:meth:`FallbackWorkers.warm`), while the caller
            still trains on this epoch's last batch.
    """

    def __init__(self, setup: PassSetup, batches: Sequence[Sequence[Sample]], plan: Sequence[Sample], *,
                 routes: Routes, budget: FailureBudget, counters: EpochCounters, fallback: FallbackWorkers,
                 dali=None, key: Hashable | None = None, on_last: Callable[[], None] | None = None) -> None:
        self.setup = setup
        self.batches = [list(b) for b in batches]
        self.counters = counters
        self._on_last = on_last
        self._here = _DecodeHere(setup, plan, budget, counters)
        self._dali = _DaliStage(dali, self.batches, self._here, routes, setup, counters) if dali else None
        self._fallback = _FallbackStage(fallback, self.batches, routes, budget, counters, key=key)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        try:
            for i, batch in enumerate(self.batches):
                parts, rows = self._dali.batch_parts(i) if self._dali is not None else ([], {})
                parts += self._fallback.parts(i, batch)
                covered = {k for part in parts for k in part.rows}
                here = [s for k, s in enumerate(batch) if k not in covered and s.position not in rows]
                rows.update(self._here.decode(here))
                parts += [Part.of_row(k, rows[s.position]) for k, s in enumerate(batch) if s.position in rows]
                self._count_past_end(batch)
                videos, labels = _merge(batch, parts, self.setup, self.counters)
                if self._dali is not None:
                    self._dali.copied(i, videos)
                if i == len(self.batches) - 1 and self._on_last is not None:
                    self._fallback.close()  # every transfer is in: the workers are free for what comes next
                    self._on_last()
                yield videos, labels
        finally:
            if self._dali is not None:
                self._dali.drain()
            self._fallback.close()

    def _count_past_end(self, batch: Sequence[Sample]) -> None:
        frames = self.setup.num_frames
        self.counters.clips_past_end += sum(
            s.start_frame + (s.clip_len - 1) * s.frame_stride >= frames.get(s.path, math.inf) for s in batch)


class _DecodeHere:
    """Decode samples outside the fallback loader, each or its replacement (the replacement rule)."""

    def __init__(self, setup: PassSetup, plan: Sequence[Sample], budget: FailureBudget,
                 counters: EpochCounters) -> None:
        self.plan = list(plan)
        self.index = {s.position: i for i, s in enumerate(self.plan)}
        self.budget = budget
        self.counters = counters
        self.decoder = IsolatedDecoder(setup.output, setup.decode, workers=setup.isolated_workers,
                                       faults=setup.faults)

    def decode(self, samples: Sequence[Sample]) -> dict[int, Row]:
        """Rows for ``samples`` (by plan position); failures go to the budget (which may raise)."""
        rows = {}
        for sample, result in self.decoder.decode(samples):
            if isinstance(result, Failure):
                self.budget.record(result)
                rows[sample.position] = self.replace(sample)
            else:
                self.counters.clips_fallback += 1
                rows[sample.position] = Row(result, sample.label)
        return rows

    def replace(self, sample: Sample) -> Row:
        """The next sample of the plan after ``sample`` that decodes."""
        for i in replacement_order(len(self.plan), self.index.get(sample.position, 0)):
            candidate = self.plan[i]
            if candidate.position == sample.position:
                continue
            [(_, result)] = self.decoder.decode([candidate])
            if isinstance(result, Failure):
                self.budget.record(result)
                continue
            self.budget.record_replacement(sample.position, candidate.position)
            self.counters.clips_fallback += 1
            return Row(result, candidate.label, replaced=True)
        raise RuntimeError(f"no sample of this rank's plan decodes; last failure: {self.budget.failures[-1]}")


class _DaliStage:
    """DALI's share of each batch: submitted ahead, collected in order, failed batches isolated."""

    def __init__(self, decoder, batches: list[list[Sample]], here: _DecodeHere, routes: Routes,
                 setup: PassSetup, counters: EpochCounters) -> None:
        self.decoder = decoder
        self.batches = batches
        self.here = here
        self.routes = routes
        self.setup = setup
        self.counters = counters
        self.parts: dict[int, list[Sample]] = {}  # DALI's share of each submitted batch
        self.part_rows: dict[int, list[int]] = {}  # and its rows in the batch
        self.submitted = 0
        self.in_flight: deque[int] = deque()  # batches submitted to DALI, oldest first
        self.early: dict[int, object] = {}  # results collected ahead while isolating (copies, or errors)
        self._outputs: dict[int, object] = {}  # batch -> DALI's output, read by that batch's merge
        self.held = HeldOutputs()

    def copied(self, i: int, videos: torch.Tensor) -> None:
        """Batch ``i`` was merged into ``videos``: keep DALI's output alive until those copies ran."""
        outputs = self._outputs.pop(i, None)
        if outputs is not None and videos.is_cuda:
            self.held.hold(outputs, torch.cuda.current_stream(videos.device))

    def batch_parts(self, i: int) -> tuple[list[Part], dict[int, Row]]:
        """Batch ``i``'s DALI share: as one part, or as rows by plan position after a failed batch."""
        self._submit_ahead(i)
        part = self.parts.get(i, [])
        if not part:
            return [], {}
        from daliload.pipeline import DaliBatchError

        copied = i in self.early  # collected ahead during an isolation: a copy, not DALI's buffer
        outcome = self.early.pop(i) if copied else self._collect(i)
        if isinstance(outcome, DaliBatchError):
            return [], self._isolate(part, outcome)
        if outcome.samples != tuple(part):
            raise RuntimeError("internal error: DALI returned another batch than the one "
                               f"expected ({len(outcome.samples)} vs {len(part)} samples)")
        self.counters.clips_dali += len(part)
        if not copied:
            self._outputs[i] = outcome
        # The labels come from the plan: reading DALI's would sync the GPU.
        # A CPU output lives as long as it is referenced (DALI's dynamic executor): a batch that is all
        # DALI's is handed out as it is. A GPU one is copied: DALI may reuse its memory before the
        # training stream has read it (HeldOutputs).
        owned = copied or not outcome.videos.is_cuda
        return [Part(self.part_rows[i], outcome.videos, [s.label for s in part], [False] * len(part), owned)], {}

    def _submit_ahead(self, i: int) -> None:
        d = self.decoder
        while self.submitted < len(self.batches) and (self.submitted <= i or d.pending < d.prefetch_queue_depth):
            # Decided now, not when the pass began: a file moved off DALI leaves from the next batch on.
            batch = self.batches[self.submitted]
            rows = [k for k, s in enumerate(batch) if self.routes.uses_dali(s)]
            part = [batch[k] for k in rows]
            self.parts[self.submitted], self.part_rows[self.submitted] = part, rows
            if part:
                d.submit(part)
                self.in_flight.append(self.submitted)
            self.submitted += 1

    def _timeout(self, n: int) -> float:
        return self.setup.dali_timeout_s * (1 + math.ceil(n / self.setup.dali_threads))

    def _collect(self, i: int):
        """The result (or DaliBatchError) of the oldest batch in flight, which is batch ``i``."""
        from daliload.pipeline import DaliBatchError

        assert self.in_flight[0] == i, "DALI batches are collected in submission order"
        self.in_flight.popleft()
        t0 = time.perf_counter()
        try:
            return self.decoder.result(self._timeout(len(self.parts[i])))
        except DaliBatchError as err:
            return err
        finally:
            self.counters.dali_wait_s += time.perf_counter() - t0

    def _isolate(self, part: list[Sample], err) -> dict[int, Row]:
        """Find the files DALI fails on by bisection; the rest stays DALI's, the culprits go to the fallback."""
        t0 = time.perf_counter()
        logger.warning("DALI batch of %d clip(s) failed (%s); isolating the file(s) at fault", len(part), err.reason)
        self._collect_early()  # bisection needs DALI's queue to itself
        named = {err.culprit.path} if err.culprit is not None else set()
        rows, culprits = self._bisect([s for s in part if s.path not in named])
        culprits += [s for s in part if s.path in named]
        blamed = len(culprits) < len(part) or len(part) == 1
        if blamed:
            self.routes.reroute({s.path for s in culprits})
        self.routes.note_batch(blamed=blamed, reason=err.reason)
        self.counters.clips_dali += len(rows)
        self.counters.isolation_s += time.perf_counter() - t0
        redecoded = self.here.decode(culprits)
        self.counters.clips_redecoded += len(culprits)
        return {**rows, **redecoded}

    def _bisect(self, samples: list[Sample]) -> tuple[dict[int, Row], list[Sample]]:
        """Rows DALI decodes among ``samples`` (copied), and the samples it fails on alone."""
        from daliload.pipeline import DaliBatchError

        if not samples:
            return {}, []
        try:
            decoded = self._copied(self.decoder.decode_batch(samples, self._timeout(len(samples))))
        except DaliBatchError:
            if len(samples) == 1:
                return {}, list(samples)
            half = len(samples) // 2
            (rows_a, bad_a), (rows_b, bad_b) = self._bisect(samples[:half]), self._bisect(samples[half:])
            return {**rows_a, **rows_b}, bad_a + bad_b
        return {s.position: Row(decoded.videos[k], s.label) for k, s in enumerate(samples)}, []

    def _collect_early(self) -> None:
        """Collect every batch still in DALI's queue, as copies (DALI may reuse its buffers)."""
        from daliload.pipeline import DaliBatchError

        while self.in_flight:
            j = self.in_flight[0]
            outcome = self._collect(j)
            self.early[j] = outcome if isinstance(outcome, DaliBatchError) else self._copied(outcome)

    @staticmethod
    def _copied(decoded):
        videos = decoded.videos.clone()
        if videos.is_cuda:
            torch.cuda.current_stream(videos.device).synchronize()
        return dataclasses.replace(decoded, videos=videos)

    def drain(self) -> None:
        """Drop what was submitted ahead for an abandoned pass, without waiting for it; release the
        outputs held (their copies were queued before the batch was handed out)."""
        self.held.release_all()
        dropped = self.decoder.discard_pending()
        if dropped:
            logger.debug("dropped %d DALI batch(es) submitted ahead of an abandoned pass", dropped)


class HeldOutputs:
    """DALI outputs kept alive until the GPU copies that read them have run: no host-side wait.

    A batch's DALI rows are views into DALI's output (zero-copy, DLPack). The
    merge copies them into a loader-owned tensor on torch's current stream,
    asynchronously; DALI must not free or reuse that memory before the copies
    run. Holding the output (and its views) keeps DALI's reference-counted
    buffer alive, and an event recorded on the stream after the copies says
    when it may go. Outputs are let go once their event has completed,
    checked with ``query()`` at each new batch, so the CPU never waits for the
    GPU here and decoding, copies and the training step overlap. Only the end
    of a pass waits (``release_all``) for at most the last few batches.

    Args:
        new_event: makes an event (default ``torch.cuda.Event``); for tests.
    """

    def __init__(self, new_event=None) -> None:
        self._new_event = new_event or torch.cuda.Event
        self._held: deque = deque()

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, outputs: object, stream) -> None:
        event = self._new_event()
        event.record(stream)
        self._held.append((event, outputs))
        self.prune()

    def prune(self) -> None:
        """Let go of the outputs whose copies have run (never waits)."""
        while self._held and self._held[0][0].query():
            self._held.popleft()

    def release_all(self) -> None:
        """Wait for every held output's copies, then let go of all (end of a pass)."""
        while self._held:
            event, _ = self._held.popleft()
            event.synchronize()


class FallbackWorkers:
    """The fallback's worker processes, kept for the loader's life: each pass hands them its samples.

    They start at the first pass with fallback-route samples and hold no plan
    (each batch's samples travel with it), so a new epoch, a resumed one or
    :meth:`~daliload.KineticsDALILoader.set_epoch` needs no new processes. They
    stop at :meth:`close`, when garbage-collected, and after a pass abandoned
    with decodes in flight (they restart at the next pass).

    A pass can be started ahead (:meth:`warm`): its first transfers decode
    while the caller still trains on the previous epoch's last batch, and the
    pass that asks for the same key (:meth:`iterate`) takes it over. A pass
    started ahead that nobody takes over is abandoned like any other (its
    decodes are dropped, the workers restart).

    Args:
        setup: the loader's fixed settings (output, decode options, workers).
        budget: the loader's failure budget (reset by the loader every epoch).
    """

    def __init__(self, setup: PassSetup, budget: FailureBudget) -> None:
        self.setup = setup
        self.budget = budget
        self.loader: FallbackLoader | None = None
        self._ahead: tuple[Hashable, list[int], Iterator[FallbackBatch]] | None = None

    def start(self, samples: list[Sample], batch_sizes: list[int]) -> FallbackLoader:
        """The fallback loader, set to ``samples`` in batches of ``batch_sizes``."""
        self.discard_ahead()
        if self.loader is None:
            # The seek hints stay here: each task carries its own samples' hints to a worker.
            dataset = ClipDataset(samples, self.setup.output, decode=self.setup.decode, faults=self.setup.faults)
            self.loader = FallbackLoader(dataset, self.setup.workers, budget=self.budget)
        self.loader.set_plan(samples, batch_sizes=batch_sizes)
        return self.loader

    def iterate(self, key: Hashable | None, samples: list[Sample], batch_sizes: list[int]) -> Iterator[FallbackBatch]:
        """A pass over ``samples``: the one started ahead under ``key`` if there is one, else a new one."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None and key is not None and ahead[0] == key and ahead[1] == list(batch_sizes):
            return ahead[2]
        if ahead is not None:
            ahead[2].close()
        return iter(self.start(samples, batch_sizes)) if samples else iter(())

    def warm(self, key: Hashable, samples: list[Sample], batch_sizes: list[int]) -> None:
        """Start the pass over ``samples`` now: its first transfers go to the workers (see the class)."""
        self.discard_ahead()
        if samples:
            self._ahead = (key, list(batch_sizes), iter(self.start(samples, batch_sizes)))

    def discard_ahead(self) -> None:
        """Abandon the pass started ahead, if any."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead[2].close()

    @property
    def worker_pids(self) -> list[int]:
        """Pids of the running workers (empty when none runs)."""
        return self.loader.worker_pids if self.loader is not None else []

    def close(self) -> None:
        self.discard_ahead()
        if self.loader is not None:
            self.loader.close()


@dataclass(frozen=True)
class FallbackShare:
    """A pass's fallback share: which rows of which batch, and in which transfers they come.

    Attributes:
        rows: batch -> its rows of route fallback (batches without any are absent).
        transfers: batch -> the clip counts of its share's transfers (:func:`fallback_transfers`).
        samples: the share's samples, in plan order.
        sizes: every transfer's clip count, in order (the fallback loader's batch sizes).
    """

    rows: dict[int, list[int]]
    transfers: dict[int, list[int]]
    samples: list[Sample]
    sizes: list[int]

    @classmethod
    def of(cls, batches: Sequence[Sequence[Sample]], routes: Routes, workers: int) -> FallbackShare:
        rows = {}
        for i, batch in enumerate(batches):
            share = [k for k, s in enumerate(batch) if not routes.uses_dali(s)]
            if share:
                rows[i] = share
        per_share = fallback_transfers([len(r) for r in rows.values()], workers)
        return cls(rows=rows, transfers=dict(zip(rows, per_share)),
                   samples=[batches[i][k] for i, r in rows.items() for k in r],
                   sizes=[size for sizes in per_share for size in sizes])


class _FallbackStage:
    """Each batch's fallback share, from the fallback's workers, in plan order.

    A batch's share is its samples whose route was the fallback when the pass
    began; it comes in one transfer, which is the batch itself (no copy) when
    the whole batch is the fallback's. The pass's first share is split into
    one transfer per worker, so all workers decode for the first batch and it
    arrives after the share's decodes divided by the workers. Workers take
    transfers in turn, so after that split the last shares are split too, as
    many as leave every worker the same number of whole shares: otherwise one
    worker decodes a batch more at the end of every pass while the others
    wait (with 2 workers and 8 batches of 8 clips, 7 % of the pass, measured).
    Splitting every share would cost a copy of every batch into a new tensor
    (on a 2-core machine, several ms of the training process per 224x224x16
    float16 clip, measured).
    """

    def __init__(self, workers: FallbackWorkers, batches: list[list[Sample]], routes: Routes,
                 budget: FailureBudget, counters: EpochCounters, *, key: Hashable | None = None) -> None:
        self.budget = budget
        self.counters = counters
        self.exhausted = False
        share = FallbackShare.of(batches, routes, workers.setup.workers.num_workers)
        self.shares = share.rows  # batch -> its rows of route fallback
        self.transfers = share.transfers  # batch -> the sizes of its share's transfers
        self._batches: Iterator[FallbackBatch] = workers.iterate(key, share.samples, share.sizes)

    def parts(self, i: int, batch: list[Sample]) -> list[Part]:
        """Batch ``i``'s share, as one part per transfer received.

        Once the fallback loader has no decodable replacement left, it has
        stopped: the rest of the share, and of the pass's fallback-route
        samples, is decoded outside it, with replacements from the whole plan.
        """
        rows = self.shares.get(i)
        if rows is None or self.exhausted:
            return []
        parts: list[Part] = []
        done = 0
        t0 = time.perf_counter()
        try:
            for _ in self.transfers[i]:
                chunk = next(self._batches)
                taken = rows[done:done + len(chunk.labels)]
                done += len(taken)
                used = chunk.positions.tolist()
                replaced = [batch[k].position != p for k, p in zip(taken, used)]
                parts.append(Part(taken, chunk.videos, chunk.labels.tolist(), replaced, owned=True))
        except NoReplacementError as err:
            logger.warning("%s; decoding the rest outside the fallback loader", err)
            for failure in err.failures:
                self.budget.record(failure)
            self.exhausted = True
        finally:
            self.counters.fallback_wait_s += time.perf_counter() - t0
        self.counters.clips_fallback += done
        return parts

    def close(self) -> None:
        """End this pass's iteration (the workers stay, unless it ended early with decodes in flight)."""
        close = getattr(self._batches, "close", None)
        if close is not None:
            close()


def fallback_transfers(share_sizes: Sequence[int], workers: int) -> list[list[int]]:
    """The clips of each transfer of each fallback share of a pass (the rule of :class:`_FallbackStage`).

    The first share is split over the workers; then as many last shares as
    leave every worker the same number of whole ones (workers take transfers
    in turn); every other share is one transfer. Benchmarks that run the
    fallback as the loader does call this rather than copy it.

    Example: ``fallback_transfers([4, 4, 4, 3], 2) == [[2, 2], [4], [4], [2, 1]]``
    and ``fallback_transfers([4, 4, 3], 2) == [[2, 2], [4], [3]]``.
    """
    per = max(1, workers)
    n = len(share_sizes)
    split = {0} | set(range(n - (n - 1) % per, n)) if n else set()
    return [_split(size, per if j in split else 1) for j, size in enumerate(share_sizes)]


def _split(n: int, parts: int) -> list[int]:
    """``n`` clips in ``min(n, parts)`` near-equal transfers: ``_split(5, 2) == [3, 2]``."""
    k = min(n, parts)
    return [n // k + (j < n % k) for j in range(k)]


def _merge(batch: Sequence[Sample], parts: Sequence[Part], setup: PassSetup,
           counters: EpochCounters) -> tuple[torch.Tensor, torch.Tensor]:
    """Put the parts of ``batch`` in plan order into ``(videos, labels)`` on the loader's device.

    One tensor copy per run of consecutive rows of a part (none when a single
    fallback transfer is the whole batch); copies are asynchronous on torch's
    current stream (the caller keeps DALI's outputs alive until they ran:
    :class:`HeldOutputs`). Labels come from the plan, on the CPU, and go to
    the device with one non-blocking copy.
    """
    n = len(batch)
    if sum(len(part.rows) for part in parts) != n:
        raise RuntimeError(f"internal error: {sum(len(p.rows) for p in parts)} rows decoded for a batch of {n}")
    labels, replaced = [0] * n, [False] * n
    for part in parts:
        for k, label, was_replaced in zip(part.rows, part.labels, part.replaced):
            labels[k], replaced[k] = label, was_replaced
    if setup.label_padding or setup.mask_failed:
        masked = [setup.mask_failed and r for r in replaced]
        counters.clips_masked += sum(masked)
        labels = [PADDING_LABEL if (setup.label_padding and s.is_padding) or m else label
                  for s, m, label in zip(batch, masked, labels)]
    videos = _stack(parts, n, setup.device)
    if setup.views:
        videos, labels = _per_video(videos, labels, setup.views)
    on_cpu = torch.tensor(labels, dtype=torch.int64)
    if setup.device.type == "cuda":
        on_cpu = on_cpu.pin_memory()  # so the copy to the device is truly asynchronous
    return videos, on_cpu.to(setup.device, non_blocking=True)


def _per_video(videos: torch.Tensor, labels: list[int], views: int) -> tuple[torch.Tensor, list[int]]:
    """A multi-view batch as ``(B, V, ...)`` and one label per video: -1 when any of its views is masked."""
    grouped = [labels[k:k + views] for k in range(0, len(labels), views)]
    per_video = [PADDING_LABEL if PADDING_LABEL in group else group[0] for group in grouped]
    return videos.view(len(per_video), views, *videos.shape[1:]), per_video


def _stack(parts: Sequence[Part], n: int, device: torch.device) -> torch.Tensor:
    """The batch's videos: one part's own tensor when it is the whole batch, else copies into a new one."""
    first = parts[0]
    if len(parts) == 1 and first.owned and len(first.rows) == n:
        return first.videos.to(device, non_blocking=True)  # rows are ascending: 0 .. n - 1
    videos = torch.empty((n, *first.videos.shape[1:]), dtype=first.videos.dtype, device=device)
    for part in parts:
        for row, src, length in _runs(part.rows):
            videos[row:row + length].copy_(part.videos[src:src + length], non_blocking=True)
    return videos


def _runs(rows: Sequence[int]) -> Iterator[tuple[int, int, int]]:
    """``(first row, index in the part, length)`` of each run of consecutive rows.

    Example: ``list(_runs([0, 1, 3])) == [(0, 0, 2), (3, 2, 1)]``.
    """
    start = 0
    for j in range(1, len(rows) + 1):
        if j == len(rows) or rows[j] != rows[j - 1] + 1:
            yield rows[start], start, j - start
            start = j
