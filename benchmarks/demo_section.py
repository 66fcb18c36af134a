"""README's figures of a ``daliload demo`` run, written from that run's ``metrics.json``.

``python -m benchmarks.demo_section [demo_out/report/metrics.json]`` copies the
run's report to ``benchmarks/results/demo.json`` and rewrites what stands
between docs/demo.md's ``demo`` markers (:func:`benchmarks.report.write_marked`)
from it: the machine and how busy it was, what was generated and how the scan
routed it, how many of the planned epochs ran (and why training stopped, when
the time cap cut it short), accuracy against chance, the DALI share, run-time
failures and where the time went. ``--report-from JSON`` rewrites the section
from a stored copy without touching ``--json``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.report import save_result, write_marked

HERE = Path(__file__).resolve().parent


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.demo_section", description=__doc__.split("\n")[0])
    parser.add_argument("metrics", nargs="?", default="demo_out/report/metrics.json",
                        help="a demo run's report/metrics.json (%(default)s)")
    parser.add_argument("--report-from", default=None, metavar="JSON",
                        help="write the section from this stored copy instead (nothing is copied)")
    parser.add_argument("--json", default=str(HERE / "results" / "demo.json"), help="where the copy goes")
    parser.add_argument("--readme", default=str(HERE.parent / "docs" / "demo.md"),
                        help="the page whose demo markers get the figures (default docs/demo.md)")
    return parser.parse_args(argv)


def _counts(mapping: dict) -> str:
    return ", ".join(f"{name} {count}" for name, count in sorted(mapping.items())) or "none"


def readme_section(report: dict) -> str:
    """The README paragraph of one demo run (``report`` is its ``metrics.json``)."""
    machine, dataset, scan, training = report["machine"], report["dataset"], report["scan"], report["training"]
    loader, seconds, config = report["loader"], report["seconds"], report["config"]
    start, end = machine.get("load_average_start"), machine.get("load_average_end")
    busy = f", load average {' '.join(f'{x:.1f}' for x in start)} at the start" if start else ""
    busy += f" and {' '.join(f'{x:.1f}' for x in end)} at the end" if start and end else ""
    gpu = "no GPU" if machine["device"] == "cpu" else "a GPU"
    files = scan["files"]
    reasons = "; ".join(f"{reason} ({count})" for route, reason, count in scan["reasons"] if route == "bad")
    run, planned = training["epochs_run"], training["epochs_planned"]
    if training["stopped_early"]:
        epochs = (f"**{run} of the {planned} planned epochs: training stopped at the "
                  f"{training['time_cap_minutes']:g}-minute cap** (another epoch would have overrun it; the demo "
                  f"says so, and `metrics.json` records both counts)")
    else:
        epochs = f"all {planned} planned epochs (time cap {training['time_cap_minutes']:g} minutes, not reached)"
    workers = training["fallback_workers"]
    decode = (f"the fallback in {workers} worker processes" if workers else "the fallback in the training process")
    multiview = training.get("multiview")
    views = (f"; multi-view top-1 {multiview['top1']:.3f} ({multiview['views'][0]} x {multiview['views'][1]} "
             f"views, each of {multiview['videos']} val videos once)" if multiview else "")
    failed = len(loader["run_time_failures"])
    package = machine.get("package") or {}
    code = (f"daliload {package.get('version')} at `{package['commit']}`" if package.get("commit")
            else "a daliload with no commit recorded")
    return (
        f"Written by `python -m benchmarks.demo_section` from one run's `metrics.json` "
        f"(`benchmarks/results/demo.json`): `daliload demo` of {code}, with its defaults, on "
        f"{machine['cpus']} CPUs, {gpu} ({machine['date_utc']} UTC{busy}). It generated {dataset['files']} files "
        f"({len(dataset['classes'])} motion classes, {config['width']}x{config['height']}, "
        f"{config['duration_s']:g} s; {_counts(dataset['codecs'])}; broken or odd on purpose: "
        f"{_counts(dataset['broken'])}); the scan for the {machine['device'].upper()} sent {files.get('dali', 0)} "
        f"to DALI, {files.get('fallback', 0)} to the fallback and rejected {files.get('bad', 0)} ({reasons}). "
        f"It trained `{config['model']}` for {epochs}, with {decode}: **validation top-1 "
        f"{training['val_top1']:.3f} against a chance level of {training['chance']:.2f}**{views}; "
        f"{loader['dali_share']:.0%} of the training clips decoded by DALI, {failed} failed at run time. "
        f"Time: " + ", ".join(f"{name} {value:.{1 if value < 10 else 0}f} s" for name, value in seconds.items()) + "."
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    source = Path(args.report_from or args.metrics)
    report = json.loads(source.read_text(encoding="utf-8"))
    if args.report_from is None:
        save_result(report, args.json)
    text = readme_section(report)
    print(text)
    if not write_marked(args.readme, "demo", text):
        print(f"(no demo markers in {args.readme}: nothing written there)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
