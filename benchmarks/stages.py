"""Where a fallback clip's time goes, stage by stage: ``python -m benchmarks.stages JOB.json``.

The harness runs this once per dataset, in its own process, on the run's
plan (the first ``clips`` samples, after one untimed pass over a few of them),
one clip after another on one core, as one fallback worker decodes them
(torch on one thread, the loader's seek hints). Per clip it times::

    opening        av.open of the file (container, stream set-up)
    demux/index    reading the packets and numbering the frames, or entering by a seek hint
    decode         the decoder itself, from the entry point to the window's last frame
                   (non-reference frames the clip does not use skipped)
    RGB conversion YUV to RGB of the clip's frames, and their copy into the clip array
    crop/resize    the plan's crop, the uint8 antialiased resize, flip
    normalise      (pixel - mean) / std, the cast to the output dtype and the layout,
                   written straight into the clip's row of the group's shared buffer
                   (as :func:`fallback.source.decode_rows` does in a worker; the first
                   touch of a new buffer's memory is paid here)
    transfer       the clip's share of taking that buffer from the ring (one per
                   ``batch_size`` clips, in the training process: a reused one is
                   mapped with its pages) and the worker's mapping of its row with
                   its pages; the training process copies nothing when a batch is
                   one group, as it is when every file of the batch is the fallback's

Opening, demux/index and RGB conversion are timed by wrapping the fallback's
own functions (:mod:`fallback.decode`) while the profile runs; decode is the
rest of :func:`fallback.decode.decode_window`'s time. The two transform stages
are its two halves, :func:`fallback.transform.crop_resize` (crop, uint8
resize, flip) and :func:`fallback.transform.normalize` (normalisation, cast
and layout). The same windows decoded the exact way (from the keyframe
before the window to its end, every frame, no RGB, a fresh open) give the
exact-seek time of the same spans, for comparison.

The job file: ``{"dataset": DIR, "plan": PLAN.json, "clips": 32, "out": OUT.json}``;
the result is :class:`StageProfile` as JSON.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

#: The stages, in the order a clip goes through them.
STAGES = ("opening", "demux/index", "decode", "RGB conversion", "crop/resize", "normalise", "transfer")


@dataclass(frozen=True)
class StageProfile:
    """Mean milliseconds per clip of each stage, over ``clips`` clips.

    Attributes:
        clips: clips profiled.
        ms_per_clip: stage -> mean ms per clip (the :data:`STAGES`).
        total_ms: their sum.
        frames_decoded_per_clip: frames the fallback's decoder produced per clip.
        exact_ms_per_clip: the same windows decoded the exact way (keyframe to
            window end, every frame, no RGB, including the open), ms per clip.
        exact_frames_per_clip: frames that exact decode produced per clip.
    """

    clips: int
    ms_per_clip: dict[str, float]
    total_ms: float
    frames_decoded_per_clip: float
    exact_ms_per_clip: float
    exact_frames_per_clip: float


class _StageClock:
    """Accumulates seconds per stage; nested calls of one stage are timed once (the outer call)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = dict.fromkeys(STAGES, 0.0)
        self._active: set[str] = set()

    def wrap(self, stage: str, function: Callable) -> Callable:
        def timed(*args, **kwargs):
            if stage in self._active:
                return function(*args, **kwargs)
            self._active.add(stage)
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds[stage] += time.perf_counter() - start
                self._active.discard(stage)

        return timed


@contextlib.contextmanager
def _instrumented(clock: _StageClock) -> Iterator[None]:
    """Wrap the fallback decoder's opening, indexing and RGB steps with ``clock`` (restored on exit)."""
    from fallback import decode as module

    window = module._Window
    patches = [
        (window, "open", clock.wrap("opening", window.open)),
        (window, "_rgb", clock.wrap("RGB conversion", window._rgb)),
        (window, "_assemble", clock.wrap("RGB conversion", window._assemble)),
        (module, "first_output_pts", clock.wrap("demux/index", module.first_output_pts)),
    ]
    demux = module.FrameTable.__dict__["demux"]  # a classmethod
    timed_demux = clock.wrap("demux/index", demux.__func__)
    patches.append((module.FrameTable, "demux", classmethod(timed_demux)))
    originals = [(owner, name, owner.__dict__[name]) for owner, name, _ in patches]
    try:
        for owner, name, replacement in patches:
            setattr(owner, name, replacement)
        yield
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)


def _exact_span(path: str, first_key: int, last: int, fps: float) -> tuple[float, int]:
    """Seconds and frames to decode frames ``first_key..last`` the exact way: open, seek, decode all, no RGB."""
    import av

    start = time.perf_counter()
    decoded = 0
    with av.open(path) as container:
        stream = container.streams.video[0]
        stream.thread_count = 1
        if first_key > 0:
            container.seek(int(first_key / fps * av.time_base), backward=True)
        for frame in container.decode(stream):
            decoded += 1
            if frame.time is not None and frame.time * fps >= last - 0.5:
                break
    return time.perf_counter() - start, decoded


