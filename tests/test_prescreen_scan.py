"""The scan and its manifest: incremental, resumable, fault-tolerant, and the CLI."""

from __future__ import annotations

import contextlib
import json
import re
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from datetime import timedelta
from pathlib import Path

import pytest

from daliload import runtime
from daliload.cli import main
from daliload.dataset import VideoRecord, load_index
from daliload.prescreen import Manifest, ScanSpec, default_manifest_path, ensure_manifest, scan
from daliload.prescreen.cli import JSON_FIELDS
from daliload.prescreen.manifest import SCHEMA_VERSION
from daliload.testing import probe_faults

#: (split, class, file name) -> codec of the generated clip ("garbage" = random bytes)
LAYOUT = {
    ("train", "abseiling", "a_h264.mp4"): "h264",
    ("train", "abseiling", "a_vp9.webm"): "vp9",
    ("train", "bowling", "b_mpeg4.avi"): "mpeg4",
    ("train", "bowling", "b_garbage.mp4"): "garbage",
    ("val", "abseiling", "c_vp8.webm"): "vp8",
    ("val", "bowling", "d_mjpeg.avi"): "mjpeg",
}
EXPECTED = (
    {  # file name -> (gpu route, cpu route); vp9/vp8 at 128x96 are below NVDEC's minimum size
        "a_h264.mp4": ("dali", "fallback"),
        "a_vp9.webm": ("fallback", "dali"),
        "b_mpeg4.avi": ("dali", "fallback"),
        "b_garbage.mp4": ("bad", "bad"),
        "c_vp8.webm": ("dali", "dali"),
        "d_mjpeg.avi": ("fallback", "dali"),
    }
)


def _clip(make_clip, codec):
    return make_clip(codec, num_frames=30, gop=10)


@pytest.fixture
def dataset(tmp_path, make_clip) -> Path:
    """ROOT/<split>/<class>/<file> with one clip per codec and one garbage file."""
    root = tmp_path / "kinetics"
    for (split, cls, name), codec in LAYOUT.items():
        path = root / split / cls / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if codec == "garbage":
            path.write_bytes(os.urandom(4096))
        else:
            shutil.copyfile(_clip(make_clip, codec), path)
    return root


def _routes(manifest_path, device) -> dict[str, tuple[str, str]]:
    with Manifest(manifest_path) as manifest:
        return {Path(e.path).name: (e.route, e.reason) for e in manifest.entries(device=device)}


def _tables(manifest_path) -> dict[str, list]:
    """Everything a scan stores about files, for comparing two manifests."""
    conn = sqlite3.connect(f"file:{manifest_path}?mode=ro", uri=True)
    try:
        return {
            table: conn.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall()
            for table in ("files", "routes", "classes")
        }
    finally:
        conn.close()


def test_scan_routes_every_file_and_the_manifest_serves_the_loader(dataset):
    summary = scan(dataset, device="cpu", workers=2, progress=False)

    assert summary.manifest_path == dataset / ".daliload" / "manifest.sqlite"
    assert summary.manifest_path == default_manifest_path(dataset)
    assert (summary.total, summary.probed, summary.reused, summary.removed) == (6, 6, 0, 0)
    assert dict(summary.files) == {"dali": 3, "fallback": 2, "bad": 1}
    assert summary.reasons[("fallback", "DALI on cpu has no h264 decoder")] == 1
    assert (
        summary.reasons[
            ("bad", "cannot open: InvalidDataError: Invalid data found when processing input")
        ]
        == 1
    )
    assert summary.hours["dali"] == pytest.approx(3 * 30 / 30 / 3600, rel=0.01)
    assert "| dali | 3 | 0.00 |" in summary.format()

    for device, column in (("gpu", 0), ("cpu", 1)):
        routes = _routes(summary.manifest_path, device)
        assert {name: route for name, (route, _) in routes.items()} == {
            name: pair[column] for name, pair in EXPECTED.items()
        }

    index = load_index(dataset, "train")
    with Manifest(summary.manifest_path) as manifest:
        assert manifest.classes() == index.classes == ("abseiling", "bowling")
        train = manifest.entries("train", device="gpu")
        assert [e.path for e in train] == [r.path for r in index.records]
        assert [(e.label, e.class_name, e.split) for e in train] == [
            (r.label, r.class_name, "train") for r in index.records
        ]
        h264 = train[0]
        assert (h264.codec, h264.num_frames, h264.fps, h264.width, h264.height) == (
            "h264",
            30,
            30.0,
            128,
            96,
        )
        assert h264.keyframes == (0, 10, 20) and h264.pix_fmt == "yuv420p" and not h264.deep_checked
        assert len(manifest.entries("val", device="cpu")) == 2
        assert manifest.splits() == ("train", "val")


