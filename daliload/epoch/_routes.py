"""Where each sample of a pass goes: DALI, the fallback, or nowhere (:class:`Routes`, one per loader).

The one place a routing policy lives: a hybrid one (idle CPU workers taking
DALI's samples when NVDEC is saturated) would change :class:`Routes`, nothing else.
"""

from __future__ import annotations

import logging
import warnings

import numpy as np

from daliload.dataset import ROUTE_CODES, VideoIndex
from daliload.failures import Failure
from daliload.plan import Sample

logger = logging.getLogger(__name__)

#: DALI batches in a row that fail with no single file to blame before DALI is given up for the run.
DALI_FAILURE_STREAK = 3


class Routes:
    """Where each file goes, for the whole run: DALI, the fallback, or nowhere.

    Starts from the pre-screen's routes. A file that DALI alone fails on (found
    by isolating a failed batch) moves to the fallback from the next batch on;
    after :data:`DALI_FAILURE_STREAK` failed batches in a row with no single
    file to blame (a driver or library problem), DALI is given up for the run.
    A file whose decode killed a worker twice or ran past the time limit is
    not decoded again in this run (:meth:`quarantine`): its samples fail at
    once with that reason, and are replaced.

    Args:
        on_dali: by ``Sample.video_index``, whether the video's route is
            ``dali`` (a boolean array over the split: no Python object per
            video); ``None`` (default): DALI is not used.
    """

    def __init__(self, on_dali: np.ndarray | None = None) -> None:
        self._on_dali = on_dali
        self.rerouted: set[str] = set()
        self.quarantined: dict[str, Failure] = {}  # path -> the failure that put it there
        self.dali_disabled: str | None = None  # why DALI was given up, once it was
        self._streak = 0

    def uses_dali(self, sample: Sample) -> bool:
        return (self.dali_disabled is None and self._on_dali is not None and bool(self._on_dali[sample.video_index])
                and sample.path not in self.rerouted)

    def quarantine(self, failure: Failure) -> None:
        """Decode ``failure``'s file no more in this run, if it crashed or hung a worker."""
        if failure.kind in ("crash", "timeout"):
            self.quarantined.setdefault(failure.path, failure)

    def reroute(self, paths: set[str]) -> None:
        """Send ``paths`` (files of route ``dali``) to the fallback from now on."""
        self.rerouted |= paths

    def note_batch(self, *, blamed: bool, reason: str = "") -> None:
        """Count a failed DALI batch: ``blamed`` when isolation found the files at fault."""
        self._streak = 0 if blamed else self._streak + 1
        if self._streak >= DALI_FAILURE_STREAK and self.dali_disabled is None:
            self.dali_disabled = (f"{self._streak} DALI batches in a row failed with no single file to blame "
                                  f"(last: {reason})")
            warnings.warn(f"{self.dali_disabled}; the rest of this run decodes every file with the PyAV "
                          "fallback (loader.stats().dali_disabled)", RuntimeWarning, stacklevel=2)


def dali_videos(index: VideoIndex, max_pixels: int | None) -> np.ndarray:
    """By video, whether DALI decodes it: route ``dali`` and frames no larger than ``max_pixels``
    (``DecodeSpec.dali_max_pixels``; ``None``: any size). The start of :class:`Routes`."""
    on_dali = index.route == ROUTE_CODES["dali"]
    if max_pixels is not None:
        large = on_dali & (index.width.astype(np.int64) * index.height.astype(np.int64) > max_pixels)
        if large.any():
            on_dali &= ~large
            logger.info("%d video(s) of route dali are larger than dali_max_pixels=%d: the fallback decodes "
                        "them", int(large.sum()), max_pixels)
    return on_dali
