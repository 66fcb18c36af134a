"""The router (daliload.epoch.Routes.assign) and the sources' load (daliload.clips.LoadMeter).

Three levels, no video: the policy's arithmetic; a simulation on a virtual
clock of two decoders of set speeds fed by the pass's schedule (prefetch,
collect in plan order), where throughput is counted in virtual seconds, so
nothing here depends on how busy the machine is; and two threaded test
doubles of set speeds under the real :class:`EpochPass`, which check plan
order, every sample once, determinism of the clips and a source that stops
answering. The loader's own run with DALI's CPU decoder is in
``tests/test_routing_loader.py``.
"""

from __future__ import annotations

import threading
import time
from collections import deque

import numpy as np
import pytest
import torch

from daliload.clips import Decoded, LoadMeter, SourceLoad
from daliload.epoch import EpochPass, PassSetup, Routes
from daliload.failures import FailureBudget
from daliload.options import DecodeSpec
from daliload.plan import CropBox, OutputSpec, Sample
from daliload.runtime import usable_cores


RAW = OutputSpec(size=(2, 2), mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0), dtype="float32", layout="CTHW")


def samples(n: int, *, views: int = 1, on_dali: np.ndarray | None = None) -> list[Sample]:
    """``n`` samples, ``views`` in a row per video (positions 0..n-1)."""
    return [Sample(position=i, video_index=i // views, path=f"v{i // views}.webm", label=i % 7, start_frame=0,
                   frame_stride=1, clip_len=1, crop=CropBox.full(), flip=False, view=i % views)
            for i in range(n)]


# -- the policy ---------------------------------------------------------------------------------------


def test_the_worked_example_of_the_module_docstring():
    """A share of 0.30: of batches of 8 the fallback takes the last 2, then 3, then 2 (the fraction carried)."""
    routes = Routes(np.ones(8, bool))
    routes._share = 0.30
    load = SourceLoad(0, 4)
    taken = [routes.assign(samples(8), range(8), load, load)[1] for _ in range(3)]
    assert taken == [[6, 7], [5, 6, 7], [6, 7]]


def test_the_share_steps_away_from_the_decoder_waited_for_and_holds_for_the_batches_in_flight():
    routes = Routes(np.ones(8, bool), lag=2)
    fallback_share = []
    dali_waits = [0, 1, 2, 3, 4, 5, 6, 7]  # the pass waits for DALI at every batch
    for waited in dali_waits:
        to_dali, to_fallback = routes.assign(samples(8), range(8), SourceLoad(8, 12, waited), SourceLoad(2, 4, 0))
        fallback_share.append(routes._share)
    assert fallback_share[0] == pytest.approx(0.25)  # the capacities: 4 workers against 12 threads
    assert fallback_share == pytest.approx([0.25, 0.29, 0.29, 0.29, 0.33, 0.33, 0.33, 0.37])  # a step, then 2 held
    for waited in range(8, 12):  # now the fallback is waited for, and DALI no more
        routes.assign(samples(8), range(8), SourceLoad(8, 12, 7), SourceLoad(2, 4, waited))
    assert routes._share == pytest.approx(0.33)


def test_static_sends_every_dali_route_sample_to_dali_however_busy():
    on_dali = np.array([True, False, True, True])
    routes = Routes(on_dali, policy="static")
    to_dali, to_fallback = routes.assign(samples(4), range(4), SourceLoad(1000, 1, 500), SourceLoad(0, 64))
    assert (to_dali, to_fallback) == ([0, 2, 3], [1]) and routes.last_moved == 0


def test_fallback_only_files_never_go_to_dali_even_when_dali_idles():
    on_dali = np.array([False, True, False, False, True, False])
    routes = Routes(on_dali)
    for waited in range(20):  # the pass waits for the fallback every time
        to_dali, to_fallback = routes.assign(samples(6), range(6), SourceLoad(0, 64), SourceLoad(500, 1, waited))
        assert set(to_dali) <= {1, 4} and {0, 2, 3, 5} <= set(to_fallback)
        assert sorted(to_dali + to_fallback) == list(range(6))
        assert routes.last_moved == len(set(to_fallback) & {1, 4})  # only DALI's own clips count as moved
    assert to_dali == [1, 4] and routes.last_moved == 0


