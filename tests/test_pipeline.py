"""The DALI path: planned clips decoded by DALI (CPU here; GPU tests carry the ``cuda`` marker).

DALI's CPU decoder only does VP8/VP9/MJPEG, so the clips are VP9. Frame
indices are read back from the frame code painted into every generated frame.
"""

from __future__ import annotations

import pickle
import re
import sys
from pathlib import Path

import av
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from daliload.framecode import read_clip, read_code
from daliload.plan import (
    AugmentSpec,
    ClipSpec,
    CropBox,
    OutputSpec,
    Sample,
    VideoInfo,
    make_train_plan,
)

from daliload.dali import _pipeline as pipeline
from daliload.dali import DaliBatchError, DaliClipDecoder, DecodedBatch

try:
    import nvidia.dali  # noqa: F401

    HAS_DALI = True
except ImportError:
    HAS_DALI = False


def needs_dali(test):
    """Mark ``test`` as needing DALI and skip it without DALI installed."""
    skip = pytest.mark.skipif(not HAS_DALI, reason="nvidia-dali is not installed")
    return pytest.mark.dali(skip(test))


#: Raw pixels out: no normalisation, exact float values, native size (no resampling).
RAW = OutputSpec(size=(96, 128), mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0), dtype="float32",
                 layout="CTHW")
NUM_FRAMES = 90  # keyframes every 30 frames: 0, 30, 60


def raw_output(size=(96, 128), layout="CTHW", dtype="float32") -> OutputSpec:
    """Pixels as decoded: no normalisation."""
    return OutputSpec(size=size, mean=(0, 0, 0), std=(1, 1, 1), dtype=dtype, layout=layout)


def sample(path, start, stride, clip_len=8, *, crop=None, flip=False, label=3,
           position=0) -> Sample:
    return Sample(position=position, video_index=0, path=str(path), label=label, start_frame=start,
                  frame_stride=stride, clip_len=clip_len, crop=crop or CropBox.full(), flip=flip)


@pytest.fixture(scope="module")
def vp9(make_clip) -> Path:
    return make_clip(codec="vp9", num_frames=NUM_FRAMES, gop=30)


@pytest.fixture(scope="module")
def raw_decoder():
    if not HAS_DALI:
        pytest.skip("nvidia-dali is not installed")
    with DaliClipDecoder(RAW, batch_size=4, device="cpu", num_threads=2,
                         prefetch_queue_depth=3) as decoder:
        yield decoder


# --- frames ---------------------------------------------------------------------


WINDOWS = [
    (0, 1, 8),    # the first frames
    (40, 3, 8),   # starts after the keyframe at 30, stride > 1
    (61, 2, 6),   # starts just after the keyframe at 60, a shorter clip
    (70, 4, 8),   # runs past the end: 70, 74, ..., 86, then 89 (edge padding)
]


@needs_dali
@pytest.mark.parametrize("layout", ["CTHW", "TCHW"])
def test_frame_indices_match_the_plan(vp9, layout):
    with DaliClipDecoder(raw_output(layout=layout), batch_size=4, device="cpu",
                         num_threads=2) as decoder:
        # Same clip_len within a batch (it is stacked): two batches.
        for windows in ([w for w in WINDOWS if w[2] == 8], [w for w in WINDOWS if w[2] != 8]):
            samples = [sample(vp9, *w, label=10 + i, position=i) for i, w in enumerate(windows)]
            batch = decoder.decode_batch(samples)
            assert isinstance(batch, DecodedBatch) and batch.samples == tuple(samples)
            t = samples[0].clip_len
            n = len(samples)
            expected_shape = (n, 3, t, 96, 128) if layout == "CTHW" else (n, t, 3, 96, 128)
            assert tuple(batch.videos.shape) == expected_shape
            assert batch.videos.dtype == torch.float32
            for s, clip in zip(samples, batch.videos):
                assert read_clip(clip, layout=layout) == s.frame_indices(NUM_FRAMES)


def test_window_past_the_end_repeats_the_last_frame(vp9, raw_decoder):
    batch = raw_decoder.decode_batch([sample(vp9, 70, 4), sample(vp9, 89, 2)])
    assert read_clip(batch.videos[0], layout="CTHW") == [70, 74, 78, 82, 86, 89, 89, 89]
    assert read_clip(batch.videos[1], layout="CTHW") == [89] * 8
    # Edge padding repeats the decoded frame itself, pixel for pixel.
    assert torch.equal(batch.videos[0][:, 5], batch.videos[0][:, 7])


#: Windows past the end of the 90-frame clip, and one inside it, as (start, stride).
PAST_END = [(70, 4), (89, 2), (85, 1), (20, 3)]


