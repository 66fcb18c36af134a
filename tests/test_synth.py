"""The generated dataset: layouts, every broken kind probed with PyAV, frame codes, determinism."""

from __future__ import annotations

import csv
import hashlib
import re
from collections import Counter
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest

from daliload.cli import main
from daliload.framecode import read_clip
from daliload.synth.broken import BROKEN_KINDS, GARBAGE_BYTES, vfr_timestamps
from daliload.synth.dataset import CSV_COLUMNS, generate_dataset, read_report
from daliload.synth.spec import SynthSpec, class_name, parse_fps, plan_dataset

SMALL = dict(num_classes=4, clips_per_class=4, val_fraction=0.25, width=128, height=96,
             duration_s=2)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """4 classes x 4 clips at 128x96, 2 s; half H.264, half VP9; 8 broken files, one per kind."""
    spec = SynthSpec(**SMALL, codec_mix={"h264": 0.5, "vp9": 0.5}, broken_fraction=0.5, seed=7)
    return generate_dataset(tmp_path_factory.mktemp("synth") / "k", spec, workers=2, progress=False)


def _decode(path):
    """All frames PyAV decodes, as RGB, and the error that stopped decoding (or None)."""
    frames, error = [], None
    with av.open(str(path)) as container:
        try:
            for frame in container.decode(video=0):
                frames.append(frame)
        except av.FFmpegError as err:
            error = err
    return frames, error


def _codes(frames):
    return read_clip(np.stack([f.to_ndarray(format="rgb24") for f in frames]))


def _only(report, kind):
    (clip,) = [c for c in report.clips if c.broken == kind]
    return clip, Path(report.root) / clip.path


# ---------------------------------------------------------------- planning (no encoding)

def test_plan_apportions_codecs_fps_and_broken_kinds_exactly():
    spec = SynthSpec(num_classes=10, clips_per_class=10, codec_mix={"h264": 0.7, "vp9": 0.3},
                     broken_fraction=0.1)
    clips = plan_dataset(spec)
    assert len(clips) == 100
    # 10 broken files: the 8 kinds in turn, then the first two again.
    assert Counter(c.broken for c in clips if c.broken) == Counter(BROKEN_KINDS + BROKEN_KINDS[:2])
    assert Counter(c.codec for c in clips if c.broken is None) == {"h264": 63, "vp9": 27}
    assert Counter(c.fps for c in clips) == {Fraction(30): 80, Fraction(25): 10,
                                             Fraction(30000, 1001): 10}
    assert Counter(c.split for c in clips) == {"train": 80, "val": 20}
    one_each = SynthSpec(num_classes=2, clips_per_class=1, val_fraction=0.9)
    assert [c.split for c in plan_dataset(one_each)] == ["train", "train"]
    assert all(c.num_frames == round(10 * c.fps) for c in clips if c.broken is None)
    # Label = position in the sorted class names; names have spaces, as Kinetics' do.
    assert spec.class_names == tuple(sorted(spec.class_names))
    assert all(spec.class_names[c.label] == c.class_name for c in clips)
    assert "bounce vertical fast" in spec.class_names  # class 9: first moving motion at speed 2
    assert "still fast" not in spec.class_names  # a faster "still" would look like "still"
    ids = [c.youtube_id for c in clips]
    assert len(set(ids)) == 100 and all(re.fullmatch(r"[A-Za-z0-9_-]{11}", i) for i in ids)


def test_class_names_are_readable_and_distinct():
    assert [class_name(c) for c in (0, 1, 6, 9, 17, 25)] == [
        "still", "bounce vertical", "spin", "bounce vertical fast", "bounce vertical faster",
        "bounce vertical speed 4"]
    assert len({class_name(c) for c in range(400)}) == 400


def test_plan_is_a_function_of_the_seed():
    spec = SynthSpec(**SMALL, broken_fraction=0.5, seed=3)
    assert plan_dataset(spec) == plan_dataset(SynthSpec(**SMALL, broken_fraction=0.5, seed=3))
    other = plan_dataset(SynthSpec(**SMALL, broken_fraction=0.5, seed=4))
    assert {c.youtube_id for c in other}.isdisjoint({c.youtube_id for c in plan_dataset(spec)})


