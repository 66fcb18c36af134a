"""The task every loader runs: the same windows, crops and flips, the same output.

Per video, one random ``clip_len``-frame window at ``frame_stride``, a random
crop after a random short-side resize (:class:`daliload.plan.AugmentSpec`'s
``short_side_jitter``), a random horizontal flip, normalisation, batches of
``batch_size``. The windows are drawn ONCE per run from ``seed`` by
:func:`daliload.plan.make_train_plan` (epoch 0, one rank, over the videos in
the order daliload's own loader lists them, so its plan is this plan) and
written to a plan file that every loader's process reads, so all loaders
decode the same frames and cut the same pixels.

Loaders that decode frames themselves and hand over ``uint8`` RGB frames use
:func:`transform_clip` for the rest, which is daliload's fallback transform
(:func:`fallback.transform.apply_plan`): every loader of a table does the same
transform (same uint8 resize path, same crop and resize rule) and delivers
tensors equal in shape, dtype and normalisation;
:class:`PlanDataset` is the map-style ``torch.utils.data.Dataset`` they share.

Torch is imported lazily: the orchestrator and ``python -m benchmarks --help`` never need it.
"""

from __future__ import annotations

import bisect
import json
import os
from dataclasses import asdict, dataclass, replace
from typing import Callable, Sequence

from daliload.plan import AugmentSpec, ClipSpec, CropBox, OutputSpec, Sample, make_train_plan

#: ``decode(path, frame_indices) -> (frames (T, H, W, 3) uint8 array or tensor, frames decoded or None)``
DecodeFn = Callable[[str, Sequence[int]], tuple[object, "int | None"]]


@dataclass(frozen=True)
class TaskSpec:
    """What every loader produces.

    Attributes:
        clip_len: frames per clip. Default 16.
        frame_stride: source frames between clip frames. Default 4.
        crop_size: output height and width in pixels. Default 224.
        short_side_range: random short side (pixels) the frame is scaled to
            before the crop is cut. Default ``(256, 320)``.
        flip_prob: probability of a horizontal flip. Default 0.5.
        batch_size: clips per batch. Default 32.
        seed: draws the windows, crops and flips.
    """

    clip_len: int = 16
    frame_stride: int = 4
    crop_size: int = 224
    short_side_range: tuple[int, int] = (256, 320)
    flip_prob: float = 0.5
    batch_size: int = 32
    seed: int = 0

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")

    @property
    def clip(self) -> ClipSpec:
        return ClipSpec(clip_len=self.clip_len, frame_stride=self.frame_stride)

    @property
    def augment(self) -> AugmentSpec:
        return AugmentSpec(crop_size=self.crop_size, crop_mode="short_side_jitter",
                           short_side_range=tuple(self.short_side_range), flip_prob=self.flip_prob)

    @property
    def output(self) -> OutputSpec:
        return OutputSpec(size=(self.crop_size, self.crop_size))

    @property
    def output_shape(self) -> tuple[int, int, int, int]:
        """Shape of one clip: ``(C, T, H, W)``."""
        return (3, self.clip_len, self.crop_size, self.crop_size)


def make_plan(videos: Sequence, task: TaskSpec, order: Sequence[int] | None = None) -> list[Sample]:
    """One sample per video, shuffled: the run's windows, crops and flips.

    Args:
        videos: the dataset's videos; ``Sample.video_index`` indexes this sequence.
        task: the task (its seed draws the plan).
        order: plan over ``[videos[i] for i in order]``, as a loader that lists
            the videos in that order plans them (window, crop and flip draws
            are keyed by a video's place in the list). The harness passes
            :func:`benchmarks.datasets.loader_order`, so the run's plan is the
            one :class:`daliload.KineticsDALILoader` draws for epoch 0 with the
            same seed. The samples still carry the indices and paths of ``videos``.
    """
    listed = list(videos) if order is None else [videos[i] for i in order]
    samples = make_train_plan(listed, seed=task.seed, epoch=0, rank=0, world_size=1,
                              clip=task.clip, augment=task.augment)
    if order is None:
        return samples
    return [replace(s, video_index=order[s.video_index], path=videos[order[s.video_index]].path)
            for s in samples]


def write_plan(path: str | os.PathLike, samples: Sequence[Sample], task: TaskSpec) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"task": asdict(task), "samples": [asdict(s) for s in samples]}, f)


def read_plan(path: str | os.PathLike) -> tuple[TaskSpec, list[Sample]]:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    task = TaskSpec(**(data["task"] | {"short_side_range": tuple(data["task"]["short_side_range"])}))
    samples = [Sample(**(s | {"crop": CropBox(**s["crop"])})) for s in data["samples"]]
    return task, samples


def seek_decode_estimate(frame_indices: Sequence[int], keyframes: Sequence[int]) -> int:
    """Frames a decoder that seeks to the keyframe before the window decodes, at least.

    It decodes every frame from the last keyframe at or before the first index
    through the last index (no skipping of unreferenced frames). Loaders that
    cannot count what they decode are credited with this.

    Worked example: keyframes ``[0, 250]``, indices ``252, 256, ..., 312`` in a
    300-frame file (clamped to ``..., 296, 299, 299, 299, 299``): decoding runs
    from 250 to 299, 50 frames.

    Args:
        frame_indices: the clip's source frames, already clamped to the video.
        keyframes: keyframe indices ascending; frame 0 is assumed a keyframe.
    """
    first, last = min(frame_indices), max(frame_indices)
    position = bisect.bisect_right(list(keyframes), first) - 1
    start = keyframes[position] if position >= 0 else 0
    return last - start + 1


