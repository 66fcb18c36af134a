"""fallback.source and the epoch pass's replacement loop: failed samples are replaced deterministically;
hangs and dead workers cost one sample; clips come back in shared memory."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from daliload.epoch import EpochCounters, EpochPass, PassSetup, Routes
from daliload.failures import FailedVideo, FailureBudget
from daliload.framecode import read_clip
from daliload.plan import CropBox, OutputSpec, Sample
from daliload.testing import inject_faults
from fallback import FallbackSource, NoReplacementError, TooManyFailuresError, decode_sample
from fallback.options import FallbackOptions

RAW = OutputSpec(size=(48, 64), mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0), dtype="float32", layout="CTHW")
CLIP_LEN, STRIDE = 4, 3


def plan(paths: list[str], starts: list[int] | None = None) -> list[Sample]:
    starts = starts or [(7 * i) % 40 for i in range(len(paths))]
    videos = {p: v for v, p in enumerate(dict.fromkeys(map(str, paths)))}  # a video is its file, as in a loader
    return [Sample(position=100 + i, video_index=videos[str(p)], path=str(p), label=i, start_frame=s,
                   frame_stride=STRIDE, clip_len=CLIP_LEN, crop=CropBox.full(), flip=bool(i % 2))
            for i, (p, s) in enumerate(zip(paths, starts))]


def expected_codes(sample: Sample, num_frames: int = 60) -> list[int]:
    return sample.frame_indices(num_frames)


def run_pass(samples: list[Sample], batch_size: int, source: FallbackSource, *, max_fraction: float | None = 1.0,
             routes: Routes | None = None
             ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], FailureBudget, EpochCounters]:
    """One epoch pass over ``samples`` with only the fallback: ``(batches, budget, counters)``.

    ``routes`` carries what a run remembers from one epoch to the next (the files it quarantined).
    """
    batches = [samples[i:i + batch_size] for i in range(0, len(samples), batch_size)]
    budget = FailureBudget(len({s.path for s in samples}), max_fraction=max_fraction)
    counters = EpochCounters()
    setup = PassSetup(output=RAW, device=torch.device("cpu"), label_padding=False, mask_failed=False, prefetch=2,
                      num_frames=lambda path: None)
    passing = EpochPass(setup, batches, samples, routes=routes if routes is not None else Routes(), budget=budget,
                        counters=counters, fallback=source)
    return [(v.clone(), lab.clone()) for v, lab, _ in passing], budget, counters


def used_positions(samples: list[Sample], budget: FailureBudget) -> list[int]:
    """The plan position of the sample that fills each slot (its own, or its replacement's)."""
    used = dict(budget.replacements)
    return [used.get(s.position, s.position) for s in samples]


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
    batches, budget, _ = run_pass(samples, 5, FallbackSource(RAW, workers=0))
    [(videos, labels)] = batches
    # zero bytes -> garbage fails too -> slot 101 takes sample 103 (vp9); the last slot wraps around to 100
    assert used_positions(samples, budget) == [100, 103, 103, 103, 100]
    assert labels.tolist() == [0, 3, 3, 3, 0]
    assert read_clip(videos[1], layout="CTHW") == expected_codes(samples[3])
    failed = {f.path: f for f in budget.failures}
    assert failed[files["zero"]].positions == (101,) and failed[files["zero"]].reason.startswith("cannot open")
    assert failed[files["garbage"]].positions == (102,)
    again, _, _ = run_pass(samples, 5, FallbackSource(RAW, workers=0))
    assert torch.equal(again[0][0], videos)  # every run replaces the same way
    assert read_clip(videos[0], layout="CTHW") == expected_codes(samples[0])  # its own


def test_no_replacement_found_is_reported_with_the_failures(files):
    samples = plan([files["zero"], files["garbage"], files["truncated"]])
    with pytest.raises(NoReplacementError, match=r"plan position 100: no decodable replacement in the plan") as info:
        run_pass(samples, 3, FallbackSource(RAW, workers=0))
    assert [f.path for f in info.value.failures] == [files["zero"], files["garbage"], files["truncated"]]


def test_too_many_failures_raise_listing_them(files):
    paths = [files["h264"], files["zero"], files["vp9"], files["garbage"], files["h264"], files["vp9"]]
    too_many = (r"2 of 4 videos failed to decode, more than max_failure_fraction=0.25 of 4 videos \(1 allowed\)")
    with pytest.raises(TooManyFailuresError, match=too_many) as info:  # h264 and vp9 are planned twice
        run_pass(plan(paths), 2, FallbackSource(RAW, workers=0), max_fraction=0.25)
    assert re.search(re.escape(files["zero"]) + r" \(position 101\): cannot open", str(info.value))
    assert re.search(re.escape(files["garbage"]) + r" \(position 103\): cannot open", str(info.value))


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="workers must be an integer >= 0, got -1"):
        FallbackSource(RAW, workers=-1)
    with pytest.raises(ValueError, match="timeout_s must be > 0 or None, got 0"):
        FallbackOptions(timeout_s=0)
    with pytest.raises(ValueError, match="unknown fault action"):
        inject_faults(FallbackSource(RAW, workers=0), {"a.mp4": "explode"})


