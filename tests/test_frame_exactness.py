"""Frame N is frame N on every file, or a loud error (issue 16).

Frame ``N`` is the ``N``-th frame a full sequential PyAV decode outputs. For
generated files of every kind that once gave silently wrong frames (a stream
cut mid-GOP, a large start time, open GOPs, sync samples that cannot start a
decode, 4:4:4 H.264) and for the real files in ``../shared/realclips``:

- the probe's frame count (what the manifest stores and the plan draws from)
  is the full decode's count;
- the fallback's windows at the start, the middle, after the last keyframe and
  at the end are the full decode's frames at those indices, bit-exact
  (:data:`TOLERANCE` lists the codecs allowed to drift after a seek: none so far);
- a seek that gives wrong frames is caught: the fallback backs off to an earlier
  entry, the deep check marks the file ``unsafe_seek``.
"""

from __future__ import annotations

import csv
import re
from fractions import Fraction

import av
from av.video.reformatter import Colorspace
import numpy as np
import pytest

from daliload.prescreen.deep import seek_check, with_seek_check
from daliload.prescreen.probe import probe_file
from daliload.synth import render_clip
from fallback import DecodeError, StreamHint, decode_window
from daliload.stream.numbering import FrameTable

#: Mean absolute RGB difference allowed per codec after a seek (0: bit-exact). Every
#: file here is bit-exact, WMV2 included; a real WMV2 file (not in realclips) showed
#: the right pictures slightly off after a seek, which the deep check tolerates up to
#: ``daliload.prescreen.deep.SEEK_TOLERANCE``.
TOLERANCE: dict[str, float] = {}


# -- helpers -----------------------------------------------------------------------------------


def full_decode(path, keep=None) -> tuple[dict[int, np.ndarray], int]:
    """The reference: a plain sequential decode, counting frames as they come out.

    Like the ``ffmpeg`` command line, it goes on past decoder errors on the
    pictures before the first frame (a VP9 stream cut mid-GOP raises on them);
    an error after the first frame is damage and raises.
    """
    kept, count = {}, 0
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        stream.codec_context.thread_count = 1
        for packet in container.demux(stream):
            try:
                frames = stream.codec_context.decode(packet if packet.size else None)
            except av.error.InvalidDataError:
                if count:
                    raise
                frames = []
            for frame in frames:
                if keep is None or count in keep:  # the fallback's colour rule: BT.601 whatever the tag
                    rgb = frame.reformat(format="rgb24", src_colorspace=Colorspace.ITU601).to_ndarray()
                    # upright, as the fallback shows a rotated file (tests/test_rotation.py holds it to FFmpeg's)
                    kept[count] = np.rot90(rgb, round((frame.rotation or 0) / 90) % 4)
                count += 1
    return kept, count


def windows(num_frames: int, keyframes=()) -> list[list[int]]:
    """Start, middle, after the last keyframe, end (and past it)."""
    mid = num_frames // 2
    found = [[0, 1, 2, 3], [mid - 2, mid, mid + 2], [num_frames - 3, num_frames - 1, num_frames + 4]]
    later = [k for k in keyframes if k > 0]
    if later:
        found.append([later[-1], later[-1] + 1, min(later[-1] + 5, num_frames - 1)])
    return [[max(0, i) for i in w] for w in found]


