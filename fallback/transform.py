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

On a GPU host the steps split between two places: the fallback's workers do
steps 1, 2 and 4 and write uint8 pixels (:func:`pixel_spec`: a quarter of a
float32 clip's bytes to carry to the GPU, and none of the float math on the
CPU), and the merge does step 3 on the GPU (:func:`normalize_pixels`, the same
operations in the same order as :func:`normalize`, so the batch is bitwise the
same as the one the workers would have normalised).
"""

from __future__ import annotations

import dataclasses
import functools

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
    scale, shift = (c.view(3, 1, 1) for c in _scale_shift(tuple(output.mean), tuple(output.std), torch.device("cpu")))
    scratch = torch.empty((3, height, width), dtype=torch.float32)
    for t in range(frames):
        dst = frame_of(t)
        work = dst if dtype == torch.float32 else scratch
        work.copy_(x[t]).mul_(scale).add_(shift)
        if work is not dst:
            dst.copy_(work)
    return out


def pixel_spec(output: OutputSpec) -> OutputSpec:
    """What a worker writes when the merge normalises: ``output``'s size and layout, uint8, not normalised.

    Steps 1, 2 and 4 of :func:`apply_plan` with this spec give the pixels that
    :func:`normalize_pixels` turns into what ``apply_plan`` with ``output`` gives.
    """
    return dataclasses.replace(output, dtype="uint8", mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))


def normalize_pixels(x: torch.Tensor, output: OutputSpec, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Step 3 alone, on clips already laid out (:func:`pixel_spec`): uint8 in, ``output.dtype`` out, on ``x``'s device.

    What the merge runs for the fallback's clips on a GPU host. The arithmetic
    is :func:`normalize`'s, operation for operation: uint8 to float32 (exact),
    times the same float32 ``1/std``, plus the same float32 ``-mean/std``, one
    rounding each, then one cast. So on any device the result is bitwise what
    ``normalize`` gives on the CPU (``tests/test_lean_fallback.py`` checks it
    on the CPU; a GPU run must confirm it there).

    Args:
        x: uint8 clips in ``output.layout``, with any leading dimensions:
            ``(..., 3, T, h, w)`` (``CTHW``) or ``(..., T, 3, h, w)`` (``TCHW``).
        output: normalisation, dtype and layout.
        out: a contiguous tensor of ``x``'s shape, of ``output.dtype``, on
            ``x``'s device, to write into (the batch's rows); default: a new tensor.

    Returns:
        ``out`` when given, else a new contiguous tensor of ``x``'s shape.

    Raises:
        ValueError: ``x`` is not uint8 clips, or ``out`` has another shape,
            dtype or device, or is not contiguous.
    """
    if x.dtype != torch.uint8 or x.ndim < 4:
        raise ValueError(f"normalize_pixels wants uint8 clips (..., 3, T, h, w) or (..., T, 3, h, w), "
                         f"got {x.dtype} {tuple(x.shape)}")
    dtype = output_dtype(output)
    if out is None:
        out = torch.empty(x.shape, dtype=dtype, device=x.device)
    elif out.shape != x.shape or out.dtype != dtype or out.device != x.device or not out.is_contiguous():
        raise ValueError(f"normalize_pixels: out must be a contiguous {dtype} tensor of shape {tuple(x.shape)} on "
                         f"{x.device}, got {out.dtype} {tuple(out.shape)} on {out.device}")
    if output.dtype == "uint8":
        return out.copy_(x)
    # Aligned with the last four (CTHW) or three (TCHW) dimensions: the channel axis, whatever leads.
    per_channel = (3, 1, 1, 1) if output.layout == "CTHW" else (3, 1, 1)
    scale, shift = (c.view(per_channel) for c in _scale_shift(tuple(output.mean), tuple(output.std), x.device))
    if dtype == torch.float32:
        return out.copy_(x).mul_(scale).add_(shift)
    # A half-precision output goes through float32 one clip at a time, as normalize does it frame by frame:
    # a whole batch in float32 would be twice the batch's own memory.
    scratch = torch.empty(x.shape[-4:], dtype=torch.float32, device=x.device)
    for src, dst in zip(x.reshape(-1, *x.shape[-4:]), out.view(-1, *x.shape[-4:])):
        dst.copy_(scratch.copy_(src).mul_(scale).add_(shift))
    return out


@functools.lru_cache(maxsize=8)
def _scale_shift(mean: tuple[float, ...], std: tuple[float, ...],
                 device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``1/std`` and ``-mean/std`` as float32 on ``device``: the constants both normalisations use.

    Computed in Python's float64 and rounded once to float32, the same for
    the worker and the merge. Kept per device: the merge would otherwise copy
    six numbers to the GPU for every batch.
    """
    scale = torch.tensor([1.0 / s for s in std], dtype=torch.float32)
    shift = torch.tensor([-m / s for m, s in zip(mean, std)], dtype=torch.float32)
    return scale.to(device), shift.to(device)
