"""The fallback's worker processes live as long as the loader: across epochs, resumes and restarts.

Each test checks three things: the samples (every row shows the planned frames, flip and label, read
from the frame code, and equals what a fresh loader gives for the same epoch), which worker processes
ran (the same ones across passes, or new ones after a stop), and that none is left once they should be
gone.
"""

from __future__ import annotations

import gc
import shutil
import sys
import time
from pathlib import Path

import pytest
import torch

from daliload.failures import DecodeFailureWarning
from daliload.framecode import read_code
from daliload.loader import DecodeSpec, KineticsDALILoader
from daliload.plan import AugmentSpec, CropBox, OutputSpec, Sample
from fallback import make_fallback_loader
from fallback.dataset import FAULTS_ENV

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

RAW = OutputSpec(size=(48, 64), mean=(0, 0, 0), std=(1, 1, 1), dtype="float32")
WHOLE = AugmentSpec(crop_size=(48, 64), crop_mode="center", flip_prob=0.5)


def make_loader(root, **decode) -> KineticsDALILoader:
    return KineticsDALILoader(root, "train", batch_size=4, clip_len=6, frame_stride=3, augment=WHOLE, output=RAW,
                              decode=DecodeSpec(**decode))


def running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except FileNotFoundError:
        return False


def wait_gone(pids: list[int], seconds: float = 15.0, *, collect: bool = False) -> list[int]:
    """The pids still running after up to ``seconds`` (``collect``: running the garbage collector meanwhile,
    for a loader that a thread of its own, such as the plan drawn ahead, may still hold for a moment)."""
    deadline = time.monotonic() + seconds
    while any(running(p) for p in pids) and time.monotonic() < deadline:
        if collect:
            gc.collect()
        time.sleep(0.1)
    return [p for p in pids if running(p)]


def workers_of(loader: KineticsDALILoader) -> list[int]:
    return sorted(loader._fallback.worker_pids)


def epoch(loader, batches=None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    out = []
    for videos, labels in loader:
        out.append((videos.clone(), labels.clone()))
        if batches is not None and len(out) == batches:
            break
    return out


def check_rows(loader, got, first_batch: int = 0) -> None:
    """Every row shows its planned frames, flip and label (no failure in these tests)."""
    plan = loader.plan()[first_batch:]
    assert len(got) == len(plan)
    frames = {v.path: v.num_frames for v in loader.videos}
    for (videos, labels), batch in zip(got, plan):
        assert videos.shape[0] == len(batch)
        for k, sample in enumerate(batch):
            codes = [read_code(videos[k][:, t], layout="CHW") for t in range(videos.shape[2])]
            assert [c.index for c in codes] == sample.frame_indices(frames[sample.path]), sample.path
            assert all(c.flipped == sample.flip for c in codes), sample.path
            assert int(labels[k]) == sample.label


def same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(va, vb) and torch.equal(la, lb) for (va, la), (vb, lb) in zip(a, b))


@pytest.fixture(scope="module")
def root(small_kinetics) -> Path:
    return small_kinetics


def test_epochs_run_on_the_same_workers_and_give_a_fresh_loaders_samples(root):
    loader = make_loader(root)
    try:
        first = epoch(loader)
        pids = workers_of(loader)
        assert len(pids) == 2
        check_rows(loader, first)
        loader.set_epoch(1)
        second = epoch(loader)
        assert workers_of(loader) == pids  # no new processes for a new epoch
        check_rows(loader, second)
        assert loader.stats().clips_fallback > 0
        loader.set_epoch(0)
        # Epoch 2 was started ahead (epoch 1 followed epoch 0): going back to epoch 0 drops
        # it, and its workers with the decodes they were given; none is left behind.
        assert same(epoch(loader), first)
        assert set(workers_of(loader)).isdisjoint(pids) and wait_gone(pids) == []
        pids = workers_of(loader)
        loader.set_epoch(0)
        assert same(epoch(loader), first)  # a repeated epoch is not guessed past: same workers
        assert workers_of(loader) == pids
        fresh = make_loader(root)
        fresh.set_epoch(1)
        assert same(epoch(fresh), second)
        fresh.close()
    finally:
        loader.close()
    assert wait_gone(pids) == []
    assert workers_of(loader) == []


