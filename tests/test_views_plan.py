"""Multi-view evaluation plans: where each view's window starts and which crop it takes."""

from __future__ import annotations

import pytest

from daliload.plan import (AugmentSpec, ClipSpec, VideoInfo, center_crop_box, center_start_frame, check_views,
                           make_val_plan, spatial_view_boxes, split_batches, temporal_view_starts)

CLIP = ClipSpec(clip_len=16, frame_stride=4)  # span 61
AUG = AugmentSpec(crop_size=224)


@pytest.mark.parametrize("num_frames", [61, 62, 100, 300, 301])
@pytest.mark.parametrize("num_temporal", [2, 3, 5, 10])
def test_temporal_views_run_from_the_first_frame_to_the_last_evenly(num_frames, num_temporal):
    starts = temporal_view_starts(num_frames, 61, num_temporal)
    assert len(starts) == num_temporal and starts[0] == 0
    assert starts[-1] + 61 - 1 == num_frames - 1  # the last window ends on the last frame
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert max(gaps) - min(gaps) <= 1 and all(g >= 0 for g in gaps)


def test_one_temporal_view_is_the_centred_window_and_a_short_video_starts_every_view_at_zero():
    assert temporal_view_starts(300, 61, 1) == [center_start_frame(300, 61)] == [119]
    assert temporal_view_starts(40, 61, 10) == [0] * 10  # the edge rule pads each view


def test_three_spatial_views_are_both_ends_and_the_centre_of_the_long_side():
    landscape = [b.pixels(256, 340) for b in spatial_view_boxes(340, 256, (224, 224), 3)]
    assert landscape == [(0, 0, 256, 256), (0, 42, 256, 298), (0, 84, 256, 340)]
    assert spatial_view_boxes(340, 256, (224, 224), 3)[1] == center_crop_box(340, 256, (224, 224))
    portrait = [b.pixels(340, 256) for b in spatial_view_boxes(256, 340, (224, 224), 3)]
    assert portrait == [(0, 0, 256, 256), (42, 0, 298, 256), (84, 0, 340, 256)]
    assert spatial_view_boxes(340, 256, (224, 224), 1) == [center_crop_box(340, 256, (224, 224))]
    # A non-square output keeps its aspect ratio; a frame with no room repeats the one box.
    assert [b.pixels(96, 128) for b in spatial_view_boxes(128, 96, (48, 64), 2)] == [(0, 0, 96, 128)] * 2


def videos(n=5):
    return [VideoInfo(f"/v{i}.mp4", i % 3, 100 + 50 * i, 30.0, 340, 256) for i in range(n)]


def test_a_multi_view_plan_lists_each_videos_views_in_a_row_temporal_major():
    vs = videos()
    plan = make_val_plan(vs, rank=1, world_size=2, clip=CLIP, augment=AUG, views=(2, 3))
    single = make_val_plan(vs, rank=1, world_size=2, clip=CLIP, augment=AUG)
    assert len(plan) == 6 * len(single) == 18
    assert [s.position for s in plan] == list(range(18))
    for number, first in enumerate(single):
        group = plan[6 * number:6 * number + 6]
        assert [s.view for s in group] == list(range(6))
        assert {(s.video_index, s.path, s.label, s.is_padding, s.frame_stride) for s in group} == {
            (first.video_index, first.path, first.label, first.is_padding, first.frame_stride)}
        video = vs[first.video_index]
        starts = temporal_view_starts(video.num_frames, 61, 2)
        boxes = spatial_view_boxes(340, 256, (224, 224), 3)
        assert [(s.start_frame, s.crop) for s in group] == [(t, b) for t in starts for b in boxes]
    assert plan[-1].is_padding  # 5 videos on 2 ranks: rank 1's last video is a repeat, all its views marked


def test_views_one_by_one_is_the_single_view_plan():
    vs = videos()
    assert make_val_plan(vs, rank=0, world_size=3, clip=CLIP, augment=AUG, views=(1, 1)) == make_val_plan(
        vs, rank=0, world_size=3, clip=CLIP, augment=AUG)


def test_batches_in_videos_pad_with_whole_videos():
    plan = make_val_plan(videos(3), rank=0, world_size=1, clip=CLIP, augment=AUG, views=(2, 2))
    batches = split_batches(plan, 2 * 4, "pad")  # 2 videos per batch, 4 views each
    assert [len(b) for b in batches] == [8, 8]
    padding = batches[-1][4:]
    assert [s.view for s in padding] == [0, 1, 2, 3] and all(s.is_padding for s in padding)
    assert {s.video_index for s in padding} == {0}


@pytest.mark.parametrize("bad", [(0, 3), (2,), (2, 3, 1), "10x3", (2.5, 1), (True, 1), None])
def test_bad_views_are_refused_naming_them(bad):
    with pytest.raises(ValueError, match=r"views must be \(num_temporal, num_spatial\)"):
        check_views(bad)
    if bad is not None:
        with pytest.raises(ValueError, match="views must be"):
            make_val_plan(videos(), rank=0, world_size=1, clip=CLIP, augment=AUG, views=bad)
