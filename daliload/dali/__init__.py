"""The DALI path: the DALI clip source, the decoder under it, the cuts it is fed, and what goes wrong.

Modules, by concept (each imports only those after it):

* :mod:`._source`: :class:`DaliSource`, DALI as a
  :class:`~daliload.clips.ClipSource`: a failed batch isolated by halves, a
  batch fed once its cuts are in;
* :mod:`._pipeline`: :class:`DaliClipDecoder`, the DALI pipelines
  (``fn.decoders.video`` + ``fn.resize`` + ``fn.crop_mirror_normalize``) fed
  batch by batch with the plan, and :class:`DecodedBatch`;
* :mod:`._graph`: one pipeline's graph, built, fed a batch, its outputs read
  as torch tensors;
* :mod:`._cutter`: :class:`WindowCutter`, the cuts (the packets a window
  needs, ``daliload.stream.cut``) made in worker processes ahead of DALI;
* :mod:`._wait`: the one thread that calls a pipeline and waits for it with a
  time limit, and the exit of a process whose DALI is stuck;
* :mod:`._errors`: :func:`import_dali` (the ImportError that names the
  ``pip install``), :func:`is_dali_available`, :class:`DaliBatchError`,
  :class:`DaliTimeoutError`.

DALI itself is imported only when a pipeline is built: this package's names
are re-exported lazily (PEP 562, as in ``daliload``), so ``import
daliload.dali`` imports neither ``nvidia.dali`` nor torch, and the pre-screen's
probe workers can use :func:`import_dali` and :func:`dali_error_reason`
without either. Code that asks whether DALI is there reads
``daliload.dali.is_dali_available`` when it asks (a test can patch that name).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from daliload.runtime import lazy_exports

_EXPORTS = {
    "daliload.dali._errors": ("INSTALL_HINT", "DaliBatchError", "DaliTimeoutError", "dali_error_reason", "import_dali",
                              "is_dali_available"),
    "daliload.dali._pipeline": ("DaliClipDecoder", "DecodedBatch"),
    "daliload.dali._cutter": ("WindowCutter",),
    "daliload.dali._source": ("DaliSource",),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)

if TYPE_CHECKING:  # for type checkers and IDEs; at run time __getattr__ imports on first use
    from daliload.dali._cutter import WindowCutter
    from daliload.dali._errors import (INSTALL_HINT, DaliBatchError, DaliTimeoutError, dali_error_reason, import_dali,
                                       is_dali_available)
    from daliload.dali._pipeline import DaliClipDecoder, DecodedBatch
    from daliload.dali._source import DaliSource


__getattr__, __dir__ = lazy_exports(__name__, globals(), _MODULE_OF)
