"""Turn decoded frames into the plan's output tensor, in torch: crop, resize, flip, normalize.

The same :class:`~daliload.plan.Sample` and :class:`~daliload.plan.OutputSpec`
drive DALI's ``fn.resize`` + ``fn.crop_mirror_normalize``; this is the PyAV
path's equivalent, step for step:

1. crop the relative box (:meth:`~daliload.plan.CropBox.pixels`) and resize it to
   ``output.size`` with antialiased bilinear resampling (skipped when the crop
   already has that size);
2. mirror horizontally if ``sample.flip``;
3. ``(pixel - mean) / std`` in 0..255 units, cast to ``output.dtype``;
4. lay out as ``CTHW`` or ``TCHW``.

Worked example: a ``(16, 256, 340, 3)`` clip, ``CropBox(0.125, 0.1, 0.875, 0.9)``,
``OutputSpec(size=(112, 112))`` crops rows 32..224 and columns 34..306 (a
192x272 region), resizes it to 112x112, and returns ``(3, 16, 112, 112)`` float16.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from daliload.plan import OutputSpec, Sample

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "uint8": torch.uint8}


def apply_plan(frames: np.ndarray | torch.Tensor, sample: Sample, output: OutputSpec, *,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """Crop, resize, flip and normalize one clip as ``sample`` and ``output`` say.

    Resampling runs on uint8 (torch's antialiased uint8 path, ten times
    faster than float32 and rounded to the nearest integer, as DALI's uint8
    resize is). The two halves are :func:`crop_resize` and :func:`normalize`.

    Args:
        frames: ``(T, H, W, 3)`` uint8 RGB clip, numpy or torch.
        sample: the plan item (its ``crop`` and ``flip`` are used).
        output: output size, normalization, dtype and layout.
        out: where to write the clip (see :func:`normalize`); default: a new tensor.

    Returns:
        ``(3, T, h, w)`` for ``CTHW`` or ``(T, 3, h, w)`` for ``TCHW``, where
        ``(h, w) = output.size``, of ``output.dtype``; contiguous (``out`` when given).

    Raises:
        TypeError: ``frames`` is not uint8 or not ``(T, H, W, 3)``.
        ValueError: ``out`` has another shape or dtype than the clip.
    """
    return normalize(crop_resize(frames, sample, output), output, out=out)


def crop_resize(frames: np.ndarray | torch.Tensor, sample: Sample, output: OutputSpec) -> torch.Tensor:
    """Steps 1 and 2: the plan's crop, resized to ``output.size`` on uint8, mirrored if ``sample.flip``.

    Returns:
        ``(T, 3, h, w)`` uint8, a channels-last view (what the resize returns; not copied).

    Raises:
        TypeError: ``frames`` is not uint8 or not ``(T, H, W, 3)``.
    """
    clip = torch.from_numpy(frames) if isinstance(frames, np.ndarray) else frames
    if not isinstance(clip, torch.Tensor) or clip.dtype != torch.uint8 or clip.ndim != 4 or clip.shape[-1] != 3:
        raise TypeError(f"{sample.path}: apply_plan wants (T, H, W, 3) uint8 frames, got "
                        f"{getattr(clip, 'dtype', type(clip).__name__)} {tuple(getattr(clip, 'shape', ()))}")
    _, height, width, _ = clip.shape
    y0, x0, y1, x1 = sample.crop.pixels(height, width)  # the plan's one crop rule
    x = clip[:, y0:y1, x0:x1, :].permute(0, 3, 1, 2)  # TCHW view
    size = tuple(output.sized().size)
    if (y1 - y0, x1 - x0) != size:
        x = F.interpolate(x, size=size, mode="bilinear", align_corners=False, antialias=True)
    if sample.flip:
        x = x.flip(-1)
    return x


def clip_shape(clip_len: int, output: OutputSpec) -> tuple[int, int, int, int]:
    """The shape :func:`apply_plan` gives a clip of ``clip_len`` frames: ``(3, T, h, w)`` or ``(T, 3, h, w)``."""
    height, width = output.sized().size
    return (3, clip_len, height, width) if output.layout == "CTHW" else (clip_len, 3, height, width)


def output_dtype(output: OutputSpec) -> torch.dtype:
    """The torch dtype of ``output.dtype``."""
    return _DTYPES[output.dtype]


def normalize(x: torch.Tensor, output: OutputSpec, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Steps 3 and 4: ``(pixel - mean) / std``, cast to ``output.dtype``, laid out as ``output.layout``.

    Args:
        x: ``(T, 3, h, w)`` uint8 (any strides), as :func:`crop_resize` returns it.
        output: normalization, dtype and layout.
        out: a contiguous tensor of the result's shape and dtype to write
            into (a worker's shared-memory transfer, so the clip is not
            copied again); default: a new tensor.

    Returns:
        A contiguous tensor ``(3, T, h, w)`` (``CTHW``) or ``(T, 3, h, w)`` (``TCHW``): ``out`` when given.

    Raises:
        ValueError: ``out`` has another shape or dtype, or is not contiguous.
    """
    frames, height, width = x.shape[0], x.shape[-2], x.shape[-1]
    shape, dtype = clip_shape(frames, output), output_dtype(output)
    if out is None:
        out = torch.empty(shape, dtype=dtype)
    elif tuple(out.shape) != shape or out.dtype != dtype or not out.is_contiguous():
        raise ValueError(f"normalize: out must be a contiguous {dtype} tensor of shape {shape}, "
                         f"got {out.dtype} {tuple(out.shape)}")
    frame_of = (lambda t: out[:, t]) if output.layout == "CTHW" else (lambda t: out[t])
    if output.dtype == "uint8":
        for t in range(frames):
            frame_of(t).copy_(x[t])
        return out
    # Frame by frame through a float32 scratch that stays in cache: (x * 1/std) + (-mean/std),
    # then one cast into ``out``. A third faster than a pass per channel over the whole clip.
    scale = torch.tensor([1.0 / s for s in output.std], dtype=torch.float32).view(3, 1, 1)
    shift = torch.tensor([-m / s for m, s in zip(output.mean, output.std)], dtype=torch.float32).view(3, 1, 1)
    scratch = torch.empty((3, height, width), dtype=torch.float32)
    for t in range(frames):
        dst = frame_of(t)
        work = dst if dtype == torch.float32 else scratch
        work.copy_(x[t]).mul_(scale).add_(shift)
        if work is not dst:
            dst.copy_(work)
    return out
