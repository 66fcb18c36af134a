"""PyAV fallback for files DALI cannot decode. Never imports DALI.

Layers (imports go down only; see ``docs/architecture.md``):

* the stream layer under it, shared with the DALI route:
  :mod:`daliload.stream.numbering` numbers a file's frames and says where a
  decode may start (:class:`StreamHint`, :func:`probe_hint`, re-exported
  here); :mod:`daliload.stream.cut` copies the packets a window needs for DALI;
* :mod:`fallback.decode` decodes only the frames of one clip window
  (:func:`decode_window`; :class:`DecodeError`, of :mod:`daliload.stream.errors`,
  when it cannot); :mod:`fallback.transform` crops, resizes, flips and
  normalizes them as the plan says (:func:`apply_plan`); :mod:`fallback.views`
  decodes all the windows of one video in one pass, with the knobs of
  :class:`FallbackOptions` (:mod:`fallback.options`).
* :mod:`fallback.source`: :class:`FallbackSource`, the clip source an epoch
  pass sends the fallback's samples to: supervised worker processes
  (:class:`daliload.runtime.WorkerPool`) writing clips into shared memory.

The failure record and errors live in the core (:mod:`daliload.failures`) and
are re-exported here. Public names are re-exported lazily (PEP 562), as in
:mod:`daliload`: the pre-screen imports :mod:`daliload.stream.numbering` in every
probe worker and must not pull in torch for it (2.6 s and 255 MB per worker
against 0.7 s and 65 MB, measured).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from daliload.runtime import lazy_exports

_EXPORTS = {
    "daliload.failures": ("Failure", "NoReplacementError", "TooManyFailuresError"),
    "fallback.decode": ("DecodedClip", "decode_window"),
    "daliload.stream.errors": ("DecodeError",),
    "daliload.stream.numbering": ("StreamHint", "probe_hint"),
    "fallback.options": ("FallbackOptions",),
    "fallback.source": ("FallbackSource", "decode_sample"),
    "fallback.transform": ("apply_plan",),
    "fallback.views": ("decode_views",),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)

if TYPE_CHECKING:  # for type checkers and IDEs; at run time __getattr__ imports on first use
    from daliload.failures import Failure, NoReplacementError, TooManyFailuresError
    from fallback.decode import DecodedClip, decode_window
    from daliload.stream.errors import DecodeError
    from daliload.stream.numbering import StreamHint, probe_hint
    from fallback.options import FallbackOptions
    from fallback.source import FallbackSource, decode_sample
    from fallback.transform import apply_plan
    from fallback.views import decode_views


__getattr__, __dir__ = lazy_exports(__name__, globals(), _MODULE_OF)
