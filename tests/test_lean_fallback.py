"""The fallback on a GPU host: workers that only crop, resize and flip (uint8), and the merge that normalises.

``FallbackSource(normalize_on="device")`` writes uint8 pixels and the merge normalises them on the
batch's device with :func:`fallback.transform.normalize_pixels`. Here the device is the CPU: the same
function the GPU path runs, compared with the workers' own :func:`fallback.transform.normalize` on the
same samples of real H.264 and VP9 clips. Bitwise for every dtype.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from daliload.epoch import EpochCounters, EpochPass, PassSetup, Routes, fallback_normalizes_on
from daliload.epoch import _sources as sources_mod
from daliload.failures import DecodeFailureWarning, FailureBudget
from daliload.loader import DecodeSpec, KineticsDALILoader
from daliload.plan import AugmentSpec, CropBox, OutputSpec, Sample
from daliload.testing import inject_faults
from fallback.source import FallbackSource
from fallback.transform import apply_plan, clip_shape, normalize_pixels, output_dtype, pixel_spec

KINETICS = OutputSpec(size=(56, 72))  # Kinetics mean and std, float32, CTHW
SPECS = [OutputSpec(size=(56, 72), dtype=dtype, layout=layout)
         for dtype in ("float32", "float16", "bfloat16") for layout in ("CTHW", "TCHW")]


def frames_with_ramps(count: int = 5) -> np.ndarray:
    """Every uint8 value in every channel, so each constant of the normalisation is exercised."""
    rng = np.random.default_rng(3)
    return rng.integers(0, 256, (count, 90, 120, 3), dtype=np.uint8)


INSIDE = CropBox(0.1, 0.05, 0.9, 0.95)


def sample(path: str = "clip.mp4", *, start: int = 0, crop: CropBox = INSIDE,
           flip: bool = True, position: int = 0, clip_len: int = 5) -> Sample:
    return Sample(position=position, video_index=position, path=path, label=position % 3, start_frame=start,
                  frame_stride=2, clip_len=clip_len, crop=crop, flip=flip)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.dtype}-{s.layout}")
def test_normalizing_the_pixels_is_bitwise_what_the_worker_gives(spec):
    frames, s = frames_with_ramps(), sample()
    want = apply_plan(frames, s, spec)
    pixels = apply_plan(frames, s, pixel_spec(spec))
    assert pixels.dtype == torch.uint8 and pixels.shape == want.shape
    assert torch.equal(normalize_pixels(pixels, spec), want)
    # A batch of them, into the rows of a batch (as the merge writes them).
    batch = torch.full((3, *want.shape), 7.0, dtype=want.dtype)
    rows = batch[1:]
    assert normalize_pixels(torch.stack([pixels, pixels]), spec, out=rows) is rows
    assert torch.equal(batch[1], want) and torch.equal(batch[2], want) and bool((batch[0] == 7).all())


def test_normalize_pixels_refuses_what_is_not_uint8_pixels():
    with pytest.raises(ValueError, match=r"wants uint8 clips .* got torch.float32 \(3, 5, 56, 72\)"):
        normalize_pixels(torch.zeros((3, 5, 56, 72)), KINETICS)
    with pytest.raises(ValueError, match="out must be a contiguous torch.float32 tensor of shape"):
        normalize_pixels(torch.zeros((3, 5, 56, 72), dtype=torch.uint8), KINETICS,
                         out=torch.empty((3, 5, 56, 72), dtype=torch.float16))


def test_the_pixel_spec_keeps_size_and_layout_and_a_uint8_output_is_left_alone():
    spec = OutputSpec(size=(224, 224), dtype="float16", layout="TCHW")
    assert pixel_spec(spec) == OutputSpec(size=(224, 224), mean=(0, 0, 0), std=(1, 1, 1), dtype="uint8",
                                          layout="TCHW")
    raw = OutputSpec(size=(56, 72), mean=(0, 0, 0), std=(1, 1, 1), dtype="uint8")
    source = FallbackSource(raw, workers=0, normalize_on="device")
    assert source.normalize_on == "worker" and source.written == raw  # nothing to normalise
    with pytest.raises(ValueError, match="normalize_on must be 'worker' or 'device', got 'gpu'"):
        FallbackSource(KINETICS, workers=0, normalize_on="gpu")


def test_the_loaders_device_decides_where_the_fallback_normalises():
    assert fallback_normalizes_on(torch.device("cuda", 0)) == "device"
    assert fallback_normalizes_on(torch.device("cpu")) == "worker"
    assert fallback_normalizes_on(torch.device("meta")) == "worker"


def test_bytes_per_clip_both_ways():
    """What crosses to the GPU per fallback clip at the benchmark's size: 16 frames, 224 crop."""
    spec = OutputSpec(size=(224, 224))
    shape = clip_shape(16, spec)
    worker = FallbackSource(spec, workers=0)
    device = FallbackSource(spec, workers=0, normalize_on="device")
    assert math.prod(shape) * output_dtype(worker.written).itemsize == 9_633_792  # float32
    assert math.prod(shape) * output_dtype(device.written).itemsize == 2_408_448  # uint8: a quarter
    half = FallbackSource(OutputSpec(size=(224, 224), dtype="float16"), workers=0)
    assert math.prod(shape) * output_dtype(half.written).itemsize == 4_816_896


