"""Plans of centred clips: evaluation, and training without augmentation.

:func:`make_val_plan` gives each video its centred window and crop, or the
views of multi-view testing, with no random draw; the videos keep their
order, or (``shuffle``) follow the permutation of a training epoch. Imports
neither a decoder nor torch.
"""

from __future__ import annotations

from typing import Sequence

from daliload.plan.columns import VideoColumns, epoch_slots, strides
from daliload.plan.sampling import (VideoLike, check_int, check_rank, check_specs, spatial_view_boxes,
                                    temporal_view_starts)
from daliload.plan.specs import AugmentSpec, ClipSpec, Sample, check_views


def make_val_plan(
    videos: Sequence[VideoLike] | VideoColumns,
    *,
    rank: int,
    world_size: int,
    clip: ClipSpec,
    augment: AugmentSpec,
    views: tuple[int, int] | None = None,
    shuffle: bool = False,
    seed: int = 0,
    epoch: int = 0,
) -> list[Sample]:
    """This rank's validation samples: deterministic, in video order, centred.

    Videos keep their order (unless ``shuffle``); the list is padded by repeating its
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
        videos: per-video facts (:class:`VideoColumns`, or any sequence of :class:`VideoLike`).
        rank: this rank, ``0 <= rank < world_size``.
        world_size: number of ranks (>= 1).
        clip: clip length, stride and optional target frame rate.
        augment: only ``output_size`` is used.
        views: ``(num_temporal, num_spatial)`` views per video, or ``None`` (one).
        shuffle: order the videos by the permutation :func:`make_train_plan`
            draws from ``(seed, epoch)`` (training without augmentation); the
            samples stay centred. Default ``False``.
        seed, epoch: the permutation's, with ``shuffle``.

    Returns:
        ``samples_per_rank(len(videos), world_size) * V`` samples.

    Raises:
        ValueError: as :func:`make_train_plan`; ``views`` that are not two integers >= 1.
    """
    check_rank(rank, world_size)
    check_specs(clip, augment)
    check_int("seed", seed, minimum=0)
    check_int("epoch", epoch, minimum=0)
    columns = VideoColumns.of(videos)
    columns.check()
    num_temporal, num_spatial = check_views(views) if views is not None else (1, 1)
    num_views = num_temporal * num_spatial
    num_videos = len(columns)
    stride = strides(columns, clip, stacklevel=2)
    slots, video = epoch_slots(num_videos, seed=seed, epoch=epoch, world_size=world_size, rank=rank, shuffle=shuffle)
    facts = zip(slots.tolist(), video.tolist(), columns.num_frames[video].tolist(), columns.width[video].tolist(),
                columns.height[video].tolist(), columns.label[video].tolist(), stride[video].tolist())
    samples = []
    for number, (slot, v, num_frames, width, height, label, frame_stride) in enumerate(facts):
        starts = temporal_view_starts(num_frames, clip.span(frame_stride), num_temporal)
        crops = spatial_view_boxes(width, height, augment.output_size, num_spatial)
        path = columns.paths[v]
        for view in range(num_views):
            samples.append(Sample(
                position=number * num_views + view, video_index=v, path=path, label=label,
                start_frame=starts[view // num_spatial], frame_stride=frame_stride, clip_len=clip.clip_len,
                crop=crops[view % num_spatial], flip=False, is_padding=slot >= num_videos, view=view,
            ))
    return samples
