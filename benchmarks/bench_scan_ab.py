"""The first scan's rate, one checkout's code against another's, interleaved: ``python -m benchmarks.bench_scan_ab``.

``python -m benchmarks.bench_scan_ab --checkout before=/tmp/wt-old --checkout now=.``
builds one tree of ``--files`` videos (hardlinks of the scale benchmark's
source clips, :mod:`benchmarks.scale_tree`), then in each of ``--rounds``
rounds scans it once with each checkout's daliload, each scan into a new
manifest (every file probed, ``--workers`` probe workers, on the CPU) in a
fresh process that imports that checkout, with ``torch`` imported first as a
training script has it. The order of the checkouts rotates by one each
round, so a drift of the machine's speed moves them alike, and each
checkout's rate is compared with the first checkout's within each round.

It answers whether code or machine moved the first scan's rate between two
runs of :mod:`benchmarks.bench_scale` (whose ``fresh_scan`` is the same scan
of 2,000 files). The JSON records each checkout's commit, the machine and its
load; the section of ``docs/scale.md`` between its ``scan-ab`` markers and of
``benchmarks/RESULTS.md`` are written from it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.machine import commit_of, machine_info, machine_line
from benchmarks.options import int_at_least
from benchmarks.report import add_output_options, load_average, publish_run
from benchmarks.scale_tree import build_tree, source_clips

CHAPTER = "## The first scan's rate, code against code: `python -m benchmarks.bench_scan_ab`"

#: What a scan process runs: the checkout's own ``scan`` on the tree, timed whole, and its own CPU.
_CHILD = """
import json, resource, sys, time
import torch  # noqa: F401  (a training script has it imported)
from daliload.prescreen import scan
a = json.loads(sys.argv[1])
before = resource.getrusage(resource.RUSAGE_SELF)
started = time.perf_counter()
summary = scan(a["root"], manifest_path=a["manifest"], device="cpu", workers=a["workers"], progress=False)
wall = time.perf_counter() - started
after = resource.getrusage(resource.RUSAGE_SELF)
cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
print(json.dumps({"wall_s": wall, "probed": summary.probed, "parent_cpu_s": cpu}))
"""


def _checkout(text: str) -> tuple[str, Path]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH, got {text!r}")
    folder = Path(path).resolve()
    if not (folder / "daliload" / "__init__.py").is_file():
        raise argparse.ArgumentTypeError(f"{folder} is not a daliload checkout (no daliload/__init__.py)")
    return name, folder


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_scan_ab", description=__doc__.split("\n")[0])
    parser.add_argument("--checkout", dest="checkouts", type=_checkout, action="append", default=None,
                        metavar="NAME=PATH", help="a daliload checkout to scan with (repeat; the first is the "
                                                  "reference; default: this checkout, as 'now')")
    parser.add_argument("--files", type=int_at_least(1), default=2000, help="videos in the tree (default 2000)")
    parser.add_argument("--rounds", type=int_at_least(1), default=5, help="rounds (default 5)")
    parser.add_argument("--workers", type=int_at_least(1), default=2, help="probe workers a scan (default 2)")
    parser.add_argument("--clips", type=Path, default=None, help="source clips (default: generated, as bench_scale)")
    parser.add_argument("--data-dir", default="bench_out/datasets", help="cache of the generated source clips")
    parser.add_argument("--readme", default=None, help="a file whose scan-ab markers get the run's summary "
                                                       "(e.g. docs/scale.md)")
    add_output_options(parser, "scan-ab")
    args = parser.parse_args(argv)
    args.checkouts = args.checkouts or [("now", Path(__file__).resolve().parent.parent)]
    names = [name for name, _ in args.checkouts]
    if len(set(names)) != len(names):
        parser.error(f"--checkout names must differ, got {names}")
    return args


def scan_once(folder: Path, root: Path, manifest: Path, workers: int) -> dict:
    """One first scan of ``root`` with the daliload of ``folder``, in a fresh process."""
    env = dict(os.environ, PYTHONPATH=str(folder))
    proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps({"root": str(root), "manifest": str(manifest),
                                                                       "workers": workers})],
                          cwd=folder, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"bench_scan_ab: the scan with {folder} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(args: argparse.Namespace, work: Path) -> dict:
    sources = source_clips(args, work)
    root = work / "tree"
    build_tree(root, sources, args.files)
    names = [name for name, _ in args.checkouts]
    rounds = []
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        scans = {}
        for name in order:
            manifest = work / f"{name}-{r}.sqlite"
            scans[name] = scan_once(dict(args.checkouts)[name], root, manifest, args.workers)
            scans[name]["files_per_s"] = scans[name]["probed"] / scans[name]["wall_s"]
            manifest.unlink(missing_ok=True)
        rounds.append({"order": order, "scans": scans})
    return {"sources": [p.name for p in sources], "rounds": rounds}


def summarize(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": values}


def figures(result: dict) -> dict:
    """Per checkout: files/s over the rounds, and its rate over the first checkout's within each round."""
    names = [c["name"] for c in result["checkouts"]]
    rounds = result["measurements"]["rounds"]
    out = {}
    for name in names:
        rates = [r["scans"][name]["files_per_s"] for r in rounds]
        ratios = [r["scans"][name]["files_per_s"] / r["scans"][names[0]]["files_per_s"] for r in rounds]
        out[name] = {"files_per_s": summarize(rates), "over_first": summarize(ratios),
                     "parent_ms_per_file": statistics.median(
                         1000 * r["scans"][name]["parent_cpu_s"] / r["scans"][name]["probed"] for r in rounds)}
    return out