@pytest.fixture(scope="module")
def clips(make_clip, tmp_path_factory) -> dict[str, str]:
    garbage = tmp_path_factory.mktemp("lean") / "garbage.mp4"
    garbage.write_bytes(np.random.default_rng(1).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    return {"h264": str(make_clip(codec="h264", num_frames=40, width=170, height=128, gop=10)),
            "vp9": str(make_clip(codec="vp9", num_frames=40, width=170, height=128, gop=10)),
            "garbage": str(garbage)}


def plan_of(clips: dict[str, str], *, with_garbage: bool) -> list[Sample]:
    paths = [clips["h264"], clips["vp9"], clips["h264"], clips["garbage" if with_garbage else "vp9"],
             clips["vp9"], clips["h264"]]
    crops = [INSIDE, CropBox.full(), CropBox(0.0, 0.2, 0.7, 0.9)]
    return [sample(path, start=(5 * i) % 24, crop=crops[i % 3], flip=bool(i % 2), position=i)
            for i, path in enumerate(paths)]


def run_pass(samples: list[Sample], source: FallbackSource, output: OutputSpec) -> tuple[list, FailureBudget]:
    budget = FailureBudget(len({s.path for s in samples}), max_fraction=1.0)
    setup = PassSetup(output=output, device=torch.device("cpu"), label_padding=False, mask_failed=False, prefetch=2,
                      num_frames=lambda path: None)
    batches = [samples[:4], samples[4:]]
    passing = EpochPass(setup, batches, samples, routes=Routes(), budget=budget, counters=EpochCounters(),
                        fallback=source)
    return [(v.clone(), labels.clone()) for v, labels, _ in passing], budget


@pytest.mark.parametrize("spec", [SPECS[0], SPECS[3]], ids=lambda s: f"{s.dtype}-{s.layout}")
def test_the_merge_normalises_device_mode_clips_into_the_workers_batches(clips, spec):
    """Same samples, both modes, through the epoch pass on the CPU: the groups differ (uint8 pixels against
    finished clips), the batches are bitwise the same."""
    samples = plan_of(clips, with_garbage=False)
    worker = FallbackSource(spec, workers=1)
    device = FallbackSource(spec, workers=1, normalize_on="device")
    try:
        finished = worker.collect(worker.submit(samples[:3]))
        pixels = device.collect(device.submit(samples[:3]))
        assert finished.normalized and finished.videos.dtype == output_dtype(spec)
        assert not pixels.normalized and pixels.videos.dtype == torch.uint8
        assert pixels.videos.shape == finished.videos.shape and not pixels.failures
        assert pixels.frames_decoded == finished.frames_decoded
        assert torch.equal(normalize_pixels(pixels.videos, spec), finished.videos)
        want, _ = run_pass(samples, worker, spec)
        got, _ = run_pass(samples, device, spec)
    finally:
        worker.close()
        device.close()
    assert len(got) == len(want) == 2
    for (videos, labels), (videos_w, labels_w) in zip(got, want):
        assert videos.dtype == videos_w.dtype and torch.equal(videos, videos_w) and torch.equal(labels, labels_w)


def test_a_bad_file_fails_its_sample_with_its_reason_and_its_replacement_is_normalised(clips):
    """The garbage file's row fails in the worker as before (named, with FFmpeg's reason); its replacement
    comes through the same source, as uint8, and the merge normalises it beside the batch's other rows."""
    samples = plan_of(clips, with_garbage=True)
    worker = FallbackSource(KINETICS, workers=1)
    device = FallbackSource(KINETICS, workers=1, normalize_on="device")
    try:
        decoded = device.collect(device.submit(samples[3:4]))
        assert list(decoded.failures) == [0]
        failure = decoded.failures[0]
        assert failure.path == clips["garbage"] and failure.kind == "decode" and failure.reason
        want, budget_w = run_pass(samples, worker, KINETICS)
        got, budget = run_pass(samples, device, KINETICS)
    finally:
        worker.close()
        device.close()
    assert [f.path for f in budget.failures] == [clips["garbage"]]
    assert [f.reason for f in budget.failures] == [f.reason for f in budget_w.failures]
    assert budget.replacements == budget_w.replacements and len(budget.replacements) == 1
    for (videos, labels), (videos_w, labels_w) in zip(got, want):
        assert torch.equal(videos, videos_w) and torch.equal(labels, labels_w)


def test_a_test_double_in_the_workers_writes_the_same_uint8_pixels(clips):
    """``inject_faults`` swaps the workers' task; the source still gives it the uint8 spec it writes."""
    samples = plan_of(clips, with_garbage=False)[:2]
    device = FallbackSource(KINETICS, workers=1, normalize_on="device")
    try:
        clean = device.collect(device.submit(samples)).videos.clone()
        inject_faults(device, {samples[1].path: "fail"})
        decoded = device.collect(device.submit(samples))
    finally:
        device.close()
    assert list(decoded.failures) == [1] and "test fault 'fail'" in decoded.failures[1].reason
    assert decoded.videos.dtype == torch.uint8 and torch.equal(decoded.videos[0], clean[0])


@pytest.mark.cuda
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.dtype}-{s.layout}")
def test_on_the_gpu_normalizing_the_pixels_is_bitwise_what_the_worker_gives(spec):
    frames, s = frames_with_ramps(), sample()
    pixels = apply_plan(frames, s, pixel_spec(spec)).cuda()
    assert torch.equal(normalize_pixels(pixels, spec).cpu(), apply_plan(frames, s, spec))


