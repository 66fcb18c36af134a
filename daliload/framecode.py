"""Frame-index code: every generated frame carries its own index in its pixels.

The generator (:mod:`daliload.synth`) paints a strip across the top of each
frame; any decoder's output can then be read back to tell exactly which source
frame it is, so tests of both loaders assert on frame indices, not shapes.

Layout, in fractions of the frame so it survives resizing::

    row 0 ............................................. row H*STRIP_FRACTION
    | M1 | b11 | b10 | ... | b0 | c3 | c2 | c1 | c0 | M0 |     (18 equal cells)

    M1  start marker, always bright     M0  end marker, always dark
    b11..b0  frame index, 12 bits, most significant first (bright = 1)
    c3..c0   checksum: the three 4-bit nibbles of the index XOR-ed with 0b1010

A horizontally flipped frame has its markers swapped; :func:`read_code` reports
that instead of misreading. Thresholds come from the two markers, per channel,
so frames that were normalized with any per-channel mean/std (std > 0) still
read correctly. Each cell is sampled only in its middle half, which keeps the
code readable through H.264/VP9 compression and chroma subsampling.

This module is decoder-independent (numpy only) on purpose: the tests of the
DALI path and of the PyAV fallback use the same reader.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np

INDEX_BITS = 12
CHECK_BITS = 4
NUM_CELLS = 2 + INDEX_BITS + CHECK_BITS
MAX_INDEX = (1 << INDEX_BITS) - 1
#: Fraction of the frame height taken by the code strip.
STRIP_FRACTION = 1.0 / 12.0
#: Pixel values (all RGB channels) for a 1 and a 0 cell.
BRIGHT = 235
DARK = 20

Layout = Literal["HWC", "CHW"]


class FrameCodeError(ValueError):
    """A frame's code strip could not be read (missing, damaged or ambiguous)."""


@dataclass(frozen=True)
class FrameCode:
    """What :func:`read_code` found in one frame."""

    index: int
    flipped: bool


def strip_height(height: int) -> int:
    """Rows, from the top, that the code strip of a ``height``-row frame uses."""
    return max(2, int(round(height * STRIP_FRACTION)))


def _checksum(index: int) -> int:
    return ((index >> 8) ^ (index >> 4) ^ index ^ 0b1010) & 0xF


def code_bits(index: int) -> list[int]:
    """The 18 cell values (1 bright, 0 dark) that encode ``index``, left to right."""
    if not 0 <= index <= MAX_INDEX:
        raise ValueError(f"frame index {index} is outside the code's range 0..{MAX_INDEX}")
    bits = [(index >> (INDEX_BITS - 1 - i)) & 1 for i in range(INDEX_BITS)]
    check = _checksum(index)
    bits += [(check >> (CHECK_BITS - 1 - i)) & 1 for i in range(CHECK_BITS)]
    return [1] + bits + [0]


def paint_code(frame: np.ndarray, index: int) -> np.ndarray:
    """Paint the code of ``index`` into the top strip of an HWC uint8 frame, in place.

    Args:
        frame: ``(H, W, C)`` uint8 array; modified in place.
        index: frame index, 0..4095.

    Returns:
        The same array, for chaining.
    """
    if frame.ndim != 3 or frame.dtype != np.uint8:
        raise TypeError(f"paint_code wants an (H, W, C) uint8 array, got {frame.dtype} {frame.shape}")
    height, width = frame.shape[:2]
    rows = strip_height(height)
    edges = np.linspace(0, width, NUM_CELLS + 1).round().astype(int)
    for cell, bit in enumerate(code_bits(index)):
        frame[:rows, edges[cell]:edges[cell + 1]] = BRIGHT if bit else DARK
    return frame


