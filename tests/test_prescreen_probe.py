"""The probe, the capability rules and the deep check, on generated and real files."""

from __future__ import annotations

import csv
import re
from dataclasses import replace
from fractions import Fraction

import av
import pytest

from daliload.framecode import read_code
from daliload.prescreen import deep as deep_module
from daliload.prescreen.deep import DALI_MISSING, deep_check, windows
from daliload.prescreen.probe import (
    ProbeResult,
    _decode_first,
    pixel_layout,
    probe_file,
)
from daliload.prescreen.rules import DALI_CAPABILITIES, check_device, route_for
from daliload.synth.broken import ClipContent, write_broken
from fallback.decode import DecodeError, decode_window
from daliload.stream.numbering import shows_frame

NVDEC_CODECS = {"h264", "hevc", "vp8", "vp9", "av1", "mpeg4"}
DALI_CPU_CODECS = {"vp8", "vp9", "mjpeg"}


def full_decode(path) -> list:
    """Every frame PyAV outputs for the first video stream, in order."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        return list(container.decode(stream))


# -- generated clips ------------------------------------------------------------------------


@pytest.mark.parametrize("codec", ["h264", "hevc", "vp9", "vp8", "mpeg4", "mjpeg", "av1"])
def test_probe_matches_a_full_decode(make_clip, codec):
    extra = {"bframes": 2} if codec in ("h264", "hevc") else {}
    path = make_clip(codec, num_frames=45, gop=15, fps=Fraction(30000, 1001), **extra)
    facts = probe_file(path)
    frames = full_decode(path)

    assert facts.ok, facts.reason
    assert facts.codec == codec
    assert facts.num_frames == len(frames) == 45
    # Frame i of the probe's numbering is the frame that carries code i.
    assert [read_code(f.to_ndarray(format="rgb24")).index for f in frames] == list(range(45))
    assert facts.keyframes == tuple(i for i, f in enumerate(frames) if f.key_frame)
    assert facts.keyframes[0] == 0 and len(facts.keyframes) >= 2
    assert (facts.width, facts.height) == (128, 96)
    assert facts.fps == pytest.approx(30000 / 1001, rel=1e-3)
    assert facts.bit_depth == 8 and facts.chroma == "420"
    assert facts.duration_s == pytest.approx(45 * 1001 / 30000, abs=0.01)
    assert not facts.vfr and not facts.interlaced and facts.rotation == 0


def test_yuv444_and_10_bit_go_to_the_fallback_on_both_devices(make_clip):
    for pix_fmt, chroma, depth in (("yuv444p", "444", 8), ("yuv420p10le", "420", 10)):
        facts = probe_file(make_clip("h264", num_frames=30, pix_fmt=pix_fmt))
        assert (facts.pix_fmt, facts.chroma, facts.bit_depth) == (pix_fmt, chroma, depth)
        assert route_for(facts, "gpu") == (
            "fallback",
            f"DALI on {GPU} decodes h264 only as 8-bit 420 (got {pix_fmt})",
        )
        assert route_for(facts, "cpu") == ("fallback", "DALI on cpu has no h264 decoder")


def _broken(tmp_path, kind):
    path = tmp_path / f"{kind}.mp4"
    write_broken(
        path,
        kind,
        ClipContent(content_class=2, num_frames=40, width=128, height=96, fps=Fraction(30), seed=1),
    )
    return probe_file(path)


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        (
            "zero_bytes",
            r"^cannot open: InvalidDataError: Invalid data found when processing input$",
        ),
        ("garbage", r"^cannot open: InvalidDataError: Invalid data found when processing input$"),
        ("header_only", r"^zero frames$"),
        ("no_video", r"^no video stream$"),
        ("truncated", r"^corrupt packet \(truncated file\?\): packet \d+ of \d+$"),
    ],
)
def test_unusable_files_are_bad_with_a_reason(tmp_path, kind, reason):
    facts = _broken(tmp_path, kind)
    assert not facts.ok
    for device in ("gpu", "cpu"):
        route, why = route_for(facts, device)
        assert route == "bad"
        assert why == facts.reason
    assert re.match(reason, facts.reason)


def test_vfr_file_gets_the_hint_and_keeps_its_route(tmp_path):
    facts = _broken(tmp_path, "vfr")
    assert facts.ok and facts.vfr and facts.num_frames == 40
    assert route_for(facts, "gpu") == ("dali", "")


def test_hidden_and_filler_packets_are_not_frames():
    # VP8 frame tag: bit 4 of the first byte is show_frame (RFC 6386 9.1).
    assert shows_frame("vp8", av.Packet(bytes([0x10, 0, 0, 0])))
    assert not shows_frame("vp8", av.Packet(bytes([0x00, 0, 0, 0])))
    # MPEG-4 part 2: a packet with a VOP start code is a (maybe not-coded) frame, a filler is not.
    assert shows_frame("mpeg4", av.Packet(b"\x00\x00\x01\xb6\x50\x00\x00\x01"))
    assert not shows_frame("mpeg4", av.Packet(b"\x7f"))


class _TwoPacketDecoder:
    """A decoder that shows a frame only once it has two packets since its last reset
    (like a field-coded stream), to drive the probe's replay path."""

    def __init__(self):
        self.seen, self.resets, self.log = 0, 0, []

    def decode(self, packet):
        self.log.append(None if packet is None else bytes(packet))
        if packet is not None:
            self.seen += 1
        return ["frame"] if self.seen == 2 and packet is not None else []

    def flush_buffers(self):
        self.seen, self.resets = 0, self.resets + 1


