"""daliload: Kinetics-style video loading for PyTorch DDP with NVIDIA DALI and a PyAV fallback.

Public names are re-exported lazily (PEP 562): ``import daliload`` stays cheap,
``fallback/`` can import :mod:`daliload.plan` without pulling in the loader,
and DALI itself is imported only when a DALI pipeline is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from daliload.runtime import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "KineticsDALILoader": "daliload.loader",
    "DecodeSpec": "daliload.options",
    "ScanSpec": "daliload.prescreen",
    "LoaderStats": "daliload.stats",
    "Failure": "daliload.failures",
    "FailedVideo": "daliload.failures",
    "DecodeFailureWarning": "daliload.failures",
    "TooManyFailuresError": "daliload.failures",
    "ClipSpec": "daliload.plan",
    "AugmentSpec": "daliload.plan",
    "OutputSpec": "daliload.plan",
    "CropBox": "daliload.plan",
    "Sample": "daliload.plan",
    "BatchInfo": "daliload.epoch",
    "EpochSampler": "daliload.epoch",
    "Manifest": "daliload.prescreen",
    "scan": "daliload.prescreen",
    "load_index": "daliload.dataset",
    "evaluate": "daliload.evaluation",
    "EvalResult": "daliload.evaluation",
    "EvaluationCountError": "daliload.evaluation",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # for type checkers and IDEs; at run time __getattr__ imports on first use
    from daliload.evaluation import EvalResult, EvaluationCountError, evaluate
    from daliload.dataset import load_index
    from daliload.failures import DecodeFailureWarning, FailedVideo, Failure, TooManyFailuresError
    from daliload.epoch import BatchInfo
    from daliload.epoch import EpochSampler
    from daliload.loader import KineticsDALILoader
    from daliload.options import DecodeSpec
    from daliload.stats import LoaderStats
    from daliload.plan import AugmentSpec, ClipSpec, CropBox, OutputSpec, Sample
    from daliload.prescreen import Manifest, ScanSpec, scan


__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
