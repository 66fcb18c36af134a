"""What a plan is made of: the specs users give and the :class:`Sample` each decoder takes.

* :class:`CropBox` (relative crop, and the one rule that turns it into pixels),
  :class:`OutputSpec` (size, normalisation, dtype, layout) and :class:`Sample`
  (one planned clip, and the edge rule for frames past the end of a video);
* :class:`ClipSpec` (which frames make a clip) and :class:`AugmentSpec`
  (spatial augmentation and output size).

Imports neither DALI nor PyAV nor torch: both decoders import it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np

#: Kinetics RGB statistics in 0..255 pixel units (those of torchvision's video models).
KINETICS_MEAN = (110.2008, 100.63983, 95.99475)
KINETICS_STD = (58.14765, 56.46975, 55.332195)

OutputDType = Literal["float32", "float16", "bfloat16", "uint8"]
#: Every OutputDType, in the order the docs list them.
OUTPUT_DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16", "uint8")
OutputLayout = Literal["CTHW", "TCHW"]
#: The units of :class:`OutputSpec` ``mean`` and ``std``: pixel levels, fractions of 255, or detected.
NormUnits = Literal["auto", "0..255", "0..1"]


@dataclass(frozen=True)
class CropBox:
    """A crop, in fractions of the decoded frame: ``[y0, y1) x [x0, x1)``.

    ``CropBox(0, 0, 1, 1)`` is the whole frame. The plan builds boxes on whole
    pixels of the frame size the pre-screen recorded (:meth:`from_pixels`), and
    :meth:`pixels` is the one rule that turns a box back into pixels: the
    fallback crops with it, and DALI's relative ``roi`` lands on the same pixel
    edges whenever the decoded frame has the recorded size (on another size,
    DALI keeps the fractions exactly while the fallback rounds to whole pixels).
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

    @classmethod
    def from_pixels(cls, top: int, left: int, box_h: int, box_w: int, width: int, height: int) -> "CropBox":
        """The box of rows ``top .. top + box_h`` and columns ``left .. left + box_w`` of a frame."""
        return cls(top / height, left / width, (top + box_h) / height, (left + box_w) / width)

    def pixels(self, height: int, width: int) -> tuple[int, int, int, int]:
        """The pixel rows/columns ``(y0, x0, y1, x1)`` of this box on a ``height`` x ``width`` frame.

        Edges are rounded half up to whole pixels and the box keeps at least
        one pixel, so a tiny box on a tiny frame still yields a crop; a box
        made by :meth:`from_pixels` for the same size gives its pixels back.

        Example: ``CropBox(0.25, 0.5, 0.75, 1.0).pixels(96, 128) == (24, 64, 72, 128)``.
        """
        def edge(fraction: float, size: int) -> int:
            return min(size, max(0, math.floor(fraction * size + 0.5)))

        y0, y1 = edge(self.y0, height), edge(self.y1, height)
        x0, x1 = edge(self.x0, width), edge(self.x1, width)
        y1, x1 = max(y1, min(height, y0 + 1)), max(x1, min(width, x0 + 1))
        y0, x0 = min(y0, y1 - 1), min(x0, x1 - 1)
        return y0, x0, y1, x1


