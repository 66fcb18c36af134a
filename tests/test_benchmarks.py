"""The benchmark harness: a tiny end-to-end run, the peers' decoding, the NVDEC proof and ceiling.

The GPU visit's wheel handling and plan are tested in test_gpu_visit.py."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks import harness
from benchmarks.datasets import (BenchVideo, Dataset, DatasetSpec, kinetics_layout, loader_order, prepare_dataset,
                                 probe_keyframes)
from benchmarks.loaders import LOADERS, LoadedBatch, LoaderConfig, load_adapter
from benchmarks.measure import _check_batch
from benchmarks.metrics import summarize
from benchmarks.task import PlanDataset, TaskSpec, from_start_decode_estimate, make_plan, seek_decode_estimate
from daliload.framecode import read_code
from daliload.dataset import load_index
from daliload.options import DecodeSpec
from daliload.plan import CropBox, Sample

REPO = Path(__file__).resolve().parents[1]
CPU_CONFIG = LoaderConfig(task=TaskSpec(batch_size=2), workers=0, device="cpu")


def _available(name: str) -> str | None:
    """None if the peer runs here, else why not."""
    return load_adapter(name).probe(CPU_CONFIG)


@pytest.fixture(scope="module")
def tiny_dataset(tmp_path_factory):
    spec = DatasetSpec(name="h264-gop250", codec="h264", width=128, height=96, gop=250, num_clips=3,
                       duration_s=2.1)
    return prepare_dataset(spec, tmp_path_factory.mktemp("bench-data"), workers=1)


def test_smoke_run_reports_every_peer(tmp_path):
    from benchmarks.summary import README_BEGIN, README_END

    results, md, readme = tmp_path / "results", tmp_path / "RESULTS.md", tmp_path / "README.md"
    readme.write_text(f"# x\n\n## Speed\n\n{README_BEGIN}\nold table 1.0\n{README_END}\n\nNotes (2026-01-01).\n")
    front = tmp_path / "FRONT.md"
    front.write_text("# p\n\n<!-- speed-headline:begin: by code -->\nold headline\n<!-- speed-headline:end -->\n")
    code = harness.main([
        "--device", "cpu", "--datasets", "h264-gop250", "--clips", "3", "--duration", "2.1", "--size", "128x96",
        "--batch-size", "2", "--workers", "0", "--no-sweeps", "--runs", "1", "--warmup", "0",
        "--data-dir", str(tmp_path / "data"), "--results-dir", str(results), "--results-md", str(md),
        "--readme", str(readme), "--headline", str(front), "--profile-clips", "2",
        "--name", "smoke", "--machine", "test machine", "--timeout", "120"])
    assert code == 0
    result = json.loads((results / "smoke.json").read_text())
    # The README's speed section is the run's, between the markers; the hand notes after them stay.
    text = readme.read_text()
    assert "old table" not in text and text.endswith(f"{README_END}\n\nNotes (2026-01-01).\n")
    assert "Generated from run `smoke`" in text and "| daliload fallback alone | ceiling files/s |" in text
    assert "| `h264-gop250`: 128x96 h264, keyframe every 250 | 3 x 2.1 s |" in text
    assert "fallback alone / GOP-bound limit on `h264-gop250`" in text
    # The front page's headline: daliload against the best peer, from the same run.
    front_text = front.read_text()
    assert "old headline" not in front_text and "by run `smoke` of `python -m benchmarks`" in front_text
    best = result["round_ratios"]["h264-gop250"]["best_peer"]
    assert best not in ("daliload", "daliload-static", "daliload-fallback")
    assert "| `h264-gop250` | " in front_text and f"| `{best}`, " in front_text
    assert "| >= 1.3: " in front_text  # the dataset's target against the best peer, judged in its row
    # The fallback's stage profile, and the GOP-bound limit with the loader's ratios.
    profile = result["profiles"]["h264-gop250"]
    assert profile["clips"] == 2 and profile["total_ms"] > 0 and profile["ms_per_clip"]["decode"] > 0
    targets = result["targets"]["h264-gop250"]
    assert targets["path"] == "daliload-fallback" and targets["fallback_over_limit"] > 0

    machine = result["machine"]
    assert machine["label"] == "test machine" and machine["cpu_cores"] >= 1 and machine["date_utc"]
    assert "torch" in machine["versions"] and "av" in machine["versions"]
    assert machine["package_commit"]  # the package commit measured (tests/test_bench_commit.py)
    assert result["settings"]["batch_size"] == 2 and result["settings"]["clip_len"] == 16
    (dataset,) = result["datasets"]
    assert dataset["num_clips"] == 3 and dataset["total_frames"] == 189  # 3 x 2.1 s at 30 fps

    by_loader = {m["loader"]: m for m in result["measurements"]}
    ceiling = by_loader["ceiling-pyav"]
    assert ceiling["status"] == "ok" and ceiling["workers"] == 1  # as many processes as the loaders' workers
    assert ceiling["runs"][0]["frames_decoded"] == 189  # every frame of the 3 files
    assert ceiling["figures"]["ratio_clips"] == pytest.approx(1.0)
    for name in LOADERS:
        if load_adapter(name).sweep_only:  # the workers sweep's row (daliload-workers): not in the main table
            assert name not in by_loader
            continue
        m = by_loader[load_adapter(name).name]
        if m["status"] == "ok":
            figures = m["figures"]
            assert figures["clips_per_s"]["median"] > 0 and figures["peak_rss_mb"] > 0
            assert figures["ratio_clips"] > 0
            assert m["runs"][0]["clips"] == 3
        else:
            assert m["status"] == "unavailable", (name, m["status"], m["reason"])
            assert m["reason"]
    # The GPU-only peers say why they did not run on a CPU run.
    assert "GPU only" in by_loader["dali-readers-video"]["reason"]
    assert "GPU only" in by_loader["daliload-dali-gpu"]["reason"]
    assert by_loader["daliload-dali-cpu"]["reason"] == "does not decode h264 (decodes vp8, vp9, mjpeg)"
    # daliload's fallback decodes only up to each window's end: fewer frames than whole files.
    fallback = by_loader["daliload-fallback"]
    assert fallback["status"] == "ok" and fallback["figures"]["frames_counted"] is True
    assert 0 < fallback["runs"][0]["frames_decoded"] < 189
    # The whole loader planned the run's windows itself (it refuses to run otherwise).
    whole = by_loader["daliload"]
    assert whole["status"] == "ok" and whole["plan_windows"] is True and whole["runs"][0]["clips"] == 3
    # On the CPU every H.264 clip goes through its fallback: the loader's own count, not an estimate.
    assert whole["figures"]["frames_counted"] is True
    assert whole["runs"][0]["frames_decoded"] == fallback["runs"][0]["frames_decoded"]
    # The blog approach decodes whole files: 30 frames per clip, 30 - 8 distinct used frames wasted.
    blog = by_loader["blog-pyav"]
    assert blog["status"] == "ok" and blog["runs"][0]["frames_decoded"] == 189
    assert blog["figures"]["frames_counted"] is True

    text = md.read_text()
    assert "test machine" in text and "| dataset | loader | workers | clips/s |" in text
    assert "dali-readers-video`: unavailable: GPU only" in text
    for plot in result["plots"]:
        assert Path(plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if result["plots"]:  # matplotlib installed: the loaders' plot, and no scaling plot without the workers sweep
        assert [Path(p).name for p in result["plots"]] == ["smoke-loaders.png"]


def test_report_from_rebuilds_the_table(tmp_path):
    result = {
        "name": "x", "machine": {"label": "m", "cpu_model": "cpu", "cpu_cores": 2, "cpu_cores_usable": 2,
                                 "memory_gib": 1, "gpu": None, "python": "3", "versions": {},
                                 "date_utc": "2026-01-01 00:00 UTC"},
        "settings": {"device": "cpu", "workers": 2, "sweep_workers": [], "sweep_dataset": "h264-gop250",
                     "runs": 1, "warmup": 0, "clip_len": 16, "frame_stride": 4, "crop_size": 224,
                     "short_side_range": [256, 320], "flip_prob": 0.5, "batch_size": 8, "seed": 0},
        "datasets": [], "ceiling_used": "ceiling-pyav", "plots": [],
        "measurements": [{"loader": "decord-cpu", "kind": "loader", "dataset": "vp9", "workers": 2,
                          "sweep": "main", "status": "unavailable", "reason": "decord does not import",
                          "plan_windows": True, "knob": "DataLoader workers", "figures": None}],
    }
    path = tmp_path / "x.json"
    path.write_text(json.dumps(result))
    md = tmp_path / "R.md"
    assert harness.main(["--report-from", str(path), "--results-md", str(md), "--readme", str(tmp_path / "README.md"),
                         "--no-plots"]) == 0
    assert "- `decord-cpu`: unavailable: decord does not import" in md.read_text()


def test_results_md_keeps_the_newest_run_of_each_name(tmp_path):
    from benchmarks.report import append_markdown

    md = tmp_path / "RESULTS.md"
    md.write_text("# Results\n\n## Loaders\n\n### CPU run `cpu` — old machine\n\nold table\n\n"
                  "## Fallback\n\nfallback table\n")
    append_markdown(md, "### CPU run `cpu` — new machine\n\nnew table\n")
    assert md.read_text() == ("# Results\n\n## Loaders\n\n### CPU run `cpu` — new machine\n\nnew table\n\n"
                              "## Fallback\n\nfallback table\n")
    append_markdown(md, "### CUDA run `gpu` — a GPU\n\ngpu table\n")  # another name: appended
    assert md.read_text().endswith("fallback table\n\n### CUDA run `gpu` — a GPU\n\ngpu table\n")


def test_a_small_benchmark_publishes_its_json_section_and_readme_figures(tmp_path, capsys):
    import argparse
    import json

    from benchmarks.report import add_output_options, publish_run

    parser = argparse.ArgumentParser()
    add_output_options(parser, "thing")
    parser.add_argument("--readme")
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\n<!-- thing:begin (written by code) -->\nold figures\n<!-- thing:end -->\n\nrest\n")
    args = parser.parse_args(["--json", str(tmp_path / "r" / "thing.json"), "--results-md", str(tmp_path / "R.md"),
                              "--readme", str(readme)])
    result = {"name": "thing", "speed": 3}
    publish_run(result, args, "### CPU run `thing` — here\n\nthe table\n", chapter="## Things",
                marker="thing", figures=lambda r: f"speed {r['speed']}")
    assert json.loads((tmp_path / "r" / "thing.json").read_text()) == result
    assert "## Things\n" in (tmp_path / "R.md").read_text() and "the table" in (tmp_path / "R.md").read_text()
    assert readme.read_text() == "# x\n\n<!-- thing:begin (written by code) -->\nspeed 3\n<!-- thing:end -->\n\nrest\n"

    bare = tmp_path / "BARE.md"
    bare.write_text("no markers\n")
    args = parser.parse_args(["--json", str(tmp_path / "t.json"), "--no-md", "--readme", str(bare)])
    publish_run(result, args, "section\n", chapter="## Things", marker="thing", figures=lambda r: "figures")
    assert bare.read_text() == "no markers\n" and f"{bare} has no thing markers" in capsys.readouterr().out
    assert (tmp_path / "t.json").exists()


@pytest.mark.parametrize("peer", ["blog-pyav", "torchcodec-cpu", "torchcodec-cpu-approx", "decord-cpu"])
def test_peer_decodes_the_planned_frames(make_clip, peer):
    reason = _available(peer)
    if reason:
        pytest.skip(reason)
    path = str(make_clip("h264", num_frames=90))
    indices = [3, 7, 40, 80, 89, 89]
    frames, decoded = load_adapter(peer).decode(path, indices)
    frames = np.asarray(frames)
    assert frames.shape == (6, 96, 128, 3) and frames.dtype == np.uint8
    assert [read_code(f).index for f in frames] == indices
    assert decoded == (90 if peer == "blog-pyav" else None)


def test_peers_give_the_same_clip_for_the_same_sample(tiny_dataset):
    task = TaskSpec(batch_size=2, seed=3)
    samples = make_plan(tiny_dataset.videos, task)
    num_frames = [v.num_frames for v in tiny_dataset.videos]
    peers = [name for name in ("blog-pyav", "torchcodec-cpu", "decord-cpu") if _available(name) is None]
    clips = {name: PlanDataset(samples, num_frames, load_adapter(name).decode, task.output)[1][0] for name in peers}
    reference = clips["blog-pyav"]
    assert tuple(reference.shape) == (3, 16, 224, 224)
    for name, clip in clips.items():
        diff = (clip.float() - reference.float()).abs()
        assert diff.mean() < 0.01, name  # same decoded pixels, same transform


# --- daliload's own adapters -------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_vp9(tmp_path_factory):
    spec = DatasetSpec(name="vp9", codec="vp9", width=128, height=96, gop=250, num_clips=3, duration_s=2.1)
    return prepare_dataset(spec, tmp_path_factory.mktemp("bench-vp9"), workers=1)


def _readable_plan(dataset, task):
    """The run's plan with crops that keep the frame-code strip (the top rows, full width)."""
    samples = make_plan(dataset.videos, task, loader_order(dataset))
    return [dataclasses.replace(s, crop=CropBox.full()) for s in samples]


