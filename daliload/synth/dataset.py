"""Generate a Kinetics-like dataset: class folders, annotation CSVs, list files.

What :func:`generate_dataset` writes under ``ROOT``::

    ROOT/
      train/
        blink/                               one folder per class name
          Xk3_a9-QzTb_000042_000052.mp4      <youtube_id>_<start:06d>_<end:06d>.<ext>
          ...
        bounce vertical/                     class names contain spaces, as Kinetics' do
        ...
      val/
        <class name>/...
      annotations/
        train.csv                            label,youtube_id,time_start,time_end,split
        val.csv                              (label is the class NAME)
      trainlist.txt                          "<path relative to ROOT> <label index>" per line
      vallist.txt
      synth.tsv                              what every file is (see SynthClip)

Label indices are positions in the class names sorted alphabetically (as
torchvision and mmaction number Kinetics classes), so they match what
:func:`daliload.index.load_index` computes from any of the three layouts.

Everything is a function of :class:`SynthSpec` (including its seed):
:func:`plan_dataset` decides every file without encoding anything, and the
same spec gives the same names, listings and rendered frames. Encoded bytes
may still differ between runs (libvpx's realtime mode adapts to the time it
has, and libx264's output was seen to vary when CPUs were contended), so
compare decoded frame codes, not file hashes.
"""

from __future__ import annotations

import csv
import io
import math
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Iterable, Literal, Mapping, Sequence

import av
import numpy as np

from daliload.framecode import MAX_INDEX
from daliload.synth.broken import (
    BROKEN_EXTENSION,
    BROKEN_KINDS,
    KIND_CONTENT,
    BrokenKind,
    ClipContent,
    check_kind,
    write_broken,
)
from daliload.synth.content import motion_of
from daliload.synth.encode import CODEC_PRESETS, default_spec, write_video

Split = Literal["train", "val"]

#: Columns of the annotation CSVs, in Kinetics' order.
CSV_COLUMNS = ("label", "youtube_id", "time_start", "time_end", "split")
#: Characters of a YouTube video id (URL-safe base64).
YOUTUBE_ID_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
YOUTUBE_ID_LENGTH = 11
#: Kinetics clips start anywhere in the first few minutes of the source video.
MAX_TIME_START_S = 290
REPORT_NAME = "synth.tsv"

_SPEED_WORDS = {1: "", 2: " fast", 3: " faster"}


def _default_fps_mix() -> dict[Fraction, float]:
    return {Fraction(30): 0.8, Fraction(25): 0.1, Fraction(30000, 1001): 0.1}


def _default_codec_mix() -> dict[str, float]:
    return {"h264": 1.0}


def class_name(content_class: int) -> str:
    """Readable class name of a content class: its motion, plus a speed word.

    ``0 -> "still"``, ``1 -> "bounce vertical"``, ``9 -> "bounce vertical fast"``,
    ``17 -> "bounce vertical faster"``, ``25 -> "bounce vertical speed 4"``.
    """
    motion, speed = motion_of(content_class)
    suffix = _SPEED_WORDS.get(speed, f" speed {speed}")
    return motion.replace("_", " ") + suffix