@dataclass(frozen=True)
class OutputSpec:
    """What every decoded clip is turned into, identical for both decoders.

    Attributes:
        size: output ``(height, width)`` in pixels after crop and resize.
            ``None`` (default): the loader's crop size (``crop_size`` /
            ``AugmentSpec.crop_size``); a decoder built on its own needs it set.
        mean, std: per-channel RGB normalisation: ``out = (pixel - mean) /
            std``, in 0..255 units (pixel levels: the default Kinetics
            constants; mean 0 and std 1 for raw pixels) or in 0..1 units (what
            torchvision's and Hugging Face's processors pass, e.g. ImageNet's
            ``(0.485, 0.456, 0.406)``, ``(0.229, 0.224, 0.225)``, with pixels
            read as fractions of 255). Values in 0..1 units are stored times 255,
            so ``OutputSpec(mean=m, std=s) == OutputSpec(mean=m * 255, std=s *
            255)`` and both give the same output, bit for bit.
        units: ``"auto"`` (default) tells the units from the values: every
            std below 1 and every mean at most 1 is 0..1, every std at least 1
            is 0..255 (with a mean that is 0 or above 1); a mean and a std that
            look like different units raise a ``ValueError`` saying which
            looks like which. ``"0..255"`` or ``"0..1"`` says it outright.
        dtype: ``float32`` (default: what a float32 model takes as it is, and
            what ``torch.autocast`` casts from), ``float16`` or ``bfloat16``
            (half the bytes of a batch; feed them to a model of that dtype or
            under autocast), or ``uint8`` (a quarter of the bytes; skips
            normalisation and requires mean 0, std 1: normalise on the device).
            DALI has no bfloat16 output: it normalises in float32 and the batch
            is cast on the device.
        layout: ``CTHW`` (default, what 3D CNNs take) or ``TCHW``.
    """

    size: tuple[int, int] | None = None
    mean: tuple[float, float, float] = KINETICS_MEAN
    std: tuple[float, float, float] = KINETICS_STD
    dtype: OutputDType = "float32"
    layout: OutputLayout = "CTHW"
    units: NormUnits = "auto"

    def __post_init__(self) -> None:
        if self.size is not None and (len(self.size) != 2 or min(self.size) < 1):
            raise ValueError(f"size must be (height, width) with both >= 1, or None (the crop size), got {self.size}")
        for name in ("mean", "std"):
            values = getattr(self, name)
            if (not isinstance(values, (tuple, list, np.ndarray)) or len(values) != 3
                    or not all(isinstance(v, (int, float, np.number)) and not isinstance(v, bool) for v in values)):
                raise ValueError(f"mean and std need 3 numbers (RGB), got {name}={values!r}")
        if any(s <= 0 for s in self.std):
            raise ValueError(f"std values must be > 0, got {self.std}")
        if self.units not in ("auto", "0..255", "0..1"):
            raise ValueError(f"units must be 'auto', '0..255' or '0..1', got {self.units!r}")
        scale = 255 if _norm_units(self.mean, self.std, self.units) == "0..1" else 1
        # Stored in pixel levels, whatever the units given: one spec, one output, for both decoders.
        object.__setattr__(self, "mean", tuple(float(m) * scale for m in self.mean))
        object.__setattr__(self, "std", tuple(float(s) * scale for s in self.std))
        object.__setattr__(self, "units", "0..255")
        if self.dtype not in OUTPUT_DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(map(repr, OUTPUT_DTYPES))}, got {self.dtype!r}")
        if self.layout not in ("CTHW", "TCHW"):
            raise ValueError(f"layout must be 'CTHW' or 'TCHW', got {self.layout!r}")
        if self.dtype == "uint8" and (any(self.mean) or any(s != 1 for s in self.std)):
            raise ValueError("dtype 'uint8' cannot hold normalised values: use mean=(0,0,0), std=(1,1,1)")

    def sized(self) -> "OutputSpec":
        """This spec, checked to have a ``size`` (what a decoder needs; the loader fills it from the crop size).

        Raises:
            ValueError: ``size`` is ``None``.
        """
        if self.size is None:
            raise ValueError("OutputSpec.size is not set: a decoder used on its own needs the output size, "
                             "e.g. OutputSpec(size=(224, 224)) (the loader sets it from crop_size)")
        return self