def test_a_rerouted_video_and_a_disabled_dali_leave_only_the_fallback():
    routes = Routes(np.ones(4, bool))
    routes.reroute({2})
    load = SourceLoad(0, 1)
    to_dali, to_fallback = routes.assign(samples(4), [0, 1, 2, 3], load, load)
    assert 2 in to_fallback and 2 not in to_dali
    routes.dali_disabled = "three failed batches"
    assert routes.assign(samples(4), [0, 1, 2, 3], load, load) == ([], [0, 1, 2, 3])
    assert Routes(np.ones(4, bool)).assign(samples(4), [0, 1, 2, 3], None, load) == ([], [0, 1, 2, 3])


def test_a_videos_views_go_to_one_decoder_together():
    batch = samples(12, views=3)  # 4 videos of 3 views
    routes = Routes(np.ones(4, bool))
    to_dali, to_fallback = routes.assign(batch, range(12), SourceLoad(0, 4), SourceLoad(0, 4))
    assert (to_dali, to_fallback) == ([0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11])


def test_before_any_wait_the_capacities_split_a_batch():
    """1 DALI thread and 1 worker: half each, the batch's last clips to the fallback."""
    routes = Routes(np.ones(8, bool))
    assert routes.assign(samples(4), range(4), SourceLoad(0, 1), SourceLoad(0, 1)) == ([0, 1], [2, 3])
    assert routes.last_moved == 2


def test_routing_is_a_decode_option_checked_up_front():
    spec = DecodeSpec()
    assert spec.routing == "auto"
    # on a GPU: measured (the first GPU visit found NVDEC through DALI the slower of the two; which is faster is
    # measured, not assumed), whatever the cores
    assert (spec.routing_for("train", "gpu", 32), spec.routing_for("val", "gpu", 32)) == ("measured", "static")
    assert DecodeSpec(dali_threads=1, fallback_workers=1).routing_for("train", "gpu", 8) == "measured"
    cores = usable_cores()
    # DALI on the CPU: adaptive only when its threads and the workers each have cores of their own
    assert DecodeSpec(dali_threads=1, fallback_workers=1).routing_for("train", "cpu", 8) == \
        ("adaptive" if cores >= 2 else "static")
    # sharing the cores: each codec to the decoder measured faster; static on the other splits
    assert DecodeSpec(dali_threads=cores, fallback_workers=2).routing_for("train", "cpu", 8) == "measured"
    assert DecodeSpec().routing_for("train", "cpu", 8) == "measured"
    assert DecodeSpec().routing_for("val", "cpu", 8) == "static"
    assert DecodeSpec(routing="static").routing_for("train", "cpu", 8) == "static"  # as asked
    assert DecodeSpec(routing="adaptive", dali_threads=cores).routing_for("val", "cpu", 8) == "adaptive"  # as asked
    assert DecodeSpec(routing="adaptive", fallback_workers=0).routing_for("train", "gpu", 8) == "static"
    with pytest.raises(ValueError, match="routing must be 'auto', 'adaptive' or 'static', got 'fastest'"):
        DecodeSpec(routing="fastest")
    with pytest.raises(ValueError, match="routing must be one of 'adaptive', 'static', 'measured'"):
        Routes(None, policy="round-robin")


