"""Multi-view evaluation through the decoders: every view shows the planned frames and crop."""

from __future__ import annotations

import pytest
import torch

from daliload.framecode import read_clip
from daliload.plan import AugmentSpec, ClipSpec, OutputSpec, VideoInfo, make_val_plan
from fallback import views as views_module
from fallback.dataset import DecodeOptions, decode_sample
from fallback.views import decode_views

RAW = OutputSpec(size=(48, 64), mean=(0, 0, 0), std=(1, 1, 1), dtype="float32")


@pytest.fixture(scope="module")
def long_clip(make_clip):
    return make_clip("h264", num_frames=120, width=192, height=96, gop=30)


def view_samples(path, num_frames=120, views=(3, 3), crop_size=(48, 64)):
    video = VideoInfo(str(path), 2, num_frames, 30.0, 192, 96)
    return make_val_plan([video], rank=0, world_size=1, clip=ClipSpec(clip_len=6, frame_stride=4),
                         augment=AugmentSpec(crop_size=crop_size), views=views)


def test_the_fallback_decodes_all_views_in_one_pass_and_each_equals_its_own_decode(long_clip, monkeypatch):
    samples = view_samples(long_clip)
    calls = []
    real = views_module.decode_window

    def counted(path, indices, **kwargs):
        calls.append(list(indices))
        return real(path, indices, **kwargs)

    monkeypatch.setattr(views_module, "decode_window", counted)
    clips, decoded = decode_views(samples, RAW)
    assert len(calls) == 1 and calls[0] == sorted(set(calls[0]))  # one open, ascending, each frame once
    for sample, clip in zip(samples, clips):
        assert torch.equal(clip, decode_sample(sample, RAW, DecodeOptions()))
    # Spatial views: the left end, the centre and the right end of the 192-wide frame.
    assert [s.crop.pixels(96, 192)[1] for s in samples[:3]] == [0, 32, 64]
    assert decoded <= 120


def test_temporal_views_show_windows_from_the_first_frame_to_the_last(long_clip):
    """Whole-frame crops (the output has the frame's shape), so each frame's code can be read back."""
    samples = view_samples(long_clip, views=(3, 1), crop_size=(48, 96))
    clips, _ = decode_views(samples, OutputSpec(size=(48, 96), mean=(0, 0, 0), std=(1, 1, 1), dtype="float32"))
    # Span 21 on 120 frames: starts 0, 49 and 99, the last window ending on frame 119.
    assert [read_clip(clip, layout="CTHW") for clip in clips] == [
        [start + 4 * i for i in range(6)] for start in (0, 49, 99)]


def test_decode_views_refuses_views_of_several_files(long_clip, make_clip):
    other = view_samples(make_clip("h264", num_frames=30, width=192, height=96, gop=10), num_frames=30)
    with pytest.raises(ValueError, match="views of one file"):
        decode_views(view_samples(long_clip)[:2] + other[:1], RAW)
    with pytest.raises(ValueError, match="at least one sample"):
        decode_views([], RAW)
