"""Routing through ``KineticsDALILoader`` itself: both decoders take DALI-route files, every clip is still the plan's.

VP9 files (route ``dali`` on the CPU: DALI's CPU decoder) with one DALI thread and one fallback worker, and a
mix with H.264 files (route ``fallback`` here). Each clip is checked by the frame code painted into every
generated frame (frames, flip). ``routing="static"`` pins every DALI-route clip to DALI.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from daliload.framecode import read_code
from daliload.loader import DecodeSpec, KineticsDALILoader
from daliload.plan import AugmentSpec, OutputSpec
from daliload.runtime import usable_cores
from daliload.synth import SynthSpec, generate_dataset

RAW = OutputSpec(size=(48, 64), mean=(0, 0, 0), std=(1, 1, 1), dtype="float32")
WHOLE = AugmentSpec(crop_size=(48, 64), crop_mode="center", flip_prob=0.5)
ONE_EACH = dict(dali_threads=1, fallback_workers=1)
ADAPTIVE = dict(ONE_EACH, routing="adaptive")  # what "auto" is with a core each (said, for a 1-core machine)


@pytest.fixture(scope="module")
def roots(tmp_path_factory) -> dict[str, Path]:
    out = {}
    for name, mix in (("vp9", {"vp9": 1.0}), ("mixed", {"vp9": 0.5, "h264": 0.5})):
        root = tmp_path_factory.mktemp(name)
        generate_dataset(root, SynthSpec(num_classes=3, clips_per_class=4, val_fraction=0.25, width=128, height=96,
                                         duration_s=2.0, codec_mix=mix, seed=5), workers=2, progress=False)
        out[name] = root
    return out


def make_loader(root, **decode) -> KineticsDALILoader:
    return KineticsDALILoader(root, "train", batch_size=4, clip_len=6, frame_stride=3, augment=WHOLE, output=RAW,
                              device="cpu", decode=DecodeSpec(**decode))


def epoch_rows(loader) -> list:
    """One pass: ``(videos, labels)`` per batch, checked row by row against the plan's frames and flips."""
    batches = [(v.clone(), lab.clone()) for v, lab in loader]
    frames = {v.path: v.num_frames for v in loader.videos}
    plan = loader.plan()
    assert len(batches) == len(plan)
    for (videos, labels), batch in zip(batches, plan):
        for k, sample in enumerate(batch):
            codes = [read_code(videos[k][:, t], layout="CHW") for t in range(videos.shape[2])]
            assert [c.index for c in codes] == sample.frame_indices(frames[sample.path])
            assert all(c.flipped == sample.flip for c in codes)
            assert int(labels[k]) == sample.label
    return batches


def test_both_decoders_take_dali_route_files_and_every_clip_is_the_plans(roots):
    loader = make_loader(roots["vp9"], **ADAPTIVE)
    try:
        assert {v.route for v in loader.videos} == {"dali"}
        for _ in range(2):  # two epochs
            epoch_rows(loader)
            stats = loader.stats()
            clips = sum(len(b) for b in loader.plan())
            assert stats.routing == "adaptive" and stats.failures == ()
            assert stats.clips_dali + stats.clips_fallback == clips
            # every fallback clip was a DALI-route one moved by the router (nothing failed in DALI)
            assert stats.clips_moved == stats.clips_fallback and stats.clips_redecoded == 0
            # before either decoder made the pass wait, one thread against one worker splits a batch in two
            assert stats.clips_dali > 0 and stats.clips_fallback > 0
            assert "DALI-route clips moved to the fallback" in stats.format()
    finally:
        loader.close()


def test_the_default_routing_measures_where_the_decoders_share_the_cores(roots):
    """DALI on the CPU with a thread per core beside 2 workers: sharing would add no decoder, so "auto" sends
    each codec to the decoder measured faster (``tests/test_routing_measured.py``); it starts on DALI, the table's."""
    loader = make_loader(roots["vp9"], dali_threads=max(2, usable_cores()), fallback_workers=2)
    try:
        epoch_rows(loader)
        stats = loader.stats()
        assert stats.routing == "measured"
        assert stats.clips_dali + stats.clips_fallback == sum(len(b) for b in loader.plan())
        assert [(r.codec, r.why) for r in stats.decoders] == [("vp9", "measured")]
    finally:
        loader.close()


