"""Every generated section of the docs is what its writer makes of the committed JSON: no figure typed by hand."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"


def _writers():
    from benchmarks import (bench_dali_window, bench_lean_fallback, bench_repeated, bench_routing, bench_scan_ab,
                            bench_transcode, bench_views, demo_section, remote_report, scale_report)
    from benchmarks import summary

    return [("demo.md", "demo", demo_section.readme_section, "demo.json"),
            ("evaluation.md", "views", bench_views.readme_figures, "views.json"),
            ("performance.md", "speed", summary.readme_section, "cpu.json"),
            ("performance.md", "dali-window", bench_dali_window.readme_figures, "dali_window.json"),
            ("performance.md", "routing", bench_routing.readme_figures, "routing.json"),
            ("performance.md", "lean-fallback", bench_lean_fallback.readme_figures, "lean_fallback.json"),
            ("remote.md", "remote", remote_report.readme_figures, "remote.json"),
            ("scale.md", "scale", scale_report.readme_figures, "scale-650000.json"),
            ("scale.md", "scan-ab", bench_scan_ab.readme_figures, "scan-ab.json"),
            ("transcode.md", "transcode", bench_transcode.readme_figures, "transcode.json"),
            ("using.md", "repeated", bench_repeated.readme_figures, "repeated.json")]


@pytest.mark.parametrize("index", range(len(_writers())))
def test_a_generated_section_is_its_writers_output_from_the_committed_run(index):
    page, marker, write, run = _writers()[index]
    text = (REPO / "docs" / page).read_text()
    found = re.search(rf"<!-- {marker}:begin.*?-->\n(.*?)<!-- {marker}:end -->", text, re.S)
    assert found, f"docs/{page} has no {marker} markers"
    assert found.group(1).strip() == write(json.loads((RESULTS / run).read_text())).strip()


def test_the_readme_stays_a_front_page():
    readme = (REPO / "README.md").read_bytes()
    assert len(readme) <= 12_000, len(readme)
    for command in ("make demo", "make test"):
        assert command in readme.decode()


def test_the_readme_speed_headline_is_its_writers_output_from_the_committed_run():
    """The README's speed figures are ``summary.headline`` of the run they name, not typed or left stale."""
    from benchmarks import summary

    text = (REPO / "README.md").read_text()
    found = re.search(rf"<!-- {summary.HEADLINE_MARKER}:begin.*?-->\n(.*?)<!-- {summary.HEADLINE_MARKER}:end -->",
                      text, re.S)
    assert found, f"README.md has no {summary.HEADLINE_MARKER} markers"
    run = re.search(r"by run `([^`]+)` of `python -m benchmarks`", found.group(1))
    assert run, "the headline names no run"
    result = json.loads((RESULTS / f"{run.group(1)}.json").read_text())
    assert found.group(1).strip() == summary.headline(result).strip()