def test_first_frame_replays_when_one_packet_is_not_enough():
    ctx, fed = _TwoPacketDecoder(), []
    first, second = av.Packet(b"first"), av.Packet(b"second")
    assert _decode_first(ctx, first, fed) is None
    assert ctx.resets == 1  # drained after one packet, nothing came out: reset, first packet resent
    assert _decode_first(ctx, second, fed) == "frame"
    assert ctx.log == [b"first", None, b"first", b"second"]


@pytest.mark.parametrize(
    ("pix_fmt", "expected"),
    [
        ("yuv420p", (8, "420")),
        ("yuvj422p", (8, "422")),
        ("yuv444p", (8, "444")),
        ("yuv420p10le", (10, "420")),
        ("gray", (8, "400")),
        ("rgb24", (8, "rgb")),
        ("nv12", (8, "420")),
        (None, (None, None)),
        ("not_a_format", (None, None)),
    ],
)
def test_pixel_layout(pix_fmt, expected):
    assert pixel_layout(pix_fmt) == expected


# -- the capability table ---------------------------------------------------------------------


#: How route reasons name the default GPU target ("gpu": the Hopper class, no AV1).
GPU = "gpu (NVDEC hopper: H100, H200, GH200)"


def _facts(**changes) -> ProbeResult:
    base = ProbeResult(
        "/x.mp4",
        has_video=True,
        codec="h264",
        pix_fmt="yuv420p",
        bit_depth=8,
        chroma="420",
        width=340,
        height=256,
        num_frames=300,
        keyframes=(0,),
    )
    return replace(base, **changes)


def test_table_lists_the_issue_codecs():
    assert set(DALI_CAPABILITIES["gpu:ada"]) == NVDEC_CODECS  # AV1: only GA10x, Ada, Blackwell
    assert set(DALI_CAPABILITIES["gpu:hopper"]) == NVDEC_CODECS - {"av1"}
    assert set(DALI_CAPABILITIES["cpu"]) == DALI_CPU_CODECS