# --- through KineticsDALILoader, the mode forced on the CPU --------------------------------------------

JITTER = AugmentSpec(crop_size=(48, 64), crop_mode="random_resized", flip_prob=0.5)  # resized: the float path



def loader_on(root, **decode) -> KineticsDALILoader:
    decode.setdefault("max_failure_fraction", 1.0)
    return KineticsDALILoader(root, "train", batch_size=4, clip_len=6, frame_stride=3, augment=JITTER,
                              output=OutputSpec(dtype="float16"), device="cpu", decode=DecodeSpec(**decode))


def epoch_of(loader: KineticsDALILoader) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(videos.clone(), labels.clone()) for videos, labels in loader]


@pytest.mark.parametrize("decoder", ["fallback", "auto"])
def test_a_loader_gives_the_same_batches_whichever_side_normalises(small_kinetics, monkeypatch, decoder):
    """``decoder="auto"``: with DALI installed its VP9 rows (finished) and the fallback's H.264 rows (uint8)
    share batches, and the merge normalises only the latter."""
    default = loader_on(small_kinetics, decoder=decoder)
    want = epoch_of(default)
    default.close()
    monkeypatch.setattr(sources_mod, "fallback_normalizes_on", lambda device: "device")
    lean = loader_on(small_kinetics, decoder=decoder)
    assert default.sources.fallback.normalize_on == "worker" and lean.sources.fallback.normalize_on == "device"
    got = epoch_of(lean)
    stats = lean.stats()
    lean.close()
    assert stats.clips_fallback > 0 and (stats.clips_dali > 0) == (decoder == "auto" and lean.dali_enabled)
    assert len(got) == len(want) == len(lean)
    for (videos, labels), (videos_w, labels_w) in zip(got, want):
        assert videos.dtype == torch.float16 and torch.equal(videos, videos_w) and torch.equal(labels, labels_w)


def test_a_loader_in_device_mode_fails_a_file_broken_after_the_scan_as_the_default_does(small_kinetics, tmp_path,
                                                                                      monkeypatch):
    """Nothing lost: the same file fails with the same reason, and the same replacement fills its slot."""
    root = tmp_path / "data"
    shutil.copytree(small_kinetics, root, ignore=shutil.ignore_patterns(".daliload"))
    default = loader_on(root, decoder="fallback")
    monkeypatch.setattr(sources_mod, "fallback_normalizes_on", lambda device: "device")
    lean = loader_on(root, decoder="fallback")
    victim = Path(lean.plan()[0][0].path)
    victim.write_bytes(victim.read_bytes()[:200])  # broken after the scan: its header only
    try:
        with pytest.warns(DecodeFailureWarning):
            want = epoch_of(default)
        with pytest.warns(DecodeFailureWarning):
            got = epoch_of(lean)
        stats, stats_w = lean.stats(), default.stats()
    finally:
        default.close()
        lean.close()
    assert [f.path for f in stats.failures] == [str(victim)]
    assert stats.failures[0].reason and [f.reason for f in stats.failures] == [f.reason for f in stats_w.failures]
    assert stats.replacements == stats_w.replacements and stats.replacements
    for (videos, labels), (videos_w, labels_w) in zip(got, want):
        assert torch.equal(videos, videos_w) and torch.equal(labels, labels_w)


@pytest.mark.cuda
def test_a_gpu_loader_normalises_on_the_device_and_gives_the_cpu_loaders_batches(small_kinetics):
    """The mode as a GPU host runs it (no switch): uint8 groups, normalised on the GPU, the CPU's batches."""
    on_cpu = loader_on(small_kinetics, decoder="fallback")
    want = epoch_of(on_cpu)
    on_cpu.close()
    on_gpu = KineticsDALILoader(small_kinetics, "train", batch_size=4, clip_len=6, frame_stride=3, augment=JITTER,
                                output=OutputSpec(dtype="float16"), device="gpu",
                                decode=DecodeSpec(decoder="fallback", max_failure_fraction=1.0))
    assert on_gpu.sources.fallback.normalize_on == "device"
    got = [(videos.cpu(), labels.cpu()) for videos, labels in on_gpu]
    on_gpu.close()
    for (videos, labels), (videos_w, labels_w) in zip(got, want):
        assert torch.equal(videos, videos_w) and torch.equal(labels, labels_w)
