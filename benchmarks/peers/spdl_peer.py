"""SPDL (Meta's Scalable and Performant Data Loading): each clip's frames by index with ``spdl.io.sample_decode_video``.

Per clip, SPDL's own API for "these frames of this video", as its documentation
and its tests use it::

    packets = Demuxer(path).demux_video(window=(start, end))   # seek to the keyframe before, read to the end
    frames = sample_decode_video(packets, indices - first, filter_desc=None)
    FilterGraph("buffer=...,format=pix_fmts=rgb24,buffersink")  # RGB for those frames only

Why this API and these settings:

- ``sample_decode_video`` is the one SPDL call that takes frame *indices*: it
  splits the packets at keyframes, decodes only the splits that hold a
  requested frame and stops each at the last one it needs, and picks the
  frames by their place in presentation order (B-frames included). With
  ``demux_video(window=...)`` the indices count from the window's first frame
  (SPDL shifts them by the frames between the keyframe and the window), so only
  the packets from the keyframe before the window to its end are read, not the
  whole file. The other ways to reach a window select by time, not by index:
  ``decode_packets`` with a ``trim``/``select`` filter, or
  ``load_video(timestamp=...)``; the NVDEC ones (``decode_packets_nvdec``,
  ``streaming_load_video_nvdec``) need a GPU and a CUDA build.
- ``filter_desc=None`` and an RGB conversion of the clip's frames alone: with
  its default filter ``sample_decode_video`` converts every frame it decodes
  to RGB, the frames between the keyframe and the window and between the
  clip's stride-4 frames included, which costs about half again per clip on
  340x256 H.264 with a keyframe every 250 frames (38.6 against 25.4 ms of CPU
  per clip in a try on one file). The fallback and torchcodec convert only the
  frames they return, so SPDL does too.
- One FFmpeg decoder thread, SPDL's default.
- The window is half a frame wider on each side than the clip's first and last
  frames, because a container's timestamps are rounded (WebM's milliseconds:
  frame 16 at 30 fps is 533 ms, before 16/30 s). Frame ``i`` is at ``i / fps``
  s on these constant-frame-rate files, which start at 0; every clip checks
  that against the packets' timestamps and raises naming the file otherwise,
  so a file that breaks that rule fails loudly rather than giving other frames.

SPDL seeks to the keyframe strictly before the window's start
(``av_seek_frame(t - 1, BACKWARD)``): a window that starts on a keyframe is
decoded from the keyframe before it. It does not say how many frames it
decoded, so the harness credits it with a seek from the keyframe at or before
the window (``~``), which is a little below what it decodes there.

The rows (``pip install --no-deps spdl==0.8.0 spdl_io==0.8.0 spdl_core==0.8.0``,
Python 3.11; it loads the system's FFmpeg shared libraries, major versions 4 to 9, as
torchcodec does):

- ``spdl-cpu``: in spawned DataLoader workers (the knob), as every ``-cpu`` peer;
- ``spdl-cpu-1process``: the same decode and transform in the training process,
  one clip after another: SPDL's single-process figure (no knob);
- ``spdl-cpu-pipeline``: SPDL's own answer to the DataLoader, a thread pipeline
  in one process (``spdl.pipeline.PipelineBuilder``): the clips decoded and
  transformed by ``config.workers`` threads (the knob) in plan order, batched,
  stacked; SPDL releases the GIL while it demuxes, decodes and converts.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Iterator, Sequence

from benchmarks.loaders import DataLoaderAdapter, LoadedBatch, LoaderAdapter

_HALF_FRAME = Fraction(1, 2)


def decode_frames(path: str, frame_indices: Sequence[int]):
    """The clip's frames as a ``(T, H, W, 3)`` uint8 array; frames decoded unknown (None).

    ``frame_indices`` may repeat (a window clamped at the end of a short video):
    each distinct frame is decoded once.

    Raises:
        ValueError: the file's frames are not at ``index / fps`` from 0 (the
            window would not hold the clip's frames).
    """
    import numpy as np
    import spdl.io

    wanted = sorted(set(frame_indices))
    first, last = wanted[0], wanted[-1]
    with spdl.io.Demuxer(path) as demuxer:
        fps = Fraction(*demuxer.video_codec.frame_rate)
        packets = demuxer.demux_video(window=((first - _HALF_FRAME) / fps, (last + _HALF_FRAME) / fps))
    relative = [i - first for i in wanted]
    _check_numbering(path, packets.get_timestamps(), wanted, fps)
    codec = packets.codec
    frames = spdl.io.sample_decode_video(packets, relative, filter_desc=None)  # consumes the packets
    graph = spdl.io.FilterGraph(f"{spdl.io.get_buffer_desc(codec)},format=pix_fmts=rgb24,buffersink")
    for frame in frames:
        graph.add_frames(frame)
    graph.flush()
    rgb = spdl.io.to_numpy(spdl.io.convert_frames(graph.get_frames()))
    if rgb.shape[0] != len(wanted):
        raise ValueError(f"{path}: SPDL gave {rgb.shape[0]} frames for the {len(wanted)} of the clip")
    position = {index: k for k, index in enumerate(wanted)}
    return np.ascontiguousarray(rgb[[position[i] for i in frame_indices]]), None


def _check_numbering(path: str, timestamps: Sequence[float], wanted: Sequence[int], fps: Fraction) -> None:
    """Raise unless the window's packets put frame ``i`` at ``i / fps`` (within half a frame) for every wanted ``i``."""
    first = wanted[0]
    span = wanted[-1] - first + 1
    if len(timestamps) < span:
        raise ValueError(f"{path}: the window of frames {first}-{wanted[-1]} holds {len(timestamps)} packets, "
                         f"not {span}: its timestamps are not frame / {fps} s from 0")
    for index in wanted:
        if abs(timestamps[index - first] - index / fps) >= 0.5 / fps:
            raise ValueError(f"{path}: frame {index} is at {timestamps[index - first]:.4f} s, not {index}/{fps}; "
                             "SPDL's time window would not give the clip's frames")


