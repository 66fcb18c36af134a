"""``daliload transcode``: layout, frames, keyframes, sizes, routes, resume, kill, failures, shares.

Datasets are tiny (96x64 to 200x200, about a second) so the whole file runs in
well under a minute on 2 cores; the real clips of ``../shared/realclips`` are
transcoded at a small short side.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest

from daliload.framecode import read_code
from daliload.dataset import load_index
from daliload.loader import KineticsDALILoader
from daliload.prescreen import Manifest, probe_file, scan
from daliload.prescreen.gpus import GPU_MODELS
from daliload.synth import SynthSpec, generate_dataset
from daliload.synth.content import render_clip
from daliload.transcode import (
    Shard,
    TranscodeOptions,
    output_size,
    parse_fps,
    parse_shard,
    plan_transcode,
    record_path,
    resolve_encoder,
    rewrite_list,
    transcode_dataset,
)
from daliload.transcode import options as options_module
from daliload.transcode.encode import FileJob, transcode_file

OPTIONS = TranscodeOptions(short_side=64, gop=8)
ALL = Shard(0, 1)
CLI = [sys.executable, "-m", "daliload.cli", "transcode"]


def full_decode(path) -> list[float]:
    """Presentation times (s) of every frame a sequential decode outputs, going past damaged packets."""
    times = []
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        for packet in container.demux(stream):
            try:
                frames = packet.decode()
            except av.error.InvalidDataError:
                continue
            times += [float(f.pts * f.time_base) if f.pts is not None else -1.0 for f in frames]
    return times


def frame_codes(path) -> list[int]:
    """The frame index painted into each frame (:mod:`daliload.framecode`), in output order."""
    with av.open(str(path)) as container:
        return [read_code(frame.to_ndarray(format="rgb24")).index for frame in container.decode(video=0)]


def outputs(root: Path) -> dict[str, bytes]:
    """Relative path -> SHA-1 of every file under ``root`` except the record."""
    return {p.relative_to(root).as_posix(): hashlib.sha1(p.read_bytes()).digest()
            for p in sorted(root.rglob("*")) if p.is_file() and ".daliload" not in p.parts}


def assert_same_videos(root: Path, reference: Path) -> None:
    """The same files, and each video the same frames as the reference's, up to libx264's own variation.

    libx264 is not bit-exact from run to run even with one thread: under CPU load about 1 encode in 150
    of the same frames comes out with other bytes (measured in this session, frames checked equal at
    the encoder's input), its pictures differing by about one level of 255. A wrong frame differs by tens.
    """
    assert sorted(outputs(root)) == sorted(outputs(reference))
    for rel in outputs(root):
        if not rel.endswith(".mp4"):
            assert (root / rel).read_bytes() == (reference / rel).read_bytes(), rel
            continue
        with av.open(str(root / rel)) as a, av.open(str(reference / rel)) as b:
            got = [f.to_ndarray(format="rgb24").astype(np.int16) for f in a.decode(video=0)]
            want = [f.to_ndarray(format="rgb24").astype(np.int16) for f in b.decode(video=0)]
        assert len(got) == len(want) and all(g.shape == w.shape for g, w in zip(got, want)), rel
        assert max(float(np.abs(g - w).mean()) for g, w in zip(got, want)) < 3.0, rel


def record_rows(dst: Path, shard: Shard = ALL) -> dict[str, tuple]:
    with sqlite3.connect(record_path(dst, shard)) as conn:
        return {row[0]: row[1:] for row in conn.execute(
            "SELECT rel, status, reason, out_rel, src_size, bytes_out, frames_in, frames_out FROM files")}


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """Mixed codecs (H.264 at GOP 250, VP9, AV1), 4:4:4, 10-bit, VFR and broken files."""
    root = tmp_path_factory.mktemp("raw")
    spec = SynthSpec(num_classes=3, clips_per_class=5, val_fraction=0.2, width=96, height=72, duration_s=1.0,
                     codec_mix={"h264": 0.5, "vp9": 0.3, "av1": 0.2}, broken_fraction=0.34,
                     broken_kinds=("yuv444", "ten_bit", "vfr", "truncated", "garbage"), seed=3)
    generate_dataset(root, spec, workers=2, progress=False)
    return root


@pytest.fixture(scope="module")
def transcoded(source, tmp_path_factory):
    dst = tmp_path_factory.mktemp("out") / "k"
    json_path = dst.parent / "files.jsonl"
    summary = transcode_dataset(source, dst, OPTIONS, workers=2, progress=False, json_path=json_path)
    return dst, summary, json_path


# The CSVs still list the bad files, which were not written: the index of DST says they are missing.
@pytest.mark.filterwarnings("ignore:.*listed in the .* index are missing")
def test_layout_frames_keyframes_sizes_and_bad_files(source, transcoded):
    dst, summary, json_path = transcoded
    assert not summary.failed and summary.written == 13 and len(summary.bad) == 2  # truncated, garbage
    assert all(r.reason for r in summary.bad) and "corrupt packet" in " ".join(r.reason for r in summary.bad)
    assert not any((dst / r.rel).with_suffix(".mp4").exists() for r in summary.bad)
    for split in ("train", "val"):
        src_index, dst_index = load_index(source, split), load_index(dst, split)
        assert dst_index.classes == src_index.classes and dst_index.layout == "csv"
        good = {Path(r.path).relative_to(source).with_suffix(".mp4").as_posix() for r in src_index.records} - {
            Path(r.rel).with_suffix(".mp4").as_posix() for r in summary.bad}
        assert {Path(r.path).relative_to(dst).as_posix() for r in dst_index.records} == good
        csv = f"annotations/{split}.csv"
        assert (dst / csv).read_bytes() == (source / csv).read_bytes()
        listed = (dst / f"{split}list.txt").read_text().splitlines()
        assert listed == rewrite_list((source / f"{split}list.txt").read_text()).splitlines()
        assert all(line.rpartition(" ")[0].endswith(".mp4") for line in listed)
        by_list = load_index(dst, split, layout="list")
        assert [(r.path, r.label) for r in by_list.records] == [(r.path, r.label) for r in dst_index.records]
    for result in summary.of("written"):
        out = dst / result.out_rel
        facts = probe_file(out)
        assert (facts.codec, facts.pix_fmt, facts.interlaced) == ("h264", "yuv420p", False)
        assert min(facts.width, facts.height) == 64 and facts.width % 2 == facts.height % 2 == 0
        gaps = np.diff([*facts.keyframes, facts.num_frames])
        assert facts.keyframes[0] == 0 and gaps.max() <= OPTIONS.gop, result.rel
        src_times = full_decode(source / result.rel)
        assert facts.num_frames == len(src_times) == result.frames_out, result.rel
        assert full_decode(out) == pytest.approx(src_times, abs=2e-3), f"timestamps of {result.rel}"
        assert frame_codes(out) == frame_codes(source / result.rel), f"frames of {result.rel}"
    assert not list(dst.rglob(".*.partial-*"))
    lines = [json.loads(line) for line in json_path.read_text().splitlines()]
    assert sorted(r["rel"] for r in lines) == [r.rel for r in summary.results]
    assert {r["status"] for r in lines} == {"written", "bad"}


@pytest.mark.filterwarnings("ignore:.*listed in the .* index are missing")
def test_scan_of_the_output_routes_every_file_to_dali_on_every_gpu_model(transcoded, tmp_path):
    dst, summary, _ = transcoded
    manifest_path = tmp_path / "manifest.sqlite"
    scan(dst, device="gpu", workers=2, progress=False, manifest_path=manifest_path)
    with Manifest(manifest_path) as manifest:
        for generation in sorted(set(GPU_MODELS.values())):
            routes = {e.route for e in manifest.entries(device=f"gpu:{generation}")}
            assert routes == {"dali"}, generation
        assert len(manifest.entries(device="gpu")) == summary.written


@pytest.mark.filterwarnings("ignore:.*listed in the .* index are missing")
def test_the_loader_reads_the_output_unchanged(transcoded):
    dst, summary, _ = transcoded
    loader = KineticsDALILoader(dst, "train", batch_size=4, clip_len=4, frame_stride=2, crop_size=48)
    try:
        assert sum(len(labels) for _, labels in loader) == 4 * len(loader) and not loader.stats().failures
        assert len(loader.videos) == sum(r.rel.startswith("train/") for r in summary.of("written"))
    finally:
        loader.close()


def test_rerun_skips_everything_and_redoes_a_changed_source(source, transcoded, tmp_path):
    dst_first, _, _ = transcoded
    dst = tmp_path / "k"
    shutil.copytree(dst_first, dst)
    before = outputs(dst)
    again = transcode_dataset(source, dst, OPTIONS, workers=2, progress=False)
    assert (again.written, again.skipped, len(again.failed)) == (0, len(again.results), 0)
    assert again.bytes_in == 0 and outputs(dst) == before
    changed = again.of("written")[0]
    os.utime(source / changed.rel, ns=(time.time_ns(), changed.src_mtime_ns + 10**9))
    try:
        third = transcode_dataset(source, dst, OPTIONS, workers=1, progress=False)
        assert [r.rel for r in third.results if not r.skipped] == [changed.rel]
    finally:
        os.utime(source / changed.rel, ns=(time.time_ns(), changed.src_mtime_ns))
    other = transcode_dataset(source, dst, TranscodeOptions(short_side=48, gop=8), splits=("val",),
                              workers=2, progress=False)
    assert other.skipped == 0 and {(r.width, r.height) for r in other.of("written")} == {(64, 48)}


def test_a_killed_run_resumes_to_the_same_result(source, transcoded, tmp_path):
    dst_full, _, _ = transcoded
    dst = tmp_path / "k"
    args = [*CLI, str(source), str(dst), "--short-side", "64", "--gop", "8", "--workers", "1", "--no-progress"]
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    record = record_path(dst, ALL)
    deadline = time.monotonic() + 120
    rows = {}
    while time.monotonic() < deadline and process.poll() is None:
        if record.exists():
            try:
                rows = record_rows(dst)
            except sqlite3.OperationalError:
                rows = {}
            if any(row[0] == "written" for row in rows.values()):
                break
        time.sleep(0.02)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert any(row[0] == "written" for row in rows.values()) and len(record_rows(dst)) < 15, "not killed midway"
    resumed = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert "0 failed" in resumed.stdout and "skipped" in resumed.stdout
    assert_same_videos(dst, dst_full)
    def without_bytes(rows):  # the encoded size varies with libx264's bytes (assert_same_videos)
        return {rel: row[:4] + row[5:] for rel, row in rows.items()}
    assert without_bytes(record_rows(dst)) == without_bytes(record_rows(dst_full))


def test_shards_partition_the_files_and_share_the_record(source, transcoded, tmp_path):
    all_jobs = {j.rel for j in plan_transcode(source, tmp_path / "x", OPTIONS).jobs}
    for count in (2, 3, 7):
        shares = [{j.rel for j in plan_transcode(source, tmp_path / "x", OPTIONS, shard=Shard(i, count)).jobs}
                  for i in range(count)]
        assert sum(len(s) for s in shares) == len(all_jobs) and set().union(*shares) == all_jobs
    dst = tmp_path / "k"
    halves = [transcode_dataset(source, dst, OPTIONS, shard=Shard(i, 2), workers=1, progress=False)
              for i in range(2)]
    assert sum(len(h.results) for h in halves) == len(all_jobs)
    assert_same_videos(dst, transcoded[0])
    whole = transcode_dataset(source, dst, OPTIONS, workers=2, progress=False)
    assert whole.skipped == len(all_jobs) and whole.written == 0


def test_a_file_that_fails_or_hangs_is_reported_and_the_others_are_written(source, realclips, tmp_path):
    src = tmp_path / "src"
    (src / "train" / "a").mkdir(parents=True)
    for clip in sorted((source / "train").rglob("*.webm"))[:2]:
        shutil.copy(clip, src / "train" / "a" / clip.name)
    slow = src / "train" / "a" / "slow.mp4"
    slow.symlink_to(realclips / "PySceneDetect" / "issue-134-rotate.mp4")
    dst = tmp_path / "dst"
    args = [*CLI, str(src), str(dst), "--short-side", "0", "--timeout-s", "1.5", "--workers", "2", "--no-progress"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "2 written" in done.stdout and "1 failed" in done.stdout
    assert "train/a/slow.mp4: timeout" in done.stdout
    assert not (dst / "train" / "a" / "slow.mp4").exists() and not list(dst.rglob(".*partial*"))
    assert "train/a/slow.mp4" not in record_rows(dst)


def _mpeg2_ts(path: Path) -> None:
    """An MPEG-2 transport stream with B-frames (what broadcast captures are)."""
    with av.open(str(path), "w", format="mpegts") as out:
        stream = out.add_stream("mpeg2video", rate=25)
        stream.width, stream.height, stream.pix_fmt = 128, 96, "yuv420p"
        stream.codec_context.gop_size, stream.codec_context.max_b_frames = 12, 2
        for rgb in render_clip(2, 40, width=128, height=96, fps=25.0, seed=1):
            for packet in stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)


REAL = {  # class folder -> real clips (4:4:4 VFR, 10-bit, rotated, broken, AVI, FLV, IVF, MJPEG, HEVC, SAR)
    "odd": ["torchcodec/var_fps_video.mp4", "torchcodec/h264_10bits.mp4", "VALI/test_hevc10.mkv",
            "PySceneDetect/issue-134-rotate.mp4", "mp4ff/ed_hevc.mp4", "mp4ff/vp9.ivf"],
    "old": ["video_reader_benchmark/RATRACE_wave_f_nm_np1_fr_goo_37.avi", "mmaction2/test.mp4", "moviepy/clip1024.flv",
            "nwb-video-widgets/stub_mjpeg.avi", "moviepy/big_buck_bunny_432_433.webm"],
    "broken": ["mp4parse-rust/chunk_out_of_range.mp4", "mp4parse-rust/zero_empty_stsc.mp4", "decord/corrupted.mp4"],
}


def test_real_clips(realclips, tmp_path):
    src = tmp_path / "src"
    for folder, names in REAL.items():
        (src / "train" / folder).mkdir(parents=True)
        for name in names:
            (src / "train" / folder / name.replace("/", "_")).symlink_to(realclips / name)
    _mpeg2_ts(src / "train" / "old" / "broadcast.ts")
    dst = tmp_path / "dst"
    summary = transcode_dataset(src, dst, TranscodeOptions(short_side=96, gop=12), workers=2, progress=False)
    assert not summary.failed, summary.format()
    assert {Path(r.rel).name for r in summary.bad} == {"mp4parse-rust_chunk_out_of_range.mp4",
                                                       "mp4parse-rust_zero_empty_stsc.mp4"}
    for result in summary.of("written"):
        out = dst / result.out_rel
        facts = probe_file(out)
        assert (facts.codec, facts.pix_fmt, min(facts.width, facts.height)) == ("h264", "yuv420p", 96), result.rel
        assert np.diff([*facts.keyframes, facts.num_frames]).max() <= 12, result.rel
        assert facts.num_frames == len(full_decode(src / result.rel)), result.rel
        assert facts.rotation == 0
    with av.open(str(dst / "train/old/mmaction2_test.mp4")) as container:  # non-square pixels, SAR 1024/765
        assert container.streams.video[0].sample_aspect_ratio == Fraction(1024, 765)
    vfr = "train/odd/torchcodec_var_fps_video.mp4"
    assert full_decode(dst / "train/odd/torchcodec_var_fps_video.mp4") == pytest.approx(full_decode(src / vfr),
                                                                                         abs=1e-3)
    _check_upright(src / "train/odd/PySceneDetect_issue-134-rotate.mp4",
                   dst / "train/odd/PySceneDetect_issue-134-rotate.mp4")


def _check_upright(src: Path, out: Path) -> None:
    """The rotated clip (display matrix -90: turn clockwise) comes out turned, with no rotation flag."""
    with av.open(str(src)) as container:
        coded = next(container.decode(video=0)).to_ndarray(format="gray")
    with av.open(str(out)) as container:
        written = next(container.decode(video=0)).to_ndarray(format="gray").astype(float)
    assert written.shape[0] > written.shape[1] and coded.shape[0] < coded.shape[1]

    def shrink(image):  # nearest-neighbour to the output's size
        rows = np.linspace(0, image.shape[0] - 1, written.shape[0]).round().astype(int)
        cols = np.linspace(0, image.shape[1] - 1, written.shape[1]).round().astype(int)
        return image[rows][:, cols].astype(float)

    clockwise, counter = shrink(np.rot90(coded, -1)), shrink(np.rot90(coded, 1))
    assert np.abs(written - clockwise).mean() < 0.5 * np.abs(written - counter).mean()


def test_fps_and_audio_options(realclips, tmp_path):
    src = realclips / "moviepy" / "transparent.webm"  # 150 frames at 30 fps, Vorbis audio
    job = FileJob(str(src), str(tmp_path / "a.mp4"), "a.webm", TranscodeOptions(short_side=64, fps=Fraction(10)))
    result = transcode_file(job)
    with av.open(job.dst) as container:
        assert not container.streams.audio
        assert float(container.streams.video[0].average_rate) == pytest.approx(10, rel=0.01)
    assert result.frames_in == 150 and abs(result.frames_out - 50) <= 1
    kept = FileJob(str(src), str(tmp_path / "b.mp4"), "b.webm", TranscodeOptions(short_side=64, keep_audio=True))
    assert transcode_file(kept).frames_out == 150
    with av.open(kept.dst) as container:
        assert container.streams.audio[0].codec_context.name == "aac"


def test_two_sources_that_would_become_one_output_are_a_clash(tmp_path):
    folder = tmp_path / "src" / "train" / "a"
    folder.mkdir(parents=True)
    for name in ("x.webm", "x.mkv", "y.avi"):
        (folder / name).write_bytes(b"not probed by the plan")
    plan = plan_transcode(tmp_path / "src", tmp_path / "dst", OPTIONS)
    assert [(j.rel, j.out_rel) for j in plan.jobs] == [("train/a/x.mkv", "train/a/x.mp4"),
                                                       ("train/a/y.avi", "train/a/y.mp4")]
    assert plan.clashes == (("train/a/x.webm", "name clash: train/a/x.mkv also becomes train/a/x.mp4; "
                                               "rename one of them"),)


def test_bad_arguments_are_clear_errors(source, tmp_path, monkeypatch, capsys):
    with pytest.raises(ValueError, match="I/N with 0 <= I < N"):
        parse_shard("2/2")
    with pytest.raises(ValueError, match="--shard must be I/N"):
        parse_shard("half")
    with pytest.raises(ValueError, match="'keep' or a frame rate"):
        parse_fps("fast")
    with pytest.raises(ValueError, match="short_side must be an even"):
        TranscodeOptions(short_side=255)
    with pytest.raises(ValueError, match="not a libx264 preset"):
        TranscodeOptions(preset="p4")
    with pytest.raises(ValueError, match="inside it"):
        plan_transcode(source, source / "out", OPTIONS)
    with pytest.raises(FileNotFoundError, match="nowhere"):
        plan_transcode(tmp_path / "nowhere", tmp_path / "out", OPTIONS)
    monkeypatch.setattr(options_module, "gpu_visible", lambda: False)
    with pytest.raises(ValueError, match="no NVIDIA GPU is visible"):
        resolve_encoder("nvenc")
    assert resolve_encoder("auto") == "libx264"
    monkeypatch.setattr(options_module, "gpu_visible", lambda: True)  # a GPU, but (here) no NVENC behind it
    with pytest.raises(ValueError, match="does not open on this machine"):
        resolve_encoder("nvenc")
    assert resolve_encoder("auto") == "libx264"
    monkeypatch.setattr(options_module, "gpu_visible", lambda: False)
    from daliload.cli import main
    assert main(["transcode", str(source), str(tmp_path / "o"), "--encoder", "nvenc"]) == 2
    assert "nvenc" in capsys.readouterr().err
    assert output_size(1280, 544, 256) == (602, 256) and output_size(81, 61, 0) == (80, 60)


def test_the_benchmark_writes_its_figures_and_section(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1]))  # the checkout's benchmarks/
    from benchmarks import bench_transcode

    out, md, readme = tmp_path / "transcode.json", tmp_path / "RESULTS.md", tmp_path / "README.md"
    md.write_text("# Benchmark results\n\n## Other: `x`\n\n### Other run `x` — m\n\nkept\n")
    readme.write_text("before\n<!-- transcode:begin: generated -->\nold figures\n<!-- transcode:end -->\nafter\n")
    args = ["--classes", "2", "--clips-per-class", "2", "--size", "128x96", "--duration-s", "2.1", "--epochs", "1",
            "--workers", "1", "--data-dir", str(tmp_path / "data"), "--json", str(out), "--results-md", str(md),
            "--readme", str(readme)]
    assert bench_transcode.main(args) == 0
    assert bench_transcode.main(args) == 0  # a second run replaces its section
    result = json.loads(out.read_text())
    assert [t["workers"] for t in result["transcode"]] == [1] and result["transcode"][0]["files_per_s"] > 0
    assert result["routes"]["dst"] == {"dali": 4} and result["loader"]["dst"]["clips_per_s"]["median"] > 0
    text = md.read_text()
    assert text.count(bench_transcode.SECTION) == 1 and text.count("### Transcode run `transcode`") == 1
    assert "kept" in text and "DST over SRC" in text and result["load_average_start"]
    # README's figures come from the run's JSON, between the markers; the rest of the file stays.
    figures = readme.read_text()
    gain = result["loader"]["dst"]["clips_per_s"]["median"] / result["loader"]["src"]["clips_per_s"]["median"]
    assert figures.startswith("before\n<!-- transcode:begin: generated -->\nWritten by")
    assert "old figures" not in figures
    assert f"({gain:.2f}x)" in figures and figures.endswith("<!-- transcode:end -->\nafter\n")


def test_a_full_disk_names_the_record_and_keeps_its_rows(tmp_path, monkeypatch, capsys):
    """The record's "database or disk is full" becomes one line naming the file; rows committed before stay."""
    import errno

    from daliload.cli import main
    from daliload.transcode import cli as transcode_cli
    from daliload.transcode import record as record_module
    from daliload.transcode.options import ALL_FILES
    from daliload.transcode.record import Record, record_path
    from daliload.transcode.summary import FileResult

    real = sqlite3.connect

    def small_disk(*args, **kwargs):  # the record's file may not grow past 3 pages
        conn = real(*args, **kwargs)
        conn.execute("PRAGMA max_page_count = 3")
        return conn

    monkeypatch.setattr(record_module.sqlite3, "connect", small_disk)
    put = []
    with Record(tmp_path, ALL_FILES) as record:
        with pytest.raises(OSError, match=r"no space left to write the transcode record .*record.sqlite \(database "
                                          r"or disk is full\): free space .* run the same command again") as caught:
            for i in range(1000):
                record.put(FileResult(f"train/c/{i:04d}.mp4", "bad", reason="x" * 200, options_key="k"))
                put.append(i)
        assert caught.value.errno == errno.ENOSPC and "\n" not in str(caught.value)
    assert len(put) > 1
    monkeypatch.undo()
    with Record(tmp_path, ALL_FILES) as record:  # every row committed before the disk filled up is there
        assert all(record.lookup(f"train/c/{i:04d}.mp4") is not None for i in put)
    monkeypatch.setattr(transcode_cli, "transcode_dataset", lambda *a, **k: (_ for _ in ()).throw(caught.value))
    assert main(["transcode", str(tmp_path / "src"), str(tmp_path / "dst"), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"no space left to write the transcode record {record_path(tmp_path, ALL_FILES)}" in err
