"""What can go wrong with DALI, and the errors that say so: not installed, a failed batch, a stuck one.

- DALI is imported lazily (:func:`import_dali`); without it the message says
  which ``pip install`` fixes it (:data:`INSTALL_HINT`).
- A batch DALI cannot decode raises :class:`DaliBatchError`, naming every
  file of the batch and, when DALI's message points at one, the culprit.
- A batch that does not finish in time raises :class:`DaliTimeoutError`
  (:mod:`daliload.dali._wait`): the run cannot go on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from daliload.plan import Sample

INSTALL_HINT = (
    "pip install 'daliload[cuda13]' (NVIDIA driver >= 580) or 'daliload[cuda12]' (driver >= 525)"
)


def import_dali() -> tuple[Any, Any, Any]:
    """Import DALI lazily: ``(nvidia.dali.pipeline, nvidia.dali.fn, nvidia.dali.types)``.

    Raises:
        ImportError: DALI is not installed; the message says which ``pip
            install`` fixes it, raised from the original error.
    """
    try:
        import nvidia.dali.fn as fn
        import nvidia.dali.pipeline as pipeline
        import nvidia.dali.types as types
    except ImportError as err:
        raise ImportError(f"NVIDIA DALI is not installed; {INSTALL_HINT}") from err
    return pipeline, fn, types


def is_dali_available() -> bool:
    """True when ``nvidia.dali`` imports (without raising; for the loader's fallback-only mode)."""
    try:
        import_dali()
    except ImportError:
        return False
    return True


class DaliBatchError(RuntimeError):
    """DALI could not produce a batch; every sample of it must be decoded another way.

    Attributes:
        samples: the samples of the failed batch, in batch order.
        reason: DALI's (or the file reader's) explanation, shortened.
        culprit: the sample DALI's message points at (``"sample #i"``), when it
            names one; other samples of the batch may be fine.
    """

    def __init__(
        self, samples: Sequence[Sample], reason: str, *, culprit: Sample | None = None
    ) -> None:
        self.samples = tuple(samples)
        self.reason = reason
        self.culprit = culprit
        paths = list(dict.fromkeys(s.path for s in self.samples))
        blame = f" (cause: {culprit.path})" if culprit is not None else ""
        super().__init__(
            f"DALI failed to decode a batch of {len(self.samples)} clip(s){blame}: {reason}; "
            f"files: {', '.join(paths)}"
        )

    @property
    def paths(self) -> list[str]:
        """Paths of the batch's samples, in batch order (repeats kept)."""
        return [s.path for s in self.samples]

    def __reduce__(self):
        # Crosses process boundaries intact (the keyword-only culprit needs a helper).
        return (_rebuild_batch_error, (self.samples, self.reason, self.culprit))


def _rebuild_batch_error(samples, reason, culprit) -> DaliBatchError:
    return DaliBatchError(samples, reason, culprit=culprit)


class DaliTimeoutError(RuntimeError):
    """DALI did not finish a batch within the time limit; the decoder cannot be used any more.

    Attributes:
        samples: the samples of the batch DALI was decoding.
        timeout_s: the limit that passed, in seconds.
    """

    def __init__(self, samples: Sequence[Sample], timeout_s: float) -> None:
        self.samples = tuple(samples)
        self.timeout_s = timeout_s
        paths = list(dict.fromkeys(s.path for s in self.samples))
        super().__init__(
            f"DALI did not finish a batch of {len(self.samples)} clip(s) within {timeout_s:g} s; a thread "
            f"is stuck inside DALI, so this run cannot go on (raise DecodeSpec.timeout_s if such "
            f"batches are expected to be slow); files: {', '.join(paths)}"
        )


def dali_error_reason(message: str) -> str:
    """DALI's error text without the pipeline-definition traceback and C++ context lines."""
    tail = message.rsplit("encountered:", 1)[-1]
    noise = ("C++ context", "Current pipeline object", "Critical error")
    lines = [line.strip() for line in tail.splitlines()
             if line.strip() and not line.strip().startswith(noise)]
    return " ".join(lines) or message.strip().splitlines()[0]
