"""DALI decodes only what a window needs: the cut (``fallback.cut``) and the loader feeding it to DALI.

The cut is checked on H.264 (B-frames, closed and open GOPs), HEVC (open GOP,
B-frames), VP9 and with timestamps that do not start at 0, by decoding the
cut bytes with PyAV (the stand-in for NVDEC here) against a full decode,
frame code by frame code. Through ``KineticsDALILoader`` on DALI's CPU
decoder (VP9, GOP 1, 16 and 250): every frame of every window at the start,
the middle, the end and past the end is the planned one, on both routes, and
DALI decodes from the keyframe before the window.
"""

from __future__ import annotations

import io
from fractions import Fraction
from pathlib import Path

import av
import pytest
import torch

from daliload import AugmentSpec, DecodeSpec, KineticsDALILoader, OutputSpec
from daliload.framecode import read_code
from daliload.prescreen.probe import probe_file
from daliload.synth.content import render_clip
from daliload.synth.encode import default_spec, write_video
from fallback.cut import cut_task, cut_window
from fallback.numbering import StreamHint
from test_frame_exactness import encode

RAW = OutputSpec(mean=(0, 0, 0), std=(1, 1, 1))


def codes_of(source) -> list[int]:
    """Frame codes of a full PyAV decode of ``source`` (a path, or bytes of a file)."""
    handle = io.BytesIO(source) if isinstance(source, bytes) else str(source)
    with av.open(handle) as container:
        return [read_code(f.to_ndarray(format="rgb24"), layout="HWC").index for f in container.decode(video=0)]


def hint_of(path) -> StreamHint:
    facts = probe_file(path)
    assert facts.ok and not facts.vfr, facts
    return StreamHint(facts.keyframes, facts.fps, facts.num_frames)


def check_cut(path, first: int, last: int, hint: StreamHint | None = None) -> int | None:
    """Cut ``first .. last``; the cut's frames from its first frame are the file's; return where it starts."""
    hint = hint or hint_of(path)
    full = codes_of(path)
    cut = cut_window(path, first, last, hint)
    if cut is None:
        return None
    assert 0 < cut.first_frame <= first and cut.frames == last - cut.first_frame + 1
    got = codes_of(cut.data)
    assert got[:cut.frames] == full[cut.first_frame:last + 1], (path, first, last, cut.first_frame)
    return cut.first_frame


