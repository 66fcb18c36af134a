"""fallback.decode: exact frame indices for any window, and clear errors for broken files."""

from __future__ import annotations

import random
import re
from fractions import Fraction

import av
import numpy as np
import pytest

from daliload.framecode import read_clip
from daliload.synth import default_spec, render_clip, write_video
from fallback import DecodeError, StreamHint, decode_window, probe_hint

KINETICS_CLIP = "video_reader_benchmark/R6llTwEh07w.mp4"  # H.264 High, 303 frames, keyframes 0 and 250


def random_windows(num_frames: int, count: int, seed: int) -> list[list[int]]:
    """Windows of every kind: in the first GOP, after later keyframes, past the end."""
    rng = random.Random(seed)
    windows = []
    for _ in range(count):
        stride = rng.choice([1, 2, 4])
        length = rng.choice([1, 4, 8, 16])
        start = rng.randrange(0, num_frames + 8)
        windows.append([start + i * stride for i in range(length)])
    return windows


def expected(window: list[int], num_frames: int, offset: int = 0) -> list[int]:
    return [min(i, num_frames - 1) + offset for i in window]


def sequential_frames(path, keep: set[int]) -> tuple[dict[int, np.ndarray], int]:
    """The reference: a plain full decode, counting frames as they come out."""
    kept, count = {}, 0
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        stream.codec_context.thread_count = 1
        for count, frame in enumerate(container.decode(stream), start=1):
            if count - 1 in keep:
                kept[count - 1] = frame.to_ndarray(format="rgb24")
    return kept, count


@pytest.mark.parametrize("codec", ["h264", "vp9"])
def test_random_windows_have_exact_frame_indices(make_clip, codec):
    path = make_clip(codec=codec, num_frames=90, gop=25)  # keyframes at 0, 25, 50, 75
    windows = random_windows(90, 24, seed=7) + [[26, 27, 28], [52, 56, 60, 64], [80, 88, 96, 104]]
    for window in windows:
        clip = decode_window(path, window)
        assert clip.frames.shape == (len(window), 96, 128, 3)
        assert read_clip(clip.frames) == expected(window, 90), window
        assert clip.video_num_frames == 90


def test_window_after_a_keyframe_does_not_decode_from_the_start(make_clip):
    path = make_clip(codec="h264", num_frames=90, gop=25)
    clip = decode_window(path, [77, 78], skip_nonref=False)
    assert read_clip(clip.frames) == [77, 78]
    assert clip.num_frames_decoded == 4  # frames 75..78: entered at the keyframe of frame 75


def test_short_video_is_edge_padded(make_clip):
    path = make_clip(codec="h264", num_frames=30, gop=25)
    clip = decode_window(path, [20, 24, 28, 32, 36, 40])
    assert read_clip(clip.frames) == [20, 24, 28, 29, 29, 29]
    assert clip.video_num_frames == 30
    assert np.array_equal(clip.frames[3], clip.frames[5])


def test_indices_keep_request_order_and_repeats(make_clip):
    path = make_clip(codec="h264", num_frames=60, gop=25)
    clip = decode_window(path, [40, 3, 40, 27])
    assert read_clip(clip.frames) == [40, 3, 40, 27]


def test_skip_nonref_decodes_fewer_frames_with_identical_pixels(make_clip):
    path = make_clip(codec="h264", num_frames=90)  # one GOP: every window starts decoding at frame 0
    window = [60, 64, 68, 72]
    skipped = decode_window(path, window, skip_nonref=True)
    full = decode_window(path, window, skip_nonref=False)
    assert np.array_equal(skipped.frames, full.frames)
    assert read_clip(skipped.frames) == window
    assert full.num_frames_decoded == 73
    assert skipped.num_frames_decoded < 0.75 * full.num_frames_decoded


def test_frame_threads_give_the_same_frames(make_clip):
    path = make_clip(codec="h264", num_frames=60, gop=25)
    window = [30, 34, 38, 42]
    assert np.array_equal(decode_window(path, window, threads=2).frames, decode_window(path, window).frames)


def test_non_zero_start_time(tmp_path):
    # pts start at 1.5 s (a clip cut from a longer stream keeps its timestamps).
    path = tmp_path / "late_start.webm"
    write_video(path, render_clip(3, 40, width=128, height=96), default_spec("vp9", gop=10),
                pts=[1500 + 33 * i for i in range(40)], time_base=Fraction(1, 1000))
    with av.open(str(path)) as container:
        assert container.streams.video[0].start_time > 0
    for window in ([0, 1, 2], [12, 16, 20], [33, 38, 43]):
        assert read_clip(decode_window(path, window).frames) == expected(window, 40)


