"""The rules for one sample: its window, its crop, its views; and what planning takes per video.

:class:`VideoLike` is what planning needs to know about a video. The
functions here decide one sample from those facts and a random source; the
plans of a whole split (:func:`~daliload.plan.make_train_plan`,
:func:`~daliload.plan.make_val_plan`, in :mod:`.columns`) apply them to every
sample at once. No decoder is touched.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from daliload.plan.specs import AugmentSpec, ClipSpec, CropBox, is_int
from daliload.plan.streams import RandomSource


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


def check_int(name: str, value: object, *, minimum: int) -> None:
    if not is_int(value) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def check_rank(rank: int, world_size: int) -> None:
    """Raise ``ValueError`` unless ``world_size >= 1`` and ``0 <= rank < world_size`` are integers."""
    check_int("world_size", world_size, minimum=1)
    if not is_int(rank) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an integer in [0, world_size={world_size}), got {rank!r}")


def check_specs(clip: ClipSpec, augment: AugmentSpec) -> None:
    """Raise ``TypeError`` unless ``clip`` is a :class:`ClipSpec` and ``augment`` an :class:`AugmentSpec`."""
    if not isinstance(clip, ClipSpec):
        raise TypeError(f"clip must be a ClipSpec, got {type(clip).__name__}")
    if not isinstance(augment, AugmentSpec):
        raise TypeError(f"augment must be an AugmentSpec, got {type(augment).__name__}")
