"""``python -m benchmarks.bench_scan_ab``: every checkout scans the same tree once a round, in rotated order, and
the run writes its figures, its section and the marked summary. Rates are not asserted (the machine decides
them); counts, order and that each figure is written are."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_two_checkouts_scan_the_same_files_in_rotated_order_and_the_run_writes_its_figures(tmp_path):
    from benchmarks import bench_scan_ab

    out, md, readme = tmp_path / "scan-ab.json", tmp_path / "RESULTS.md", tmp_path / "scale.md"
    readme.write_text("intro\n<!-- scan-ab:begin: written by code -->\nold\n<!-- scan-ab:end -->\nrest\n")
    rc = bench_scan_ab.main(["--checkout", f"a={REPO}", "--checkout", f"b={REPO}", "--files", "12", "--rounds", "2",
                             "--json", str(out), "--results-md", str(md), "--readme", str(readme), "--machine", "CI"])
    assert rc == 0
    result = json.loads(out.read_text())
    rounds = result["measurements"]["rounds"]
    assert [r["order"] for r in rounds] == [["a", "b"], ["b", "a"]]
    assert all(s["probed"] == 12 for r in rounds for s in r["scans"].values()), "every scan probes every file"
    from benchmarks.machine import commit_of

    assert [c["commit"] for c in result["checkouts"]] == [commit_of(REPO)] * 2
    figures = result["figures"]
    assert figures["a"]["over_first"]["runs"] == [1.0, 1.0]
    assert len(figures["b"]["files_per_s"]["runs"]) == 2 and figures["b"]["files_per_s"]["median"] > 0
    section = md.read_text()
    assert bench_scan_ab.CHAPTER in section and "### Scan run `scan-ab` — CI: " in section
    text = readme.read_text()
    assert "old" not in text and text.startswith("intro\n") and text.endswith("rest\n")
    row = next(line for line in text.splitlines() if line.startswith("| `b` |"))
    assert bench_scan_ab.verdict(figures["b"]["over_first"]) in row
    assert f"| `{commit_of(REPO)[:7]}" in row  # the hash shortened in the table


@pytest.mark.parametrize("ratio, words", [
    ({"min": 1.2, "max": 1.4}, "faster in every round"),
    ({"min": 0.6, "max": 0.9}, "slower in every round"),
    ({"min": 0.97, "max": 1.03}, "the same within 5% in every round"),
    ({"min": 0.8, "max": 1.2}, "not settled (the rounds straddle it)"),
])
def test_the_verdict_calls_a_difference_only_when_every_round_is_on_one_side(ratio, words):
    from benchmarks.bench_scan_ab import verdict

    assert verdict(ratio) == words


@pytest.mark.parametrize("argv, message", [
    (["--checkout", "nopath"], "expected NAME=PATH, got 'nopath'"),
    (["--checkout", "x=/nonexistent-daliload"], "is not a daliload checkout"),
    (["--checkout", f"a={REPO}", "--checkout", f"a={REPO}"], "--checkout names must differ"),
    (["--files", "0"], "argument --files: expected an integer >= 1, got '0'"),
])
def test_bad_options_are_refused_naming_them(argv, message, capsys):
    from benchmarks.bench_scan_ab import parse_args

    with pytest.raises(SystemExit):
        parse_args(argv)
    assert message in capsys.readouterr().err
