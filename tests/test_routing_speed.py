"""Routing by measured speed (policy ``"measured"``, ``daliload/epoch/_speed.py``) on a virtual clock.

Two decoders of set speeds, fed by the pass's schedule (prefetch, collect in
plan order), time counted in virtual seconds: nothing here depends on how
busy the machine is. What is checked: the codec's clips go to the faster
decoder within a few batches, the slower one is still tried now and then,
a change of speeds is followed, two codecs each find their own decoder, and
what ``Routes.decoders`` (``loader.stats().decoders``) says. The loader's
own run with DALI's CPU decoder and a slowed decoder is in
``tests/test_routing_measured.py``.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest

from daliload.epoch import Routes
from daliload.epoch._speed import SpeedRouter
from daliload.plan import CropBox, Sample


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Decoder:
    """One slot, FIFO; a clip of codec ``c`` takes ``clip_s[c]`` virtual seconds (changeable mid-run)."""

    def __init__(self, clock: Clock, clip_s: dict[str, float]) -> None:
        self.clock, self.clip_s = clock, clip_s
        self.free_at = 0.0
        self.done_at: dict[int, float] = {}
        self.clips: dict[str, int] = {}
        self._next = 0

    def submit(self, rows: list[Sample]) -> int:
        ticket, self._next = self._next, self._next + 1
        for s in rows:
            codec = s.path.split(".")[0]
            self.free_at = max(self.free_at, self.clock.now) + self.clip_s[codec]
            self.clips[codec] = self.clips.get(codec, 0) + 1
        self.done_at[ticket] = self.free_at
        return ticket

    def collect(self, ticket: int) -> None:
        self.clock.now = max(self.clock.now, self.done_at.pop(ticket))


def plan(n: int, codecs: tuple[str, ...] = ("vp9",)) -> list[Sample]:
    return [Sample(position=i, video_index=i, path=f"{codecs[i % len(codecs)]}.{i}.webm", label=0, start_frame=0,
                   frame_stride=1, clip_len=1, crop=CropBox.full(), flip=False) for i in range(n)]


def make_routes(samples: list[Sample], clock: Clock, lag: int) -> Routes:
    names = [s.path.split(".")[0] for s in samples]
    return Routes(np.ones(len(samples), bool), policy="measured", lag=lag, codecs=lambda: names, clock=clock)


def run(routes: Routes, samples: list[Sample], dali: Decoder, fallback: Decoder, *, batch: int = 4,
        prefetch: int = 2, at_batch=None) -> list[dict[str, int]]:
    """One pass; per batch, the clips each decoder was given. ``at_batch(i)`` runs before batch ``i`` is collected."""
    batches = [samples[i:i + batch] for i in range(0, len(samples), batch)]
    queue: deque = deque()
    given = []
    routes.pass_started()
    for i in range(len(batches)):
        while len(queue) < min(len(batches) - i, prefetch):
            b = batches[i + len(queue)]
            to_dali, to_fallback = routes.assign(b, range(len(b)), object(), object())
            given.append({"dali": len(to_dali), "fallback": len(to_fallback)})
            queue.append([(d, d.submit([b[k] for k in rows])) for d, rows in ((dali, to_dali), (fallback, to_fallback))
                          if rows])
        if at_batch is not None:
            at_batch(i)
        for d, ticket in queue.popleft():
            d.collect(ticket)
        routes.batch_done(len(batches[i]))
    return given


def settled_after(given: list[dict[str, int]], faster: str) -> int:
    """The first batch from which the faster decoder took every clip for at least 8 batches in a row."""
    for i in range(len(given) - 8):
        if all(g[faster] == sum(g.values()) for g in given[i:i + 8]):
            return i
    return len(given)


@pytest.mark.parametrize("faster", ["dali", "fallback"])
def test_the_codec_goes_to_the_faster_decoder_within_a_few_batches(faster):
    clock = Clock()
    samples = plan(2000)
    speeds = {"dali": 0.05, "fallback": 0.05}
    speeds[faster] = 0.02
    dali, fallback = Decoder(clock, {"vp9": speeds["dali"]}), Decoder(clock, {"vp9": speeds["fallback"]})
    routes = make_routes(samples, clock, lag=2)
    given = run(routes, samples, dali, fallback)
    trial = routes.speed.trial_batches
    # one measurement on DALI (the table's), a trial of the fallback, then the faster: about three trials' length
    assert settled_after(given, faster) <= 3 * trial + 2, given[:40]
    (route,) = routes.decoders()
    assert (route.codec, route.decoder, route.why) == ("vp9", faster, "measured")
    assert route.rates[faster] > 2 * route.rates["dali" if faster == "fallback" else "fallback"]
    assert sum(route.clips.values()) == len(samples)
    slower = "dali" if faster == "fallback" else "fallback"
    # the slower is still tried now and then (about every 200 batches at this ratio, 2.5), at a small cost
    assert route.trials >= 2
    assert route.clips[slower] < 0.1 * len(samples), route.clips
    assert "vp9: " + faster in route.describe() and "measured" in route.describe()


@pytest.mark.parametrize("before, after, first, then, within", [
    # the speeds swap mid-pass: the clips follow
    ({"dali": 0.05, "fallback": 0.02}, {"dali": 0.02, "fallback": 0.05}, "fallback", "dali", 4),
    # DALI drifts to 0.8x its rate when chosen (above FALL) and below the fallback's rate on record: the fallback
    # is tried at once, not a gap of eight trial lengths (MIN_GAP_TRIALS) later
    ({"dali": 0.020, "fallback": 0.022}, {"dali": 0.025, "fallback": 0.022}, "dali", "fallback", 3),
], ids=["swap", "drift below the other's record"])
def test_a_change_of_speeds_mid_run_is_followed(before, after, first, then, within):
    clock = Clock()
    samples = plan(1600)
    dali, fallback = Decoder(clock, {"vp9": before["dali"]}), Decoder(clock, {"vp9": before["fallback"]})
    routes = make_routes(samples, clock, lag=2)
    change_at = 150

    def change(i: int) -> None:
        if i == change_at:
            dali.clip_s["vp9"], fallback.clip_s["vp9"] = after["dali"], after["fallback"]
    given = run(routes, samples, dali, fallback, at_batch=change)
    assert settled_after(given[:change_at], first) < change_at - 20
    assert settled_after(given[change_at:], then) <= within * routes.speed.trial_batches, \
        given[change_at:change_at + 60]
    assert routes.decoders()[0].decoder == then


def test_two_codecs_each_find_their_own_decoder():
    """VP9 faster on the fallback, VP8 faster on DALI (half the clips each): each goes its own way."""
    clock = Clock()
    samples = plan(2000, codecs=("vp9", "vp8"))
    dali = Decoder(clock, {"vp9": 0.05, "vp8": 0.01})
    fallback = Decoder(clock, {"vp9": 0.01, "vp8": 0.05})
    routes = make_routes(samples, clock, lag=2)
    run(routes, samples, dali, fallback, batch=8)
    by_codec = {r.codec: r for r in routes.decoders()}
    assert (by_codec["vp9"].decoder, by_codec["vp8"].decoder) == ("fallback", "dali")
    assert fallback.clips["vp9"] > 0.8 * 1000 and dali.clips["vp8"] > 0.8 * 1000


def test_when_the_training_step_sets_the_pace_the_choice_holds():
    """Both decoders keep up with a slow step: the rates come out equal, and DALI (the table's) keeps the codec."""
    clock = Clock()
    samples = plan(400)
    dali, fallback = Decoder(clock, {"vp9": 0.01}), Decoder(clock, {"vp9": 0.012})
    routes = make_routes(samples, clock, lag=2)
    batches = [samples[i:i + 4] for i in range(0, 400, 4)]
    routes.pass_started()
    queue: deque = deque()
    for i in range(len(batches)):
        while len(queue) < min(len(batches) - i, 2):
            b = batches[i + len(queue)]
            to_dali, to_fallback = routes.assign(b, range(4), object(), object())
            queue.append([(d, d.submit([b[k] for k in rows])) for d, rows in ((dali, to_dali), (fallback, to_fallback))
                          if rows])
        for d, ticket in queue.popleft():
            d.collect(ticket)
        clock.now += 1.0  # the training step, much slower than either decoder
        routes.batch_done(4)
    (route,) = routes.decoders()
    assert route.decoder == "dali" and route.rates["dali"] == pytest.approx(route.rates["fallback"], rel=0.01)


def test_every_batch_keeps_its_samples_and_files_only_the_fallback_can_take_never_reach_dali():
    clock = Clock()
    samples = plan(400)
    on_dali = np.arange(400) % 3 != 0  # every third video is of route fallback
    names = ["vp9"] * 400
    routes = Routes(on_dali, policy="measured", lag=2, codecs=lambda: names, clock=clock)
    dali, fallback = Decoder(clock, {"vp9": 0.01}), Decoder(clock, {"vp9": 0.05})
    batches = [samples[i:i + 4] for i in range(0, 400, 4)]
    routes.pass_started()
    for b in batches:
        to_dali, to_fallback = routes.assign(b, range(4), object(), object())
        assert sorted(to_dali + to_fallback) == [0, 1, 2, 3]
        assert not any(b[k].video_index % 3 == 0 for k in to_dali)
        for d, rows in ((dali, to_dali), (fallback, to_fallback)):
            if rows:
                d.collect(d.submit([b[k] for k in rows]))
        routes.batch_done(4)
    assert routes.decoders()[0].decoder == "dali"


def test_no_batch_of_a_pass_start_or_a_switch_is_counted():
    """The first ``lag`` batches of the run and the first of each later pass measure nothing."""
    clock = Clock()
    speed = SpeedRouter(lag=2, clock=clock)
    speed.pass_started()
    for _ in range(4):
        speed.decoder_for(0)
        speed.submitted({0})
    for _ in range(2):  # the pass's first two: not counted
        clock.now += 1.0
        speed.batch_done(4)
    assert speed.counted == 0
    for _ in range(2):  # counted (MEASURE_CLIPS, 16, make a measurement)
        speed.submitted({0})
        clock.now += 1.0
        speed.batch_done(4)
    assert speed.counted == 2 and speed.codecs[0].rates == {}  # 8 clips: not a measurement yet
    # a later pass: only its first batch is left out (small epochs are measured too)
    speed.pass_started()
    for _ in range(4):
        speed.submitted({0})
    for _ in range(4):
        clock.now += 1.0
        speed.batch_done(4)
    # its batches 1 and 2 complete a measurement (16 clips over two passes), DALI's first of the run: its start,
    # dropped; batch 3 begins the next
    assert speed.counted == 5 and speed.trial is None and speed.codecs[0].rates == {}
    for _ in range(3):
        speed.submitted({0})
        clock.now += 1.0
        speed.batch_done(4)
    # 16 clips in 4 s: DALI's rate, and the fallback's trial begins
    assert speed.counted == 8 and speed.trial == (0, "fallback")
    assert speed.codecs[0].rates == {"dali": pytest.approx(4.0)}


def test_a_decoders_first_measurement_of_the_run_holds_its_start_and_is_dropped():
    """DALI's pipelines decode their first clips slowly (their warm-up outlasts the run's first ``lag`` batches):
    measured then, DALI would lose to a fallback it beats, and keep the warm-up's rate on record until a trial
    a long gap away."""
    clock = Clock()
    samples = plan(600)

    class WarmingUp(Decoder):
        def submit(self, rows):
            warm = sum(self.clips.values()) < 24  # the run's first 24 clips: three times as slow
            self.clip_s["vp9"] = 0.060 if warm else 0.020
            return super().submit(rows)
    dali, fallback = WarmingUp(clock, {"vp9": 0.020}), Decoder(clock, {"vp9": 0.022})
    routes = make_routes(samples, clock, lag=2)
    given = run(routes, samples, dali, fallback)
    (route,) = routes.decoders()
    assert route.decoder == "dali" and route.rates["dali"] == pytest.approx(50.0, rel=0.05), route
    assert settled_after(given, "dali") <= 4 * routes.speed.trial_batches, given[:40]




def test_a_codec_only_the_fallback_takes_is_never_tried_nor_measured():
    """H.264 beside VP9 on the CPU: H.264's clips always go to the fallback ("only decoder able"); only VP9 has
    trials."""
    clock = Clock()
    samples = plan(800, codecs=("vp9", "h264"))
    names = [s.path.split(".")[0] for s in samples]
    on_dali = np.array([n == "vp9" for n in names])
    routes = Routes(on_dali, policy="measured", lag=2, codecs=lambda: names, clock=clock)
    dali, fallback = Decoder(clock, {"vp9": 0.05, "h264": 0.0}), Decoder(clock, {"vp9": 0.01, "h264": 0.01})
    run(routes, samples, dali, fallback, batch=8)
    by_codec = {r.codec: r for r in routes.decoders()}
    assert (by_codec["h264"].decoder, by_codec["h264"].why) == ("fallback", "only decoder able")
    assert by_codec["h264"].clips == {"dali": 0, "fallback": 400} and "h264" not in dali.clips
    assert (by_codec["vp9"].decoder, by_codec["vp9"].why) == ("fallback", "measured")
    assert list(routes.speed.codecs) == [routes.codec_groups()[0]]  # VP9's group alone


def test_a_manifest_that_cannot_be_read_leaves_one_codec_and_routing_goes_on(caplog):
    import sqlite3

    def unreadable():
        raise sqlite3.OperationalError("unable to open database file")

    samples = plan(8)
    routes = Routes(np.ones(8, bool), policy="measured", lag=2, codecs=unreadable, clock=Clock())
    routes.pass_started()
    assert routes.assign(samples[:4], range(4), object(), object()) == ([0, 1, 2, 3], [])
    assert "could not read the videos' codecs" in caplog.text
    assert [(r.codec, r.decoder, r.why) for r in routes.decoders()] == [("", "dali", "measured")]
    # DALI not in the run (decoder="fallback") and no codec read: everything to the fallback, nothing to report
    routes = Routes(None, policy="measured", lag=2, codecs=unreadable, clock=Clock())
    assert routes.assign(samples[:4], range(4), None, object()) == ([], [0, 1, 2, 3])
    assert routes.decoders() == ()
