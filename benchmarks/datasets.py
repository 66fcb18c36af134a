"""Generated benchmark datasets: Kinetics-like clips in the codecs and GOPs that matter.

Every dataset is a folder of clips rendered by :func:`daliload.synth.render_clip`
(class-specific motion plus the frame-index code) and encoded by
:func:`daliload.synth.write_video`, cached by its spec::

    DATA_DIR/
      h264-gop250-340x256-16x10s-s0-1a2b3c4d/
        clip000.mp4          clip i shows content class i % 9, seed (seed, i)
        clip001.mp4
        ...
        meta.json            the spec and, per clip, frames, fps, size, keyframes;
                             written last, so a folder without it is incomplete
        kinetics/            the same clips as ROOT/train/<class>/<file> links, made
                             when a loader that scans a dataset root needs them
                             (see kinetics_layout)

:func:`daliload.synth.dataset.generate_dataset` writes a Kinetics folder layout
but has no GOP setting, and the GOP is one of the things measured here, so
this module drives the renderer and encoder itself.

The standard datasets (:data:`STANDARD`):

==============  ===========  =======  ====  ======================================
name            codec        size     GOP   why
==============  ===========  =======  ====  ======================================
h264-gop250     H.264 High   340x256  250   as Kinetics downloads arrive
h264-gop16      H.264 High   340x256   16   the same re-encoded for seeking
vp9             VP9          340x256  250   the codec DALI also decodes on CPU
vp9-gop16       VP9          340x256   16   what DALI gains from a short GOP (its cut)
h264-720p       H.264 High  1280x720  250   resolution scaling
==============  ===========  =======  ====  ======================================
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path
from typing import Iterator, Literal, Sequence

DatasetName = Literal["h264-gop250", "h264-gop16", "vp9", "vp9-gop16", "h264-720p"]

#: name -> (codec, width, height, gop, why it is here)
STANDARD: dict[str, tuple[str, int, int, int, str]] = {
    "h264-gop250": ("h264", 340, 256, 250, "as Kinetics downloads arrive"),
    "h264-gop16": ("h264", 340, 256, 16, "re-encoded with short GOPs"),
    "vp9": ("vp9", 340, 256, 250, "the codec DALI also decodes on the CPU"),
    "vp9-gop16": ("vp9", 340, 256, 16, "re-encoded with short GOPs: DALI decodes from the keyframe before a window"),
    "h264-720p": ("h264", 1280, 720, 250, "resolution scaling"),
}
_CODEC_NAMES = {"h264": "H.264", "vp9": "VP9", "hevc": "HEVC", "vp8": "VP8", "av1": "AV1", "mpeg4": "MPEG-4",
                "mjpeg": "MJPEG"}
#: Datasets whose frames are larger than Kinetics' get their own (smaller) clip count.
HD_DATASETS = ("h264-720p",)
META_NAME = "meta.json"
_NUM_CONTENT_CLASSES = 9  # one per motion of daliload.synth.content


@dataclass(frozen=True)
class DatasetSpec:
    """One generated dataset.

    Attributes:
        name: short name (a :data:`STANDARD` key for the standard ones).
        codec: a :data:`daliload.synth.CODEC_PRESETS` key.
        width, height: frame size in pixels, even.
        gop: frames between keyframes.
        num_clips: clips in the dataset (>= 1).
        duration_s: seconds per clip; a clip has ``round(duration_s * fps)`` frames.
        fps: frame rate, frames/s.
        seed: content seed (clip ``i`` is rendered with seed ``seed * 100003 + i``).
        description: one line for reports.
    """

    name: str
    codec: str
    width: int
    height: int
    gop: int
    num_clips: int
    duration_s: float
    fps: int = 30
    seed: int = 0
    description: str = ""

    def __post_init__(self) -> None:
        if self.num_clips < 1:
            raise ValueError(f"dataset {self.name!r}: num_clips must be >= 1, got {self.num_clips}")
        if not self.duration_s > 0:
            raise ValueError(f"dataset {self.name!r}: duration_s must be > 0, got {self.duration_s}")
        if self.width < 32 or self.height < 32 or self.width % 2 or self.height % 2:
            raise ValueError(f"dataset {self.name!r}: frame size must be even and >= 32x32, "
                             f"got {self.width}x{self.height}")
        if self.gop < 1:
            raise ValueError(f"dataset {self.name!r}: gop must be >= 1, got {self.gop}")

    @property
    def frames_per_clip(self) -> int:
        return int(round(self.duration_s * self.fps))

    @property
    def key(self) -> str:
        """Folder name: readable, plus a hash of every field that changes the files."""
        fields = asdict(self)
        fields.pop("description")
        digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:8]
        return (f"{self.name}-{self.width}x{self.height}-{self.num_clips}x{self.duration_s:g}s"
                f"-s{self.seed}-{digest}")


@dataclass(frozen=True)
class BenchVideo:
    """One clip of a dataset: what planning needs (a :class:`daliload.plan.VideoLike`) plus keyframes.

    Attributes:
        path: absolute path of the file.
        label: class index (the content class).
        num_frames: frames a full decode outputs.
        fps: frame rate, frames/s.
        width, height: frame size in pixels.
        keyframes: indices of the frames that are keyframes, ascending.
        size_bytes: file size.
    """

    path: str
    label: int
    num_frames: int
    fps: float
    width: int
    height: int
    keyframes: tuple[int, ...]
    size_bytes: int


@dataclass(frozen=True)
class Dataset:
    """A generated dataset on disk."""

    spec: DatasetSpec
    root: str
    videos: tuple[BenchVideo, ...]

    @property
    def total_frames(self) -> int:
        return sum(v.num_frames for v in self.videos)

    def to_json(self) -> dict:
        return {"spec": asdict(self.spec), "root": self.root,
                "videos": [asdict(v) | {"path": os.path.relpath(v.path, self.root)} for v in self.videos]}

    @classmethod
    def from_json(cls, data: dict, root: str | os.PathLike | None = None) -> "Dataset":
        root = os.fspath(root if root is not None else data["root"])
        videos = tuple(BenchVideo(**(v | {"path": os.path.join(root, v["path"]),
                                          "keyframes": tuple(v["keyframes"])})) for v in data["videos"])
        return cls(spec=DatasetSpec(**data["spec"]), root=root, videos=videos)


def standard_specs(
    names: Sequence[str],
    *,
    num_clips: int,
    num_clips_hd: int,
    duration_s: float,
    duration_hd_s: float | None = None,
    seed: int = 0,
    size: tuple[int, int] | None = None,
) -> list[DatasetSpec]:
    """Specs of the named standard datasets.

    Args:
        names: :data:`STANDARD` keys.
        num_clips: clips per dataset at Kinetics size.
        num_clips_hd: clips per :data:`HD_DATASETS` dataset (their frames cost ~10x more).
        duration_s: seconds per clip (Kinetics: 10).
        duration_hd_s: seconds per :data:`HD_DATASETS` clip (None: ``duration_s``).
        seed: content seed.
        size: ``(width, height)`` replacing 340x256 in the Kinetics-size datasets
            (tests use tiny frames); the HD ones keep their size.

    Raises:
        ValueError: an unknown name.
    """
    specs = []
    for name in names:
        if name not in STANDARD:
            raise ValueError(f"unknown dataset {name!r}; choose from {', '.join(STANDARD)}")
        codec, width, height, gop, why = STANDARD[name]
        hd = name in HD_DATASETS
        if size is not None and not hd:
            width, height = size
        description = f"{width}x{height} {_CODEC_NAMES.get(codec, codec)}, keyframe every {gop} frames: {why}"
        specs.append(DatasetSpec(name=name, codec=codec, width=width, height=height, gop=gop,
                                 num_clips=num_clips_hd if hd else num_clips,
                                 duration_s=duration_hd_s if hd and duration_hd_s is not None else duration_s,
                                 seed=seed, description=description))
    return specs


def probe_keyframes(path: str | os.PathLike) -> tuple[int, tuple[int, ...]]:
    """Frames in a file and which of them are keyframes, by demuxing (no decoding).

    Frame ``N`` is the packet with the ``N``-th smallest presentation timestamp,
    the numbering every decoder here uses; packets an edit list discards
    produce no frame.

    Returns:
        ``(num_frames, keyframe indices ascending)``.

    Raises:
        ValueError: the file has no video stream or its packets carry no timestamps.
    """
    import av

    with av.open(os.fspath(path)) as container:
        if not container.streams.video:
            raise ValueError(f"{path}: no video stream")
        stream = container.streams.video[0]
        entries = []
        for packet in container.demux(stream):
            if packet.size == 0 or packet.is_discard:
                continue
            if packet.pts is None:
                raise ValueError(f"{path}: a video packet carries no pts; cannot number frames")
            entries.append((packet.pts, packet.is_keyframe))
    entries.sort()
    return len(entries), tuple(i for i, (_, key) in enumerate(entries) if key)


def _write_clip(root: str, spec: DatasetSpec, index: int) -> dict:
    """Render, encode and probe clip ``index`` (runs in a worker process)."""
    from daliload.synth import default_spec, render_clip, write_video

    encode = default_spec(spec.codec, fps=Fraction(spec.fps), gop=spec.gop)
    path = Path(root) / f"clip{index:03d}.{encode.extension}"
    label = index % _NUM_CONTENT_CLASSES
    frames = render_clip(label, spec.frames_per_clip, width=spec.width, height=spec.height,
                         fps=float(spec.fps), seed=spec.seed * 100003 + index)
    written = write_video(path, frames, encode)
    num_frames, keyframes = probe_keyframes(path)
    if num_frames != written:
        raise RuntimeError(f"{path}: encoded {written} frames but the file holds {num_frames}")
    return asdict(BenchVideo(path=path.name, label=label, num_frames=num_frames, fps=float(spec.fps),
                             width=spec.width, height=spec.height, keyframes=keyframes,
                             size_bytes=path.stat().st_size))


def class_folder(label: int) -> str:
    """The class folder of ``label`` in :func:`kinetics_layout` (zero-padded: sorts as the labels)."""
    return f"class{label:03d}"


def layout_relpath(video: BenchVideo) -> str:
    """Where :func:`kinetics_layout` puts ``video``, relative to its root."""
    return f"train/{class_folder(video.label)}/{os.path.basename(video.path)}"


def loader_order(dataset: Dataset) -> list[int]:
    """Indices of ``dataset.videos`` in the order daliload's manifest lists the Kinetics layout.

    The manifest (like :func:`daliload.dataset.load_index`) lists a split sorted
    by path; planning over the videos in this order draws the same windows,
    crops and flips as :class:`daliload.KineticsDALILoader` does on
    :func:`kinetics_layout`. Worked example: clips 0..3 with labels 0, 1, 2, 0
    sort as ``class000/clip000, class000/clip003, class001/clip001,
    class002/clip002``, so the order is ``[0, 3, 1, 2]``.
    """
    return sorted(range(len(dataset.videos)), key=lambda i: layout_relpath(dataset.videos[i]))


def kinetics_layout(dataset: Dataset) -> Path:
    """The dataset as a Kinetics folder layout, for loaders that scan one; returns its root.

    Symbolic links, made once, beside the clips::

        DATASET/kinetics/                 the root to give the loader
          train/class000/clip000.mp4  ->  ../../../clip000.mp4
          train/class001/clip001.mp4  ->  ../../../clip001.mp4
          ...
          .daliload/manifest.sqlite       written by the loader's scan
    """
    root = Path(dataset.root) / "kinetics"
    for video in dataset.videos:
        link = root / layout_relpath(video)
        if link.is_symlink() or link.exists():
            continue
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(video.path, link.parent))
    return root


def load_dataset(folder: str | os.PathLike) -> Dataset:
    """The dataset in ``folder`` (one :func:`prepare_dataset` wrote).

    Raises:
        FileNotFoundError: no ``meta.json`` there (missing or incompletely generated).
    """
    folder = Path(folder).absolute()
    with open(folder / META_NAME, encoding="utf-8") as f:
        return Dataset.from_json(json.load(f), root=folder)


def prepare_dataset(spec: DatasetSpec, data_dir: str | os.PathLike, *, workers: int = 1) -> Dataset:
    """Generate ``spec`` under ``data_dir`` unless an identical one is already there.

    Args:
        spec: what to generate.
        data_dir: cache folder; the dataset goes to ``data_dir / spec.key``.
        workers: encoder processes (each renders and encodes whole clips).

    Returns:
        The dataset, read back from its ``meta.json``.
    """
    folder = Path(data_dir).absolute() / spec.key
    if (folder / META_NAME).exists():
        dataset = load_dataset(folder)
        if dataset.spec == spec:
            return dataset
    folder.mkdir(parents=True, exist_ok=True)
    if workers <= 1 or spec.num_clips == 1:
        videos = [_write_clip(str(folder), spec, i) for i in range(spec.num_clips)]
    else:
        methods = multiprocessing.get_all_start_methods()
        context = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
        with ProcessPoolExecutor(max_workers=min(workers, spec.num_clips), mp_context=context) as pool:
            videos = list(pool.map(_write_clip, [str(folder)] * spec.num_clips,
                                   [spec] * spec.num_clips, range(spec.num_clips)))
    meta = {"spec": asdict(spec), "root": str(folder), "videos": videos}
    tmp = folder / (META_NAME + ".tmp")
    tmp.write_text(json.dumps(meta, indent=1), encoding="utf-8")
    os.replace(tmp, folder / META_NAME)
    return load_dataset(folder)


def prepare_standard(names_csv: str, *, clips: int, duration_s: float, size: str | None,
                     data_dir: str | os.PathLike) -> Iterator[Dataset]:
    """The small benchmarks' datasets: ``--datasets`` (comma-separated :data:`STANDARD` names), ``--clips``
    videos of ``--duration`` seconds, ``--size WIDTHxHEIGHT`` replacing 340x256; each generated (or reused)
    when the caller reaches it."""
    names = [n for n in names_csv.split(",") if n]
    frame = tuple(int(x) for x in size.split("x")) if size else None
    for spec in standard_specs(names, num_clips=clips, num_clips_hd=clips, duration_s=duration_s,
                               **({"size": frame} if frame else {})):
        yield prepare_dataset(spec, data_dir, workers=2)