def test_parse_fps_keeps_ntsc_rates_exact():
    assert parse_fps(29.97) == parse_fps("29.97") == parse_fps("30000/1001")
    assert parse_fps(29.97) == Fraction(30000, 1001)
    assert parse_fps(25) == Fraction(25)
    with pytest.raises(ValueError, match="frame rate must be > 0, got 0"):
        parse_fps(0)


@pytest.mark.parametrize("changes, message", [
    (dict(codec_mix={"h265": 1.0}), r"unknown codec 'h265'; choose from av1, h264"),
    (dict(codec_mix={"h264": -1.0}), r"codec_mix shares must be >= 0"),
    (dict(broken_kinds=("zero_bytes", "melted")),
     r"unknown broken kind 'melted'; choose from zero_bytes"),
    (dict(broken_fraction=1.5), r"broken_fraction must be in \[0, 1\], got 1.5"),
    (dict(val_fraction=1.0), r"val_fraction must be in \[0, 1\), got 1.0"),
    (dict(width=127), r"even and at least 32x32.*got 127x256"),
    (dict(duration_s=200.0), r"200.0 s at 30 fps is more than the 4096 frames"),
    (dict(num_classes=0), r"need at least one class"),
    (dict(gop=0), r"gop must be >= 1 frame between keyframes .*got 0"),
])
def test_spec_rejects_bad_options(changes, message):
    with pytest.raises(ValueError, match=message):
        SynthSpec(**changes)


def test_gop_sets_the_keyframe_interval_of_every_codec(tmp_path):
    spec = SynthSpec(num_classes=1, clips_per_class=2, val_fraction=0.0, width=64, height=48, duration_s=1.0,
                     fps_mix={30: 1.0}, codec_mix={"h264": 1.0, "vp9": 1.0}, gop=8)
    report = generate_dataset(tmp_path, spec, progress=False)
    assert {c.codec for c in report.clips} == {"h264", "vp9"}
    for clip in report.clips:
        with av.open(str(tmp_path / clip.path)) as container:
            keys = sorted(p.pts for p in container.demux(video=0) if p.size and p.is_keyframe)
            time_base = container.streams.video[0].time_base
        assert [round(float(pts * time_base) * 30) for pts in keys] == [0, 8, 16, 24], clip.path


# ---------------------------------------------------------------- what is written

def test_writes_every_layout(dataset):
    root = Path(dataset.root)
    assert len(dataset.clips) == 16 and len(dataset.broken) == 8
    on_disk = {p.relative_to(root).as_posix() for p in root.rglob("*")
               if p.is_file() and p.parts[len(root.parts)] in ("train", "val")}
    assert on_disk == {c.path for c in dataset.clips}
    for c in dataset.clips:
        ext = "webm" if c.codec == "vp9" and not c.broken else "mp4"
        name = f"{c.youtube_id}_{c.time_start:06d}_{c.time_end:06d}.{ext}"
        assert c.path == f"{c.split}/{c.class_name}/{name}"
        assert c.time_end - c.time_start == 2
    assert Counter(c.split for c in dataset.clips) == {"train": 12, "val": 4}
    assert set(dataset.index_files) == {"annotations/train.csv", "annotations/val.csv",
                                        "trainlist.txt", "vallist.txt", "synth.tsv"}
    for split in ("train", "val"):
        clips = dataset.split(split)
        with open(root / "annotations" / f"{split}.csv", newline="") as f:
            rows = list(csv.reader(f))
        assert tuple(rows[0]) == CSV_COLUMNS
        assert rows[1:] == [[c.class_name, c.youtube_id, str(c.time_start), str(c.time_end), split]
                            for c in clips]
        lines = (root / f"{split}list.txt").read_text().splitlines()
        assert lines == [f"{c.path} {c.label}" for c in clips]
        assert any(" " in line.rpartition(" ")[0] for line in lines)  # paths with spaces
    assert read_report(root) == dataset.clips


