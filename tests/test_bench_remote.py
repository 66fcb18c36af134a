"""``python -m benchmarks.bench_remote`` runs every row against a throttled S3 store and writes its figures.

Counts, bytes and the targets' presence are asserted, never a speed.
"""

from __future__ import annotations

import json

import pytest

from benchmarks.remote_least import PacketMap, window_bytes
from benchmarks.remote_store import StoreConfig, parse_stores


def test_store_configurations_parse_and_bad_ones_are_named():
    assert parse_stores("0, 20,50@20") == [StoreConfig(0, None), StoreConfig(20, None), StoreConfig(50, 20)]
    assert StoreConfig(20, 20).name == "20 ms, 20 MB/s"
    with pytest.raises(ValueError, match=r"--stores: bad item '20@fast'.*LATENCY_MS@CAP_MB_S"):
        parse_stores("0,20@fast")
    with pytest.raises(ValueError, match=r"cap_mb_s must be > 0 MB/s.*got 0"):
        parse_stores("20@0")
    with pytest.raises(ValueError, match=r"no configuration in ' , '"):
        parse_stores(" , ")


def test_the_least_runs_from_the_entry_keyframe_to_the_last_packet_the_window_needs():
    # 8 frames in two GOPs with B-frames: in decode order the frames are 0 (key), 2, 1, 3, 4 (key), 6, 5, 7
    frames = (0, 2, 1, 3, 4, 6, 5, 7)
    keys = (True, False, False, False, True, False, False, False)
    starts = tuple(100 + 10 * n for n in range(8))  # 100-byte header, 10-byte packets
    packets = PacketMap(size_bytes=200, header_bytes=100 + 20, starts=starts, ends=tuple(s + 10 for s in starts),
                        frames=frames, keys=keys)
    assert window_bytes(packets, [5, 6]) == 30  # enters at frame 4 (packet 4), ends with packet 6 (frame 5)
    assert window_bytes(packets, [1, 2]) == 30  # frame 1 is decoded after frame 2: packets 0..2
    assert window_bytes(packets, [3, 5]) == 70  # enters at frame 0: packets 0..6


@pytest.mark.slow
def test_the_remote_benchmark_measures_every_row_on_one_plan_and_writes_its_sections(tmp_path):
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    from benchmarks import bench_remote
    from benchmarks.remote_report import CHAPTER

    out, md, page = tmp_path / "remote.json", tmp_path / "RESULTS.md", tmp_path / "remote.md"
    page.write_text("before\n<!-- remote:begin: generated -->\nold figures\n<!-- remote:end -->\nafter\n")
    assert bench_remote.main(["--classes", "2", "--clips-per-class", "2", "--duration", "3", "--size", "64x48",
                              "--clip-len", "8", "--frame-stride", "2", "--rounds", "1", "--stores", "20,20@20",
                              "--data-dir", str(tmp_path / "data"), "--json", str(out), "--results-md", str(md),
                              "--readme", str(page)]) == 0
    result = json.loads(out.read_text())
    assert {"date_utc", "package_commit", "cpu_cores_usable"} <= result["machine"].keys()
    assert len(result["load_average"]) == 2
    least = result["least"]
    assert least["clips"] == 4 and 0 < least["windows_per_clip"] < least["per_clip"] <= least["file_per_clip"]
    assert list(result["stores"]) == ["20 ms", "20 ms, 20 MB/s"]
    for store in result["stores"].values():
        rows = store["rows"]
        assert list(rows) == list(bench_remote.ROWS)
        for name, row in rows.items():
            if name == "torchcodec" and row["status"] == "unavailable":
                continue  # torchcodec needs FFmpeg's libraries; its reason is in the row
            assert row["status"] == "ok", (name, row.get("reason"))
            assert [run["clips"] for run in row["runs"]] == [4]
            f = row["figures"]
            assert f["clips"] == 4 and f["clips_per_s"]["n"] == 1
            if name == "daliload local":
                assert f["requests_per_clip"] == 0 and f["bytes_per_clip"] == 0  # nothing from the store
                continue
            assert f["requests_per_clip"] > 0 and f["bytes_per_clip"] > 0
            assert 0 <= f["heads_per_clip"] < f["requests_per_clip"]  # a HEAD has no body: some GET had
            assert f["bytes_over_file"] == pytest.approx(f["bytes_per_clip"] / least["file_per_clip"])
            assert f["bytes_over_least"] == pytest.approx(f["bytes_per_clip"] / least["per_clip"])
            if name.startswith("daliload"):
                # daliload's own counters saw the same reads as the proxy (its requests may count retries
                # and a size look-up differently: bytes only)
                assert f["daliload_bytes_per_clip"] > 0
                assert f["daliload_over_proxy_bytes"] == pytest.approx(1.0, rel=0.25)
        # the whole object: one GET (and no more than a size look-up) per clip, the file's bytes
        assert rows["whole object"]["figures"]["bytes_over_file"] == pytest.approx(1.0, rel=0.05)
    targets = result["targets"]
    assert [(t["target"].split(",")[0], t["row"]) for t in targets] == [
        ("bytes per clip over the least", "daliload s3"), ("bytes per clip over the least", "daliload s3 shards"),
        ("clips/s over daliload local", "daliload s3"), ("clips/s over daliload local", "daliload s3 shards"),
        ("clips/s over torchcodec", "daliload s3")]
    evaluated = targets if result["stores"]["20 ms, 20 MB/s"]["rows"]["torchcodec"]["status"] == "ok" else targets[:4]
    assert all(t["pass"] in (True, False) and t["measured"] > 0 for t in evaluated)
    text = md.read_text()
    assert CHAPTER in text and "| 20 ms, 20 MB/s | daliload s3 shards |" in text
    assert "daliload's own counters over the proxy's, on its 4 measurements from the store: bytes" in text
    assert text.count("- PASS ") + text.count("- FAIL ") == len(evaluated)
    figures = page.read_text()
    assert figures.startswith("before\n<!-- remote:begin: generated -->\nWritten by") and "old" not in figures
    assert figures.endswith("<!-- remote:end -->\nafter\n")


