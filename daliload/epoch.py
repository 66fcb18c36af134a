"""One pass over an epoch for one rank: routes, the DALI stage, the fallback stage, the merge.

:class:`~daliload.KineticsDALILoader` is the public face; this module does the
work of one pass over the batches of its plan::

    batches of the plan (plan order)
      -> Routes: which samples DALI decodes (route ``dali`` and DALI enabled,
         minus files that failed in DALI earlier in the run)
      -> DALI stage (_DaliStage): batches submitted up to ``prefetch_batches``
         ahead, collected in order; a batch DALI fails is decoded again here,
         sample by sample, and the files to blame move to the fallback
      -> fallback stage (_FallbackStage): the pass's fallback-route samples, in
         plan order, through a supervised fallback.FallbackLoader; if it has no
         decodable replacement left, the rest is decoded here
      -> merge (_merge): rows in plan order into one ``(videos, labels)`` batch
         on the loader's device

Every failure, whichever path met it, goes to the epoch's one
:class:`~daliload.failures.FailureBudget`, which counts it once, raises past
the limit, and warns once when the pass ends. Decodes "here" (in this process)
apply the same replacement rule as the fallback's workers
(:func:`~daliload.failures.replacement_order`), over the whole plan.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch

from daliload.failures import Failure, FailureBudget, NoReplacementError, replacement_order
from daliload.plan import OutputSpec, Sample
from fallback import ClipDataset, DecodeError, DecodeOptions, FallbackLoader, WorkerOptions, decode_sample

logger = logging.getLogger(__name__)

#: Label given to padding samples when ``label_padding`` is on (validation default).
PADDING_LABEL = -1


class Routes:
    """Which files DALI decodes, for the whole run.

    Starts from the pre-screen's routes; a file that breaks a DALI batch at run
    time (named by DALI, or failing in the fallback too) moves to the fallback
    for the rest of the run, so the cost of a failed DALI batch is paid once.

    Args:
        dali_paths: files of route ``dali`` (empty when DALI is not used).
    """

    def __init__(self, dali_paths: Sequence[str]) -> None:
        self._dali = set(dali_paths)
        self.rerouted: set[str] = set()

    def uses_dali(self, sample: Sample) -> bool:
        return sample.path in self._dali

    def reroute(self, paths: set[str]) -> None:
        """Send ``paths`` to the fallback from now on."""
        self._dali -= paths
        self.rerouted |= paths


@dataclass
class EpochCounters:
    """What one pass did; :class:`~daliload.LoaderStats` reports them with the budget's failures."""

    batches: int = 0
    clips_dali: int = 0
    clips_fallback: int = 0
    clips_redecoded: int = 0
    dali_wait_s: float = 0.0
    fallback_wait_s: float = 0.0


@dataclass(frozen=True)
class PassSetup:
    """What a pass needs from its loader, fixed for the run.

    Attributes:
        output: what every clip is turned into.
        decode: how the fallback decodes (threads, time limit, seek hints).
        workers: the fallback's workers (batch of 1 clip: rows are merged here).
        device: where batches are assembled (``cuda:N`` or the CPU).
        label_padding: give padding samples :data:`PADDING_LABEL`.
    """

    output: OutputSpec
    decode: DecodeOptions
    workers: WorkerOptions
    device: torch.device
    label_padding: bool


