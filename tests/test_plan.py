"""The epoch plan: pure functions, no decoder."""

from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from daliload.plan import (
    AugmentSpec,
    ClipSpec,
    CropBox,
    Sample,
    VideoInfo,
    VideoLike,
    center_crop_box,
    clamp_frame_indices,
    center_start_frame,
    make_train_plan,
    make_val_plan,
    sample_crop_box,
    sample_start_frame,
    samples_per_rank,
)

CLIP = ClipSpec(clip_len=16, frame_stride=4)
AUG = AugmentSpec(crop_size=224)


def videos(n: int, *, seed: int = 0) -> list[VideoInfo]:
    """``n`` videos of assorted lengths (some shorter than a clip), sizes and rates."""
    rng = np.random.default_rng(seed)
    sizes = [(340, 256), (256, 340), (320, 240), (640, 360), (256, 256)]
    out = []
    for i in range(n):
        width, height = sizes[i % len(sizes)]
        out.append(VideoInfo(f"/data/k/{i:04d}.mp4", label=i % 7,
                             num_frames=int(rng.integers(20, 400)), fps=(25.0, 30.0, 60.0)[i % 3],
                             width=width, height=height))
    return out


def train(vs, *, seed=0, epoch=0, rank=0, world_size=1, clip=CLIP, augment=AUG) -> list[Sample]:
    return make_train_plan(vs, seed=seed, epoch=epoch, rank=rank, world_size=world_size,
                           clip=clip, augment=augment)


def video(path: str, num_frames: int = 300, fps: float = 30.0) -> VideoInfo:
    """A 320x240 video with label 0."""
    return VideoInfo(path, 0, num_frames, fps, 320, 240)


def box_pixels(box: CropBox, width: int, height: int) -> tuple[float, float, float, float]:
    return box.y0 * height, box.x0 * width, box.y1 * height, box.x1 * width


# --- shuffling, sharding, padding -------------------------------------------


def test_same_inputs_give_the_same_plan():
    vs = videos(37)
    kwargs = dict(seed=3, epoch=2, rank=1, world_size=3)
    assert train(vs, **kwargs) == train(vs, **kwargs)


def test_epochs_and_seeds_reshuffle():
    vs = videos(50)
    order = lambda **kw: [s.video_index for s in train(vs, **kw)]  # noqa: E731
    e0, e1, other_seed = order(epoch=0), order(epoch=1), order(epoch=0, seed=1)
    assert sorted(e0) == sorted(e1) == list(range(50))
    assert e0 != e1 and e0 != other_seed
    # Windows are redrawn too, not only the order.
    starts = lambda **kw: {s.video_index: s.start_frame for s in train(vs, **kw)}  # noqa: E731
    assert starts(epoch=0) != starts(epoch=1)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("num_videos", [1, 2, 5, 12, 13, 31])
