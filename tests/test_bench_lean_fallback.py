"""``python -m benchmarks.bench_lean_fallback`` writes its figures: bytes and clip counts, never a speed asserted."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_the_lean_fallback_benchmark_measures_both_ways_on_one_plan_and_writes_its_sections(tmp_path):
    from benchmarks import bench_lean_fallback

    out, md, readme = tmp_path / "lean.json", tmp_path / "RESULTS.md", tmp_path / "README.md"
    readme.write_text("before\n<!-- lean-fallback:begin: generated -->\nold\n<!-- lean-fallback:end -->\nafter\n")
    assert bench_lean_fallback.main(["--datasets", "h264-gop250", "--clips", "4", "--duration", "3", "--size",
                                     "128x96", "--crop", "64", "--batch-size", "2", "--passes", "2", "--data-dir",
                                     str(tmp_path / "data"), "--json", str(out), "--results-md", str(md),
                                     "--readme", str(readme)]) == 0
    result = json.loads(out.read_text())
    row = result["datasets"]["h264-gop250"]
    # 4 clips in groups of 2, two groups a round: one round a pass
    assert row["clips"] == 4 and row["rounds"] == 2
    assert [len(row[way]["runs"]) for way in bench_lean_fallback.WAYS] == [2, 2]
    assert row["worker"]["dtype"] == "float32" and row["device"]["dtype"] == "uint8"
    assert row["worker"]["bytes_per_clip"] == 3 * 16 * 64 * 64 * 4 == 4 * row["device"]["bytes_per_clip"]
    assert len(row["saved_ms_per_clip"]["runs"]) == 2 and row["normalize_pixels_cpu_ms_per_clip"] > 0
    assert len(result["load_average"]) == 2 and result["machine"]["cpu_cores"]
    assert bench_lean_fallback.CHAPTER in md.read_text() and "| `h264-gop250` | 4 x 2 (2) |" in md.read_text()
    figures = readme.read_text()
    assert figures.startswith("before\n<!-- lean-fallback:begin: generated -->\nWritten by") and "old" not in figures
    assert "196,608 bytes of uint8 instead of 786,432 of float32" in figures