def _assert_planned_frames(adapter_name, dataset, workers):
    task = TaskSpec(batch_size=2, seed=5)
    samples = _readable_plan(dataset, task)
    assert {s.flip for s in samples} == {True, False}  # both flips are checked
    adapter = load_adapter(adapter_name)(dataset, samples, LoaderConfig(task=task, workers=workers, device="cpu"))
    try:
        batches = list(adapter.epoch())
    finally:
        adapter.close()
    videos = [clip for b in batches for clip in b.videos]
    assert [b.num_clips for b in batches] == [2, 1]
    assert len(videos) == 3 and tuple(videos[0].shape) == (3, 16, 224, 224)
    for clip, sample in zip(videos, samples):
        planned = sample.frame_indices(dataset.videos[sample.video_index].num_frames)
        codes = [read_code(clip[:, t], layout="CHW") for t in range(clip.shape[1])]
        assert [c.index for c in codes] == planned, (adapter_name, sample)
        assert all(c.flipped is sample.flip for c in codes)
    return batches


@pytest.mark.parametrize("codec", ["h264", "vp9"])
def test_daliload_fallback_adapter_decodes_the_planned_frames(tiny_dataset, tiny_vp9, codec):
    dataset = tiny_dataset if codec == "h264" else tiny_vp9
    batches = _assert_planned_frames("daliload-fallback", dataset, workers=0)
    # It counts what it decodes: at least each window's span from frame 0 (GOP 250), never past its end.
    decoded = sum(b.frames_decoded for b in batches)
    assert 3 * 16 <= decoded <= 3 * 63  # 2.1 s at 30 fps: 63 frames