@pytest.mark.parametrize(
    ("changes", "device", "expected"),
    [
        ({}, "gpu", ("dali", "")),
        ({}, "cpu", ("fallback", "DALI on cpu has no h264 decoder")),
        ({"codec": "vp9"}, "cpu", ("dali", "")),
        ({"codec": "vp9", "chroma": "444", "pix_fmt": "yuv444p"}, "cpu", ("dali", "")),
        (
            {"codec": "mjpeg", "chroma": "422", "pix_fmt": "yuvj422p"},
            "gpu",
            ("fallback", f"DALI on {GPU} has no mjpeg decoder"),
        ),
        (
            {"interlaced": True},
            "gpu",
            ("fallback", f"DALI on {GPU} decodes h264 only progressive (got interlaced)"),
        ),
        ({"codec": "vp9", "interlaced": True}, "cpu", ("dali", "")),
        (
            {"width": 4097},
            "gpu",
            ("fallback", f"h264 frame size 4097x256 outside DALI on {GPU} limits 48x16..4096x4096"),
        ),
        ({"codec": "hevc", "width": 7680, "height": 4320}, "gpu", ("dali", "")),
        (
            {"codec": "vp9", "width": 128, "height": 96},
            "gpu",
            ("fallback", f"vp9 frame size 128x96 outside DALI on {GPU} limits 128x128..8192x8192"),
        ),
        (
            {"codec": "mpeg4", "width": 2048, "height": 1080},
            "gpu",
            ("fallback", f"mpeg4 frame size 2048x1080 outside DALI on {GPU} limits 48x16..2032x2032"),
        ),
        ({"reason": "zero frames"}, "gpu", ("bad", "zero frames")),
    ],
)
def test_route_for(changes, device, expected):
    assert route_for(_facts(**changes), device) == expected


def test_unknown_device_is_refused():
    with pytest.raises(ValueError, match=r"device must be 'cpu', 'gpu' or 'gpu:<generation>' .* got 'tpu'"):
        check_device("tpu")


# -- the real clips ------------------------------------------------------------------------------


