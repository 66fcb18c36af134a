"""Shared fixtures: tiny generated clips with a frame-index code in every frame."""

from __future__ import annotations

import os
from fractions import Fraction
from pathlib import Path

import pytest

from daliload.synth import SynthSpec, default_spec, generate_dataset, render_clip, write_video


@pytest.fixture(autouse=True)
def _fresh_manifest_checks():
    """Each test is a job of its own: a loader checks its dataset again (daliload checks once per process)."""
    from daliload.prescreen.ensure import forget_checks

    forget_checks()
    yield


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    """Skip ``cuda`` tests without a GPU, unless DALILOAD_FAIL_WITHOUT_CUDA=1 asks them to fail."""
    if _has_cuda() or os.environ.get("DALILOAD_FAIL_WITHOUT_CUDA") == "1":
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (set DALILOAD_FAIL_WITHOUT_CUDA=1 to fail instead)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def make_clip(tmp_path_factory):
    """Factory: ``make_clip(codec="h264", num_frames=60, ...) -> Path``, cached per session.

    Keyword arguments: codec, num_frames, width, height, fps (number or Fraction),
    class_id, seed, and any EncodeSpec field (gop, bframes, pix_fmt, quality).
    Frame ``i`` carries frame code ``i``.
    """
    cache: dict[tuple, Path] = {}
    root = tmp_path_factory.mktemp("clips")

    def make(codec="h264", num_frames=60, width=128, height=96, fps=30, class_id=1, seed=0, **spec_kw):
        key = (codec, num_frames, width, height, fps, class_id, seed, tuple(sorted(spec_kw.items())))
        if key not in cache:
            spec = default_spec(codec, fps=Fraction(fps), **spec_kw)
            path = root / f"clip{len(cache):03d}_{codec}.{spec.extension}"
            frames = render_clip(class_id, num_frames, width=width, height=height, fps=float(fps), seed=seed)
            write_video(path, frames, spec)
            cache[key] = path
        return cache[key]

    return make


REALCLIPS = Path(__file__).resolve().parents[2] / "shared" / "realclips"


@pytest.fixture(scope="session")
def realclips() -> Path:
    """``../shared/realclips`` (skips when this checkout has no shared/ beside it)."""
    if not (REALCLIPS / "MANIFEST.tsv").exists():
        pytest.skip(f"real clips not found at {REALCLIPS}")
    return REALCLIPS


@pytest.fixture(scope="session")
def small_kinetics(tmp_path_factory) -> Path:
    """A tiny generated Kinetics-like dataset: 4 classes x 4 clips, 128x96, 2 s, H.264 + VP9,
    20 % broken or odd files (every kind the generator makes). Not scanned yet."""
    root = tmp_path_factory.mktemp("kinetics")
    spec = SynthSpec(num_classes=4, clips_per_class=4, val_fraction=0.25, width=128, height=96,
                     duration_s=2.0, codec_mix={"h264": 0.5, "vp9": 0.5}, broken_fraction=0.2, seed=1)
    generate_dataset(root, spec, workers=2, progress=False)
    return root


@pytest.fixture(scope="session")
def gpu_kinetics(tmp_path_factory) -> Path:
    """Like ``small_kinetics`` at 192x144 (4:3): every codec at a size NVDEC decodes (VP9 needs
    128x128, HEVC 144x144), so on a GPU the H.264 and VP9 files go to DALI. For ``cuda`` tests."""
    root = tmp_path_factory.mktemp("kinetics_gpu")
    spec = SynthSpec(num_classes=4, clips_per_class=4, val_fraction=0.25, width=192, height=144,
                     duration_s=2.0, codec_mix={"h264": 0.5, "vp9": 0.5}, broken_fraction=0.2, seed=1)
    generate_dataset(root, spec, workers=2, progress=False)
    return root


@pytest.fixture(scope="session")
def cut_stream(tmp_path_factory) -> tuple[Path, int]:
    """``(path, frames)``: an MPEG-2 transport stream of ``frames`` frame-coded frames, cut through its last
    frame (as a recording stopped mid-frame): the demuxer sees nothing wrong, the decoder flags the last
    frame it outputs corrupt, and every frame before it is intact."""
    import av

    folder = tmp_path_factory.mktemp("cut_stream")
    full = folder / "full.ts"
    frames = render_clip(3, 60, width=128, height=96, fps=30.0, seed=5)
    with av.open(str(full), "w", format="mpegts") as out:
        stream = out.add_stream("mpeg2video", rate=30)
        stream.width, stream.height, stream.pix_fmt = 128, 96, "yuv420p"
        stream.codec_context.gop_size = 15
        stream.codec_context.qmax = 4  # the frame codes survive
        for frame in frames:
            out.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        out.mux(stream.encode())
    data = full.read_bytes()
    cut = folder / "cut.ts"
    for end in range(len(data) * 2 // 3, len(data), 333):
        cut.write_bytes(data[:end])
        try:
            with av.open(str(cut)) as container:
                flags = [frame.is_corrupt for frame in container.decode(video=0)]
        except av.error.FFmpegError:
            continue
        if len(flags) > 16 and flags[-1] and not any(flags[:-1]):
            return cut, len(flags)
    raise AssertionError("no cut of the stream leaves exactly its last frame corrupt")
