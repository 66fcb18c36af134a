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

_DTYPES = {"float16": torch.float16, "float32": torch.float32, "uint8": torch.uint8}


def apply_plan(frames: np.ndarray | torch.Tensor, sample: Sample, output: OutputSpec) -> torch.Tensor:
    """Crop, resize, flip and normalize one clip as ``sample`` and ``output`` say.

    Resampling runs on uint8 (torch's antialiased uint8 path, ten times
    faster than float32 and rounded to the nearest integer, as DALI's uint8
    resize is). The two halves are :func:`crop_resize` and :func:`normalize`.

    Args:
        frames: ``(T, H, W, 3)`` uint8 RGB clip, numpy or torch.
        sample: the plan item (its ``crop`` and ``flip`` are used).
        output: output size, normalization, dtype and layout.

    Returns:
        ``(3, T, h, w)`` for ``CTHW`` or ``(T, 3, h, w)`` for ``TCHW``, where
        ``(h, w) = output.size``, of ``output.dtype``; contiguous.

    Raises:
        TypeError: ``frames`` is not uint8 or not ``(T, H, W, 3)``.
    """
    return normalize(crop_resize(frames, sample, output), output)


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
    if (y1 - y0, x1 - x0) != tuple(output.size):
        x = F.interpolate(x, size=tuple(output.size), mode="bilinear", align_corners=False, antialias=True)
    if sample.flip:
        x = x.flip(-1)
    return x


def normalize(x: torch.Tensor, output: OutputSpec) -> torch.Tensor:
    """Steps 3 and 4: ``(pixel - mean) / std``, cast to ``output.dtype``, laid out as ``output.layout``.

    Args:
        x: ``(T, 3, h, w)`` uint8 (any strides), as :func:`crop_resize` returns it.
        output: normalization, dtype and layout.

    Returns:
        A new contiguous tensor ``(3, T, h, w)`` (``CTHW``) or ``(T, 3, h, w)`` (``TCHW``).
    """
    if output.dtype == "uint8":
        out = x.permute(1, 0, 2, 3) if output.layout == "CTHW" else x
        return out.contiguous()
    # One channel at a time on contiguous memory: five times faster than
    # broadcasting mean/std over the channels-last tensor the resize returns.
    frames, height, width = x.shape[0], x.shape[-2], x.shape[-1]
    dtype = _DTYPES[output.dtype]
    if output.layout == "CTHW":
        out = torch.empty((3, frames, height, width), dtype=dtype)
        channels = [out[c] for c in range(3)]
    else:
        out = torch.empty((frames, 3, height, width), dtype=dtype)
        channels = [out[:, c] for c in range(3)]
    for c, dst in enumerate(channels):
        dst.copy_(x[:, c].float().sub_(output.mean[c]).div_(output.std[c]))
    return out
