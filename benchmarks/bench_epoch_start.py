"""How long an epoch's first batch takes, against the epoch's other batches.

``python -m benchmarks.bench_epoch_start`` (options: ``--help``) runs
:class:`~daliload.KineticsDALILoader` as users run it on the benchmark's
``h264-gop250`` dataset (every clip goes to the PyAV fallback on a CPU), at
``--batch-size`` 8 with 2 workers, over consecutive epochs (``set_epoch(0)``,
``set_epoch(1)``, ...), and times each batch from asking for it (``iter`` +
``next`` for an epoch's first) to having it. The training step between
batches is simulated (``time.sleep``: the training process waits, as it waits
for a GPU), at ``--step`` seconds:

- ``0``: the loader is the bottleneck, every batch is waited for;
- ``balanced`` (default): 1.25 times the loader's median time per batch with no
  step, measured first, so the workers keep up, as in a GPU training run.

The fallback's workers live across epochs, so an epoch's first batch costs one
batch's decodes (the pass submits it when asked for), where the other batches
were decoded while the caller trained. The difference is what starting each
epoch costs; the loader does not start the next epoch ahead (it did before
the epoch pass was rebuilt; why it no longer does: ``docs/architecture.md``,
"Starting an epoch"). The first pass is not counted (the workers start there).

Writes ``--json`` (default ``benchmarks/results/epoch_start.json``) and its
section of ``benchmarks/RESULTS.md``, both from this one run.
"""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks.datasets import kinetics_layout, prepare_dataset, standard_specs
from benchmarks.report import add_output_options, load_average, publish_run, run_heading
from benchmarks.machine import machine_info
from daliload.loader import DecodeSpec, KineticsDALILoader

CHAPTER = "## Epoch start: `python -m benchmarks.bench_epoch_start`"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_epoch_start",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--batch-size", type=int, default=8, help="clips per batch (default 8)")
    parser.add_argument("--workers", type=int, default=2, help="fallback workers (default 2)")
    parser.add_argument("--clips", type=int, default=64, help="clips in the dataset (default 64)")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per clip (default 10)")
    parser.add_argument("--passes", type=int, default=5, help="epochs, the first not counted (default 5)")
    parser.add_argument("--step", type=_step, default="balanced",
                        help="simulated training step per batch, seconds, or 'balanced' (default)")
    parser.add_argument("--data-dir", default="bench_out/datasets", help="where the dataset is generated (cached)")
    add_output_options(parser, "epoch_start")
    args = parser.parse_args(argv)
    if args.passes < 2:
        parser.error("--passes must be >= 2 (the first is not counted)")
    return args


def _step(text: str) -> str | float:
    """``'balanced'`` or seconds >= 0."""
    if text == "balanced":
        return text
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise argparse.ArgumentTypeError(f"expected seconds >= 0 or 'balanced', got {text!r}")
    return seconds


def timed_pass(loader: KineticsDALILoader, step_s: float) -> list[float]:
    """Seconds waited for each batch of one pass (the first from ``iter``), training ``step_s`` on each."""
    waits = []
    asked = time.perf_counter()
    for _ in loader:
        waits.append(time.perf_counter() - asked)
        if step_s:
            time.sleep(step_s)
        asked = time.perf_counter()
    return waits


def measure(root, args: argparse.Namespace, step_s: float) -> dict:
    """Consecutive epochs at ``step_s`` of training per batch; the first not counted."""
    loader = KineticsDALILoader(root, "train", batch_size=args.batch_size, clip_len=16, frame_stride=4,
                                crop_size=224, device="cpu", decode=DecodeSpec(fallback_workers=args.workers))
    try:
        passes = []
        for epoch in range(args.passes):
            loader.set_epoch(epoch)
            passes.append(timed_pass(loader, step_s))
    finally:
        loader.close()
    counted = passes[1:]
    first, others = statistics.median(p[0] for p in counted), statistics.median(w for p in counted for w in p[1:])
    return {"step_s": step_s, "epochs": list(range(args.passes)), "waits_s": passes,
            "first_batch_s": [p[0] for p in counted], "first_batch_median_s": first,
            "other_batches_median_s": others, "epoch_start_cost_s": first - others}


def markdown(result: dict) -> str:
    s = result["settings"]
    lines = [
        *run_heading(
            "Epoch-start", "epoch_start", "python -m benchmarks.bench_epoch_start", result,
            f"KineticsDALILoader on `{s['dataset']}` ({s['clips']} clips of {s['duration_s']:g} s, all decoded by "
            f"the fallback on the CPU), batch {s['batch_size']}, {s['workers']} workers, 16 frames at stride 4, "
            f"224 crop; {s['passes']} consecutive epochs, the first not counted. Seconds from asking for a batch "
            "to having it (an epoch's first: from `iter`), median; the training step is a sleep."),
        "",
        "| training step per batch | an epoch's first batch | the epoch's other batches | what starting "
        "the epoch costs |",
        "|---|---|---|---|",
    ]
    for run in result["runs"]:
        lines.append(
            f"| {run['label']} ({run['step_s']:.2f} s) | {run['first_batch_median_s']:.3f} "
            f"({', '.join(f'{w:.3f}' for w in run['first_batch_s'])}) | {run['other_batches_median_s']:.3f} | "
            f"{run['epoch_start_cost_s']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    [spec] = standard_specs(["h264-gop250"], num_clips=args.clips, num_clips_hd=args.clips, duration_s=args.duration)
    root = kinetics_layout(prepare_dataset(spec, args.data_dir, workers=2))
    started = load_average()
    runs = []
    free = measure(root, args, 0.0)
    runs.append({"label": "none", **free})
    if args.step == "balanced":
        runs.append({"label": "balanced", **measure(root, args, 1.25 * free["other_batches_median_s"])})
    elif args.step > 0:
        runs.append({"label": "fixed", **measure(root, args, args.step)})
    result = {"name": "epoch_start", "machine": machine_info(args.machine),
              "load_average": [started, load_average()],
              "settings": {"dataset": spec.name, "clips": args.clips, "duration_s": args.duration,
                           "batch_size": args.batch_size,
                           "workers": args.workers, "passes": args.passes},
              "runs": runs}
    publish_run(result, args, markdown(result), chapter=CHAPTER)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