def test_rescan_probes_only_new_or_changed_files(dataset, make_clip):
    first = scan(dataset, device="gpu", workers=1, progress=False)
    before = _tables(first.manifest_path)

    again = scan(dataset, device="gpu", workers=1, progress=False)
    assert (again.probed, again.reused) == (0, 6)
    assert _tables(first.manifest_path) == before

    touched = dataset / "train" / "abseiling" / "a_h264.mp4"
    stat = touched.stat()
    os.utime(touched, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert scan(dataset, device="gpu", workers=1, progress=False).probed == 1

    # Rewritten with other content: probed again, and the manifest says what it is now.
    shutil.copyfile(_clip(make_clip, "mjpeg"), dataset / "train" / "bowling" / "b_garbage.mp4")
    (dataset / "val" / "abseiling" / "c_vp8.webm").unlink()
    new = dataset / "val" / "abseiling" / "e_new.webm"
    shutil.copyfile(_clip(make_clip, "vp9"), new)
    summary = scan(dataset, device="gpu", workers=1, progress=False)
    assert (summary.probed, summary.removed, summary.total) == (2, 1, 6)
    routes = _routes(summary.manifest_path, "cpu")
    assert routes["b_garbage.mp4"] == ("dali", "")
    assert "c_vp8.webm" not in routes and routes["e_new.webm"] == ("dali", "")


def test_hang_and_crash_cost_one_file_each(dataset, make_clip):
    for name in ("stuck.mp4", "boom.mp4"):
        shutil.copyfile(_clip(make_clip, "h264"), dataset / "train" / "bowling" / name)
    with probe_faults({"stuck*": "hang", "boom*": "crash"}):
        summary = scan(dataset, device="gpu", workers=2, progress=False, timeout_s=2.0)
    routes = _routes(summary.manifest_path, "gpu")
    assert routes["stuck.mp4"] == ("bad", "timeout")
    assert routes["boom.mp4"] == ("bad", "crash")
    assert routes["a_h264.mp4"] == ("dali", "")
    assert summary.files == {"dali": 3, "fallback": 2, "bad": 3}

    # A hang or crash keeps its verdict while the file is unchanged, so that every job sees the
    # same videos; the summary says so, and an explicit --retry-bad probes exactly those two again.
    kept = scan(dataset, device="gpu", workers=1, progress=False)
    assert (kept.probed, kept.transient) == (0, 2)
    assert "2 file(s) are bad because their probe timed out, crashed or raised" in kept.format()
    assert "daliload scan --retry-bad" in kept.format()
    assert _routes(summary.manifest_path, "gpu")["stuck.mp4"] == ("bad", "timeout")
    again = scan(dataset, device="gpu", workers=1, progress=False, retry_bad=True)
    assert again.probed == 3 and again.transient == 0  # the two, and the garbage file (bad too)
    assert _routes(summary.manifest_path, "gpu")["stuck.mp4"] == ("dali", "")
    assert scan(dataset, device="gpu", workers=1, progress=False).probed == 0

    # A fixed file (the file rewritten) is probed again and recovers.
    for name in ("stuck.mp4", "boom.mp4"):
        shutil.copyfile(_clip(make_clip, "vp9"), dataset / "train" / "bowling" / name)
    assert scan(dataset, device="gpu", workers=1, progress=False).probed == 2
    assert _routes(summary.manifest_path, "gpu")["boom.mp4"] == (
        "fallback",
        "vp9 frame size 128x96 outside DALI on gpu (NVDEC hopper: H100, H200, GH200) limits 128x128..8192x8192",
    )


_KILLABLE_SCAN = textwrap.dedent("""
    import sys
    from daliload.prescreen import scan
    from daliload.testing import probe_faults
    with probe_faults({"*": "slow"}):  # 0.2 s per file: 24 files take ~5 s
        scan(sys.argv[1], manifest_path=sys.argv[2], device="cpu", workers=1, chunk_size=3,
             progress=False)
""")

#: ``python -c SLOW_CLI scan ...`` is ``daliload scan ...`` whose every probe takes a while (0.2 s a file).
SLOW_CLI = textwrap.dedent("""
    import sys
    from daliload.cli import main
    from daliload.testing import probe_faults
    with probe_faults({"*": "slow"}):
        sys.exit(main(sys.argv[1:]))
""")


def _committed(manifest_path: Path) -> int:
    try:
        conn = sqlite3.connect(f"file:{manifest_path}?mode=ro", uri=True, timeout=5)
        try:
            return conn.execute("SELECT COUNT(*) FROM files").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.OperationalError:  # not created yet
        return 0


def test_scan_killed_midway_resumes_to_the_same_manifest(tmp_path, make_clip):
    root = tmp_path / "many"
    codecs = ["h264", "vp9", "mpeg4", "mjpeg"]
    for i in range(24):
        path = (
            root
            / "train"
            / f"class{i % 3}"
            / f"clip{i:02d}.{'webm' if codecs[i % 4] == 'vp9' else 'mp4'}"
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_clip(make_clip, codecs[i % 4]), path)

    killed = tmp_path / "killed.sqlite"
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLABLE_SCAN, str(root), str(killed)],
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while _committed(killed) < 6:
            assert proc.poll() is None, "the scan ended before it could be killed"
            assert time.monotonic() < deadline, "no chunk committed within 60 s"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the scan, its forkserver and its worker
        proc.wait()
    partial = _committed(killed)
    assert 6 <= partial < 24

    resumed = scan(
        root, manifest_path=killed, device="cpu", workers=2, splits=("train",), progress=False
    )
    assert (resumed.probed, resumed.reused) == (24 - partial, partial)

    clean = tmp_path / "clean.sqlite"
    scan(root, manifest_path=clean, device="cpu", workers=2, splits=("train",), progress=False)
    assert _tables(killed) == _tables(clean)
    assert len(_tables(clean)["files"]) == 24