class EpochPass:
    """Iterate ``(videos, labels)`` over ``batches``, one per batch, in plan order.

    Args:
        setup: the loader's fixed settings.
        batches: the batches of this pass (an epoch's, or the rest of one).
        plan: every sample of the epoch, in order (replacements are searched there).
        routes: the run's routes (updated when a file fails in DALI).
        budget: the epoch's failure budget.
        counters: where this pass counts what it did.
        dali: a ``DaliClipDecoder`` when any sample goes to DALI, else ``None``.
    """

    def __init__(self, setup: PassSetup, batches: Sequence[Sequence[Sample]], plan: Sequence[Sample], *,
                 routes: Routes, budget: FailureBudget, counters: EpochCounters, dali=None) -> None:
        self.setup = setup
        self.batches = [list(b) for b in batches]
        self.routes = routes
        self.budget = budget
        self.counters = counters
        self._here = _DecodeHere(setup, plan, budget, counters)
        dali_parts = [[s for s in b if routes.uses_dali(s)] for b in self.batches]
        self._dali = _DaliStage(dali, dali_parts, self._here, routes, counters) if any(dali_parts) else None
        fallback = [s for b in self.batches for s in b if not routes.uses_dali(s)]
        self._fallback = _FallbackStage(setup, fallback, self._here, budget, counters)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        try:
            for i, batch in enumerate(self.batches):
                rows = self._dali.rows(i) if self._dali is not None else {}
                for sample in batch:
                    if sample.position not in rows:
                        rows[sample.position] = self._fallback.next_row(sample)
                yield _merge(batch, rows, self.setup, synchronize=bool(self._dali and self._dali.has_rows(i)))
        finally:
            if self._dali is not None:
                self._dali.drain()
            self._fallback.close()


class _DecodeHere:
    """Decode a sample in this process, or the next one of the plan that decodes (the replacement rule)."""

    def __init__(self, setup: PassSetup, plan: Sequence[Sample], budget: FailureBudget,
                 counters: EpochCounters) -> None:
        self.setup = setup
        self.plan = list(plan)
        self.index = {s.position: i for i, s in enumerate(self.plan)}
        self.budget = budget
        self.counters = counters

    def __call__(self, sample: Sample) -> tuple[torch.Tensor, int]:
        """The clip and label filling ``sample``'s slot; failures go to the budget (which may raise)."""
        for i in replacement_order(len(self.plan), self.index.get(sample.position, 0)):
            candidate = self.plan[i]
            try:
                video = decode_sample(candidate, self.setup.output, self.setup.decode)
            except DecodeError as err:
                self.budget.record(Failure(candidate.path, err.reason, candidate.position))
                continue
            if candidate.position != sample.position:
                self.budget.record_replacement(sample.position, candidate.position)
            self.counters.clips_fallback += 1
            return video, candidate.label
        raise RuntimeError(f"no sample of this rank's plan decodes; last failure: {self.budget.failures[-1]}")


class _DaliStage:
    """DALI's share of each batch: submitted ahead, collected in order, re-decoded here if DALI fails."""

    def __init__(self, decoder, parts: list[list[Sample]], here: _DecodeHere, routes: Routes,
                 counters: EpochCounters) -> None:
        self.decoder = decoder
        self.parts = parts
        self.here = here
        self.routes = routes
        self.counters = counters
        self.submitted = 0
        self._decoded: set[int] = set()  # batches whose rows live in DALI's output buffer

    def has_rows(self, i: int) -> bool:
        return i in self._decoded

    def rows(self, i: int) -> dict[int, tuple[torch.Tensor, int]]:
        """Rows (by plan position) of batch ``i``'s DALI samples."""
        self._submit_ahead(i)
        part = self.parts[i]
        if not part:
            return {}
        from daliload.pipeline import DaliBatchError

        t0 = time.perf_counter()
        try:
            decoded = self.decoder.result()
        except DaliBatchError as err:
            self.counters.dali_wait_s += time.perf_counter() - t0
            return self._redecode(part, err)
        self.counters.dali_wait_s += time.perf_counter() - t0
        if decoded.samples != tuple(part):
            raise RuntimeError("internal error: DALI returned another batch than the one "
                               f"expected ({len(decoded.samples)} vs {len(part)} samples)")
        self.counters.clips_dali += len(part)
        self._decoded.add(i)
        # The label comes from the plan: reading DALI's would sync the GPU per row.
        return {s.position: (decoded.videos[k], s.label) for k, s in enumerate(part)}

    def _submit_ahead(self, i: int) -> None:
        d = self.decoder
        while self.submitted < len(self.parts) and (self.submitted <= i or d.pending < d.prefetch_queue_depth):
            if self.parts[self.submitted]:
                d.submit(self.parts[self.submitted])
            self.submitted += 1

    def _redecode(self, part: list[Sample], err) -> dict[int, tuple[torch.Tensor, int]]:
        logger.warning("DALI batch failed, decoding its %d clip(s) with the fallback: %s", len(part), err.reason)
        # A file DALI cannot decode (damaged after the scan, or mid-stream where only
        # --deep looks) would fail every batch it joins: once known, it goes to the
        # fallback for the rest of the run. Known = named by DALI, or failing here too.
        culprits = {err.culprit.path} if err.culprit is not None else set()
        rows = {}
        for sample in part:
            before = len(self.here.budget.failures)
            rows[sample.position] = self.here(sample)
            self.counters.clips_redecoded += 1
            if any(f.path == sample.path for f in self.here.budget.failures[before:]):
                culprits.add(sample.path)
        self.routes.reroute(culprits)
        return rows

    def drain(self) -> None:
        """Drop what was submitted ahead for an abandoned pass."""
        while self.decoder.pending:
            try:
                self.decoder.result()
            except Exception as err:  # noqa: BLE001 - results of a dropped pass are discarded
                logger.debug("discarding a pending DALI batch: %s", err)


