"""fallback.transform: crop, resize, flip and normalize against references computed by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from daliload.framecode import read_clip, read_code
from daliload.plan import CropBox, OutputSpec, Sample
from daliload.synth import render_clip
from fallback import apply_plan


def sample(crop: CropBox | None = None, flip: bool = False) -> Sample:
    return Sample(position=0, video_index=0, path="clip.mp4", label=0, start_frame=0, frame_stride=1,
                  clip_len=2, crop=CropBox.full() if crop is None else crop, flip=flip)


def known_frames() -> np.ndarray:
    """(2, 8, 10, 3): every pixel distinct, value = 50 t + 10 y + x + 3 c (all < 256)."""
    t, y, x, c = np.meshgrid(np.arange(2), np.arange(8), np.arange(10), np.arange(3), indexing="ij")
    return (50 * t + 10 * y + x + 3 * c).astype(np.uint8)


def test_crop_flip_normalize_match_hand_computed_pixels():
    frames = known_frames()
    crop = CropBox(y0=2 / 8, x0=3 / 10, y1=6 / 8, x1=8 / 10)  # rows 2..5, columns 3..7
    spec = OutputSpec(size=(4, 5), mean=(1.0, 2.0, 3.0), std=(2.0, 4.0, 8.0), dtype="float32", layout="CTHW")
    out = apply_plan(frames, sample(crop, flip=True), spec)
    assert out.shape == (3, 2, 4, 5) and out.dtype == torch.float32
    for c, (mean, std) in enumerate(zip(spec.mean, spec.std)):
        for t in range(2):
            for i in range(4):
                for j in range(5):
                    # flipped: output column j shows source column 7 - j
                    pixel = 50 * t + 10 * (2 + i) + (7 - j) + 3 * c
                    assert out[c, t, i, j].item() == pytest.approx((pixel - mean) / std, abs=1e-6)


def test_tchw_layout_and_float16():
    frames = known_frames()
    spec = OutputSpec(size=(8, 10), mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0), dtype="float16", layout="TCHW")
    out = apply_plan(frames, sample(), spec)
    assert out.shape == (2, 3, 8, 10) and out.dtype == torch.float16 and out.is_contiguous()
    assert out[1, 2, 7, 9].item() == 50 + 70 + 9 + 6


def test_uint8_output_is_the_cropped_pixels():
    frames = known_frames()
    spec = OutputSpec(size=(2, 3), mean=(0, 0, 0), std=(1, 1, 1), dtype="uint8", layout="TCHW")
    out = apply_plan(torch.from_numpy(frames), sample(CropBox(0.5, 0.2, 0.75, 0.5)), spec)
    assert out.dtype == torch.uint8
    assert torch.equal(out, torch.from_numpy(frames[:, 4:6, 2:5, :]).permute(0, 3, 1, 2))


def test_antialiased_downscale_of_a_ramp():
    # Columns hold 4 x; a 2x downscale with a symmetric (antialiasing) filter
    # maps a linear ramp to its value at each output pixel's centre, input
    # column 2 j + 0.5, i.e. 8 j + 2, away from the borders.
    ramp = np.broadcast_to((4 * np.arange(32)).astype(np.uint8)[None, None, :, None], (1, 16, 32, 3))
    spec = OutputSpec(size=(8, 16), mean=(0, 0, 0), std=(1, 1, 1), dtype="float32", layout="TCHW")
    out = apply_plan(np.ascontiguousarray(ramp), sample(), spec)
    interior = out[0, :, :, 1:15]
    assert torch.equal(interior, (8 * torch.arange(1, 15, dtype=torch.float32) + 2).expand(3, 8, 14))


def test_antialiasing_averages_a_fine_pattern():
    # One-pixel stripes 0/200 shrunk 4x: antialiasing gives their mean, not an alias.
    stripes = np.zeros((1, 32, 32, 3), np.uint8)
    stripes[:, :, ::2] = 200
    spec = OutputSpec(size=(8, 8), mean=(0, 0, 0), std=(1, 1, 1), dtype="float32", layout="TCHW")
    out = apply_plan(stripes, sample(), spec)
    assert torch.all((out[..., 1:7] - 100).abs() <= 1)


def test_frame_code_survives_resize_and_flip():
    frames = np.stack(list(render_clip(4, 3, width=128, height=96)))
    spec = OutputSpec(size=(72, 100), dtype="float16", layout="CTHW")
    out = apply_plan(frames, sample(), spec)
    assert read_clip(out, layout="CTHW") == [0, 1, 2]
    flipped = apply_plan(frames, sample(flip=True), spec)
    code = read_code(flipped[:, 1], layout="CHW")
    assert code.flipped and code.index == 1


def test_wrong_frames_are_type_errors():
    spec = OutputSpec(size=(4, 4))
    wants = r"clip.mp4: apply_plan wants \(T, H, W, 3\) uint8 frames, "
    with pytest.raises(TypeError, match=wants + r"got torch.float32 \(2, 8, 8, 3\)"):
        apply_plan(np.zeros((2, 8, 8, 3), np.float32), sample(), spec)
    with pytest.raises(TypeError, match=r"got torch.uint8 \(8, 8, 3\)"):
        apply_plan(torch.zeros((8, 8, 3), dtype=torch.uint8), sample(), spec)


@pytest.mark.parametrize("dtype,layout", [("float16", "CTHW"), ("float32", "TCHW"), ("uint8", "CTHW")])
def test_out_receives_the_clip_unchanged(dtype, layout):
    """Workers normalise straight into their shared-memory transfer: the same clip as a new tensor."""
    frames = np.stack(list(render_clip(4, 3, width=128, height=96)))
    plain = dict(mean=(0, 0, 0), std=(1, 1, 1)) if dtype == "uint8" else {}
    spec = OutputSpec(size=(72, 100), dtype=dtype, layout=layout, **plain)
    expected = apply_plan(frames, sample(flip=True), spec)
    out = torch.full(expected.shape, 7, dtype=expected.dtype)
    assert apply_plan(frames, sample(flip=True), spec, out=out) is out
    assert torch.equal(out, expected)


def test_normalisation_is_pixel_minus_mean_over_std():
    frames = np.random.default_rng(3).integers(0, 256, (2, 6, 8, 3), dtype=np.uint8)
    spec = OutputSpec(size=(6, 8), mean=(110.2, 100.6, 96.0), std=(58.1, 56.5, 55.3), dtype="float32",
                      layout="CTHW")
    want = (torch.from_numpy(frames).permute(3, 0, 1, 2).float() - torch.tensor(spec.mean).view(3, 1, 1, 1)) \
        / torch.tensor(spec.std).view(3, 1, 1, 1)
    torch.testing.assert_close(apply_plan(frames, sample(), spec), want, rtol=0, atol=1e-5)


def test_an_out_of_the_wrong_shape_or_dtype_is_refused():
    frames = np.zeros((2, 8, 8, 3), np.uint8)
    spec = OutputSpec(size=(4, 4), dtype="float16", layout="CTHW")
    with pytest.raises(ValueError, match=r"out must be a contiguous torch.float16 tensor of shape \(3, 2, 4, 4\), "
                                         r"got torch.float32 \(3, 2, 4, 4\)"):
        apply_plan(frames, sample(), spec, out=torch.empty((3, 2, 4, 4)))
    with pytest.raises(ValueError, match=r"got torch.float16 \(2, 3, 4, 4\)"):
        apply_plan(frames, sample(), spec, out=torch.empty((2, 3, 4, 4), dtype=torch.float16))