@needs_dali
@pytest.mark.parametrize(("layout", "dtype"), [("CTHW", "float32"), ("TCHW", "uint8"), ("CTHW", "float16")])
def test_frame_counts_give_the_same_clips_past_the_end(vp9, layout, dtype):
    """With the plan's frame counts DALI decodes only existing frames; the clips are unchanged.

    Crops and flips come before the last frame is repeated, so the repeats
    must equal DALI's own edge padding of the cropped, flipped frame.
    """
    crops = [CropBox.full(), CropBox.full(), CropBox(0.1, 0.2, 0.9, 0.8), CropBox(0.0, 0.0, 0.5, 0.5)]
    samples = [sample(vp9, start, stride, crop=crop, flip=i % 2 == 1, position=i)
               for i, ((start, stride), crop) in enumerate(zip(PAST_END, crops))]
    output = raw_output(layout=layout, dtype=dtype)
    with DaliClipDecoder(output, batch_size=4, device="cpu", num_threads=2) as padded_by_dali, \
            DaliClipDecoder(output, batch_size=4, device="cpu", num_threads=2,
                            num_frames={str(vp9): NUM_FRAMES}) as counted:
        reference = padded_by_dali.decode_batch(samples).videos
        got = counted.decode_batch(samples).videos
    assert got.shape == reference.shape and got.dtype == reference.dtype
    assert torch.equal(got, reference)
    for s, clip in list(zip(samples, got))[:2]:  # the uncropped ones carry a readable frame code
        frames = clip if layout == "TCHW" else clip.transpose(0, 1)  # (T, C, H, W)
        codes = [read_code(frame.float(), layout="CHW") for frame in frames]
        assert [c.index for c in codes] == s.frame_indices(NUM_FRAMES)
        assert {c.flipped for c in codes} == {s.flip}


@needs_dali
def test_frame_counts_ask_dali_for_each_existing_frame_once(vp9, monkeypatch):
    """The cost: P frames past the end used to cost about P decodes of the file; now none."""
    fed = []
    with DaliClipDecoder(RAW, batch_size=4, device="cpu", num_threads=2,
                         num_frames={str(vp9): NUM_FRAMES}) as decoder:
        pipe = decoder._pipe
        real_feed = pipe.feed_input
        monkeypatch.setattr(pipe, "feed_input", lambda name, data: (fed.append((name, data)), real_feed(name, data))[1])
        batch = decoder.decode_batch([sample(vp9, 70, 4), sample(vp9, 89, 2), sample(vp9, 0, 1)])
    frames = dict(fed)["frames"]
    assert [ids.tolist() for ids in frames] == [[70, 74, 78, 82, 86, 89], [89], list(range(8))]
    assert {name for name, _ in fed}.isdisjoint({"start_frame", "frame_stride", "clip_len"})
    assert read_clip(batch.videos[0], layout="CTHW") == [70, 74, 78, 82, 86, 89, 89, 89]
    assert read_clip(batch.videos[1], layout="CTHW") == [89] * 8
    assert read_clip(batch.videos[2], layout="CTHW") == list(range(8))
    # The repeats are the decoded frame itself, pixel for pixel.
    assert torch.equal(batch.videos[0][:, 5], batch.videos[0][:, 7])


@needs_dali
def test_frame_counts_keep_whole_batches_zero_copy(vp9):
    """A batch with no window past the end is still DALI's own buffer; a padded one is a copy."""
    with DaliClipDecoder(RAW, batch_size=2, device="cpu", num_threads=2,
                         num_frames={str(vp9): NUM_FRAMES}) as decoder:
        whole = decoder.decode_batch([sample(vp9, 0, 1), sample(vp9, 30, 2)])
        dali_buffer = torch.from_dlpack(whole.outputs[0].as_tensor())
        assert whole.videos.data_ptr() == dali_buffer.data_ptr()
        padded = decoder.decode_batch([sample(vp9, 0, 1), sample(vp9, 80, 2)])
        assert not padded.outputs[0].is_dense_tensor()
        assert read_clip(padded.videos[1], layout="CTHW") == [80, 82, 84, 86, 88, 89, 89, 89]


@needs_dali
def test_a_file_shorter_than_its_count_fails_its_batch_instead_of_being_padded(vp9, broken_files):
    """With counts DALI pads nothing: a plan that expects frames the file lacks is an error, as a
    start past the end is without counts (the loader then isolates the file)."""
    short = broken_files["truncated"]  # a third of the 90-frame clip
    counts = {str(vp9): NUM_FRAMES, str(short): NUM_FRAMES}
    with DaliClipDecoder(RAW, batch_size=2, device="cpu", num_threads=2, num_frames=counts) as decoder:
        with pytest.raises(DaliBatchError, match=r"out-of-bounds frame index") as info:
            decoder.decode_batch([sample(vp9, 0, 1), sample(short, 60, 2, position=1)])
        assert str(short) in str(info.value)
        after = decoder.decode_batch([sample(vp9, 86, 1)])
        assert read_clip(after.videos[0], layout="CTHW") == [86, 87, 88, 89, 89, 89, 89, 89]


