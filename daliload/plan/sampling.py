"""The pure functions that build a plan: windows, crops, shuffling and sharding over ranks.

:func:`make_train_plan` and :func:`make_val_plan` turn per-video facts
(:class:`VideoLike`) plus a :class:`~daliload.plan.specs.ClipSpec` and an
:class:`~daliload.plan.specs.AugmentSpec` into each rank's ordered list of
:class:`~daliload.plan.specs.Sample`. No decoder is touched.
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

import numpy as np

from daliload.plan.specs import AugmentSpec, ClipSpec, CropBox, Sample, check_views, is_int, usable_fps
from daliload.plan.streams import (DRAWS_PER_CROP, PURPOSE_CROP, PURPOSE_FLIP, PURPOSE_START, SHUFFLE_STREAM, Draws,
                                   RandomSource, keyed_uniforms, sample_key)

@runtime_checkable
class VideoLike(Protocol):
    """The per-video facts planning needs; manifest entries of the pre-screen fit as they are.

    Attributes:
        path: the video file.
        label: class index.
        num_frames: decodable frames (>= 1); windows are chosen inside it.
        fps: average frame rate in frames/s (used only with ``ClipSpec.target_fps``;
            ``None`` or 0 there means ``frame_stride``, with one warning).
        width, height: decoded frame size in pixels, as the decoder outputs it
            (coded size, before any rotation), for crop boxes; ``None`` is
            rejected with the path named.
    """

    @property
    def path(self) -> str | os.PathLike[str]: ...

    @property
    def label(self) -> int: ...

    @property
    def num_frames(self) -> int: ...

    @property
    def fps(self) -> float | None: ...

    @property
    def width(self) -> int | None: ...

    @property
    def height(self) -> int | None: ...


@dataclass(frozen=True)
class VideoInfo:
    """A plain :class:`VideoLike`: the facts about one video that planning uses."""

    path: str
    label: int
    num_frames: int
    fps: float
    width: int
    height: int


def samples_per_rank(num_videos: int, world_size: int) -> int:
    """Samples every rank gets per epoch: ``ceil(num_videos / world_size)``."""
    if num_videos < 1:
        raise ValueError(f"num_videos must be >= 1, got {num_videos}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    return -(-num_videos // world_size)


def sample_start_frame(num_frames: int, span: int, rng: RandomSource) -> int:
    """A start frame uniform over the valid starts ``0 .. num_frames - span``.

    Args:
        num_frames: frames in the video (>= 1).
        span: source frames one clip covers (see :meth:`ClipSpec.span`).
        rng: random source (a ``numpy.random.Generator`` will do).

    Returns:
        The start frame; 0 when the video is shorter than ``span`` (the clip
        then runs past the end and the decoder repeats the last frame).
    """
    last_start = num_frames - span
    if last_start <= 0:
        return 0
    return int(rng.integers(0, last_start + 1))


def center_start_frame(num_frames: int, span: int) -> int:
    """The start frame that centres a ``span``-frame window; 0 when the video is shorter."""
    return max(0, (num_frames - span) // 2)


def center_crop_box(width: int, height: int, output_size: tuple[int, int]) -> CropBox:
    """The largest centred box with the aspect ratio of ``output_size``, snapped to whole pixels.

    For a square output this is "scale the short side to the crop size, then
    centre crop": a 340x256 frame and a 224x224 output give the box
    ``x 42..298, y 0..256``, i.e. ``CropBox(0.0, 42/340, 1.0, 298/340)``.

    Args:
        width, height: frame size in pixels.
        output_size: ``(height, width)`` of the output in pixels.
    """
    out_h, out_w = output_size
    if width * out_h > height * out_w:  # frame wider than the output: full height
        box_h, box_w = height, min(width, max(1, round(height * out_w / out_h)))
    else:
        box_w, box_h = width, min(height, max(1, round(width * out_h / out_w)))
    top, left = (height - box_h) // 2, (width - box_w) // 2
    return CropBox.from_pixels(top, left, box_h, box_w, width, height)


def temporal_view_starts(num_frames: int, span: int, num_temporal: int) -> list[int]:
    """Start frames of ``num_temporal`` windows of ``span`` frames spread evenly over a video.

    One view is the centred window (:func:`center_start_frame`, the single-view
    rule). Several: the first starts at frame 0, the last ends at the last
    frame, the others are evenly spaced between (rounded down). A video
    shorter than the span starts every view at 0; the edge rule then repeats
    its last frame, as for single-view clips.

    Example: a 300-frame video, span 61, 3 views: starts ``[0, 119, 239]``.
    """
    if num_temporal == 1:
        return [center_start_frame(num_frames, span)]
    room = max(0, num_frames - span)
    return [room * k // (num_temporal - 1) for k in range(num_temporal)]


def spatial_view_boxes(width: int, height: int, output_size: tuple[int, int], num_spatial: int) -> list[CropBox]:
    """``num_spatial`` crop boxes of the test-time multi-crop, along the frame's long side.

    Each box is the one :func:`center_crop_box` takes (for a square output:
    the short side scaled to the crop size), moved along the axis where the
    frame has room to spare: one view is the centre crop, several are spaced
    evenly from one end to the other (3: both ends and the centre, as
    SlowFast's test crops). Boxes fall on whole pixels of the frame.

    Example: a 340x256 frame, 224x224 output, 3 views: columns ``0..256``,
    ``42..298`` and ``84..340``, all rows.
    """
    centre = center_crop_box(width, height, output_size)
    top, left, bottom, right = centre.pixels(height, width)
    box_h, box_w = bottom - top, right - left
    if num_spatial == 1:
        return [centre]
    room_x, room_y = width - box_w, height - box_h
    boxes = []
    for k in range(num_spatial):
        if room_x >= room_y:  # slide along the width (also when neither side has room)
            x, y = room_x * k // (num_spatial - 1), top
        else:
            x, y = left, room_y * k // (num_spatial - 1)
        boxes.append(CropBox.from_pixels(y, x, box_h, box_w, width, height))
    return boxes


def sample_crop_box(
    width: int, height: int, augment: AugmentSpec, rng: RandomSource
) -> CropBox:
    """A training crop box for a ``width`` x ``height`` frame, per ``augment.crop_mode``.

    Args:
        width, height: frame size in pixels.
        augment: crop mode, its ranges and the output size.
        rng: random source (a ``numpy.random.Generator`` will do; ``"center"``
            draws nothing from it).

    Returns:
        A :class:`CropBox` whose corners fall on whole pixels of the frame.
    """
    out_h, out_w = augment.output_size
    if augment.crop_mode == "center":
        return center_crop_box(width, height, (out_h, out_w))
    if augment.crop_mode == "short_side_jitter":
        lo, hi = augment.short_side_range
        short_side = int(rng.integers(lo, hi + 1))
        scale = short_side / min(width, height)  # scaled pixels per source pixel
        box_h = min(height, max(1, round(out_h / scale)))
        box_w = min(width, max(1, round(out_w / scale)))
        top = int(rng.integers(0, height - box_h + 1))
        left = int(rng.integers(0, width - box_w + 1))
        return CropBox.from_pixels(top, left, box_h, box_w, width, height)
    # random_resized: torchvision's RandomResizedCrop.get_params, in numpy.
    area = width * height
    log_lo, log_hi = math.log(augment.aspect_range[0]), math.log(augment.aspect_range[1])
    for _ in range(10):
        target_area = area * rng.uniform(*augment.area_range)
        aspect = math.exp(rng.uniform(log_lo, log_hi))
        box_w = round(math.sqrt(target_area * aspect))
        box_h = round(math.sqrt(target_area / aspect))
        if 0 < box_w <= width and 0 < box_h <= height:
            top = int(rng.integers(0, height - box_h + 1))
            left = int(rng.integers(0, width - box_w + 1))
            return CropBox.from_pixels(top, left, box_h, box_w, width, height)
    # No try fitted: the largest centred box within the aspect range.
    frame_aspect = width / height
    if frame_aspect < augment.aspect_range[0]:
        box_w, box_h = width, min(height, max(1, round(width / augment.aspect_range[0])))
    elif frame_aspect > augment.aspect_range[1]:
        box_h, box_w = height, min(width, max(1, round(height * augment.aspect_range[1])))
    else:
        box_w, box_h = width, height
    return CropBox.from_pixels((height - box_h) // 2, (width - box_w) // 2, box_h, box_w, width, height)


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
    """This rank's ordered training samples for one epoch.

    The videos are shuffled by a permutation drawn from ``(seed, epoch)`` alone,
    so every rank computes the same one. The permuted list is padded by
    repeating its head until its length is a multiple of ``world_size`` (as
    ``torch.utils.data.DistributedSampler`` does), and rank ``r`` takes items
    ``r, r + world_size, r + 2 * world_size, ...``. Every rank thus gets
    :func:`samples_per_rank` samples, and across ranks each video appears
    exactly once per epoch, apart from the repeats, which are marked
    ``is_padding=True`` (they are trained on like any sample; they only exist
    so every rank yields the same number of batches).

    Each sample's window, crop and flip come from random draws keyed by
    ``(seed, epoch, video index)`` only, not by rank or world size: a video
    gets the same clip whether the job runs on 1 or 64 GPUs. Window, crop and
    flip use separate streams, so changing the crop mode keeps the windows. A
    padding repeat draws from its own streams, so it is a different clip of
    the same video. Cost, measured on a 2-core VM: about 12 us per sample
    (650k videos: 8 s on one rank, about 1 s per rank on 8 ranks).

    Per video: ``frame_stride = clip.stride_for(video.fps)``; the start frame is
    uniform over ``0 .. num_frames - span`` (``span = (clip_len - 1) *
    frame_stride + 1``), or 0 for a video shorter than ``span``, whose clip then
    runs past the end (decoders repeat the last frame); the crop box follows
    ``augment.crop_mode`` on the video's ``width`` x ``height``; the flip is
    drawn with ``augment.flip_prob``.

    Worked example: 5 videos, ``world_size=2``. With a permutation
    ``[3, 0, 4, 1, 2]`` the padded list is ``[3, 0, 4, 1, 2, 3]``; rank 0 gets
    videos ``[3, 4, 2]``, rank 1 gets ``[0, 1, 3]`` where that last 3 has
    ``is_padding=True``. A video of 40 frames with ``clip_len=16,
    frame_stride=4`` (span 61) always starts at frame 0 and its clip reads
    frames ``0, 4, ..., 36, 39, 39, 39, 39, 39, 39``.

    Args:
        videos: per-video facts (any :class:`VideoLike`; the index of a video
            in this sequence is its ``Sample.video_index``).
        seed: base seed, an integer >= 0, the same on every rank.
        epoch: epoch number, an integer >= 0.
        rank: this rank, ``0 <= rank < world_size``.
        world_size: number of ranks (>= 1).
        clip: clip length, stride and optional target frame rate.
        augment: crop mode and ranges, output size, flip probability.

    Returns:
        ``samples_per_rank(len(videos), world_size)`` samples, ``position``
        numbering them from 0.

    Raises:
        ValueError: empty ``videos``, a video with ``num_frames``, ``width`` or
            ``height`` < 1 (the message names its path), or seed, epoch, rank
            or world size out of range.
    """
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
    """This rank's validation samples: deterministic, in video order, centred.

    Videos keep their order (no shuffle); the list is padded by repeating its
    head to a multiple of ``world_size`` and rank ``r`` takes items ``r, r +
    world_size, ...``, exactly as in :func:`make_train_plan`. Repeats carry
    ``is_padding=True`` so metrics can drop them. Each sample is the centred
    window (:func:`center_start_frame`), the centre crop
    (:func:`center_crop_box` for ``augment.output_size``; the other fields of
    ``augment`` are not used) and no flip.

    Worked example: 5 videos, ``world_size=2``: rank 0 gets videos
    ``[0, 2, 4]``, rank 1 gets ``[1, 3, 0]`` with the last marked padding. A
    100-frame video with ``clip_len=16, frame_stride=4`` (span 61) starts at
    frame 19.

    With ``views=(T, S)`` each video gets ``V = T * S`` samples in a row
    (``view`` 0..V-1, temporal-major): the windows of
    :func:`temporal_view_starts` times the crops of :func:`spatial_view_boxes`.
    Videos are sharded exactly as without views; a video's views never
    straddle two ranks. ``views=(1, 1)`` gives the single-view samples.

    Args:
        videos: per-video facts (any :class:`VideoLike`).
        rank: this rank, ``0 <= rank < world_size``.
        world_size: number of ranks (>= 1).
        clip: clip length, stride and optional target frame rate.
        augment: only ``output_size`` is used.
        views: ``(num_temporal, num_spatial)`` views per video, or ``None`` (one).

    Returns:
        ``samples_per_rank(len(videos), world_size) * V`` samples.

    Raises:
        ValueError: as :func:`make_train_plan`; ``views`` that are not two integers >= 1.
    """
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