def _probe() -> str | None:
    try:
        from spdl.io.utils import get_ffmpeg_versions

        get_ffmpeg_versions()  # loads SPDL's extension against the system's FFmpeg libraries
    except (ImportError, OSError, RuntimeError) as err:
        # SPDL raises RuntimeError when none of its extensions loads against the FFmpeg libraries found.
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return (f"SPDL does not import: {first_line[:200]} (needs `pip install --no-deps spdl==0.8.0 "
                f"spdl_io==0.8.0 spdl_core==0.8.0` and FFmpeg's shared libraries: apt-get install ffmpeg)")
    return None


class SpdlCPU(DataLoaderAdapter):
    name = "spdl-cpu"
    summary = ("SPDL demux_video(window) + sample_decode_video(indices, no filter) + RGB of the clip's frames "
               "(1 FFmpeg thread) in spawn DataLoader workers")
    decode = staticmethod(decode_frames)

    @classmethod
    def probe(cls, config) -> str | None:
        return _probe()


class SpdlCPUSingleProcess(SpdlCPU):
    name = "spdl-cpu-1process"
    summary = ("SPDL demux_video(window) + sample_decode_video(indices, no filter) + RGB of the clip's frames "
               "(1 FFmpeg thread), one clip after another in the training process")
    knob = None

    def __init__(self, dataset, samples: Sequence, config) -> None:
        from dataclasses import replace

        super().__init__(dataset, samples, replace(config, workers=0))


class SpdlPipeline(LoaderAdapter):
    name = "spdl-cpu-pipeline"
    summary = ("SPDL's thread pipeline in one process (spdl.pipeline.PipelineBuilder): demux_video(window) + "
               "sample_decode_video + RGB of the clip's frames (1 FFmpeg thread each) and the transform on the "
               "knob's threads, in plan order, batched")
    knob = "SPDL pipeline threads"

    @classmethod
    def probe(cls, config) -> str | None:
        reason = _probe()
        if reason is not None:
            return reason
        try:
            from spdl.pipeline import PipelineBuilder  # noqa: F401
        except ImportError as err:
            return f"spdl.pipeline does not import ({err}); pip install --no-deps spdl==0.8.0"
        return None

    def __init__(self, dataset, samples: Sequence, config) -> None:
        self._samples = list(samples)
        self._num_frames = [v.num_frames for v in dataset.videos]
        self._task = config.task
        self._threads = max(1, config.workers)

    def _clip(self, sample):
        from benchmarks.task import transform_clip

        frames, _ = decode_frames(sample.path, sample.frame_indices(self._num_frames[sample.video_index]))
        return transform_clip(frames, sample, self._task.output), sample.label

    @staticmethod
    def _collate(items):
        import torch

        return torch.stack([video for video, _ in items]), torch.tensor([label for _, label in items])

    def epoch(self) -> Iterator[LoadedBatch]:
        from spdl.pipeline import PipelineBuilder

        # One pipeline per epoch (its threads start in milliseconds); max_failures=0 halts it at the first
        # clip that fails instead of dropping the clip, which is SPDL's default.
        pipeline = (PipelineBuilder()
                    .add_source(self._samples)
                    .pipe(self._clip, concurrency=self._threads, output_order="input")
                    .aggregate(self._task.batch_size)
                    .pipe(self._collate)
                    .add_sink(2)
                    .build(num_threads=self._threads, max_failures=0))
        with pipeline.auto_stop():
            for videos, labels in pipeline:
                yield LoadedBatch(videos, labels, int(labels.shape[0]), None)
