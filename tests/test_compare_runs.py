"""``python -m benchmarks.compare_runs``: before/after figures come from the two runs' JSON, on equal work only."""

from __future__ import annotations

import json

import pytest

from benchmarks import compare_runs


def _run(daliload: float, fallback: float, dali_cpu: float, *, runs: int = 3) -> dict:
    def m(loader, dataset, median):
        clips = {"median": median, "low": median * 0.9, "high": median * 1.1, "spread_pct": 20.0, "n": runs}
        return {"loader": loader, "dataset": dataset, "kind": "loader", "sweep": "main", "status": "ok",
                "figures": {"clips_per_s": clips}}

    return {"machine": {"label": "test", "cpu_model": "x", "cpu_cores": 2, "cpu_cores_usable": 2, "memory_gib": 1.0,
                        "gpu": None, "date_utc": "2026-12-01 00:00 UTC"},
            "settings": {"runs": runs, "workers": 2}, "datasets": [{"name": "h264-gop250", "root": "/a"}],
            "measurements": [m("daliload", "h264-gop250", daliload), m("daliload-fallback", "h264-gop250", fallback),
                             m("daliload", "vp9", dali_cpu), m("daliload-dali-cpu", "vp9", dali_cpu * 2),
                             {"loader": "torchcodec-cuda", "dataset": "vp9", "kind": "loader", "sweep": "main",
                              "status": "unavailable", "figures": None}]}


def test_the_figures_and_the_section_come_from_the_two_runs(tmp_path):
    before, after = tmp_path / "before.json", tmp_path / "after.json"
    before.write_text(json.dumps(_run(9.0, 10.0, 4.0)))
    after_run = _run(12.0, 12.5, 4.0)
    after_run["datasets"][0]["root"] = "/elsewhere"  # where the data lies is not the work asked
    after.write_text(json.dumps(after_run))
    md = tmp_path / "RESULTS.md"
    assert compare_runs.main([str(before), str(after), "--name", "ab", "--before-commit", "aaa", "--after-commit",
                              "bbb", "--results-dir", str(tmp_path), "--results-md", str(md)]) == 0
    result = json.loads((tmp_path / "ab.json").read_text())
    rows = {(r["dataset"], r["loader"]): r for r in result["figures"]["loaders"]}
    assert rows["h264-gop250", "daliload"]["after_over_before"] == pytest.approx(12 / 9)
    assert ("vp9", "torchcodec-cuda") not in rows  # not run: no row
    routed = {(r["dataset"], r["run"]): r["whole_over_route"] for r in result["figures"]["whole_over_route"]}
    assert routed == {("h264-gop250", "before"): pytest.approx(0.9), ("h264-gop250", "after"): pytest.approx(0.96),
                      ("vp9", "before"): pytest.approx(0.5), ("vp9", "after"): pytest.approx(0.5)}
    text = md.read_text()
    assert compare_runs.CHAPTER in text
    assert "| h264-gop250 | daliload | 9.0 (8.1-9.9) | 12.0 (10.8-13.2) | 1.33x |" in text
    assert "package `aaa`" in text and "package `bbb`" in text


def test_runs_of_different_work_are_refused(tmp_path, capsys):
    before, after = tmp_path / "before.json", tmp_path / "after.json"
    before.write_text(json.dumps(_run(9.0, 10.0, 4.0)))
    after.write_text(json.dumps(_run(9.0, 10.0, 4.0, runs=5)))
    assert compare_runs.main([str(before), str(after), "--name", "ab", "--before-commit", "a", "--after-commit", "b",
                              "--results-dir", str(tmp_path), "--no-md"]) == 2
    assert "differ in runs" in capsys.readouterr().err and not (tmp_path / "ab.json").exists()