@needs_dali
@pytest.mark.parametrize(("counts", "error", "message"), [
    ([90], TypeError, r"num_frames must be a mapping of path -> frame count \(or a function of the path\) or None, "
                      r"got list"),
    ({"other.webm": 90}, ValueError, r"no frame count for .*clip\d+_vp9.webm in this decoder's num_frames"),
    ({"VP9": 0}, ValueError, r"num_frames\[.*\] must be an integer >= 1 \(frames in the file\), got 0"),
    ({"VP9": -5}, ValueError, r"must be an integer >= 1 .*got -5"),
    ({"VP9": True}, ValueError, r"must be an integer >= 1 .*got True"),
    ({"VP9": 90.0}, ValueError, r"must be an integer >= 1 .*got 90.0"),
])
def test_frame_counts_are_validated(vp9, counts, error, message):
    if isinstance(counts, dict):
        counts = {str(vp9) if k == "VP9" else k: v for k, v in counts.items()}
    with pytest.raises(error, match=message):
        with DaliClipDecoder(RAW, batch_size=1, device="cpu", num_threads=1, num_frames=counts) as decoder:
            decoder.submit([sample(vp9, 0, 1)])


def test_flip_mirrors_every_frame(vp9, raw_decoder):
    batch = raw_decoder.decode_batch([sample(vp9, 10, 2), sample(vp9, 10, 2, flip=True)])
    plain, flipped = batch.videos
    for t in range(8):
        assert read_code(plain[:, t], layout="CHW").flipped is False
        code = read_code(flipped[:, t], layout="CHW")
        assert code.flipped is True and code.index == 10 + 2 * t
    assert torch.equal(flipped, plain.flip(-1))


@pytest.mark.parametrize(("size", "box"), [
    ((48, 48), (12, 20, 84, 92)),     # downscale 72 -> 48, antialiased
    ((64, 64), (0, 16, 96, 112)),     # centre square of the frame
    ((40, 70), (10, 10, 90, 110)),    # non-square, different scale per axis
    ((120, 160), (0, 0, 96, 128)),    # upscale the whole frame
])
def test_crop_and_resize_match_a_torch_reference(vp9, raw_decoder, size, box):
    """DALI's ROI resize against torch's antialiased bilinear resize of the same pixels.

    Tolerance: mean absolute difference < 1.0 in 0..255 units (measured 0.24-0.35:
    DALI rounds its uint8 resize output, and at the box edges it reads the real
    neighbouring pixels where torch repeats the edge).
    """
    y0, x0, y1, x1 = box
    full = raw_decoder.decode_batch([sample(vp9, 20, 3)]).videos[0]  # (C, T, 96, 128)
    crop = CropBox(y0 / 96, x0 / 128, y1 / 96, x1 / 128)
    with DaliClipDecoder(raw_output(size), batch_size=2, device="cpu", num_threads=2) as decoder:
        got = decoder.decode_batch([sample(vp9, 20, 3, crop=crop)]).videos[0]
    frames = full[:, :, y0:y1, x0:x1].permute(1, 0, 2, 3)  # (T, C, h, w)
    reference = F.interpolate(frames, size=size, mode="bilinear", antialias=True,
                              align_corners=False).permute(1, 0, 2, 3)
    assert got.shape == reference.shape == (3, 8, *size)
    assert float((got - reference).abs().mean()) < 1.0


def test_normalisation_dtypes_and_layouts(vp9, raw_decoder):
    samples = [sample(vp9, 5, 5)]
    raw = raw_decoder.decode_batch(samples).videos  # (1, C, T, H, W) float32 pixel values
    default = OutputSpec(size=(96, 128))  # Kinetics mean/std, float32, CTHW
    mean = torch.tensor(default.mean).view(1, 3, 1, 1, 1)
    std = torch.tensor(default.std).view(1, 3, 1, 1, 1)
    # bfloat16 keeps 8 bits of mantissa: |x| < 4 is within 2 ** -6
    for dtype, atol in (("float32", 1e-4), ("float16", 2e-3), ("bfloat16", 2 ** -6)):
        spec = OutputSpec(size=(96, 128), dtype=dtype)
        with DaliClipDecoder(spec, batch_size=1, device="cpu", num_threads=2) as decoder:
            normed = decoder.decode_batch(samples).videos
        assert normed.dtype == getattr(torch, dtype)
        assert torch.allclose(normed.float(), (raw - mean) / std, atol=atol), dtype
    as_uint8 = raw_output(dtype="uint8", layout="TCHW")
    with DaliClipDecoder(as_uint8, batch_size=1, device="cpu", num_threads=2) as decoder:
        pixels = decoder.decode_batch(samples).videos
    assert pixels.dtype == torch.uint8 and pixels.shape == (1, 8, 3, 96, 128)
    assert torch.equal(pixels.permute(0, 2, 1, 3, 4).float(), raw)