def check_file(path, *, codec: str = "", skip_nonref: bool = True) -> dict:
    """Compare probe count and fallback windows with a full decode; return what was seen."""
    facts = probe_file(path)
    assert facts.ok, (path, facts.reason)
    wins = windows(facts.num_frames, facts.keyframes)
    reference, count = full_decode(path, {min(i, facts.num_frames - 1) for w in wins for i in w})
    assert facts.num_frames == count, f"{path}: probe counts {facts.num_frames}, a full decode outputs {count}"
    seen = {"exact": 0, "within tolerance": 0, "backed off": 0}
    # The loader's seek hint, as it builds one from the manifest (constant frame rate only).
    hint = None if facts.vfr or not facts.fps else StreamHint(facts.keyframes, facts.fps, facts.num_frames)
    for window, use_hint in [(w, False) for w in wins] + [(w, True) for w in wins if hint is not None]:
        clip = decode_window(path, window, skip_nonref=skip_nonref, hint=hint if use_hint else None)
        assert clip.video_num_frames in (None, count), (path, window)
        seen["backed off"] += clip.seek_unsafe
        for got, index in zip(clip.frames, window):
            want = reference[min(index, count - 1)]
            diff = float(np.abs(got.astype(np.int16) - want).mean())
            assert diff <= TOLERANCE.get(codec, 0.0), f"{path}: frame {index} of {window} differs by {diff:.2f}"
            seen["exact" if diff == 0 else "within tolerance"] += 1
    return seen