def test_the_next_epoch_starts_while_the_caller_trains_on_this_ones_last_batch(root):
    """Once epochs follow one another (set_epoch(e + 1)), the next one's first transfers go to the workers
    before this epoch's last batch is handed out, and set_epoch(e + 1) takes them over (same workers, a
    fresh loader's samples). Nothing is started ahead without that evidence, or from a pass left early."""
    loader = make_loader(root)

    def started_ahead() -> list[bool]:
        return [loader._fallback._ahead is not None for _ in loader]

    try:
        assert len(loader) > 1
        assert started_ahead() == [False] * len(loader)  # the first pass: which epoch comes next is unknown
        pids = workers_of(loader)
        loader.set_epoch(1)
        assert started_ahead() == [False] * (len(loader) - 1) + [True]
        loader.set_epoch(2)
        third = epoch(loader)
        assert workers_of(loader) == pids and loader._fallback._ahead is not None  # epoch 3's, by now
        check_rows(loader, third)
        fresh = make_loader(root)
        fresh.set_epoch(2)
        assert same(epoch(fresh), third)
        fresh.set_epoch(3)
        epoch(fresh, batches=len(fresh) - 1)
        assert fresh._fallback._ahead is None  # left before its last batch: nothing started ahead
        fresh.close()
        evaluation = KineticsDALILoader(root, "val", batch_size=4, clip_len=6, frame_stride=3, augment=WHOLE,
                                        output=RAW)
        for e in range(3):
            evaluation.set_epoch(e)
            epoch(evaluation)
        assert evaluation._fallback._ahead is None  # an evaluation split's next pass is not foreseen
        evaluation.close()
    finally:
        loader.close()
    assert wait_gone(pids) == []


def test_an_epoch_that_cannot_start_ahead_costs_this_one_nothing(root, monkeypatch, caplog):
    loader = make_loader(root)

    def broken(*args, **kwargs):
        raise OSError("no more processes")

    try:
        epoch(loader)
        loader.set_epoch(1)
        monkeypatch.setattr(loader._fallback, "warm", broken)
        with caplog.at_level("WARNING", logger="daliload.loader"):
            got = epoch(loader)  # its last batch still arrives
        check_rows(loader, got)
        assert "could not start epoch 2 ahead (OSError: no more processes)" in caplog.text
        loader.set_epoch(2)
        check_rows(loader, epoch(loader))  # started when asked for
    finally:
        loader.close()


def test_break_stops_the_workers_and_resume_gives_the_same_samples(root):
    loader = make_loader(root)
    try:
        loader.set_epoch(2)
        head = epoch(loader, batches=1)
        pids = workers_of(loader)
        assert len(pids) == 2
        state = loader.state_dict()
        loader.load_state_dict(state)
        rest = epoch(loader)  # resumes at the next batch, on new workers
        # The pass was abandoned with decodes in flight: its workers stopped rather than decode them for nothing.
        assert wait_gone(pids) == []
        assert set(workers_of(loader)).isdisjoint(pids) and len(workers_of(loader)) == 2
        check_rows(loader, head + rest)

        resumed = make_loader(root)
        resumed.load_state_dict(state)
        again = epoch(resumed)
        assert same(again, rest)
        resumed_pids = workers_of(resumed)
        del resumed  # garbage collection stops its workers
        assert wait_gone(resumed_pids, collect=True) == []
    finally:
        loader.close()


def test_a_crashed_worker_is_replaced_and_none_is_left_behind(root, tmp_path, monkeypatch):
    copy = tmp_path / "data"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns(".daliload"))
    probe = make_loader(copy)
    victim = sorted(v.path for v in probe.videos if v.route == "fallback")[0]
    monkeypatch.setenv(FAULTS_ENV, f"{victim}=segv")
    loader = make_loader(probe.manifest_path, max_failure_fraction=1.0)
    seen: set[int] = set()
    try:
        for epoch_index in range(2):
            loader.set_epoch(epoch_index)
            with pytest.warns(DecodeFailureWarning, match="worker deaths"):
                for _ in loader:
                    seen |= set(workers_of(loader))
            reasons = {f.path: f.reason for f in loader.stats().failures}
            assert reasons == {victim: "worker died (signal SIGSEGV) while decoding this sample"}
            assert loader.stats().replaced >= 1
    finally:
        loader.close()
    assert len(seen) > 2  # the crashed worker's pool was restarted
    assert wait_gone(sorted(seen)) == []


