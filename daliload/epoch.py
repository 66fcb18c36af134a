"""One pass over an epoch for one rank: routes, the DALI stage, the fallback stage, the merge.

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
         fallback when the pass began, in plan order, from a supervised
         fallback.FallbackLoader
      -> decoded here (_DecodeHere): everything else (culprits, files moved
         off DALI mid-pass, the search once the fallback loader has nothing
         decodable left), in supervised worker processes (fallback.isolated)
      -> merge (_merge): rows in plan order into one ``(videos, labels)`` batch
         on the loader's device

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
from typing import Iterator, NamedTuple, Sequence

import torch

from daliload.failures import Failure, FailureBudget, NoReplacementError, replacement_order
from daliload.plan import OutputSpec, Sample
from fallback import ClipDataset, DecodeOptions, FallbackLoader, WorkerOptions
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


class EpochPass:
    """Iterate ``(videos, labels)`` over ``batches``, one per batch, in plan order.

    Args:
        setup: the loader's fixed settings.
        batches: the batches of this pass (an epoch's, or the rest of one).
        plan: every sample of the epoch, in order (replacements are searched there).
        routes: the run's routes (updated when a file fails in DALI).
        budget: the epoch's failure budget.
        counters: where this pass counts what it did.
        dali: a ``DaliClipDecoder`` when any sample may go to DALI, else ``None``.
    """

    def __init__(self, setup: PassSetup, batches: Sequence[Sequence[Sample]], plan: Sequence[Sample], *,
                 routes: Routes, budget: FailureBudget, counters: EpochCounters, dali=None) -> None:
        self.setup = setup
        self.batches = [list(b) for b in batches]
        self.counters = counters
        self._here = _DecodeHere(setup, plan, budget, counters)
        self._dali = _DaliStage(dali, self.batches, self._here, routes, setup, counters) if dali else None
        fallback = [s for b in self.batches for s in b if not routes.uses_dali(s)]
        self._fallback = _FallbackStage(setup, fallback, budget, counters)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        try:
            for i, batch in enumerate(self.batches):
                rows = self._dali.rows(i) if self._dali is not None else {}
                here = []
                for sample in batch:
                    if sample.position in rows:
                        continue
                    row = self._fallback.next_row(sample) if self._fallback.owns(sample) else None
                    if row is not None:
                        rows[sample.position] = row
                    else:
                        here.append(sample)
                rows.update(self._here.decode(here))
                self._count_past_end(batch)
                videos, labels = _merge(batch, rows, self.setup, self.counters)
                if self._dali is not None:
                    self._dali.copied(i, videos)
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

    def rows(self, i: int) -> dict[int, Row]:
        """Rows (by plan position) of batch ``i``'s DALI share."""
        self._submit_ahead(i)
        part = self.parts.get(i, [])
        if not part:
            return {}
        from daliload.pipeline import DaliBatchError

        copied = i in self.early  # collected ahead during an isolation: a copy, not DALI's buffer
        outcome = self.early.pop(i) if copied else self._collect(i)
        if isinstance(outcome, DaliBatchError):
            return self._isolate(part, outcome)
        if outcome.samples != tuple(part):
            raise RuntimeError("internal error: DALI returned another batch than the one "
                               f"expected ({len(outcome.samples)} vs {len(part)} samples)")
        self.counters.clips_dali += len(part)
        if not copied:
            self._outputs[i] = outcome
        # The label comes from the plan: reading DALI's would sync the GPU per row.
        return {s.position: Row(outcome.videos[k], s.label) for k, s in enumerate(part)}

    def _submit_ahead(self, i: int) -> None:
        d = self.decoder
        while self.submitted < len(self.batches) and (self.submitted <= i or d.pending < d.prefetch_queue_depth):
            # Decided now, not when the pass began: a file moved off DALI leaves from the next batch on.
            part = [s for s in self.batches[self.submitted] if self.routes.uses_dali(s)]
            self.parts[self.submitted] = part
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
        """Drop what was submitted ahead for an abandoned pass; release the outputs held."""
        self.held.release_all()
        while self.decoder.pending and not self.decoder.stuck:
            try:
                self.decoder.result(self._timeout(self.decoder.batch_size))
            except Exception as err:  # noqa: BLE001 - results of a dropped pass are discarded
                logger.debug("discarding a pending DALI batch: %s", err)


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


class _FallbackStage:
    """The samples whose route was the fallback when the pass began, in plan order, from worker processes."""

    def __init__(self, setup: PassSetup, samples: list[Sample], budget: FailureBudget,
                 counters: EpochCounters) -> None:
        self.budget = budget
        self.counters = counters
        self.exhausted = False
        self.positions = {s.position for s in samples}
        self._loader = None
        self._rows: Iterator[tuple[Row, int]] = iter(())
        if samples:
            # Only this pass's hints travel to the workers (the whole dataset's would be pickled).
            hints = {s.path: h for s in samples if (h := setup.decode.hint(s.path)) is not None}
            dataset = ClipDataset(samples, setup.output, decode=dataclasses.replace(setup.decode, hints=hints),
                                  faults=setup.faults)
            self._loader = FallbackLoader(dataset, setup.workers, budget=budget)
            self._rows = self._unbatch(self._loader)

    def owns(self, sample: Sample) -> bool:
        """Whether ``sample`` is this stage's to decode (its route, while the loader has replacements)."""
        return sample.position in self.positions and not self.exhausted

    @staticmethod
    def _unbatch(loader: FallbackLoader) -> Iterator[tuple[Row, int]]:
        for videos, labels, positions in loader:
            for k in range(len(labels)):
                yield Row(videos[k], int(labels[k]), replaced=False), int(positions[k])

    def next_row(self, sample: Sample) -> Row | None:
        """The row for ``sample``, the next fallback-route sample of the plan.

        ``None`` once the fallback loader has no decodable replacement left: it
        has stopped, so this and the pass's remaining fallback-route samples
        are decoded outside it, with replacements searched over the whole plan.
        """
        t0 = time.perf_counter()
        try:
            row, position = next(self._rows)
        except NoReplacementError as err:
            logger.warning("%s; decoding the rest outside the fallback loader", err)
            for failure in err.failures:
                self.budget.record(failure)
            self.exhausted = True
            return None
        finally:
            self.counters.fallback_wait_s += time.perf_counter() - t0
        self.counters.clips_fallback += 1
        return row._replace(replaced=position != sample.position)

    def close(self) -> None:
        close = getattr(self._rows, "close", None)
        if close is not None:
            close()
        if self._loader is not None:
            self._loader.close()


def _merge(batch: Sequence[Sample], rows: dict[int, Row], setup: PassSetup,
           counters: EpochCounters) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack the rows of ``batch`` in plan order into ``(videos, labels)`` on the loader's device.

    Copies are asynchronous on torch's current stream (the caller keeps DALI's
    rows alive until they ran: :class:`HeldOutputs`); labels come from the
    plan, on the CPU, and go to the device with one non-blocking copy.
    """
    first = rows[batch[0].position].video
    videos = torch.empty((len(batch), *first.shape), dtype=first.dtype, device=setup.device)
    # Pinned on a GPU run, so the labels' copy to the device is truly asynchronous.
    labels = torch.empty(len(batch), dtype=torch.int64, pin_memory=setup.device.type == "cuda")
    for k, sample in enumerate(batch):
        row = rows[sample.position]
        videos[k].copy_(row.video, non_blocking=True)
        masked = setup.mask_failed and row.replaced
        counters.clips_masked += masked
        labels[k] = PADDING_LABEL if (setup.label_padding and sample.is_padding) or masked else row.label
    return videos, labels.to(setup.device, non_blocking=True)