def test_broken_files_dead_and_hung_workers_cost_one_sample_each(files, realclips):
    """The whole contract, with real worker processes.

    Slots: good clips, every broken kind, the broken real clips, and three
    test faults (SIGKILL, a real segfault, a hang). The epoch must finish
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
    source = FallbackSource(RAW, FallbackOptions(timeout_s=1.0), workers=2)
    inject_faults(source, {"fault:kill": "kill", "fault:segv": "segv", "fault:hang": "hang"})
    routes = Routes()  # what the run remembers across epochs
    try:
        first = None
        for epoch in range(2):
            batches, budget, counters = run_pass(samples, 4, source, routes=routes)
            assert [len(labels) for _, labels in batches] == [4, 4, 4, 4, 2]
            # each slot holds its own sample or, if that failed, the next good one
            want = [100 + next(j % len(paths) for j in range(i, i + len(paths)) if j % len(paths) not in bad)
                    for i in range(len(paths))]
            assert used_positions(samples, budget) == want
            labels = torch.cat([lab for _, lab in batches]).tolist()
            assert labels == [p - 100 for p in want]
            videos = torch.cat([v for v, _ in batches])
            assert videos.shape[1:] == (3, CLIP_LEN, 48, 64)
            for video, position in zip(videos, want):
                assert read_clip(video, layout="CTHW") == expected_codes(samples[position - 100])
            reasons = {f.path: f.reason for f in budget.failures}
            assert set(reasons) == {paths[i] for i in bad}
            assert reasons["fault:kill"] == "worker died (signal SIGKILL) while decoding this sample"
            assert reasons["fault:segv"] == "worker died (signal SIGSEGV) while decoding this sample"
            assert reasons["fault:hang"].startswith("timeout: decode still running after")
            assert reasons[files["zero"]].startswith("cannot open")
            assert (budget.count("timeout"), budget.count("crash")) == (1, 2)
            assert counters.clips_fallback == len(paths)
            assert counters.frames_decoded_fallback >= CLIP_LEN * (len(paths) - len(bad))
            if epoch == 0:
                first, pids = videos, sorted(source.worker_pids)
            else:
                # The second epoch gives the same batches on the same workers: what killed or hung a
                # worker was not decoded again (the run quarantined it), so no worker died.
                assert torch.equal(videos, first) and sorted(source.worker_pids) == pids
                path_of = {s.video_index: s.path for s in samples}  # the run keeps them by video
                assert {path_of[v] for v in routes.quarantined} == {"fault:kill", "fault:segv", "fault:hang"}
    finally:
        source.close()


def test_a_worker_that_exits_costs_one_sample(files):
    """An exit code (not a signal) is the file's doing: no second try, one failure, the slot replaced."""
    paths = [files["h264"], files["vp9"], "fault:exit", files["h264"], files["vp9"], files["h264"]]
    samples = plan(paths)
    source = FallbackSource(RAW, workers=1)
    inject_faults(source, {"fault:exit": "exit"})
    try:
        with pytest.warns(UserWarning, match="1 of 3 videos failed to decode and were replaced "
                                             r"\(0 timeouts, 1 worker deaths\)"):
            batches, budget, _ = run_pass(samples, 3, source, max_fraction=1 / 3)  # one of the 3 videos
            budget.warn()
    finally:
        source.close()
    assert used_positions(samples, budget) == [100, 101, 103, 103, 104, 105]
    died = "worker died (exit code 3) while decoding this sample"
    assert budget.failures == (FailedVideo("fault:exit", died, (102,), "crash"),)
    assert read_clip(batches[0][0][2], layout="CTHW") == expected_codes(samples[3])


