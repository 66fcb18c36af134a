"""One pass over an epoch's batches for one rank: one scheduler over the clip sources, one replacement loop.

:class:`EpochPass` submits each batch's shares to their sources (the routes
split each batch by route and by the sources' loads when it is submitted), up
to ``prefetch`` batches ahead, collects them in plan order, re-decodes DALI's
failures through the fallback, replaces what fails (the replacement rule of
:mod:`daliload.failures`) and merges the rows (:mod:`._merge`). What a pass
counts and where it is lives here too: its counters, the epoch's failure
budget (reset when the pass begins, its warning when it ends) and the next
batch it yields.
"""

from __future__ import annotations

import functools
import time
from collections import deque
from typing import Iterator, Sequence

import torch

from daliload.clips import ClipSource, Decoded
from daliload.epoch._merge import BatchInfo, HeldOutputs, HostTransfer, Part, merge
from daliload.epoch._routes import Routes
from daliload.epoch._setup import EpochCounters, PassSetup
from daliload.failures import Failure, FailureBudget, NoReplacementError, replacement_order
from daliload.plan import Sample


class EpochPass:
    """Iterate ``(videos, labels, info)`` over ``batches``, one per batch, in plan order.

    Args:
        setup: the loader's fixed settings.
        batches: the batches of this pass (an epoch's, or the rest of one).
        plan: every sample of the epoch, in order (replacements are searched there).
        routes: the run's routes (updated when a file fails in DALI) and routing policy.
        budget: the epoch's failure budget, reset here for the plan's videos.
        fallback: the PyAV source (it also decodes replacements and DALI's culprits).
        dali: the DALI source, when any sample may go to DALI; else ``None``.
        counters: where this pass counts what it did (default: new ones, :attr:`counters`).
        epoch: the epoch the batches are of (for :attr:`epoch`).
        start: the epoch's batch the first of ``batches`` is (a resumed pass).

    Attributes:
        counters: what the pass did so far (:class:`EpochCounters`).
        next_batch: the epoch's batch after the last one yielded (``start`` before the first).
    """

    def __init__(self, setup: PassSetup, batches: Sequence[Sequence[Sample]], plan: Sequence[Sample], *,
                 routes: Routes, budget: FailureBudget, fallback: ClipSource, dali: ClipSource | None = None,
                 counters: EpochCounters | None = None, epoch: int = 0, start: int = 0,
                 pinned: dict[int, int] | None = None) -> None:
        self.setup = setup
        self.pinned = pinned  # host memory registered for as long as it lives (RegisteredBuffers.pinned)
        self.batches = [list(b) for b in batches]
        self.plan = list(plan)
        self.routes, self.budget = routes, budget
        self.counters = counters if counters is not None else EpochCounters()
        self.fallback, self.dali = fallback, dali
        self.epoch, self.next_batch = epoch, start
        budget.reset(len({s.video_index for s in self.plan}))  # the videos of this rank's epoch
        # Per batch submitted ahead: each share's (source, ticket, rows), and rows known to fail already.
        self._submitted: deque[tuple[list[tuple[ClipSource, int, list[int]]], dict[int, Failure]]] = deque()
        self._held = HeldOutputs()

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, BatchInfo]]:
        self.routes.pass_started()
        try:
            for i, batch in enumerate(self.batches):
                self._submit_ahead(i)
                parts, replaced = self._collect(batch, *self._submitted.popleft())
                self._count_past_end(batch)
                host = None
                if self.setup.device.type != "cpu":  # cuda (tests: meta)
                    host = HostTransfer(device=self.setup.device, pinned=self.pinned)
                try:
                    videos, labels, info = merge(batch, parts, replaced, self.setup, self.counters, host)
                finally:
                    if host is not None:  # what the batch's copies read lives until they have run
                        decoded = [p.decoded for p in parts]
                        self._held.hold(decoded, torch.cuda.current_stream(self.setup.device),
                                        on_release=functools.partial(_release, host, decoded))
                # Set before yielding: a state taken while the caller holds this batch resumes after it.
                self.next_batch += 1
                self.counters.batches += 1
                self.routes.batch_done(len(batch))  # the measured routing's clock
                yield videos, labels, info
        finally:
            # Nothing waits here: an abandoned pass (an exception in the caller's loop, Ctrl-C, break,
            # the end of a script) drops what it submitted ahead.
            for source in (self.dali, self.fallback):
                if source is not None:
                    source.cancel()
            self._held.release_all()
            # Once per epoch, pointing at the loop over the loader: this generator, the loader's _pass_over and
            # _epoch_pass are the frames between (whether the pass ended, broke off or raised).
            self.budget.warn(stacklevel=4)

    # -- the scheduler ------------------------------------------------------------------------

    def _submit_ahead(self, i: int) -> None:
        """Submit batches up to ``prefetch`` ahead of batch ``i``, each share to its source."""
        while len(self._submitted) < min(len(self.batches) - i, self.setup.prefetch):
            batch = self.batches[i + len(self._submitted)]
            # Decided now, not when the pass began: a file moved off DALI leaves from the next batch on,
            # and a file that failed is not decoded again.
            known = {k: failure for k, s in enumerate(batch) if (failure := self._known_failure(s)) is not None}
            rows = [k for k in range(len(batch)) if k not in known]
            to_dali, to_fallback = self.routes.assign(batch, rows, self.dali.load() if self.dali else None,
                                                      self.fallback.load())
            self.counters.clips_moved += self.routes.last_moved
            shares = []
            for source, share in ((self.dali, to_dali), (self.fallback, to_fallback)):
                if share:
                    shares.append((source, source.submit([batch[k] for k in share]), share))
            self._submitted.append((shares, known))

    def _known_failure(self, sample: Sample) -> Failure | None:
        """How ``sample`` fails without decoding it: its file failed this epoch, or was quarantined."""
        failure = self.routes.quarantined.get(sample.video_index) or self.budget.failure_of(sample.video_index)
        if failure is None:
            return None
        return Failure(sample.path, failure.reason, sample.position, failure.kind)

    def _collect(self, batch: list[Sample], shares, known: dict[int, Failure]) -> tuple[list[Part], dict[int, Sample]]:
        """The batch's rows as parts; failed rows re-decoded or replaced (``row -> the sample that fills it``)."""
        parts: list[Part] = []
        failed: list[tuple[int, Sample]] = []
        redo: list[int] = []
        c = self.counters
        for row, failure in known.items():
            self.budget.record(failure, batch[row].video_index)
            failed.append((row, batch[row]))
        for source, ticket, rows in shares:
            on_dali = source is self.dali
            started, isolating = time.perf_counter(), getattr(source, "isolation_s", 0.0)
            cut = getattr(source, "clips_cut", 0)
            decoded = source.collect(ticket)
            waited = time.perf_counter() - started
            if on_dali:
                isolated = getattr(source, "isolation_s", 0.0) - isolating  # finding the files that broke a batch
                c.isolation_s += isolated
                c.dali_wait_s += waited - isolated
                c.clips_dali_cut += getattr(source, "clips_cut", 0) - cut
            else:
                c.fallback_wait_s += waited
            parts.append(self._part(decoded, rows, on_dali=on_dali))
            for j, failure in decoded.failures.items():
                if failure.kind in ("dali", "dali_batch"):
                    redo.append(rows[j])
                else:
                    self._fail(failure, batch[rows[j]])
                    failed.append((rows[j], batch[rows[j]]))
            self._note_dali_failures(decoded, [batch[k] for k in rows])
        if redo:  # DALI's culprits and the batch-mates it could not tell apart: the fallback decodes them now
            c.clips_redecoded += len(redo)
            decoded = self.fallback.collect(self.fallback.submit([batch[k] for k in redo], urgent=True))
            parts.append(self._part(decoded, redo, on_dali=False))
            for j, failure in decoded.failures.items():
                self._fail(failure, batch[redo[j]])
                failed.append((redo[j], batch[redo[j]]))
        replaced = {}
        for row, sample in failed:
            part, replaced[row] = self._replacement(row, sample)
            parts.append(part)
        return parts, replaced

    def _part(self, decoded: Decoded, rows: list[int], *, on_dali: bool) -> Part:
        """The rows of ``rows`` that ``decoded`` holds a clip for, counted to the source that decoded them."""
        ok = [j for j in range(len(rows)) if j not in decoded.failures]
        if on_dali:
            self.counters.clips_dali += len(ok)
            self.counters.frames_decoded_dali += decoded.frames_decoded or 0
        else:
            self.counters.clips_fallback += len(ok)
            self.counters.frames_decoded_fallback += decoded.frames_decoded or 0
        return Part([rows[j] for j in ok], ok, decoded)

    def _fail(self, failure: Failure, sample: Sample) -> None:
        """``sample`` failed: the budget counts its video (and may end the epoch); a worker-killing one is
        quarantined."""
        self.routes.quarantine(failure, sample.video_index)
        self.budget.record(failure, sample.video_index)

    def _note_dali_failures(self, decoded: Decoded, samples: list[Sample]) -> None:
        kinds = {f.kind for f in decoded.failures.values()}
        if "dali" in kinds:
            self.routes.reroute({samples[j].video_index for j, f in decoded.failures.items() if f.kind == "dali"})
            self.routes.note_batch(blamed=True)
        elif "dali_batch" in kinds:
            reason = next(f.reason for f in decoded.failures.values() if f.kind == "dali_batch")
            self.routes.note_batch(blamed=False, reason=reason)

    def _replacement(self, row: int, sample: Sample) -> tuple[Part, Sample]:
        """The replacement rule: the next sample of the plan after ``sample`` that decodes fills its slot."""
        for index in replacement_order(len(self.plan), self._plan_index(sample)):
            candidate = self.plan[index]
            if candidate.position == sample.position or self._known_failure(candidate) is not None:
                continue  # a file that failed is not decoded again
            decoded = self.fallback.collect(self.fallback.submit([candidate], urgent=True))
            part = self._part(decoded, [row], on_dali=False)
            if decoded.failures:
                self._fail(decoded.failures[0], candidate)
                continue
            self.budget.record_replacement(sample.position, candidate.position)
            return part, candidate
        raise NoReplacementError(sample.position, self.budget.failures)

    def _plan_index(self, sample: Sample) -> int:
        """Where ``sample`` is in the plan: its position (plans number their samples in order; padding after)."""
        position = sample.position
        if 0 <= position < len(self.plan) and self.plan[position].position == position:
            return position
        return next((i for i, s in enumerate(self.plan) if s.position == position), 0)

    def _count_past_end(self, batch: Sequence[Sample]) -> None:
        for s in batch:
            frames = self.setup.num_frames(s.video_index)
            if frames is not None and s.last_frame >= frames:
                self.counters.clips_past_end += 1


def _release(host: HostTransfer, decoded: Sequence[Decoded]) -> None:
    """A batch's copies have run: undo its registrations, and give its reusable buffers back."""
    host.release()
    for part in decoded:
        if part.recycle is not None:
            part.recycle()