@pytest.mark.parametrize("name", ["daliload", "daliload-static", "daliload-dali-cpu"])
def test_daliload_adapter_runs_its_own_plan_which_is_the_runs(tiny_vp9, name):
    if _available(name):
        pytest.skip(_available(name))
    task = TaskSpec(batch_size=2, seed=5)
    samples = make_plan(tiny_vp9.videos, task, loader_order(tiny_vp9))
    config = LoaderConfig(task=task, workers=1, device="cpu")
    adapter = load_adapter(name)(tiny_vp9, samples, config)
    try:
        # The row named daliload is the loader with its defaults and nothing else (the knob is not passed on);
        # a row with another setting says so in its name.
        # DALI's path alone is the loader pinned to DALI, DALI's threads and the cut processes the knob.
        assert adapter._loader.decode == {
            "daliload": DecodeSpec(), "daliload-static": DecodeSpec(routing="static"),
            "daliload-dali-cpu": DecodeSpec(routing="static", dali_threads=1, fallback_workers=1)}[name]
        batches = list(adapter.epoch())
        stats = adapter.stats()
    finally:
        adapter.close()
    assert [b.num_clips for b in batches] == [2, 1]
    if name != "daliload":
        assert (stats.clips_dali, stats.clips_fallback) == (3, 0)  # VP9 routes to DALI on the CPU
    else:  # the defaults on the CPU: VP9 to the decoder measured faster (DALI, the table's, until measured)
        assert stats.routing == "measured" and stats.clips_dali + stats.clips_fallback == 3
    # Both decoders' frames, as the loader counts them: each window's span at least, never past the file's end.
    assert sum(b.frames_decoded for b in batches) == stats.frames_decoded_dali + stats.frames_decoded_fallback
    assert 3 * 16 <= stats.frames_decoded_dali + stats.frames_decoded_fallback <= 3 * 63
    # Another seed draws other windows: the adapter refuses to time them under the run's name.
    other = make_plan(tiny_vp9.videos, TaskSpec(batch_size=2, seed=6), loader_order(tiny_vp9))
    with pytest.raises(ValueError, match="daliload's own plan differs from the run's plan at position 0"):
        load_adapter("daliload")(tiny_vp9, other, config)