def test_scan_of_records_and_its_argument_errors(dataset, tmp_path):
    records = list(load_index(dataset, "val").records)
    path = tmp_path / "val.sqlite"
    summary = scan(
        records, manifest_path=path, device="cpu", workers=0, splits=("val",), progress=False
    )
    assert (summary.total, summary.splits) == (2, ("val",))
    assert _routes(path, "cpu") == {"c_vp8.webm": ("dali", ""), "d_mjpeg.avi": ("dali", "")}

    with pytest.raises(
        ValueError, match=r"manifest_path is required when scanning a list of records"
    ):
        scan(records, device="cpu", splits=("val",))
    with pytest.raises(ValueError, match=r"none of the 2 records is in splits \('train', 'test'\)"):
        scan(records, manifest_path=path, device="cpu", splits=("train", "test"))
    with pytest.raises(ValueError, match=r"device must be 'cpu', 'gpu' or 'gpu:<generation>' .* got 'cuda'"):
        scan(dataset, device="cuda")
    with pytest.raises(ValueError, match=r"workers must be an int >= 0, got -1"):
        scan(dataset, device="cpu", workers=-1)
    bad_label = [
        VideoRecord(records[0].path, 0, "x", "val"),
        VideoRecord(records[1].path, 0, "y", "val"),
    ]
    with pytest.raises(ValueError, match=r"label 0 names two classes: 'x' and 'y'"):
        scan(bad_label, manifest_path=path, device="cpu", splits=("val",))