def _norm_units(mean: Sequence[float], std: Sequence[float], units: str) -> str:
    """``"0..255"`` or ``"0..1"``: ``units`` unless ``"auto"``, else what the values look like (:class:`OutputSpec`)."""
    if units != "auto":
        return units
    std_units = "0..1" if all(s < 1 for s in std) else "0..255" if all(s >= 1 for s in std) else None
    mean_units = "0..255" if any(m > 1 for m in mean) else "either" if not any(mean) else "0..1"
    if std_units is None:
        raise ValueError(f"std={tuple(std)} mixes units: values below 1 look like 0..1 units, values of 1 and "
                         "above like 0..255 units (pixel levels); give all three in one unit")
    if mean_units not in ("either", std_units):
        raise ValueError(
            f"mean={tuple(mean)} looks like {mean_units} units but std={tuple(std)} looks like {std_units} units; "
            "give both in one unit: 0..1 (torchvision's and Hugging Face's, e.g. ImageNet's mean (0.485, 0.456, "
            "0.406), std (0.229, 0.224, 0.225)) or 0..255 (pixel levels: those times 255), or say which with "
            "OutputSpec(units='0..1') or units='0..255'")
    return std_units


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
        view: which of its video's samples this one is, ``0 .. V-1``: a view
            (temporal-major; :func:`~daliload.plan.make_val_plan` with
            ``views``) or a clip of repeated sampling
            (:func:`~daliload.plan.make_train_plan` with ``clips_per_video``);
            0 with one sample a video. A video's samples follow one another in
            the plan, so a decoder can read the file once for all of them.
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
    view: int = 0

    @property
    def last_frame(self) -> int:
        """The source frame of the clip's last frame (past the video's end if the clip runs past it)."""
        return self.start_frame + clip_span(self.clip_len, self.frame_stride) - 1

    def frame_indices(self, num_frames: int | None = None) -> list[int]:
        """Source frame of each clip frame; past the end, the edge rule if ``num_frames`` is given."""
        idx = [self.start_frame + i * self.frame_stride for i in range(self.clip_len)]
        if num_frames is not None:
            if num_frames < 1:
                raise ValueError(f"{self.path}: video has no frames")
            idx = clamp_frame_indices(idx, num_frames)
        return idx


def clip_span(clip_len: int, frame_stride: int) -> int:
    """Source frames a clip of ``clip_len`` frames at ``frame_stride`` covers: ``(clip_len - 1) * stride + 1``."""
    return (clip_len - 1) * frame_stride + 1


def clamp_frame_indices(frame_indices: Sequence[int], num_frames: int) -> list[int]:
    """The edge rule: frames past the end of a video repeat its last frame (DALI's ``pad_mode="edge"``).

    Example: ``clamp_frame_indices([30, 38, 46], 40) == [30, 38, 39]``.
    """
    last = num_frames - 1
    return [min(i, last) for i in frame_indices]


def usable_fps(fps: object) -> bool:
    """Whether ``fps`` is a frame rate planning can use: a finite number > 0."""
    return isinstance(fps, (int, float)) and not isinstance(fps, bool) and math.isfinite(fps) and fps > 0



CropMode = Literal["short_side_jitter", "random_resized", "center"]
_CROP_MODES = ("short_side_jitter", "random_resized", "center")


def check_views(views: object) -> tuple[int, int]:
    """``views`` as ``(num_temporal, num_spatial)``, both integers >= 1; else ``ValueError`` naming it."""
    if not (isinstance(views, (tuple, list)) and len(views) == 2 and all(is_int(v) and v >= 1 for v in views)):
        raise ValueError(f"views must be (num_temporal, num_spatial), two integers >= 1, e.g. (10, 3); "
                         f"got {views!r}")
    return int(views[0]), int(views[1])


@dataclass(frozen=True)
class ClipSpec:
    """Which frames make a clip.

    Attributes:
        clip_len: frames per clip (>= 1). Default 16.
        frame_stride: step between consecutive clip frames, in source frames
            (>= 1). Default 4. With ``target_fps`` it is the stride at that rate.
        target_fps: if set (frames/s, > 0), each video's stride becomes
            ``max(1, round_half_up(frame_stride * video_fps / target_fps))``, so
            a 25 fps and a 60 fps video span the same time. ``None`` (default)
            uses ``frame_stride`` for every video.
    """

    clip_len: int = 16
    frame_stride: int = 4
    target_fps: float | None = None

    def __post_init__(self) -> None:
        if not is_int(self.clip_len) or self.clip_len < 1:
            raise ValueError(f"clip_len must be an integer >= 1, got {self.clip_len!r}")
        if not is_int(self.frame_stride) or self.frame_stride < 1:
            raise ValueError(f"frame_stride must be an integer >= 1, got {self.frame_stride!r}")
        if self.target_fps is not None and not usable_fps(self.target_fps):
            raise ValueError(
                f"target_fps must be None or a finite number > 0 (frames/s), got {self.target_fps!r}"
            )

    def stride_for(self, fps: float) -> int:
        """Frame stride for a video at ``fps`` frames/s (see ``target_fps``)."""
        if self.target_fps is None:
            return self.frame_stride
        return max(1, math.floor(self.frame_stride * fps / self.target_fps + 0.5))

    def span(self, frame_stride: int) -> int:
        """Source frames one clip covers at ``frame_stride``: ``(clip_len - 1) * stride + 1``."""
        return clip_span(self.clip_len, frame_stride)


