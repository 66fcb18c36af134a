"""The options of ``python -m benchmarks`` (:mod:`benchmarks.harness` runs them).

Defaults give a run whose tables can be read: 64 clips in every dataset (the
1280x720 one too, with shorter clips: ``--duration-hd``), 3 timed epochs
after 1 warm-up, median with min-max, and the CPU ceiling decoding with as
many processes as the loaders have workers.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.datasets import STANDARD

REPO_ROOT = Path(__file__).resolve().parent.parent


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from err
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"values must be >= 1, got {text!r}")
    return values


def int_at_least(minimum: int):
    """An argparse ``type``: an integer >= ``minimum``, or an error naming the value."""
    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}") from err
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}")
        return value
    return convert


def _name_list(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


def _size(text: str) -> tuple[int, int]:
    try:
        width, height = (int(v) for v in text.lower().split("x"))
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected WIDTHxHEIGHT, e.g. 128x96, got {text!r}") from err
    return width, height


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``python -m benchmarks``."""
    from benchmarks.loaders import LOADERS

    g = parser.add_argument_group("what to run")
    g.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where batches must end up; auto: cuda if torch sees a GPU (default)")
    g.add_argument("--datasets", type=_name_list, default=list(STANDARD),
                   help=f"comma-separated, from {', '.join(STANDARD)} (default: all)")
    g.add_argument("--loaders", type=_name_list, default=list(LOADERS),
                   help=f"comma-separated, from {', '.join(LOADERS)} (default: all); ceilings always run")
    g.add_argument("--workers", type=int_at_least(0), default=None,
                   help="DataLoader workers / DALI threads of the main table (default: 2 on CPU, 8 on GPU, "
                        "at most the usable cores)")
    g.add_argument("--sweep-workers", type=_int_list, default=None,
                   help="workers sweep values, comma-separated (default: 1,2 on CPU; 2,8,16 with >= 16 cores)")
    g.add_argument("--no-sweeps", action="store_true", help="skip the workers sweep")
    g.add_argument("--sweep-dataset", default="h264-gop250", choices=list(STANDARD),
                   help="dataset of the workers sweep (default h264-gop250)")
    g = parser.add_argument_group("datasets and task")
    g.add_argument("--clips", type=int, default=64, help="clips per 340x256 dataset (default 64)")
    g.add_argument("--clips-hd", type=int, default=64, help="clips in the 1280x720 dataset (default 64)")
    g.add_argument("--duration", type=float, default=10.0, help="seconds per clip (default 10, as Kinetics)")
    g.add_argument("--duration-hd", type=float, default=4.0,
                   help="seconds per 1280x720 clip (default 4: still one keyframe per clip at GOP 250, and "
                        "64 such clips keep a 2-core run under half an hour)")
    g.add_argument("--size", type=_size, default=None,
                   help="WIDTHxHEIGHT replacing 340x256 (tests use tiny frames); 720p keeps its size")
    g.add_argument("--batch-size", type=int_at_least(1), default=None,
                   help="clips per batch (default: 2 on CPU, 32 on GPU); a run measures one batch size: for 8 "
                        "and 32, run twice with their own --name (e.g. cpu-b8, cpu-b32)")
    g.add_argument("--seed", type=int, default=0, help="draws the datasets' content and the plan (default 0)")
    g.add_argument("--data-dir", default=str(REPO_ROOT / "bench_out" / "datasets"),
                   help="where generated datasets are cached (default bench_out/datasets)")
    g.add_argument("--gen-workers", type=int, default=None, help="encoder processes (default: usable cores)")
    g = parser.add_argument_group("timing")
    g.add_argument("--runs", type=int, default=3, help="timed epochs per measurement (default 3)")
    g.add_argument("--warmup", type=int, default=1, help="untimed epochs first (default 1)")
    g.add_argument("--timeout", type=float, default=600.0,
                   help="seconds a loader's set-up or one of its epochs may take before its process is killed "
                        "(default 600)")
    g.add_argument("--profile-clips", type=int, default=32,
                   help="clips of the plan the per-stage profile of the fallback times, per dataset "
                        "(default 32; 0: no profile)")
    g.add_argument("--time-budget", type=float, default=None,
                   help="seconds after which no new measurement starts (the rest are listed as skipped)")
    g = parser.add_argument_group("output")
    g.add_argument("--name", default=None, help="result name: RESULTS_DIR/NAME.json, NAME-*.png (default: cpu/gpu)")
    g.add_argument("--machine", default="", help="a label for the machine, e.g. '2-core CPU VM, no GPU'")
    g.add_argument("--results-dir", default=str(REPO_ROOT / "benchmarks" / "results"))
    g.add_argument("--results-md", default=str(REPO_ROOT / "benchmarks" / "RESULTS.md"),
                   help="markdown file the run's section goes to (replacing the previous run of the same name)")
    g.add_argument("--readme", default=str(REPO_ROOT / "docs" / "performance.md"),
                   help="file whose generated speed section (between its speed markers) the run rewrites")
    g.add_argument("--headline", default=str(REPO_ROOT / "README.md"),
                   help="file whose speed-headline figures the run rewrites, when it rewrites --readme's "
                        "speed section (default README.md)")
    g.add_argument("--no-md", action="store_true", help="write neither --results-md nor --readme")
    g.add_argument("--no-plots", action="store_true", help="do not write PNG plots")
    g.add_argument("--report-from", default=None, metavar="JSON",
                   help="measure nothing: make the table and plots of an earlier run's JSON (e.g. one cut short)")