@dataclass(frozen=True)
class SynthSpec:
    """What dataset to generate.

    Attributes:
        num_classes: classes; class ``c`` shows motion ``c % 9`` at speed
            ``1 + c // 9`` (see :mod:`daliload.synth.content`).
        clips_per_class: files per class, over both splits.
        val_fraction: share of each class's files that go to ``val``
            (rounded per class, leaving at least one train file; 0 writes no
            val split).
        width, height: frame size in pixels, even (default 340x256, Kinetics' size).
        duration_s: clip length in seconds; a clip has ``round(duration_s * fps)`` frames.
        fps_mix: frame rate -> share of files (weights are normalized; the counts
            are apportioned exactly, not sampled). Default 80 % 30 fps, 10 % 25,
            10 % 29.97 (30000/1001).
        codec_mix: codec -> share of the non-broken files; codecs are
            :data:`daliload.synth.CODEC_PRESETS` keys. Default all ``h264``.
        broken_fraction: share of all files replaced by a broken kind, 0..1.
        broken_kinds: the kinds to hand out, in turn, to the broken files (default
            all of :data:`daliload.synth.broken.BROKEN_KINDS`, so a fraction that
            gives at least 8 broken files writes every kind).
        seed: decides ids, times, splits, which files get which codec/fps/kind,
            and every clip's content.
    """

    num_classes: int = 8
    clips_per_class: int = 10
    val_fraction: float = 0.2
    width: int = 340
    height: int = 256
    duration_s: float = 10.0
    fps_mix: Mapping[Fraction, float] = field(default_factory=_default_fps_mix)
    codec_mix: Mapping[str, float] = field(default_factory=_default_codec_mix)
    broken_fraction: float = 0.0
    broken_kinds: tuple[BrokenKind, ...] = BROKEN_KINDS
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_classes < 1 or self.clips_per_class < 1:
            raise ValueError(f"need at least one class and one clip per class, got num_classes="
                             f"{self.num_classes}, clips_per_class={self.clips_per_class}")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in [0, 1), got {self.val_fraction}")
        if self.width < 32 or self.height < 32 or self.width % 2 or self.height % 2:
            raise ValueError(f"frame size must be even and at least 32x32 (4:2:0 encoders), "
                             f"got {self.width}x{self.height}")
        if not self.duration_s > 0:
            raise ValueError(f"duration_s must be > 0, got {self.duration_s}")
        _check_mix("fps_mix", self.fps_mix)
        # Keys may be given as 30, 29.97 or "30000/1001"; keep exact Fractions.
        object.__setattr__(self, "fps_mix", {parse_fps(k): w for k, w in self.fps_mix.items()})
        _check_mix("codec_mix", self.codec_mix)
        for fps in self.fps_mix:
            if round(self.duration_s * fps) > MAX_INDEX + 1:
                raise ValueError(f"{self.duration_s} s at {float(fps):g} fps is more than the "
                                 f"{MAX_INDEX + 1} frames the frame code can number")
        for codec in self.codec_mix:
            if codec not in CODEC_PRESETS:
                raise ValueError(f"codec_mix: unknown codec {codec!r}; choose from "
                                 f"{', '.join(sorted(CODEC_PRESETS))}")
        if not 0.0 <= self.broken_fraction <= 1.0:
            raise ValueError(f"broken_fraction must be in [0, 1], got {self.broken_fraction}")
        if not isinstance(self.broken_kinds, tuple):
            raise TypeError(f"broken_kinds must be a tuple, got {type(self.broken_kinds).__name__}")
        for kind in self.broken_kinds:
            check_kind(kind)
        if len(set(self.broken_kinds)) != len(self.broken_kinds):
            raise ValueError(f"broken_kinds lists a kind twice: {self.broken_kinds}")
        if self.broken_fraction > 0 and not self.broken_kinds:
            raise ValueError("broken_fraction > 0 needs at least one broken kind")

    @property
    def num_files(self) -> int:
        return self.num_classes * self.clips_per_class

    @property
    def class_names(self) -> tuple[str, ...]:
        """Class names, sorted: position = label index."""
        return tuple(sorted(class_name(c) for c in range(self.num_classes)))


def parse_fps(value: Fraction | int | float | str) -> Fraction:
    """A frame rate as an exact Fraction; 23.976, 29.97 and 59.94 mean n*1000/1001.

    Raises:
        ValueError: not a positive number or ``"num/den"``.
    """
    try:
        fps = Fraction(value)
    except (ValueError, TypeError, ZeroDivisionError) as err:
        raise ValueError(f"frame rate must be a number or 'num/den', got {value!r}") from err
    if not fps > 0:
        raise ValueError(f"frame rate must be > 0, got {value!r}")
    if fps.denominator not in (1, 1001):
        for base in (24, 30, 60):
            if abs(fps - Fraction(base * 1000, 1001)) < Fraction(1, 100):
                return Fraction(base * 1000, 1001)
    return fps


def _check_mix(name: str, mix: Mapping) -> None:
    if not isinstance(mix, Mapping) or not mix:
        raise ValueError(f"{name} must be a non-empty mapping of value -> share, got {mix!r}")
    weights = list(mix.values())
    if any(not w >= 0 for w in weights) or not sum(weights) > 0:
        raise ValueError(f"{name} shares must be >= 0 and not all 0, got {dict(mix)!r}")


