"""The epoch plan as daliload drew it before the draws were vectorised: one sample at a time.

Kept as the reference the vectorised plan (:mod:`daliload.plan.columns`) must
equal, sample for sample (tests/test_plan_columns.py). It is the code of
``make_train_plan`` and ``make_val_plan`` as they stood, with the per-sample
rules they called (``sample_start_frame``, ``sample_crop_box``, the views)
imported from the package, where they are unchanged.
"""

from __future__ import annotations

import os
import warnings
from typing import Sequence

import numpy as np

from daliload.plan.sampling import (VideoLike, sample_crop_box, sample_start_frame, samples_per_rank,
                                    spatial_view_boxes, temporal_view_starts)
from daliload.plan.specs import AugmentSpec, ClipSpec, Sample, check_views, is_int, usable_fps
from daliload.plan.streams import (DRAWS_PER_CROP, PURPOSE_CROP, PURPOSE_FLIP, PURPOSE_START, SHUFFLE_STREAM, Draws,
                                   keyed_uniforms, sample_key)


def make_train_plan(
    videos: Sequence[VideoLike],
    *,
    seed: int,
    epoch: int,
    rank: int,
    world_size: int,
    clip: ClipSpec,
    augment: AugmentSpec,
) -> list[Sample]:
    """The pre-vectorisation rule (see the module docstring)."""
    _check_int("seed", seed, minimum=0)
    _check_int("epoch", epoch, minimum=0)
    _check_rank(rank, world_size)
    _check_specs(clip, augment)
    _check_videos(videos)
    num_videos = len(videos)
    order = np.random.default_rng([seed, epoch, SHUFFLE_STREAM]).permutation(num_videos)
    strides = _strides(videos, clip)
    slots = _rank_slots(order, rank, world_size)
    # Separate streams per purpose: the window does not change with the crop mode.
    key = sample_key(seed, epoch)
    index_arr = np.array([v for _, v in slots], dtype=np.int64)
    repeat_arr = np.array([slot // num_videos for slot, _ in slots], dtype=np.int64)
    start_draws = keyed_uniforms(key, index_arr, repeat_arr, PURPOSE_START, 1)
    crop_draws = keyed_uniforms(key, index_arr, repeat_arr, PURPOSE_CROP,
                                 DRAWS_PER_CROP[augment.crop_mode])
    flip_draws = keyed_uniforms(key, index_arr, repeat_arr, PURPOSE_FLIP, 1)
    samples = []
    for position, (slot, video_index) in enumerate(slots):
        repeat = slot // num_videos  # 0 for a video's own slot, >= 1 for padding repeats
        video = videos[video_index]
        stride = strides[video_index]
        start = sample_start_frame(int(video.num_frames), clip.span(stride),
                                   Draws(start_draws[position]))
        crop = sample_crop_box(int(video.width), int(video.height), augment,
                               Draws(crop_draws[position]))
        flip = flip_draws[position][0] < augment.flip_prob
        samples.append(Sample(
            position=position, video_index=video_index, path=os.fspath(video.path),
            label=int(video.label), start_frame=start, frame_stride=stride,
            clip_len=clip.clip_len, crop=crop, flip=flip, is_padding=repeat > 0,
        ))
    return samples


def make_val_plan(
    videos: Sequence[VideoLike],
    *,
    rank: int,
    world_size: int,
    clip: ClipSpec,
    augment: AugmentSpec,
    views: tuple[int, int] | None = None,
) -> list[Sample]:
    """The pre-vectorisation rule (see the module docstring)."""
    _check_rank(rank, world_size)
    _check_specs(clip, augment)
    _check_videos(videos)
    num_temporal, num_spatial = check_views(views) if views is not None else (1, 1)
    num_views = num_temporal * num_spatial
    num_videos = len(videos)
    strides = _strides(videos, clip)
    samples = []
    slots = _rank_slots(np.arange(num_videos), rank, world_size)
    for number, (slot, video_index) in enumerate(slots):
        video = videos[video_index]
        stride = strides[video_index]
        starts = temporal_view_starts(int(video.num_frames), clip.span(stride), num_temporal)
        crops = spatial_view_boxes(int(video.width), int(video.height), augment.output_size, num_spatial)
        for view in range(num_views):
            samples.append(Sample(
                position=number * num_views + view, video_index=video_index, path=os.fspath(video.path),
                label=int(video.label), start_frame=starts[view // num_spatial], frame_stride=stride,
                clip_len=clip.clip_len, crop=crops[view % num_spatial], flip=False,
                is_padding=slot >= num_videos, view=view,
            ))
    return samples


def _rank_slots(order: np.ndarray, rank: int, world_size: int) -> list[tuple[int, int]]:
    """``(slot, video_index)`` of this rank's share of ``order``, padded cyclically.

    The padded list has a multiple of ``world_size`` slots; slot ``k`` holds
    ``order[k % len(order)]``, so slots ``>= len(order)`` are the repeats.
    """
    num_videos = len(order)
    total = samples_per_rank(num_videos, world_size) * world_size
    return [(slot, int(order[slot % num_videos])) for slot in range(rank, total, world_size)]


def _strides(videos: Sequence[VideoLike], clip: ClipSpec) -> list[int]:
    """Per-video frame stride; without a usable fps, ``clip.frame_stride`` and one warning."""
    if clip.target_fps is None:
        return [clip.frame_stride] * len(videos)
    strides, bad = [], []
    for video in videos:
        if usable_fps(video.fps):
            strides.append(clip.stride_for(float(video.fps)))
        else:
            strides.append(clip.frame_stride)
            bad.append(os.fspath(video.path))
    if bad:
        warnings.warn(
            f"{len(bad)} video(s) have no usable fps (first: {bad[0]}); they use frame_stride="
            f"{clip.frame_stride} instead of following target_fps={clip.target_fps}",
            stacklevel=3,
        )
    return strides



def _check_int(name: str, value: object, *, minimum: int) -> None:
    if not is_int(value) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _check_rank(rank: int, world_size: int) -> None:
    _check_int("world_size", world_size, minimum=1)
    if not is_int(rank) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an integer in [0, world_size={world_size}), got {rank!r}")


def _check_specs(clip: ClipSpec, augment: AugmentSpec) -> None:
    if not isinstance(clip, ClipSpec):
        raise TypeError(f"clip must be a ClipSpec, got {type(clip).__name__}")
    if not isinstance(augment, AugmentSpec):
        raise TypeError(f"augment must be an AugmentSpec, got {type(augment).__name__}")


def _check_videos(videos: Sequence[VideoLike]) -> None:
    if len(videos) == 0:
        raise ValueError("cannot plan an epoch over an empty video list")
    for video in videos:
        nf, width, height = video.num_frames, video.width, video.height
        # The common case, checked fast: this loop runs over every video of the dataset.
        if type(nf) is int and type(width) is int and type(height) is int \
                and min(nf, width, height) >= 1:
            continue
        for name in ("num_frames", "width", "height"):
            value = getattr(video, name)
            if not is_int(value) or value < 1:
                raise ValueError(
                    f"{os.fspath(video.path)}: {name} must be an integer >= 1, got {value!r}; "
                    "re-scan the dataset or drop this video"
                )