def test_edit_list_that_cuts_the_first_frames(make_clip, tmp_path):
    # Remux with timestamps shifted 5 frames below zero: the MP4 muxer writes an
    # edit list that starts the presentation at the sixth coded frame.
    source = make_clip(codec="h264", num_frames=60, gop=25)
    path = tmp_path / "edit_list.mp4"
    with av.open(str(source)) as src, av.open(str(path), "w") as dst:
        in_stream = src.streams.video[0]
        out_stream = dst.add_stream_from_template(in_stream)
        shift = 5 * round(1 / (30 * in_stream.time_base))
        for packet in src.demux(in_stream):
            if packet.dts is None:
                continue
            packet.pts -= shift
            packet.dts -= shift
            packet.stream = out_stream
            dst.mux(packet)
    reference, count = sequential_frames(path, {0})
    assert count == 55 and read_clip(reference[0][None]) == [5]  # frame 0 is coded frame 5
    for window in ([0, 1, 2], [15, 19, 23, 27], [40, 48, 56, 64]):
        assert read_clip(decode_window(path, window).frames) == expected(window, 55, offset=5)


def test_hint_seek_matches_the_exact_path(make_clip):
    path = make_clip(codec="h264", num_frames=90, gop=25)
    hint = probe_hint(path)
    assert hint.keyframe_indices == (0, 25, 50, 75) and hint.fps == 30 and hint.num_frames == 90
    for window in random_windows(90, 12, seed=3):
        with_hint = decode_window(path, window, hint=hint)
        assert read_clip(with_hint.frames) == expected(window, 90), window
        assert np.array_equal(with_hint.frames, decode_window(path, window).frames)


def test_hint_seek_is_exact_when_a_frame_is_not_a_whole_number_of_ticks(tmp_path, caplog):
    """29.97 fps in a millisecond time base, as MKV stores it: 33.367 ticks a frame, each pts rounded."""
    path = tmp_path / "ntsc.mkv"
    frames = render_clip(1, 90, width=128, height=96, fps=30000 / 1001, seed=0)
    write_video(path, frames, default_spec("h264", fps=Fraction(30000, 1001), gop=25),
                pts=[round(i * 1001 / 30) for i in range(90)], time_base=Fraction(1, 1000))
    hint = probe_hint(path)
    assert hint.keyframe_indices == (0, 25, 50, 75) and hint.fps == Fraction(30000, 1001)
    windows = [w for w in random_windows(90, 16, seed=5) if min(w) >= 25] + [[25, 26], [74, 75, 76], [89, 93]]
    with caplog.at_level("DEBUG", logger="fallback.decode"):
        for window in windows:
            assert read_clip(decode_window(path, window, hint=hint).frames) == expected(window, 90), window
    assert "does not fit" not in caplog.text  # every window was served by the hint's seek


def test_wrong_hint_is_ignored(make_clip):
    path = make_clip(codec="h264", num_frames=90, gop=25)
    wrong = StreamHint(keyframe_indices=(0, 60), fps=10)  # would seek 3x too far
    assert read_clip(decode_window(path, [61, 62], hint=wrong).frames) == [61, 62]


def test_real_kinetics_clip_matches_full_sequential_decode(realclips):
    path = realclips / KINETICS_CLIP
    windows = [[0, 4, 8], [240, 244, 248, 252, 256], [251, 255, 259], [290, 296, 302, 308, 314]]
    reference, count = sequential_frames(path, {i for w in windows for i in w} | {302})
    assert count == 303
    for window in windows:
        clip = decode_window(path, window)
        assert clip.video_num_frames == 303
        for got, index in zip(clip.frames, window):
            assert np.array_equal(got, reference[min(index, 302)]), (window, index)