def _realclip_rows(realclips):
    with open(realclips / "MANIFEST.tsv", newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


#: Real clips with packets that show no frame (measured: 73 packets, 72 frames; the
#: packed-B-frame fillers of MPEG-4 Part 2 in AVI).
PACKETS_WITHOUT_FRAMES = {"video_reader_benchmark/RATRACE_wave_f_nm_np1_fr_goo_37.avi"}


def _expected_route(row: dict, device: str) -> str:
    """The route MANIFEST.tsv's columns imply (independent of the rules module)."""
    if not row["container"] or int(row["frames_decoded"] or 0) == 0:
        return "bad"  # cannot be opened, or not even one frame decodes
    if row["file"] in PACKETS_WITHOUT_FRAMES:
        return "fallback"  # DALI numbers frames by packet: its frame N would not be frame N
    if int(row["rotation"] or 0) % 360:
        return "fallback"  # DALI decodes the stored picture: only the fallback turns it upright
    codec, pix_fmt = row["video_codec"], row["pix_fmt"]
    width, height = int(row["width"]), int(row["height"])
    eight_bit_420 = pix_fmt in ("yuv420p", "yuvj420p")
    if device == "gpu":
        nvdec_min = {"hevc": 144, "vp9": 128, "av1": 128}.get(codec, 16)
        ok = codec in NVDEC_CODECS and eight_bit_420 and min(width, height) >= nvdec_min
    else:
        ok = codec in DALI_CPU_CODECS and "10" not in pix_fmt
    return "dali" if ok else "fallback"


def test_every_real_clip_is_routed_as_its_properties_imply(realclips):
    rows = _realclip_rows(realclips)
    assert len(rows) == 20
    routes = {}
    for row in rows:
        facts = probe_file(realclips / row["file"])
        for device in ("gpu", "cpu"):
            route, reason = route_for(facts, device)
            assert route == _expected_route(row, device), (row["file"], device, reason)
            assert (reason == "") == (route == "dali"), (row["file"], device, reason)
            routes[row["file"], device] = route
        if facts.ok:
            assert facts.codec == row["video_codec"]
            assert facts.pix_fmt == row["pix_fmt"]
            assert (facts.width, facts.height) == (int(row["width"]), int(row["height"]))
    # The cases the issue names.
    for kinetics in (
        "video_reader_benchmark/R6llTwEh07w.mp4",
        "video_reader_benchmark/SOX5yA1l24A.mp4",
        "mmaction2/test.mp4",
    ):
        assert (routes[kinetics, "gpu"], routes[kinetics, "cpu"]) == ("dali", "fallback")
    for odd in (
        "torchcodec/h264_10bits.mp4",
        "torchcodec/var_fps_video.mp4",
        "VALI/test_hevc10.mkv",
    ):
        assert (routes[odd, "gpu"], routes[odd, "cpu"]) == ("fallback", "fallback")
    for webm in (
        "moviepy/transparent.webm",
        "moviepy/big_buck_bunny_432_433.webm",
        "mp4ff/vp9.ivf",
    ):
        assert (routes[webm, "gpu"], routes[webm, "cpu"]) == ("dali", "dali")
    for corrupt in ("mp4parse-rust/zero_empty_stsc.mp4", "mp4parse-rust/chunk_out_of_range.mp4"):
        assert routes[corrupt, "gpu"] == routes[corrupt, "cpu"] == "bad"


def test_real_clip_facts(realclips):
    assert probe_file(realclips / "PySceneDetect/issue-134-rotate.mp4").rotation == -90
    vfr = probe_file(realclips / "torchcodec/var_fps_video.mp4")
    assert vfr.vfr and vfr.base_fps == 30.0 and vfr.fps == pytest.approx(1125 / 56)
    webm = probe_file(realclips / "moviepy/transparent.webm")
    assert webm.container == "matroska,webm" and webm.num_frames == 150  # the WebM header says 0
    assert probe_file(realclips / "VALI/test_hevc10.mkv").bit_depth == 10
    zero = probe_file(realclips / "mp4parse-rust/zero_empty_stsc.mp4")
    assert (
        zero.reason
        == "first frame fails to decode: InvalidDataError: Invalid data found when processing input"
    )
    assert (
        probe_file(realclips / "mp4parse-rust/chunk_out_of_range.mp4").reason
        == "cannot open: InvalidDataError: Invalid data found when processing input"
    )


def test_real_clip_frame_counts_match_a_full_decode(realclips):
    checked = 0
    for row in _realclip_rows(realclips):
        if row["pyav_decoded_all_ok"] != "True":
            continue
        facts = probe_file(realclips / row["file"])
        assert (
            facts.num_frames
            == len(full_decode(realclips / row["file"]))
            == int(row["frames_decoded"])
        ), row["file"]
        checked += 1
    assert checked == 17  # every clip PyAV decodes to the end, including the Xvid/DivX AVIs


# -- the deep check ----------------------------------------------------------------------------


def test_windows():
    assert windows(300) == ((0, 8), (292, 8))
    assert windows(5) == ((0, 5), (0, 5))


def test_deep_check_catches_damage_after_the_first_frame(realclips):
    facts = probe_file(realclips / "decord/corrupted.mp4")
    route, reason = route_for(facts, "cpu")
    assert (route, reason) == (
        "fallback",
        "DALI on cpu has no h264 decoder",
    )  # the cheap probe passes it
    result = deep_check(facts, route, reason, "cpu")
    # Its packets promise 50 frames; the first 28 decode (MANIFEST.tsv), then the damage starts. The file is
    # kept at the length that decodes, so no window of the loader reaches the damage.
    assert (result.route, result.checked, result.num_frames) == ("fallback", True, 28)
    assert result.reason.startswith("deep: the end does not decode (decode failed: InvalidDataError")
    assert result.reason.endswith("frames 0-27 of 50 used")
    for start in range(28):
        decode_window(facts.path, range(start, min(28, start + 8)))
    with pytest.raises(DecodeError):
        decode_window(facts.path, range(28, 36))


def test_deep_check_keeps_a_file_whose_last_frame_is_cut_and_refuses_one_whose_start_fails(
    cut_stream, make_clip, tmp_path
):
    """A stream cut mid-frame (an MPEG-2 transport stream, as broadcast recordings are): the last frame is
    flagged corrupt, every other frame is fine. The file is kept without that frame; a file whose start
    does not decode is bad."""
    cut, frames = cut_stream
    facts = probe_file(cut)
    assert facts.num_frames == frames
    result = deep_check(facts, *route_for(facts, "cpu"), "cpu")
    assert (result.route, result.num_frames) == ("fallback", frames - 1), result
    assert result.reason == (f"deep: the end does not decode (frame {frames - 1} is damaged: the decoder flagged "
                             f"it corrupt); frames 0-{frames - 2} of {frames} used")
    with pytest.raises(DecodeError, match="damaged"):
        decode_window(cut, range(frames - 4, frames))
    decode_window(cut, range(frames - 5, frames - 1))

    # Damage right after the first frame: the probe passes it, the start window does not decode: bad.
    clip = make_clip("h264", num_frames=40, gop=40, bframes=0)
    broken = bytearray(clip.read_bytes())
    with av.open(str(clip)) as container:
        packets = [(p.pos, p.size) for p in container.demux(video=0) if p.size]
    for pos, size in packets[1:6]:
        broken[pos + 8:pos + size] = bytes(size - 8)
    early = tmp_path / "early.mp4"
    early.write_bytes(bytes(broken))
    facts = probe_file(early)
    assert facts.ok, facts.reason
    result = deep_check(facts, *route_for(facts, "cpu"), "cpu")
    assert (result.route, result.num_frames) == ("bad", None), result
    assert result.reason.startswith("deep: fallback failed: ")


def test_deep_check_keeps_good_fallback_files(make_clip):
    facts = probe_file(make_clip("h264", num_frames=40, gop=12))
    result = deep_check(facts, *route_for(facts, "cpu"), "cpu")
    assert (result.route, result.reason, result.checked) == (
        "fallback",
        "DALI on cpu has no h264 decoder",
        True,
    )


@pytest.mark.dali
def test_deep_check_with_dali_on_cpu(make_clip):
    pytest.importorskip("nvidia.dali")
    facts = probe_file(make_clip("vp9", num_frames=40, gop=12))
    assert deep_check(facts, "dali", "", "cpu") == deep_module.DeepResult("dali", "", True)
    # A frame count DALI does not have: the tail window fails in DALI, and in the fallback too.
    # The fallback finds the 40 frames there are: the file keeps them, on the fallback.
    wrong = replace(facts, num_frames=48)
    result = deep_check(wrong, "dali", "", "cpu")
    assert (result.route, result.num_frames) == ("fallback", 40)
    assert result.reason.startswith("deep: DALI (cpu) failed: ")
    assert result.reason.endswith("; the end does not decode (the fallback finds 40 frames); frames 0-39 of 48 used")


def test_deep_check_reroutes_dali_failures_to_the_fallback(make_clip, monkeypatch):
    facts = probe_file(make_clip("vp9", num_frames=40, gop=12))
    monkeypatch.setattr(deep_module, "dali_check", lambda *a, **k: "DALI (cpu) failed: boom")
    assert deep_check(facts, "dali", "", "cpu") == deep_module.DeepResult(
        "fallback", "deep: DALI (cpu) failed: boom", True
    )
    assert deep_check(facts, "dali", "", "cpu", allow_dali=False) == deep_module.DeepResult(
        "fallback", "deep: DALI (cpu) crashed or hung", True
    )


def test_deep_check_without_dali_keeps_the_route_unchecked(make_clip, monkeypatch):
    facts = probe_file(make_clip("vp9", num_frames=40, gop=12))

    def no_dali(*args, **kwargs):
        raise ImportError("No module named 'nvidia'")

    monkeypatch.setattr(deep_module, "dali_check", no_dali)
    assert deep_check(facts, "dali", "", "cpu") == deep_module.DeepResult(
        "dali", DALI_MISSING, False
    )
