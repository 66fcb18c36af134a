"""Pre-screen throughput: files per second per core, for the probe and for ``--deep``.

Generates Kinetics-like clips (340x256, 10 s, H.264 and VP9, no audio) with
:func:`daliload.synth.dataset.generate_dataset` into a temporary folder (or
reuses ``--data``), then measures:

- ``probe``: :func:`daliload.prescreen.probe_file` in this process: the cost
  of the probe itself (demux every packet, decode one frame), in files per
  CPU-second of this process, i.e. per core;
- ``deep``: probe plus the deep check on ``--device`` (CPU: DALI's CPU decoder
  for VP9, the PyAV fallback for H.264), also per CPU-second (DALI's threads
  count too);
- ``scan``: the whole ``daliload scan`` (``stat``, worker pool, SQLite) with
  ``--workers`` processes into a fresh manifest, on the wall clock, divided by
  the cores used. On a shared machine the wall clock includes other people's
  load (the load average is recorded); the CPU-time figures do not.

Each is repeated ``--runs`` times after a warm-up; the median and the spread
(min..max) are reported. Files are read from the page cache after the first
run, so this measures CPU cost, not disk. Target: >= 200 files/s per core for
the probe, so Kinetics-700 (~650k files) screens in minutes on a 16-core host.

    python -m benchmarks.bench_probe --clips 32 --runs 5

It writes ``benchmarks/results/probe.json`` and puts its markdown in
``benchmarks/RESULTS.md`` as the section ``### Probe run `probe` — ...``,
replacing the previous run's.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from daliload.prescreen import probe_file, scan
from daliload.prescreen.probe_pool import ProbeTask, run_probe_task
from daliload.prescreen.rows import ProbeRows
from daliload.prescreen.scan import default_workers
from benchmarks.machine import package_commit

TARGET_FILES_PER_S = 200.0
_REALCLIPS = Path(__file__).resolve().parents[2] / "shared" / "realclips"
#: The real 340x256 Kinetics H.264 downloads among the shared test clips.
REAL_KINETICS = [_REALCLIPS / "video_reader_benchmark" / "R6llTwEh07w.mp4",
                 _REALCLIPS / "video_reader_benchmark" / "SOX5yA1l24A.mp4",
                 _REALCLIPS / "mmaction2" / "test.mp4"]


def _generate(root: Path, clips: int, seed: int) -> None:
    from daliload.synth.dataset import SynthSpec, generate_dataset

    classes = 4
    spec = SynthSpec(
        num_classes=classes,
        clips_per_class=max(1, clips // classes),
        val_fraction=0.0,
        width=340,
        height=256,
        duration_s=10.0,
        fps_mix={30: 1.0},
        codec_mix={"h264": 0.5, "vp9": 0.5},
        seed=seed,
    )
    generate_dataset(root, spec, workers=min(2, default_workers()), progress=False)


def _files(root: Path) -> dict[str, list[str]]:
    by_codec: dict[str, list[str]] = {}
    for path in sorted(root.glob("train/*/*")):
        if path.suffix in (".mp4", ".webm"):
            by_codec.setdefault("h264" if path.suffix == ".mp4" else "vp9", []).append(str(path))
    return by_codec


def _rate(run, count: int, runs: int, *, clock=time.process_time) -> dict:
    """Files per second of ``clock``: CPU time of this process (= per core) by default."""
    run()  # warm-up: imports, page cache, DALI pipeline build
    rates, wall = [], []
    for _ in range(runs):
        start, start_wall = clock(), time.perf_counter()
        run()
        rates.append(count / (clock() - start))
        wall.append(count / (time.perf_counter() - start_wall))
    return {
        "files": count,
        "median_files_per_s": statistics.median(rates),
        "min_files_per_s": min(rates),
        "max_files_per_s": max(rates),
        "median_wall_files_per_s": statistics.median(wall),
        "clock": "cpu" if clock is time.process_time else "wall",
        "runs": runs,
    }


def _probe_all(paths: list[str]) -> None:
    for path in paths:
        facts = probe_file(path)
        if not facts.ok:
            raise RuntimeError(f"{path}: {facts.reason}")


def _deep_all(paths: list[str], device: str) -> None:
    for path in paths:
        rows = ProbeRows(*run_probe_task(ProbeTask(0, path, deep_device=device)))
        deep = dict((row[0], row) for row in rows.routes)[device]
        if deep[1] == "bad" or not deep[3]:
            raise RuntimeError(f"{path}: deep check gave {deep}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--clips", type=int, default=32, help="clips to generate (half H.264, half VP9)"
    )
    parser.add_argument(
        "--runs", type=int, default=5, help="timed runs per measurement (after a warm-up)"
    )
    parser.add_argument(
        "--workers", type=int, default=default_workers(), help="scan worker processes"
    )
    parser.add_argument("--scan-copies", type=int, default=8,
                        help="hard-linked copies of the clips the scan measurement probes")
    parser.add_argument(
        "--device", choices=("cpu", "gpu"), default="cpu", help="device of the deep check"
    )
    parser.add_argument("--data", type=Path, default=None, help="reuse (or create) clips here")
    parser.add_argument("--real", type=Path, nargs="*", default=REAL_KINETICS,
                        help="real Kinetics clips to probe too (skipped when missing)")
    parser.add_argument("--no-deep", action="store_true", help="skip the deep-check measurements")
    parser.add_argument(
        "--machine",
        default=f"{platform.machine()} {default_workers()}-core",
        help="machine description for the report",
    )
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "probe.json"
    )
    parser.add_argument("--results-md", type=Path, default=Path(__file__).parent / "RESULTS.md",
                        help="markdown file whose `### Probe run` section the run replaces")
    parser.add_argument("--no-md", action="store_true", help="print the markdown only")
    parser.add_argument("--report-from", type=Path, default=None, metavar="JSON",
                        help="measure nothing: write the section of an earlier run's JSON")
    return parser


def _clips(root: Path, clips: int) -> dict[str, list[str]]:
    """The clips under ``root`` by codec, generated first if there are none."""
    if not _files(root):
        start = time.perf_counter()
        _generate(root, clips, seed=0)
        print(
            f"generated {clips} clips in {time.perf_counter() - start:.0f} s",
            file=sys.stderr,
        )
    return _files(root)


def _measure_probe_and_deep(args: argparse.Namespace, by_codec: dict[str, list[str]], results: dict) -> None:
    """Probe (and deep-check) rates per codec and for all clips, into results["probe"] and results["deep"]."""
    every = [p for paths in by_codec.values() for p in paths]
    real = [str(p) for p in args.real if p.is_file()]
    if real:  # real downloads have smaller keyframes than the noisy generated content
        results["probe"]["real kinetics h264"] = _rate(functools.partial(_probe_all, real), len(real),
                                                       args.runs * 10)
    for codec, paths in [*by_codec.items(), ("all", every)]:
        results["probe"][codec] = _rate(functools.partial(_probe_all, paths), len(paths), args.runs)
        if not args.no_deep:
            results["deep"][codec] = _rate(
                functools.partial(_deep_all, paths, args.device), len(paths), max(1, args.runs // 2)
            )


def _link_copies(paths: list[str], scan_root: Path, copies: int) -> int:
    """Hard-link ``copies`` copies of ``paths`` under ``scan_root/train``; returns the number of files."""
    for copy in range(copies):
        for path in paths:
            link = scan_root / "train" / f"copy{copy}" / Path(path).name
            link.parent.mkdir(parents=True, exist_ok=True)
            os.link(path, link)
    return len(paths) * copies


def _measure_scan(args: argparse.Namespace, every: list[str], tmp: Path) -> dict:
    """The whole scan's rate on the wall clock, per core used, and its supervisor's CPU cost per file."""
    # Hard links give the scan enough files to amortize starting its workers.
    scan_root = tmp / "scan"
    scan_files = _link_copies(every, scan_root, args.scan_copies)
    parent_cpu: list[float] = []

    def one_scan() -> None:
        start_cpu = time.process_time()
        manifest = tmp / f"m{time.monotonic_ns()}.sqlite"
        summary = scan(scan_root, manifest_path=manifest, device=args.device,
                       workers=args.workers, splits=("train",), progress=False)
        if summary.probed != scan_files:
            raise RuntimeError(f"scan probed {summary.probed} of {scan_files} files")
        parent_cpu.append(time.process_time() - start_cpu)

    # Workers are other processes: the scan is timed on the wall clock.
    scan_rate = _rate(one_scan, scan_files, max(1, args.runs // 2), clock=time.perf_counter)
    cores = min(args.workers, default_workers())
    scan_rate["workers"] = args.workers
    # The supervisor's own cost (stat, IPC, SQLite, progress): what caps a many-core scan.
    scan_rate["parent_cpu_ms_per_file"] = 1000 * statistics.median(parent_cpu) / scan_files
    scan_rate["median_files_per_s_per_core"] = scan_rate["median_files_per_s"] / cores
    return scan_rate


def markdown(report: dict) -> str:
    """The run as a RESULTS.md section (``### Probe run `probe` — ...``): load, table, supervisor cost, verdict."""
    results = report["results"]
    s = results["scan"]["all"]
    cores = report["scan_cores"]
    load = report["load_average_1min"]
    lines = [
        f"### Probe run `probe` — {report['machine']}, {report['date']}",
        "",
        f"`python -m benchmarks.bench_probe`; {', '.join(f'{k} {v}' for k, v in report['versions'].items())}. "
        f"Load average (1 min) {load['start']:.1f} at the start and {load['end']:.1f} at the end, on "
        f"{report['cores']} cores. Clips: {', '.join(f'{n} {c}' for c, n in report['clips'].items())} "
        f"({report['clip']}); median of {report['runs']} runs after a warm-up, spread min..max. Probe and deep "
        "rows count the probing process's CPU time (files/s per core); the scan row is wall time divided by "
        "the cores it used.",
        "",
        "| measurement | clips | files/s per core (median) | spread (min..max) |",
        "|---|---|---:|---|",
    ]
    for kind in ("probe", "deep"):
        for codec, r in results[kind].items():
            label = kind if kind == "probe" else f"deep ({report['deep_device']})"
            lines.append(f"| {label}, CPU time | {codec} | {r['median_files_per_s']:.0f} | "
                         f"{r['min_files_per_s']:.0f}..{r['max_files_per_s']:.0f} |")
    lines += [
        f"| scan, {s['workers']} workers, wall / {cores} cores | {s['files']} files | "
        f"{s['median_files_per_s_per_core']:.0f} | "
        f"{s['min_files_per_s'] / cores:.0f}..{s['max_files_per_s'] / cores:.0f} |",
        "",
        f"Scan supervisor (stat, IPC, SQLite): {s['parent_cpu_ms_per_file']:.2f} ms of CPU per file.",
    ]
    probe_all = results["probe"]["all"]["median_files_per_s"]
    verdict = "met" if probe_all >= TARGET_FILES_PER_S else "missed"
    lines += ["", f"**Probe target (>= {TARGET_FILES_PER_S:.0f} files/s per core, all clips): {probe_all:.0f}, "
                  f"{verdict}.**"]
    return "\n".join(lines) + "\n"


def _report(report: dict, args: argparse.Namespace) -> int:
    """Print the section and, unless ``--no-md``, put it in ``--results-md`` (replacing the last run's)."""
    from benchmarks.report import record_section

    record_section(markdown(report), None if args.no_md else args.results_md)
    print(f"(JSON in {args.out})")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.report_from is not None:
        return _report(json.loads(args.report_from.read_text(encoding="utf-8")), args)
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench_probe_") as tmp:
        by_codec = _clips(args.data or Path(tmp) / "clips", args.clips)
        results: dict = {"probe": {}, "deep": {}, "scan": {}}
        _measure_probe_and_deep(args, by_codec, results)
        every = [p for paths in by_codec.values() for p in paths]
        results["scan"]["all"] = _measure_scan(args, every, Path(tmp))

    report = {
        "benchmark": "bench_probe",
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": args.machine,
        "package_commit": package_commit(),
        "versions": {"python": platform.python_version(), **_versions()},
        "cores": default_workers(),
        "scan_cores": min(args.workers, default_workers()),
        "runs": args.runs,
        "clips": {codec: len(paths) for codec, paths in by_codec.items()},
        "clip": "340x256, 10 s, 30 fps, keyframe every 250 frames, no audio",
        "deep_device": args.device,
        "target_files_per_s_per_core": TARGET_FILES_PER_S,
        "load_average_1min": {"start": load_start, "end": os.getloadavg()[0]},
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return _report(report, args)


def _versions() -> dict[str, str]:
    import importlib.metadata

    found = {}
    for package in ("av", "nvidia-dali-cuda130", "nvidia-dali-cuda120"):
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


if __name__ == "__main__":
    sys.exit(main())
