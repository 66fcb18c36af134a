"""The vectorised plan draws the samples the one-at-a-time rule drew, sample for sample."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import reference_plan

from daliload.plan import (AugmentSpec, ClipSpec, VideoColumns, VideoInfo, draw_train_epoch, make_train_plan,
                           make_val_plan, samples_of)
from daliload.plan.columns import crop_boxes
from daliload.plan.sampling import sample_crop_box
from daliload.plan.streams import Draws

SIZES = [(340, 256), (256, 340), (320, 240), (640, 360), (256, 256), (171, 128), (1280, 720), (96, 72), (64, 480)]


def videos(n: int, *, seed: int = 0) -> list[VideoInfo]:
    """``n`` videos: many lengths (a fifth shorter than a 61-frame clip), sizes, rates, some without an fps."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        width, height = SIZES[i % len(SIZES)]
        num_frames = int(rng.integers(1, 60)) if i % 5 == 0 else int(rng.integers(60, 900))
        fps = (25.0, 29.97, 30.0, 60.0, 12.5, float("nan"), 0.0)[i % 7]
        out.append(VideoInfo(f"/data/k700/train/class {i % 700:03d}/{i:07d}.mp4", label=i % 700,
                             num_frames=num_frames, fps=fps, width=width, height=height))
    return out


VIDEOS = videos(3000)
CLIPS = [ClipSpec(clip_len=16, frame_stride=4), ClipSpec(clip_len=8, frame_stride=8, target_fps=15.0),
         ClipSpec(clip_len=32, frame_stride=2, target_fps=30)]
AUGMENTS = [AugmentSpec(crop_size=224), AugmentSpec(crop_size=(160, 112), crop_mode="random_resized"),
            AugmentSpec(crop_size=112, crop_mode="random_resized", area_range=(0.3, 1.0), aspect_range=(0.5, 2.0)),
            AugmentSpec(crop_size=224, crop_mode="center", flip_prob=0.3),
            AugmentSpec(crop_size=(128, 171), short_side_range=(128, 160))]


@pytest.mark.filterwarnings("ignore:.*no usable fps")
@pytest.mark.parametrize("clip", CLIPS)
@pytest.mark.parametrize("augment", AUGMENTS)
@pytest.mark.parametrize(("rank", "world_size"), [(0, 1), (5, 8), (63, 64)])
def test_train_plan_equals_the_one_sample_at_a_time_rule(clip, augment, rank, world_size):
    for seed, epoch in ((0, 0), (7, 3)):
        kwargs = dict(seed=seed, epoch=epoch, rank=rank, world_size=world_size, clip=clip, augment=augment)
        assert make_train_plan(VIDEOS, **kwargs) == reference_plan.make_train_plan(VIDEOS, **kwargs)


@pytest.mark.filterwarnings("ignore:.*no usable fps")
@pytest.mark.parametrize("views", [None, (1, 1), (3, 3), (10, 3), (4, 1)])
@pytest.mark.parametrize(("rank", "world_size"), [(0, 1), (2, 3), (63, 64)])
def test_val_plan_equals_the_one_sample_at_a_time_rule(views, rank, world_size):
    for clip in CLIPS:
        kwargs = dict(rank=rank, world_size=world_size, clip=clip, augment=AUGMENTS[4], views=views)
        assert make_val_plan(VIDEOS[:700], **kwargs) == reference_plan.make_val_plan(VIDEOS[:700], **kwargs)


@pytest.mark.filterwarnings("ignore:.*no usable fps")
def test_the_whole_epochs_draw_holds_every_ranks_samples():
    clip, augment = CLIPS[1], AUGMENTS[0]
    every = draw_train_epoch(VIDEOS, seed=3, epoch=2, world_size=7, clip=clip, augment=augment)
    assert len(every) == 7 * math.ceil(len(VIDEOS) / 7) and list(every.slot) == list(range(len(every)))
    for rank in (0, 6):
        mine = make_train_plan(VIDEOS, seed=3, epoch=2, rank=rank, world_size=7, clip=clip, augment=augment)
        assert samples_of(every, VIDEOS, clip, rows=slice(rank, None, 7)) == mine
    # Every video once, plus the repeats that pad the last round.
    assert sorted(every.video[~every.is_padding]) == list(range(len(VIDEOS)))


