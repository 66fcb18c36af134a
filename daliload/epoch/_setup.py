"""What a pass is given by its loader (:class:`PassSetup`) and what it counts (:class:`EpochCounters`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from daliload.plan import OutputSpec

#: Label given to padding samples when ``label_padding`` is on (validation default),
#: and to failed samples outside training.
PADDING_LABEL = -1


@dataclass
class EpochCounters:
    """What one pass did; :class:`~daliload.LoaderStats` reports them with the budget's failures."""

    batches: int = 0
    clips_dali: int = 0
    clips_fallback: int = 0
    clips_redecoded: int = 0
    clips_masked: int = 0
    clips_past_end: int = 0
    frames_decoded_fallback: int = 0
    frames_decoded_dali: int = 0
    clips_dali_cut: int = 0
    clips_moved: int = 0
    dali_wait_s: float = 0.0
    fallback_wait_s: float = 0.0
    isolation_s: float = 0.0


@dataclass(frozen=True)
class PassSetup:
    """What a pass needs from its loader, fixed for the run.

    Attributes:
        output: what every clip is turned into (for the merge's shapes).
        device: where batches are assembled (``cuda:N`` or the CPU).
        label_padding: give padding samples :data:`PADDING_LABEL`.
        mask_failed: give failed (replaced) samples :data:`PADDING_LABEL`
            (evaluation splits).
        prefetch: batches submitted ahead of the one being collected.
        num_frames: ``video_index -> frames`` of a video (for counting clips
            that run past its end; ``None`` when unknown).
        views: clips per video of a multi-view plan (its views follow one
            another in each batch); the merge then gives ``(B, V, ...)``
            videos and one label per video. 0: single-view batches.
        padding_label: the label of those rows (:data:`PADDING_LABEL`, or
            the user's ``padding_label``: -100 is what Hugging Face's losses
            and ``torch.nn.CrossEntropyLoss`` ignore by default).
    """

    output: OutputSpec
    device: torch.device
    label_padding: bool
    mask_failed: bool
    prefetch: int
    num_frames: Callable[[int], int | None]
    views: int = 0
    padding_label: int = PADDING_LABEL