# -- the load meter -----------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_meter_counts_clips_in_flight_and_the_collects_that_waited():
    clock = Clock()
    meter = LoadMeter(2, clock=clock)
    meter.submitted(0, 4)
    meter.submitted(1, 3)
    assert meter.load() == SourceLoad(7, 2, 0)
    clock.now = 1.0
    meter.collected(0, asked_at=0.5)  # waited from 0.5 to 1.0
    assert meter.load() == SourceLoad(3, 2, 1)
    meter.collected(1, asked_at=1.0)  # ready when asked
    assert meter.load() == SourceLoad(0, 2, 1)
    meter.collected(1, asked_at=0.0)  # collected twice (or cancelled): nothing counted
    meter.submitted(2, 3)
    meter.dropped()  # a pass abandoned: nothing in flight any more
    assert meter.load() == SourceLoad(0, 2, 1)
    assert LoadMeter(0).capacity == 1  # workers=0 still decodes one clip at a time


# -- a simulation on a virtual clock -----------------------------------------------------------------


class SimSource:
    """A decoder of ``slots`` parallel slots, each taking ``clip_s`` virtual seconds a clip, FIFO."""

    def __init__(self, clock: Clock, slots: int, clip_s: float, *, stall: tuple[float, float] | None = None) -> None:
        self.clock, self.clip_s = clock, clip_s
        self.free_at = [0.0] * slots
        self.meter = LoadMeter(slots, clock=clock)
        self.done_at: dict[int, float] = {}
        self.stall = stall  # (from, to): no clip starts in this interval
        self.clips = 0
        self._next = 0

    def submit(self, rows: list[Sample]) -> int:
        ticket, self._next = self._next, self._next + 1
        self.meter.submitted(ticket, len(rows))
        end = self.clock.now
        for _ in rows:
            slot = min(range(len(self.free_at)), key=self.free_at.__getitem__)
            start = max(self.free_at[slot], self.clock.now)
            if self.stall and self.stall[0] <= start < self.stall[1]:
                start = self.stall[1]
            self.free_at[slot] = start + self.clip_s
            end = max(end, self.free_at[slot])
        self.done_at[ticket] = end
        self.clips += len(rows)
        return ticket

    def collect(self, ticket: int) -> None:
        asked = self.clock.now
        self.clock.now = max(self.clock.now, self.done_at.pop(ticket))
        self.meter.collected(ticket, asked)


def simulate(routes: Routes, n: int, dali: SimSource, fallback: SimSource, *, batch: int = 8, prefetch: int = 4,
             step_s: float = 0.0) -> tuple[float, list[int]]:
    """The pass's schedule over ``n`` samples: ``(virtual seconds, clips DALI took per batch)``."""
    plan = samples(n)
    batches = [plan[i:i + batch] for i in range(0, n, batch)]
    clock = dali.clock
    queue: deque = deque()
    taken = []
    for i in range(len(batches)):
        while len(queue) < min(len(batches) - i, prefetch):
            b = batches[i + len(queue)]
            to_dali, to_fallback = routes.assign(b, range(len(b)), dali.meter.load(), fallback.meter.load())
            taken.append(len(to_dali))
            queue.append([(source, source.submit([b[k] for k in rows])) for source, rows in
                          ((dali, to_dali), (fallback, to_fallback)) if rows])
        for source, ticket in queue.popleft():
            source.collect(ticket)
        clock.now += step_s  # the training step
    return clock.now, taken


@pytest.mark.parametrize("dali_slots, fallback_slots", [(3, 2), (1, 1), (2, 6)])
def test_two_busy_decoders_deliver_about_the_sum_of_their_rates(dali_slots, fallback_slots):
    """Each slot decodes 10 clips a virtual second: adaptive comes within 10 % of the sum, static is DALI's."""
    n = 2400
    clock = Clock()
    elapsed, _ = simulate(Routes(np.ones(n, bool), lag=8), n, SimSource(clock, dali_slots, 0.1),
                          SimSource(clock, fallback_slots, 0.1), batch=8, prefetch=8)
    rate = n / elapsed
    assert rate >= 0.9 * 10 * (dali_slots + fallback_slots), rate
    clock = Clock()
    static, _ = simulate(Routes(np.ones(n, bool), policy="static"), n, SimSource(clock, dali_slots, 0.1),
                         SimSource(clock, fallback_slots, 0.1), batch=8, prefetch=8)
    assert n / static == pytest.approx(10 * dali_slots, rel=0.05)


