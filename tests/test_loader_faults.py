"""Faults driven through KineticsDALILoader itself: what the user gets when files break after the scan,
a decode crashes or hangs, or DALI itself hangs or fails on everything.

Every test checks the epoch (full batches, or the named error), ``stats()`` (the file is named), and
the pixels: each row shows exactly the frames and label of the sample that fills its slot (the slot's
own, or its replacement's), read from the frame-index code painted in every generated frame.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from daliload.epoch import PADDING_LABEL
from daliload.failures import DecodeFailureWarning
from daliload.framecode import read_code
from daliload.loader import DecodeSpec, KineticsDALILoader
from daliload.dali import DaliBatchError, DaliTimeoutError
from daliload.plan import AugmentSpec, OutputSpec
from daliload.testing import inject_faults

RAW = OutputSpec(size=(48, 64), mean=(0, 0, 0), std=(1, 1, 1), dtype="float32")
WHOLE = AugmentSpec(crop_size=(48, 64), crop_mode="center", flip_prob=0.5)


@pytest.fixture
def root(small_kinetics, tmp_path) -> Path:
    """A private copy of the small dataset (tests break its files), scanned on first use."""
    copy = tmp_path / "data"
    shutil.copytree(small_kinetics, copy, ignore=shutil.ignore_patterns(".daliload"))
    return copy


def make_loader(root, split="train", **decode) -> KineticsDALILoader:
    decode.setdefault("max_failure_fraction", 1.0)
    # Each DALI-route file to DALI (the faults here are DALI's to meet); adaptive routing's faults are in
    # tests/test_routing_loader.py.
    decode.setdefault("routing", "static")
    return KineticsDALILoader(root, split, batch_size=4, clip_len=6, frame_stride=3, augment=WHOLE, output=RAW,
                              decode=DecodeSpec(**decode))


def routes(loader) -> dict[str, list[str]]:
    by_route: dict[str, list[str]] = {"dali": [], "fallback": []}
    for video in sorted(loader.videos, key=lambda v: v.path):
        by_route[video.route].append(video.path)
    return by_route


def check_epoch(loader, batches) -> None:
    """Full batches; every row shows the frames, flip and label of the sample that fills its slot."""
    plan = loader.plan()
    assert len(batches) == len(plan) == len(loader)
    stats = loader.stats()
    used = dict(stats.replacements)
    by_position = {s.position: s for b in plan for s in b}
    frames = {v.path: v.num_frames for v in loader.videos}
    masked = loader.split != "train"
    for (videos, labels), batch in zip(batches, plan):
        assert videos.shape[0] == len(batch)
        for k, slot in enumerate(batch):
            sample = by_position[used.get(slot.position, slot.position)]
            clip = videos[k]
            codes = [read_code(clip[:, t], layout="CHW") for t in range(clip.shape[1])]
            assert [c.index for c in codes] == sample.frame_indices(frames[sample.path]), slot.path
            assert all(c.flipped == sample.flip for c in codes), slot.path
            replaced = slot.position in used
            want = PADDING_LABEL if (masked and (replaced or slot.is_padding)) else sample.label
            assert int(labels[k]) == want, slot.path


def epoch(loader) -> list:
    with pytest.warns(DecodeFailureWarning) as record:
        batches = [(v.clone(), lab.clone()) for v, lab in loader]
    assert len([w for w in record if issubclass(w.category, DecodeFailureWarning)]) == 1
    return batches


def test_dali_file_truncated_and_fallback_file_deleted_after_the_scan(root):
    loader = make_loader(root)
    paths = routes(loader)
    dali_victim, fallback_victim = paths["dali"][0], paths["fallback"][0]
    data = Path(dali_victim).read_bytes()
    Path(dali_victim).write_bytes(data[: len(data) // 10])  # truncated after the scan
    Path(fallback_victim).unlink()  # deleted after the scan
    batches = epoch(loader)
    check_epoch(loader, batches)
    stats = loader.stats()
    assert {dali_victim, fallback_victim} <= {f.path for f in stats.failures}
    assert stats.rerouted == (dali_victim,)
    assert stats.clips_redecoded >= 1 and stats.isolation_s > 0
    # Its batch-mates stayed with DALI: every other DALI-route clip was DALI's.
    dali_slots = sum(s.path in paths["dali"] for b in loader.plan() for s in b)
    victim_slots = sum(s.path == dali_victim for b in loader.plan() for s in b)
    assert stats.clips_dali == dali_slots - victim_slots


def test_a_fifo_put_in_a_videos_place_fails_that_video_at_once_on_both_routes(root):
    """A FIFO blocks open() and read() until a writer comes: DALI's reader thread (which no time limit can
    interrupt, and which the interpreter's exit waits for), the cut and the fallback must refuse it unread."""
    loader = make_loader(root)
    paths = routes(loader)
    victims = paths["dali"][0], paths["fallback"][0]
    for victim in victims:
        Path(victim).unlink()
        os.mkfifo(victim)
    try:
        batches = epoch(loader)
        check_epoch(loader, batches)
        failures = {f.path: f.reason for f in loader.stats().failures}
        for victim in victims:
            assert "not a regular file: it is a FIFO" in failures[victim], failures
    finally:
        loader.close()


