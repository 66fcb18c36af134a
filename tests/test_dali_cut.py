"""DALI decodes only what a window needs: the cut (``daliload.stream.cut``) and the loader feeding it to DALI.

The cut is checked on H.264 (B-frames, closed and open GOPs), HEVC (open GOP,
B-frames), VP9 and with timestamps that do not start at 0, by decoding the
cut bytes with PyAV (the stand-in for NVDEC here) against a full decode,
frame code by frame code, twice: as a file, and as NVDEC's parser sees it
(:func:`nvdec_codes`: the packets through FFmpeg's Annex B filter, as DALI
sends them, to a decoder given no extradata). Through ``KineticsDALILoader`` on DALI's CPU
decoder (VP9, GOP 1, 16 and 250): every frame of every window at the start,
the middle, the end and past the end is the planned one, on both routes, and
DALI decodes from the keyframe before the window.
"""

from __future__ import annotations

import io
from fractions import Fraction
from pathlib import Path

import av
import av.error
import pytest
from helpers.frames import check_passes
from av.bitstream import BitStreamFilterContext
import torch

from daliload import AugmentSpec, DecodeSpec, KineticsDALILoader, OutputSpec
from daliload.framecode import read_code
from daliload.prescreen.probe import probe_file
from daliload.synth.content import render_clip
from daliload.synth.encode import default_spec, write_video
from daliload.stream.cut import cut_task, cut_window
from daliload.stream.numbering import StreamHint, nal_length_size, with_parameter_sets
from test_frame_exactness import encode

RAW = OutputSpec(mean=(0, 0, 0), std=(1, 1, 1))


def codes_of(source) -> list[int]:
    """Frame codes of a full PyAV decode of ``source`` (a path, or bytes of a file)."""
    handle = io.BytesIO(source) if isinstance(source, bytes) else str(source)
    with av.open(handle) as container:
        return [read_code(f.to_ndarray(format="rgb24"), layout="HWC").index for f in container.decode(video=0)]


#: What DALI's demuxer runs on each codec's packets before NVDEC's parser sees them (``demuxer.cc``).
ANNEX_B = {"h264": "h264_mp4toannexb", "hevc": "hevc_mp4toannexb"}


def nvdec_frames(data: bytes) -> list[av.VideoFrame]:
    """The frames of the file ``data`` decoded as NVDEC's parser sees it in DALI: packets only.

    DALI passes H.264/HEVC packets through FFmpeg's Annex B filter and hands
    the parser nothing of the container (no avcC/hvcC extradata): here a
    decoder is made with no extradata and fed the filter's output. Frames that
    fail to decode are skipped, as NVDEC gives nothing for them.
    """
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        codec = stream.codec_context.codec.canonical_name
        bsf = BitStreamFilterContext(ANNEX_B.get(codec, "null"), stream)
        decoder = av.CodecContext.create(codec, "r")  # no extradata
        frames = []
        for packet in container.demux(stream):
            for filtered in bsf.filter(packet if packet.size else None):  # size 0: the end, flush
                try:
                    frames += decoder.decode(filtered)
                except av.error.InvalidDataError:
                    pass
        return frames + list(decoder.decode(None))


def nvdec_codes(data: bytes) -> list[int]:
    """Frame codes of :func:`nvdec_frames`."""
    return [read_code(f.to_ndarray(format="rgb24"), layout="HWC").index for f in nvdec_frames(data)]


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
    want = full[cut.first_frame:last + 1]
    assert codes_of(cut.data)[:cut.frames] == want, (path, first, last, cut.first_frame)
    assert nvdec_codes(cut.data)[:cut.frames] == want, ("as NVDEC sees it", path, first, last, cut.first_frame)
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
    made["h264_bframes_heavy"] = encode(root / "heavy.mp4", 120, "libx264", size=(128, 96), options={
        "x264-params": "keyint=24:min-keyint=24:scenecut=0:b-pyramid=normal:b-adapt=0", "bf": "8"})
    made["h264_late_start"] = encode(root / "late.mp4", 100, "libx264", size=(128, 96), start_s=3600.0,
                                     options={"x264-params": "keyint=16:min-keyint=16:scenecut=0", "bf": "2"})
    return made