@needs_dali
@pytest.mark.parametrize("counted", [False, True], ids=["dali-pads", "counts"])
def test_a_train_plan_decodes_as_planned(make_clip, counted):
    """Plan -> DALI end to end: windows, flips and labels, over clips of several lengths."""
    lengths = [90, 45, 20]  # the last is shorter than a clip's span: edge padding
    videos = [VideoInfo(str(make_clip(codec="vp9", num_frames=n, gop=30)), label=i, num_frames=n,
                        fps=30.0, width=128, height=96) for i, n in enumerate(lengths)]
    clip = ClipSpec(clip_len=8, frame_stride=3)
    # The centre box of a 128x96 frame for a 128x96 output is the whole frame.
    augment = AugmentSpec(crop_size=(96, 128), crop_mode="center", flip_prob=0.5)
    plan = [s for epoch in range(3) for s in make_train_plan(
        videos, seed=1, epoch=epoch, rank=0, world_size=1, clip=clip, augment=augment)]
    assert {s.flip for s in plan} == {True, False}
    output = OutputSpec(size=(96, 128), dtype="float16")  # a float16, Kinetics-normalised output
    counts = {v.path: v.num_frames for v in videos} if counted else None
    with DaliClipDecoder(output, batch_size=3, device="cpu", num_threads=2, num_frames=counts) as decoder:
        for first in range(0, len(plan), 3):
            batch = decoder.decode_batch(plan[first:first + 3])
            for s, clip_tensor in zip(batch.samples, batch.videos):
                codes = [read_code(clip_tensor[:, t], layout="CHW") for t in range(8)]
                assert [c.index for c in codes] == s.frame_indices(lengths[s.video_index])
                assert {c.flipped for c in codes} == {s.flip}



@needs_dali
def test_padding_benchmark_runs_small_and_compares_both_ways(tmp_path):
    """benchmarks.bench_padding: both ways on the same windows (it checks their clips are equal)."""
    import json

    from benchmarks import bench_padding

    out, md = tmp_path / "padding.json", tmp_path / "RESULTS.md"
    assert bench_padding.main(["--frames", "40", "--size", "128x96", "--clip-len", "6", "--stride", "3",
                               "--padded", "0", "5", "--runs", "1", "--data-dir", str(tmp_path / "data"),
                               "--json", str(out), "--results-md", str(md)]) == 0
    result = json.loads(out.read_text())
    assert [row["padded"] for row in result["rows"]] == [0, 5]
    assert [row["start_frame"] for row in result["rows"]] == [39 - 5 * 3, 39]  # ends on the last frame, 39
    assert all(len(row[way]["ms"]) == 1 for row in result["rows"] for way in ("dali_pads", "counts"))
    text = md.read_text()
    assert "## Windows past a file's end on DALI: `python -m benchmarks.bench_padding`" in text and "| 5 | " in text


@pytest.mark.parametrize(("argv", "message"), [
    (["--padded", "16"], r"--padded: each P must be 0 .. clip_len - 1 \(15\), got \[16\]"),
    (["--frames", "30"], r"--frames 30 is too short for a window of 16 frames at stride 4"),
    (["--size", "big"], r"--size: expected WIDTHxHEIGHT, e.g. 340x256, got 'big'"),
    (["--runs", "0"], r"--runs must be >= 1, got 0"),
])
def test_padding_benchmark_refuses_bad_options(argv, message, capsys):
    from benchmarks import bench_padding

    with pytest.raises(SystemExit) as info:
        bench_padding.parse_args(argv)
    assert info.value.code == 2
    assert re.search(message, capsys.readouterr().err)


# --- batches in flight, short batches, errors ----------------------------------------------


def test_batches_in_flight_come_back_in_order_including_short_ones(vp9, raw_decoder):
    batches = [[sample(vp9, 0, 1), sample(vp9, 8, 1), sample(vp9, 16, 1)], [sample(vp9, 50, 2)],
               [sample(vp9, 30, 1, position=i) for i in range(4)]]
    for b in batches:
        raw_decoder.submit(b)
    assert raw_decoder.pending == 3
    message = r"3 batches are already pending \(prefetch_queue_depth=3\)"
    with pytest.raises(RuntimeError, match=message):
        raw_decoder.submit(batches[0])
    for b in batches:
        got = raw_decoder.result()
        assert len(got.videos) == len(b)
        assert [read_clip(v, layout="CTHW")[0] for v in got.videos] == [s.start_frame for s in b]
    assert raw_decoder.pending == 0
    with pytest.raises(RuntimeError, match=r"no batch is pending: submit\(\) one first"):
        raw_decoder.result()