def verdict(ratio: dict, *, band: float = 0.05) -> str:
    """Whether the rounds say the two rates differ: every round more than ``band`` to one side, or not."""
    if ratio["min"] > 1 + band:
        return "faster in every round"
    if ratio["max"] < 1 - band:
        return "slower in every round"
    if ratio["min"] >= 1 - band and ratio["max"] <= 1 + band:
        return f"the same within {band:.0%} in every round"
    return "not settled (the rounds straddle it)"


def summary_lines(result: dict) -> list[str]:
    """The run in words and one table, as ``docs/scale.md`` and ``RESULTS.md`` show it."""
    names = [c["name"] for c in result["checkouts"]]
    f = result["figures"]
    head = (f"Written by `python -m benchmarks.bench_scan_ab` from its run's JSON (`benchmarks/results/"
            f"{Path(result['json']).name}`; {machine_line(result['machine'])}, the harness's own code; "
            f"load average {result['load_average'][0]} at the start, {result['load_average'][1]} at the end): "
            f"a first scan of {result['files']:,} files with {result['workers']} probe workers, "
            f"{len(result['measurements']['rounds'])} rounds, the checkouts in rotated order.")
    lines = [head, "", f"| checkout | commit | files/s, median (min-max) | over `{names[0]}`, within each round | "
             "the scanning process's CPU per file, ms |", "|---|---|---|---|---|"]
    for c in result["checkouts"]:
        g = f[c["name"]]
        rate, ratio = g["files_per_s"], g["over_first"]
        vs = "–" if c["name"] == names[0] else \
            f"{ratio['median']:.2f}x ({ratio['min']:.2f}-{ratio['max']:.2f}): {verdict(ratio)}"
        lines.append(f"| `{c['name']}` | `{_short(c['commit'])}` | {rate['median']:.0f} "
                     f"({rate['min']:.0f}-{rate['max']:.0f}) | {vs} | {g['parent_ms_per_file']:.3f} |")
    return lines


def _short(commit: str) -> str:
    """A recorded commit as the table shows it: the hash's first 7 digits, and whether the code was dirty."""
    head, _, rest = commit.partition(" ")
    return head[:7] + (f" {rest}" if rest else "") if not commit.startswith("unknown") else commit


def readme_figures(result: dict) -> str:
    """What stands between ``docs/scale.md``'s ``scan-ab`` markers."""
    return "\n".join(summary_lines(result))


def markdown(result: dict) -> str:
    title = f"### Scan run `{result['name']}` — {machine_line(result['machine'])}"
    return "\n".join([title, "", *summary_lines(result), ""])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="daliload-scan-ab-"))
    started = load_average()
    try:
        measured = measure(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {"name": "scan-ab", "json": Path(args.json).name, "files": args.files, "workers": args.workers,
              "checkouts": [{"name": name, "commit": commit_of(folder)}
                            for name, folder in args.checkouts],
              "machine": machine_info(args.machine), "load_average": [started, load_average()],
              "measurements": measured}
    result["figures"] = figures(result)
    publish_run(result, args, markdown(result), chapter=CHAPTER, marker="scan-ab", figures=readme_figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