def test_columns_plan_like_the_videos_they_were_made_from():
    vs = videos(500, seed=4)
    columns = VideoColumns.of(vs)
    assert VideoColumns.of(columns) is columns and len(columns) == 500
    kwargs = dict(seed=1, epoch=1, rank=1, world_size=4, clip=CLIPS[0], augment=AUGMENTS[1])
    assert make_train_plan(columns, **kwargs) == make_train_plan(vs, **kwargs)
    assert math.isnan(columns.fps[5]) and math.isnan(columns.fps[6])  # nan and 0.0: no usable fps


def test_random_resized_sides_on_a_half_pixel_are_decided_by_the_one_sample_rule(monkeypatch):
    """Where numpy's exp and math.exp could round a side apart, the vectorised crop asks the rule itself."""
    from daliload.plan import columns as columns_module

    asked = []

    def rule(width, height, augment, rng):
        asked.append((width, height))
        return sample_crop_box(width, height, augment, rng)

    monkeypatch.setattr(columns_module, "sample_crop_box", rule)
    # A quarter of a 3 x 3 frame at aspect 1: each side is sqrt(2.25) = 1.5 exactly, a half pixel.
    tie = AugmentSpec(crop_size=4, crop_mode="random_resized", area_range=(0.25, 0.25), aspect_range=(1.0, 1.0))
    uniforms = np.random.default_rng(0).random((2, 22))
    got = crop_boxes(np.array([3, 90]), np.array([3, 90]), tie, uniforms)
    assert asked == [(3, 3)]  # the 90 x 90 frame (sides of 45) is no tie
    for i, size in enumerate((3, 90)):
        box = sample_crop_box(size, size, tie, Draws(uniforms[i].tolist()))
        assert tuple(got[i]) == (box.y0, box.x0, box.y1, box.x1)


@pytest.mark.parametrize(("field", "value", "shown"), [("num_frames", 0, "0"), ("width", None, "None"),
                                                       ("height", 2.5, "2.5")])
def test_columns_of_videos_name_the_one_that_cannot_be_planned(field, value, shown):
    good = dict(label=0, num_frames=10, fps=30.0, width=320, height=240)
    vs = [VideoInfo("/v/good.mp4", **good), VideoInfo("/v/broken.mp4", **{**good, field: value})]
    with pytest.raises(ValueError, match=rf"/v/broken.mp4: {field} must be an integer >= 1, got {shown}; re-scan"):
        VideoColumns.of(vs)


def test_columns_refuse_arrays_of_another_length_and_name_a_bad_row():
    ones = np.ones(2, np.int64)
    with pytest.raises(ValueError, match=r"VideoColumns.fps must be a numpy array of 2 values"):
        VideoColumns(["/a", "/b"], ones, ones, np.ones(3), ones, ones)
    columns = VideoColumns(["/a", "/b"], ones, np.array([5, 0]), np.ones(2), ones, ones)
    with pytest.raises(ValueError, match=r"/b: num_frames must be an integer >= 1, got 0"):
        draw_train_epoch(columns, seed=0, epoch=0, world_size=1, clip=CLIPS[0], augment=AUGMENTS[0])


def test_the_fps_warning_names_the_first_video_and_points_at_the_caller():
    vs = [VideoInfo("/v/a.mp4", 0, 100, 30.0, 320, 240), VideoInfo("/v/nofps.mp4", 0, 100, float("nan"), 320, 240)]
    with pytest.warns(UserWarning, match=r"1 video\(s\) have no usable fps \(first: /v/nofps.mp4\)") as record:
        draw_train_epoch(vs, seed=0, epoch=0, world_size=1, clip=CLIPS[1], augment=AUGMENTS[0])
    assert record[0].filename == __file__
    with pytest.warns(UserWarning) as record:
        make_val_plan(vs, rank=0, world_size=1, clip=CLIPS[1], augment=AUGMENTS[0])
    assert record[0].filename == __file__