def test_loader_order_is_the_order_daliload_lists_the_layout(tmp_path):
    spec = DatasetSpec(name="f", codec="h264", width=64, height=48, gop=16, num_clips=4, duration_s=1.0)
    videos = []
    for i, label in enumerate([0, 1, 2, 0]):  # files are only listed here, never decoded
        path = tmp_path / f"clip{i:03d}.mp4"
        path.write_bytes(b"x")
        videos.append(BenchVideo(str(path), label, 30, 30.0, 64, 48, (0,), 1))
    dataset = Dataset(spec, str(tmp_path), tuple(videos))
    assert loader_order(dataset) == [0, 3, 1, 2]  # the worked example of its docstring
    index = load_index(kinetics_layout(dataset), "train")
    assert [os.path.realpath(r.path) for r in index.records] == [videos[i].path for i in [0, 3, 1, 2]]
    assert [r.label for r in index.records] == [0, 0, 1, 2]
    assert kinetics_layout(dataset) == tmp_path / "kinetics"  # made once, reused


def test_transform_applies_crop_and_flip():
    import torch

    from benchmarks.task import transform_clip
    from daliload.plan import OutputSpec

    frames = torch.zeros(2, 20, 40, 3, dtype=torch.uint8)
    frames[:, :, :20] = 200  # left half bright
    sample = Sample(position=0, video_index=0, path="x", label=0, start_frame=0, frame_stride=1, clip_len=2,
                    crop=CropBox(0.0, 0.0, 1.0, 1.0), flip=True)
    out = transform_clip(frames, sample, OutputSpec(size=(10, 20), mean=(0, 0, 0), std=(1, 1, 1),
                                                    dtype="float32"))
    assert tuple(out.shape) == (3, 2, 10, 20)
    assert out[0, 0, 5, 0] == 0 and out[0, 0, 5, 19] == 200  # flipped: bright half on the right