@pytest.fixture(scope="module")
def broken_files(tmp_path_factory, make_clip):
    """Every kind of broken file, made here with plain code."""
    root = tmp_path_factory.mktemp("broken")
    good = make_clip(codec="h264", num_frames=60, gop=25).read_bytes()
    files = {}
    files["zero_bytes"] = root / "zero_bytes.mp4"
    files["zero_bytes"].write_bytes(b"")
    files["garbage"] = root / "garbage.mp4"
    files["garbage"].write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    files["truncated"] = root / "truncated.mp4"  # index at the end: cut off with the second half
    files["truncated"].write_bytes(good[: len(good) // 2])
    faststart = root / "faststart.mp4"
    with av.open(str(make_clip(codec="h264", num_frames=60, gop=25))) as src, \
            av.open(str(faststart), "w", options={"movflags": "faststart"}) as dst:
        out_stream = dst.add_stream_from_template(src.streams.video[0])
        for packet in src.demux(src.streams.video[0]):
            if packet.dts is not None:
                packet.stream = out_stream
                dst.mux(packet)
    data = faststart.read_bytes()
    media = data.index(b"mdat") + 4
    files["header_only"] = root / "header_only.mp4"  # a moov that promises frames, no media
    files["header_only"].write_bytes(data[:media])
    files["truncated_media"] = root / "truncated_media.mp4"  # opens; decoding fails part way
    files["truncated_media"].write_bytes(data[: media + (len(data) - media) // 2])
    files["no_video"] = root / "no_video.mp4"
    with av.open(str(files["no_video"]), "w") as container:
        stream = container.add_stream("aac", rate=16000)
        for k in range(8):
            frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
            frame.sample_rate, frame.pts = 16000, k * 1024
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return files


@pytest.mark.parametrize("kind, reason", [
    ("zero_bytes", "cannot open"),
    ("garbage", "cannot open"),
    ("truncated", "cannot open"),
    ("header_only", "no video frames"),
    ("no_video", "no video stream"),
])
def test_broken_files_raise_decode_error_naming_the_file(broken_files, kind, reason):
    path = broken_files[kind]
    with pytest.raises(DecodeError, match=re.escape(str(path)) + ": " + reason) as info:
        decode_window(path, [0, 4, 8])
    assert info.value.path == str(path) and info.value.reason.startswith(reason)


def test_truncated_media_decodes_before_the_cut_and_fails_after(broken_files):
    path = broken_files["truncated_media"]
    assert read_clip(decode_window(path, [0, 2, 4]).frames) == [0, 2, 4]
    with pytest.raises(DecodeError, match=re.escape(str(path)) + ": decode failed"):
        decode_window(path, [50, 54, 58])


@pytest.mark.parametrize("name, window", [
    ("decord/corrupted.mp4", [40, 44, 48]),
    ("mp4parse-rust/zero_empty_stsc.mp4", [0, 4, 8]),
    ("mp4parse-rust/chunk_out_of_range.mp4", [0, 4, 8]),
])
def test_broken_real_clips_raise_decode_error(realclips, name, window):
    path = realclips / name
    with pytest.raises(DecodeError, match=re.escape(str(path))):
        decode_window(path, window)


def test_timeout_is_a_decode_error(make_clip):
    path = make_clip(codec="h264", num_frames=60, gop=25)
    with pytest.raises(DecodeError, match=re.escape(str(path)) + r": timeout: decoding took longer than 1e-09 s"):
        decode_window(path, [50], timeout_s=1e-9)


def test_bad_arguments_are_value_errors(make_clip):
    path = make_clip(codec="h264", num_frames=60, gop=25)
    with pytest.raises(ValueError, match="frame_indices is empty"):
        decode_window(path, [])
    with pytest.raises(ValueError, match="must be >= 0, got -1"):
        decode_window(path, [3, -1])
    with pytest.raises(ValueError, match="threads must be >= 1, got 0"):
        decode_window(path, [0], threads=0)
    with pytest.raises(ValueError, match="keyframe_indices must be ascending"):
        StreamHint(keyframe_indices=(5, 10), fps=30)


def test_decode_error_survives_pickling():
    import pickle

    err = pickle.loads(pickle.dumps(DecodeError("/x/y.mp4", "no video stream")))
    assert isinstance(err, RuntimeError) and err.path == "/x/y.mp4" and str(err) == "/x/y.mp4: no video stream"


GENERATED_KINDS = {  # what decode_window must do with each broken kind daliload.synth writes
    "zero_bytes": "cannot open", "garbage": "cannot open", "header_only": "no video frames",
    "no_video": "no video stream", "truncated": "decode failed",
    "yuv444": None, "ten_bit": None, "vfr": None,  # readable: exact frames
}


def test_every_generated_broken_kind(tmp_path):
    from daliload.synth.broken import BROKEN_KINDS, ClipContent, write_broken

    assert set(BROKEN_KINDS) == set(GENERATED_KINDS)
    for seed, kind in enumerate(BROKEN_KINDS):
        path = tmp_path / f"{kind}.mp4"
        write_broken(path, kind, ClipContent(1, 48, 128, 96, Fraction(30), seed))
        late = [40, 44, 48, 52]
        if GENERATED_KINDS[kind] is None:
            assert read_clip(decode_window(path, late).frames) == [40, 44, 47, 47], kind
            continue
        if kind == "truncated":  # cut in the middle: the first half decodes
            assert read_clip(decode_window(path, [0, 4, 8]).frames) == [0, 4, 8]
        with pytest.raises(DecodeError, match=re.escape(str(path)) + ": " + GENERATED_KINDS[kind]):
            decode_window(path, late)


@pytest.mark.parametrize("codec", ["h264", "hevc", "vp8", "vp9", "mpeg4", "mjpeg", "av1"])
def test_exact_windows_for_every_generated_codec_with_skip_nonref(make_clip, codec):
    """skip_nonref must never cost a wanted frame (AV1 once lost frame 23 here)."""
    from daliload.framecode import read_clip
    from fallback.decode import decode_window

    path = make_clip(codec, num_frames=60, gop=25, seed=3)
    for window in ([23, 27, 31], [0, 10, 20], [50, 55, 59, 70]):
        clip = decode_window(path, window, skip_nonref=True)
        assert read_clip(clip.frames) == [min(i, 59) for i in window], (codec, window)
