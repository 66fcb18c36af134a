"""Every loader of the benchmark table, on one plan, delivers the same tensors: shape, dtype, normalisation, values.

The table compares loaders on equal work only if they all do the same
transform and decode the same frames; these tests run every loader registered
in :data:`benchmarks.loaders.LOADERS` that can run here, one test per loader
and dataset:

- VP9 (keyframe every 250, the codec every loader here decodes, DALI's CPU
  decoder included): against daliload's fallback, sample by sample and frame
  by frame, with the plan's crops and flips;
- H.264 with B-frames (x264, 3 B-frames, keyframe every 250 and every 16: the
  datasets of the benchmark where the decoders differ most), on the plan with
  full-frame crops: every frame's painted index read back, so a decoder that
  seeks a frame off fails by name, then frame by frame against the fallback.

A loader that cannot run here is a skip with its reason (pytest's ``-ra``
summary lists them), never a pass: the GPU-only loaders without a GPU, DALI's
CPU decoder on H.264 (compiled out), and torchcodec, decord or SPDL where they
do not import (``make test`` and ``make bench`` install them; torchcodec and
SPDL also need FFmpeg's shared libraries). A loader that runs but does not
give the planned frames in some mode is an ``xfail`` with the reason
(:data:`NOT_EXACT`), strict: the day it gives them, the test says so.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from benchmarks.datasets import BenchVideo, DatasetSpec, loader_order, prepare_dataset
from benchmarks.loaders import LOADERS, LoaderConfig, load_adapter
from benchmarks.task import TaskSpec, _transform_on_gpu, make_plan, transform_clip
from daliload.framecode import FrameCodeError, read_code
from daliload.plan import CropBox
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
#: (loader, dataset) -> why it does not give the planned frames there: an xfail (strict), never a skip.
NOT_EXACT: dict[tuple[str, str], str] = {}
#: The H.264 datasets: x264 with 3 B-frames (daliload.synth's H.264 preset), closed GOPs of 250 and 16 frames.
H264_GOPS = (250, 16)


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
    uses_dali = name in ("daliload", "daliload-static", "daliload-workers", "daliload-dali-cpu")  # VP9 may go to DALI
    limit = DALI_TOLERANCE if uses_dali else PYAV_LIKE_TOLERANCE
    assert len(clips) == len(reference)
    for k, (clip, expected) in enumerate(zip(clips, reference)):
        assert tuple(clip.shape) == tuple(expected.shape) and clip.dtype == expected.dtype
        diffs = _frame_diffs(clip, expected)
        assert max(diffs) < limit, (plan[k], diffs)
        if name == "blog-pyav":  # the same PyAV, the same swscale, the same transform: identical
            assert torch.equal(clip, expected), (plan[k], diffs)


def _frame_diffs(clip: torch.Tensor, expected: torch.Tensor) -> list[float]:
    """Mean |difference| of each frame, normalised units: a clip right on average but a frame off fails."""
    assert TASK.output.layout == "CTHW"
    return (clip.float() - expected.float()).abs().mean(dim=(0, 2, 3)).tolist()


# --- H.264 with B-frames: every frame's index read back ---------------------------------

@pytest.fixture(scope="module", params=H264_GOPS, ids=[f"gop{gop}" for gop in H264_GOPS])
def h264_dataset(request, tmp_path_factory):
    import av

    gop = request.param
    # 4 s: 120 frames, so the 61-frame windows start anywhere in 0..59 (past two keyframes at GOP 16).
    spec = DatasetSpec(name=f"h264-gop{gop}", codec="h264", width=128, height=96, gop=gop, num_clips=4,
                       duration_s=4.0)
    dataset = prepare_dataset(spec, tmp_path_factory.mktemp(f"bench-outputs-h264-gop{gop}"), workers=1)
    for video in dataset.videos:
        assert video.keyframes == tuple(range(0, video.num_frames, gop)), video
        with av.open(video.path) as container:  # B-frames: presentation order differs from decode order
            pts = [p.pts for p in container.demux(video=0) if p.pts is not None]
        assert pts != sorted(pts), f"{video.path}: no B-frames"
    return dataset


@pytest.fixture(scope="module")
def h264_plan(h264_dataset):
    """The run's plan with full-frame crops, so every frame's painted index can be read back; flips kept.

    Then the windows a seek gets wrong first, on one video: from frame 0, from a keyframe (frame 32: at
    GOP 16 a decoder that seeks to the keyframe strictly before decodes from 16), the last full window,
    and one past the end whose indices clamp to the last frame, repeated.
    """
    samples = [dataclasses.replace(s, crop=CropBox.full())
               for s in make_plan(h264_dataset.videos, TASK, loader_order(h264_dataset))]
    if h264_dataset.spec.gop == 16:  # the run's windows start past a keyframe, between two, and span GOPs
        assert any(s.start_frame > 16 and s.start_frame % 16 for s in samples), samples
    first = samples[0]
    num_frames = h264_dataset.videos[first.video_index].num_frames
    span = (TASK.clip_len - 1) * TASK.frame_stride + 1
    edges = (0, 32, num_frames - span, num_frames - 20)
    samples += [dataclasses.replace(first, position=len(samples) + k, start_frame=start, flip=k % 2 == 1)
                for k, start in enumerate(edges)]
    assert samples[-1].frame_indices(num_frames)[-3:] == [num_frames - 1] * 3
    assert {s.flip for s in samples} == {True, False}
    return samples


@pytest.fixture(scope="module")
def h264_reference(h264_dataset, h264_plan):
    """The fallback's clips for the H.264 plan, each frame's index checked: what every other loader must match."""
    clips = _clips("daliload-fallback", h264_dataset, h264_plan)
    assert not isinstance(clips, str), clips
    assert _wrong_frames(clips, h264_dataset, h264_plan) == []
    return clips


def _wrong_frames(clips, dataset, samples) -> list[str]:
    """Each frame whose painted index or flip is not the plan's, as ``"sample k frame t: index i, planned j"``."""
    wrong = []
    for k, (clip, sample) in enumerate(zip(clips, samples)):
        planned = sample.frame_indices(dataset.videos[sample.video_index].num_frames)
        for t, index in enumerate(planned):
            try:
                code = read_code(clip[:, t], layout="CHW")
            except FrameCodeError as err:
                wrong.append(f"sample {k} frame {t}: unreadable ({err}), planned {index}")
                continue
            if code.index != index or code.flipped is not sample.flip:
                wrong.append(f"sample {k} frame {t}: index {code.index} flipped {code.flipped}, "
                             f"planned {index} flipped {sample.flip}")
    return wrong


