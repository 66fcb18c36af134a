"""fallback.dataset: failed samples are replaced deterministically; hangs and dead workers cost one sample."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from daliload.framecode import read_clip
from daliload.plan import CropBox, OutputSpec, Sample
from daliload.failures import FailedVideo
from fallback import (
    ClipDataset,
    NoReplacementError,
    TooManyFailuresError,
    collate_clips,
    decode_sample,
    make_fallback_loader,
)

RAW = OutputSpec(size=(48, 64), mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0), dtype="float32", layout="CTHW")
CLIP_LEN, STRIDE = 4, 3


def plan(paths: list[str], starts: list[int] | None = None) -> list[Sample]:
    starts = starts or [(7 * i) % 40 for i in range(len(paths))]
    return [Sample(position=100 + i, video_index=i, path=str(p), label=i, start_frame=s, frame_stride=STRIDE,
                   clip_len=CLIP_LEN, crop=CropBox.full(), flip=bool(i % 2))
            for i, (p, s) in enumerate(zip(paths, starts))]


def expected_codes(sample: Sample, num_frames: int = 60) -> list[int]:
    return sample.frame_indices(num_frames)


@pytest.fixture(scope="module")
def files(tmp_path_factory, make_clip):
    root = tmp_path_factory.mktemp("loader_files")
    zero = root / "zero.mp4"
    zero.write_bytes(b"")
    garbage = root / "garbage.mp4"
    garbage.write_bytes(np.random.default_rng(1).integers(0, 256, 2048, dtype=np.uint8).tobytes())
    good = make_clip(codec="h264", num_frames=60, gop=25).read_bytes()
    truncated = root / "truncated.mp4"
    truncated.write_bytes(good[: len(good) // 3])
    return {
        "h264": str(make_clip(codec="h264", num_frames=60, gop=25)),
        "vp9": str(make_clip(codec="vp9", num_frames=60, gop=25)),
        "zero": str(zero), "garbage": str(garbage), "truncated": str(truncated),
    }


def test_decode_sample_is_decode_window_plus_plan(files):
    s = plan([files["h264"]], starts=[50])[0]
    video = decode_sample(s, RAW)
    assert video.shape == (3, CLIP_LEN, 48, 64)
    assert read_clip(video, layout="CTHW") == [50, 53, 56, 59]


def test_failed_slot_is_replaced_by_the_next_sample_that_decodes(files):
    paths = [files["h264"], files["zero"], files["garbage"], files["vp9"], files["truncated"]]
    samples = plan(paths)
    dataset = ClipDataset(samples, RAW)
    item = dataset[1]  # zero bytes -> garbage fails too -> slot 3 (vp9)
    assert (item.slot_position, item.position, item.label) == (101, 103, 3) and item.replaced
    assert [(f.path, f.position) for f in item.failures] == [(files["zero"], 101), (files["garbage"], 102)]
    assert item.failures[0].reason.startswith("cannot open")
    assert read_clip(item.video, layout="CTHW") == expected_codes(samples[3])
    last = dataset[4]  # the last slot wraps around to the start of the plan
    assert (last.position, last.slot_position) == (100, 104)
    again = ClipDataset(samples, RAW)[1]
    assert again.position == item.position and torch.equal(again.video, item.video)
    own = dataset[0]
    assert not own.replaced and own.failures == () and own.frames_decoded >= CLIP_LEN


def test_no_replacement_found_is_reported_with_the_failures(files):
    dataset = ClipDataset(plan([files["zero"], files["garbage"], files["truncated"]]), RAW,
                          max_replacement_tries=1)
    with pytest.raises(NoReplacementError, match=r"plan position 100: no decodable replacement") as info:
        dataset[0]
    assert [f.path for f in info.value.failures] == [files["zero"], files["garbage"]]


def test_too_many_failures_raise_listing_them(files):
    paths = [files["h264"], files["zero"], files["vp9"], files["garbage"], files["h264"], files["vp9"]]
    loader = make_fallback_loader(plan(paths), RAW, batch_size=2, num_workers=0, max_failures=1)
    too_many = r"2 of 4 videos failed to decode, more than max_failures=1"  # h264 and vp9 are planned twice
    with pytest.raises(TooManyFailuresError, match=too_many) as info, \
            pytest.warns(UserWarning, match="2 of 4 videos failed"):
        list(loader)
    assert re.search(re.escape(files["zero"]) + r" \(position 101\): cannot open", str(info.value))
    assert re.search(re.escape(files["garbage"]) + r" \(position 103\): cannot open", str(info.value))


def test_fork_is_refused_and_options_are_checked(files):
    with pytest.raises(ValueError, match="multiprocessing_context must be 'forkserver' or 'spawn', got 'fork'"):
        make_fallback_loader(plan([files["h264"]]), RAW, batch_size=1, multiprocessing_context="fork")
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        make_fallback_loader(plan([files["h264"]]), RAW, batch_size=0)


def test_broken_files_dead_and_hung_workers_cost_one_sample_each(files, realclips):
    """The whole contract, with real worker processes.

    Slots: good clips, every broken kind, the broken real clips, and three
    test-only faults (SIGKILL, a real segfault, a hang). The epoch must finish
    with full batches in plan order, every failure reported by path, and a
    second epoch on the persistent workers must give the same batches.
    """
    broken_real = [str(realclips / "mp4parse-rust/zero_empty_stsc.mp4"),
                   str(realclips / "mp4parse-rust/chunk_out_of_range.mp4"),
                   str(realclips / "decord/corrupted.mp4")]
    good, vp9 = files["h264"], files["vp9"]
    paths = [good, files["zero"], vp9, "fault:kill", good, broken_real[0], vp9, "fault:hang",
             good, files["garbage"], broken_real[1], vp9, "fault:segv", good, broken_real[2], files["truncated"],
             vp9, good]
    starts = [(7 * i) % 40 for i in range(len(paths))]
    starts[14] = 40  # corrupted.mp4 decodes its first frames; its damage starts before frame 40
    samples = plan(paths, starts)
    bad = {i for i, p in enumerate(paths) if p not in (good, vp9)}
    # spawn: a dead worker is seen at once (see the forkserver test below)
    loader = make_fallback_loader(samples, RAW, batch_size=4, num_workers=2, timeout_s=1.0,
                                  max_failures=len(bad), fault_injection=True, prefetch_factor=1,
                                  multiprocessing_context="spawn")
    try:
        for epoch in range(2):
            with pytest.warns(UserWarning, match=f"{len(bad)} of {len(set(paths))} videos failed to decode"):
                batches = list(loader)
            assert [len(b.labels) for b in batches] == [4, 4, 4, 4, 2]
            positions = torch.cat([b.positions for b in batches]).tolist()
            # each slot holds its own sample or, if that failed, the next good one
            want = [100 + next(j % len(paths) for j in range(i, i + len(paths)) if j % len(paths) not in bad)
                    for i in range(len(paths))]
            assert positions == want
            for batch in batches:
                assert batch.videos.shape[1:] == (3, CLIP_LEN, 48, 64)
                for video, label, position in zip(batch.videos, batch.labels.tolist(), batch.positions.tolist()):
                    assert label == position - 100
                    assert read_clip(video, layout="CTHW") == expected_codes(samples[position - 100])
            reasons = {f.path: f.reason for f in loader.failures}
            assert set(reasons) == {paths[i] for i in bad}
            assert reasons["fault:kill"] == "worker died (signal SIGKILL) while decoding this sample"
            assert reasons["fault:segv"] == "worker died (signal SIGSEGV) while decoding this sample"
            assert reasons["fault:hang"].startswith("timeout: decode still running after")
            assert reasons[files["zero"]].startswith("cannot open")
            stats = loader.stats()
            assert (stats.num_clips, stats.num_failures, stats.num_timeouts, stats.num_worker_deaths) == \
                   (len(paths), len(bad), 1, 2)
            assert stats.frames_used == CLIP_LEN * len(paths) and stats.frames_decoded >= stats.frames_used
            # the second pass skips what killed or hung a worker: no restart
            assert stats.num_restarts == (0 if epoch else stats.num_restarts)
            assert epoch == 1 or stats.num_restarts >= 1
    finally:
        loader.close()


def test_forkserver_worker_that_exits_costs_one_sample(files):
    # Forkserver workers are not our children: their death shows at torch's
    # 5-second status check ("exited unexpectedly"), not through SIGCHLD.
    paths = [files["h264"], files["vp9"], "fault:exit", files["h264"], files["vp9"], files["h264"]]
    samples = plan(paths)
    loader = make_fallback_loader(samples, RAW, batch_size=3, num_workers=1, max_failures=1,
                                  fault_injection=True, persistent_workers=False)
    with pytest.warns(UserWarning, match="1 of 3 videos failed to decode and were replaced "
                                         r"\(0 timeouts, 1 worker deaths, 1 worker restarts\)"):
        batches = list(loader)
    assert torch.cat([b.positions for b in batches]).tolist() == [100, 101, 103, 103, 104, 105]
    died = "worker died (exit code 3) while decoding this sample"
    assert loader.failures == [FailedVideo("fault:exit", died, (102,))]
    assert read_clip(batches[0].videos[2], layout="CTHW") == expected_codes(samples[3])


def test_tasks_carry_each_slots_replacement_candidates_and_skip_known_bad_samples():
    """Workers hold no plan: a batch's tasks share one window of candidates, long enough for the rule."""
    samples = [Sample(position=500 + i, video_index=i, path=f"v{i}.mp4", label=i, start_frame=0, frame_stride=1,
                      clip_len=2, crop=CropBox.full()) for i in range(100)]
    dataset = ClipDataset(samples, RAW, max_replacement_tries=16)
    tasks = dataset.tasks(4, 6)
    assert [t.offset for t in tasks] == [0, 1] and tasks[0].window is tasks[1].window
    assert [c.index for c in tasks[0].window] == list(range(4, 22))  # slot 5 and its 16 next candidates
    assert all(t.num_slots == 100 for t in tasks)
    # A sample that killed a worker is listed (it counts as a failure) but not decoded: the window grows by one.
    window = dataset.tasks(4, 6, known_bad={samples[10]: "worker died"})[0].window
    assert [c.index for c in window] == list(range(4, 23))
    assert [c.known_bad for c in window if c.known_bad] == ["worker died"]
    # The window wraps around the plan's end, and never holds more than the plan from the last slot.
    assert [c.index for c in dataset.tasks(98, 100)[0].window] == [98, 99] + list(range(0, 16))
    small = ClipDataset(samples[:3], RAW).tasks(1, 3)[0].window
    assert [c.index for c in small] == [1, 2, 0, 1]


