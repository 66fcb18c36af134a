"""The fallback and probe micro-benchmarks write their own RESULTS.md sections from their run's JSON.

The JSON files in ``tests/bench_data`` are tiny real runs of the two scripts
(2 clips, 1 run), so these tests rebuild sections without measuring anything.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "bench_data"


@pytest.mark.parametrize(("module", "run", "heading", "table"), [
    ("bench_fallback", "fallback-run.json", "### Fallback run `fallback` — ", "| loader (2 workers, batch 8) |"),
    ("bench_probe", "probe-run.json", "### Probe run `probe` — ", "| probe, CPU time | all | 121 |"),
])
def test_a_micro_benchmark_replaces_its_own_section(tmp_path, module, run, heading, table):
    import importlib

    script = importlib.import_module(f"benchmarks.{module}")
    md = tmp_path / "RESULTS.md"
    md.write_text(f"# Results\n\n## Mine\n\n{heading}old machine, 2026-01-01\n\nold figure 9.9\n\n"
                  "## Another benchmark\n\n### Its run `x` — m\n\nits figure 1.1\n")
    assert script.main(["--report-from", str(DATA / run), "--results-md", str(md), "--out", str(tmp_path / "o")]) == 0
    text = md.read_text()
    assert "old figure 9.9" not in text and text.count(heading) == 1
    assert text.endswith("## Another benchmark\n\n### Its run `x` — m\n\nits figure 1.1\n")  # left alone
    section = text[text.index(heading):text.index("## Another benchmark")]
    result = json.loads((DATA / run).read_text())
    assert result["date"] in section and "Load average (1 min)" in section
    assert table in section  # its table, written by the script from the JSON