# daliload (the whole loader) plans its own windows, crops included, and refuses another plan: it is
# checked on H.264 against its fallback, which it routes H.264 to on the CPU (the next test).
@pytest.mark.parametrize("name", [name for name in LOADERS
                                  if name not in ("daliload-fallback", "daliload", "daliload-static",
                                                  "daliload-workers")])
def test_every_loader_decodes_the_planned_frames_of_h264_with_b_frames(name, h264_dataset, h264_plan,
                                                                       h264_reference, request):
    dataset_name = h264_dataset.spec.name
    if (name, dataset_name) in NOT_EXACT:
        request.applymarker(pytest.mark.xfail(reason=NOT_EXACT[name, dataset_name], strict=True))
    clips = _clips(name, h264_dataset, h264_plan)
    if isinstance(clips, str):
        if name in ALWAYS_HERE and "does not decode h264" not in clips:
            pytest.fail(f"{name} must run on every machine with the test extra, but: {clips}")
        pytest.skip(f"{name} cannot run on {dataset_name} here: {clips}")
    assert len(clips) == len(h264_reference)
    assert _wrong_frames(clips, h264_dataset, h264_plan) == [], name
    for k, (clip, expected) in enumerate(zip(clips, h264_reference)):
        assert tuple(clip.shape) == tuple(expected.shape) and clip.dtype == expected.dtype
        diffs = _frame_diffs(clip, expected)
        assert max(diffs) < PYAV_LIKE_TOLERANCE, (h264_plan[k], diffs)


def test_the_whole_loader_delivers_its_fallbacks_clips_on_h264(h264_dataset):
    """On the CPU daliload routes H.264 to its fallback: on the run's own plan its clips are the fallback's."""
    samples = make_plan(h264_dataset.videos, TASK, loader_order(h264_dataset))
    whole = _clips("daliload", h264_dataset, samples)
    assert not isinstance(whole, str), whole
    fallback = _clips("daliload-fallback", h264_dataset, samples)
    assert len(whole) == len(fallback) == len(samples)
    for sample, clip, expected in zip(samples, whole, fallback):
        assert torch.equal(clip, expected), sample


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