def test_a_batch_failure_that_names_no_file_is_isolated_by_halves(root):
    """DALI's 'memory file' errors name no sample: bisection finds the file, its batch-mates stay DALI's."""
    loader = make_loader(root)
    paths = routes(loader)
    victim = paths["dali"][1]
    Path(victim).write_bytes(b"\x1aE\xdf\xa3garbage" * 200)
    decoder = loader.sources.dali().decoder
    real_result = decoder.result

    def anonymous(*args, **kwargs):
        try:
            return real_result(*args, **kwargs)
        except DaliBatchError as err:
            raise DaliBatchError(err.samples, 'Failed to create video decoder for "memory file"') from err

    decoder.result = anonymous
    batches = epoch(loader)
    check_epoch(loader, batches)
    stats = loader.stats()
    assert stats.rerouted == (victim,) and stats.dali_disabled is None
    assert victim in {f.path for f in stats.failures}
    dali_slots = sum(s.path in paths["dali"] for b in loader.plan() for s in b)
    victim_slots = sum(s.path == victim for b in loader.plan() for s in b)
    assert stats.clips_dali == dali_slots - victim_slots
    # From then on the file goes to the fallback: no DALI batch fails again.
    loader.set_epoch(1)
    check_epoch(loader, epoch(loader))
    assert loader.stats().clips_redecoded == 0 and loader.stats().isolation_s == 0


def test_crash_and_hang_inside_a_redecode_cost_one_sample_each(root):
    loader = make_loader(root, timeout_s=2.0)
    paths = routes(loader)
    crash, hang = paths["dali"][0], paths["dali"][2]
    for path in (crash, hang):
        Path(path).write_bytes(b"not a video" * 100)  # fails in DALI: decoded again outside it
    inject_faults(loader, {crash: "segv", hang: "hang"})
    started = time.monotonic()
    batches = epoch(loader)
    assert time.monotonic() - started < 300  # a hang bound: the injected hang never ends by itself
    check_epoch(loader, batches)
    reasons = {f.path: f.reason for f in loader.stats().failures}
    assert reasons[crash] == "worker died (signal SIGSEGV) while decoding this sample"
    assert reasons[hang].startswith("timeout: decode still running after 3 s")