class _Transfers:
    """The fallback's shared buffers: one per ``batch_size`` clips (a group), mapped by the worker per clip.

    As :class:`fallback.source.FallbackSource` does on the CPU: the training
    process takes a group's buffer from its ring
    (:class:`fallback.buffers.ReusedBuffers`, the loader's ``keep``: 4), the
    worker decoding a clip maps its row (:func:`fallback.source.map_rows`) and
    writes the clip there, and the batch, dropped once the group is full,
    brings the buffer back for a later group.
    """

    def __init__(self, output, batch_size: int) -> None:
        from fallback.buffers import ReusedBuffers

        self.output, self.batch_size = output, batch_size
        self.ring = ReusedBuffers(keep=4)
        self.group: tuple | None = None  # (the batch, fd, shape, dtype, rows left)
        self.seconds = 0.0

    def next_row(self, clip_len: int):
        from fallback.source import map_rows
        from fallback.transform import clip_shape, output_dtype

        start = time.perf_counter()
        if self.group is None or self.group[4] == 0:
            self.group = None  # the batch goes, and its buffer back to the ring
            shape = (self.batch_size, *clip_shape(clip_len, self.output))
            dtype = output_dtype(self.output)
            batch, fd, _ = self.ring.take(shape, dtype)
            self.group = (batch, fd, shape, dtype, self.batch_size)
        batch, fd, shape, dtype, left = self.group
        self.group = (batch, fd, shape, dtype, left - 1)
        row = map_rows(fd, shape, dtype, [self.batch_size - left])[self.batch_size - left]  # the worker's row
        self.seconds += time.perf_counter() - start
        return row


def profile_clips(samples: Sequence, videos: Sequence, output, *, hints: dict | None = None,
                  batch_size: int = 1, warmup: int = 2) -> StageProfile:
    """Profile the fallback on ``samples`` (see the module docstring).

    Args:
        samples: plan samples (their ``video_index`` indexes ``videos``).
        videos: the dataset's :class:`benchmarks.datasets.BenchVideo` s (frames, keyframes, fps).
        output: the run's :class:`daliload.plan.OutputSpec`.
        hints: the loader's seek hints by path (:func:`benchmarks.peers.daliload_peer.loader_hints`).
        batch_size: clips per transfer (one shared-memory allocation each).
        warmup: clips decoded first, untimed (imports, caches).
    """
    import torch

    from benchmarks.task import seek_decode_estimate
    from fallback import decode_window
    from fallback.transform import apply_plan, crop_resize, normalize

    torch.set_num_threads(1)  # as in a fallback worker
    hints = hints or {}
    for sample in samples[:warmup]:
        apply_plan(decode_window(sample.path, _indices(sample, videos)).frames, sample, output)
    clock = _StageClock()
    transfers = _Transfers(output, batch_size)
    whole = decoded = exact_s = exact_frames = 0.0
    for sample in samples:
        indices = _indices(sample, videos)
        with _instrumented(clock):
            start = time.perf_counter()
            clip = decode_window(sample.path, indices, hint=hints.get(sample.path))
            whole += time.perf_counter() - start
        decoded += clip.num_frames_decoded
        start = time.perf_counter()
        resized = crop_resize(clip.frames, sample, output)
        clock.seconds["crop/resize"] += time.perf_counter() - start
        row = transfers.next_row(sample.clip_len)
        start = time.perf_counter()
        normalize(resized, output, out=row)
        clock.seconds["normalise"] += time.perf_counter() - start
        video = videos[sample.video_index]
        key = max(k for k in video.keyframes if k <= min(indices))
        seconds, frames = _exact_span(sample.path, key, max(indices), video.fps)
        if frames < seek_decode_estimate(indices, video.keyframes):
            raise ValueError(f"{sample.path}: the exact decode of frames {key}..{max(indices)} stopped after "
                             f"{frames} frames: its seek landed after the keyframe")
        exact_s, exact_frames = exact_s + seconds, exact_frames + frames
    clock.seconds["transfer"] = transfers.seconds
    transfers.group = None
    transfers.ring.close()
    inside = sum(clock.seconds[s] for s in ("opening", "demux/index", "RGB conversion"))
    clock.seconds["decode"] = max(0.0, whole - inside)
    n = len(samples)
    ms = {stage: clock.seconds[stage] / n * 1000 for stage in STAGES}
    return StageProfile(clips=n, ms_per_clip=ms, total_ms=sum(ms.values()), frames_decoded_per_clip=decoded / n,
                        exact_ms_per_clip=exact_s / n * 1000, exact_frames_per_clip=exact_frames / n)


def _indices(sample, videos) -> list[int]:
    return sample.frame_indices(videos[sample.video_index].num_frames)


def run_job(job: dict) -> StageProfile:
    """Profile the first ``job["clips"]`` samples of the job's plan on its dataset."""
    from benchmarks.datasets import load_dataset
    from benchmarks.peers.daliload_peer import loader_hints
    from benchmarks.task import read_plan

    dataset = load_dataset(job["dataset"])
    task, samples = read_plan(job["plan"])
    return profile_clips(samples[:int(job.get("clips", 32))], dataset.videos, task.output,
                         hints=loader_hints(dataset), batch_size=task.batch_size)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m benchmarks.stages JOB.json", file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as f:
        job = json.load(f)
    profile = run_job(job)
    with open(job["out"], "w", encoding="utf-8") as f:
        json.dump(dataclasses.asdict(profile), f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
