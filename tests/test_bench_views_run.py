"""``python -m benchmarks.bench_views`` on one tiny video: every way runs, mmaction2's baseline beside the others.

No speed is asserted: the run's counts (views per run, for every way) and its written sections.
"""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_the_views_benchmark_runs_mmaction2s_baseline_beside_the_other_ways(tmp_path):
    from benchmarks import bench_views

    out, md, page = tmp_path / "views.json", tmp_path / "RESULTS.md", tmp_path / "evaluation.md"
    page.write_text("<!-- views:begin: generated -->\nold\n<!-- views:end -->\n")
    assert bench_views.main(["--videos", "1", "--views", "2", "3", "--runs", "2", "--duration", "2.1",
                             "--data-dir", str(tmp_path / "data"), "--json", str(out), "--results-md", str(md),
                             "--readme", str(page)]) == 0
    result = json.loads(out.read_text())
    fallback = result["fallback"]
    # 2 temporal windows x 3 crops of one video: every way delivers the 6 views.
    ways = ("together", "each_on_its_own", "each_window_once")
    assert {way: fallback[way]["views"] for way in ways} == {"together": 6, "each_on_its_own": 6,
                                                            "each_window_once": 6}
    assert all(len(fallback[way]["views_per_s"]) == 2 for way in ways)
    # The ways ran interleaved: a ratio per round against each baseline.
    for baseline in ways[1:]:
        ratio = fallback["ratios"][f"together_over_{baseline}"]
        assert len(ratio["runs"]) == 2 and ratio["min"] <= ratio["median"] <= ratio["max"]
    if "skipped" not in result["dali"]:
        assert bench_views.WINDOW_ONCE not in result["dali"]  # DALI crops in its pipeline: no such baseline
    section = md.read_text()
    assert "each window once, 3 crops from it (mmaction2) | together / that |" in section
    assert "mmaction2's test pipeline (`SampleFrames`, then `ThreeCrop`)" in section
    assert "round by round" in section and "(interleaved: one run of each way per round" in section
    figures = page.read_text()
    assert "old" not in figures and "mmaction2's way of decoding each temporal window once" in figures