def test_static_routing_sends_every_dali_route_clip_to_dali(roots):
    loader = make_loader(roots["vp9"], routing="static", **ONE_EACH)
    try:
        epoch_rows(loader)
        stats = loader.stats()
        assert (stats.clips_fallback, stats.clips_moved, stats.routing) == (0, 0, "static")
        assert stats.clips_dali == sum(len(b) for b in loader.plan())
    finally:
        loader.close()


def test_fallback_only_files_never_reach_dali(roots):
    loader = make_loader(roots["mixed"], **ADAPTIVE)
    try:
        routes = {v.route for v in loader.videos}
        assert routes == {"dali", "fallback"}
        on_dali = {v.path for v in loader.videos if v.route == "dali"}
        for _ in range(2):
            epoch_rows(loader)
            stats = loader.stats()
            dali_route = sum(s.path in on_dali for b in loader.plan() for s in b)
            assert stats.clips_dali + stats.clips_moved == dali_route  # DALI took only DALI-route clips
            assert stats.clips_dali + stats.clips_fallback == sum(len(b) for b in loader.plan())
    finally:
        loader.close()


def test_the_two_decoders_pixels_differ_by_a_few_levels(roots):
    """The same plan decoded by DALI alone and by the fallback alone: the same frames, pixels a few levels apart
    (both convert BT.601; their chroma upsampling differs). The figure ``docs/performance.md`` states."""
    dali = make_loader(roots["vp9"], routing="static", **ONE_EACH)
    pyav = make_loader(roots["vp9"], decoder="fallback", fallback_workers=1)
    try:
        a = torch.cat([v for v, _ in epoch_rows(dali)])
        b = torch.cat([v for v, _ in epoch_rows(pyav)])
    finally:
        dali.close()
        pyav.close()
    assert dali.stats().clips_dali == len(a) and pyav.stats().clips_dali == 0
    diff = (a - b).abs()
    print(f"DALI against the fallback, 0..255: mean {diff.mean():.2f}, 99th percentile "
          f"{diff.flatten().kthvalue(int(0.99 * diff.numel())).values:.0f}, max {diff.max():.0f}")
    assert diff.mean() < 6


def test_a_file_broken_after_the_scan_fails_once_whichever_decoder_meets_it(roots, tmp_path):
    """Adaptive routing and faults: a VP9 file corrupted after the scan fails its samples on whichever decoder
    took them, is reported once, its slots are replaced by the plan's rule, and no other sample is lost."""
    import shutil
    import warnings

    root = tmp_path / "copy"
    shutil.copytree(roots["vp9"], root, ignore=shutil.ignore_patterns(".daliload"))
    loader = make_loader(root, max_failure_fraction=1.0, **ADAPTIVE)
    try:
        victim = loader.videos[2].path
        Path(victim).write_bytes(b"\x00garbage" * 100)
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            batches = [(v.clone(), lab.clone()) for v, lab in loader]
        stats = loader.stats()
        assert [f.path for f in stats.failures] == [victim]
        failed = [w for w in record if "failed to decode" in str(w.message)]
        assert len(failed) == 1 and failed[0].filename == __file__  # the warning points at the user's loop
        plan = loader.plan()
        used = dict(stats.replacements)
        by_position = {s.position: s for b in plan for s in b}
        frames = {v.path: v.num_frames for v in loader.videos}
        assert len(batches) == len(plan) == len(loader)
        for (videos, labels), batch in zip(batches, plan):
            for k, slot in enumerate(batch):
                sample = by_position[used.get(slot.position, slot.position)]
                assert sample.path != victim
                codes = [read_code(videos[k][:, t], layout="CHW") for t in range(videos.shape[2])]
                assert [c.index for c in codes] == sample.frame_indices(frames[sample.path])
                assert int(labels[k]) == sample.label
        assert set(used) == {s.position for b in plan for s in b if s.path == victim}
        assert stats.clips_dali + stats.clips_fallback >= sum(len(b) for b in plan)
    finally:
        loader.close()
