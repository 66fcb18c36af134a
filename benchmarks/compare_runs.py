"""Two runs of ``python -m benchmarks`` side by side: the code before a change against the code after it.

``python -m benchmarks.compare_runs BEFORE.json AFTER.json --name NAME`` reads
two result files of the main benchmark, made on the same machine in one
session with the same options (each by its own checkout, e.g. a ``git
worktree`` of the commit before the change), and writes
``benchmarks/results/NAME.json`` (both runs' measurements, the machine and the
figures below) and a section of ``benchmarks/RESULTS.md``:

- clips/s of every loader on every dataset, before and after, and after over before;
- the whole loader against the path it routes that dataset to, within each
  run: ``daliload`` over ``daliload-fallback`` on H.264 (the CPU's DALI has no
  H.264) and over ``daliload-dali-cpu`` on VP9.

Every figure comes from the two JSON files; nothing is measured here.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.report import append_markdown, publish
from benchmarks.machine import machine_line

CHAPTER = "## Before and after a change: `python -m benchmarks.compare_runs`"
#: dataset name prefix -> the loader the whole loader routes its files to on the CPU
ROUTED_TO = {"h264": "daliload-fallback", "vp9": "daliload-dali-cpu"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compare_runs", description=__doc__.split("\n")[0])
    parser.add_argument("before", type=Path, help="result JSON of the code before the change")
    parser.add_argument("after", type=Path, help="result JSON of the code after it")
    parser.add_argument("--name", required=True, help="names the output: benchmarks/results/NAME.json")
    parser.add_argument("--before-commit", required=True, help="the commit the BEFORE run measured")
    parser.add_argument("--after-commit", required=True, help="the commit the AFTER run measured")
    parser.add_argument("--what", default="", help="one line on what changed between the two runs")
    parser.add_argument("--results-dir", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--results-md", type=Path, default=Path("benchmarks/RESULTS.md"))
    parser.add_argument("--no-md", action="store_true", help="do not touch RESULTS.md")
    return parser.parse_args(argv)


def clips_per_s(run: dict) -> dict[tuple[str, str], dict]:
    """``(dataset, loader) -> clips/s summary`` of a run's loaders of the main table (sweeps left out)."""
    return {(m["dataset"], m["loader"]): m["figures"]["clips_per_s"] for m in run["measurements"]
            if m["kind"] == "loader" and m.get("sweep") in (None, "main") and m.get("status") == "ok"
            and m.get("figures")}


def compare(before: dict, after: dict) -> dict:
    """The figures: per (dataset, loader) before/after medians, and the whole loader over its route."""
    old, new = clips_per_s(before), clips_per_s(after)
    rows = []
    for key in sorted(set(old) | set(new)):
        b, a = old.get(key), new.get(key)
        rows.append({"dataset": key[0], "loader": key[1], "before": b, "after": a,
                     "after_over_before": a["median"] / b["median"] if a and b else None})
    routed = []
    for dataset in sorted({d for d, _ in new}):
        path = next((loader for prefix, loader in ROUTED_TO.items() if dataset.startswith(prefix)), None)
        for label, run in (("before", old), ("after", new)):
            whole, part = run.get((dataset, "daliload")), run.get((dataset, path))
            if whole and part:
                routed.append({"dataset": dataset, "run": label, "route": path,
                               "whole_over_route": whole["median"] / part["median"]})
    return {"loaders": rows, "whole_over_route": routed}


def _cell(summary: dict | None) -> str:
    if not summary:
        return "not run"
    return f"{summary['median']:.1f} ({summary['low']:.1f}-{summary['high']:.1f})"


def markdown(result: dict) -> str:
    f = result["figures"]
    lines = [f"### Before/after run `{result['name']}` — {machine_line(result['machine'])}", "",
             f"`python -m benchmarks.compare_runs` of `{result['before_file']}` (package `{result['before_commit']}`) "
             f"and `{result['after_file']}` (package `{result['after_commit']}`)"
             + (f": {result['what']}" if result["what"] else "") + ". Clips/s, median (range) of the timed runs.",
             "", "| dataset | loader | before | after | after / before |", "|---|---|---|---|---|"]
    for r in f["loaders"]:
        ratio = "" if r["after_over_before"] is None else f"{r['after_over_before']:.2f}x"
        lines.append(f"| {r['dataset']} | {r['loader']} | {_cell(r['before'])} | {_cell(r['after'])} | {ratio} |")
    lines += ["", "| dataset | run | the whole loader over the path it routes to |", "|---|---|---|"]
    for r in f["whole_over_route"]:
        lines.append(f"| {r['dataset']} | {r['run']} | {r['whole_over_route']:.2f}x `{r['route']}` |")
    return "\n".join(lines) + "\n"


def _differences(before: dict, after: dict) -> list[str]:
    """What the two runs were asked to do differently (settings, dataset specs; where the data lies aside)."""
    differ = sorted(k for k in set(before["settings"]) | set(after["settings"])
                    if before["settings"].get(k) != after["settings"].get(k))
    specs = [[{k: v for k, v in d.items() if k != "root"} for d in run["datasets"]] for run in (before, after)]
    return differ + (["datasets"] if specs[0] != specs[1] else [])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    before, after = (json.loads(p.read_text()) for p in (args.before, args.after))
    differ = _differences(before, after)
    if differ:
        print(f"compare_runs: the two runs differ in {', '.join(differ)}; compare equal work", file=sys.stderr)
        return 2
    result = {"name": args.name, "what": args.what, "machine": after["machine"],
              "before_file": args.before.name, "after_file": args.after.name,
              "before_commit": args.before_commit, "after_commit": args.after_commit,
              "figures": compare(before, after), "before": before, "after": after}
    publish(result, args.results_dir / f"{args.name}.json", markdown(result), None if args.no_md else args.results_md,
            write_md=lambda path, text: append_markdown(path, text, chapter=CHAPTER))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