def test_normal_clips_carry_the_frame_code_in_every_frame(dataset):
    normal = [c for c in dataset.clips if c.broken is None]
    assert Counter(c.codec for c in normal) == {"h264": 4, "vp9": 4}
    for clip in normal:
        path = Path(dataset.root) / clip.path
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            assert stream.codec_context.name == clip.codec, path
            assert (stream.width, stream.height) == (128, 96)
            assert stream.average_rate == clip.fps, path
            if clip.codec == "h264":
                assert stream.codec_context.profile == "High"
        frames, error = _decode(path)
        assert error is None
        assert len(frames) == clip.num_frames == round(2 * clip.fps)
        assert _codes(frames) == list(range(clip.num_frames)), path


def test_zero_bytes(dataset):
    _, path = _only(dataset, "zero_bytes")
    assert path.stat().st_size == 0
    with pytest.raises(av.FFmpegError):
        av.open(str(path))


def test_garbage(dataset):
    clip, path = _only(dataset, "garbage")
    assert path.suffix == ".mp4" and path.stat().st_size == GARBAGE_BYTES and clip.codec is None
    try:
        with av.open(str(path)) as container:  # random bytes may probe as some odd format...
            assert not container.streams.video  # ...but never as video
    except av.FFmpegError:
        pass


def test_truncated_stops_decoding_part_way(dataset):
    clip, path = _only(dataset, "truncated")
    with av.open(str(path)) as container:
        # The header promises every frame.
        assert container.streams.video[0].frames == clip.num_frames == round(2 * clip.fps)
    frames, error = _decode(path)
    assert 0 < len(frames) < clip.num_frames
    assert isinstance(error, av.error.InvalidDataError)
    assert _codes(frames) == list(range(len(frames)))  # what did decode is the clip's start


def test_header_only_has_no_media_data(dataset):
    clip, path = _only(dataset, "header_only")
    with path.open("rb") as f:
        head = f.read()
    assert head[4:8] == b"ftyp" and b"moov" in head and head.endswith(b"mdat")
    with av.open(str(path)) as container:
        assert container.streams.video[0].frames == clip.num_frames == round(2 * clip.fps)
    frames, _ = _decode(path)
    assert frames == []


def test_yuv444_is_high_444(dataset):
    clip, path = _only(dataset, "yuv444")
    with av.open(str(path)) as container:
        ctx = container.streams.video[0].codec_context
        assert (ctx.name, ctx.profile, ctx.pix_fmt) == ("h264", "High 4:4:4 Predictive", "yuv444p")
    frames, error = _decode(path)
    assert error is None and frames[0].format.name == "yuv444p"
    assert _codes(frames) == list(range(clip.num_frames))


def test_ten_bit_is_really_ten_bit(dataset):
    clip, path = _only(dataset, "ten_bit")
    with av.open(str(path)) as container:
        ctx = container.streams.video[0].codec_context
        assert (ctx.name, ctx.profile, ctx.pix_fmt) == ("h264", "High 10", "yuv420p10le")
    frames, error = _decode(path)
    assert error is None and frames[0].format.name == "yuv420p10le"
    luma = np.frombuffer(frames[0].planes[0], np.uint16)
    assert luma.max() > 255 and luma.max() < 1024  # 10-bit samples in 16-bit words
    assert _codes(frames) == list(range(clip.num_frames))


def test_vfr_has_irregular_timestamps(dataset):
    clip, path = _only(dataset, "vfr")
    frames, error = _decode(path)
    assert error is None and len(frames) == clip.num_frames
    seconds = np.array([float(f.pts * f.time_base) for f in frames])
    expected_ms, _ = vfr_timestamps(clip.num_frames, clip.fps, clip.content_seed)
    np.testing.assert_allclose(seconds * 1000, expected_ms, atol=1)
    assert len(set(np.round(np.diff(seconds) * 1000))) >= 3
    assert _codes(frames) == list(range(clip.num_frames))