@dataclass(frozen=True)
class SynthClip:
    """One file the generator wrote (or will write).

    Attributes:
        path: path relative to the dataset root, POSIX separators.
        split: ``"train"`` or ``"val"``.
        class_name: the class folder's name (Kinetics' ``label`` column).
        label: index of ``class_name`` in the sorted class names.
        youtube_id: 11-character YouTube-like id.
        time_start, time_end: the clip's span in its imaginary source video, in
            whole seconds (as in Kinetics CSVs; ``time_end - time_start`` is the
            duration rounded up).
        codec: codec of the video (``"aac"`` for ``no_video``, None when the
            file holds no encoded media: ``zero_bytes``, ``garbage``).
        fps: nominal frame rate (exact ``Fraction``).
        num_frames: frames encoded into the file before any damage; 0 when it
            holds no video. A ``truncated`` or ``header_only`` file decodes fewer.
        broken: the broken kind, or None for a normal clip.
        content_class: class index given to :func:`daliload.synth.render_clip`.
        content_seed: render seed of the clip (texture, colours, phase).
    """

    path: str
    split: Split
    class_name: str
    label: int
    youtube_id: str
    time_start: int
    time_end: int
    codec: str | None
    fps: Fraction
    num_frames: int
    broken: BrokenKind | None
    content_class: int
    content_seed: int

    def content(self, spec: SynthSpec) -> ClipContent:
        return ClipContent(self.content_class, self._rendered_frames(spec), spec.width,
                           spec.height, self.fps, self.content_seed)

    def _rendered_frames(self, spec: SynthSpec) -> int:
        return int(round(spec.duration_s * self.fps))


@dataclass(frozen=True)
class SynthReport:
    """Everything :func:`generate_dataset` wrote.

    Attributes:
        root: dataset root (absolute).
        spec: the spec it was generated from.
        classes: class names sorted; position = label index.
        clips: every video-like file, in plan order (class by class).
        index_files: annotation CSVs, list files and :data:`REPORT_NAME`,
            relative to ``root``.
    """

    root: str
    spec: SynthSpec
    classes: tuple[str, ...]
    clips: tuple[SynthClip, ...]
    index_files: tuple[str, ...]

    @property
    def broken(self) -> tuple[SynthClip, ...]:
        return tuple(c for c in self.clips if c.broken is not None)

    def split(self, split: Split) -> tuple[SynthClip, ...]:
        return tuple(c for c in self.clips if c.split == split)

    def listing(self) -> str:
        """The clips as TSV text (what ``ROOT/synth.tsv`` holds); no absolute paths."""
        return _report_tsv(self.clips)


def _apportion(total: int, weights: Sequence[float]) -> list[int]:
    """Split ``total`` into integer counts proportional to ``weights`` (largest remainder)."""
    weights = np.asarray(weights, dtype=np.float64)
    exact = total * weights / weights.sum()
    counts = np.floor(exact).astype(int)
    # Ties go to the earlier entry: stable argsort of the negated remainders.
    for i in np.argsort(-(exact - counts), kind="stable")[: total - counts.sum()]:
        counts[i] += 1
    return counts.tolist()


def _spread(total: int, mix: Mapping, rng: np.random.Generator) -> list:
    """``total`` values of ``mix``'s keys in exact proportion, in random order."""
    keys = list(mix)
    values = [key for key, n in zip(keys, _apportion(total, list(mix.values()))) for _ in range(n)]
    order = rng.permutation(total)
    return [values[i] for i in order]


def _youtube_ids(count: int, rng: np.random.Generator) -> list[str]:
    ids: list[str] = []
    seen: set[str] = set()
    while len(ids) < count:
        chars = rng.integers(0, len(YOUTUBE_ID_ALPHABET), size=YOUTUBE_ID_LENGTH)
        candidate = "".join(YOUTUBE_ID_ALPHABET[c] for c in chars)
        if candidate not in seen:
            seen.add(candidate)
            ids.append(candidate)
    return ids


