"""PyAV fallback loader for files DALI cannot decode. Never imports DALI.

Layers (imports go down only; see README's layout table):

* :mod:`fallback.decode` decodes only the frames of one clip window
  (:func:`decode_window`); :mod:`fallback.transform` crops, resizes, flips and
  normalizes them as the plan says (:func:`apply_plan`).
* :mod:`fallback.dataset`: :class:`ClipDataset`, one plan slot per item, a
  failed slot filled by the replacement rule of :mod:`daliload.failures`.
* :mod:`fallback.progress` and :mod:`fallback.watchdog`: crash and hang
  isolation of the worker processes (torch internals only in
  :mod:`fallback._torch_internals`).
* :mod:`fallback.loader`: :class:`FallbackLoader` / :func:`make_fallback_loader`,
  a whole plan in spawn-safe workers, reporting to a failure budget.

The failure record and errors live in the core (:mod:`daliload.failures`) and
are re-exported here.
"""

from daliload.failures import Failure, NoReplacementError, TooManyFailuresError
from fallback.dataset import ClipBatch, ClipDataset, ClipItem, DecodeOptions, collate_clips, decode_sample
from fallback.decode import DecodedClip, DecodeError, StreamHint, decode_window, probe_hint
from fallback.loader import FallbackBatch, FallbackLoader, FallbackStats, WorkerOptions, make_fallback_loader
from fallback.transform import apply_plan

__all__ = [
    "ClipBatch", "ClipDataset", "ClipItem", "DecodeError", "DecodeOptions", "DecodedClip", "Failure",
    "FallbackBatch", "FallbackLoader", "FallbackStats", "NoReplacementError", "StreamHint",
    "TooManyFailuresError", "WorkerOptions", "apply_plan", "collate_clips", "decode_sample",
    "decode_window", "make_fallback_loader", "probe_hint",
]
