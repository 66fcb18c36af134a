"""``python -m benchmarks``: the loaders of a dataset interleaved epoch by epoch, each in its own long-lived process.

No speed is asserted: the rounds' order, the per-round figures and ratios the JSON holds, and that a
loader whose epoch outlasts the timeout, or raises, is killed or reported with its reason while the
others go on.
"""

from __future__ import annotations

import json
import os
import textwrap

import pytest

from benchmarks import harness
from benchmarks.datasets import DatasetSpec, loader_order, prepare_dataset
from benchmarks.interleave import LoaderProcess, rotated, round_ratio
from benchmarks.task import TaskSpec, make_plan, write_plan


def test_each_loader_runs_first_once_every_len_rounds():
    assert ["".join(rotated("abc", r)) for r in range(4)] == ["abc", "bca", "cab", "abc"]
    assert rotated([], 3) == []


def test_a_ratio_is_taken_round_by_round():
    ratio = round_ratio([10.0, 12.0, 9.0], [5.0, 8.0, 3.0])
    assert ratio == {"median": 2.0, "min": 1.5, "max": 3.0, "runs": [2.0, 1.5, 3.0]}
    assert round_ratio([], []) is None


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("interleave")
    spec = DatasetSpec(name="h264-gop250", codec="h264", width=128, height=96, gop=250, num_clips=2,
                       duration_s=2.1)
    dataset = prepare_dataset(spec, root / "data", workers=1)
    task = TaskSpec(batch_size=2)
    write_plan(root / "plan.json", make_plan(dataset.videos, task, loader_order(dataset)), task)
    # Adapters that misbehave, importable by the measuring process through PYTHONPATH.
    (root / "misbehaving.py").write_text(textwrap.dedent("""
        import time
        from benchmarks.loaders import LoaderAdapter

        class Hangs(LoaderAdapter):
            name = "hangs"
            summary = "sleeps in its epoch"
            def __init__(self, dataset, samples, config):
                pass
            def epoch(self):
                time.sleep(60)
                yield from ()

        class Raises(Hangs):
            name = "raises"
            def epoch(self):
                raise RuntimeError("no such codec, named by the test")
                yield
    """))
    return root, dataset


def _process(tiny, adapter: str, timeout: float) -> LoaderProcess:
    root, dataset = tiny
    job = root / f"{adapter}.job.json"
    job.write_text(json.dumps({"adapter": adapter, "kind": "loader", "dataset": dataset.root,
                               "plan": str(root / "plan.json"), "workers": 0, "device": "cpu", "warmup": 0,
                               "runs": 1}))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(harness.REPO_ROOT), env.get("PYTHONPATH", "")])
    return LoaderProcess(job, root / f"{adapter}.log", timeout, env=env)


def test_a_served_loader_answers_each_epoch_with_its_figures(tiny):
    process = _process(tiny, "blog-pyav", 120)
    try:
        assert process.started()["status"] == "ready"
        for _ in range(2):
            answer = process.epoch()
            assert answer["status"] == "ok" and answer["run"]["clips"] == 2
            assert answer["run"]["frames_decoded"] == 2 * 63  # the blog approach decodes whole files
    finally:
        process.stop()


def test_an_epoch_that_outlasts_the_timeout_is_killed_with_its_workers_and_reported(tiny):
    process = _process(tiny, "misbehaving:Hangs", 5)
    assert process.started()["status"] == "ready"
    answer = process.epoch()
    assert answer == {"status": "failed", "reason": "timed out after 5 s (killed)"}
    assert process._process.poll() is not None
    process.stop()


def test_an_epoch_that_raises_is_reported_with_the_error(tiny):
    process = _process(tiny, "misbehaving:Raises", 60)
    assert process.started()["status"] == "ready"
    answer = process.epoch()
    assert answer["status"] == "failed" and answer["reason"] == "RuntimeError: no such codec, named by the test"
    process.stop()
    assert "no such codec" in (tiny[0] / "misbehaving:Raises.log").read_text()


@pytest.mark.slow
def test_the_harness_interleaves_the_loaders_of_a_dataset_and_writes_per_round_ratios(tmp_path):
    batch_size = 2
    results = tmp_path / "results"
    loaders = "blog-pyav,decord-1thread,daliload,daliload-fallback"
    assert harness.main([
        "--device", "cpu", "--datasets", "h264-gop250", "--loaders", loaders, "--clips", "4", "--duration", "2.1",
        "--size", "128x96", "--batch-size", str(batch_size), "--workers", "0", "--no-sweeps", "--runs", "2",
        "--warmup", "1", "--data-dir", str(tmp_path / "data"), "--results-dir", str(results),
        "--results-md", str(tmp_path / "RESULTS.md"), "--readme", str(tmp_path / "README.md"), "--no-plots",
        "--profile-clips", "0", "--name", "smoke", "--timeout", "300"]) == 0
    result = json.loads((results / "smoke.json").read_text())
    assert result["settings"]["batch_size"] == batch_size
    (group,) = result["interleaved"]
    ran = [m["loader"] for m in result["measurements"] if m["status"] == "ok"]
    assert group["dataset"] == "h264-gop250" and len(group["orders"]) == 2
    assert group["orders"][1] == rotated(group["orders"][0], 1) and sorted(group["orders"][0]) == sorted(ran)
    assert "ceiling-pyav" in ran and "daliload" in ran and "daliload-fallback" in ran
    for m in result["measurements"]:
        if m["status"] != "ok":
            assert m["status"] == "unavailable", m  # decord where it does not import
            continue
        assert len(m["runs"]) == len(m["round_clips_per_s"]) == 2 and len(m["warmup_wall_s"]) == 1
        assert all(run["clips"] == 4 for run in m["runs"])
        clips = m["figures"]["clips_per_s"]
        assert clips["low"] <= clips["median"] <= clips["high"] and clips["n"] == 2
        rounds = m["figures"]["ratio_clips_rounds"]
        assert len(rounds["runs"]) == 2 and rounds["min"] <= rounds["median"] <= rounds["max"]
    peers = [name for name in ran if name in ("blog-pyav", "decord-1thread")]
    ratios = result["round_ratios"]["h264-gop250"]
    assert ratios["best_peer"] in peers
    assert len(ratios["daliload_over_best_peer"]["runs"]) == 2
    target = result["peer_target"]
    assert (target["loader"], target["dataset"], target["target"]) == ("daliload", "h264-gop250", 1.3)
    assert target["verdict"] in ("met", "**missed**", "not settled (the rounds straddle it)")
    text = (tmp_path / "RESULTS.md").read_text()
    assert "Against the best peer, round by round" in text
    assert f"daliload / the best peer (`{ratios['best_peer']}`) on `h264-gop250`, round by round" in text
