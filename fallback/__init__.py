"""PyAV fallback loader for files DALI cannot decode. Never imports DALI.

* :func:`decode_window` decodes only the frames of one clip window.
* :func:`apply_plan` crops, resizes, flips and normalizes them as the plan says.
* :class:`ClipDataset` / :func:`make_fallback_loader` load a whole plan with
  spawn-safe workers, replacing failed samples and surviving hangs and crashes.
"""

from fallback.dataset import (
    ClipBatch,
    ClipDataset,
    ClipItem,
    DecodeOptions,
    Failure,
    FallbackBatch,
    FallbackLoader,
    FallbackStats,
    NoReplacementError,
    TooManyFailuresError,
    collate_clips,
    decode_sample,
    make_fallback_loader,
)
from fallback.decode import DecodedClip, DecodeError, StreamHint, decode_window, probe_hint
from fallback.transform import apply_plan, crop_pixels

__all__ = [
    "ClipBatch", "ClipDataset", "ClipItem", "DecodeError", "DecodeOptions", "DecodedClip", "Failure",
    "FallbackBatch", "FallbackLoader", "FallbackStats", "NoReplacementError", "StreamHint",
    "TooManyFailuresError", "apply_plan", "collate_clips", "crop_pixels", "decode_sample",
    "decode_window", "make_fallback_loader", "probe_hint",
]