@dataclass(frozen=True)
class AugmentSpec:
    """Spatial augmentation of training clips, and the output size of every clip.

    One crop and one flip apply to all frames of a clip. Crop boxes are chosen
    in the decoded frame's pixels, snapped to whole pixels, and stored relative
    (:class:`CropBox`), so both decoders cut the same pixels; the decoder then
    resizes the box to ``output_size``.

    Attributes:
        crop_size: output size in pixels, an int for a square or
            ``(height, width)``. Default 224.
        crop_mode:
            ``"short_side_jitter"`` (default): scale the frame so its short side
            is a random integer in ``short_side_range`` (inclusive), then take a
            random ``crop_size`` crop of the scaled frame. If the scaled frame
            is smaller than the crop in a dimension, the box takes that whole
            dimension (the decoder then upsamples).
            ``"random_resized"``: torchvision's RandomResizedCrop: a box of a
            random fraction ``area_range`` of the frame area and a log-uniform
            aspect ratio (width/height) in ``aspect_range``, at a random place
            (10 tries, then the largest centred box within ``aspect_range``).
            ``"center"``: the largest centred box with the output's aspect
            ratio, i.e. short side scaled to ``crop_size`` then centre crop.
        short_side_range: ``(min, max)`` short side in pixels for
            ``"short_side_jitter"``. Default ``(256, 320)``.
        area_range: ``(min, max)`` fraction of the frame area for
            ``"random_resized"``, in (0, 1]. Default ``(0.08, 1.0)`` as in
            torchvision; video recipes often use ``(0.3, 1.0)``.
        aspect_range: ``(min, max)`` box width/height for ``"random_resized"``.
            Default ``(3/4, 4/3)``.
        flip_prob: probability of a horizontal flip, in [0, 1]. Default 0.5.
    """

    crop_size: int | tuple[int, int] = 224
    crop_mode: CropMode = "short_side_jitter"
    short_side_range: tuple[int, int] = (256, 320)
    area_range: tuple[float, float] = (0.08, 1.0)
    aspect_range: tuple[float, float] = (3 / 4, 4 / 3)
    flip_prob: float = 0.5

    def __post_init__(self) -> None:
        size = self.crop_size
        if is_int(size):
            ok = size >= 1
        else:
            ok = (isinstance(size, tuple) and len(size) == 2
                  and all(is_int(v) and v >= 1 for v in size))
        if not ok:
            raise ValueError(
                f"crop_size must be an int >= 1 or (height, width) of ints >= 1, got {size!r}"
            )
        if self.crop_mode not in _CROP_MODES:
            raise ValueError(f"crop_mode must be one of {_CROP_MODES}, got {self.crop_mode!r}")
        lo, hi = self.short_side_range
        if not (is_int(lo) and is_int(hi) and 1 <= lo <= hi):
            raise ValueError("short_side_range must be (min, max) pixels with 1 <= min <= max, "
                             f"got {self.short_side_range!r}")
        lo, hi = self.area_range
        if not 0 < lo <= hi <= 1:
            raise ValueError(
                f"area_range must satisfy 0 < min <= max <= 1, got {self.area_range!r}"
            )
        lo, hi = self.aspect_range
        if not 0 < lo <= hi:
            raise ValueError(f"aspect_range must satisfy 0 < min <= max, got {self.aspect_range!r}")
        if not 0 <= self.flip_prob <= 1:
            raise ValueError(f"flip_prob must be in [0, 1], got {self.flip_prob!r}")

    @property
    def output_size(self) -> tuple[int, int]:
        """Output ``(height, width)`` in pixels (what :class:`OutputSpec` ``size`` should be)."""
        if is_int(self.crop_size):
            return (int(self.crop_size), int(self.crop_size))
        return (int(self.crop_size[0]), int(self.crop_size[1]))



def is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