def test_seek_decode_estimate_worked_example():
    indices = [252 + 4 * i for i in range(16)]
    clamped = [min(i, 299) for i in indices]
    assert seek_decode_estimate(clamped, [0, 250]) == 50
    assert seek_decode_estimate([10, 14, 18], [0, 250]) == 19
    assert seek_decode_estimate([40, 44], [0, 16, 32, 48]) == 13


def test_dataset_keyframes_follow_the_gop(tmp_path):
    spec = DatasetSpec(name="g", codec="h264", width=64, height=48, gop=16, num_clips=1, duration_s=2.0)
    dataset = prepare_dataset(spec, tmp_path)
    (video,) = dataset.videos
    assert video.num_frames == 60 and video.keyframes == (0, 16, 32, 48)
    assert probe_keyframes(video.path) == (60, (0, 16, 32, 48))
    assert prepare_dataset(spec, tmp_path) == dataset  # cached: read back, not regenerated


def test_dali_whole_file_ceiling_counts_every_frame(tmp_path):
    pytest.importorskip("nvidia.dali")
    from benchmarks.ceiling import DaliWholeFilesCPU

    spec = DatasetSpec(name="v", codec="vp9", width=64, height=48, gop=250, num_clips=5, duration_s=1.0)
    dataset = prepare_dataset(spec, tmp_path)
    ceiling = DaliWholeFilesCPU(dataset, [], LoaderConfig(task=TaskSpec(), workers=1, device="cpu"))
    try:
        for _ in range(2):  # the second epoch checks the pipeline rewinds
            batches = list(ceiling.epoch())
            assert sum(b.num_clips for b in batches) == 5
            assert sum(b.frames_decoded for b in batches) == 150
    finally:
        ceiling.close()


def test_batches_of_the_wrong_shape_are_refused():
    import torch

    batch = LoadedBatch(torch.zeros(2, 3, 8, 224, 224), torch.zeros(2), 2, None)
    with pytest.raises(ValueError, match=r"x: batch has shape \(2, 3, 8, 224, 224\), the task asks for "
                                         r"\(2, 3, 16, 224, 224\)"):
        _check_batch(batch, (3, 16, 224, 224), "x")


def test_unknown_loader_is_named():
    with pytest.raises(ValueError, match="unknown loader 'nope'; registered: blog-pyav"):
        load_adapter("nope")


def test_summary_median_and_spread():
    s = summarize([10.0, 12.0, 8.0])
    assert (s.median, s.low, s.high, s.n) == (10.0, 8.0, 12.0, 3)
    assert s.spread_pct == pytest.approx(20.0)
    assert summarize([]) is None