def test_ranks_are_disjoint_cover_everything_and_have_equal_lengths(num_videos, world_size):
    vs = videos(num_videos)
    plans = [train(vs, seed=7, epoch=1, rank=r, world_size=world_size) for r in range(world_size)]
    expected_len = -(-num_videos // world_size)
    assert expected_len == samples_per_rank(num_videos, world_size)
    assert [len(p) for p in plans] == [expected_len] * world_size
    real = [s.video_index for p in plans for s in p if not s.is_padding]
    padding = [s for p in plans for s in p if s.is_padding]
    assert sorted(real) == list(range(num_videos))  # every video exactly once
    assert len(padding) == expected_len * world_size - num_videos
    for plan in plans:
        assert [s.position for s in plan] == list(range(expected_len))


def test_padding_repeats_the_head_of_the_permutation_like_distributed_sampler():
    vs = videos(5)
    plans = [train(vs, seed=1, world_size=2, rank=r) for r in range(2)]
    # Interleave the ranks back into the padded global order: r0[0], r1[0], r0[1], ...
    global_order = [plans[i % 2][i // 2] for i in range(6)]
    assert [s.is_padding for s in global_order] == [False] * 5 + [True]
    assert global_order[5].video_index == global_order[0].video_index
    # A padding repeat is another clip of the same video, not a copy of the first one.
    assert global_order[5] != global_order[0]


def test_more_ranks_than_videos_repeat_cyclically():
    vs = videos(2)
    plans = [train(vs, world_size=5, rank=r) for r in range(5)]
    assert all(len(p) == 1 for p in plans)
    assert Counter(p[0].video_index for p in plans) == Counter({0: 3, 1: 2}) or \
        Counter(p[0].video_index for p in plans) == Counter({1: 3, 0: 2})
    assert sum(not p[0].is_padding for p in plans) == 2


@pytest.mark.parametrize("world_size", [1, 2, 3, 8])
def test_a_videos_sample_does_not_depend_on_rank_or_world_size(world_size):
    vs = videos(24)
    reference = {s.video_index: s for s in train(vs, seed=5, epoch=3)}
    for rank in range(world_size):
        for s in train(vs, seed=5, epoch=3, rank=rank, world_size=world_size):
            if s.is_padding:
                continue
            ref = reference[s.video_index]
            fields = lambda x: (x.start_frame, x.frame_stride, x.crop, x.flip)  # noqa: E731
            assert fields(s) == fields(ref)


def test_sample_fields_come_from_the_video():
    vs = videos(9)
    for s in train(vs):
        v = vs[s.video_index]
        assert (s.path, s.label, s.clip_len, s.frame_stride) == (v.path, v.label, 16, 4)


def test_pathlike_paths_are_turned_into_strings():
    vs = [VideoInfo(Path("/data/a.mp4"), 0, 100, 30.0, 320, 240)]  # type: ignore[arg-type]
    assert train(vs)[0].path == "/data/a.mp4"


def test_manifest_like_entries_fit_without_conversion():
    @dataclass(frozen=True)
    class ManifestEntry:  # what the pre-screen stores, with extra fields
        path: str
        label: int
        num_frames: int
        fps: float
        width: int
        height: int
        codec: str
        route: str

    entries = [ManifestEntry(f"/d/{i}.webm", i, 90, 30.0, 128, 96, "vp9", "dali") for i in range(4)]
    assert isinstance(entries[0], VideoLike)
    assert sorted(s.video_index for s in train(entries)) == [0, 1, 2, 3]


# --- windows ------------------------------------------------------------------


def test_start_frames_stay_inside_the_valid_range_and_cover_it():
    span = CLIP.span(4)  # 61
    vs = [VideoInfo(f"/v/{i}.mp4", 0, 100, 30.0, 320, 240) for i in range(400)]
    starts = [s.start_frame for s in train(vs)]
    assert min(starts) >= 0 and max(starts) <= 100 - span
    assert {0, 100 - span} <= set(starts)  # both ends of the range are reachable
    assert len(set(starts)) == 100 - span + 1


def test_videos_shorter_than_the_window_start_at_zero():
    vs = [video("/v/short.mp4", 40), video("/v/one.mp4", 1)]
    for s in train(vs) + make_val_plan(vs, rank=0, world_size=1, clip=CLIP, augment=AUG):
        assert s.start_frame == 0
    # The docstring example: the clip runs past the end and repeats the last frame.
    short = [s for s in train(vs) if s.path == "/v/short.mp4"][0]
    assert short.frame_indices(40) == [0, 4, 8, 12, 16, 20, 24, 28, 32, 36, 39, 39, 39, 39, 39, 39]


def test_exact_fit_has_a_single_start():
    vs = [VideoInfo(f"/v/{i}.mp4", 0, 61, 30.0, 320, 240) for i in range(20)]
    assert {s.start_frame for s in train(vs)} == {0}


def test_sample_start_frame_is_uniform():
    rng = np.random.default_rng(0)
    counts = Counter(sample_start_frame(13, 10, rng) for _ in range(4000))  # starts 0..3
    assert sorted(counts) == [0, 1, 2, 3]
    assert all(abs(c / 4000 - 0.25) < 0.03 for c in counts.values())


@pytest.mark.parametrize(("fps", "expected_stride"),
                         [(30.0, 4), (60.0, 8), (25.0, 3), (29.97, 4), (15.0, 2), (5.0, 1)])
def test_target_fps_makes_the_stride_follow_each_videos_rate(fps, expected_stride):
    clip = ClipSpec(clip_len=8, frame_stride=4, target_fps=30.0)
    assert clip.stride_for(fps) == expected_stride
    s = train([video("/v/a.mp4", 500, fps)], clip=clip)[0]
    assert s.frame_stride == expected_stride


def test_target_fps_spans_the_same_time_at_different_rates():
    clip = ClipSpec(clip_len=16, frame_stride=2, target_fps=15.0)
    vs = [video("/v/30.mp4", 300, 30.0), video("/v/60.mp4", 600, 60.0)]
    by_path = {s.path: s for s in train(vs, clip=clip)}
    assert by_path["/v/30.mp4"].frame_stride == 4 and by_path["/v/60.mp4"].frame_stride == 8
    seconds_30 = clip.span(by_path["/v/30.mp4"].frame_stride) / 30.0
    seconds_60 = clip.span(by_path["/v/60.mp4"].frame_stride) / 60.0
    assert seconds_30 == pytest.approx(seconds_60, rel=0.01)


def test_missing_fps_with_target_fps_warns_once_and_uses_frame_stride():
    vs = [video("/v/nofps.mp4", fps=0.0), video("/v/nan.mp4", fps=float("nan")),
          video("/v/ok.mp4", fps=60.0)]
    clip = ClipSpec(clip_len=8, frame_stride=4, target_fps=30.0)
    message = r"2 video\(s\) have no usable fps \(first: /v/nofps.mp4\)"
    with pytest.warns(UserWarning, match=message) as record:
        plan = train(vs, clip=clip)
    assert len(record) == 1
    strides = {s.path: s.frame_stride for s in plan}
    assert strides == {"/v/nofps.mp4": 4, "/v/nan.mp4": 4, "/v/ok.mp4": 8}


def test_no_warning_without_target_fps():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        train([video("/v/nofps.mp4", fps=0.0)])


# --- crops and flips ----------------------------------------------------------


@pytest.mark.parametrize("mode", ["short_side_jitter", "random_resized", "center"])
def test_crop_boxes_are_inside_the_frame_on_whole_pixels(mode):
    augment = AugmentSpec(crop_size=112, crop_mode=mode, short_side_range=(128, 160))
    for s in train(videos(60), augment=augment):
        v = videos(60)[s.video_index]
        y0, x0, y1, x1 = box_pixels(s.crop, v.width, v.height)
        assert 0 <= s.crop.y0 < s.crop.y1 <= 1 and 0 <= s.crop.x0 < s.crop.x1 <= 1
        for value in (y0, x0, y1, x1):
            assert value == pytest.approx(round(value), abs=1e-6)


def test_short_side_jitter_boxes_are_square_and_sized_by_the_short_side():
    augment = AugmentSpec(crop_size=224, crop_mode="short_side_jitter", short_side_range=(256, 320))
    vs = videos(200)
    for s in train(vs, augment=augment):
        v = vs[s.video_index]
        y0, x0, y1, x1 = box_pixels(s.crop, v.width, v.height)
        box_h, box_w = y1 - y0, x1 - x0
        assert box_h == pytest.approx(box_w, abs=1e-6)  # square output, square box: no distortion
        short = min(v.width, v.height)
        # The box is 224 pixels of a frame whose short side was scaled to 256..320.
        assert short * 224 / 320 - 0.5 <= box_h <= short * 224 / 256 + 0.5


def test_short_side_jitter_scale_is_uniform_over_the_range():
    # 1000x1000 frame, 100 px crop: short side S gives a box of 100 * 1000 / S pixels.
    augment = AugmentSpec(crop_size=100, short_side_range=(200, 203))
    expected = {round(100 * 1000 / side): side for side in range(200, 204)}  # 500, 498, 495, 493
    rng = np.random.default_rng(0)
    boxes = [sample_crop_box(1000, 1000, augment, rng) for _ in range(4000)]
    counts = Counter(round((b.y1 - b.y0) * 1000) for b in boxes)
    assert set(counts) == set(expected)
    assert all(abs(c / 4000 - 0.25) < 0.03 for c in counts.values())


def test_short_side_jitter_smaller_than_the_crop_takes_the_whole_dimension():
    augment = AugmentSpec(crop_size=224, short_side_range=(112, 112))
    box = sample_crop_box(340, 256, augment, np.random.default_rng(0))
    y0, x0, y1, x1 = box_pixels(box, 340, 256)
    assert (y0, y1) == (0, 256) and x1 - x0 == pytest.approx(340, abs=1e-6)


def test_random_resized_boxes_respect_area_and_aspect_ranges():
    augment = AugmentSpec(crop_size=224, crop_mode="random_resized", area_range=(0.3, 1.0),
                          aspect_range=(3 / 4, 4 / 3))
    rng = np.random.default_rng(0)
    areas, aspects = [], []
    for _ in range(500):
        y0, x0, y1, x1 = box_pixels(sample_crop_box(340, 256, augment, rng), 340, 256)
        areas.append((y1 - y0) * (x1 - x0) / (340 * 256))
        aspects.append((x1 - x0) / (y1 - y0))
    assert 0.29 <= min(areas) and max(areas) <= 1.0
    assert 3 / 4 - 0.02 <= min(aspects) and max(aspects) <= 4 / 3 + 0.02
    assert max(areas) - min(areas) > 0.5  # the range is actually explored


def test_random_resized_falls_back_to_the_largest_centred_box_in_range():
    # A very wide frame with a tight aspect range: no try can fit, the fallback is centred.
    augment = AugmentSpec(crop_mode="random_resized", area_range=(0.99, 1.0),
                          aspect_range=(1.0, 1.0))
    box = sample_crop_box(400, 100, augment, np.random.default_rng(0))
    assert box_pixels(box, 400, 100) == pytest.approx((0, 150, 100, 250))


@pytest.mark.parametrize(("width", "height", "size", "expected"), [
    (340, 256, (224, 224), (0, 42, 256, 298)),
    (256, 340, (224, 224), (42, 0, 298, 256)),
    (320, 240, (120, 160), (0, 0, 240, 320)),  # same aspect: whole frame
    (320, 240, (100, 300), (66, 0, 173, 320)),  # wide output from a 4:3 frame
])
def test_center_crop_box(width, height, size, expected):
    box = center_crop_box(width, height, size)
    assert box_pixels(box, width, height) == pytest.approx(expected)


def test_flip_rate_follows_flip_prob():
    vs = videos(2000)
    for prob, lo, hi in [(0.5, 0.46, 0.54), (0.2, 0.17, 0.23), (0.0, 0, 0), (1.0, 1, 1)]:
        rate = np.mean([s.flip for s in train(vs, augment=AugmentSpec(flip_prob=prob))])
        assert lo <= rate <= hi, (prob, rate)


# --- validation plan ---------------------------------------------------------


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_val_plan_is_ordered_centred_unflipped_and_marks_padding(world_size):
    vs = videos(10)

    def plan_of(rank):
        return make_val_plan(vs, rank=rank, world_size=world_size, clip=CLIP, augment=AUG)

    plans = [plan_of(r) for r in range(world_size)]
    assert len({len(p) for p in plans}) == 1
    total = len(plans[0]) * world_size
    global_order = [plans[i % world_size][i // world_size] for i in range(total)]
    assert [s.video_index for s in global_order if not s.is_padding] == list(range(10))
    assert [s.video_index for s in global_order if s.is_padding] == list(range(total - 10))
    for s in global_order:
        v = vs[s.video_index]
        assert s.flip is False
        assert s.start_frame == center_start_frame(v.num_frames, CLIP.span(4))
        assert s.crop == center_crop_box(v.width, v.height, (224, 224))
    # Deterministic: no seed, no epoch.
    assert plans == [plan_of(r) for r in range(world_size)]


def test_val_window_is_centred():
    assert center_start_frame(100, 61) == 19  # frames 19..79: 19 before, 20 after
    assert center_start_frame(61, 61) == 0
    assert center_start_frame(30, 61) == 0


def test_center_crop_mode_in_training_is_the_val_crop_with_random_flips():
    vs = videos(40)
    plan = train(vs, augment=AugmentSpec(crop_mode="center", flip_prob=0.5))
    for s in plan:
        v = vs[s.video_index]
        assert s.crop == center_crop_box(v.width, v.height, (224, 224))
    assert 0 < sum(s.flip for s in plan) < 40


# --- input validation ----------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"clip_len": 0}, r"clip_len must be an integer >= 1, got 0"),
    ({"frame_stride": 0}, r"frame_stride must be an integer >= 1, got 0"),
    ({"frame_stride": 1.5}, r"frame_stride must be an integer >= 1, got 1.5"),
    ({"target_fps": 0}, r"target_fps must be None or a finite number > 0"),
])
def test_clip_spec_validates(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ClipSpec(**kwargs)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"crop_size": 0}, r"crop_size must be an int >= 1 or \(height, width\)"),
    ({"crop_size": (224,)}, r"crop_size must be an int >= 1 or \(height, width\)"),
    ({"crop_mode": "random"}, r"crop_mode must be one of .*'random'"),
    ({"short_side_range": (320, 256)}, r"short_side_range must be \(min, max\) pixels"),
    ({"area_range": (0.0, 1.0)}, r"area_range must satisfy 0 < min <= max <= 1"),
    ({"aspect_range": (2.0, 1.0)}, r"aspect_range must satisfy 0 < min <= max"),
    ({"flip_prob": 1.5}, r"flip_prob must be in \[0, 1\], got 1.5"),
])
def test_augment_spec_validates(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AugmentSpec(**kwargs)


def test_augment_output_size():
    assert AugmentSpec(crop_size=112).output_size == (112, 112)
    assert AugmentSpec(crop_size=(128, 171)).output_size == (128, 171)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"rank": 2, "world_size": 2}, r"rank must be an integer in \[0, world_size=2\), got 2"),
    ({"rank": -1, "world_size": 2}, r"rank must be an integer in \[0, world_size=2\), got -1"),
    ({"rank": 0, "world_size": 0}, r"world_size must be an integer >= 1, got 0"),
    ({"seed": -1}, r"seed must be an integer >= 0, got -1"),
    ({"epoch": -1}, r"epoch must be an integer >= 0, got -1"),
])
def test_train_plan_validates_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        train(videos(3), **kwargs)