def encode(path, num_frames, codec, *, fmt=None, options=None, pix_fmt="yuv420p", size=(96, 64),
           start_s=0.0, rate=25, force_i=(), seed=0):  # fmt: skip
    """Encode a generated clip (frame code in every frame) with PyAV; return ``path``."""
    width, height = size
    with av.open(str(path), "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=rate, options=options or {})
        stream.width, stream.height, stream.pix_fmt = width, height, pix_fmt
        stream.thread_type = "FRAME"  # slice threading would write several slices per frame
        stream.time_base = Fraction(1, 90000)
        offset = round(start_s * 90000)
        for i, rgb in enumerate(render_clip(2, num_frames, width=width, height=height, seed=seed)):
            frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
            frame.pts, frame.time_base = offset + i * 90000 // rate, stream.time_base
            if i in force_i:
                frame.pict_type = av.video.frame.PictureType.I
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return path


def remux(source, path, *, fmt=None, drop_first=0, mark_key=()):
    """Copy the video packets of ``source`` into ``path``: drop the first ``drop_first``
    (decode order), flag the packets at positions ``mark_key`` (after dropping) as keyframes."""
    with av.open(str(source)) as src, av.open(str(path), "w", format=fmt) as dst:
        out = dst.add_stream_from_template(src.streams.video[0])
        position = 0
        for packet in src.demux(src.streams.video[0]):
            if packet.dts is None:
                continue
            position += 1
            if position <= drop_first:
                continue
            if position - drop_first - 1 in mark_key:
                packet.is_keyframe = True
            packet.stream = out
            dst.mux(packet)
    return path


def decode_order_keys(path) -> list[int]:
    with av.open(str(path)) as container:
        packets = [p for p in container.demux(container.streams.video[0]) if p.size]
    return [i for i, p in enumerate(packets) if p.is_keyframe]


# -- generated files of each kind ----------------------------------------------------------------


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """Every kind of file that once gave wrong frames, generated once for this module."""
    return make_clips(tmp_path_factory.mktemp("exactness"))


def make_clips(root) -> dict:
    made = {}
    mpeg2 = {"g": "12", "bf": "2", "qscale": "4"}  # open GOPs: the B-frames after an I lean on the GOP before
    made["mpeg2_ts_open_gop"] = encode(root / "open_gop.ts", 60, "mpeg2video", options=mpeg2, start_s=10.0)
    # Cut mid-GOP, as a broadcast recording: 5 packets before the second keyframe come first.
    second_key = decode_order_keys(made["mpeg2_ts_open_gop"])[1]
    made["mpeg2_ts_cut_mid_gop"] = remux(made["mpeg2_ts_open_gop"], root / "cut.ts", fmt="mpegts",
                                         drop_first=second_key - 5)
    made["h264_ts_cut_mid_gop"] = remux(
        encode(root / "h264.ts", 60, "libx264", options={"x264-params": "keyint=20:min-keyint=20:scenecut=0",
                                                         "bf": "2"}, start_s=3600.0),
        root / "h264_cut.ts", fmt="mpegts", drop_first=27)
    # HEVC in TS, 26 hours in, cut at an open-GOP CRA: its RASL pictures lean on the cut-off GOP.
    x265 = "keyint=16:min-keyint=16:scenecut=0:open-gop=1:bframes=3:log-level=0"
    made["hevc_ts_late_start"] = encode(root / "hevc.ts", 64, "libx265", size=(160, 120), start_s=95000.0,
                                        options={"x265-params": x265, "preset": "ultrafast"})
    made["hevc_ts_cut_at_cra"] = remux(made["hevc_ts_late_start"], root / "hevc_cut.ts", fmt="mpegts",
                                       drop_first=decode_order_keys(made["hevc_ts_late_start"])[1])
    vp9 = {"g": "20", "crf": "40", "b:v": "0", "deadline": "realtime", "cpu-used": "8"}
    made["vp9_webm_cut_mid_gop"] = remux(encode(root / "vp9.webm", 60, "libvpx-vp9", options=vp9),
                                         root / "vp9_cut.webm", drop_first=15)
    made["wmv2_asf"] = encode(root / "wmv2.asf", 60, "wmv2", options={"g": "12", "qscale": "4"})
    made["h264_open_gop"] = encode(root / "open_gop.mp4", 60, "libx264", options={
        "x264-params": "keyint=20:min-keyint=20:scenecut=0:open-gop=1", "bf": "3"})
    made["h264_intra_refresh"] = encode(root / "intra_refresh.mp4", 60, "libx264", options={
        "x264-params": "keyint=20:intra-refresh=1:scenecut=0", "bf": "0"})
    # 4:4:4 with sync samples that cannot start a decode (the recovery point is 20 frames on).
    made["h264_444_intra_refresh"] = encode(root / "yuv444_ir.mp4", 60, "libx264", pix_fmt="yuv444p", options={
        "x264-params": "keyint=20:intra-refresh=1:scenecut=0:ref=3", "bf": "2"})
    made["h264_444_mid_i"] = encode(root / "yuv444.mp4", 80, "libx264", pix_fmt="yuv444p", force_i=(30, 55),
                                    options={"x264-params": "keyint=200:scenecut=0:open-gop=1:ref=4", "bf": "2"})
    return made


@pytest.mark.parametrize("kind", ["mpeg2_ts_open_gop", "mpeg2_ts_cut_mid_gop", "h264_ts_cut_mid_gop",
                                  "hevc_ts_late_start", "hevc_ts_cut_at_cra", "h264_open_gop", "h264_intra_refresh",
                                  "h264_444_intra_refresh", "h264_444_mid_i", "wmv2_asf",
                                  "vp9_webm_cut_mid_gop"])
def test_generated_kind_matches_full_decode(clips, kind):
    seen = check_file(clips[kind])
    assert seen["exact"] > 0 and seen["within tolerance"] == 0


def test_cut_stream_gives_no_index_to_pictures_before_its_first_keyframe(clips):
    path = clips["mpeg2_ts_cut_mid_gop"]
    with av.open(str(path)) as container:
        packets = sum(1 for p in container.demux(container.streams.video[0]) if p.size)
    facts = probe_file(path)
    _, decoded = full_decode(path, keep=set())
    assert facts.num_packets == packets > decoded == facts.num_frames  # the leading pictures show nothing
    assert facts.keyframes[0] == 0


def test_recovery_points_that_recover_later_are_not_entries(clips):
    # x264's periodic intra refresh: sync samples every 20 frames whose recovery-point
    # SEI says the picture is right only some frames later.
    path = clips["h264_intra_refresh"]
    with av.open(str(path)) as container:
        table = FrameTable.demux(container, container.streams.video[0])
    flagged = [i for i, p in enumerate(table.packets) if p.is_keyframe]
    assert len(flagged) >= 3 and table.entries == [0]
    assert probe_file(path).keyframes == (0,)
    check_file(path)


@pytest.mark.parametrize("codec, options", [
    ("libvpx-vp9", {"g": "50", "crf": "40", "b:v": "0", "deadline": "realtime", "cpu-used": "8"}),
    ("libx264", {"x264-params": "keyint=50:scenecut=0", "bf": "2"}),
])
def test_an_entry_that_cannot_start_a_decode_backs_off_to_the_start(tmp_path, monkeypatch, codec, options):
    # An index that lies: inter frame 12 passes for a random-access point. Decoding from it
    # fails (VP9) or outputs nothing (H.264): the fallback must notice and start earlier.
    import daliload.stream.numbering as numbering

    path = encode(tmp_path / f"src.{'webm' if 'vp9' in codec else 'mp4'}", 40, codec, options=options)
    with av.open(str(path)) as container:
        liar = [p.pts for p in container.demux(container.streams.video[0]) if p.size][12]
    honest = numbering.is_random_access
    monkeypatch.setattr(numbering, "is_random_access",
                        lambda c, packet, n: packet.pts == liar or honest(c, packet, n))
    reference, count = full_decode(path)
    window = [14, 16, 18]
    clip = decode_window(path, window, skip_nonref=False)
    assert clip.seek_unsafe, codec
    assert all(np.array_equal(got, reference[i]) for got, i in zip(clip.frames, window))


def test_silently_wrong_seek_is_found_by_the_deep_check_and_the_hint_avoids_it(tmp_path):
    # MPEG-4 Part 2 in MP4 with a P-VOP flagged as a sync sample: decoding from it
    # invents a grey reference and raises nothing.
    source = encode(tmp_path / "src.mp4", 40, "mpeg4", options={"g": "40", "qscale": "3"})
    path = remux(source, tmp_path / "fake_key.mp4", mark_key=(20,))
    facts = probe_file(path)
    assert 20 in facts.keyframes
    assert re.match(r"seeking to keyframe 20 gives other frames", seek_check(facts))
    checked = with_seek_check(facts)
    assert checked.unsafe_seek
    reference, count = full_decode(path)
    hint = StreamHint(keyframe_indices=facts.keyframes, fps=facts.fps, num_frames=count, unsafe_seek=True)
    clip = decode_window(path, [22, 24], hint=hint)
    assert all(np.array_equal(got, reference[i]) for got, i in zip(clip.frames, [22, 24]))


def test_deep_check_finds_safe_seeking_safe(clips):
    for kind in ("h264_open_gop", "mpeg2_ts_open_gop", "hevc_ts_late_start"):
        facts = probe_file(clips[kind])
        assert seek_check(facts) == "", kind


def test_manifest_count_is_what_dali_counts_or_the_file_leaves_dali(clips):
    from daliload.prescreen.rules import route_for

    facts = probe_file(clips["mpeg2_ts_cut_mid_gop"])
    route, reason = route_for(facts, "gpu")
    assert route == "fallback"
    assert facts.num_packets != facts.num_frames


# -- real files ----------------------------------------------------------------------------------


def _decodable_realclips(realclips) -> list[dict]:
    with open(realclips / "MANIFEST.tsv", newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t"))
    return [r for r in rows if r["pyav_decoded_all_ok"] == "True"]


def test_every_decodable_real_file_gives_exact_windows(realclips):
    totals = {"files": 0, "exact": 0, "within tolerance": 0, "backed off": 0}
    for row in _decodable_realclips(realclips):
        seen = check_file(realclips / row["file"], codec=row["video_codec"])
        totals["files"] += 1
        for key, value in seen.items():
            totals[key] += value
    print("real files:", totals)
    assert totals["files"] == 17 and totals["within tolerance"] == 0


@pytest.mark.parametrize("name", ["decord/corrupted.mp4"])
def test_real_file_damaged_mid_stream_is_a_loud_error(realclips, name):
    path = realclips / name
    facts = probe_file(path)
    with pytest.raises(DecodeError, match=re.escape(str(path))):
        decode_window(path, [facts.num_frames - 3, facts.num_frames - 1])


# -- DALI on the CPU ------------------------------------------------------------------------------


def _dali_frames(path, start: int, length: int) -> np.ndarray:
    from daliload.prescreen.deep import _dali_pipeline

    pipe = _dali_pipeline("cpu", 0)
    encoded = np.fromfile(path, dtype=np.uint8)
    pipe.feed_input("encoded", [encoded, encoded])
    pipe.feed_input("start", [np.int32(start)] * 2)
    pipe.feed_input("length", [np.int32(length)] * 2)
    (frames,) = pipe.run()
    return np.asarray(frames.as_tensor())[0]


#: DALI converts YUV to RGB with interpolated chroma, FFmpeg copies the nearest
#: sample: a mean absolute difference of about 3 on the same frames (docs/architecture.md, Facts).
DALI_TOLERANCE = 6.0


def test_dali_cpu_frames_at_manifest_indices_match_a_full_decode(realclips, tmp_path):
    pytest.importorskip("nvidia.dali")
    files = [realclips / "moviepy/transparent.webm", realclips / "moviepy/big_buck_bunny_432_433.webm",
             realclips / "mp4ff/vp9.ivf"]
    files.append(encode(tmp_path / "vp8.webm", 40, "libvpx", size=(96, 64),
                        options={"g": "12", "crf": "20", "b:v": "1M", "auto-alt-ref": "1", "lag-in-frames": "8"}))
    files.append(encode(tmp_path / "mjpeg.avi", 20, "mjpeg", pix_fmt="yuvj420p", size=(96, 64)))
    for path in files:
        facts = probe_file(path)
        if facts.num_packets != facts.num_frames:
            continue  # routed away from DALI (test_manifest_count_is_what_dali_counts...)
        for start in sorted({0, facts.num_frames // 2, max(0, facts.num_frames - 4)}):
            length = min(4, facts.num_frames - start)
            got = _dali_frames(path, start, length)
            reference, _ = full_decode(path, set(range(start, start + length)))
            for k in range(length):
                diff = float(np.abs(got[k].astype(np.int16) - reference[start + k]).mean())
                assert diff <= DALI_TOLERANCE, f"{path}: DALI frame {start + k} differs by {diff:.1f}"


# -- the random-access rule, on hand-made packets -------------------------------------------------


def _packet(data: bytes, key: bool = True) -> av.Packet:
    packet = av.Packet(data)
    packet.is_keyframe = key
    return packet


def test_random_access_points():
    from daliload.stream.numbering import is_random_access

    def avcc(*units: bytes) -> bytes:
        return b"".join(len(u).to_bytes(4, "big") + u for u in units)

    idr, non_idr_i = b"\x65\x88\x84", b"\x41\x9a\x02"
    recovery_sei = b"\x06\x06\x01\xc4\x80"  # payload type 6 (recovery point), size 1
    assert is_random_access("h264", _packet(avcc(idr)), 4)
    assert not is_random_access("h264", _packet(avcc(non_idr_i)), 4)  # DALI issue #3387
    assert is_random_access("h264", _packet(avcc(recovery_sei, non_idr_i)), 4)
    assert not is_random_access("h264", _packet(avcc(idr), key=False), 4)  # never without the flag
    assert is_random_access("h264", _packet(b"\x00\x00\x00\x01\x09\xf0\x00\x00\x01" + idr), None)  # Annex B
    cra, trail = bytes([21 << 1, 1]), bytes([1 << 1, 1])
    assert is_random_access("hevc", _packet(avcc(cra)), 4)
    assert not is_random_access("hevc", _packet(avcc(trail)), 4)
    assert is_random_access("vp9", _packet(b"\x82\x49"), None)  # other codecs trust the flag


def test_frames_from_the_first_output():
    from daliload.stream.numbering import frames_from

    assert frames_from([1, 2, 17, 18], 17) == [17, 18]
    assert frames_from([1, 2, 17, 18], None) == [1, 2, 17, 18]
    assert frames_from([1, 2, 17, 18], 5) == [1, 2, 17, 18]  # an origin no packet has: no cut


def test_unsafe_seek_and_packet_count_reach_the_manifest_entry(tmp_path):
    from daliload.prescreen.manifest import Manifest
    from daliload.prescreen.rows import FileRecord, ProbeRows, Probed

    source = encode(tmp_path / "src.mp4", 40, "mpeg4", options={"g": "40", "qscale": "3"})
    path = remux(source, tmp_path / "fake_key.mp4", mark_key=(20,))
    facts = with_seek_check(probe_file(path))
    record = FileRecord(str(path), path.stat().st_size, path.stat().st_mtime_ns, "train", 0, "a")
    with Manifest(tmp_path / "m.sqlite", writable=True) as manifest:
        manifest.set_classes(["a"])
        manifest.write_probed([Probed(record, ProbeRows.of(facts))])
    with Manifest(tmp_path / "m.sqlite") as manifest:
        (entry,) = manifest.entries("train", device="gpu")
    assert entry.unsafe_seek and entry.num_packets == entry.num_frames == 40
    assert entry.route == "fallback" and "seeking to a keyframe gives wrong frames" in entry.reason


def test_a_file_that_backed_off_once_starts_at_the_start_afterwards(tmp_path, monkeypatch):
    import fallback.decode as decode
    import daliload.stream.numbering as numbering

    path = encode(tmp_path / "src.webm", 40, "libvpx-vp9", options={"g": "50", "crf": "40", "b:v": "0",
                                                                     "deadline": "realtime", "cpu-used": "8"})
    with av.open(str(path)) as container:
        liar = [p.pts for p in container.demux(container.streams.video[0]) if p.size][12]
    honest = numbering.is_random_access
    monkeypatch.setattr(numbering, "is_random_access", lambda c, p, n: p.pts == liar or honest(c, p, n))
    monkeypatch.setattr(decode, "_UNSAFE_SEEK", set())
    asked = []
    candidates = FrameTable.entry_candidates
    monkeypatch.setattr(FrameTable, "entry_candidates", lambda self, i: asked.append(i) or candidates(self, i))
    first = decode_window(path, [14], skip_nonref=False)
    assert first.seek_unsafe and asked == [14]  # tried the entry at frame 12, then the start
    again = decode_window(path, [16], skip_nonref=False)
    assert again.seek_unsafe and asked == [14] and again.num_frames_decoded == 17  # straight from the start


def test_counting_path_numbers_a_cut_stream_the_same_way(clips, monkeypatch):
    # Files without usable timestamps (AVI, raw streams) are counted from the start: the
    # pictures before the first frame must not count there either.
    import fallback.decode as decode

    path = clips["vp9_webm_cut_mid_gop"]
    reference, count = full_decode(path)
    monkeypatch.setattr(decode, "timestamps_rank_frames", lambda name: False)
    window = [0, 3, count - 1]
    clip = decode_window(path, window)
    assert all(np.array_equal(got, reference[i]) for got, i in zip(clip.frames, window))


def test_scan_deep_marks_the_file_and_the_loader_decodes_it_from_the_start(tmp_path):
    """End to end: `daliload scan --deep` records unsafe_seek; the loader's hint for it starts at frame 0."""
    from daliload.epoch import stream_hint
    from daliload.prescreen import Manifest, scan

    source = encode(tmp_path / "src.mp4", 40, "mpeg4", options={"g": "40", "qscale": "3"})
    folder = tmp_path / "data" / "train" / "a"
    folder.mkdir(parents=True)
    remux(source, folder / "fake_key.mp4", mark_key=(20,))
    summary = scan(tmp_path / "data", device="cpu", deep=True, workers=1, progress=False)
    with Manifest(summary.manifest_path) as manifest:
        (entry,) = manifest.entries("train", device="cpu")
    assert entry.unsafe_seek and entry.route == "fallback"
    hint = stream_hint(entry)
    assert hint is not None and hint.unsafe_seek