def test_missing_splits_are_skipped_but_not_all(dataset, tmp_path):
    summary = scan(dataset, device="cpu", workers=0, splits=("train", "test"), progress=False)
    assert summary.splits == ("train",)
    with pytest.raises(FileNotFoundError, match=r"none of the splits \['test'\] found under"):
        scan(dataset, device="cpu", workers=0, splits=("test",), progress=False)


@pytest.mark.dali
def test_deep_scan_reroutes_and_is_remembered(dataset, realclips):
    pytest.importorskip("nvidia.dali")
    shutil.copyfile(
        realclips / "decord/corrupted.mp4", dataset / "train" / "bowling" / "corrupted.mp4"
    )
    cheap = scan(dataset, device="cpu", workers=2, progress=False)
    assert _routes(cheap.manifest_path, "cpu")["corrupted.mp4"] == (
        "fallback",
        "DALI on cpu has no h264 decoder",
    )

    deep = scan(dataset, device="cpu", deep=True, workers=2, progress=False)
    assert deep.probed == 7  # not yet deep-checked on cpu
    routes = _routes(deep.manifest_path, "cpu")
    # Its first 28 of 50 frames decode: kept at that length, so that no window reaches the damage.
    assert routes["corrupted.mp4"][0] == "fallback"
    assert routes["corrupted.mp4"][1].startswith("deep: the end does not decode (decode failed: InvalidDataError")
    assert routes["a_vp9.webm"] == ("dali", "") and routes["a_h264.mp4"][0] == "fallback"
    with Manifest(deep.manifest_path) as manifest:
        checked = {Path(e.path).name: e.deep_checked for e in manifest.entries(device="cpu")}
        assert all(checked.values())
        assert not any(e.deep_checked for e in manifest.entries(device="gpu"))
        assert {Path(e.path).name: e.num_frames for e in manifest.entries(device="cpu")}["corrupted.mp4"] == 28

    assert scan(dataset, device="cpu", deep=True, workers=2, progress=False).probed == 0
    assert (
        scan(dataset, device="cpu", workers=2, progress=False).probed == 0
    )  # keeps the deep routes
    assert _routes(deep.manifest_path, "cpu")["corrupted.mp4"][0] == "fallback"
    # The GPU's deep check decodes on the GPU: without one it is refused, not half done.
    with pytest.raises(ValueError, match="decodes on the GPU, and torch sees no CUDA GPU"):
        scan(dataset, device="gpu", deep=True, workers=2, progress=False)
    assert _routes(deep.manifest_path, "cpu")["corrupted.mp4"][0] == "fallback"  # nothing touched


