"""The fallback's worker processes live as long as the loader: across epochs, resumes and restarts.

Each test checks three things: the samples (every row shows the planned frames, flip and label, read
from the frame code, and equals what a fresh loader gives for the same epoch), which worker processes
ran (the same ones across passes, or new ones after a stop), and that none is left once they should be
gone.
"""

from __future__ import annotations

import gc
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers.procs import proc_state, running

from daliload.failures import DecodeFailureWarning
from daliload.framecode import read_code
from daliload.loader import DecodeSpec, KineticsDALILoader
from daliload.plan import AugmentSpec, CropBox, OutputSpec, Sample
from daliload.testing import inject_faults
from fallback import FallbackSource

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

RAW = OutputSpec(size=(48, 64), mean=(0, 0, 0), std=(1, 1, 1), dtype="float32")
WHOLE = AugmentSpec(crop_size=(48, 64), crop_mode="center", flip_prob=0.5)


def make_loader(root, **decode) -> KineticsDALILoader:
    decode.setdefault("routing", "static")  # loaders compared batch for batch: each clip's decoder pinned
    return KineticsDALILoader(root, "train", batch_size=4, clip_len=6, frame_stride=3, augment=WHOLE, output=RAW,
                              decode=DecodeSpec(**decode))


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
    return sorted(loader.sources.fallback.worker_pids)


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
        assert same(epoch(loader), first)  # any epoch, in any order, on the same workers
        assert workers_of(loader) == pids
        loader.set_epoch(0)
        assert same(epoch(loader), first)
        assert workers_of(loader) == pids
        fresh = make_loader(root)
        fresh.set_epoch(1)
        assert same(epoch(fresh), second)
        fresh.close()
    finally:
        loader.close()
    assert wait_gone(pids) == []
    assert workers_of(loader) == []


def test_break_drops_the_pass_decodes_and_resume_gives_the_same_samples(root):
    loader = make_loader(root)
    try:
        loader.set_epoch(2)
        head = epoch(loader, batches=1)
        pids = workers_of(loader)
        assert len(pids) == 2
        state = loader.state_dict()
        loader.load_state_dict(state)
        rest = epoch(loader)  # resumes at the next batch
        # The pass was abandoned with decodes in flight: they were dropped, not the workers, which serve on.
        assert workers_of(loader) == pids
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


def test_a_crashed_worker_is_replaced_and_none_is_left_behind(root):
    loader = make_loader(root, max_failure_fraction=1.0)
    victim = sorted(v.path for v in loader.videos if v.route == "fallback")[0]
    inject_faults(loader, {victim: "segv"})
    first = loader.sources.fallback.start()  # started now, so that the first ones are seen before any crash
    seen: set[int] = set(first)
    try:
        for epoch_index in range(2):
            loader.set_epoch(epoch_index)
            with pytest.warns(DecodeFailureWarning, match="worker deaths"):
                for _ in loader:
                    seen |= set(workers_of(loader))
            reasons = {f.path: f.reason for f in loader.stats().failures}
            assert reasons == {victim: "worker died (signal SIGSEGV) while decoding this sample"}
            assert loader.stats().replaced >= 1
        seen_after = set(workers_of(loader))
    finally:
        loader.close()
    assert len(seen) > 2 and set(first) - seen_after  # the crashed workers were replaced
    assert loader.stats().quarantined == (victim,)  # not decoded again after the first epoch
    assert wait_gone(sorted(seen)) == []


def test_the_fallback_source_takes_any_plan_on_its_running_workers(make_clip):
    clips = [str(make_clip("h264", num_frames=40)), str(make_clip("vp9", num_frames=40))]

    def plan(offset: int) -> list[Sample]:
        return [Sample(100 + i, i % 2, clips[i % 2], i, (offset + 5 * i) % 20, 2, 4, CropBox.full(), flip=bool(i % 3))
                for i in range(7)]

    source = FallbackSource(RAW, workers=2)
    try:
        source.collect(source.submit(plan(0)))
        pids = sorted(source.worker_pids)
        groups = [plan(7)[:1], plan(7)[1:5], plan(7)[5:]]
        got = [source.collect(ticket) for ticket in [source.submit(group) for group in groups]]
        assert sorted(source.worker_pids) == pids
        assert [len(d.videos) for d in got] == [1, 4, 2] and all(d.failures == {} for d in got)
        here = FallbackSource(RAW, workers=0)
        whole = here.collect(here.submit(plan(7)))
        assert torch.equal(torch.cat([d.videos for d in got]), whole.videos)
        with pytest.raises(ValueError, match="a group needs at least one sample"):
            source.submit([])
    finally:
        source.close()
    assert wait_gone(pids) == [] and source.worker_pids == []


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




@pytest.fixture(scope="module")
def busy_root(tmp_path_factory) -> Path:
    """H.264 clips that keep two workers busy for seconds an epoch (320x240, 4 s, a keyframe every 250)."""
    from daliload.synth import SynthSpec, generate_dataset

    root = tmp_path_factory.mktemp("busy")
    generate_dataset(root, SynthSpec(num_classes=2, clips_per_class=7, val_fraction=0.15, width=320, height=240,
                                     duration_s=4.0, codec_mix={"h264": 1.0}, seed=5), workers=2, progress=False)
    return root


def test_workers_killed_from_outside_at_random_cost_no_file_and_no_batch(busy_root):
    """What the OOM killer does: SIGKILL fallback workers at random moments over 20 epochs of clean files.

    A decode whose worker a signal killed is tried once more on a fresh worker, and a worker killed
    between decodes is replaced: the run finishes, every batch is full and exact, no file is blamed.
    Most kills hit a worker while it decodes (it is running on a CPU); the next kill waits until the
    killed worker's replacement has run a while, so that a second try is never killed too (a file
    that kills two workers is the culprit, by design).
    """
    import os
    import random
    import signal
    import threading

    loader = KineticsDALILoader(busy_root, "train", batch_size=4, clip_len=16, frame_stride=4, augment=WHOLE,
                                output=RAW, decode=DecodeSpec(routing="static"))
    stop, kills = threading.Event(), []

    def killer() -> None:
        rng = random.Random(7)
        while not stop.wait(rng.uniform(0.05, 0.2)):
            pids = workers_of(loader)
            if len(pids) < 2 or set(pids) & set(kills):
                continue  # a replacement is starting
            busy = [pid for pid in pids if proc_state(pid) == "R"]
            victim = rng.choice(busy or pids)
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                continue
            kills.append(victim)
            while not stop.is_set() and (len(workers_of(loader)) < 2 or victim in workers_of(loader)):
                time.sleep(0.01)
            stop.wait(0.3)  # the replacement runs the killed decode again, unharmed

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    seen: set[int] = set()
    try:
        for epoch_index in range(20):
            loader.set_epoch(epoch_index)
            got = epoch(loader)
            seen |= set(workers_of(loader))
            check_rows(loader, got)
            stats = loader.stats()
            assert stats.failures == () and stats.replaced == 0 and stats.quarantined == ()
    finally:
        stop.set()
        thread.join()
        loader.close()
    assert len(kills) >= 5, f"only {len(kills)} kills: the epochs ran too fast to test anything"
    assert wait_gone(sorted(seen | set(kills))) == []
