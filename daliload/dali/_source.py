"""DALI as a clip source: a DaliClipDecoder's batches, with a failed batch isolated by halves inside.

:class:`DaliSource` implements :class:`daliload.clips.ClipSource` over one
:class:`~daliload.dali.DaliClipDecoder`. A batch DALI decodes comes back
as DALI's own output (zero-copy). A batch DALI fails on comes back with every
row settled: DALI's message often names no sample ("memory file"), so the
batch's samples go back to DALI in halves until the files it fails on alone
are found; the others keep DALI's clips (copies), and each culprit gets a
:class:`~daliload.failures.Failure` of kind ``"dali"`` (DALI cannot decode
that file: the pass moves it to the fallback for the rest of the run). When
every sample fails alone too, nothing singles a file out (a driver or library
problem): the rows get kind ``"dali_batch"`` and keep their route; the pass
gives DALI up after a few such batches in a row.

With a :class:`~daliload.dali.WindowCutter`, DALI gets per sample only
the packets its window needs (``daliload.stream.cut``): a batch's cuts are made in
worker processes while the batches before it decode, and the batch is fed to
DALI once they are in (at the latest when it is collected). A sample whose
cut fails, or gains nothing, gets its whole file as before.

A batch that does not finish within its time limit raises
:class:`~daliload.dali.DaliTimeoutError` from :meth:`DaliSource.collect`:
a thread stuck inside DALI cannot be stopped, so the run ends, loudly.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections import deque
from typing import Sequence

import torch

from daliload.dali._cutter import WindowCutter
from daliload.dali._errors import DaliBatchError
from daliload.dali._pipeline import DaliClipDecoder, DecodedBatch
from daliload.failures import Failure
from daliload.plan import Sample
from daliload.clips import Decoded, LoadMeter, SourceLoad

logger = logging.getLogger(__name__)


class DaliSource:
    """A :class:`~daliload.clips.ClipSource` over ``decoder`` (see the module docstring).

    Args:
        decoder: the DALI decoder (its ``prefetch_queue_depth`` bounds the batches in flight).
        clip_timeout_s: how long one clip may take; a batch of ``n`` clips may
            take ``clip_timeout_s * (1 + ceil(n / decoder.num_threads))``.
        cutter: makes the cuts that DALI decodes instead of whole files
            (the decoder needs ``num_frames``); ``None``: whole files.
    """

    def __init__(self, decoder: DaliClipDecoder, *, clip_timeout_s: float,
                 cutter: WindowCutter | None = None) -> None:
        if cutter is not None and decoder.num_frames is None:
            raise ValueError("cutting windows needs the decoder's num_frames (the frames DALI is asked for)")
        self.decoder = decoder
        self.clip_timeout_s = clip_timeout_s
        self.cutter = cutter
        self.isolation_s = 0.0  # spent finding the files that broke batches
        self.clips_cut = 0  # clips DALI decoded from a cut, not the whole file
        self._tickets: deque[tuple[int, tuple[Sample, ...]]] = deque()  # in DALI's queue, oldest first
        self._cutting: deque[tuple[int, tuple[Sample, ...], int]] = deque()  # (ticket, samples, cuts), not fed yet
        # ticket -> (frames DALI decodes for it, from each clip's entry; its clips fed as cuts)
        self._frames: dict[int, tuple[int, int]] = {}
        self._early: dict[int, DecodedBatch | DaliBatchError] = {}  # collected ahead while isolating (copies)
        self._next_ticket = 0
        self._meter = LoadMeter(decoder.num_threads * decoder.pipelines)

    def submit(self, samples: Sequence[Sample], *, urgent: bool = False) -> int:
        """Queue ``samples`` as one DALI batch (``urgent`` changes nothing: DALI runs batches in order)."""
        ticket, self._next_ticket = self._next_ticket, self._next_ticket + 1
        samples = tuple(samples)
        self._meter.submitted(ticket, len(samples))
        if self.cutter is None:
            self._feed(ticket, samples, None)
        else:
            frames = self.decoder.frames_for(samples)
            self._cutting.append((ticket, samples, self.cutter.submit(list(zip((s.path for s in samples), frames)))))
            self._feed_cut(until=None)
        return ticket

    def collect(self, ticket: int) -> Decoded:
        """The batch of ``ticket`` (batches are collected in the order submitted).

        Raises:
            DaliTimeoutError: DALI did not finish it in time; the run cannot go on.
        """
        asked = time.perf_counter()
        self._feed_cut(until=ticket)
        frames, cut = self._frames.pop(ticket, (None, 0))
        outcome = self._early.pop(ticket, None)
        if outcome is None:
            outcome = self._next(ticket)
        self._meter.collected(ticket, asked)  # a failed batch too: the time it took DALI to fail it
        if isinstance(outcome, DaliBatchError):
            return self._isolate(outcome)  # its clips are decoded again from whole files
        self.clips_cut += cut
        return Decoded(outcome.videos, {}, frames, outcome.outputs, owned=outcome.owned)

    def cancel(self) -> None:
        """Drop every batch not collected yet, without waiting for DALI or for cuts."""
        if self.cutter is not None:
            self.cutter.cancel([handle for _, _, handle in self._cutting])
        self._cutting.clear()
        self._tickets.clear()
        self._early.clear()
        self._frames.clear()
        self._meter.dropped()
        self.decoder.discard_pending()

    def load(self) -> SourceLoad:
        """Clips in flight, recent clips/s and DALI's threads times pipelines (:class:`~daliload.clips.LoadMeter`)."""
        return self._meter.load()

    def close(self) -> None:
        self.cancel()
        if self.cutter is not None:
            self.cutter.close()
        self.decoder.close()

    # -- internals --------------------------------------------------------------------------

    def _feed(self, ticket: int, samples: tuple[Sample, ...], cuts: list | None) -> None:
        """Queue the batch in DALI, with its cuts (``None``: whole files), counting what DALI decodes."""
        self.decoder.submit(samples, cuts)
        self._tickets.append((ticket, samples))
        frames = self.decoder.frames_for(samples)
        if frames is not None:  # DALI decodes from each clip's entry (its cut's first frame, else frame 0)
            starts = [0 if cut is None else cut.first_frame for cut in (cuts or [None] * len(samples))]
            self._frames[ticket] = (sum(max(ids) + 1 - start for ids, start in zip(frames, starts)),
                                    sum(start > 0 for start in starts))

    def _feed_cut(self, until: int | None) -> None:
        """Feed DALI the batches whose cuts are in, in order; up to ``until`` waiting for cuts still being made."""
        while self._cutting:
            ticket, samples, handle = self._cutting[0]
            if (until is None or ticket > until) and not self.cutter.ready(handle):
                return
            self._cutting.popleft()
            self._feed(ticket, samples, self.cutter.take(handle))

    def _timeout(self, n: int) -> float:
        return self.clip_timeout_s * (1 + math.ceil(n / self.decoder.num_threads))

    def _next(self, ticket: int) -> DecodedBatch | DaliBatchError:
        """The result (or error) of the oldest batch in DALI's queue, which must be ``ticket``'s."""
        oldest, samples = self._tickets.popleft()
        if oldest != ticket:
            raise RuntimeError(f"internal error: DALI batches are collected in order; {ticket} asked, "
                               f"{oldest} is next")
        try:
            return self.decoder.result(self._timeout(len(samples)))
        except DaliBatchError as err:
            return err

    def _isolate(self, err: DaliBatchError) -> Decoded:
        """Find the samples DALI fails on alone; the others keep DALI's clips (copied)."""
        started = time.perf_counter()
        samples = list(err.samples)
        # Not a warning: what the user is told is the outcome (stats().rerouted, the failure warning).
        logger.info("DALI batch of %d clip(s) failed (%s); isolating the file(s) at fault", len(samples), err.reason)
        while self._tickets:  # bisection needs DALI's queue to itself: what is in it is collected now
            ticket = self._tickets[0][0]
            outcome = self._next(ticket)
            self._early[ticket] = outcome if isinstance(outcome, DaliBatchError) else _copied(outcome)
        named = {err.culprit.path} if err.culprit is not None else set()
        clips, culprits = self._bisect([k for k, s in enumerate(samples) if s.path not in named], samples)
        culprits += [k for k, s in enumerate(samples) if s.path in named]
        blamed = len(culprits) < len(samples) or len(samples) == 1
        kind = "dali" if blamed else "dali_batch"
        failures = {k: Failure(samples[k].path, f"DALI: {err.reason}", samples[k].position, kind)
                    for k in sorted(culprits)}
        if clips:
            first = next(iter(clips.values()))
            videos = torch.empty((len(samples), *first.shape), dtype=first.dtype, device=first.device)
            for k, clip in clips.items():
                videos[k].copy_(clip)
        else:
            videos = torch.empty(0)
        self.isolation_s += time.perf_counter() - started
        return Decoded(videos, failures, owned=bool(clips))  # a copy of torch's already

    def _bisect(self, rows: list[int], samples: list[Sample]) -> tuple[dict[int, torch.Tensor], list[int]]:
        """Clips DALI decodes among ``rows`` (copied), and the rows it fails on alone."""
        if not rows:
            return {}, []
        try:
            decoded = _copied(self.decoder.decode_batch([samples[k] for k in rows], self._timeout(len(rows))))
        except DaliBatchError:
            if len(rows) == 1:
                return {}, list(rows)
            half = len(rows) // 2
            (clips_a, bad_a), (clips_b, bad_b) = self._bisect(rows[:half], samples), self._bisect(rows[half:], samples)
            return {**clips_a, **clips_b}, bad_a + bad_b
        return {k: decoded.videos[j] for j, k in enumerate(rows)}, []


def _copied(decoded: DecodedBatch) -> DecodedBatch:
    """``decoded`` with its clips copied out of DALI's buffer (DALI may reuse it for the batches to come)."""
    videos = decoded.videos.clone()
    if videos.is_cuda:
        torch.cuda.current_stream(videos.device).synchronize()
    return dataclasses.replace(decoded, videos=videos, outputs=None, owned=True)  # DALI's buffers may go