def test_cli_scan_prints_a_summary_and_writes_json(dataset, tmp_path, capsys):
    out = tmp_path / "files.json"
    manifest_path = tmp_path / "m.sqlite"
    rc = main(
        [
            "scan",
            str(dataset),
            "--device",
            "cpu",
            "--workers",
            "1",
            "--quiet",
            "--split",
            "train",
            "--manifest",
            str(manifest_path),
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert f"manifest: {manifest_path}" in printed
    assert "| dali | 1 | 0.00 |" in printed and "| fallback | 2 | 0.00 |" in printed
    assert "| fallback | DALI on cpu has no h264 decoder | 1 |" in printed
    rows = json.loads(out.read_text())
    assert [tuple(row) for row in rows] == [(*JSON_FIELDS, "routed_for")] * 4
    assert {row["routed_for"] for row in rows} == {"cpu"}
    assert {Path(row["path"]).name: row["route"] for row in rows} == {
        "a_h264.mp4": "fallback",
        "a_vp9.webm": "dali",
        "b_mpeg4.avi": "fallback",
        "b_garbage.mp4": "bad",
    }
    vp9 = next(row for row in rows if row["codec"] == "vp9")
    assert (vp9["num_frames"], vp9["fps"], vp9["width"], vp9["height"], vp9["pix_fmt"]) == (
        30,
        30.0,
        128,
        96,
        "yuv420p",
    )


def test_readers_refuse_missing_or_foreign_manifests(tmp_path):
    missing = tmp_path / "none.sqlite"
    with pytest.raises(
        FileNotFoundError, match=r"no manifest at .*none.sqlite; create it with `daliload scan"
    ):
        Manifest(missing)
    old = tmp_path / "old.sqlite"
    Manifest(old, writable=True).close()
    conn = sqlite3.connect(old)
    conn.execute("UPDATE meta SET value = '0' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    with pytest.raises(
        ValueError,
        match=rf"schema version 0, this daliload reads version {SCHEMA_VERSION}: "
        r"re-run `daliload scan`",
    ):
        Manifest(old)
    Manifest(old, writable=True).close()  # the scanner rebuilds it
    with Manifest(old) as manifest:
        assert len(manifest) == 0
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not a database" * 100)
    with pytest.raises(ValueError, match=r"junk.sqlite exists but is not an SQLite manifest"):
        Manifest(junk, writable=True)


def test_changed_rules_reroute_stored_facts_without_probing(dataset):
    summary = scan(dataset, device="cpu", workers=0, progress=False)
    conn = sqlite3.connect(summary.manifest_path)
    conn.execute("UPDATE routes SET route = 'bad', reason = 'stale' WHERE device = 'gpu'")
    conn.execute("UPDATE meta SET value = '0' WHERE key = 'rules_version'")
    conn.commit()
    conn.close()
    again = scan(dataset, device="cpu", workers=0, progress=False)
    assert again.probed == 0
    assert {name: route for name, (route, _) in _routes(summary.manifest_path, "gpu").items()} == {
        name: pair[0] for name, pair in EXPECTED.items()
    }


def test_default_manifest_path_falls_back_to_a_user_cache(tmp_path, monkeypatch):
    root = tmp_path / "ro_dataset"
    root.mkdir()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    path = default_manifest_path(root)
    assert path.parent == tmp_path / "cache" / "daliload" / "manifests"
    assert path.name.startswith("ro_dataset-") and path.suffix == ".sqlite"
    assert default_manifest_path(str(root) + "/") == path
    assert default_manifest_path(tmp_path / "other") != path


def test_dist_reads_the_environment_without_a_process_group(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert (runtime.rank(), runtime.world_size(), runtime.local_rank(), runtime.is_distributed()) == (
        3,
        8,
        1,
        False,
    )
    runtime.barrier()  # no process group: returns at once
    assert runtime.broadcast_object({"a": 1}) == {"a": 1}
    monkeypatch.setenv("RANK", "zero")
    with pytest.raises(ValueError, match=r"environment variable RANK='zero' is not an integer"):
        runtime.rank()
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name)
    assert (runtime.rank(), runtime.world_size(), runtime.local_rank()) == (0, 1, 0)


def _ddp_rank(rank: int, world: int, init_file: str, root: str, out_dir: str) -> None:
    """One rank of the ensure_manifest test (module-level for torch.multiprocessing.spawn)."""
    import importlib

    import torch.distributed as torch_dist

    scan_module = importlib.import_module("daliload.prescreen.ensure")  # the module that calls scan()

    # The default group gives up after 3 s; rank 0's scan takes longer than that, as a
    # first scan of a real dataset outlasts NCCL's default 10 minutes.
    torch_dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
        timeout=timedelta(seconds=3),
    )
    calls = []
    real_scan = scan_module.scan

    def counting_scan(*args, **kwargs):
        calls.append(args[0])
        time.sleep(5)
        return real_scan(*args, **kwargs)

    scan_module.scan = counting_scan
    result = {"rank": runtime.rank(), "world": runtime.world_size()}
    result["path"] = str(ensure_manifest(root, device="cpu", scan=ScanSpec(workers=1), progress=False))
    try:
        ensure_manifest(
            os.path.join(root, "nope"), device="cpu", scan=ScanSpec(manifest_path=result["path"], workers=0)
        )
    except (RuntimeError, FileNotFoundError) as err:
        result["error"] = f"{type(err).__name__}: {err}"
    result["scans"] = len(calls)
    with Manifest(result["path"]) as manifest:
        result["entries"] = len(manifest.entries(device="cpu"))
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    torch_dist.destroy_process_group()


def test_ensure_manifest_scans_on_rank_0_only(dataset, tmp_path):
    import torch.multiprocessing as torch_mp

    out = tmp_path / "ranks"
    out.mkdir()
    torch_mp.spawn(
        _ddp_rank, args=(2, str(tmp_path / "init"), str(dataset), str(out)), nprocs=2, join=True
    )
    results = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["rank"] for r in results] == [0, 1] and all(r["world"] == 2 for r in results)
    assert results[0]["path"] == results[1]["path"] == str(default_manifest_path(dataset))
    assert [r["scans"] for r in results] == [1, 0]  # rank 0 scanned the good root (the bad one is refused first)
    assert [r["entries"] for r in results] == [6, 6]
    assert results[0]["error"].startswith("FileNotFoundError: ")
    assert (
        results[1]["error"].startswith("RuntimeError: rank 0 failed to scan ")
        and "nope" in results[1]["error"]
    )


