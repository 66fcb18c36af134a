"""The epoch plan: which clip, which frames, which crop, which flip.

The plan is the single source of truth shared by both decoders. The DALI
pipeline and the PyAV fallback (``fallback/``) both take :class:`Sample` items
and an :class:`OutputSpec` and must produce the same pixels (within resampling
tolerance) for the same sample.

This module imports neither DALI nor PyAV, so ``fallback/`` can import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

#: Kinetics RGB statistics in 0..255 pixel units (those of torchvision's video models).
KINETICS_MEAN = (110.2008, 100.63983, 95.99475)
KINETICS_STD = (58.14765, 56.46975, 55.332195)

OutputDType = Literal["float16", "float32", "uint8"]
OutputLayout = Literal["CTHW", "TCHW"]


@dataclass(frozen=True)
class CropBox:
    """A crop, in fractions of the decoded frame: ``[y0, y1) x [x0, x1)``.

    ``CropBox(0, 0, 1, 1)`` is the whole frame. Relative coordinates mean the
    plan does not need to know how each decoder rounds.
    """

    y0: float
    x0: float
    y1: float
    x1: float

    def __post_init__(self) -> None:
        if not (0.0 <= self.y0 < self.y1 <= 1.0 and 0.0 <= self.x0 < self.x1 <= 1.0):
            raise ValueError(
                f"crop box must satisfy 0 <= y0 < y1 <= 1 and 0 <= x0 < x1 <= 1, got {self}"
            )

    @classmethod
    def full(cls) -> "CropBox":
        return cls(0.0, 0.0, 1.0, 1.0)


@dataclass(frozen=True)
class OutputSpec:
    """What every decoded clip is turned into, identical for both decoders.

    Attributes:
        size: output ``(height, width)`` in pixels after crop and resize.
        mean, std: per-channel RGB normalisation in 0..255 units:
            ``out = (pixel - mean) / std``. Use mean 0 and std 1 for raw pixels.
        dtype: ``float16`` (default), ``float32`` or ``uint8`` (uint8 skips
            normalisation and requires mean 0, std 1).
        layout: ``CTHW`` (default, what 3D CNNs take) or ``TCHW``.
    """

    size: tuple[int, int] = (224, 224)
    mean: tuple[float, float, float] = KINETICS_MEAN
    std: tuple[float, float, float] = KINETICS_STD
    dtype: OutputDType = "float16"
    layout: OutputLayout = "CTHW"

    def __post_init__(self) -> None:
        if len(self.size) != 2 or min(self.size) < 1:
            raise ValueError(f"size must be (height, width) with both >= 1, got {self.size}")
        if len(self.mean) != 3 or len(self.std) != 3:
            raise ValueError(f"mean and std need 3 values (RGB), got {self.mean}, {self.std}")
        if any(s <= 0 for s in self.std):
            raise ValueError(f"std values must be > 0, got {self.std}")
        if self.dtype not in ("float16", "float32", "uint8"):
            raise ValueError(f"dtype must be 'float16', 'float32' or 'uint8', got {self.dtype!r}")
        if self.layout not in ("CTHW", "TCHW"):
            raise ValueError(f"layout must be 'CTHW' or 'TCHW', got {self.layout!r}")
        if self.dtype == "uint8" and (any(self.mean) or any(s != 1 for s in self.std)):
            raise ValueError("dtype 'uint8' cannot hold normalised values: use mean=(0,0,0), std=(1,1,1)")


@dataclass(frozen=True)
class Sample:
    """One planned clip: everything a decoder needs to produce it.

    Attributes:
        position: index of this sample in the rank's plan for the epoch.
        video_index: index of the video in the record list the plan was made from.
        path: the video file.
        label: class index.
        start_frame: first decoded frame (0-based, in decode/presentation order).
        frame_stride: step between consecutive clip frames.
        clip_len: frames in the clip. Frames past the end of the video repeat
            the last frame (``pad_mode="edge"``).
        crop: crop box, relative to the decoded frame.
        flip: mirror horizontally.
        is_padding: True for samples repeated only to give every rank the same
            count; validation drops them.
    """

    position: int
    video_index: int
    path: str
    label: int
    start_frame: int
    frame_stride: int
    clip_len: int
    crop: CropBox
    flip: bool = False
    is_padding: bool = False

    def frame_indices(self, num_frames: int | None = None) -> list[int]:
        """Source frame of each clip frame; clamped to ``num_frames - 1`` if given."""
        idx = [self.start_frame + i * self.frame_stride for i in range(self.clip_len)]
        if num_frames is not None:
            if num_frames < 1:
                raise ValueError(f"{self.path}: video has no frames")
            idx = [min(i, num_frames - 1) for i in idx]
        return idx