def _cell_means(frame: np.ndarray) -> np.ndarray:
    """Mean of the middle half of each cell: ``(NUM_CELLS, C)`` float64."""
    height, width = frame.shape[:2]
    rows = strip_height(height)
    r0, r1 = rows // 4, max(rows // 4 + 1, (3 * rows) // 4)
    edges = np.linspace(0, width, NUM_CELLS + 1)
    means = []
    for cell in range(NUM_CELLS):
        lo, hi = edges[cell], edges[cell + 1]
        c0 = int(lo + (hi - lo) / 4)
        c1 = max(c0 + 1, int(hi - (hi - lo) / 4))
        means.append(frame[r0:r1, c0:c1].reshape(-1, frame.shape[2]).mean(axis=0))
    return np.asarray(means, dtype=np.float64)


def read_code(frame, *, layout: Layout = "HWC") -> FrameCode:
    """Read the frame index painted by :func:`paint_code`.

    Works on any numeric dtype (uint8 pixels, normalized floats) and any frame
    size, as long as the frame shows the whole source frame (no crop).

    Args:
        frame: one frame, numpy array or torch tensor, ``HWC`` or ``CHW``.
        layout: ``"HWC"`` (default) or ``"CHW"``.

    Returns:
        :class:`FrameCode` with the index and whether the frame was mirrored.

    Raises:
        FrameCodeError: the strip is not there or its checksum does not match.
    """
    arr = _to_numpy(frame)
    if layout == "CHW":
        arr = np.moveaxis(arr, 0, -1)
    elif layout != "HWC":
        raise ValueError(f"layout must be 'HWC' or 'CHW', got {layout!r}")
    if arr.ndim != 3:
        raise ValueError(f"read_code wants one frame with 3 dims, got shape {arr.shape}")
    means = _cell_means(arr.astype(np.float64))
    first, last = means[0], means[-1]
    spread = np.abs(first - last)
    if not np.all(spread > 1e-6):
        raise FrameCodeError("no frame code: the two marker cells look the same")
    flipped = bool(np.mean(first - last) < 0)
    if flipped:
        means = means[::-1]
        first, last = means[0], means[-1]
    # Per channel: 0 at the dark marker, 1 at the bright one; average channels.
    levels = ((means - last) / (first - last)).mean(axis=1)
    inner = levels[1:-1]
    if np.any(np.abs(inner - 0.5) < 0.15):
        raise FrameCodeError(f"ambiguous frame code cells: {np.round(inner, 2).tolist()}")
    bits = (inner > 0.5).astype(int)
    index = int("".join(map(str, bits[:INDEX_BITS])), 2)
    check = int("".join(map(str, bits[INDEX_BITS:])), 2)
    if check != _checksum(index):
        raise FrameCodeError(f"frame code checksum mismatch (read index {index})")
    return FrameCode(index=index, flipped=flipped)


ClipLayout = Literal["THWC", "TCHW", "CTHW"]


def read_clip(frames, *, layout: ClipLayout = "THWC") -> list[int]:
    """Frame indices of every frame of a clip (see :func:`read_code`).

    Args:
        frames: ``(T, H, W, C)``, ``(T, C, H, W)`` or ``(C, T, H, W)`` array or tensor.
        layout: which of the three the clip is in.

    Returns:
        One index per frame, in clip order.
    """
    arr = _to_numpy(frames)
    if layout == "CTHW":
        arr = np.moveaxis(arr, 0, 1)
        layout = "TCHW"
    if layout == "TCHW":
        return [read_code(f, layout="CHW").index for f in arr]
    if layout == "THWC":
        return [read_code(f).index for f in arr]
    raise ValueError(f"layout must be one of THWC, TCHW, CTHW, got {layout!r}")


def _to_numpy(x) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x
    detach = getattr(x, "detach", None)
    if detach is not None:  # torch tensor, on any device and dtype
        return detach().float().cpu().numpy()
    if isinstance(x, Sequence):
        return np.asarray(x)
    raise TypeError(f"expected a numpy array or torch tensor, got {type(x).__name__}")