def test_concurrent_ensure_manifest_calls_take_turns(small_kinetics, tmp_path):
    """Processes without a process group (e.g. ranks before init) never scan one manifest at once."""
    import subprocess
    import sys

    manifest = tmp_path / "m.sqlite"
    code = ("import sys; from daliload.prescreen import ScanSpec, ensure_manifest; "
            "ensure_manifest(sys.argv[1], device='cpu', scan=ScanSpec(sys.argv[2], workers=0), progress=False)")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(small_kinetics), str(manifest)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(3)]
    for proc in procs:
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out[-3000:]
    from daliload.prescreen import Manifest

    with Manifest(manifest) as m:
        entries = m.entries("train", device="cpu")
        assert len(entries) == len({e.path for e in entries}) > 0
        assert m.last_scan["probed"] == 0  # the last one to get the lock found everything done
    assert (tmp_path / "m.sqlite.lock").exists()


def test_probes_in_batches_give_each_file_its_own_verdict(tmp_path, make_clip, monkeypatch, caplog):
    """Cheap probes travel 10 to a task here; a batch that hangs, crashes or raises costs only its culprit."""
    import logging

    root = tmp_path / "many"
    folder = root / "train" / "juggling"
    folder.mkdir(parents=True)
    for i in range(40):
        shutil.copyfile(_clip(make_clip, "h264"), folder / f"clip{i:02d}.mp4")
    for name in ("stuck", "boom", "oops"):
        shutil.copyfile(_clip(make_clip, "h264"), folder / f"{name}.mp4")
    with caplog.at_level(logging.INFO, logger="daliload.prescreen.probe_pool"), \
            probe_faults({"stuck*": "hang", "boom*": "crash", "oops*": "raise"}):
        summary = scan(root, manifest_path=tmp_path / "m.sqlite", device="cpu", workers=1, splits=("train",),
                       progress=False, timeout_s=3.0)
    routes = _routes(tmp_path / "m.sqlite", "cpu")
    assert routes["stuck.mp4"] == ("bad", "timeout") and routes["boom.mp4"] == ("bad", "crash")
    assert routes["oops.mp4"] == ("bad", "probe error: RuntimeError: test fault on oops.mp4")
    assert all(route == ("fallback", "DALI on cpu has no h264 decoder")
               for name, route in routes.items() if name.startswith("clip"))
    assert summary.probed == 43 and summary.transient == 3
    # The hang and the crash each failed their batch, whose files were then probed one by one.
    assert sum("probes: timeout" in r.message or "probes: crash" in r.message for r in caplog.records) == 2