def test_daliload_bench_says_where_the_benchmarks_are_and_imports_none(capsys):
    from daliload.commands import bench as bench_cli
    from daliload.cli import build_parser

    args = build_parser().parse_args(["bench"])
    assert args._run is bench_cli.run
    assert bench_cli.run(args) == 2
    message = capsys.readouterr().err
    assert "benchmarks/ of the daliload source repository" in message
    assert "`python -m benchmarks`" in message and "`make bench`" in message
    # From the repository root, where `benchmarks` is importable: the command still imports none of it.
    probe = ("import json, sys\n"
             "import daliload.cli\n"
             "code = daliload.cli.main(['bench'])\n"
             "print(json.dumps([code, sorted(m for m in sys.modules if m.split('.')[0] == 'benchmarks')]))\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == [2, []]
    assert "python -m benchmarks" in done.stderr


def test_the_package_never_imports_the_benchmarks():
    # docs/architecture.md, Layers: benchmarks import daliload, never the other way round.
    offenders = []
    for folder in ("daliload", "fallback"):
        for path in sorted((REPO / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom):
                    names = [node.module or ""] if node.level == 0 else []
                elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                    names = [node.value]  # importlib.import_module("benchmarks...")
                else:
                    continue
                offenders += [f"{path.relative_to(REPO)}:{node.lineno}: {name}" for name in names
                              if name == "benchmarks" or name.startswith("benchmarks.")]
    assert offenders == []


def test_faults_benchmark_writes_memory_and_culprit_figures(tmp_path):
    from benchmarks import bench_faults

    out = tmp_path / "faults.json"
    md = tmp_path / "RESULTS.md"
    assert bench_faults.main(["--epochs", "2", "--classes", "2", "--clips-per-class", "3", "--data-dir",
                              str(tmp_path / "data"), "--json", str(out), "--results-md", str(md)]) == 0
    result = json.loads(out.read_text())
    memory = result["memory"]
    assert len(memory["epochs"]) == 2 and all(e["peak_rss_mb"] > 0 for e in memory["epochs"])
    assert memory["growth_mb"] == memory["last_peak_rss_mb"] - memory["first_peak_rss_mb"]
    for variant in ("dali", "named"):
        run = result["culprit"][variant]
        assert run["clean"]["failures"] == 0 and run["broken"]["failures"] >= 1
        assert len(run["broken"]["rerouted"]) == 1 and run["after"]["clips_redecoded"] == 0
    text = md.read_text()
    assert "### Faults run `faults`" in text and "growth" in text and "bisects the batch" in text


def test_each_daliload_row_sets_what_its_name_says_and_the_knob_only_where_it_has_one():
    def spec(name, workers=3):
        return object.__new__(load_adapter(name)).decode_spec(workers)  # the spec alone, no loader built

    assert spec("daliload") == DecodeSpec() and spec("daliload-static") == DecodeSpec(routing="static")
    assert spec("daliload-workers") == DecodeSpec(dali_threads=3, fallback_workers=3)
    for name in ("daliload-dali-cpu", "daliload-dali-gpu"):
        assert spec(name) == DecodeSpec(routing="static", dali_threads=3, fallback_workers=3)
    assert spec("daliload-workers", 0) == DecodeSpec(dali_threads=1, fallback_workers=0)


def test_an_uncounted_loader_is_credited_with_a_decode_from_the_keyframe_before_its_windows():
    """daliload's rows count their frames; a peer that cannot is credited with the seek estimate."""
    from benchmarks.harness import decode_estimate

    counts = {"frames_used": 10, "seek_estimate": 50}
    assert decode_estimate(load_adapter("torchcodec-cpu"), counts) == 50
    assert all(load_adapter(name).counts_frames for name in ("daliload", "daliload-static", "daliload-dali-cpu"))


def test_a_decode_from_frame_zero_is_estimated_to_the_windows_end():
    """fn.decoders.video fed a whole file has no frame index: a window at 252..299 costs 300 frames, not 50."""
    indices = [252, 256, 260, 264, 268, 272, 276, 280, 284, 288, 292, 296, 299, 299, 299, 299]
    assert from_start_decode_estimate(indices) == 300
    assert seek_decode_estimate(indices, [0, 250]) == 50


# --- the GPU run: NVDEC proof, the NVDEC ceiling ------------------------------------------

def test_a_row_without_nvdec_activity_is_failed():
    from benchmarks.metrics import nvdec_failure

    assert nvdec_failure([{"nvdec_util_pct": 0.0}, {"nvdec_util_pct": 0.0}], "nvml").startswith(
        "no NVDEC activity: decoder utilisation 0 % in all 2 timed runs")
    assert "not sampled" in nvdec_failure([{"nvdec_util_pct": None}], "none (pynvml not installed)")
    assert nvdec_failure([{"nvdec_util_pct": 0.0}, {"nvdec_util_pct": 3.5}], "nvml") is None
    from benchmarks.ceiling import DaliWholeFiles, DaliWholeFilesCPU
    from benchmarks.peers.dali_reader import DaliReadersVideo

    assert DaliWholeFiles.uses_nvdec and DaliReadersVideo.uses_nvdec and not DaliWholeFilesCPU.uses_nvdec


def test_dali_ceiling_runs_several_pipelines_at_once(tmp_path):
    pytest.importorskip("nvidia.dali")
    from benchmarks.ceiling import DaliWholeFilesCPU

    class SmallBatches(DaliWholeFilesCPU):
        batch_size = 2  # 5 files: 3 pipelines of 2, 2 and 1 files

    spec = DatasetSpec(name="v", codec="vp9", width=64, height=48, gop=250, num_clips=5, duration_s=1.0)
    ceiling = SmallBatches(prepare_dataset(spec, tmp_path), [], LoaderConfig(task=TaskSpec(), workers=1, device="cpu"))
    try:
        assert len(ceiling._pipelines) == 3 and ceiling.num_threads == 16
        for _ in range(2):
            batches = list(ceiling.epoch())
            assert sum(b.num_clips for b in batches) == 5 and sum(b.frames_decoded for b in batches) == 150
    finally:
        ceiling.close()


def test_epoch_start_benchmark_writes_each_step(tmp_path):
    from benchmarks import bench_epoch_start

    out, md = tmp_path / "epoch_start.json", tmp_path / "RESULTS.md"
    assert bench_epoch_start.main(["--clips", "4", "--duration", "2.1", "--batch-size", "2", "--workers", "1",
                                   "--passes", "3", "--step", "0.05", "--data-dir", str(tmp_path / "data"),
                                   "--json", str(out), "--results-md", str(md)]) == 0
    result = json.loads(out.read_text())
    assert [run["label"] for run in result["runs"]] == ["none", "fixed"]
    for run in result["runs"]:
        assert run["epochs"] == [0, 1, 2]
        assert [len(p) for p in run["waits_s"]] == [2, 2, 2] and len(run["first_batch_s"]) == 2
        assert run["epoch_start_cost_s"] == run["first_batch_median_s"] - run["other_batches_median_s"]
    text = md.read_text()
    assert "## Epoch start: `python -m benchmarks.bench_epoch_start`" in text
    assert "| fixed (0.05 s) |" in text and "### Epoch-start run `epoch_start`" in text


@pytest.mark.parametrize(("argv", "message"), [
    (["--passes", "1"], "--passes must be >= 2"),
    (["--step", "fast"], "--step: expected seconds >= 0 or 'balanced', got 'fast'"),
    (["--step", "-1"], "--step: expected seconds >= 0 or 'balanced', got '-1'"),
])
def test_epoch_start_benchmark_refuses_bad_options(argv, message, capsys):
    from benchmarks import bench_epoch_start

    with pytest.raises(SystemExit) as exit_info:
        bench_epoch_start.parse_args(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_nvml_reads_the_gpu_cuda_calls_this_processs_device(monkeypatch):
    """NVML and nvidia-smi number every GPU of the machine; CUDA only those CUDA_VISIBLE_DEVICES lists, in its
    order: a rank's cuda:0 under CUDA_VISIBLE_DEVICES=2,3 is physical GPU 2, read there, not GPU 0."""
    from benchmarks.metrics import physical_gpu

    assert [physical_gpu(i, "2,3") for i in (0, 1)] == ["2", "3"]
    assert physical_gpu(0, "GPU-8f0c5a1e-aaaa-bbbb-cccc-000000000001") == "GPU-8f0c5a1e-aaaa-bbbb-cccc-000000000001"
    assert physical_gpu(1, "MIG-1, MIG-2") == "MIG-2"
    assert physical_gpu(3, "") == "3"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")
    assert physical_gpu(0) == "5"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert physical_gpu(1) == "1"
    with pytest.raises(ValueError, match=r"CUDA device 1 is not among CUDA_VISIBLE_DEVICES='4,-1,5'"):
        physical_gpu(1, "4,-1,5")  # CUDA stops at the first entry that names no device