class _FallbackStage:
    """The pass's fallback-route samples, in plan order, from supervised worker processes."""

    def __init__(self, setup: PassSetup, samples: list[Sample], here: _DecodeHere, budget: FailureBudget,
                 counters: EpochCounters) -> None:
        self.here = here
        self.budget = budget
        self.counters = counters
        self.exhausted = False
        self._loader = None
        self._rows: Iterator[tuple[torch.Tensor, int]] = iter(())
        if samples:
            # Only this pass's hints travel to the workers (the whole dataset's would be pickled).
            paths = {s.path for s in samples}
            hints = {p: h for p, h in (setup.decode.hints or {}).items() if p in paths}
            decode = dataclasses.replace(setup.decode, hints=hints)
            self._loader = FallbackLoader(ClipDataset(samples, setup.output, decode=decode), setup.workers,
                                          budget=budget)
            self._rows = self._unbatch(self._loader)

    @staticmethod
    def _unbatch(loader: FallbackLoader) -> Iterator[tuple[torch.Tensor, int]]:
        for videos, labels, _positions in loader:
            for k in range(len(labels)):
                yield videos[k], int(labels[k])

    def next_row(self, sample: Sample) -> tuple[torch.Tensor, int]:
        """The row for ``sample``, the next fallback-route sample of the plan."""
        t0 = time.perf_counter()
        if self.exhausted:
            row = self.here(sample)
        else:
            try:
                row = next(self._rows)
                self.counters.clips_fallback += 1
            except NoReplacementError as err:
                # No fallback-route sample left that decodes: the fallback loader has
                # stopped, so this and the pass's remaining fallback-route samples are
                # decoded here, with replacements searched over the whole plan.
                logger.warning("%s; decoding the rest in this process", err)
                for failure in err.failures:
                    self.budget.record(failure)
                self.exhausted = True
                row = self.here(sample)
        self.counters.fallback_wait_s += time.perf_counter() - t0
        return row

    def close(self) -> None:
        close = getattr(self._rows, "close", None)
        if close is not None:
            close()
        if self._loader is not None:
            self._loader.close()


def _merge(batch: Sequence[Sample], rows: dict[int, tuple[torch.Tensor, int]], setup: PassSetup, *,
           synchronize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack the rows of ``batch`` in plan order into ``(videos, labels)`` on the loader's device."""
    first = rows[batch[0].position][0]
    videos = torch.empty((len(batch), *first.shape), dtype=first.dtype, device=setup.device)
    labels = torch.empty(len(batch), dtype=torch.int64)
    for k, sample in enumerate(batch):
        video, label = rows[sample.position]
        videos[k].copy_(video, non_blocking=True)
        labels[k] = PADDING_LABEL if (setup.label_padding and sample.is_padding) else label
    if synchronize and videos.is_cuda:
        # DALI rows live in DALI's output buffer, which its next run may overwrite from
        # its own stream: wait for the copies before letting go of that buffer.
        torch.cuda.current_stream(videos.device).synchronize()
    return videos, labels.to(setup.device, non_blocking=True)