def test_an_unknown_row_is_refused_naming_the_rows(capsys):
    from benchmarks import bench_remote

    with pytest.raises(SystemExit):
        bench_remote.main(["--rows", "daliload local,decord"])
    assert "unknown row(s) ['decord']; choose from daliload local, daliload s3" in capsys.readouterr().err


def _normal_clips(root):
    from daliload.synth.dataset import read_report

    clips = [c for c in read_report(root) if c.broken is None and c.codec in ("h264", "vp9")]
    return [next(c for c in clips if c.codec == codec) for codec in ("h264", "vp9")]


def test_the_peers_decode_the_windows_frames_from_the_objects(small_kinetics, monkeypatch):
    """Both peers, given the objects as ``file://`` URIs, return the frames the window names (the frame code)."""
    from benchmarks.peers.remote_peers import decode_torchcodec_fsspec, decode_whole_object
    from daliload.framecode import read_clip

    monkeypatch.setenv("BENCH_REMOTE_ROOT", str(small_kinetics))
    monkeypatch.setenv("BENCH_REMOTE_PREFIX", f"file://{small_kinetics}")
    decoders = [decode_whole_object]
    try:
        from benchmarks.peers.torchcodec_peer import _probe

        decoders += [decode_torchcodec_fsspec] if _probe("cpu") is None else []
    except ImportError:
        pass
    for clip in _normal_clips(small_kinetics):
        window = [clip.num_frames - 30, clip.num_frames - 17, clip.num_frames - 1, clip.num_frames - 1]
        for decode in decoders:
            frames, _ = decode(str(small_kinetics / clip.path), window)
            got = frames.numpy() if hasattr(frames, "numpy") else frames
            assert read_clip(got) == window, (decode.__name__, clip.path)


def test_the_least_of_a_real_file_is_its_windows_packets_plus_its_header(tmp_path):
    from benchmarks.remote_least import least_for_plan, packet_map
    from daliload.synth.dataset import generate_dataset
    from daliload.synth.spec import SynthSpec

    spec = SynthSpec(num_classes=1, clips_per_class=2, val_fraction=0.0, width=64, height=48, duration_s=2.0,
                     fps_mix={30: 1.0}, codec_mix={"h264": 1.0, "vp9": 1.0}, gop=8)
    report = generate_dataset(tmp_path, spec, progress=False)
    assert {c.codec for c in report.clips} == {"h264", "vp9"}
    for clip in report.clips:
        path = str(tmp_path / clip.path)
        packets = packet_map(path)
        assert sorted(packets.frames) == list(range(60))
        assert [f for f, key in zip(packets.frames, packets.keys) if key] == list(range(0, 60, 8))
        assert 0 < packets.header_bytes < packets.size_bytes
        whole = window_bytes(packets, [0, 59])
        assert whole == packets.size_bytes - packets.header_bytes  # one video stream: its packets are contiguous
        entry = packets.frames.index(56)  # the keyframe at or before frame 58
        assert window_bytes(packets, [58, 59]) == packets.ends[-1] - packets.starts[entry] < whole
        least = least_for_plan([(path, [0, 5]), (path, [58, 59])])
        assert least.clips == 2 and least.header_bytes == packets.header_bytes  # the header once per file
        assert least.file_bytes == 2 * packets.size_bytes
        assert least.window_bytes == window_bytes(packets, [0, 5]) + window_bytes(packets, [58, 59])
