"""``python -m benchmarks.bench_routing`` writes its figures: counts and shares, never a speed asserted."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_the_routing_benchmark_runs_every_way_on_one_plan_and_writes_its_sections(tmp_path):
    from benchmarks import bench_routing

    out, md, page = tmp_path / "routing.json", tmp_path / "RESULTS.md", tmp_path / "performance.md"
    page.write_text("before\n<!-- routing:begin: generated -->\nold figures\n<!-- routing:end -->\nafter\n")
    assert bench_routing.main(["--clips", "4", "--duration", "3", "--size", "128x96", "--batch-size", "2",
                               "--rounds", "2", "--data-dir", str(tmp_path / "data"), "--json", str(out),
                               "--results-md", str(md), "--readme", str(page)]) == 0
    result = json.loads(out.read_text())
    vp9, h264 = result["datasets"]["vp9"], result["datasets"]["h264-gop250"]
    for rows in (vp9, h264):
        assert list(rows) == ["one each", "defaults"]
        for row in rows.values():
            assert [len(row[way]["runs"]) for way in bench_routing.WAYS] == [2, 2, 2]
            assert {row[way]["clips"] for way in bench_routing.WAYS} == {4}
            assert row["fallback"]["fallback_share"] == 1.0
            for ratio in ("auto_over_fallback", "auto_over_static", "auto_over_faster"):
                assert row[ratio]["min"] <= row[ratio]["median"] <= row[ratio]["max"]
    # VP9: DALI's alone when static; H.264 is the fallback's only, whatever the routing
    assert vp9["one each"]["static"]["fallback_share"] == 0.0
    # one thread, one worker on 2 cores or more: the default is adaptive, and the first batch is split
    assert vp9["one each"]["auto"]["routing"] == "adaptive" and vp9["one each"]["auto"]["moved_clips"] > 0
    assert h264["one each"]["auto"]["fallback_share"] == h264["one each"]["static"]["fallback_share"] == 1.0
    assert {rows["defaults"]["static"]["routing"] for rows in (vp9, h264)} == {"static"}
    text = md.read_text()
    assert bench_routing.CHAPTER in text and "| `vp9` | one each |" in text
    assert text.count("Target:") == 3 and any(w in text for w in ("met.", "**missed**.", "not settled"))
    figures = page.read_text()
    assert figures.startswith("before\n<!-- routing:begin: generated -->\nWritten by") and "old" not in figures
    assert figures.endswith("<!-- routing:end -->\nafter\n")


def test_an_unknown_setup_is_refused_naming_the_choices():
    from benchmarks import bench_routing

    with pytest.raises(SystemExit, match="unknown setup.*'two each'.*one each, defaults"):
        bench_routing.main(["--setups", "two each"])