def test_a_faster_fallback_takes_most_of_the_dali_route_samples():
    """VP9 on a CPU host: the fallback twice DALI's speed takes about two thirds."""
    n = 1200
    clock = Clock()
    dali, fallback = SimSource(clock, 1, 0.1), SimSource(clock, 1, 0.05)
    elapsed, taken = simulate(Routes(np.ones(n, bool), lag=4), n, dali, fallback, batch=8, prefetch=4)
    assert fallback.clips / n == pytest.approx(2 / 3, abs=0.07)
    assert n / elapsed >= 0.9 * 30


def test_when_the_training_step_is_the_bottleneck_nothing_is_lost_and_both_keep_up():
    n = 400
    clock = Clock()
    dali, fallback = SimSource(clock, 4, 0.1), SimSource(clock, 2, 0.1)
    elapsed, taken = simulate(Routes(np.ones(n, bool), lag=4), n, dali, fallback, batch=8, prefetch=4, step_s=1.0)
    assert dali.clips + fallback.clips == n
    assert elapsed == pytest.approx(len(taken) * 1.0, rel=0.05)  # the step's pace: the decoders never held it up


def test_a_stalled_decoder_is_drained_and_nothing_is_lost():
    """DALI starts no clip for 20 virtual seconds: the pass waits for the batches it holds (it yields in plan
    order), then goes on; every sample is decoded once and both queues drain."""
    n = 1600
    clock = Clock()
    dali, fallback = SimSource(clock, 4, 0.1, stall=(10.0, 30.0)), SimSource(clock, 2, 0.1)
    elapsed, _ = simulate(Routes(np.ones(n, bool), lag=4), n, dali, fallback, batch=8, prefetch=4)
    assert dali.clips + fallback.clips == n and dali.clips > 0 and fallback.clips > 0
    assert not dali.done_at and not fallback.done_at  # drained: nothing left in either queue
    assert elapsed < 20 + n / 60 * 1.1  # the stall, then both at about their sum again


# -- threaded test doubles under the real pass ---------------------------------------------------------


class TimedSource:
    """A :class:`~daliload.clips.ClipSource` double: ``slots`` threads, ``clip_s`` seconds a clip; a clip is
    filled with its sample's position (so where each clip came from can be checked)."""

    def __init__(self, name: str, slots: int, clip_s: float) -> None:
        self.name, self.clip_s = name, clip_s
        self.meter = LoadMeter(slots)
        self.jobs: deque = deque()
        self.results: dict[int, Decoded] = {}
        self.decoded: list[int] = []
        self.lock = threading.Condition()
        self.paused = threading.Event()
        self.paused.set()
        self._next = 0
        self._stop = False
        self.threads = [threading.Thread(target=self._work, daemon=True) for _ in range(slots)]
        for t in self.threads:
            t.start()
        self.pending_tickets: dict[int, list] = {}

    def _work(self) -> None:
        """Decode the oldest clip queued: sleep, then fill its row with its sample's position."""
        while True:
            with self.lock:
                while not self.jobs and not self._stop:
                    self.lock.wait()
                if self._stop:
                    return
                ticket, row, sample = self.jobs.popleft()
            self.paused.wait()
            time.sleep(self.clip_s)
            with self.lock:
                group = self.pending_tickets.get(ticket)
                if group is None:
                    continue  # cancelled
                group[1][row].fill_(float(sample.position))
                group[2] -= 1
                self.decoded.append(sample.position)
                self.lock.notify_all()

    def submit(self, rows, *, urgent: bool = False) -> int:
        rows = list(rows)
        with self.lock:
            ticket, self._next = self._next, self._next + 1
            self.pending_tickets[ticket] = [rows, torch.zeros(len(rows), 3, 1, 2, 2), len(rows)]
            for k, sample in enumerate(rows):
                self.jobs.append((ticket, k, sample))
            self.meter.submitted(ticket, len(rows))
            self.lock.notify_all()
        return ticket

    def collect(self, ticket: int) -> Decoded:
        asked = time.perf_counter()
        with self.lock:
            while self.pending_tickets[ticket][2] > 0:
                self.lock.wait()
            _, videos, _ = self.pending_tickets.pop(ticket)
        self.meter.collected(ticket, asked)
        return Decoded(videos, {})

    def cancel(self) -> None:
        with self.lock:
            self.jobs.clear()
            self.pending_tickets.clear()
            self.meter.dropped()

    def load(self) -> SourceLoad:
        with self.lock:
            return self.meter.load()

    def close(self) -> None:
        with self.lock:
            self._stop = True
            self.lock.notify_all()