@pytest.fixture(scope="module")
def streams(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cut")
    made = {}

    def synth(name: str, codec: str, frames: int = 120, **spec_kw) -> None:
        spec = default_spec(codec, fps=Fraction(30), **spec_kw)
        made[name] = root / f"{name}.{spec.extension}"
        write_video(made[name], render_clip(1, frames, width=128, height=96, fps=30.0, seed=2), spec)

    synth("h264_bframes_gop16", "h264", gop=16, bframes=3)
    synth("vp9_gop16", "vp9", gop=16)
    synth("vp9_gop1", "vp9", gop=1, frames=40)
    made["h264_open_gop"] = encode(root / "open_gop.mp4", 120, "libx264", size=(128, 96), options={
        "x264-params": "keyint=20:min-keyint=20:scenecut=0:open-gop=1:b-pyramid=normal", "bf": "3"})
    made["hevc_open_gop"] = encode(root / "hevc.mp4", 96, "libx265", size=(160, 128), options={
        "x265-params": "keyint=16:min-keyint=16:scenecut=0:open-gop=1:bframes=3:log-level=0", "preset": "ultrafast"})
    made["h264_late_start"] = encode(root / "late.mp4", 100, "libx264", size=(128, 96), start_s=3600.0,
                                     options={"x264-params": "keyint=16:min-keyint=16:scenecut=0", "bf": "2"})
    return made


@pytest.mark.parametrize("name", ["h264_bframes_gop16", "vp9_gop16", "h264_open_gop", "hevc_open_gop",
                                  "h264_late_start"])
def test_a_cut_holds_the_windows_frames_from_the_keyframe_before_it(streams, name):
    path = streams[name]
    hint = hint_of(path)
    n = hint.num_frames
    later = [k for k in hint.keyframe_indices if k > 0]
    assert later, hint  # there is something to cut at
    starts = []
    for first, last in [(later[0], later[0] + 20), (later[0] + 3, n // 2), (n // 2, n // 2 + 13),
                        (later[-1] - 1, n - 1), (later[-1], n - 1), (n - 2, n - 1)]:
        start = check_cut(path, first, min(last, n - 1), hint)
        assert start is not None, (name, first, last)
        assert start == max(k for k in hint.keyframe_indices if k <= first)  # the latest entry at or before
        starts.append(start)
    assert check_cut(path, 0, 10, hint) is None and check_cut(path, later[0] - 1, later[0] + 5, hint) is None


def test_every_frame_as_its_own_keyframe_cuts_at_the_window(streams):
    hint = hint_of(streams["vp9_gop1"])
    assert hint.keyframe_indices == tuple(range(40))
    for first in (1, 17, 39):
        assert check_cut(streams["vp9_gop1"], first, 39, hint) == first


def test_a_keyframe_index_that_lies_costs_the_saving_never_a_frame(streams):
    path = streams["h264_bframes_gop16"]  # keyframes at 0, 16, 32, ...
    true = hint_of(path)
    liar = StreamHint((0, 10, 20, 40, 50, 70, 90), true.fps, true.num_frames)  # 10, 20, 50, 70, 90: no keyframes
    for first in (12, 21, 45, 75, 95):
        start = check_cut(path, first, min(first + 12, true.num_frames - 1), liar)
        assert start is None or start in true.keyframe_indices  # a real entry, or the whole file
    # A frame rate that is wrong numbers packets wrongly: the cut's check refuses it.
    wrong_fps = StreamHint(true.keyframe_indices, 25.0, true.num_frames)
    assert cut_window(path, 40, 60, wrong_fps) is None


def test_no_hint_an_unsafe_file_or_a_bad_file_is_the_whole_file(streams, tmp_path):
    path = streams["vp9_gop16"]
    hint = hint_of(path)
    assert cut_window(path, 40, 50, None) is None
    unsafe = StreamHint(hint.keyframe_indices, hint.fps, hint.num_frames, unsafe_seek=True)
    assert cut_window(path, 40, 50, unsafe) is None
    garbage = tmp_path / "garbage.webm"
    garbage.write_bytes(b"not a video" * 1000)
    assert cut_task((str(garbage), [40, 50], hint)) is None  # the task never raises: DALI gets the file
    assert cut_task((str(tmp_path / "missing.webm"), [40, 50], hint)) is None


# -- through the loader, on DALI's CPU decoder ---------------------------------------------------------------


def make_root(root: Path, gop: int, *, frames: int = 90, short: int = 20) -> Path:
    """VP9 (DALI's route) and H.264 (the fallback's) clips, one of each shorter than a clip's span."""
    for i in range(8):
        codec = "vp9" if i % 2 == 0 else "h264"
        spec = default_spec(codec, fps=Fraction(30), gop=gop)
        folder = root / "train" / f"class{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        count = short if i < 2 else frames
        write_video(folder / f"v{i}.{spec.extension}", render_clip(i % 2, count, width=128, height=96, fps=30.0,
                                                                   seed=i), spec)
    (root / "val").symlink_to(root / "train", target_is_directory=True)
    return root


def check_loader(loader: KineticsDALILoader, epochs=(0,)) -> list[int]:
    """Every row of every batch is its planned frames (frame codes); returns the planned start frames."""
    frames = {v.path: v.num_frames for v in loader.videos}
    starts = []
    for epoch in epochs:
        loader.set_epoch(epoch)
        for (videos, _), batch in zip(loader, loader.plan()):
            views = videos.flatten(0, 1) if videos.ndim == 6 else videos
            for k, sample in enumerate(batch):
                codes = [read_code(views[k][:, t], layout="CHW").index for t in range(views.shape[2])]
                assert codes == sample.frame_indices(frames[sample.path]), (sample.path, sample.start_frame)
                starts.append(sample.start_frame)
    return starts


@pytest.mark.parametrize("gop", [1, 16, 250])
def test_every_window_is_its_planned_frames_through_the_loader(tmp_path, gop):
    root = make_root(tmp_path / "data", gop)
    kw = dict(clip_len=6, frame_stride=4, augment=AugmentSpec(crop_size=(96, 128), crop_mode="center"),
              output=RAW, device="cpu", decode=DecodeSpec(fallback_workers=1))
    # Evaluation views: windows at the first frame, the middle and ending at the last (past it for the short).
    views = KineticsDALILoader(root, "val", batch_size=2, views=(3, 1), **kw)
    train = KineticsDALILoader(root, "train", batch_size=4, **kw)
    try:
        check_loader(views)
        check_loader(train, epochs=(0, 1, 2))
        for loader in (views, train):
            stats = loader.stats()
            assert stats.failures == () and stats.clips_dali > 0 and stats.clips_fallback > 0
            assert (stats.clips_dali_cut > 0) == (gop < 250), stats  # GOP 250: every window starts at frame 0
        assert views.stats().clips_past_end > 0  # the short files
    finally:
        views.close()
        train.close()


def test_dali_decodes_from_the_keyframe_before_each_window(tmp_path):
    """Same plan, DALI fed windows against whole files: the same clips, far fewer frames decoded."""
    root = make_root(tmp_path / "data", 16, frames=150)
    kw = dict(clip_len=6, frame_stride=4, augment=AugmentSpec(crop_size=(96, 128), crop_mode="center"),
              output=RAW, device="cpu")
    by_feed = {}
    for feed in ("file", "window"):
        loader = KineticsDALILoader(root, "train", batch_size=4, decode=DecodeSpec(dali_feed=feed), **kw)
        try:
            batches = [(v.clone(), lab.clone()) for v, lab in loader]
            by_feed[feed] = (batches, loader.stats())
        finally:
            loader.close()
    (whole, whole_stats), (cut, cut_stats) = by_feed["file"], by_feed["window"]
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(whole, cut))
    assert whole_stats.clips_dali == cut_stats.clips_dali > 0 and whole_stats.clips_dali_cut == 0
    assert cut_stats.clips_dali_cut > 0
    assert cut_stats.frames_decoded_dali < whole_stats.frames_decoded_dali
    with pytest.raises(ValueError, match=r"dali_feed must be 'window' or 'file', got 'cut'"):
        DecodeSpec(dali_feed="cut")


def test_files_larger_than_dali_max_pixels_go_to_the_fallback(small_kinetics):
    kw = dict(batch_size=4, clip_len=4, frame_stride=2, augment=AugmentSpec(crop_size=(48, 64), crop_mode="center"),
              output=RAW, device="cpu")
    small = KineticsDALILoader(small_kinetics, "train", decode=DecodeSpec(dali_max_pixels=128 * 96), **kw)
    large = KineticsDALILoader(small_kinetics, "train", decode=DecodeSpec(dali_max_pixels=128 * 96 - 1), **kw)
    try:
        assert check_loader(small) and check_loader(large)
        assert small.stats().clips_dali > 0  # 128x96 VP9: within the limit
        assert large.stats().clips_dali == 0 and large.stats().clips_fallback == small.stats().clips_dali + \
            small.stats().clips_fallback
    finally:
        small.close()
        large.close()
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match=r"dali_max_pixels must be an integer >= 1 \(width x height\) or None"):
            DecodeSpec(dali_max_pixels=bad)
