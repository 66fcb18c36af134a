"""The epoch plan: which clip, which frames, which crop, which flip.

The plan is the single source of truth shared by both decoders. The DALI
pipeline and the PyAV fallback (``fallback/``) both take :class:`Sample` items
and an :class:`OutputSpec` and must produce the same pixels (within resampling
tolerance) for the same sample.

This package imports neither DALI nor PyAV nor torch, so ``fallback/`` can
import it. Its modules, by concept:

* :mod:`.specs`: :class:`Sample`, :class:`CropBox`, :class:`OutputSpec`,
  :class:`ClipSpec`, :class:`AugmentSpec`, the edge rule and the crop rule;
* :mod:`.sampling`: the rules for one sample (window, crop, views) and
  :class:`VideoLike`, what planning needs to know per video;
* :mod:`.columns`: a split's facts as columns (:class:`VideoColumns`), an
  epoch's draws over all of them at once (:func:`draw_train_epoch`),
  shuffling and sharding over ranks (:func:`make_train_plan`);
* :mod:`.centred`: plans of centred clips, for evaluation and for training
  without augmentation (:func:`make_val_plan`, with ``views`` or ``shuffle``);
* :mod:`.streams`: the counter-based random streams planning draws from;
* :mod:`.batches`: batches of a rank's plan, the last-batch policy, and
  batches without their padding (:func:`drop_padding`).

Planning is pure code: :func:`make_train_plan` and :func:`make_val_plan` turn
per-video facts (:class:`VideoLike`: path, label, num_frames, fps, width,
height) plus a :class:`ClipSpec` and an :class:`AugmentSpec` into each rank's
ordered list of :class:`Sample`. No decoder is touched, so every property of
the plan (coverage, disjointness, windows, crops) is testable on its own.
"""

from daliload.plan.batches import (LAST_BATCH_POLICIES, LastBatch, check_last_batch, drop_padding, num_batches,
                                   split_batches)
from daliload.plan.centred import make_val_plan
from daliload.plan.columns import EpochDraws, VideoColumns, draw_train_epoch, make_train_plan, samples_of
from daliload.plan.sampling import (VideoInfo, VideoLike, center_crop_box, center_start_frame, sample_crop_box,
                                    sample_start_frame, samples_per_rank, spatial_view_boxes, temporal_view_starts)
from daliload.plan.specs import (KINETICS_MEAN, KINETICS_STD, OUTPUT_DTYPES, AugmentSpec, ClipSpec, CropBox, CropMode,
                                 NormUnits, OutputDType, OutputLayout, OutputSpec, Sample, check_views,
                                 clamp_frame_indices, usable_fps)
from daliload.plan.streams import RandomSource

__all__ = [
    "KINETICS_MEAN", "KINETICS_STD", "LAST_BATCH_POLICIES", "OUTPUT_DTYPES", "AugmentSpec", "ClipSpec", "CropBox",
    "CropMode",
    "EpochDraws", "LastBatch", "NormUnits", "OutputDType", "OutputLayout", "OutputSpec", "RandomSource", "Sample",
    "VideoColumns", "VideoInfo", "VideoLike", "center_crop_box", "center_start_frame", "check_last_batch",
    "check_views", "clamp_frame_indices", "draw_train_epoch", "drop_padding", "make_train_plan",
    "make_val_plan", "num_batches",
    "sample_crop_box", "sample_start_frame", "samples_of", "samples_per_rank", "spatial_view_boxes",
    "split_batches", "temporal_view_starts", "usable_fps",
]
