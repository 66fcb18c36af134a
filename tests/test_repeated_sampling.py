"""Repeated sampling: k clips of a video per epoch (``clips_per_video``), decoded from one pass over the file.

Every clip is checked against the plan by the frame code painted into every generated frame (frames,
flip; the crop is the whole frame, so a wrong crop shows as unreadable codes), for k = 1, 2 and 4, on
both routes: VP9 through DALI's CPU decoder and H.264 through the fallback's workers.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from daliload.failures import DecodeFailureWarning
from daliload.framecode import read_code
from daliload.loader import DecodeSpec, KineticsDALILoader
from daliload.plan import AugmentSpec, ClipSpec, OutputSpec, VideoInfo, make_train_plan
from daliload.synth import SynthSpec, generate_dataset

RAW = OutputSpec(size=(48, 64), mean=(0, 0, 0), std=(1, 1, 1), dtype="float32")
WHOLE = AugmentSpec(crop_size=(48, 64), crop_mode="center", flip_prob=0.5)


@pytest.fixture(scope="module")
def roots(tmp_path_factory) -> dict[str, Path]:
    """Route -> a small dataset whose every file takes that route on the CPU (7 train videos: odd on purpose)."""
    out = {}
    for route, codec in (("dali", "vp9"), ("fallback", "h264")):
        root = tmp_path_factory.mktemp(codec)
        generate_dataset(root, SynthSpec(num_classes=3, clips_per_class=3, val_fraction=0.2, width=128, height=96,
                                         duration_s=2.0, codec_mix={codec: 1.0}, seed=11), workers=2, progress=False)
        out[route] = root
    return out


def make_loader(root, k: int, **kwargs) -> KineticsDALILoader:
    kwargs.setdefault("batch_size", 4)
    return KineticsDALILoader(root, "train", clip_len=6, frame_stride=3, augment=WHOLE, output=RAW,
                              clips_per_video=k, **kwargs)


def check_rows(loader, batches) -> None:
    """Every row shows the frames, flip and label of the plan sample that fills its slot."""
    plan = loader.plan()
    assert len(batches) == len(plan) == len(loader)
    used = dict(loader.stats().replacements)
    by_position = {s.position: s for b in plan for s in b}
    frames = {v.path: v.num_frames for v in loader.videos}
    for (videos, labels), batch in zip(batches, plan):
        assert videos.shape[0] == len(batch) == loader.batch_size
        for k, slot in enumerate(batch):
            sample = by_position[used.get(slot.position, slot.position)]
            codes = [read_code(videos[k][:, t], layout="CHW") for t in range(videos.shape[2])]
            assert [c.index for c in codes] == sample.frame_indices(frames[sample.path]), slot
            assert all(c.flipped == sample.flip for c in codes), slot
            assert int(labels[k]) == sample.label


@pytest.mark.parametrize("route", ["dali", "fallback"])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_every_clip_of_every_video_is_the_planned_one(roots, route, k):
    loader = make_loader(roots[route], k, decode=DecodeSpec(routing="static"))  # route dali: DALI's decode
    try:
        assert {v.route for v in loader.videos} == {route}
        batches = [(v.clone(), lab.clone()) for v, lab in loader]
        check_rows(loader, batches)
        flat = [s for b in loader.plan() for s in b]
        videos = len(loader.videos)
        assert len(loader) == -(-videos * k // loader.batch_size)  # batches count clips
        assert sum(not s.is_padding for s in flat) == videos * k
        own = [s for s in flat if not s.is_padding]
        for first in range(0, len(own), k):  # a video's k clips in a row, views 0..k-1, one batch
            group = own[first:first + k]
            assert len({s.path for s in group}) == 1 and [s.view for s in group] == list(range(k))
            assert len({s.position // loader.batch_size for s in group}) == 1
        if k > 1:  # its own windows, crops or flips: not k copies of one clip
            assert any(len({(s.start_frame, s.flip) for s in own[f:f + k]}) > 1 for f in range(0, len(own), k))
        stats = loader.stats()
        assert stats.failures == ()
        assert (stats.clips_dali if route == "dali" else stats.clips_fallback) == len(flat)
    finally:
        loader.close()


def test_the_fallback_decodes_a_videos_clips_in_one_pass(roots):
    """Frames decoded per clip fall as k grows: the clips of a video share its decode."""
    per_clip = {}
    for k in (1, 4):
        loader = make_loader(roots["fallback"], k)
        try:
            clips = sum(len(lab) for _, lab in loader)
            per_clip[k] = loader.stats().frames_decoded_fallback / clips
        finally:
            loader.close()
    assert per_clip[4] < 0.6 * per_clip[1], per_clip


def test_one_plan_whatever_the_world_size_and_one_clip_is_the_plain_plan():
    videos = [VideoInfo(f"/v{i}.mp4", i % 5, 100 + 13 * i, 30.0, 128, 96) for i in range(23)]
    clip, augment = ClipSpec(clip_len=8, frame_stride=2), AugmentSpec(crop_size=64)
    plain = make_train_plan(videos, seed=4, epoch=2, rank=0, world_size=1, clip=clip, augment=augment)
    assert make_train_plan(videos, seed=4, epoch=2, rank=0, world_size=1, clip=clip, augment=augment,
                           clips_per_video=1) == plain

    def clips_by_video(world: int) -> dict:
        out = {}
        for rank in range(world):
            for s in make_train_plan(videos, seed=4, epoch=2, rank=rank, world_size=world, clip=clip,
                                     augment=augment, clips_per_video=3):
                if not s.is_padding:
                    out[(s.video_index, s.view)] = (s.start_frame, s.crop, s.flip)
        return out

    one = clips_by_video(1)
    assert len(one) == 23 * 3 and one == clips_by_video(4) == clips_by_video(8)
    # clip 0 of a video is the plain plan's clip: clip j of repeat r draws as r * k + j
    assert {(s.video_index, 0): (s.start_frame, s.crop, s.flip) for s in plain}.items() <= one.items()


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"clips_per_video": 0}, r"clips_per_video must be an integer >= 1, got 0"),
    ({"clips_per_video": 3, "batch_size": 4}, r"batch_size=4 must be a multiple of clips_per_video=3, so that a "
     r"video's clips share a batch and one decode \(batches count clips\): use batch_size=3 or 6; for a video's clips "
     r"spread over the epoch instead \(torchvision's reference\), use clips_per_video=1 and 3 times the epochs"),
    ({"clips_per_video": 5, "batch_size": 24}, r"use batch_size=20 or 25; "),
    ({"clips_per_video": 2, "split": "val"}, r"clips_per_video=2 is for split='train' \(repeated sampling\)"),
])
def test_bad_clips_per_video_are_refused(roots, kwargs, message):
    split = kwargs.pop("split", "train")
    with pytest.raises(ValueError, match=message):
        KineticsDALILoader(roots["fallback"], split, batch_size=kwargs.pop("batch_size", 4), clip_len=6, **kwargs)


def test_resume_and_a_broken_video_count_its_clips_as_one(roots, tmp_path):
    root = tmp_path / "copy"
    shutil.copytree(roots["fallback"], root, ignore=shutil.ignore_patterns(".daliload"))
    loader = make_loader(root, 2, decode=DecodeSpec(max_failure_fraction=0.2))
    try:
        loader.set_epoch(3)
        full = [(v.clone(), lab.clone()) for v, lab in loader]
        state = {**loader.state_dict(), "epoch": 3, "next_batch": 2}  # as if saved at batch 2 of epoch 3
        assert state["clips_per_video"] == 2
        resumed = make_loader(root, 2)
        resumed.load_state_dict(state)
        rest = [(v.clone(), lab.clone()) for v, lab in resumed]
        assert len(rest) == len(full) - 2
        assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(rest, full[2:]))
        with pytest.raises(ValueError, match="clips_per_video=2, this loader has clips_per_video=4"):
            make_loader(root, 4).load_state_dict(state)
        resumed.close()
        victim = loader.plan()[0][0].path
        Path(victim).unlink()
        with pytest.warns(DecodeFailureWarning, match=r"1 of \d+ videos failed to decode and were replaced"):
            batches = [(v.clone(), lab.clone()) for v, lab in loader]
        check_rows(loader, batches)
        [failed] = loader.stats().failures
        assert failed.path == victim and len(failed.positions) == 2  # both clips, one failed video
    finally:
        loader.close()