def test_a_standalone_loader_takes_a_new_plan_on_its_running_workers(make_clip):
    clips = [str(make_clip("h264", num_frames=40)), str(make_clip("vp9", num_frames=40))]

    def plan(offset: int) -> list[Sample]:
        return [Sample(100 + i, i % 2, clips[i % 2], i, (offset + 5 * i) % 20, 2, 4, CropBox.full(), flip=bool(i % 3))
                for i in range(7)]

    loader = make_fallback_loader(plan(0), RAW, batch_size=3, num_workers=2, prefetch_factor=1)
    try:
        list(loader)
        pids = sorted(loader.worker_pids)
        loader.set_plan(plan(7), batch_sizes=[1, 4, 2])
        batches = list(loader)
        assert sorted(loader.worker_pids) == pids
        assert [len(b.labels) for b in batches] == [1, 4, 2]
        assert torch.cat([b.positions for b in batches]).tolist() == [s.position for s in plan(7)]
        fresh = make_fallback_loader(plan(7), RAW, batch_size=7, num_workers=0)
        [whole] = list(fresh)
        assert torch.equal(torch.cat([b.videos for b in batches]), whole.videos)
        with pytest.raises(ValueError, match="add up to the 7 samples"):
            loader.set_plan(plan(1), batch_sizes=[3, 3])
    finally:
        loader.close()
    assert wait_gone(pids) == [] and loader.worker_pids == []


def test_the_next_epochs_plan_is_drawn_while_this_one_runs(root, monkeypatch):
    """The plan costs Python work per video; drawn ahead, it does not delay the next epoch's first batch."""
    import threading

    from daliload import loader as loader_mod

    drawn: list[tuple[int, str]] = []
    real = loader_mod.make_train_plan

    def recording(*args, epoch, **kwargs):
        drawn.append((epoch, threading.current_thread().name))
        return real(*args, epoch=epoch, **kwargs)

    monkeypatch.setattr(loader_mod, "make_train_plan", recording)
    loader = make_loader(root)
    try:
        first = epoch(loader)
        loader.set_epoch(1)
        second = epoch(loader)  # waits for the plan drawn ahead, if it is not ready yet
        by_passes = list(drawn)
        assert by_passes[0] == (0, "MainThread")
        assert (1, "daliload-plan-ahead") in by_passes and (1, "MainThread") not in by_passes
        check_rows(loader, second)  # loader.plan() gives the plan the pass used, not a second draw
        assert (1, "MainThread") not in drawn
        loader.set_epoch(0)
        check_rows(loader, first)
        loader.set_epoch(5)  # not the one drawn ahead: drawn when asked for, as before
        done = len(drawn)
        check_rows(loader, epoch(loader))
        assert drawn[done] == (5, "MainThread")
    finally:
        loader.close()


@pytest.mark.parametrize(("num_batches", "workers", "want"), [
    (8, 2, [4, 4] + [8] * 6 + [4, 4]),  # 7 whole shares after the first would leave one worker a batch more
    (7, 2, [4, 4] + [8] * 6),
    (6, 4, [2, 2, 2, 2] + [8] * 4 + [2, 2, 2, 2]),
    (1, 2, [4, 4]),
])
def test_transfers_split_the_first_share_and_even_out_the_last(num_batches, workers, want):
    """Workers take transfers in turn: the first batch is split over them, and no worker ends a pass alone."""
    from types import SimpleNamespace

    from daliload.epoch import EpochCounters, Routes, _FallbackStage
    from daliload.failures import FailureBudget

    class Workers:
        setup = SimpleNamespace(workers=SimpleNamespace(num_workers=workers))

        def iterate(self, key, samples, sizes):
            self.samples, self.sizes = samples, sizes
            return iter(())

    batches = [[Sample(8 * b + k, 0, "v.mp4", 0, 0, 1, 1, CropBox.full()) for k in range(8)]
               for b in range(num_batches)]
    stub = Workers()
    _FallbackStage(stub, batches, Routes([]), FailureBudget(0), EpochCounters())
    assert stub.sizes == want
    assert [s.position for s in stub.samples] == list(range(8 * num_batches))


def test_the_transfer_rule_is_one_function_benchmarks_can_call():
    from daliload.epoch import fallback_transfers

    assert fallback_transfers([4, 4, 4, 3], 2) == [[2, 2], [4], [4], [2, 1]]
    assert fallback_transfers([4, 4, 3], 2) == [[2, 2], [4], [3]]
    assert fallback_transfers([1, 2], 4) == [[1], [1, 1]]  # a share smaller than the workers: one clip each
    assert fallback_transfers([], 2) == []


def test_a_route_change_makes_a_fallback_share_started_ahead_stale():
    """The pass key holds the routes' version: it changes when a file leaves DALI or DALI is given up."""
    import warnings

    from daliload.epoch import DALI_FAILURE_STREAK, Routes

    routes = Routes(["a.mp4", "b.mp4"])
    first = routes.version
    routes.reroute({"c.mp4"})  # not a DALI file: nothing moves
    assert routes.version == first
    routes.reroute({"a.mp4"})
    second = routes.version
    assert second != first
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for _ in range(DALI_FAILURE_STREAK):
            routes.note_batch(blamed=False, reason="driver")
    assert routes.version not in (first, second)