@pytest.mark.parametrize("name", ["h264_bframes_gop16", "vp9_gop16", "h264_open_gop", "hevc_open_gop",
                                  "h264_bframes_heavy", "h264_late_start"])
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


def test_an_open_gop_cut_without_its_parameter_sets_decodes_nothing_as_nvdec_sees_it(streams, monkeypatch):
    """Why the cut puts SPS/PPS in band: without them an entry at a recovery point gives NVDEC nothing."""
    path = streams["h264_open_gop"]
    hint = hint_of(path)
    first = hint.keyframe_indices[2]
    cut = cut_window(path, first, first + 10, hint)
    assert nvdec_codes(cut.data)[:cut.frames] == codes_of(path)[first:first + 11]
    monkeypatch.setattr("daliload.stream.cut.with_parameter_sets", lambda codec, data, extradata, size: data)
    bare = cut_window(path, first, first + 10, hint)
    assert codes_of(bare.data)[:bare.frames] == codes_of(path)[first:first + 11]  # fine with the extradata
    assert nvdec_codes(bare.data) == []  # and nothing without it


def test_parameter_sets_go_in_band_once_and_only_where_they_can_be_found(streams):
    with av.open(str(streams["h264_open_gop"])) as container:
        stream = container.streams.video[0]
        extradata = stream.codec_context.extradata
        packets = [bytes(p) for p in container.demux(stream) if p.size]
    size = nal_length_size("h264", extradata)
    idr, later = packets[0], packets[40]  # x264 writes SPS/PPS in the avcC, not in band
    whole = with_parameter_sets("h264", later, extradata, size)
    assert whole.endswith(later) and len(whole) > len(later)
    assert with_parameter_sets("h264", whole, extradata, size) is whole  # already in band: unchanged
    assert with_parameter_sets("h264", idr, b"", size) is None  # none to be had: no cut starts there
    assert with_parameter_sets("h264", idr, extradata[:12], size) is None  # a record cut short
    assert with_parameter_sets("vp9", b"\x82\x49", None, None) == b"\x82\x49"  # needs none
    annex_b = b"\x00\x00\x00\x01\x67\x64\x00\x1f\x00\x00\x00\x01\x68\xeb"
    assert with_parameter_sets("h264", b"\x00\x00\x01\x01\x9a", annex_b, None).endswith(b"\x00\x00\x01\x01\x9a")


@pytest.mark.parametrize("name", ["video_reader_benchmark/R6llTwEh07w.mp4", "video_reader_benchmark/SOX5yA1l24A.mp4",
                                  "mmaction2/test.mp4", "decord/flipping_a_pancake.mkv",
                                  "PySceneDetect/issue-134-rotate.mp4"])
def test_cuts_of_real_h264_downloads_decode_from_their_packets_alone(realclips, name):
    """Real Kinetics-style H.264 (no frame codes): each cut's frames, as NVDEC sees them, are the full decode's."""
    path = realclips / name
    hint = hint_of(path)
    with av.open(str(path)) as container:
        full = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    for key in hint.keyframe_indices[1:]:
        last = min(key + 12, hint.num_frames - 1)
        cut = cut_window(path, key + 1, last, hint)
        assert cut is not None and cut.first_frame == key, (name, key)
        got = nvdec_frames(cut.data)
        assert len(got) >= cut.frames, (name, key, len(got))
        for offset, frame in enumerate(got[:cut.frames]):
            assert (frame.to_ndarray(format="rgb24") == full[key + offset]).all(), (name, key, offset)


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


