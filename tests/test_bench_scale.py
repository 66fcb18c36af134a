"""``python -m benchmarks.bench_scale`` at CI size: 10,000 videos, every target scaled to that size."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_the_scale_benchmark_meets_its_targets_at_10k_videos_and_writes_its_section(tmp_path):
    from benchmarks import bench_scale, scale_report

    md = tmp_path / "RESULTS.md"
    out = tmp_path / "scale.json"
    rc = bench_scale.main(["--videos", "10000", "--work", str(tmp_path / "work"), "--json", str(out),
                           "--results-md", str(md), "--machine", "CI", "--check"])
    result = json.loads(out.read_text())
    assert rc == 0, bench_scale.missed_targets(result["figures"], 10_000)
    figures, measured = result["figures"], result["measurements"]
    assert figures["rescan_probed"] == 0 and measured["construct"]["1"]["videos"] == 9400
    assert measured["fresh_scan"]["whole"]["probed"] == bench_scale.FRESH_FILES
    assert 0 < measured["fresh_scan"]["shard"]["probed"] < bench_scale.FRESH_FILES
    text = md.read_text()
    assert bench_scale.CHAPTER in text and "### Scale run `scale-10000` — CI: " in text
    for label, _, _ in scale_report._ROWS:
        assert f"| {label} |" in text
    assert not (tmp_path / "work").exists()  # the tree is removed


@pytest.mark.parametrize("argv, message", [
    (["--videos", "0"], "argument --videos: expected an integer >= 1, got '0'"),
    (["--videos", "many"], "argument --videos: expected an integer >= 1, got 'many'"),
])
def test_bench_scale_refuses_a_bad_video_count_naming_it(argv, message, capsys):
    from benchmarks.bench_scale import parse_args

    with pytest.raises(SystemExit):
        parse_args(argv)
    assert message in capsys.readouterr().err


def test_the_loaders_benchmark_refuses_negative_workers_naming_the_value(capsys):
    from benchmarks.harness import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["--workers", "-1"])
    assert "argument --workers: expected an integer >= 0, got '-1'" in capsys.readouterr().err