def test_plans_reject_an_empty_video_list():
    with pytest.raises(ValueError, match="cannot plan an epoch over an empty video list"):
        train([])
    with pytest.raises(ValueError, match="cannot plan an epoch over an empty video list"):
        make_val_plan([], rank=0, world_size=1, clip=CLIP, augment=AUG)


@pytest.mark.parametrize(("field", "value"), [("num_frames", 0), ("width", 0), ("height", -2)])
def test_plans_name_the_video_with_bad_facts(field, value):
    good = dict(label=0, num_frames=10, fps=30.0, width=320, height=240)
    vs = [VideoInfo("/v/good.mp4", **good), VideoInfo("/v/broken.mp4", **{**good, field: value})]
    message = rf"/v/broken.mp4: {field} must be an integer >= 1, got {value}"
    with pytest.raises(ValueError, match=message):
        train(vs)
    with pytest.raises(ValueError, match=rf"/v/broken.mp4: {field} must be an integer >= 1"):
        make_val_plan(vs, rank=0, world_size=1, clip=CLIP, augment=AUG)


def test_plans_reject_specs_of_the_wrong_type():
    with pytest.raises(TypeError, match="clip must be a ClipSpec, got dict"):
        train(videos(2), clip={"clip_len": 16})  # type: ignore[arg-type]


