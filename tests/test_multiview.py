"""Multi-view evaluation through the decoders: every view shows the planned frames and crop."""

from __future__ import annotations

import os

import pytest
import torch

from daliload.framecode import read_clip
from daliload.plan import AugmentSpec, ClipSpec, OutputSpec, VideoInfo, make_val_plan
from fallback import views as views_module
from fallback.options import FallbackOptions
from fallback.source import decode_sample
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
        assert torch.equal(clip, decode_sample(sample, RAW, FallbackOptions()))
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


# --- through the loader ----------------------------------------------------------------------

def views_loader(root, views=(3, 2), **kwargs):
    from daliload.loader import DecodeSpec, KineticsDALILoader
    from daliload.plan import AugmentSpec

    # The output has the frames' 4:3 shape, so every crop is the whole frame and its frame code reads back.
    return KineticsDALILoader(root, "val", batch_size=2, clip_len=4, frame_stride=3, views=views,
                              augment=AugmentSpec(crop_size=(48, 64)), output=RAW,
                              decode=DecodeSpec(**({"fallback_workers": 1, "timeout_s": 30.0} | kwargs)))


def test_the_loader_gives_every_video_with_all_its_views_in_one_row(small_kinetics):
    loader = views_loader(small_kinetics)
    frames = {v.path: v.num_frames for v in loader.videos}
    routes = {v.route for v in loader.videos}
    assert routes == {"dali", "fallback"}  # VP9 through DALI on the CPU, H.264 through the fallback
    rows = 0
    for (videos, labels), batch in zip(loader, loader.plan()):
        assert videos.shape == (2, 6, 3, 4, 48, 64) and labels.shape == (2,)
        for row in range(2):
            views = batch[6 * row:6 * row + 6]
            assert [s.view for s in views] == list(range(6))
            assert int(labels[row]) == (-1 if views[0].is_padding else views[0].label)
            for view, sample in enumerate(views):
                assert read_clip(videos[row, view], layout="CTHW") == sample.frame_indices(frames[sample.path])
            rows += 1
    assert rows == 2 * len(loader)
    starts = [s.start_frame for s in loader.plan()[0][:6:2]]  # the 3 temporal views of the first video
    assert starts[0] == 0 and starts == sorted(starts) and len(set(starts)) == 3
    loader.close()


def test_multi_view_evaluation_counts_each_video_once(small_kinetics):
    from daliload.evaluation import evaluate
    from eval_model import ChannelMeans

    loader = views_loader(small_kinetics, views=(2, 1))
    model = ChannelMeans(frames=4)
    result = evaluate(model, loader, topk=(1,), views_per_forward=3)
    assert result.num_videos == len(loader.videos) and result.views == 2 and result.failed == ()
    assert max(model.calls) <= 3
    loader.close()


def test_views_are_refused_for_training_and_checked_on_resume(small_kinetics):
    from daliload.loader import KineticsDALILoader

    with pytest.raises(ValueError, match=r"views=\(2, 1\) is for evaluation splits"):
        KineticsDALILoader(small_kinetics, "train", views=(2, 1))
    with pytest.raises(ValueError, match=r"views must be \(num_temporal, num_spatial\)"):
        views_loader(small_kinetics, views=(0, 3))
    state = views_loader(small_kinetics, views=(3, 2)).state_dict()
    assert state["views"] == [3, 2]
    with pytest.raises(ValueError, match=r"cannot resume: the state was saved with views=\[3, 2\]"):
        views_loader(small_kinetics, views=(2, 2)).load_state_dict(state)


def test_a_video_whose_views_fail_gets_label_minus_one(small_kinetics, tmp_path):
    import shutil

    root = tmp_path / "copy"
    shutil.copytree(small_kinetics, root, ignore=shutil.ignore_patterns(".daliload"))
    loader = views_loader(root, views=(2, 1), max_failure_fraction=1.0)
    gone = loader.plan()[0][0].path
    os.remove(gone)
    videos, labels = next(iter(loader))
    assert int(labels[0]) == -1 and videos.shape[1] == 2
    assert loader.stats().clips_masked >= 2
    loader.close()


def test_the_loaders_fallback_decodes_each_videos_views_in_one_pass(small_kinetics, monkeypatch):
    """In-process fallback (no workers), so the decode calls can be counted: one per video row, not per view."""
    calls = []
    real = views_module.decode_window

    def counted(path, indices, **kwargs):
        calls.append(path)
        return real(path, indices, **kwargs)

    monkeypatch.setattr(views_module, "decode_window", counted)
    loader = views_loader(small_kinetics, views=(3, 2), decoder="fallback", fallback_workers=0)
    frames = {v.path: v.num_frames for v in loader.videos}
    rows = 0
    for (videos, _labels), batch in zip(loader, loader.plan()):
        for k, sample in enumerate(batch):
            assert read_clip(videos[k // 6, k % 6], layout="CTHW") == sample.frame_indices(frames[sample.path])
        rows += len(batch) // 6
    assert len(calls) == rows  # one open and one pass per video (padding repeats are rows too)
    loader.close()


def test_dali_takes_the_same_three_crops_as_the_fallback(make_clip):
    """Spatial views on the DALI path: both ends and the centre of the long side, as the fallback cuts them."""
    from daliload.dali import is_dali_available
    from daliload.dali import DaliClipDecoder

    if not is_dali_available():
        pytest.skip("nvidia-dali is not installed")
    path = make_clip("vp9", num_frames=24, width=128, height=96, gop=8)
    video = VideoInfo(str(path), 1, 24, 30.0, 128, 96)
    samples = make_val_plan([video], rank=0, world_size=1, clip=ClipSpec(clip_len=4, frame_stride=2),
                            augment=AugmentSpec(crop_size=48), views=(1, 3))
    assert [s.crop.pixels(96, 128) for s in samples] == [(0, 0, 96, 96), (0, 16, 96, 112), (0, 32, 96, 128)]
    square = OutputSpec(size=(48, 48), mean=(0, 0, 0), std=(1, 1, 1), dtype="float32")
    with DaliClipDecoder(square, batch_size=3, device="cpu", num_threads=2) as decoder:
        dali = decoder.decode_batch(samples).videos
    fallback, _ = decode_views(samples, square)
    for k in range(3):
        assert float((dali[k] - fallback[k]).abs().mean()) < 3.0  # 0..255 pixels: resampling differences only
    assert float((dali[0] - dali[2]).abs().mean()) > 10.0  # the two ends really are other pixels
