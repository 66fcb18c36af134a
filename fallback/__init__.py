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
are re-exported here. Public names are re-exported lazily (PEP 562), as in
:mod:`daliload`: the pre-screen imports :mod:`fallback.numbering` in every
probe worker and must not pull in torch through :mod:`fallback.loader` for it
(2.6 s and 255 MB per worker against 0.7 s and 65 MB, measured).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from daliload.lazy import lazy_exports

_EXPORTS = {
    "daliload.failures": ("Failure", "NoReplacementError", "TooManyFailuresError"),
    "fallback.dataset": ("ClipBatch", "ClipDataset", "ClipItem", "DecodeOptions", "collate_clips", "decode_sample"),
    "fallback.decode": ("DecodedClip", "DecodeError", "StreamHint", "decode_window", "probe_hint"),
    "fallback.loader": ("FallbackBatch", "FallbackLoader", "FallbackStats", "WorkerOptions", "make_fallback_loader"),
    "fallback.transform": ("apply_plan",),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)

if TYPE_CHECKING:  # for type checkers and IDEs; at run time __getattr__ imports on first use
    from daliload.failures import Failure, NoReplacementError, TooManyFailuresError
    from fallback.dataset import ClipBatch, ClipDataset, ClipItem, DecodeOptions, collate_clips, decode_sample
    from fallback.decode import DecodedClip, DecodeError, StreamHint, decode_window, probe_hint
    from fallback.loader import FallbackBatch, FallbackLoader, FallbackStats, WorkerOptions, make_fallback_loader
    from fallback.transform import apply_plan


__getattr__, __dir__ = lazy_exports(__name__, globals(), _MODULE_OF)