def test_a_cut_file_is_read_to_its_last_good_frame_after_a_deep_scan(tmp_path, make_clip, cut_stream):
    """Through the loader, with evaluation views (the last one ends at the video's last frame): without
    --deep the view that reaches a cut stream's damaged last frame fails at run time; after a deep scan the
    file is kept at the length that decodes, nothing fails, and every frame is where the plan says."""
    from daliload import KineticsDALILoader
    from daliload.framecode import read_code
    from daliload.loader import DecodeSpec
    from daliload.plan import AugmentSpec, OutputSpec

    root = tmp_path / "kinetics"
    for cls in ("a", "b"):
        (root / "val" / cls).mkdir(parents=True)
        shutil.copyfile(make_clip("h264", num_frames=60, gop=10, class_id=1), root / "val" / cls / "whole.mp4")
    cut = root / "val" / "a" / "cut.ts"
    shutil.copyfile(cut_stream[0], cut)

    def evaluate(deep: bool) -> tuple[list[str], int]:
        """(the files that failed, the cut file's length in the index)"""
        shutil.rmtree(root / ".daliload", ignore_errors=True)
        loader = KineticsDALILoader(
            root, "val", batch_size=3, clip_len=8, frame_stride=2, views=(3, 1), scan=ScanSpec(deep=deep),
            device="cpu", augment=AugmentSpec(crop_size=(96, 128), crop_mode="center", flip_prob=0.0),
            output=OutputSpec(size=(96, 128), mean=(0, 0, 0), std=(1, 1, 1), dtype="float32"),
            decode=DecodeSpec(max_failure_fraction=1.0, fallback_workers=1))
        try:
            frames = {v.path: v.num_frames for v in loader.videos}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for (videos, labels), batch in zip(loader, loader.plan()):  # videos: (B, V, C, T, H, W)
                    for j, sample in enumerate(batch):
                        clip = videos[j // 3, j % 3]
                        if labels[j // 3] >= 0:
                            codes = [read_code(clip[:, t], layout="CHW").index for t in range(clip.shape[1])]
                            assert codes == sample.frame_indices(frames[sample.path]), sample.path
            return [Path(f.path).name for f in loader.stats().failures], frames[str(cut)]
        finally:
            loader.close()

    failed, probed = evaluate(deep=False)
    assert probed == cut_stream[1] and failed == ["cut.ts"]  # its last view reaches the damaged frame
    failed, kept = evaluate(deep=True)
    assert failed == [] and kept == probed - 1  # every view decodes; every frame before the damage is used


def test_a_process_waiting_for_another_ones_scan_says_whose_and_how_far(dataset, tmp_path):
    """A second process of the same root waits for the first one's scan and says, every so often, which
    process it waits for and how many files that one has probed; then it uses the manifest as it is."""
    import daliload.prescreen.scan_lock as scan_lock

    manifest = tmp_path / "m.sqlite"
    code = textwrap.dedent("""
        import sys
        import daliload.prescreen.scan_lock as scan_lock
        from daliload.prescreen import ScanSpec, ensure_manifest
        from daliload.testing import probe_faults
        scan_lock.FIRST_REPORT_S, scan_lock.REPORT_EVERY_S = 0.3, 0.5
        with probe_faults({"*": "slow"}):  # each probe takes a while: the first scan lasts a few seconds
            ensure_manifest(sys.argv[1], device="cpu", scan=ScanSpec(sys.argv[2], workers=1), progress=True)
    """)
    first = subprocess.Popen([sys.executable, "-c", code, str(dataset), str(manifest)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    # The first is stopped once it holds the turn, so the second meets it however long the second's start
    # takes on a busy machine (it once found the scan over: "finished after 0 s", no waiting line).
    deadline = time.monotonic() + 60
    while scan_lock.read_note(scan_lock.lock_path(manifest)) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    with _stopped(first):
        second = subprocess.Popen([sys.executable, "-c", code, str(dataset), str(manifest)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        waiting = _read_until(second.stderr, b"daliload: waiting for the scan of", b"\n")
    _, second_err = second.communicate(timeout=120)
    out, _ = first.communicate(timeout=120)
    out, second_stderr = out.decode(errors="replace"), (waiting + second_err).decode(errors="replace")
    assert first.returncode == 0 and second.returncode == 0, out[-2000:] + second_stderr[-2000:]
    waits = [line for line in second_stderr.splitlines() if line.startswith("daliload: waiting for the scan of")]
    assert waits, second_stderr[-2000:]
    assert f"{dataset} by pid {first.pid} on " in waits[0]
    assert any(re.search(r": \d+ of 6 files probed$", line) for line in waits), waits
    assert "finished after" in second_stderr and "scan cpu" not in second_stderr  # it probed nothing itself


@contextlib.contextmanager
def _stopped(process: subprocess.Popen):
    """``process`` stopped (SIGSTOP) for the block, so another process meets it in its scan turn whatever their
    speeds; it goes on (SIGCONT) when the block ends, or after 120 s should the block hang (say a second process
    that never says it waits), so the test fails rather than hangs."""
    resume = threading.Timer(120, lambda: process.poll() is None and process.send_signal(signal.SIGCONT))
    process.send_signal(signal.SIGSTOP)
    resume.start()
    try:
        yield
    finally:
        resume.cancel()
        if process.poll() is None:
            process.send_signal(signal.SIGCONT)


def _read_until(stream, marker: bytes, then: bytes = b"") -> bytes:
    """What ``stream`` gives up to and with ``marker`` (and the first ``then`` after it), or all it gave before
    it closed."""
    seen = b""
    while marker not in seen or then not in seen[seen.index(marker) + len(marker):]:
        chunk = stream.read1(4096)
        if not chunk:
            break
        seen += chunk
    return seen


def test_two_daliload_scans_of_one_root_take_turns_and_the_second_probes_nothing(small_kinetics, tmp_path):
    """The second `daliload scan` waits for the first one's (saying for which process), then finds every file
    probed. The first is stopped (SIGSTOP) while it holds the turn, so the second meets it whatever the speeds."""
    root = tmp_path / "k"
    shutil.copytree(small_kinetics, root, ignore=shutil.ignore_patterns(".daliload"))
    total = len(load_index(root, "train")) + len(load_index(root, "val"))
    command = [sys.executable, "-c", SLOW_CLI, "scan", str(root), "--device", "cpu", "--workers", "1",
               "--timeout", "600"]  # slow probes: the first is still probing when it is stopped
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    started = _read_until(first.stderr, b"scan cpu")  # its progress bar: it is probing, in its turn
    assert b"scan cpu" in started, started.decode(errors="replace")[-2000:]
    with _stopped(first):
        second = subprocess.Popen(command + ["--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        waiting = _read_until(second.stderr, b"daliload: waiting for the scan of", b"\n").decode()
    second_out, second_err = second.communicate(timeout=300)
    first_out, first_err = first.communicate(timeout=300)
    second_err = waiting + second_err.decode()
    assert first.returncode == 0 and second.returncode == 0, first_err.decode()[-2000:] + second_err[-2000:]
    assert f"daliload: waiting for the scan of {root} by pid {first.pid} on " in second_err, second_err[-2000:]
    assert f"the scan of {root} by another process finished after " in second_err
    probed = [re.search(r"^files: (\d+) \((\d+) probed, (\d+) unchanged", out.decode(), re.M).groups()
              for out in (first_out, second_out)]
    assert probed == [(str(total), str(total), "0"), (str(total), "0", str(total))]


def test_a_file_system_without_flock_stops_the_scan_naming_the_lock_file_and_the_fix(small_kinetics, tmp_path,
                                                                                      monkeypatch):
    import errno
    import fcntl

    from daliload.prescreen import scan_lock

    def no_flock(fd, how):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    manifest = tmp_path / "manifest.sqlite"
    with pytest.raises(OSError, match=r"cannot take the scan lock .*manifest\.sqlite\.lock: Function not implemented\. "
                                      r"This file system gives no flock \(Lustre: mount with -o flock") as info:
        with scan_lock.scan_lock(manifest, small_kinetics, job=None, progress=False):
            pass
    assert info.value.errno == errno.ENOSYS