@needs_dali
def test_several_pipelines_take_batches_in_turn_and_return_them_in_order(vp9):
    with DaliClipDecoder(raw_output(), batch_size=2, device="cpu", num_threads=1, pipelines=2,
                         prefetch_queue_depth=3) as decoder:
        assert decoder.pipelines == 2
        starts = [[0, 8], [16, 24], [32, 40], [48, 56]]
        submitted = 0
        for i, pair in enumerate(starts):
            while submitted < len(starts) and (submitted <= i or decoder.pending < 3):
                decoder.submit([sample(vp9, s, 1, position=k) for k, s in enumerate(starts[submitted])])
                submitted += 1
            got = decoder.result()
            assert [read_clip(v, layout="CTHW")[0] for v in got.videos] == pair
    with pytest.raises(ValueError, match="pipelines must be an integer >= 1, got 0"):
        DaliClipDecoder(raw_output(), batch_size=2, device="cpu", pipelines=0)


@pytest.fixture(scope="module")
def broken_files(vp9, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("broken")
    data = vp9.read_bytes()
    files = {
        "garbage": (root / "garbage.webm", np.random.default_rng(0).bytes(4000)),
        "truncated": (root / "truncated.webm", data[: len(data) // 3]),
        "empty": (root / "empty.webm", b""),
    }
    for path, content in files.values():
        path.write_bytes(content)
    return {name: path for name, (path, _) in files.items()} | {"missing": root / "missing.webm"}


@pytest.mark.parametrize(("kind", "start", "reason"), [
    ("garbage", 0, r"Failed to create video decoder"),
    # A third of the file holds fewer than 80 frames.
    ("truncated", 80, r"Start frame 80 is out of bounds for sample #1"),
    ("empty", 0, r"cannot read file: .*file is empty"),
    ("missing", 0, r"cannot read file: .*No such file or directory"),
])
def test_a_failed_batch_names_its_files_and_the_next_batch_decodes(
        vp9, raw_decoder, broken_files, kind, start, reason):
    bad = broken_files[kind]
    samples = [sample(vp9, 0, 1), sample(bad, start, 1, position=1)]
    with pytest.raises(DaliBatchError, match=reason) as info:
        raw_decoder.decode_batch(samples)
    err = info.value
    assert str(bad) in str(err) and str(vp9) in str(err)
    assert err.samples == tuple(samples) and err.paths == [str(vp9), str(bad)]
    if kind != "garbage":  # DALI's message for undecodable bytes names no sample
        assert err.culprit == samples[1]
    if kind in ("garbage", "truncated"):
        assert isinstance(err.__cause__, RuntimeError)  # DALI's own error, kept
    copy = pickle.loads(pickle.dumps(err))  # e.g. sent to a fallback worker
    assert (copy.samples, copy.reason, copy.culprit, str(copy)) == (
        err.samples, err.reason, err.culprit, str(err))
    after = raw_decoder.decode_batch([sample(vp9, 33, 2)])
    assert read_clip(after.videos[0], layout="CTHW") == [33, 35, 37, 39, 41, 43, 45, 47]


def test_a_failed_batch_among_batches_in_flight(vp9, raw_decoder, broken_files):
    raw_decoder.submit([sample(vp9, 1, 1)])
    raw_decoder.submit([sample(broken_files["garbage"], 0, 1)])
    raw_decoder.submit([sample(vp9, 2, 1)])
    assert read_clip(raw_decoder.result().videos[0], layout="CTHW")[0] == 1
    with pytest.raises(DaliBatchError, match="garbage.webm"):
        raw_decoder.result()
    assert read_clip(raw_decoder.result().videos[0], layout="CTHW")[0] == 2


def test_submit_validates_batches(vp9, raw_decoder):
    with pytest.raises(ValueError, match="a batch needs at least one sample"):
        raw_decoder.submit([])
    with pytest.raises(ValueError, match="got 5 samples, more than batch_size=4"):
        raw_decoder.submit([sample(vp9, 0, 1)] * 5)
    with pytest.raises(ValueError, match=r"same clip_len to stack, got \[4, 8\]"):
        raw_decoder.submit([sample(vp9, 0, 1, 8), sample(vp9, 0, 1, 4)])
    with pytest.raises(TypeError, match="expected Sample items, got tuple"):
        raw_decoder.submit([(str(vp9), 0)])
    raw_decoder.submit([sample(vp9, 0, 1)])
    message = r"1 batch\(es\) pending: collect them with result\(\) first"
    with pytest.raises(RuntimeError, match=message):
        raw_decoder.decode_batch([sample(vp9, 0, 1)])
    raw_decoder.result()
    assert raw_decoder.pending == 0


@needs_dali
@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"device": "tpu"}, ValueError, r"device must be 'cpu' or 'gpu', got 'tpu'"),
    ({"batch_size": 0}, ValueError, r"batch_size must be an integer >= 1, got 0"),
    ({"num_threads": 0}, ValueError, r"num_threads must be an integer >= 1, got 0"),
    ({"prefetch_queue_depth": 0}, ValueError,
     r"prefetch_queue_depth must be an integer >= 1, got 0"),
])
def test_decoder_validates_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        DaliClipDecoder(RAW, **{"batch_size": 2, "device": "cpu", **kwargs})


