"""Where each sample of a pass goes: DALI, the fallback, or nowhere (:class:`Routes`, one per loader).

The one place a routing policy lives. A sample's *route* (the pre-screen's,
changed at run time when DALI fails on its file) says which decoders may take
it: a file of route ``dali`` may go to either (the fallback decodes everything
DALI can), any other only to the fallback. The *policy*
(``DecodeSpec.routing``) picks, per batch, which decoder takes each sample
that may go to either:

- ``"static"``: DALI, always (the pre-screen's routes as they are);
- ``"measured"`` (the default for training, on a GPU and where DALI decodes
  on the CPU sharing the cores with the fallback's workers): each codec to
  the decoder the run delivers more clips per second with, measured as it
  goes, the other tried now and then (:mod:`._speed` has the schedule);
- ``"adaptive"`` (the default only where DALI on the CPU and the fallback
  each have cores of their own): the fallback takes a share of them, steered
  batch by batch away from the decoder the pass has to wait for. The share
  starts at the fallback's part of both capacities (workers against DALI's
  threads times pipelines) and moves by :data:`SHARE_STEP` towards the
  decoder that kept up, whenever one made the pass wait more often than the
  other since the last batch (each source's :class:`~daliload.clips.SourceLoad`);
  after a step it holds for the batches already in flight (their split is
  older than the step). So while NVDEC is the bottleneck the fallback's idle
  workers take DALI's files, and where the fallback is the faster decoder
  (VP9 on a CPU host) it takes most of them; while the training step is the
  bottleneck nobody waits and the share stays.

A video's samples in a row (its views, its clips of repeated sampling) go to
one decoder together, and the share's fraction of a clip is carried to the
next batch. Either way a sample is decoded as the plan says (the same window,
crop and flip) and the batch keeps plan order: only which decoder produced a
clip can differ between runs.

Worked example: a share of 0.30 and batches of 8 DALI-route samples: the
fallback is owed 2.4 clips of the first batch and takes the last 2 (0.4
carried), 2.8 of the second and takes 3 (-0.2 carried), 2.2 of the third and
takes 2. If the pass then waited for DALI and not for the fallback, the share
becomes 0.34 and stays so for the batches in flight.
"""

from __future__ import annotations

import logging
import sqlite3
import time
import warnings
from collections import Counter
from typing import Callable, Literal, Sequence

import numpy as np

from daliload.clips import SourceLoad
from daliload.dataset import ROUTE_CODES, VideoIndex
from daliload.epoch._speed import CodecRoute, SpeedRouter
from daliload.failures import Failure
from daliload.plan import Sample

logger = logging.getLogger(__name__)

#: DALI batches in a row that fail with no single file to blame before DALI is given up for the run.
DALI_FAILURE_STREAK = 3

RoutingPolicy = Literal["adaptive", "static", "measured"]
ROUTING_POLICIES: tuple[str, ...] = ("adaptive", "static", "measured")
#: How far the fallback's share of DALI-route clips moves at a step, toward the decoder that kept up. Measured
#: on the simulation of ``tests/test_routing.py`` (prefetch 4): 0.04 came within 4-7 % of the sum of both
#: decoders' speeds; 0.08 and 0.15 overshot (8-15 % short), as did steps that grew while one decoder led.
SHARE_STEP = 0.04