def plan_dataset(spec: SynthSpec) -> tuple[SynthClip, ...]:
    """Decide every file of the dataset, without writing anything.

    Per class, the last ``round(clips_per_class * val_fraction)`` files go to
    ``val``. Frame rates are apportioned over all files, codecs over the
    non-broken ones, broken kinds in turn over ``round(num_files *
    broken_fraction)`` files chosen at random.

    Returns:
        The files, class by class (content class 0 first), train before val.
    """
    rng = np.random.default_rng(spec.seed)
    total = spec.num_files
    labels = {name: i for i, name in enumerate(spec.class_names)}
    ids = _youtube_ids(total, rng)
    starts = rng.integers(0, MAX_TIME_START_S + 1, size=total).tolist()
    content_seeds = rng.integers(0, 2**31 - 1, size=total).tolist()
    fps_values = _spread(total, spec.fps_mix, rng)
    num_broken = int(round(total * spec.broken_fraction))
    broken_at = sorted(rng.permutation(total)[:num_broken].tolist())
    kinds: dict[int, BrokenKind] = {
        i: spec.broken_kinds[n % len(spec.broken_kinds)] for n, i in enumerate(broken_at)}
    codecs = iter(_spread(total - num_broken, spec.codec_mix, rng))
    # Every class keeps at least one train file.
    num_val = min(spec.clips_per_class - 1, int(round(spec.clips_per_class * spec.val_fraction)))
    span = math.ceil(spec.duration_s)

    clips = []
    for content_class in range(spec.num_classes):
        name = class_name(content_class)
        for k in range(spec.clips_per_class):
            i = content_class * spec.clips_per_class + k
            split: Split = "val" if k >= spec.clips_per_class - num_val else "train"
            kind = kinds.get(i)
            fps = Fraction(fps_values[i])
            num_frames = int(round(spec.duration_s * fps))
            if kind is None:
                codec: str | None = next(codecs)
                extension = CODEC_PRESETS[codec][1]
            else:
                codec, has_video = KIND_CONTENT[kind]
                num_frames = num_frames if has_video else 0
                extension = BROKEN_EXTENSION
            start = starts[i]
            clips.append(SynthClip(
                path=f"{split}/{name}/{ids[i]}_{start:06d}_{start + span:06d}.{extension}",
                split=split, class_name=name, label=labels[name], youtube_id=ids[i],
                time_start=start, time_end=start + span, codec=codec, fps=fps,
                num_frames=num_frames, broken=kind, content_class=content_class,
                content_seed=content_seeds[i]))
    return tuple(clips)


def _write_clip(root: str, spec: SynthSpec, clip: SynthClip) -> str:
    """Encode one file (runs in a worker process). Returns its relative path."""
    path = Path(root) / clip.path
    path.parent.mkdir(parents=True, exist_ok=True)
    content = clip.content(spec)
    try:
        if clip.broken is not None:
            write_broken(path, clip.broken, content)
            return clip.path
        written = write_video(path, content.frames(), default_spec(clip.codec, fps=clip.fps))
    except (av.FFmpegError, OSError) as err:
        raise RuntimeError(f"could not write {path}: {err}") from err
    if written != clip.num_frames:
        raise RuntimeError(f"{path}: wrote {written} frames, planned {clip.num_frames}")
    return clip.path


def generate_dataset(
    root: str | os.PathLike,
    spec: SynthSpec | None = None,
    *,
    workers: int = 1,
    progress: bool = True,
) -> SynthReport:
    """Write a Kinetics-like dataset under ``root`` (see the module docstring).

    Existing files with the same names are overwritten; other files are left alone.

    Args:
        root: dataset directory; created if missing.
        spec: what to generate (default :class:`SynthSpec()`: 8 classes x 10
            clips, 340x256, 10 s, H.264, nothing broken).
        workers: encoder processes. 1 encodes in this process; more use a
            ``forkserver`` (``spawn`` where that is missing) process pool, since
            every file is independent. Each libx264/libvpx encoder is
            frame-threaded, so more workers than cores rarely helps.
        progress: show a tqdm progress bar on stderr.

    Returns:
        :class:`SynthReport` listing every file written.

    Raises:
        ValueError: ``workers`` < 1.

    Example:
        >>> report = generate_dataset("/tmp/k", SynthSpec(num_classes=4, clips_per_class=5,
        ...                           codec_mix={"h264": 0.7, "vp9": 0.3}, broken_fraction=0.1))
    """
    spec = spec if spec is not None else SynthSpec()
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    root_path = Path(root).absolute()
    root_path.mkdir(parents=True, exist_ok=True)
    clips = plan_dataset(spec)

    from tqdm import tqdm

    bar = tqdm(total=len(clips), unit="file", desc="synth", disable=not progress)
    try:
        if workers == 1:
            for clip in clips:
                _write_clip(str(root_path), spec, clip)
                bar.update()
        else:
            # Not fork: the caller may hold threads (torch, tqdm) that a fork would copy mid-lock.
            methods = multiprocessing.get_all_start_methods()
            context = multiprocessing.get_context(
                "forkserver" if "forkserver" in methods else "spawn")
            with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
                futures = [pool.submit(_write_clip, str(root_path), spec, c) for c in clips]
                try:
                    for future in futures:
                        future.result()  # re-raises a worker's error, which names the file
                        bar.update()
                except BaseException:
                    for future in futures:
                        future.cancel()
                    raise
    finally:
        bar.close()

    index_files = _write_index_files(root_path, spec.class_names, clips)
    return SynthReport(root=str(root_path), spec=spec, classes=spec.class_names, clips=clips,
                       index_files=index_files)


