"""What a generated dataset holds, decided from its :class:`SynthSpec` before anything is encoded.

:class:`SynthSpec` says what to generate (classes, clips, size, frame rates,
codecs, broken files, seed); :func:`plan_dataset` turns it into one
:class:`SynthClip` per file (name, split, label, codec, frame rate, broken
kind, render seed) without touching the disk, so the same spec always gives
the same names, listings and rendered frames. :mod:`daliload.synth.dataset`
encodes the plan and writes the listings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Literal, Mapping, Sequence

import numpy as np

from daliload.framecode import MAX_INDEX
from daliload.synth.broken import (
    BROKEN_EXTENSION,
    BROKEN_KINDS,
    KIND_CONTENT,
    BrokenKind,
    ClipContent,
    check_kind,
)
from daliload.synth.content import motion_of
from daliload.synth.encode import CODEC_PRESETS

Split = Literal["train", "val"]

#: Characters of a YouTube video id (URL-safe base64).
YOUTUBE_ID_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
YOUTUBE_ID_LENGTH = 11
#: Kinetics clips start anywhere in the first few minutes of the source video.
MAX_TIME_START_S = 290

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
        gop: frames between keyframes in every encoded file; default ``None``:
            the codec preset's (250; every frame for MJPEG).
            ``benchmarks.bench_remote`` writes 16, a short GOP for seeking.
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
    gop: int | None = None

    def __post_init__(self) -> None:
        if self.gop is not None and self.gop < 1:
            raise ValueError(f"gop must be >= 1 frame between keyframes (or None: the codec's default), "
                             f"got {self.gop}")
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


__all__ = ["SynthSpec", "SynthClip", "plan_dataset", "class_name", "parse_fps", "Split"]
