"""Contact sheets: frames of several loaded clips in a grid, to check augmentations by eye.

``daliload preview ROOT`` takes the first batch that :class:`KineticsDALILoader`
yields for a split (training clips carry their random crop and flip), undoes
the normalisation and writes one PNG. Layout, in pixels (``P`` = :data:`PAD`,
``L`` = :data:`LABEL_HEIGHT`, ``C`` = :data:`CAPTION_HEIGHT`, tiles ``h`` x
``w`` = the clip's frame size times an integer ``scale``)::

    | note: what a row is, and (generated data) what the strip on top is  |  N lines
    P
    | P | clip 0: label 2 (spin), decoded by DALI (CPU)                 | P    L
    |   | train/spin/abc_000010_000020.mp4                              |      L
    |   +-----------+ P +-----------+ P +-----------+                   |
    |   | frame t0  |   | frame t1  |   | frame t2  | ...               |      h   one row per clip
    |   +-----------+   +-----------+   +-----------+                   |
    |   source frame 12  source frame 20  source frame 28               |      C
    P
    | P | clip 1: label 0 (blink) ...                                   |

The frames shown are ``frames`` evenly spaced clip frames (first and last
included), each captioned with its frame number in the source video. Pixels
of a tile are the clip's pixels, each repeated ``scale`` times in both
directions (no interpolation), so the sheet shows exactly what the model is
fed. :func:`render_contact_sheet` without row details, frame numbers or a
note draws only the one-line title band and the tiles.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

#: Background grey and the gaps between tiles, in pixels.
PAD = 4
#: Height of one line of the text band above each row of tiles, in pixels.
LABEL_HEIGHT = 18
#: Height of the band under each row of tiles that gives each tile's source frame, in pixels.
CAPTION_HEIGHT = 14
#: Height of one line of the note at the top of the sheet, in pixels.
NOTE_LINE_HEIGHT = 13
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
        titles: text above each row (its first line when there are details).
        tile_height, tile_width: size of one frame tile in pixels.
        scale: integer upscaling of the clip's frames into tiles.
        details: second line above each row (file and decoder), or empty.
        source_frames: per row, the source-video frame number under each
            column's tile, or empty.
        note: the text at the top of the sheet, or ``""``.
        header_height: pixels the note takes above the first row.
        title_height: pixels of the text band above each row of tiles.
        caption_height: pixels of the frame-number band under each row.
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
    details: tuple[str, ...] = ()
    source_frames: tuple[tuple[int, ...], ...] = ()
    note: str = ""
    header_height: int = 0
    title_height: int = LABEL_HEIGHT
    caption_height: int = 0

    @property
    def row_height(self) -> int:
        """Pixels from the top of one row's title band to the next one's."""
        return self.title_height + self.tile_height + self.caption_height + PAD

    def tile_box(self, row: int, column: int) -> tuple[int, int, int, int]:
        """``(top, left, height, width)`` in pixels of the tile at ``row`` (clip), ``column``."""
        top = self.header_height + PAD + row * self.row_height + self.title_height
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
    details: Sequence[str] = (),
    source_frames: Sequence[Sequence[int]] = (),
    note: str = "",
) -> ContactSheet:
    """Write a contact sheet PNG of already-denormalised clips (see the module docstring).

    Args:
        frames: ``(N, T, H, W, 3)`` uint8 RGB clips (what :func:`denormalize` returns).
        labels: class index of each clip.
        classes: class names; ``classes[label]`` titles a row.
        path: PNG to write; its folder is created.
        frames_per_clip: columns: evenly spaced clip frames.
        details: one line per clip under its title (the file and its decoder), or none.
        source_frames: per clip, the source-video frame number of each of its
            ``T`` frames (captioned under the tiles), or none.
        note: text for the top of the sheet, wrapped to its width, or ``""``.

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
    if details and len(details) != num_clips:
        raise ValueError(f"got {len(details)} detail lines for {num_clips} clips")
    if source_frames and (len(source_frames) != num_clips or any(len(f) != clip_len for f in source_frames)):
        raise ValueError(f"source_frames must give {clip_len} frame numbers for each of the {num_clips} clips")
    columns = sheet_frame_indices(clip_len, frames_per_clip)
    scale = max(1, math.ceil(MIN_TILE_SIDE / max(frame_h, frame_w)))
    tile_h, tile_w = frame_h * scale, frame_w * scale
    width = PAD + len(columns) * (tile_w + PAD)
    note_lines = textwrap.wrap(note, width=max(20, (width - 2 * PAD) // 6)) if note else []
    if details:
        titles = tuple(f"clip {i}: label {int(label)} ({classes[int(label)]})" for i, label in enumerate(labels))
    else:
        titles = tuple(f"{int(label)}: {classes[int(label)]}  (clip {i})" for i, label in enumerate(labels))
    sheet = ContactSheet(
        path=os.fspath(path), width=width, height=0, frame_indices=columns, labels=tuple(int(v) for v in labels),
        titles=titles, tile_height=tile_h, tile_width=tile_w, scale=scale, details=tuple(details),
        source_frames=tuple(tuple(int(i) for i in f) for f in source_frames), note=note,
        header_height=PAD + len(note_lines) * NOTE_LINE_HEIGHT if note_lines else 0,
        title_height=LABEL_HEIGHT * (2 if details else 1), caption_height=CAPTION_HEIGHT if source_frames else 0)
    height = sheet.header_height + PAD + num_clips * sheet.row_height
    sheet = dataclasses.replace(sheet, height=height)

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

        def text(x: float, y: float, line: str, **kwargs) -> None:  # x, y in pixels from the top left
            figure.text(x / width, 1 - y / height, line, va="center", clip_on=True, **kwargs)

        for number, line in enumerate(note_lines):
            text(PAD, PAD / 2 + (number + 0.5) * NOTE_LINE_HEIGHT, line, fontsize=8, ha="left", color="0.25")
        for row, title in enumerate(titles):
            top = sheet.header_height + PAD + row * sheet.row_height
            text(PAD, top + LABEL_HEIGHT / 2, title, fontsize=9, ha="left")
            if details:
                text(PAD, top + 1.5 * LABEL_HEIGHT, details[row], fontsize=8, ha="left", color="0.3")
            if source_frames:
                for column, t in enumerate(columns):
                    tile_top, left, _, _ = sheet.tile_box(row, column)
                    text(left + tile_w / 2, tile_top + tile_h + CAPTION_HEIGHT / 2,
                         f"source frame {source_frames[row][t]}", fontsize=7, ha="center", color="0.3")
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

    Each row is titled with the clip's label, its file (relative to ``root``)
    and the decoder that produced it (DALI on the CPU or GPU, or the PyAV
    fallback, as the loader routed it); each tile is captioned with its frame
    number in the source video. A note at the top says what a row shows and,
    for a dataset made by ``daliload synth``, what the black-and-white strip
    across the top of its frames is.

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
    from daliload.synth.dataset import REPORT_NAME

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
        stats = loader.stats()
    finally:
        batches.close()  # stops the epoch's decoding (the loader's generator cleans up)
        loader.close()
    output = loader.output
    frames = denormalize(videos, output.mean, output.std, layout=output.layout)
    samples = _row_samples(loader, stats, epoch)
    num_frames = {v.path: v.num_frames for v in loader.videos}
    base = Path(root) if Path(root).is_dir() else None
    details = [f"{_shown_path(s.path, base)}, decoded by {_decoder(loader, stats, s.path)}"
               + (", flipped" if s.flip else "") for s in samples]
    source_frames = [s.frame_indices(num_frames[s.path]) for s in samples]
    return render_contact_sheet(frames, labels.tolist(), loader.classes, path, frames_per_clip=frames_per_clip,
                                details=details, source_frames=source_frames,
                                note=_note(split, base is not None and (base / REPORT_NAME).exists()))


def _row_samples(loader, stats, epoch: int) -> list:
    """The plan sample behind each row of the first batch: a failed slot shows the sample that filled it."""
    batches = loader.plan(epoch)
    by_position = {s.position: s for batch in batches for s in batch}
    filled_by = dict(stats.replacements)
    return [by_position[filled_by.get(s.position, s.position)] for s in batches[0]]


def _decoder(loader, stats, path: str) -> str:
    """Which decoder the loader used for ``path``, as its routes decide (``daliload.epoch.Routes``)."""
    route = {v.path: v.route for v in loader.videos}.get(path)
    if route == "dali" and loader.dali_enabled and path not in stats.rerouted and not stats.dali_disabled:
        return "DALI on the GPU (NVDEC)" if loader.device == "gpu" else "DALI on the CPU"
    return "the PyAV fallback"


def _shown_path(path: str, base: Path | None) -> str:
    if base is not None:
        relative = os.path.relpath(path, base)
        if not relative.startswith(".."):
            return relative
    return path


def _note(split: str, generated: bool) -> str:
    what = ("its random crop and flip" if split == "train" else "its centre crop")
    note = (f"Each row is one clip of the first {split} batch as the model receives it ({what}; the "
            f"normalisation undone), titled with its label, its file, the decoder that decoded it and whether "
            f"it was flipped; under each frame, its number in the source video.")
    if generated:
        note += (" The black-and-white strip across the top of each frame is not a decoding error: daliload "
                 "synth paints every generated frame's number into it (a 12-bit code with a checksum, "
                 "daliload/framecode.py), so tests can check that both decoders return exactly the planned "
                 "frames. A crop may cut it off and a flip mirrors it.")
    return note


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