def test_a_dali_batch_that_never_finishes_fails_loudly_naming_its_files(root):
    loader = make_loader(root, timeout_s=0.5)
    decoder = loader.sources.dali().decoder
    released = threading.Event()
    decoder._pipe.outputs = lambda: released.wait(600)  # DALI stuck inside a library call, far past any bound
    try:
        first_dali_batch = next(b for b in loader.plan() if any(s.path in routes(loader)["dali"] for s in b))
        started = time.monotonic()
        with pytest.raises(DaliTimeoutError, match=r"DALI did not finish a batch of \d+ clip\(s\) within") as info:
            list(loader)
        assert time.monotonic() - started < 120  # a hang bound: the stuck call would take 600 s
        dali_paths = [s.path for s in first_dali_batch if s.path in routes(loader)["dali"]]
        assert all(p in str(info.value) for p in dali_paths)
        with pytest.raises(RuntimeError, match="unusable"):
            decoder.submit(first_dali_batch[:1])
    finally:
        released.set()  # so that this test process does not exit through the stuck-DALI exit hook


def test_dali_failing_everything_is_given_up_for_the_run(root):
    """No libnvcuvid, a broken driver: every batch fails with no file to blame."""
    loader = make_loader(root)

    def broken():
        raise RuntimeError('Failed to create video decoder for "memory file"')

    loader.sources.dali().decoder._pipe.outputs = broken
    with pytest.warns(RuntimeWarning, match=r"3 DALI batches in a row failed with no single file to blame"):
        batches = [(v.clone(), lab.clone()) for v, lab in loader]
    check_epoch(loader, batches)
    stats = loader.stats()
    assert stats.dali_disabled.startswith("3 DALI batches in a row") and stats.failures == ()
    assert stats.rerouted == () and stats.clips_dali == 0
    assert "DALI given up for this run" in stats.format()


def test_evaluation_masks_a_failed_sample_instead_of_scoring_another_video_twice(root):
    loader = make_loader(root, "val", max_failure_fraction=1.0)
    victim = routes(loader)["fallback"][0] if routes(loader)["fallback"] else routes(loader)["dali"][0]
    Path(victim).unlink()
    batches = epoch(loader)
    check_epoch(loader, batches)
    stats = loader.stats()
    victim_slots = sum(s.path == victim and not s.is_padding for b in loader.plan() for s in b)
    assert stats.clips_masked >= victim_slots >= 1
    labels = [int(x) for _, lab in batches for x in lab]
    assert labels.count(PADDING_LABEL) == stats.clips_masked + sum(
        s.is_padding and s.path != victim for b in loader.plan() for s in b)


def test_a_broken_video_counts_once_whatever_its_views_or_padding_repeats(root):
    """The failure limit counts videos: 30 views of one broken file, or a file repeated to pad the last
    batch, are one failed video, named once (default limit: 5 % of the videos, at least one)."""
    views = KineticsDALILoader(root, "val", batch_size=2, clip_len=4, frame_stride=2, crop_size=(48, 64),
                               augment=WHOLE, output=RAW, views=(10, 3))
    victim = views.plan()[0][0].path
    Path(victim).unlink()
    with pytest.warns(DecodeFailureWarning, match=r"1 of \d+ videos failed to decode and were masked"):
        assert len([lab for _, lab in views]) == len(views)
    stats = views.stats()
    assert [f.path for f in stats.failures] == [victim]
    assert stats.failures[0].positions == tuple(range(30))  # every view of the video, one entry
    assert stats.format().count(victim) == 1

    train = KineticsDALILoader(root, "train", batch_size=len(views.videos) + 1, clip_len=4, frame_stride=2,
                               crop_size=(48, 64), augment=WHOLE, output=RAW)
    padded = [s for b in train.plan() for s in b if s.is_padding]
    assert padded, "the last batch must be padded for this test"
    repeated = next(s.path for b in train.plan() for s in b if s.position == 0)
    Path(repeated).unlink()
    with pytest.warns(DecodeFailureWarning, match=r"1 of \d+ videos failed to decode and were replaced"):
        assert len(list(train)) == len(train)
    [failed] = train.stats().failures
    assert failed.path == repeated and 0 in failed.positions and padded[0].position in failed.positions