@needs_dali
def test_gpu_device_without_a_gpu_says_so():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ValueError, match=r"device='gpu' needs a CUDA GPU .* use device='cpu'"):
        DaliClipDecoder(RAW, batch_size=2, device="gpu")


@needs_dali
def test_closed_decoder_refuses_work(vp9):
    decoder = DaliClipDecoder(RAW, batch_size=2, device="cpu", num_threads=1)
    decoder.close()
    with pytest.raises(RuntimeError, match="this DaliClipDecoder is closed"):
        decoder.submit([sample(vp9, 0, 1)])


@needs_dali
def test_close_frees_the_pipelines_on_the_closing_thread(vp9):
    """The waiting thread keeps no reference to a call it has run: the last reference to a pipeline goes in
    close(), on the caller's thread. Dropped on the daemon thread while the interpreter exits, it aborted the
    process ("terminate called without an active exception", about 1 exit in 7 after a DALI CPU run)."""
    import weakref

    decoder = DaliClipDecoder(RAW, batch_size=2, device="cpu", num_threads=1)
    decoder.decode_batch([sample(vp9, 0, 1), sample(vp9, 30, 2)]).videos.sum()  # the waiting thread ran a call
    pipes = [weakref.ref(pipe) for pipe in decoder._pipes]
    decoder.close()
    assert [ref() for ref in pipes] == [None]