def test_a_file_that_failed_is_not_decoded_again_in_its_epoch(files):
    """Neither as a replacement candidate nor in a later slot of its own: a crashing file costs one retry."""
    paths = [files["h264"], "fault:segv", files["zero"], files["vp9"], files["h264"], files["vp9"],
             files["h264"], "fault:segv", files["vp9"]]
    samples = plan(paths)
    source = FallbackSource(RAW, workers=1)
    inject_faults(source, {"fault:segv": "segv"})
    budget = FailureBudget(len(set(paths)), max_fraction=1.0)
    setup = PassSetup(output=RAW, device=torch.device("cpu"), label_padding=False, mask_failed=False, prefetch=2,
                      num_frames=lambda path: None)
    batches = [samples[i:i + 3] for i in range(0, len(samples), 3)]
    try:
        passing = iter(EpochPass(setup, batches, samples, routes=Routes(), budget=budget,
                                 counters=EpochCounters(), fallback=source))
        next(passing)  # batch 0: the file killed a worker, and the fresh one it was tried on again
        pids = source.worker_pids
        assert len(list(passing)) == 2
        assert source.worker_pids == pids  # slot 107, submitted once the file had failed, was not decoded
        # slot 101 skips 102 (zero, failed in its own slot) and takes 103; slot 107 takes 108
        assert used_positions(samples, budget) == [100, 103, 103, 103, 104, 105, 106, 108, 108]
        assert {f.path: f.positions for f in budget.failures} == {"fault:segv": (101, 107), files["zero"]: (102,)}
    finally:
        source.close()


def test_a_group_is_its_samples_decoded_one_by_one(files):
    """``FallbackSource`` writes each clip into its row of one buffer: the same clips as one by one."""
    samples = plan([files["h264"], files["zero"], files["vp9"], files["h264"]])
    source = FallbackSource(RAW, workers=0)
    decoded = source.collect(source.submit(samples))
    assert sorted(decoded.failures) == [1] and decoded.failures[1].path == files["zero"]
    assert decoded.failures[1].kind == "decode" and decoded.failures[1].position == 101
    for k in (0, 2, 3):
        assert torch.equal(decoded.videos[k], decode_sample(samples[k], RAW))
    assert decoded.frames_decoded >= 3 * CLIP_LEN


def test_worker_clips_arrive_in_shared_memory_without_a_copy(files):
    """The workers write into an anonymous shared buffer that becomes the batch: no copy in this process."""
    samples = plan([files["h264"], files["vp9"], files["h264"]])
    source = FallbackSource(RAW, workers=1)
    try:
        decoded = source.collect(source.submit(samples))
    finally:
        source.close()
    assert decoded.failures == {}
    assert [read_clip(v, layout="CTHW") for v in decoded.videos] == [expected_codes(s) for s in samples]
    start = decoded.videos.data_ptr()
    spans = [line.split()[0].split("-") for line in Path("/proc/self/maps").read_text().splitlines()
             if "daliload-clips" in line]
    assert any(int(low, 16) <= start < int(high, 16) for low, high in spans), "not the workers' shared buffer"



def test_a_worker_allocates_its_rows_pages_at_once_and_only_its_rows():
    """map_rows allocates exactly the task's rows of a fresh buffer (one call instead of a fault a page);
    another task's rows are left to the worker that writes them."""
    from fallback.source import map_rows, shared_buffer

    shape = (4, 3, 8, 64, 64)  # 393,216 bytes a row of float32: 96 pages
    videos, fd = shared_buffer(shape, torch.float32)
    try:
        assert os.fstat(fd).st_blocks == 0
        mapped = map_rows(fd, shape, torch.float32, [1, 2])
        row_bytes = videos[0].numel() * 4
        assert os.fstat(fd).st_blocks * 512 == 2 * row_bytes
        mapped[1:3] = 7.0
        assert torch.equal(videos[1:3], torch.full_like(videos[1:3], 7.0)) and not videos[0].any()
    finally:
        os.close(fd)


def test_a_source_dropped_in_a_reference_cycle_stops_its_workers_cleanly(files, tmp_path):
    """Garbage collection of a cycle may finalize the workers' pipes before their owner (it does in a fresh
    interpreter, in this order): the source's cleanup must not close those descriptors a second time."""
    script = tmp_path / "cycle.py"
    script.write_text(textwrap.dedent(f"""
        import gc, os, sys, time
        sys.path.insert(0, os.getcwd())
        from tests.test_fallback_source import plan, RAW
        from fallback import FallbackSource

        samples = plan([{files["h264"]!r}] * 2)
        source = FallbackSource(RAW, workers=2)
        source.collect(source.submit(samples))
        pids = source.worker_pids
        source.cycle = source
        del source
        gc.collect()
        def running(pid):
            try:
                with open(f"/proc/{{pid}}/stat") as stat:
                    return stat.read().rsplit(")", 1)[1].split()[0] not in "ZX"
            except OSError:  # ENOENT, or ESRCH when reaped between the open and the read
                return False
        deadline = time.monotonic() + 10
        while any(map(running, pids)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(map(running, pids)), "workers left running"
        print("collected", flush=True)
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0 and "collected" in done.stdout, done.stderr
    assert "Exception ignored" not in done.stderr and "Bad file descriptor" not in done.stderr, done.stderr
