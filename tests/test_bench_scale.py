"""``python -m benchmarks.bench_scale`` at CI size: 10,000 videos, every target scaled to that size.

The run's times and memory depend on how busy the machine is, so this test asserts only what does
not: the counts the run measured, that its section and every row are written, and that each target
is printed as met or missed. Whether the targets are met is the benchmark's to print (``--check``
turns a miss into exit status 1 for a person who runs it), never the test suite's to fail on.
"""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_the_scale_benchmark_at_10k_videos_counts_its_work_and_writes_every_row(tmp_path):
    from benchmarks import bench_scale, scale_report

    md = tmp_path / "RESULTS.md"
    out = tmp_path / "scale.json"
    rc = bench_scale.main(["--videos", "10000", "--work", str(tmp_path / "work"), "--json", str(out),
                           "--results-md", str(md), "--machine", "CI"])
    assert rc == 0
    result = json.loads(out.read_text())
    figures, measured = result["figures"], result["measurements"]
    assert figures["rescan_probed"] == 0 and measured["construct"]["1"]["videos"] == 9400
    assert measured["construct"]["64"]["videos"] == 9400
    assert measured["fresh_scan"]["whole"]["probed"] == bench_scale.FRESH_FILES
    assert 0 < measured["fresh_scan"]["shard"]["probed"] < bench_scale.FRESH_FILES
    for key in scale_report.TARGETS:
        assert figures[key] > 0, key
    text = md.read_text()
    assert bench_scale.CHAPTER in text and "### Scale run `scale-10000` — CI: " in text
    for label, _, key in scale_report._ROWS:
        row = next(line for line in text.splitlines() if line.startswith(f"| {label} |"))
        if key is not None:
            limit = scale_report.target(key, 10_000)
            verdict = "met" if figures[key] <= limit else "**missed**"
            assert row.endswith(f"<= {limit:.3g} {scale_report.TARGETS[key][2]}: {verdict} |"), row
    assert not (tmp_path / "work").exists()  # the tree is removed


def test_missed_targets_names_each_target_over_its_scaled_limit_and_only_those():
    from benchmarks.scale_report import TARGETS, missed_targets, target

    at_limit = {key: target(key, 10_000) for key in TARGETS}
    assert missed_targets(at_limit, 10_000) == []
    over = dict(at_limit, plan_rank64_s=2 * target("plan_rank64_s", 10_000))
    (missed,) = missed_targets(over, 10_000)
    assert missed.startswith("a rank of 64 draws its share: ") and missed.endswith(" s")


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