def from_start_decode_estimate(frame_indices: Sequence[int]) -> int:
    """Frames a decoder with no frame index decodes: every frame from 0 through the last index.

    DALI's ``fn.decoders.video`` builds no index (see :mod:`daliload.dali._pipeline`):
    it reaches a window by decoding from frame 0. Worked example: indices
    ``252, ..., 299`` decode 300 frames, where a seeking decoder decodes 50.
    """
    return max(frame_indices) + 1


def transform_clip(frames, sample: Sample, output: OutputSpec):
    """Crop, resize, flip and normalise one clip of RGB frames, as the plan says: the fallback's own transform.

    On the CPU this IS :func:`fallback.transform.apply_plan` (the crop rule of
    :meth:`daliload.plan.CropBox.pixels`, antialiased bilinear resize on uint8,
    skipped when the crop already has the output size, then flip and
    normalise), so every peer that hands over uint8 RGB frames spends the same
    work on its transform as daliload's fallback and gives the same tensor for
    the same frames. Frames on a GPU (torchcodec's CUDA decoder) take the same
    steps on the GPU, resizing in float32: torch has no antialiased uint8
    resize on CUDA. Its summary says so.

    Args:
        frames: ``(T, H, W, 3)`` uint8 numpy array or torch tensor (any device).
        sample: gives the crop box (relative) and the flip.
        output: output size, mean/std (0..255 units), dtype and layout.

    Returns:
        A tensor ``(C, T, h, w)`` (``CTHW``) or ``(T, C, h, w)`` of ``output.dtype``
        on the frames' device.
    """
    import torch

    from fallback.transform import apply_plan

    if not isinstance(frames, torch.Tensor) or frames.device.type == "cpu":
        return apply_plan(frames, sample, output)
    return _transform_on_gpu(frames, sample, output)


def _transform_on_gpu(frames, sample: Sample, output: OutputSpec):
    """:func:`fallback.transform.apply_plan`'s steps on a CUDA tensor (resize in float32)."""
    import torch
    import torch.nn.functional as F

    _, height, width, _ = frames.shape
    y0, x0, y1, x1 = sample.crop.pixels(height, width)
    clip = frames[:, y0:y1, x0:x1].permute(0, 3, 1, 2).float()  # T, C, h, w
    if (y1 - y0, x1 - x0) != tuple(output.size):
        clip = F.interpolate(clip, size=tuple(output.size), mode="bilinear", align_corners=False, antialias=True)
        clip = clip.round_().clamp_(0, 255)  # as the uint8 resize rounds
    if sample.flip:
        clip = clip.flip(-1)
    mean = torch.tensor(output.mean, device=clip.device).view(1, 3, 1, 1)
    std = torch.tensor(output.std, device=clip.device).view(1, 3, 1, 1)
    clip = ((clip - mean) / std).to(getattr(torch, output.dtype))
    return (clip.permute(1, 0, 2, 3) if output.layout == "CTHW" else clip).contiguous()


class PlanDataset:
    """Map-style dataset over a plan: item ``i`` is sample ``i`` decoded and transformed.

    ``__getitem__`` returns ``(video, label, frames_decoded)`` with
    ``frames_decoded = -1`` when the decode function cannot tell, so
    ``default_collate`` batches it. The decode function must be a module-level
    function (spawned workers pickle it).

    Args:
        samples: the plan.
        num_frames: frames of each video, by ``Sample.video_index`` (to clamp windows).
        decode: the peer's decode function (:data:`DecodeFn`).
        output: the output spec.
    """

    def __init__(self, samples: Sequence[Sample], num_frames: Sequence[int], decode: DecodeFn,
                 output: OutputSpec) -> None:
        self.samples = list(samples)
        self.num_frames = list(num_frames)
        self.decode = decode
        self.output = output

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        sample = self.samples[i]
        indices = sample.frame_indices(self.num_frames[sample.video_index])
        frames, decoded = self.decode(sample.path, indices)
        video = transform_clip(frames, sample, self.output)
        return video, sample.label, -1 if decoded is None else int(decoded)


def plan_dataloader(dataset: PlanDataset, *, batch_size: int, workers: int, pin_memory: bool = False):
    """A DataLoader over ``dataset`` in plan order, with ``workers`` spawned worker processes.

    Workers persist across epochs (the harness times epochs after a warm-up, so
    the start-up of spawned workers lands in the warm-up, as it would be
    amortised over a real epoch of many thousands of clips). ``pin_memory``
    (a GPU run): batches come in page-locked memory, so the harness's
    ``non_blocking`` copy to the GPU is asynchronous, as the DataLoader's
    documentation advises for CUDA training.
    """
    from torch.utils.data import DataLoader

    if workers < 0:
        raise ValueError(f"workers must be >= 0, got {workers}")
    extra = {"multiprocessing_context": "spawn", "persistent_workers": True, "prefetch_factor": 2} if workers else {}
    return DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=workers, pin_memory=pin_memory,
                      **extra)