class Routes:
    """Where each video goes, for the whole run, and which decoder takes each sample of a batch.

    Starts from the pre-screen's routes. A video that DALI alone fails on
    (found by isolating a failed batch) moves to the fallback from the next
    batch on; after :data:`DALI_FAILURE_STREAK` failed batches in a row with
    no single file to blame (a driver or library problem), DALI is given up
    for the run. A video whose decode killed a worker twice or ran past the
    time limit is not decoded again in this run (:meth:`quarantine`): its
    samples fail at once with that reason, and are replaced. Everything is
    keyed by ``Sample.video_index`` (no per-path lookup per sample).

    Args:
        on_dali: by ``Sample.video_index``, whether the video's route is
            ``dali`` (a boolean array over the split: no Python object per
            video); ``None`` (default): DALI is not used.
        policy: how samples that may go to either decoder are split
            (see the module docstring).
        lag: batches submitted ahead of the one collected (the pass's
            ``prefetch``): how many batches later a step of the share shows.
        codecs: reads the codec of each video, by ``video_index`` (the
            manifest's; ``daliload.prescreen.split_codecs``), when first needed:
            at the first batch with ``"measured"``, else at the first
            :meth:`decoders`; ``None``: every video's codec is ``""``.
        explicit: the user's choice behind ``policy`` and ``on_dali``
            (``"routing='static'"``, ``"decoder='fallback'"``), for
            :meth:`decoders`; ``None``: the defaults.
        clock: seconds, monotonic, of the measured policy (a test's virtual clock).
    """

    def __init__(self, on_dali: np.ndarray | None = None, *, policy: RoutingPolicy = "adaptive", lag: int = 1,
                 codecs: Callable[[], Sequence[str]] | None = None, explicit: str | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if policy not in ROUTING_POLICIES:
            raise ValueError(f"routing must be one of {', '.join(map(repr, ROUTING_POLICIES))}, got {policy!r}")
        self._on_dali = on_dali
        self.policy: RoutingPolicy = policy
        self.explicit = explicit
        self._read_codecs = codecs
        self._codes: np.ndarray | None = None  # codec group by video
        self._codec_names: list[str] = []
        self._clips_by_codec: Counter = Counter()  # (codec group, decoder) -> clips given ("measured")
        self._able_by_codec: tuple | None = None  # ((rerouted, disabled), per codec whether DALI may take any)
        #: the measured policy's state (``None`` under the others)
        self.speed = SpeedRouter(lag, clock=clock) if policy == "measured" else None
        self.rerouted: set[int] = set()  # video indices DALI failed on
        self.quarantined: dict[int, Failure] = {}  # video index -> the failure that put it there
        self.dali_disabled: str | None = None  # why DALI was given up, once it was
        self._streak = 0
        self._share: float | None = None  # of the DALI-route clips, the fallback's (adaptive)
        self._carry = 0.0  # the fraction of a clip the fallback is owed from the batches before
        self._waited = (0, 0)  # groups DALI, the fallback had made the pass wait for, at the last batch
        self._hold = 0  # batches to go before the next step
        self.lag = max(1, lag)
        self.last_moved = 0  # clips of the last batch assigned that DALI could take and the fallback got

    def uses_dali(self, sample: Sample) -> bool:
        """Whether DALI may decode ``sample`` (its route is ``dali``, DALI failed on neither it nor the run)."""
        return (self.dali_disabled is None and self._on_dali is not None and bool(self._on_dali[sample.video_index])
                and sample.video_index not in self.rerouted)

    def assign(self, batch: Sequence[Sample], rows: Sequence[int], dali: SourceLoad | None,
               fallback: SourceLoad) -> tuple[list[int], list[int]]:
        """Split ``rows`` of ``batch`` into ``(DALI's rows, the fallback's rows)``, by route and policy.

        Called once per batch, in submission order (the adaptive share steps here). How many
        of the fallback's rows were DALI's to take is left in ``last_moved``.

        Args:
            batch: the batch's samples.
            rows: the rows to decode (the others are known to fail).
            dali: DALI's load now; ``None``: DALI takes nothing this pass.
            fallback: the fallback's load now.
        """
        eligible = [k for k in rows if dali is not None and self.uses_dali(batch[k])]
        self.last_moved = 0
        if self.speed is not None:
            return self._by_speed(batch, rows, eligible)
        if self.policy == "static" or not eligible:
            taken = set(eligible)
            return eligible, [k for k in rows if k not in taken]
        self._steer(dali, fallback)
        units = _videos(batch, eligible)
        wanted = self._share * len(eligible) + self._carry  # clips for the fallback, carrying the fraction
        on_dali = set(eligible)
        to_dali, to_fallback = [], [k for k in rows if k not in on_dali]
        moved = 0
        for unit in reversed(units):  # the batch's last videos to the fallback, a video's samples together
            if moved + len(unit) <= wanted + 0.5 * len(unit):
                to_fallback += unit
                moved += len(unit)
            else:
                to_dali[:0] = unit
        self._carry = wanted - moved
        self.last_moved = moved
        return sorted(to_dali), sorted(to_fallback)

    def _by_speed(self, batch: Sequence[Sample], rows: Sequence[int], eligible: list[int]
                  ) -> tuple[list[int], list[int]]:  # fmt: skip
        """The measured policy: each codec's clips to the decoder :attr:`speed` picks for it."""
        codes, speed = self.codec_groups(), self.speed
        able = set(eligible)
        to_dali, to_fallback = [], []
        measured: set[int] = set()  # only codecs both decoders may take are measured
        for k in rows:
            video = batch[k].video_index
            group = int(codes[video]) if video < len(codes) else 0  # (no codec read: one codec, "")
            decoder = speed.decoder_for(group) if k in able else "fallback"
            (to_dali if decoder == "dali" else to_fallback).append(k)
            self._clips_by_codec[group, decoder] += 1
            if k in able:
                measured.add(group)
        speed.submitted(measured)
        self.last_moved = len(able) - len(to_dali)
        return to_dali, to_fallback

    def pass_started(self) -> None:
        """A pass begins (the measured policy's clock starts over: nothing is in flight)."""
        if self.speed is not None:
            self.speed.pass_started()

    def batch_done(self, clips: int) -> None:
        """The pass yields its next batch, of ``clips`` clips (what the measured policy times)."""
        if self.speed is not None:
            self.speed.batch_done(clips)

    def codec_groups(self) -> np.ndarray:
        """Each video's codec, as a number into the codec names (``""`` where unknown), read when first asked."""
        if self._codes is None:
            names: list[str] = []
            if self._read_codecs is not None:
                try:
                    names = list(self._read_codecs())
                except (OSError, sqlite3.Error, ValueError) as err:  # the manifest moved or broke since the start
                    logger.warning("could not read the videos' codecs from the manifest (%s): routing and "
                                   "stats().decoders take every video as one codec, ''", err)
            if not names and self._on_dali is not None:
                names = [""] * len(self._on_dali)
            numbers: dict[str, int] = {}
            self._codes = np.array([numbers.setdefault(n, len(numbers)) for n in names], np.int16)
            self._codec_names = list(numbers) or [""]
        return self._codes

    def decoders(self) -> tuple[CodecRoute, ...]:
        """Which decoder each codec goes to, and why (``LoaderStats.decoders``)."""
        codes = self.codec_groups()
        if not len(codes):
            return ()
        key = (len(self.rerouted), self.dali_disabled)
        if self._able_by_codec is None or self._able_by_codec[0] != key:  # per codec: may any file go to DALI
            able = np.zeros(len(codes), bool) if self._on_dali is None else self._on_dali.copy()
            if self.rerouted:
                able[list(self.rerouted)] = False
            self._able_by_codec = key, [bool(able[codes == g].any()) for g in range(len(self._codec_names))]
        out = []
        for group, name in enumerate(self._codec_names):
            clips = {d: self._clips_by_codec[group, d] for d in ("dali", "fallback")} if self.speed else {}
            if self.dali_disabled is not None or self._on_dali is None or not self._able_by_codec[1][group]:
                if self._on_dali is None and self.explicit:
                    route = CodecRoute(name, "fallback", "explicit", self.explicit, clips=clips)
                else:
                    why = ("DALI given up for this run" if self.dali_disabled else "DALI not in this run"
                           if self._on_dali is None else "route fallback")
                    route = CodecRoute(name, "fallback", "only decoder able", why, clips=clips)
            elif self.speed is not None:
                state = self.speed.codecs.get(group)
                decoder = state.choice if state is not None else "dali"
                on_trial = self.speed.trial is not None and self.speed.trial[0] == group
                detail = ("the faster by the clips/s measured" if state is not None and len(state.rates) == 2
                          else "measuring") + (f"; trying {self.speed.trial[1]} now" if on_trial else "")
                route = CodecRoute(name, decoder, "measured", detail, dict(state.rates) if state else {}, clips,
                                   state.trials if state else 0)
            else:
                decoder = "dali" if self.policy == "static" else "both"
                detail = self.explicit or f"routing {self.policy!r} (the default here)"
                route = CodecRoute(name, decoder, "explicit" if self.explicit else "default", detail)
            out.append(route)
        return tuple(out)

    def _steer(self, dali: SourceLoad, fallback: SourceLoad) -> None:
        """Step the fallback's share away from the decoder the pass waited for more often since the last batch."""
        if self._share is None:
            self._share = fallback.capacity / (fallback.capacity + dali.capacity)
        # (a source built again counts from 0: no step on its account)
        waited_dali, waited_fallback = max(0, dali.waited - self._waited[0]), max(0, fallback.waited - self._waited[1])
        self._waited = (dali.waited, fallback.waited)
        if self._hold > 0:  # the batches in flight were split before the last step: their waits are old news
            self._hold -= 1
            return
        direction = (waited_dali > waited_fallback) - (waited_fallback > waited_dali)  # +1: more to the fallback
        if direction:
            self._share = min(1.0, max(0.0, self._share + direction * SHARE_STEP))
            self._hold = self.lag

    def quarantine(self, failure: Failure, video_index: int) -> None:
        """Decode video ``video_index`` no more in this run, if ``failure`` crashed or hung a worker."""
        if failure.kind in ("crash", "timeout"):
            self.quarantined.setdefault(video_index, failure)

    def reroute(self, video_indices: set[int]) -> None:
        """Send these videos (of route ``dali``) to the fallback only, from now on."""
        self.rerouted |= video_indices

    def note_batch(self, *, blamed: bool, reason: str = "") -> None:
        """Count a failed DALI batch: ``blamed`` when isolation found the files at fault."""
        self._streak = 0 if blamed else self._streak + 1
        if self._streak >= DALI_FAILURE_STREAK and self.dali_disabled is None:
            self.dali_disabled = (f"{self._streak} DALI batches in a row failed with no single file to blame "
                                  f"(last: {reason})")
            warnings.warn(f"{self.dali_disabled}; the rest of this run decodes every file with the PyAV "
                          "fallback (loader.stats().dali_disabled)", RuntimeWarning, stacklevel=2)


def _videos(batch: Sequence[Sample], rows: Sequence[int]) -> list[list[int]]:
    """``rows`` in runs of one video (consecutive rows of the same ``video_index``): a decoder's unit."""
    units: list[list[int]] = []
    for k in rows:
        if units and units[-1][-1] == k - 1 and batch[k - 1].video_index == batch[k].video_index:
            units[-1].append(k)
        else:
            units.append([k])
    return units


def dali_videos(index: VideoIndex, max_pixels: int | None) -> np.ndarray:
    """By video, whether DALI decodes it: route ``dali`` and frames no larger than ``max_pixels``
    (``DecodeSpec.dali_max_pixels``; ``None``: any size). The start of :class:`Routes`."""
    on_dali = index.route == ROUTE_CODES["dali"]
    if max_pixels is not None:
        large = on_dali & (index.width.astype(np.int64) * index.height.astype(np.int64) > max_pixels)
        if large.any():
            on_dali &= ~large
            logger.info("%d video(s) of route dali are larger than dali_max_pixels=%d: the fallback decodes "
                        "them", int(large.sum()), max_pixels)
    return on_dali


def explicit_choice(decoder: str, routing: str) -> str | None:
    """The user's choice of decoder behind a run's routes (``DecodeSpec.decoder``, ``.routing``), as
    :meth:`Routes.decoders` names it; ``None`` for the defaults."""
    if decoder == "fallback":
        return "decoder='fallback'"
    return f"routing={routing!r}" if routing != "auto" else None
