import numpy as np
import pytest
import av
import torch

from daliload.framecode import FrameCodeError, MAX_INDEX, paint_code, read_clip, read_code


@pytest.mark.parametrize("index", [0, 1, 5, 255, 1000, MAX_INDEX])
def test_roundtrip_raw(index):
    frame = np.full((96, 128, 3), 90, np.uint8)
    paint_code(frame, index)
    assert read_code(frame).index == index
    assert read_code(frame).flipped is False


def test_flipped_and_normalized_and_resized():
    frame = np.random.default_rng(0).integers(0, 255, (256, 340, 3), dtype=np.uint8)
    paint_code(frame, 777)
    flipped = frame[:, ::-1]
    got = read_code(flipped)
    assert (got.index, got.flipped) == (777, True)
    mean, std = np.array([110.0, 100.0, 96.0]), np.array([58.0, 56.0, 55.0])
    normed = ((frame - mean) / std).astype(np.float16)
    assert read_code(torch.from_numpy(normed).permute(2, 0, 1), layout="CHW").index == 777
    small = torch.nn.functional.interpolate(
        torch.from_numpy(frame).permute(2, 0, 1)[None].float(), size=(112, 112), mode="bilinear",
        antialias=True)[0]
    assert read_code(small, layout="CHW").index == 777


def test_unreadable_frames_raise():
    with pytest.raises(FrameCodeError, match="marker"):
        read_code(np.full((64, 64, 3), 50, np.uint8))
    frame = np.full((96, 128, 3), 90, np.uint8)
    paint_code(frame, 300)
    frame[:4, 40:60] = 255 - frame[:4, 40:60]  # flip some code cells
    with pytest.raises(FrameCodeError):
        read_code(frame)
    with pytest.raises(ValueError, match="outside"):
        paint_code(frame, MAX_INDEX + 1)


@pytest.mark.parametrize("codec", ["h264", "vp9"])
def test_code_survives_compression_every_frame(make_clip, codec):
    path = make_clip(codec, num_frames=300, width=340, height=256)
    with av.open(str(path)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(frames) == 300
    assert read_clip(np.stack(frames)) == list(range(300))
