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


def _demo_report(stopped: bool) -> dict:
    """A demo's metrics.json, as ``daliload.commands.demo.run_demo`` writes it (the fields the README section reads)."""
    return {
        "machine": {"cpus": 2, "device": "cpu", "date_utc": "2026-12-01 14:00", "load_average_start": [3.6, 3.2, 2.9],
                    "load_average_end": [4.8, 3.6, 3.1], "package": {"version": "0.1.0", "commit": "abc1234"}},
        "config": {"width": 170, "height": 128, "duration_s": 3.0, "model": "small3d"},
        "dataset": {"files": 192, "classes": ["a", "b", "c", "d", "e", "f"], "codecs": {"h264": 92, "vp9": 92},
                    "broken": {"garbage": 2, "zero_frames": 1}},
        "scan": {"files": {"dali": 92, "fallback": 95, "bad": 5},
                 "reasons": [["bad", "no video stream", 1], ["bad", "truncated", 4], ["fallback", "h264 on cpu", 95]]},
        "training": {"epochs_run": 4 if stopped else 15, "epochs_planned": 15, "time_cap_minutes": 6.0,
                     "stopped_early": {"reason": "another epoch would overrun --max-minutes 6"} if stopped else None,
                     "fallback_workers": 2, "val_top1": 0.979, "chance": 0.17,
                     "multiview": {"views": [3, 3], "top1": 0.957, "videos": 47}},
        "loader": {"dali_share": 0.48, "run_time_failures": []},
        "seconds": {"generate": 6.2, "scan": 0.4, "train": 61.0, "report": 1.3, "total": 69.0},
    }


def test_the_demo_section_says_what_ran_and_whether_the_time_cap_cut_it(tmp_path):
    from benchmarks import demo_section

    finished = demo_section.readme_section(_demo_report(stopped=False))
    assert "all 15 planned epochs (time cap 6 minutes, not reached)" in finished
    assert "**validation top-1 0.979 against a chance level of 0.17**" in finished
    assert "with the fallback in 2 worker processes" in finished
    assert "load average 3.6 3.2 2.9 at the start and 4.8 3.6 3.1 at the end" in finished
    assert "rejected 5 (no video stream (1); truncated (4))" in finished
    assert "`daliload demo` of daliload 0.1.0 at `abc1234`, with its defaults" in finished
    unnamed = _demo_report(stopped=False)
    del unnamed["machine"]["package"]  # a report from before the demo named its code
    assert "of a daliload with no commit recorded" in demo_section.readme_section(unnamed)
    cut = demo_section.readme_section(_demo_report(stopped=True))
    assert "**4 of the 15 planned epochs: training stopped at the 6-minute cap**" in cut
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\n<!-- demo:begin: written by code -->\nold 1 min 41 s\n<!-- demo:end -->\n\nafter\n")
    metrics = tmp_path / "metrics.json"
    metrics.write_text(json.dumps(_demo_report(stopped=True)))
    assert demo_section.main([str(metrics), "--json", str(tmp_path / "demo.json"), "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert "old 1 min 41 s" not in text and cut in text and text.endswith("<!-- demo:end -->\n\nafter\n")
    assert json.loads((tmp_path / "demo.json").read_text()) == _demo_report(stopped=True)


def test_the_readme_demo_figures_are_the_stored_runs():
    """docs/demo.md's demo paragraph is exactly what the stored run's JSON gives: nobody edited a figure by hand."""
    from benchmarks import demo_section

    repo = Path(__file__).resolve().parents[1]
    report = json.loads((repo / "benchmarks" / "results" / "demo.json").read_text())
    readme = (repo / "docs" / "demo.md").read_text()
    marked = readme.split("<!-- demo:begin", 1)[1].split("-->", 1)[1].split("<!-- demo:end -->", 1)[0]
    assert marked.strip() == demo_section.readme_section(report)


def test_the_views_benchmark_compares_each_way_with_the_same_parallelism(tmp_path):
    """README's claim and the RESULTS section come from the run's JSON; DALI's baseline is the same batch."""
    from benchmarks import bench_views

    run = json.loads((DATA / "views-run.json").read_text())  # a tiny real run: 1 video, 2 x 2 views, 1 run
    md, readme = tmp_path / "RESULTS.md", tmp_path / "README.md"
    readme.write_text("# x\n\n<!-- views:begin: by code -->\nDALI reads the file once (old claim)\n"
                      "<!-- views:end -->\n")
    assert bench_views.main(["--report-from", str(DATA / "views-run.json"), "--results-md", str(md),
                             "--readme", str(readme)]) == 0
    section = md.read_text()
    assert "| decoder (codec) | all views of a video together | each view on its own | ratio |" in section
    assert "DALI with batches of the 4 views of one video on 2 threads both ways" in section
    claim = readme.read_text()
    assert "old claim" not in claim and "the same batch of 4 views on 2 threads" in claim
    dali = run["dali"]
    assert f"{dali['together']['median']:.1f} against {dali['each_on_its_own']['median']:.1f} views/s" in claim
    # Within the noise of these machines, the claim is that sharing the read gains nothing measurable.
    even = json.loads(json.dumps(run))
    even["dali"]["together"]["median"] = even["dali"]["each_on_its_own"]["median"] * 1.05
    assert "**reading the file once for all views gains DALI nothing measurable** (1.05x" in \
        bench_views.readme_figures(even)


def test_each_view_on_its_own_gets_its_own_read_of_the_same_file(tmp_path):
    from benchmarks.bench_views import own_reads
    from daliload.plan import CropBox, Sample

    video = tmp_path / "v.webm"
    video.write_bytes(b"bytes of a video")
    group = [Sample(position=i, video_index=0, path=str(video), label=0, start_frame=4 * i, frame_stride=4,
                    clip_len=16, crop=CropBox.full()) for i in range(3)]
    (separate,) = own_reads([group], tmp_path / "links")
    assert len({s.path for s in separate}) == 3  # the decoder reads each path once per batch: three reads
    assert all(Path(s.path).read_bytes() == b"bytes of a video" for s in separate)
    assert [s.start_frame for s in separate] == [0, 4, 8] and all(s.path != str(video) for s in separate)
