"""Every loader of the benchmark table, on one plan, delivers the same tensors: shape, dtype, normalisation, values.

The table compares loaders on equal work only if they all do the same
transform; these tests run every loader registered in
:data:`benchmarks.loaders.LOADERS` that can run here against daliload's
fallback, sample by sample, one test per loader. A loader that cannot run
here is a skip with its reason (pytest's ``-ra`` summary lists them), never a
pass: the GPU-only loaders without a GPU, and torchcodec or decord where they
do not import (``make test`` and ``make bench`` install them; torchcodec also
needs FFmpeg's shared libraries).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from benchmarks.datasets import BenchVideo, DatasetSpec, loader_order, prepare_dataset
from benchmarks.loaders import LOADERS, LoaderConfig, load_adapter
from benchmarks.task import TaskSpec, _transform_on_gpu, make_plan, transform_clip
from fallback.transform import apply_plan

#: Loaders that decode with FFmpeg and convert with swscale, as the fallback does: the same pixels
#: up to FFmpeg's version (torchcodec uses the system's, decord its own), so nearly equal clips.
PYAV_LIKE_TOLERANCE = 0.02  # mean |difference| in normalised units (about 1 grey level in 0..255)
#: DALI converts YUV to RGB with interpolated chroma and resizes with its own filter (docs/architecture.md, Facts):
#: a mean difference of about 3 grey levels on the same frames.
DALI_TOLERANCE = 0.12
#: The loaders that must run on any machine with the test extra installed: a skip of one of these is a failure.
ALWAYS_HERE = ("blog-pyav", "daliload", "daliload-dali-cpu", "daliload-fallback")
TASK = TaskSpec(batch_size=2, seed=5)


@pytest.fixture(scope="module")
def vp9_dataset(tmp_path_factory):
    # VP9: the one codec every loader here decodes, DALI's CPU decoder included.
    spec = DatasetSpec(name="vp9", codec="vp9", width=128, height=96, gop=250, num_clips=3, duration_s=2.1)
    return prepare_dataset(spec, tmp_path_factory.mktemp("bench-outputs"), workers=1)


@pytest.fixture(scope="module")
def plan(vp9_dataset):
    samples = make_plan(vp9_dataset.videos, TASK, loader_order(vp9_dataset))
    assert {s.flip for s in samples} == {True, False}
    return samples


@pytest.fixture(scope="module")
def reference(vp9_dataset, plan):
    """What daliload's fallback delivers for the plan: the clips every other loader must match."""
    clips = _clips("daliload-fallback", vp9_dataset, plan)
    assert not isinstance(clips, str), clips
    out = TASK.output
    mean = torch.tensor(out.mean).view(3, 1, 1, 1)
    std = torch.tensor(out.std).view(3, 1, 1, 1)
    for expected in clips:
        assert tuple(expected.shape) == TASK.output_shape and expected.dtype == torch.float32  # the loader's default
        pixels = expected.float() * std + mean  # normalised with the Kinetics mean/std in 0..255 units
        assert pixels.min() > -1 and pixels.max() < 256 and pixels.std() > 10
    return clips


def _clips(name: str, dataset, samples) -> list[torch.Tensor] | str:
    """The clips ``name`` delivers for the plan, in plan order, or why it cannot run here."""
    cls = load_adapter(name)
    config = LoaderConfig(task=TASK, workers=0, device="cpu")
    reason = cls.skip_reason(dataset.spec, config) or cls.probe(config)
    if reason is not None:
        return reason
    adapter = cls(dataset, samples, config)
    try:
        return [clip for batch in adapter.epoch() for clip in batch.videos]
    finally:
        adapter.close()


@pytest.mark.parametrize("name", [name for name in LOADERS if name != "daliload-fallback"])
def test_every_loader_of_the_table_delivers_the_fallbacks_clips(name, vp9_dataset, plan, reference):
    clips = _clips(name, vp9_dataset, plan)
    if isinstance(clips, str):
        if name in ALWAYS_HERE:
            pytest.fail(f"{name} must run on every machine with the test extra, but: {clips}")
        pytest.skip(f"{name} cannot run here: {clips}")
    uses_dali = name in ("daliload", "daliload-dali-cpu")  # VP9 routes to DALI on the CPU
    limit = DALI_TOLERANCE if uses_dali else PYAV_LIKE_TOLERANCE
    assert len(clips) == len(reference)
    for k, (clip, expected) in enumerate(zip(clips, reference)):
        assert tuple(clip.shape) == tuple(expected.shape) and clip.dtype == expected.dtype
        diff = (clip.float() - expected.float()).abs().mean().item()
        assert diff < limit, (plan[k], diff)
        if name == "blog-pyav":  # the same PyAV, the same swscale, the same transform: identical
            assert torch.equal(clip, expected), (plan[k], diff)


def test_the_peers_transform_is_the_fallbacks():
    generator = torch.Generator().manual_seed(0)
    frames = torch.randint(0, 256, (4, 96, 128, 3), dtype=torch.uint8, generator=generator)
    task = TaskSpec(batch_size=1, seed=2)
    videos = [BenchVideo(f"x{i}.mp4", 0, 40, 30.0, 128, 96, (0,), 1) for i in range(4)]
    for sample in make_plan(videos, task):
        sample = dataclasses.replace(sample, clip_len=4)
        expected = apply_plan(frames, sample, task.output)
        assert torch.equal(transform_clip(frames, sample, task.output), expected)
        assert torch.equal(transform_clip(frames.numpy(), sample, task.output), expected)
        # The GPU path takes the same steps, resizing in float32; run here on the CPU it stays within
        # one grey level of the uint8 resize (plus float16's rounding of the normalised value).
        gpu_path = _transform_on_gpu(frames, sample, task.output)
        assert gpu_path.shape == expected.shape and gpu_path.dtype == expected.dtype
        grey = (gpu_path.float() - expected.float()).abs() * torch.tensor(task.output.std).view(3, 1, 1, 1)
        assert grey.max() < 1.5 and grey.mean() < 0.3


def test_the_fallback_row_runs_the_fallback_as_the_loader_configures_it(vp9_dataset):
    from daliload.loader import DecodeSpec

    task = TaskSpec(batch_size=2, seed=5)
    samples = make_plan(vp9_dataset.videos, task, loader_order(vp9_dataset))
    adapter = load_adapter("daliload-fallback")(vp9_dataset, samples, LoaderConfig(task=task, workers=2,
                                                                                    device="cpu"))
    try:
        decode, workers, prefetch, hints = adapter.options
    finally:
        adapter.close()
    spec = DecodeSpec(fallback_workers=2)
    assert (workers, prefetch) == (spec.fallback_workers, spec.batches_ahead(task.batch_size)) == (2, 4)
    assert (decode.threads, decode.timeout_s, decode.skip_nonref) == (spec.fallback_threads, spec.timeout_s, True)
    hint = hints[vp9_dataset.videos[0].path]  # the seek hints the scan gives the loader
    assert hint is not None and hint.keyframe_indices == vp9_dataset.videos[0].keyframes
    assert hint.num_frames == vp9_dataset.videos[0].num_frames