def test_no_video_is_audio_only(dataset):
    clip, path = _only(dataset, "no_video")
    assert path.suffix == ".mp4" and clip.num_frames == 0
    with av.open(str(path)) as container:
        assert not container.streams.video
        (audio,) = container.streams.audio
        assert audio.codec_context.name == "aac"
        assert container.duration / 1e6 == pytest.approx(2.0, abs=0.1)


def test_default_size_is_kinetics_340x256(tmp_path):
    spec = SynthSpec(num_classes=1, clips_per_class=1, val_fraction=0.0, duration_s=1)
    assert (SynthSpec().width, SynthSpec().height, SynthSpec().duration_s) == (340, 256, 10.0)
    report = generate_dataset(tmp_path, spec, progress=False)
    (clip,) = report.clips
    frames, error = _decode(tmp_path / clip.path)
    assert error is None and (frames[0].width, frames[0].height) == (340, 256)
    assert _codes(frames) == list(range(clip.num_frames))


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_same_seed_same_dataset(tmp_path):
    spec = SynthSpec(num_classes=2, clips_per_class=3, val_fraction=0.34, width=64, height=48,
                     duration_s=1, codec_mix={"h264": 0.5, "vp9": 0.5}, broken_fraction=0.34,
                     broken_kinds=("garbage", "vfr"), seed=11)
    one = generate_dataset(tmp_path / "one", spec, workers=1, progress=False)
    two = generate_dataset(tmp_path / "two", spec, workers=2, progress=False)
    assert one.listing() == two.listing() and one.clips == two.clips
    for rel in one.index_files:
        assert _digest(tmp_path / "one" / rel) == _digest(tmp_path / "two" / rel), rel
    # Encoded bytes may differ (libvpx realtime mode is time-adaptive), the content may not.
    for clip in one.clips:
        a, b = tmp_path / "one" / clip.path, tmp_path / "two" / clip.path
        if clip.broken == "garbage":
            assert _digest(a) == _digest(b)
            continue
        assert _codes(_decode(a)[0]) == _codes(_decode(b)[0]) == list(range(clip.num_frames))
    other = generate_dataset(tmp_path / "other", replace(spec, seed=12), progress=False)
    assert {c.youtube_id for c in other.clips}.isdisjoint({c.youtube_id for c in one.clips})


# ---------------------------------------------------------------- CLI

def test_cli_writes_and_summarizes(tmp_path, capsys):
    root = tmp_path / "cli"
    code = main(["synth", str(root), "--classes", "2", "--clips-per-class", "2", "--size", "64x48",
                 "--duration", "1", "--val-fraction", "0.5", "--codecs", "h264=1,vp9=1",
                 "--fps", "25", "--broken-fraction", "0.25", "--broken-kinds", "zero_bytes",
                 "--workers", "1", "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0
    assert f"wrote 4 files to {root}" in out
    assert "codecs: h264 2, vp9 1" in out and "broken: zero_bytes 1" in out and "fps: 25 4" in out
    assert [c.fps for c in read_report(root)] == [Fraction(25)] * 4


@pytest.mark.parametrize("argv, message", [
    (["--codecs", "h265=1"],
     r"argument --codecs: bad codec mix item 'h265=1'.*unknown codec 'h265'"),
    (["--size", "340by256"], r"size must be WIDTHxHEIGHT, e.g. 340x256, got '340by256'"),
    (["--broken-kinds", "melted"], r"unknown broken kind\(s\) melted; choose from zero_bytes"),
])
def test_cli_rejects_bad_arguments(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["synth", str(tmp_path / "x"), *argv])
    assert exit_info.value.code == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "x").exists()


def test_cli_reports_spec_errors(tmp_path, capsys):
    assert main(["synth", str(tmp_path / "x"), "--val-fraction", "1.5"]) == 2
    assert "val_fraction must be in [0, 1), got 1.5" in capsys.readouterr().err