def run_pass(routes: Routes, n: int, dali: TimedSource, fallback: TimedSource, batch: int = 8):
    plan = samples(n)
    batches = [plan[i:i + batch] for i in range(0, n, batch)]
    setup = PassSetup(output=RAW, device=torch.device("cpu"), label_padding=False, mask_failed=False, prefetch=4,
                      num_frames=lambda video: None)
    passing = EpochPass(setup, batches, plan, routes=routes, budget=FailureBudget(n), fallback=fallback, dali=dali)
    got = [(videos[:, 0, 0, 0, 0].tolist(), labels.tolist()) for videos, labels, _ in passing]
    return plan, batches, got, passing.counters


@pytest.fixture
def sources():
    made = []

    def make(name, slots, clip_s):
        made.append(TimedSource(name, slots, clip_s))
        return made[-1]
    yield make
    for s in made:
        s.close()


def test_both_doubles_are_used_and_every_clip_is_the_plans_in_plan_order(sources):
    n = 240
    dali, fallback = sources("dali", 2, 0.004), sources("fallback", 1, 0.004)
    plan, batches, got, counters = run_pass(Routes(np.ones(n, bool), lag=4), n, dali, fallback)
    assert [clip for clips, _ in got for clip in clips] == [float(s.position) for s in plan]  # order and content
    assert [label for _, labels in got for label in labels] == [s.label for s in plan]
    assert sorted(dali.decoded + fallback.decoded) == list(range(n))  # each sample decoded once
    assert counters.clips_dali == len(dali.decoded) and counters.clips_fallback == len(fallback.decoded)
    assert counters.clips_moved == len(fallback.decoded)  # every sample was of route dali
    # both did a fair share: the fallback has a third of the slots
    assert 0.1 <= len(fallback.decoded) / n <= 0.6, len(fallback.decoded)


def test_static_routing_leaves_the_fallback_idle(sources):
    n = 64
    dali, fallback = sources("dali", 2, 0.002), sources("fallback", 1, 0.002)
    plan, _, got, counters = run_pass(Routes(np.ones(n, bool), policy="static"), n, dali, fallback)
    assert fallback.decoded == [] and counters.clips_moved == 0 and counters.clips_dali == n
    assert [clip for clips, _ in got for clip in clips] == [float(s.position) for s in plan]


def test_a_double_that_stops_answering_for_a_while_loses_no_sample(sources):
    """DALI's double pauses mid-pass: the pass waits for what it holds, the fallback takes what comes next,
    and every clip still arrives, in plan order, once."""
    n = 160
    dali, fallback = sources("dali", 2, 0.003), sources("fallback", 1, 0.003)

    def pause_then_resume():
        while len(dali.decoded) < 20:
            time.sleep(0.001)
        dali.paused.clear()
        time.sleep(0.5)
        dali.paused.set()
    pauser = threading.Thread(target=pause_then_resume)
    pauser.start()
    plan, _, got, _ = run_pass(Routes(np.ones(n, bool), lag=4), n, dali, fallback)
    pauser.join()
    assert [clip for clips, _ in got for clip in clips] == [float(s.position) for s in plan]
    assert sorted(dali.decoded + fallback.decoded) == list(range(n))