@pytest.mark.parametrize("gop", [1, 16, 250])
def test_every_window_is_its_planned_frames_through_the_loader(tmp_path, gop):
    root = make_root(tmp_path / "data", gop)
    kw = dict(clip_len=6, frame_stride=4, augment=AugmentSpec(crop_size=(96, 128), crop_mode="center"),
              output=RAW, device="cpu", decode=DecodeSpec(fallback_workers=1, routing="static"))
    # Evaluation views: windows at the first frame, the middle and ending at the last (past it for the short).
    views = KineticsDALILoader(root, "val", batch_size=2, views=(3, 1), **kw)
    train = KineticsDALILoader(root, "train", batch_size=4, **kw)
    try:
        check_passes(views)
        check_passes(train, epochs=(0, 1, 2))
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
        loader = KineticsDALILoader(root, "train", batch_size=4, decode=DecodeSpec(dali_feed=feed, routing="static"),
                                    **kw)
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


@pytest.mark.cuda
def test_nvdec_decodes_every_cut_to_its_planned_frames(tmp_path):
    """On NVDEC (``device="gpu"``), through the loader with the cutter on: open-GOP H.264 (entries at
    recovery points), H.264 with 8 B-frames, HEVC with CRA entries; every row's frame codes are the plan's,
    every clip is DALI's, some from a cut. HEVC is 192x160: NVDEC's HEVC minimum is 144x144."""
    kinds = {
        "h264_open_gop": ("libx264", (128, 96), {"x264-params": "keyint=20:min-keyint=20:scenecut=0:open-gop=1:"
                                                                "b-pyramid=normal", "bf": "3"}),
        "h264_bframes_heavy": ("libx264", (128, 96), {"x264-params": "keyint=24:min-keyint=24:scenecut=0:"
                                                                     "b-pyramid=normal:b-adapt=0", "bf": "8"}),
        "hevc_cra": ("libx265", (192, 160), {"x265-params": "keyint=16:min-keyint=16:scenecut=0:open-gop=1:"
                                                            "bframes=3:log-level=0", "preset": "ultrafast"}),
    }
    root = tmp_path / "data"
    for label, (name, (codec, size, options)) in enumerate(kinds.items()):
        (root / "train" / name).mkdir(parents=True)
        for i in range(3):
            encode(root / "train" / name / f"v{i}.mp4", 120, codec, size=size, options=options, seed=label * 3 + i)
    loader = KineticsDALILoader(root, "train", batch_size=3, clip_len=6, frame_stride=3, output=RAW,
                                augment=AugmentSpec(crop_size=(96, 128), crop_mode="center"), device="gpu",
                                decode=DecodeSpec(routing="static"))
    try:
        check_passes(loader, epochs=(0, 1, 2))
        stats = loader.stats()
        assert stats.failures == () and stats.clips_fallback == 0 and stats.clips_dali == 9, stats  # the last epoch's
        assert stats.clips_dali_cut > 0, stats
    finally:
        loader.close()


def test_files_larger_than_dali_max_pixels_go_to_the_fallback(small_kinetics):
    kw = dict(batch_size=4, clip_len=4, frame_stride=2, augment=AugmentSpec(crop_size=(48, 64), crop_mode="center"),
              output=RAW, device="cpu")
    static = dict(routing="static")  # each file on its route: the counts below are the routes'
    small = KineticsDALILoader(small_kinetics, "train", decode=DecodeSpec(dali_max_pixels=128 * 96, **static), **kw)
    large = KineticsDALILoader(small_kinetics, "train", decode=DecodeSpec(dali_max_pixels=128 * 96 - 1, **static),
                               **kw)
    try:
        assert check_passes(small, epochs=(0,)) and check_passes(large, epochs=(0,))
        assert small.stats().clips_dali > 0  # 128x96 VP9: within the limit
        assert large.stats().clips_dali == 0 and large.stats().clips_fallback == small.stats().clips_dali + \
            small.stats().clips_fallback
    finally:
        small.close()
        large.close()
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match=r"dali_max_pixels must be an integer >= 1 \(width x height\) or None"):
            DecodeSpec(dali_max_pixels=bad)