def _write_index_files(root: Path, classes: tuple[str, ...],
                       clips: Sequence[SynthClip]) -> tuple[str, ...]:
    written = []
    (root / "annotations").mkdir(exist_ok=True)
    for split in ("train", "val"):
        rows = [c for c in clips if c.split == split]
        if not rows:
            continue
        csv_rel = f"annotations/{split}.csv"
        _write_text(root / csv_rel, _csv_text(rows))
        list_rel = f"{split}list.txt"
        _write_text(root / list_rel, "".join(f"{c.path} {c.label}\n" for c in rows))
        written += [csv_rel, list_rel]
    _write_text(root / REPORT_NAME, _report_tsv(clips))
    written.append(REPORT_NAME)
    return tuple(written)


def _write_text(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)


def _csv_text(rows: Iterable[SynthClip]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for c in rows:
        writer.writerow([c.class_name, c.youtube_id, c.time_start, c.time_end, c.split])
    return buffer.getvalue()


_REPORT_COLUMNS = ("path", "split", "class_name", "label", "youtube_id", "time_start", "time_end",
                   "codec", "fps", "num_frames", "broken", "content_class", "content_seed")


def _report_tsv(clips: Iterable[SynthClip]) -> str:
    lines = ["\t".join(_REPORT_COLUMNS)]
    for c in clips:
        values = [getattr(c, name) for name in _REPORT_COLUMNS]
        lines.append("\t".join("" if v is None else str(v) for v in values))
    return "\n".join(lines) + "\n"


def read_report(root: str | os.PathLike) -> tuple[SynthClip, ...]:
    """The clips listed in ``ROOT/synth.tsv`` (ground truth for tests and benchmarks).

    Raises:
        FileNotFoundError: the dataset has no ``synth.tsv``.
        ValueError: its header is not the one this version writes.
    """
    path = Path(root) / REPORT_NAME
    with open(path, encoding="utf-8", newline="") as f:
        lines = f.read().splitlines()
    if not lines or tuple(lines[0].split("\t")) != _REPORT_COLUMNS:
        raise ValueError(f"{path}: header is not {chr(9).join(_REPORT_COLUMNS)!r}")
    clips = []
    for line in lines[1:]:
        v = dict(zip(_REPORT_COLUMNS, line.split("\t")))
        clips.append(SynthClip(
            path=v["path"], split=v["split"], class_name=v["class_name"],  # type: ignore[arg-type]
            label=int(v["label"]), youtube_id=v["youtube_id"], time_start=int(v["time_start"]),
            time_end=int(v["time_end"]), codec=v["codec"] or None, fps=Fraction(v["fps"]),
            num_frames=int(v["num_frames"]), broken=v["broken"] or None,  # type: ignore[arg-type]
            content_class=int(v["content_class"]), content_seed=int(v["content_seed"])))
    return tuple(clips)


__all__ = ["SynthSpec", "SynthClip", "SynthReport", "generate_dataset", "plan_dataset",
           "read_report", "class_name", "parse_fps", "CSV_COLUMNS", "REPORT_NAME"]
