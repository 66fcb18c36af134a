"""The per-video facts planning needs, as columns, and one epoch's draws over them, vectorised.

A Kinetics-700 split has about 650,000 videos. Drawing each one's window,
crop and flip in Python costs 11-27 us per sample (15-18 s an epoch in one
process) and a Python object per video costs about 2 KB on every rank. Here
the facts are numpy columns (:class:`VideoColumns`) and an epoch's draws are
computed for all its slots at once (:func:`draw_train_epoch`, about 1 us per
sample), as columns too (:class:`EpochDraws`); only the samples a rank
actually uses become :class:`~daliload.plan.specs.Sample` objects
(:func:`samples_of`).

The rule is the one :func:`~daliload.plan.sampling.sample_start_frame` and
:func:`~daliload.plan.sampling.sample_crop_box` state for one sample, applied
with the same arithmetic in the same order (IEEE double operations give the
same bits in numpy as in Python), so a plan drawn here is the plan drawn one
sample at a time, sample for sample. One operation is not bit-exact across
the two: ``exp`` (numpy's and the C library's may differ in the last bit),
used by the ``random_resized`` aspect ratio; where its result could round a
box side the other way (within 1e-9 of a half pixel), that sample is drawn
again one at a time.
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from daliload.plan.sampling import VideoLike, check_int, check_rank, check_specs, sample_crop_box
from daliload.plan.specs import AugmentSpec, ClipSpec, CropBox, Sample, is_int, usable_fps
from daliload.plan.streams import (DRAWS_PER_CROP, PURPOSE_CROP, PURPOSE_FLIP, PURPOSE_START, SHUFFLE_STREAM, Draws,
                                   keyed_uniform_array, sample_key)

#: Distance from a half pixel within which a vectorised ``random_resized`` box side is drawn again in Python.
_TIE = 1e-9


@dataclass(frozen=True, eq=False)
class VideoColumns:
    """The facts planning needs about each video of a split, one numpy array per fact.

    Row ``i`` is video ``i`` (the ``Sample.video_index`` of its samples).

    Attributes:
        paths: the files, any sequence of ``str`` (a list, or a compact
            :class:`daliload.dataset.StringColumn`).
        label: class index per video (int).
        num_frames: decodable frames per video (int, >= 1 to be planned).
        fps: frame rate per video (float; NaN where unknown or unusable).
        width, height: decoded frame size in pixels (int, >= 1 to be planned).
    """

    paths: Sequence[str]
    label: np.ndarray
    num_frames: np.ndarray
    fps: np.ndarray
    width: np.ndarray
    height: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.paths)
        for name in ("label", "num_frames", "fps", "width", "height"):
            column = getattr(self, name)
            if not isinstance(column, np.ndarray) or column.shape != (n,):
                raise ValueError(f"VideoColumns.{name} must be a numpy array of {n} values (one per path), "
                                 f"got {type(column).__name__} of shape {getattr(column, 'shape', None)}")

    def __len__(self) -> int:
        return len(self.paths)

    @classmethod
    def of(cls, videos: Sequence | VideoColumns) -> VideoColumns:
        """``videos`` as columns: columns as they are, else any sequence of :class:`~daliload.plan.VideoLike`.

        Raises:
            ValueError: a video whose ``num_frames``, ``width`` or ``height`` is
                not an integer >= 1 (the message names its path).
        """
        if isinstance(videos, VideoColumns):
            return videos
        columns = getattr(videos, "columns", None)
        if isinstance(columns, VideoColumns):
            return columns
        n = len(videos)
        label = np.empty(n, np.int64)
        ints = np.empty((3, n), np.int64)
        fps = np.empty(n, np.float64)
        paths = []
        for i, video in enumerate(videos):
            facts = (video.num_frames, video.width, video.height)
            if not (type(facts[0]) is int and type(facts[1]) is int and type(facts[2]) is int
                    and min(facts) >= 1):  # the common case, checked fast
                _check_facts(video)
            ints[:, i] = facts
            label[i] = int(video.label)
            fps[i] = float(video.fps) if usable_fps(video.fps) else math.nan
            paths.append(os.fspath(video.path))
        return cls(paths, label, ints[0], fps, ints[1], ints[2])

    def check(self) -> None:
        """Raise ``ValueError`` for an empty split or a video that cannot be planned, naming its path."""
        if len(self) == 0:
            raise ValueError("cannot plan an epoch over an empty video list")
        for name in ("num_frames", "width", "height"):
            bad = np.flatnonzero(getattr(self, name) < 1)
            if bad.size:
                i = int(bad[0])
                raise ValueError(f"{self.paths[i]}: {name} must be an integer >= 1, got {getattr(self, name)[i]}; "
                                 "re-scan the dataset or drop this video")


def _check_facts(video) -> None:
    for name in ("num_frames", "width", "height"):
        value = getattr(video, name)
        if not is_int(value) or value < 1:
            raise ValueError(f"{os.fspath(video.path)}: {name} must be an integer >= 1, got {value!r}; "
                             "re-scan the dataset or drop this video")


@dataclass(frozen=True, eq=False)
class EpochDraws:
    """One epoch's training samples as columns, one row per slot, in slot order.

    Slot ``k`` of an epoch holds video ``order[k % num_videos]`` (the epoch's
    permutation, padded cyclically to a multiple of the world size); rank
    ``r`` takes slots ``r, r + world_size, ...`` (see
    :func:`~daliload.plan.make_train_plan`).

    With ``clips_per_video`` k > 1 a slot has k rows in a row, its video's
    clips ``0 .. k-1`` (``clip``).

    Attributes:
        slot: the slot of each row.
        video: its video (row of the :class:`VideoColumns`).
        is_padding: a repeat that only keeps ranks equal.
        start_frame, frame_stride: the window.
        crop: ``(rows, 4)`` crop boxes, ``y0, x0, y1, x1`` fractions of the frame.
        flip: mirror horizontally.
        clip: which of its slot's clips the row is (0 with one clip a video).
    """

    slot: np.ndarray
    video: np.ndarray
    is_padding: np.ndarray
    start_frame: np.ndarray
    frame_stride: np.ndarray
    crop: np.ndarray
    flip: np.ndarray
    clip: np.ndarray

    def __len__(self) -> int:
        return len(self.slot)


def epoch_slots(num_videos: int, *, seed: int, epoch: int, world_size: int,
                rank: int | None = None, shuffle: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """``(slots, videos)`` of one epoch: every slot, or rank ``rank``'s.

    The permutation is drawn from ``(seed, epoch)`` alone, so every rank
    computes the same one; slot ``k`` holds ``order[k % num_videos]``.
    Without ``shuffle`` the order is the videos' own.
    """
    order = (np.random.default_rng([seed, epoch, SHUFFLE_STREAM]).permutation(num_videos) if shuffle
             else np.arange(num_videos))
    total = -(-num_videos // world_size) * world_size
    slots = np.arange(0 if rank is None else rank, total, 1 if rank is None else world_size, dtype=np.int64)
    return slots, order[slots % num_videos]


def draw_train_epoch(videos: Sequence | VideoColumns, *, seed: int, epoch: int, world_size: int, clip: ClipSpec,
                     augment: AugmentSpec, rank: int | None = None, clips_per_video: int = 1,
                     shuffle: bool = True) -> EpochDraws:
    """One training epoch's samples, as columns: every rank's (``rank=None``), or one rank's.

    The same samples, sample for sample, as :func:`~daliload.plan.make_train_plan`
    (which is this, then :func:`samples_of`); see there for the rule. Every
    draw is keyed by ``(seed, epoch, video, repeat)``, so one rank's rows are
    the whole epoch's rows of its slots.

    Args:
        videos: the split's videos (:class:`VideoColumns`, or any sequence of
            :class:`~daliload.plan.VideoLike`).
        seed, epoch, world_size, clip, augment: as in :func:`~daliload.plan.make_train_plan`.
        rank: this rank's slots only; ``None``: all slots of all ranks.
        clips_per_video: clips drawn for each slot (repeated sampling).
        shuffle: as in :func:`~daliload.plan.make_train_plan`.

    Raises:
        ValueError: as :func:`~daliload.plan.make_train_plan`.
    """
    return _draw(videos, seed=seed, epoch=epoch, world_size=world_size, clip=clip, augment=augment, rank=rank,
                 clips_per_video=clips_per_video, shuffle=shuffle, stacklevel=3)


def _draw(videos, *, seed, epoch, world_size, clip, augment, rank, clips_per_video: int = 1, shuffle: bool = True,
          stacklevel: int) -> EpochDraws:
    """:func:`draw_train_epoch`; a warning about fps points ``stacklevel`` frames above this one's caller."""
    check_int("seed", seed, minimum=0)
    check_int("epoch", epoch, minimum=0)
    check_int("world_size", world_size, minimum=1)
    check_int("clips_per_video", clips_per_video, minimum=1)
    if rank is not None:
        check_rank(rank, world_size)
    check_specs(clip, augment)
    columns = VideoColumns.of(videos)
    columns.check()
    num_videos = len(columns)
    slots, video = epoch_slots(num_videos, seed=seed, epoch=epoch, world_size=world_size, rank=rank,
                               shuffle=shuffle)
    repeat = slots // num_videos
    k = clips_per_video
    if k > 1:  # each slot's k clips in a row; clip j of repeat r draws as "repeat" r * k + j (r itself for k = 1)
        slots, video, repeat = np.repeat(slots, k), np.repeat(video, k), np.repeat(repeat, k)
    which = np.tile(np.arange(k, dtype=np.int64), len(slots) // k)
    draw_key = repeat * k + which
    key = sample_key(seed, epoch)
    stride = strides(columns, clip, stacklevel=stacklevel)[video]
    span = (clip.clip_len - 1) * stride + 1
    # Separate streams per purpose: the window does not change with the crop mode.
    starts = keyed_uniform_array(key, video, draw_key, PURPOSE_START, 1)[:, 0]
    start = start_frames(columns.num_frames[video].astype(np.int64), span, starts)
    crop = crop_boxes(columns.width[video].astype(np.int64), columns.height[video].astype(np.int64), augment,
                      keyed_uniform_array(key, video, draw_key, PURPOSE_CROP, DRAWS_PER_CROP[augment.crop_mode]))
    flip = keyed_uniform_array(key, video, draw_key, PURPOSE_FLIP, 1)[:, 0] < augment.flip_prob
    return EpochDraws(slots, video, repeat > 0, start, stride, crop, flip, which)


def samples_of(draws: EpochDraws, videos: Sequence | VideoColumns, clip: ClipSpec,
               rows: slice | None = None) -> list[Sample]:
    """:class:`Sample` objects of ``draws`` (``rows`` of them), positions numbering them from 0."""
    columns = VideoColumns.of(videos)
    rows = rows if rows is not None else slice(None)
    video = draws.video[rows].tolist()
    start, stride = draws.start_frame[rows].tolist(), draws.frame_stride[rows].tolist()
    crop, flip, padding = draws.crop[rows].tolist(), draws.flip[rows].tolist(), draws.is_padding[rows].tolist()
    which = draws.clip[rows].tolist()
    labels, paths, clip_len = columns.label, columns.paths, clip.clip_len
    label = labels[draws.video[rows]].tolist()
    return [Sample(position, v, paths[v], label[position], start[position], stride[position], clip_len,
                   CropBox(*crop[position]), flip[position], padding[position], which[position])
            for position, v in enumerate(video)]


def strides(videos: VideoColumns, clip: ClipSpec, *, stacklevel: int = 2) -> np.ndarray:
    """Per-video frame stride; without a usable fps, ``clip.frame_stride`` and one warning naming the first."""
    if clip.target_fps is None:
        return np.full(len(videos), clip.frame_stride, dtype=np.int64)
    fps = videos.fps
    usable = np.isfinite(fps) & (fps > 0)
    with np.errstate(invalid="ignore"):
        following = np.maximum(1, np.floor(clip.frame_stride * fps / clip.target_fps + 0.5))
    out = np.where(usable, following, clip.frame_stride).astype(np.int64)
    if not usable.all():
        bad = np.flatnonzero(~usable)
        warnings.warn(
            f"{bad.size} video(s) have no usable fps (first: {videos.paths[int(bad[0])]}); they use frame_stride="
            f"{clip.frame_stride} instead of following target_fps={clip.target_fps}",
            stacklevel=stacklevel + 1,
        )
    return out


def start_frames(num_frames: np.ndarray, span: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """:func:`~daliload.plan.sample_start_frame` for every row: uniform over ``0 .. num_frames - span``."""
    last = num_frames - span
    drawn = np.minimum(last, (uniforms * (last + 1)).astype(np.int64))
    return np.where(last > 0, drawn, 0)


def crop_boxes(width: np.ndarray, height: np.ndarray, augment: AugmentSpec, uniforms: np.ndarray) -> np.ndarray:
    """:func:`~daliload.plan.sample_crop_box` for every row: ``(rows, 4)`` boxes ``y0, x0, y1, x1``.

    ``uniforms`` holds each row's crop draws in the order the one-sample rule takes them.
    """
    out_h, out_w = augment.output_size
    if augment.crop_mode == "center":
        top, left, box_h, box_w = _center(width, height, out_h, out_w)
    elif augment.crop_mode == "short_side_jitter":
        lo, hi = augment.short_side_range
        short_side = _integers(uniforms[:, 0], lo, hi + 1)
        scale = short_side / np.minimum(width, height)
        box_h = np.minimum(height, np.maximum(1, np.rint(out_h / scale).astype(np.int64)))
        box_w = np.minimum(width, np.maximum(1, np.rint(out_w / scale).astype(np.int64)))
        top = _integers(uniforms[:, 1], 0, height - box_h + 1)
        left = _integers(uniforms[:, 2], 0, width - box_w + 1)
    else:
        return _random_resized(width, height, augment, uniforms)
    return _boxes(top, left, box_h, box_w, width, height)


def _integers(uniform: np.ndarray, low, high) -> np.ndarray:
    """``Draws.integers(low, high)`` per row: ``min(high - 1, low + int(u * (high - low)))``."""
    return np.minimum(high - 1, low + (uniform * (high - low)).astype(np.int64))


def _clamp(rounded: np.ndarray, size: np.ndarray) -> np.ndarray:
    """``min(size, max(1, rounded))`` as integers."""
    return np.minimum(size, np.maximum(1, rounded.astype(np.int64)))


def _boxes(top, left, box_h, box_w, width, height) -> np.ndarray:
    """``CropBox.from_pixels`` per row, as ``(rows, 4)`` fractions."""
    return np.stack([top / height, left / width, (top + box_h) / height, (left + box_w) / width], axis=1)


def _center(width, height, out_h: int, out_w: int):
    """:func:`~daliload.plan.center_crop_box` per row: ``(top, left, box_h, box_w)``."""
    wide = width * out_h > height * out_w
    box_h = np.where(wide, height, np.minimum(height, np.maximum(1, np.rint(width * out_h / out_w).astype(np.int64))))
    box_w = np.where(wide, np.minimum(width, np.maximum(1, np.rint(height * out_w / out_h).astype(np.int64))), width)
    return (height - box_h) // 2, (width - box_w) // 2, box_h, box_w


def _random_resized(width: np.ndarray, height: np.ndarray, augment: AugmentSpec, uniforms: np.ndarray) -> np.ndarray:
    """torchvision's RandomResizedCrop rule (see :func:`~daliload.plan.sample_crop_box`) for every row."""
    tries = 10
    area = width * height
    a_lo, a_hi = augment.area_range
    log_lo, log_hi = math.log(augment.aspect_range[0]), math.log(augment.aspect_range[1])
    target_area = area[:, None] * (a_lo + (a_hi - a_lo) * uniforms[:, 0:2 * tries:2])
    aspect = np.exp(log_lo + (log_hi - log_lo) * uniforms[:, 1:2 * tries:2])
    raw_w, raw_h = np.sqrt(target_area * aspect), np.sqrt(target_area / aspect)
    box_w, box_h = np.rint(raw_w).astype(np.int64), np.rint(raw_h).astype(np.int64)
    fits = (box_w > 0) & (box_w <= width[:, None]) & (box_h > 0) & (box_h <= height[:, None])
    first = np.argmax(fits, axis=1)
    found = fits[np.arange(len(width)), first]
    rows = np.arange(len(width))
    box_w, box_h = box_w[rows, first], box_h[rows, first]
    top = _integers(uniforms[rows, 2 * first + 2], 0, height - box_h + 1)
    left = _integers(uniforms[rows, 2 * first + 3], 0, width - box_w + 1)
    # No try fitted: the largest centred box within the aspect range.
    frame_aspect = width / height
    narrow, broad = frame_aspect < augment.aspect_range[0], frame_aspect > augment.aspect_range[1]
    fb_w = np.where(broad, _clamp(np.rint(height * augment.aspect_range[1]), width), width)
    fb_h = np.where(narrow, _clamp(np.rint(width / augment.aspect_range[0]), height), height)
    box_w, box_h = np.where(found, box_w, fb_w), np.where(found, box_h, fb_h)
    top, left = np.where(found, top, (height - box_h) // 2), np.where(found, left, (width - box_w) // 2)
    out = _boxes(top, left, box_h, box_w, width, height)
    # Where numpy's exp may round a side the other way than math.exp would, the one-sample rule decides.
    near = (np.abs(raw_w - np.floor(raw_w) - 0.5) < _TIE) | (np.abs(raw_h - np.floor(raw_h) - 0.5) < _TIE)
    for i in np.flatnonzero(near.any(axis=1)).tolist():
        box = sample_crop_box(int(width[i]), int(height[i]), augment, Draws(uniforms[i].tolist()))
        out[i] = (box.y0, box.x0, box.y1, box.x1)
    return out


def make_train_plan(
    videos: Sequence[VideoLike] | VideoColumns,
    *,
    seed: int,
    epoch: int,
    rank: int,
    world_size: int,
    clip: ClipSpec,
    augment: AugmentSpec,
    clips_per_video: int = 1,
    shuffle: bool = True,
) -> list[Sample]:
    """This rank's ordered training samples for one epoch (random windows, crops and flips).

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
    the same video. The draws are vectorised (:func:`draw_train_epoch`); what
    costs is the :class:`Sample` objects, a few microseconds each, so a rank
    pays for its own share only.

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
        videos: per-video facts (:class:`VideoColumns`, or any sequence of
            :class:`VideoLike`; the index of a video in it is its ``Sample.video_index``).
        seed: base seed, an integer >= 0, the same on every rank.
        epoch: epoch number, an integer >= 0.
        rank: this rank, ``0 <= rank < world_size``.
        world_size: number of ranks (>= 1).
        clip: clip length, stride and optional target frame rate.
        augment: crop mode and ranges, output size, flip probability.
        clips_per_video: repeated sampling: each video of the rank gives this
            many samples in a row (``view`` 0..k-1), each with its own window,
            crop and flip, drawn by the same rule and keyed by the clip too (so
            the same on any world size); 1 (default) is the plan above, sample
            for sample.
        shuffle: ``False`` keeps the videos' order (rank ``r`` takes videos
            ``r, r + world_size, ...``, as :func:`make_val_plan`); each
            sample's window, crop and flip are the same as when shuffled.

    Returns:
        ``samples_per_rank(len(videos), world_size) * clips_per_video``
        samples, ``position`` numbering them from 0.

    Raises:
        ValueError: empty ``videos``, a video with ``num_frames``, ``width`` or
            ``height`` < 1 (the message names its path), or seed, epoch, rank
            or world size out of range.
    """
    draws = _draw(videos, seed=seed, epoch=epoch, world_size=world_size, clip=clip, augment=augment, rank=rank,
                  clips_per_video=clips_per_video, shuffle=shuffle, stacklevel=3)
    return samples_of(draws, videos, clip)