def test_exit_waits_briefly_for_dropped_dali_work_then_exits_without_it(tmp_path):
    """At exit the waiting thread finishes what an abandoned pass handed it (a thread still inside DALI when
    the interpreter finalizes aborts the process); work longer than EXIT_DRAIN_S is not waited for."""
    import subprocess
    import textwrap

    script = tmp_path / "drop.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(Path.cwd())!r})
        from daliload.dali import _wait as dali_wait
        dali_wait.EXIT_DRAIN_S = 2.0
        waiter = dali_wait.Waiter()
        def dropped():
            time.sleep(float(sys.argv[1]))
            open(sys.argv[2], "w").write("finished")
        waiter.submit(dropped, discard=True)
        print("script ends", flush=True)
    """))
    # The unfinished work sleeps 600 s: a script that waited for it would hit run()'s 120 s limit, however
    # busy the machine (no time is asserted beyond that).
    for seconds, finished in ((0.5, True), (600.0, False)):
        marker = tmp_path / f"marker-{seconds}"
        run = subprocess.run([sys.executable, str(script), str(seconds), str(marker)], capture_output=True,
                             text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        assert "script ends" in run.stdout
        assert marker.exists() is finished
        if not finished:
            assert "dropped batches are still decoding" in run.stderr


def test_missing_dali_raises_an_import_error_that_says_how_to_install(monkeypatch):
    import daliload.dali._errors as dali_errors
    import daliload.dali._pipeline as pipeline

    for name in ("nvidia.dali", "nvidia.dali.fn", "nvidia.dali.pipeline", "nvidia.dali.types"):
        monkeypatch.setitem(sys.modules, name, None)  # None in sys.modules makes the import fail
    message = r"NVIDIA DALI is not installed; pip install 'daliload\[cuda13\]'"
    with pytest.raises(ImportError, match=message) as info:
        dali_errors.import_dali()
    assert "daliload[cuda12]" in str(info.value)
    assert isinstance(info.value.__cause__, ImportError)
    assert dali_errors.is_dali_available() is False
    with pytest.raises(ImportError, match=r"pip install 'daliload\[cuda13\]'"):
        pipeline.DaliClipDecoder(RAW, batch_size=2, device="cpu")


# --- real files and the other decoder ---------------------------------------------------------


def _pyav_frames(path: Path) -> np.ndarray:
    with av.open(str(path)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def test_real_vp9_webm_matches_pyav(realclips, raw_decoder):
    """moviepy/transparent.webm (VP9, 200x200, 150 frames): DALI-CPU against PyAV, same frames.

    Tolerance: mean absolute difference < 1 in 0..255 units (measured 0.05).
    DALI interpolates chroma where FFmpeg's default RGB conversion copies the
    nearest sample (docs/architecture.md, Facts: mean about 3 on busy real footage); this clip
    is flat colours, so the two conversions hardly differ.
    """
    path = realclips / "moviepy" / "transparent.webm"
    reference = _pyav_frames(path)
    assert len(reference) == 150
    output = raw_output(size=(200, 200), layout="TCHW")
    s = sample(path, 20, 5, 8)
    with DaliClipDecoder(output, batch_size=1, device="cpu", num_threads=2) as decoder:
        got = decoder.decode_batch([s]).videos[0].permute(0, 2, 3, 1).numpy()  # (T, H, W, C)
    expected = reference[s.frame_indices(150)].astype(np.float32)
    diff = np.abs(got - expected)
    assert diff.mean() < 1.0
    # A frame off by one would differ far more than the chroma interpolation: the dot moves.
    wrong = np.abs(got - reference[[i + 1 for i in s.frame_indices(150)]].astype(np.float32)).mean()
    assert wrong > diff.mean()


@needs_dali
@pytest.mark.parametrize("counted", [False, True], ids=["dali-pads", "counts"])
def test_dali_and_the_fallback_agree_on_the_same_plan(make_clip, counted):
    """Same plan (random crops, flips, windows) through DALI-CPU and through fallback/.

    The 18-frame video is shorter than a clip's span (22 frames): its window
    runs past the end, padded by DALI or, with counts, repeated by the decoder.
    Tolerance: mean absolute difference < 3 in 0..255 units per clip (measured
    1.3-1.5: chroma interpolation differs, docs/architecture.md; resampling adds < 0.4).
    """
    decode = pytest.importorskip("fallback.decode")
    transform = pytest.importorskip("fallback.transform")
    videos = []
    for i, n in enumerate([90, 18]):
        path = make_clip(codec="vp9", num_frames=n, width=160, height=120, gop=30, seed=n)
        videos.append(VideoInfo(str(path), label=i, num_frames=n, fps=30.0, width=160, height=120))
    augment = AugmentSpec(crop_size=64, crop_mode="random_resized", area_range=(0.3, 1.0))
    plan = make_train_plan(videos, seed=4, epoch=0, rank=0, world_size=1,
                           clip=ClipSpec(clip_len=8, frame_stride=3), augment=augment)
    output = raw_output(size=(64, 64))
    counts = {v.path: v.num_frames for v in videos}
    with DaliClipDecoder(output, batch_size=2, device="cpu", num_threads=2,
                         num_frames=counts if counted else None) as decoder:
        dali_clips = decoder.decode_batch(plan).videos
    assert plan[[s.path for s in plan].index(videos[1].path)].frame_indices(18)[-2:] == [17, 17]  # past the end
    for s, dali_clip in zip(plan, dali_clips):
        frames = decode.decode_window(s.path, s.frame_indices(counts[s.path])).frames
        fallback_clip = transform.apply_plan(frames, s, output)
        assert fallback_clip.shape == dali_clip.shape
        assert float((fallback_clip - dali_clip).abs().mean()) < 3.0, s


# --- GPU ---------------------------------------------------------------------------------------


@needs_dali
@pytest.mark.cuda
@pytest.mark.parametrize("layout", ["CTHW", "TCHW"])
def test_frame_indices_match_the_plan_on_gpu(make_clip, layout):
    """NVDEC ("mixed") decodes the same windows, flips them, and returns CUDA tensors.

    192x144: NVDEC's VP9 minimum is 128x128 (HEVC's 144x144), so the CPU tests' 128x96 clips
    would be routed to the fallback on a GPU, never decoded by NVDEC.
    """
    vp9 = make_clip(codec="vp9", num_frames=NUM_FRAMES, width=192, height=144, gop=30)
    h264 = make_clip(codec="h264", num_frames=NUM_FRAMES, width=192, height=144, gop=30)
    with DaliClipDecoder(raw_output(size=(144, 192), layout=layout), batch_size=4, device="gpu",
                         num_threads=4) as decoder:
        for path in (vp9, h264):
            samples = [sample(path, *w[:2], 8, flip=i % 2 == 1, position=i)
                       for i, w in enumerate([(0, 1), (40, 3), (61, 2), (70, 4)])]
            batch = decoder.decode_batch(samples)
            assert batch.videos.is_cuda
            for s, clip in zip(samples, batch.videos):
                assert read_clip(clip, layout=layout) == s.frame_indices(NUM_FRAMES)
                frame = clip[:, 0] if layout == "CTHW" else clip[0]
                assert read_code(frame, layout="CHW").flipped is s.flip


@needs_dali
def test_the_views_of_a_video_share_one_read_of_its_file(vp9, raw_decoder, monkeypatch):
    """Multi-view evaluation gives DALI one entry per view; the file is read once per batch, not per view."""
    reads = []

    def counted(path, **options):
        reads.append(path)
        return real_read(path, **options)

    real_read = pipeline.read_video_file
    monkeypatch.setattr(pipeline, "read_video_file", counted)
    views = [sample(vp9, start, 2, label=4, position=i) for i, start in enumerate((0, 10, 20, 30))]
    batch = raw_decoder.decode_batch(views)
    assert reads == [str(vp9)]
    assert [read_clip(v, layout="CTHW")[0] for v in batch.videos] == [0, 10, 20, 30]


@needs_dali
@pytest.mark.cuda
def test_frame_counts_on_gpu_give_the_same_clips_on_a_side_stream(make_clip):
    """NVDEC with counts: the same clips as DALI's edge padding, the repeat copy ordered on the caller's stream.

    Decoded on a side stream that is not synchronised with the default one
    before reading: the copy that repeats the last frame must run after
    DALI's outputs are ready on that stream, and read buffers still valid.
    """
    h264 = make_clip(codec="h264", num_frames=NUM_FRAMES, width=192, height=144, gop=30)
    samples = [sample(h264, start, stride, position=i) for i, (start, stride) in enumerate(PAST_END)]
    output = raw_output(size=(144, 192))
    with DaliClipDecoder(output, batch_size=4, device="gpu", num_threads=4) as padded_by_dali, \
            DaliClipDecoder(output, batch_size=4, device="gpu", num_threads=4,
                            num_frames={str(h264): NUM_FRAMES}) as counted:
        reference = padded_by_dali.decode_batch(samples).videos.cpu()
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            batch = counted.decode_batch(samples)
            got = batch.videos.to("cpu", non_blocking=False)  # queued on the side stream, after the copy
    assert batch.videos.is_cuda and torch.equal(got, reference)
    for s, clip in zip(samples, got):
        assert read_clip(clip, layout="CTHW") == s.frame_indices(NUM_FRAMES)


def _tagged_vp9(path, colorspace: int) -> str:
    """A VP9 clip of the generated frames whose stream says ``colorspace`` (1: BT.709, 5: BT.470BG/BT.601)."""
    from daliload.synth import render_clip

    frames = render_clip(3, 24, width=128, height=96, fps=30.0, seed=2)
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libvpx-vp9", rate=30)
        stream.width, stream.height, stream.pix_fmt = 128, 96, "yuv420p"
        stream.codec_context.colorspace = colorspace
        stream.codec_context.color_primaries = colorspace
        for i, rgb in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24").reformat(format="yuv420p")
            frame.pts = i
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return str(path)


@needs_dali
def test_a_bt709_file_gives_the_same_pixels_on_both_routes(tmp_path):
    """One colour rule for both routes: BT.601, whatever the file's tag (as DALI converts)."""
    decode_sample = pytest.importorskip("fallback").decode_sample
    tagged = {space: _tagged_vp9(tmp_path / f"c{space}.webm", space) for space in (1, 5)}
    with av.open(tagged[1]) as container:
        assert next(container.decode(video=0)).colorspace == 1  # the stream really says BT.709
    output = raw_output(size=(96, 128))
    samples = {space: Sample(0, 0, path, 0, 4, 2, 8, CropBox.full()) for space, path in tagged.items()}
    fallback = {space: decode_sample(s, output) for space, s in samples.items()}
    assert torch.equal(fallback[1], fallback[5])  # the tag changes nothing: the same YUV gives the same RGB
    with DaliClipDecoder(output, batch_size=1, device="cpu", num_threads=1) as decoder:
        dali = {space: decoder.decode_batch([s]).videos[0].clone() for space, s in samples.items()}
    assert torch.equal(dali[1], dali[5])  # nor on DALI: it converts BT.601 whatever the tag
    # What is left is chroma interpolation (docs/architecture.md, Facts: measured 2.2 on this clip, against 5.9
    # for a fallback that converted this file with its own BT.709 matrix).
    assert float((dali[1] - fallback[1]).abs().mean()) < 3.0


def test_a_decoder_on_its_own_needs_the_output_size():
    with pytest.raises(ValueError, match=r"OutputSpec.size is not set: a decoder used on its own needs the output "
                                         r"size, e.g. OutputSpec\(size=\(224, 224\)\)"):
        DaliClipDecoder(OutputSpec(), batch_size=1, device="cpu")
