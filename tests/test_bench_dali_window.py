"""``python -m benchmarks.bench_dali_window`` writes its figures: counts and frames, never a speed asserted."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_the_dali_window_benchmark_compares_three_ways_on_one_plan_and_writes_its_sections(tmp_path):
    from benchmarks import bench_dali_window

    out, md, readme = tmp_path / "dali_window.json", tmp_path / "RESULTS.md", tmp_path / "README.md"
    readme.write_text("before\n<!-- dali-window:begin: generated -->\nold figures\n<!-- dali-window:end -->\nafter\n")
    assert bench_dali_window.main(["--clips", "4", "--duration", "3", "--size", "128x96", "--batch-size", "2",
                                   "--rounds", "2", "--data-dir", str(tmp_path / "data"), "--json", str(out),
                                   "--results-md", str(md), "--readme", str(readme)]) == 0
    result = json.loads(out.read_text())
    short, long = result["datasets"]["vp9-gop16"], result["datasets"]["vp9"]
    for row in (short, long):
        assert [len(row[way]["runs"]) for way in bench_dali_window.WAYS] == [2, 2, 2]
        assert row["dali-window"]["clips"] == row["fallback"]["clips"] == 4
        assert row["dali-window"]["dali_clips"] == 4 and row["fallback"]["dali_clips"] == 0
    # A keyframe every 16 frames: DALI decodes fewer frames fed windows; every 250: the windows start at frame 0.
    assert short["dali-window"]["cut_clips"] > 0
    assert short["dali-window"]["frames_per_clip"] < short["dali-file"]["frames_per_clip"]
    assert long["dali-window"]["cut_clips"] == 0
    assert long["dali-window"]["frames_per_clip"] == long["dali-file"]["frames_per_clip"]
    assert short["cut_cost"]["cut"] > 0 and long["cut_cost"]["cut"] == 0 and short["cut_cost"]["ms_per_clip"] > 0
    text = md.read_text()
    assert bench_dali_window.CHAPTER in text and "| `vp9-gop16` |" in text and "Target: DALI fed windows" in text
    assert any(word in text for word in ("met.", "**missed**.", "not settled"))
    figures = readme.read_text()
    assert figures.startswith("before\n<!-- dali-window:begin: generated -->\nWritten by") and "old" not in figures
    assert figures.endswith("<!-- dali-window:end -->\nafter\n")


@pytest.mark.parametrize("ratio, verdict", [({"min": 0.95, "max": 1.2}, "met"), ({"min": 0.5, "max": 0.8},
                                                                                   "**missed**"),
                                            ({"min": 0.8, "max": 1.1}, "not settled (the rounds straddle it)")])
def test_a_target_is_met_or_missed_only_when_every_round_is_on_one_side(ratio, verdict):
    from benchmarks.bench_dali_window import verdict as judge

    assert judge(ratio, 0.9) == verdict