def test_a_transfer_is_its_slots_decoded_one_by_one(files):
    """``SlotDecoder.__getitems__`` writes each clip into its row of one transfer; replacements included."""
    samples = plan([files["h264"], files["zero"], files["vp9"], files["h264"]])
    dataset = ClipDataset(samples, RAW)
    batch = dataset.slot_decoder().__getitems__(dataset.tasks(0, 3))
    one_by_one = [dataset[i] for i in range(3)]
    assert torch.equal(batch.videos, torch.stack([item.video for item in one_by_one]))
    assert batch.positions == (100, 102, 102) and batch.slot_positions == (100, 101, 102)  # slot 1 replaced
    assert [f.path for f in batch.failures] == [files["zero"]]
    assert collate_clips(batch) is batch  # the DataLoader's collate passes a ready transfer through


def test_collate_stacks_items_that_did_not_fill_their_rows(files):
    samples = plan([files["h264"], files["vp9"]])
    dataset = ClipDataset(samples, RAW)
    items = [dataset[0], dataset[1]]
    elsewhere = torch.zeros((2, *items[0].video.shape))
    batch = collate_clips(items, elsewhere)
    assert batch.videos is not elsewhere and torch.equal(batch.videos, torch.stack([i.video for i in items]))


def test_worker_transfers_arrive_in_shared_memory(files):
    loader = make_fallback_loader(plan([files["h264"], files["vp9"], files["h264"]]), RAW, batch_size=3,
                                  num_workers=1)
    try:
        (videos, _, positions), = list(loader)
    finally:
        loader.close()
    assert videos.is_shared() and positions.tolist() == [100, 101, 102]
    assert [read_clip(v, layout="CTHW") for v in videos] == [expected_codes(s) for s in loader.dataset.samples]