@pytest.mark.parametrize("crop, size, pixels", [
    (CropBox(0.25, 0.5, 0.75, 1.0), (96, 128), (24, 64, 72, 128)),
    (CropBox(0.0, 0.0, 1.0, 1.0), (7, 5), (0, 0, 7, 5)),
    (CropBox(0.5, 0.5, 0.51, 0.51), (10, 10), (5, 5, 6, 6)),  # keeps at least one pixel
    (CropBox(0.99, 0.99, 1.0, 1.0), (10, 10), (9, 9, 10, 10)),
])
def test_crop_pixels_rounding(crop, size, pixels):
    assert crop.pixels(*size) == pixels


def test_crop_boxes_made_from_pixels_give_the_same_pixels_back():
    """The plan's boxes (from_pixels) and the decoders' crops (pixels) are one rule: exact round trip."""
    rng = np.random.default_rng(3)
    for _ in range(500):
        height, width = int(rng.integers(1, 2000)), int(rng.integers(1, 2000))
        box_h, box_w = int(rng.integers(1, height + 1)), int(rng.integers(1, width + 1))
        top, left = int(rng.integers(0, height - box_h + 1)), int(rng.integers(0, width - box_w + 1))
        box = CropBox.from_pixels(top, left, box_h, box_w, width, height)
        assert box.pixels(height, width) == (top, left, top + box_h, left + box_w)


def test_edge_rule_repeats_the_last_frame():
    assert clamp_frame_indices([30, 38, 46], 40) == [30, 38, 39]
    sample = Sample(position=0, video_index=0, path="v.mp4", label=0, start_frame=30, frame_stride=8,
                    clip_len=3, crop=CropBox.full())
    assert sample.frame_indices(40) == [30, 38, 39] and sample.frame_indices() == [30, 38, 46]
    with pytest.raises(ValueError, match="v.mp4: video has no frames"):
        sample.frame_indices(0)
