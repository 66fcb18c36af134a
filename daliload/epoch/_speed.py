"""Routing by measured speed (policy ``"measured"``): each codec to the decoder the run is faster with.

Where DALI's CPU decoder and the fallback's workers share the machine's
cores, sending a clip to the other decoder adds no decoder, only contention;
what matters is which of the two is faster, and that depends on the codec,
the batch size, the crop, the GOP and the machine (VP9 with DALI on the CPU
was 0.85x the fallback on one set and 1.11x on another). So it is measured
as the run goes, per codec, and each codec's clips go to the faster decoder.
On a GPU the two have hardware of their own, but the first GPU visit (an
H200, DALI 2.4.0) found NVDEC through DALI the slower of the two on
Kinetics-sized H.264, against the fallback on the host's cores: there too the
faster is measured, not assumed.

What is measured: the run's clips per second while a setting holds (a
setting: which decoder takes each codec). The pass reports each batch as it
yields it (:meth:`SpeedRouter.batch_done`); a batch's time is the time since
the batch before (the decoders' pace when they hold the pass up, the
training step's when it does). A batch counts for its setting only when the
``lag`` batches before it and those in flight with it were routed the same,
so that a measurement is of one setting and not of the switch between two;
the first batch of a pass counts for none (its time holds the pass's start),
nor do the first ``lag`` batches of the run, nor the first measurement of
each decoder in the run (workers and pipelines start, lazily: the
fallback's workers often at its first trial, and a measurement that holds
their start would make the fallback look slower than it is until the next
trial, a gap away).
:data:`MEASURE_CLIPS` such clips make one measurement, which may span passes
(so that small epochs are measured too; the time between passes is in none).

The schedule, per codec that both decoders can take:

1. its table's decoder (DALI) until one measurement is in, then a *trial*:
   the fallback takes the codec until one measurement of that is in;
2. the faster of the two takes it (the other only when faster by more than
   :data:`SWITCH_MARGIN`), each measurement while it holds updating its rate
   (a running mean, half the weight on the newest);
3. a trial of the other decoder again: at once when a measurement of the
   chosen one falls below :data:`FALL` times its rate when it was chosen (the
   speeds changed: the other may now be faster), or when the chosen one's
   rate falls below the other's on record by more than :data:`SWITCH_MARGIN`
   (a slower drift, or a record of the other taken in a good moment: the
   trial measures it again, so a stale record costs one trial at most), else
   after a gap of batches that keeps trials at about :data:`TRIAL_COST` of the run's time at the
   measured ratio (a trial on a decoder 1.15x slower costs more than on one
   1.01x slower), between :data:`MIN_GAP_TRIALS` and :data:`MAX_GAP_TRIALS`
   trial lengths. One trial at a time.

Only which decoder makes a clip changes: a batch holds the plan's samples,
in plan order, with the same count on every rank, whatever is measured.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Literal

Decoder = Literal["dali", "fallback"]
DECODERS: tuple[Decoder, Decoder] = ("dali", "fallback")

#: Clips of counted batches that make one measurement of a setting.
MEASURE_CLIPS = 16
#: The other decoder takes a codec over only when its rate beats the chosen one's by this fraction.
SWITCH_MARGIN = 0.02
#: A measurement of the chosen decoder below this fraction of its rate when chosen starts a trial of the other.
FALL = 0.75
#: The share of the run's time the trials of the slower decoder are allowed (at the measured ratio).
TRIAL_COST = 0.03
#: Bounds of the gap between trials, in trial lengths.
MIN_GAP_TRIALS, MAX_GAP_TRIALS = 8, 64


@dataclass
class CodecRoute:
    """Where one codec's clips go, and why (an entry of ``LoaderStats.decoders``).

    Attributes:
        codec: the codec, as the pre-screen recorded it (``"vp9"``, ``"h264"``).
        decoder: ``"dali"``, ``"fallback"``, or ``"both"`` (the adaptive share).
        why: ``"measured"`` (by measured speed: ``rates``), ``"explicit"`` (the
            user's ``decoder=`` or ``routing=``: ``detail`` says which),
            ``"only decoder able"`` (route ``fallback``, or DALI not in this run),
            ``"default"`` (the default policy where it does not measure:
            ``detail`` says which).
        detail: a line for people.
        rates: measured clips/s of the run with this codec on each decoder
            (``{}`` unless ``why == "measured"``).
        clips: clips of the codec each decoder was given, this run.
        trials: trials of the decoder not chosen, this run.
    """

    codec: str
    decoder: str
    why: str
    detail: str = ""
    rates: dict[str, float] = field(default_factory=dict)
    clips: dict[str, int] = field(default_factory=dict)
    trials: int = 0

    def describe(self) -> str:
        rates = ", ".join(f"{d} {r:.1f}" for d, r in self.rates.items())
        counts = ", ".join(f"{d} {n}" for d, n in self.clips.items() if n)
        return (f"{self.codec or '?'}: {self.decoder} ({self.why}{': ' + self.detail if self.detail else ''}"
                f"{'; clips/s ' + rates if rates else ''}){'; clips ' + counts if counts else ''}")


@dataclass
class _Codec:
    choice: Decoder = "dali"
    rates: dict[str, float] = field(default_factory=dict)
    chosen_rate: float | None = None  # the chosen decoder's rate when it was chosen
    next_trial: int | None = None  # counted batches at which the other is tried again
    trials: int = 0


@dataclass
class _Window:
    clips: int = 0
    seconds: float = 0.0
    codecs: set[int] = field(default_factory=set)


class SpeedRouter:
    """The measured policy's state: per codec group, the decoder chosen, the rates measured, the trial under way.

    Args:
        lag: batches submitted ahead of the one collected (the pass's prefetch).
        clock: seconds, monotonic (a test's virtual clock).
    """

    def __init__(self, lag: int, *, clock: Callable[[], float] = time.perf_counter) -> None:
        self.lag = max(1, lag)
        self._clock = clock
        self.codecs: dict[int, _Codec] = {}
        self.trial: tuple[int, Decoder] | None = None  # (codec group, decoder) under trial
        self._setting = 0  # bumped whenever a codec's decoder changes
        self._window = _Window()
        self._pass: list[tuple[int, set[int]]] = []  # this pass's batches in submission order: (setting, codecs)
        self._done = 0  # this pass's batches yielded
        self._last: float | None = None  # when the last one was
        self.counted = 0  # batches counted, the run's: the clock of the trial schedule
        self._batch_clips = 1  # clips of the largest batch yet
        self._passes = 0  # passes begun
        self._warm: set[Decoder] = set()  # decoders measured once already (a decoder's first measurement is dropped)

    # -- at submission --------------------------------------------------------------------------

    def decoder_for(self, group: int) -> Decoder:
        """The decoder that takes codec ``group`` in the batch being submitted."""
        if self.trial is not None and self.trial[0] == group:
            return self.trial[1]
        return self.codecs.setdefault(group, _Codec()).choice

    def submitted(self, groups: set[int]) -> None:
        """A batch went out with clips of codec ``groups`` (those both decoders may take: the ones measured)."""
        self._pass.append((self._setting, set(groups)))

    # -- as the pass yields ----------------------------------------------------------------------

    def pass_started(self) -> None:
        """A new pass: nothing in flight; its first batch counts for no setting (a measurement under way goes
        on with the pass's counted batches: the time between passes is in none)."""
        self._pass, self._done, self._last = [], 0, self._clock()
        self._passes += 1

    def batch_done(self, clips: int) -> None:
        """The pass yields its next batch, of ``clips`` clips."""
        now = self._clock()
        i, self._done = self._done, self._done + 1
        seconds = now - self._last if self._last is not None else 0.0
        self._last = now
        if i >= len(self._pass):
            return
        self._batch_clips = max(self._batch_clips, clips)
        setting, groups = self._pass[i]
        around = self._pass[max(0, i - self.lag):i + self.lag]
        starting = i < (self.lag if self._passes == 1 else 1)
        if starting or setting != self._setting or any(s != setting for s, _ in around):
            return  # a pass (or the run) starting, a switch between settings, or a batch of an older setting
        w = self._window
        w.clips, w.seconds = w.clips + clips, w.seconds + seconds
        w.codecs |= groups
        self.counted += 1
        if w.clips >= MEASURE_CLIPS and w.seconds > 0:
            self._measured(w.clips / w.seconds, w.codecs)
            self._window = _Window()
        if self.trial is None:
            self._maybe_try()

    # -- the schedule ----------------------------------------------------------------------------

    @property
    def trial_batches(self) -> int:
        """Batches a trial lasts at least: its measurement's, and the switches in and out."""
        return -(-MEASURE_CLIPS // self._batch_clips) + 2 * self.lag - 1

    def _measured(self, rate: float, groups: set[int]) -> None:
        measured = {self.trial[1]} if self.trial is not None else {self.codecs.setdefault(g, _Codec()).choice
                                                                   for g in groups}
        if not measured <= self._warm:  # a decoder's first measurement of the run: its start (workers, pipelines)
            self._warm |= measured
            return
        if self.trial is not None:
            group, decoder = self.trial
            if group not in groups:
                return  # no clip of the codec on trial: this measured nothing about it
            codec = self.codecs[group]
            codec.rates[decoder] = rate
            self.trial = None
            self._decide(group)
            return
        for group in groups:
            codec = self.codecs.setdefault(group, _Codec())
            old = codec.rates.get(codec.choice)
            mine = codec.rates[codec.choice] = rate if old is None else 0.5 * (old + rate)
            theirs = codec.rates.get(_other(codec.choice))
            if codec.chosen_rate is not None and rate < FALL * codec.chosen_rate:
                codec.next_trial = self.counted  # the speeds changed: try the other now
            elif theirs is not None and theirs > mine * (1 + SWITCH_MARGIN):
                codec.next_trial = self.counted  # the other's rate on record beats this one's now: see if it holds

    def _decide(self, group: int) -> None:
        codec = self.codecs[group]
        other = _other(codec.choice)
        mine, theirs = codec.rates.get(codec.choice), codec.rates.get(other)
        if mine is not None and theirs is not None and theirs > mine * (1 + SWITCH_MARGIN):
            codec.choice, mine, theirs = other, theirs, mine
        codec.chosen_rate = mine
        ratio = mine / theirs if mine and theirs else 1.0
        gap = self.trial_batches * (ratio - 1) / TRIAL_COST
        gap = min(MAX_GAP_TRIALS * self.trial_batches, max(MIN_GAP_TRIALS * self.trial_batches, gap))
        codec.next_trial = self.counted + int(gap)
        self._setting += 1
        self._window = _Window()

    def _maybe_try(self) -> None:
        """Start the trial that is due first, if any: a codec measured on one decoder only, or past its gap."""
        due = [(0 if _other(c.choice) not in c.rates else 1, c.next_trial or 0, g) for g, c in self.codecs.items()
               if c.rates.get(c.choice) is not None
               and (_other(c.choice) not in c.rates or (c.next_trial is not None and self.counted >= c.next_trial))]
        if not due:
            return
        group = min(due)[2]
        codec = self.codecs[group]
        codec.trials += 1
        self.trial = (group, _other(codec.choice))
        self._setting += 1
        self._window = _Window()


def _other(decoder: Decoder) -> Decoder:
    return "fallback" if decoder == "dali" else "dali"
