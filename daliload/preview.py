"""Contact sheets: frames of several loaded clips in a grid, to check augmentations by eye.

``daliload preview ROOT`` takes the first batch that :class:`KineticsDALILoader`
yields for a split (training clips carry their random crop and flip), undoes
the normalisation and writes one PNG. Layout, in pixels (``P`` = :data:`PAD`,
``L`` = :data:`LABEL_HEIGHT`, tiles ``h`` x ``w`` = the clip's frame size
times an integer ``scale``)::

    P
    | P | label 2: spin (clip 0)                                | P
    |   +-----------+ P +-----------+ P +-----------+           |
    |   | frame t0  |   | frame t1  |   | frame t2  | ...       |   one row per clip
    |   +-----------+   +-----------+   +-----------+           |
    P
    | P | label 0: blink (clip 1)  ...                          |

The frames shown are ``frames`` evenly spaced clip frames (first and last
included). Pixels of a tile are the clip's pixels, each repeated ``scale``
times in both directions (no interpolation), so the sheet shows exactly what
the model is fed.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

#: Background grey and the gaps between tiles, in pixels.
PAD = 4
#: Height of the text band above each row of tiles, in pixels.
LABEL_HEIGHT = 18
#: Tiles are upscaled by an integer factor until their long side is at least this many pixels.
MIN_TILE_SIDE = 96
_BACKGROUND = 255

HELP = "write a PNG contact sheet of augmented clips from a dataset, to check augmentations by eye"


@dataclass(frozen=True)
class ContactSheet:
    """A written contact sheet and where everything is on it.

    Attributes:
        path: the PNG file.
        width, height: image size in pixels.
        frame_indices: which clip frames the columns show (0-based within the clip).
        labels: label of each row's clip.
        titles: text above each row.
        tile_height, tile_width: size of one frame tile in pixels.
        scale: integer upscaling of the clip's frames into tiles.
    """

    path: str
    width: int
    height: int
    frame_indices: tuple[int, ...]
    labels: tuple[int, ...]
    titles: tuple[str, ...]
    tile_height: int
    tile_width: int
    scale: int

    def tile_box(self, row: int, column: int) -> tuple[int, int, int, int]:
        """``(top, left, height, width)`` in pixels of the tile at ``row`` (clip), ``column``."""
        top = PAD + row * (LABEL_HEIGHT + self.tile_height + PAD) + LABEL_HEIGHT
        left = PAD + column * (self.tile_width + PAD)
        return top, left, self.tile_height, self.tile_width


def sheet_frame_indices(clip_len: int, frames: int) -> tuple[int, ...]:
    """``frames`` evenly spaced positions in a ``clip_len``-frame clip, first and last included.

    Raises:
        ValueError: ``frames`` < 1 or more than ``clip_len``.
    """
    if not 1 <= frames <= clip_len:
        raise ValueError(f"frames must be between 1 and the clip length {clip_len}, got {frames}")
    return tuple(int(round(i)) for i in np.linspace(0, clip_len - 1, frames))


def denormalize(videos, mean: Sequence[float], std: Sequence[float], *,
                layout: str = "CTHW") -> np.ndarray:
    """Normalised clips back to displayable pixels.

    Args:
        videos: ``(N, C, T, H, W)`` (``layout="CTHW"``) or ``(N, T, C, H, W)``
            (``"TCHW"``) tensor or array, any float dtype or uint8.
        mean, std: per-channel values in 0..255 units the loader normalised with.
        layout: ``"CTHW"`` (default) or ``"TCHW"``.

    Returns:
        ``(N, T, H, W, 3)`` uint8 RGB, ``round(value * std + mean)`` clipped to 0..255.
    """
    arr = videos.detach().float().cpu().numpy() if hasattr(videos, "detach") else np.asarray(videos)
    if arr.ndim != 5:
        raise ValueError(f"videos must have 5 dims (N, C, T, H, W) or (N, T, C, H, W), "
                         f"got shape {arr.shape}")
    if layout == "CTHW":
        arr = arr.transpose(0, 2, 3, 4, 1)
    elif layout == "TCHW":
        arr = arr.transpose(0, 1, 3, 4, 2)
    else:
        raise ValueError(f"layout must be 'CTHW' or 'TCHW', got {layout!r}")
    if arr.shape[-1] != 3:
        raise ValueError(f"videos must have 3 colour channels in layout {layout}, "
                         f"got shape {arr.shape}")
    pixels = arr.astype(np.float64) * np.asarray(std, np.float64) + np.asarray(mean, np.float64)
    return np.clip(np.rint(pixels), 0, 255).astype(np.uint8)


def render_contact_sheet(
    frames: np.ndarray,
    labels: Sequence[int],
    classes: Sequence[str],
    path: str | os.PathLike,
    *,
    frames_per_clip: int = 4,
) -> ContactSheet:
    """Write a contact sheet PNG of already-denormalised clips (see the module docstring).

    Args:
        frames: ``(N, T, H, W, 3)`` uint8 RGB clips (what :func:`denormalize` returns).
        labels: class index of each clip.
        classes: class names; ``classes[label]`` titles a row.
        path: PNG to write; its folder is created.
        frames_per_clip: columns: evenly spaced clip frames.

    Returns:
        :class:`ContactSheet` with the image size and every tile's position.

    Raises:
        ValueError: wrong shapes, a label outside ``classes``, or ``frames_per_clip`` out of range.
        ImportError: matplotlib is missing (``pip install 'daliload[demo]'``).
    """
    plt = _pyplot()
    frames = np.asarray(frames)
    if frames.ndim != 5 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise ValueError(f"frames must be (N, T, H, W, 3) uint8, got {frames.dtype} {frames.shape}")
    num_clips, clip_len, frame_h, frame_w, _ = frames.shape
    if len(labels) != num_clips:
        raise ValueError(f"got {len(labels)} labels for {num_clips} clips")
    for label in labels:
        if not 0 <= int(label) < len(classes):
            raise ValueError(f"label {label} is outside the {len(classes)} classes")
    columns = sheet_frame_indices(clip_len, frames_per_clip)
    scale = max(1, math.ceil(MIN_TILE_SIDE / max(frame_h, frame_w)))
    tile_h, tile_w = frame_h * scale, frame_w * scale
    width = PAD + len(columns) * (tile_w + PAD)
    height = PAD + num_clips * (LABEL_HEIGHT + tile_h + PAD)
    titles = tuple(f"{int(label)}: {classes[int(label)]}  (clip {i})"
                   for i, label in enumerate(labels))
    sheet = ContactSheet(path=os.fspath(path), width=width, height=height, frame_indices=columns,
                         labels=tuple(int(v) for v in labels), titles=titles, tile_height=tile_h,
                         tile_width=tile_w, scale=scale)

    canvas = np.full((height, width, 3), _BACKGROUND, np.uint8)
    for row in range(num_clips):
        for column, t in enumerate(columns):
            top, left, h, w = sheet.tile_box(row, column)
            tile = frames[row, t].repeat(scale, axis=0).repeat(scale, axis=1)
            canvas[top:top + h, left:left + w] = tile

    dpi = 100
    figure = plt.figure(figsize=(width / dpi, height / dpi), dpi=dpi)
    try:
        # figimage puts the array on the canvas pixel for pixel (no resampling).
        figure.figimage(canvas, xo=0, yo=0, origin="upper")
        for row, title in enumerate(titles):
            top = PAD + row * (LABEL_HEIGHT + tile_h + PAD)
            figure.text(PAD / width, 1 - (top + LABEL_HEIGHT / 2) / height, title, fontsize=9,
                        va="center", ha="left", clip_on=True)
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, dpi=dpi)
    finally:
        plt.close(figure)
    return sheet


def preview(
    root: str | os.PathLike,
    path: str | os.PathLike,
    *,
    split: str = "train",
    clips: int = 8,
    frames_per_clip: int = 4,
    clip_len: int = 16,
    frame_stride: int = 4,
    crop_size: int = 224,
    short_side_range: tuple[int, int] = (256, 320),
    seed: int = 0,
    epoch: int = 0,
    device: str = "auto",
    loader_options: dict | None = None,
) -> ContactSheet:
    """Contact sheet of the first ``clips`` clips the loader yields for ``split`` in ``epoch``.

    Args:
        root: dataset root (or manifest), as :class:`daliload.KineticsDALILoader` takes it.
        path: PNG to write.
        split: ``"train"`` (default; random crops and flips) or another split (centre crops).
        clips: rows (one batch of this size is loaded).
        frames_per_clip: columns, evenly spaced in the clip.
        clip_len, frame_stride, crop_size, seed, device: passed to the loader.
        short_side_range: training scale jitter, pixels (see :class:`daliload.plan.AugmentSpec`).
        epoch: which epoch's augmentations to show.
        loader_options: further keyword arguments for the loader (an ``augment``
            there replaces ``crop_size`` and ``short_side_range``).

    Returns:
        :class:`ContactSheet`.

    Raises:
        FileNotFoundError: ``root`` does not exist.
        ValueError: a bad option, or a split the dataset does not have (from the loader).
    """
    from daliload import KineticsDALILoader
    from daliload.plan import AugmentSpec

    if clips < 1:
        raise ValueError(f"clips must be >= 1, got {clips}")
    options = {"label_padding": False, **(loader_options or {})}  # a repeat shows its real label
    if "augment" not in options:
        options["augment"] = AugmentSpec(crop_size=crop_size,
                                         short_side_range=tuple(short_side_range))
    loader = KineticsDALILoader(root, split, batch_size=clips, clip_len=clip_len,
                                frame_stride=frame_stride, seed=seed, device=device, **options)
    loader.set_epoch(epoch)
    batches = iter(loader)
    try:
        videos, labels = next(batches)
    finally:
        batches.close()  # stops the epoch's decoding (the loader's generator cleans up)
        loader.close()
    output = loader.output
    frames = denormalize(videos, output.mean, output.std, layout=output.layout)
    return render_contact_sheet(frames, labels.tolist(), loader.classes, path,
                                frames_per_clip=frames_per_clip)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("root", help="dataset root (or its manifest)")
    parser.add_argument("--split", default="train", help="split to show (%(default)s)")
    parser.add_argument("--out", default="contact_sheet.png", help="PNG to write (%(default)s)")
    parser.add_argument("--clips", type=int, default=8, help="clips, one per row (%(default)s)")
    parser.add_argument("--frames", type=int, default=4,
                        help="frames per clip, one per column (%(default)s)")
    parser.add_argument("--clip-len", type=int, default=16, help="frames per clip (%(default)s)")
    parser.add_argument("--frame-stride", type=int, default=4,
                        help="source frames between clip frames (%(default)s)")
    parser.add_argument("--crop-size", type=int, default=224,
                        help="output size in pixels (%(default)s)")
    parser.add_argument("--short-side", type=int, nargs=2, default=(256, 320),
                        metavar=("MIN", "MAX"),
                        help="training scale jitter: short side before the crop (256 320)")
    parser.add_argument("--seed", type=int, default=0, help="loader seed (%(default)s)")
    parser.add_argument("--epoch", type=int, default=0,
                        help="epoch whose augmentations to show (%(default)s)")
    parser.add_argument("--device", default="auto", choices=("auto", "gpu", "cpu"),
                        help="(%(default)s)")


def run(args: argparse.Namespace) -> int:
    try:
        sheet = preview(args.root, args.out, split=args.split, clips=args.clips,
                        frames_per_clip=args.frames, clip_len=args.clip_len,
                        frame_stride=args.frame_stride, crop_size=args.crop_size,
                        short_side_range=tuple(args.short_side), seed=args.seed, epoch=args.epoch,
                        device=args.device)
    except (FileNotFoundError, ValueError, ImportError) as err:
        print(f"daliload preview: error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {sheet.path} ({sheet.width}x{sheet.height} px): {len(sheet.labels)} clips x "
          f"{len(sheet.frame_indices)} frames (clip frames {list(sheet.frame_indices)})")
    return 0


def _pyplot():
    try:
        import matplotlib
    except ImportError as err:
        raise ImportError("contact sheets need matplotlib: pip install 'daliload[demo]'") from err
    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    return plt
