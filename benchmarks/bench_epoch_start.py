"""How long an epoch's first batch takes, with the next epoch started ahead and without.

``python -m benchmarks.bench_epoch_start`` (options: ``--help``) runs
:class:`~daliload.KineticsDALILoader` as users run it on the benchmark's
``h264-gop250`` dataset (every clip goes to the PyAV fallback on a CPU), at
``--batch-size`` 8 with 2 workers, and times each batch from asking for it
(``iter`` + ``next`` for an epoch's first) to having it. The training step
between batches is simulated (``time.sleep``: the training process waits, as
it waits for a GPU), at ``--step`` seconds:

- ``0``: the loader is the bottleneck, every batch is waited for;
- ``balanced`` (default): 1.25 times the loader's median time per batch with no
  step, measured first, so the workers keep up, as in a GPU training run.

Two ways through the epochs, on the same loader settings and the same sizes:

- ``next epoch ahead``: ``set_epoch(0)``, ``set_epoch(1)``, ...: the loader
  starts epoch ``e + 1``'s first transfers when it hands out epoch ``e``'s
  last batch (:meth:`daliload.epoch.FallbackWorkers.warm`);
- ``nothing ahead``: ``set_epoch(0)``, ``set_epoch(2)``, ``set_epoch(4)``, ...:
  epochs that do not follow one another are not foreseen, so each pass starts
  its workers on its first batch when it is asked for.

The first two passes of each way are not counted (the loader starts an epoch
ahead only once it has seen one epoch follow another).

Writes ``--json`` (default ``benchmarks/results/epoch_start.json``) and its
section of ``benchmarks/RESULTS.md``, both from this one run.
"""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks.datasets import kinetics_layout, prepare_dataset, standard_specs
from benchmarks.report import (
    add_output_options,
    append_markdown,
    load_average,
    machine_info,
    machine_line,
    publish,
    versions_line,
)
from daliload.loader import DecodeSpec, KineticsDALILoader

CHAPTER = "## Epoch start: `python -m benchmarks.bench_epoch_start`"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_epoch_start",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--batch-size", type=int, default=8, help="clips per batch (default 8)")
    parser.add_argument("--workers", type=int, default=2, help="fallback workers (default 2)")
    parser.add_argument("--clips", type=int, default=64, help="clips in the dataset (default 64)")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per clip (default 10)")
    parser.add_argument("--passes", type=int, default=5, help="passes per way, the first two not counted (default 5)")
    parser.add_argument("--step", type=_step, default="balanced",
                        help="simulated training step per batch, seconds, or 'balanced' (default)")
    parser.add_argument("--data-dir", default="bench_out/datasets", help="where the dataset is generated (cached)")
    add_output_options(parser, "epoch_start")
    args = parser.parse_args(argv)
    if args.passes < 3:
        parser.error("--passes must be >= 3 (the first two are not counted)")
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


def run_way(root, args: argparse.Namespace, epochs: list[int], step_s: float) -> dict:
    loader = KineticsDALILoader(root, "train", batch_size=args.batch_size, clip_len=16, frame_stride=4,
                                crop_size=224, device="cpu", decode=DecodeSpec(fallback_workers=args.workers))
    try:
        passes = []
        for epoch in epochs:
            loader.set_epoch(epoch)
            passes.append(timed_pass(loader, step_s))
    finally:
        loader.close()
    counted = passes[2:]
    return {"epochs": epochs, "waits_s": passes,
            "first_batch_s": [p[0] for p in counted],
            "first_batch_median_s": statistics.median(p[0] for p in counted),
            "other_batches_median_s": statistics.median(w for p in counted for w in p[1:])}


def measure(root, args: argparse.Namespace, step_s: float) -> dict:
    n = args.passes
    return {"step_s": step_s,
            "ahead": run_way(root, args, list(range(n)), step_s),
            "nothing_ahead": run_way(root, args, [2 * e for e in range(n)], step_s)}


def markdown(result: dict) -> str:
    s = result["settings"]
    lines = [
        f"### Epoch-start run `epoch_start` — {machine_line(result['machine'])}",
        "",
        f"`python -m benchmarks.bench_epoch_start`; {versions_line(result['machine'])}; load average "
        f"(1, 5, 15 min) {result['load_average'][0]} at the start, {result['load_average'][1]} at the end. "
        f"KineticsDALILoader on `{s['dataset']}` ({s['clips']} clips of {s['duration_s']:g} s, all decoded by the "
        "fallback on the CPU), "
        f"batch {s['batch_size']}, {s['workers']} workers, 16 frames at stride 4, 224 crop; {s['passes']} passes "
        "per way, the first two not counted. Seconds from asking for a batch to having it (an epoch's first: "
        "from `iter`), median; the training step is a sleep.",
        "",
        "| training step per batch | next epoch started ahead: first batch | its other batches | "
        "nothing ahead: first batch | its other batches |",
        "|---|---|---|---|---|",
    ]
    for run in result["runs"]:
        ahead, cold = run["ahead"], run["nothing_ahead"]
        lines.append(
            f"| {run['label']} ({run['step_s']:.2f} s) | {ahead['first_batch_median_s']:.3f} "
            f"({', '.join(f'{w:.3f}' for w in ahead['first_batch_s'])}) | {ahead['other_batches_median_s']:.3f} | "
            f"{cold['first_batch_median_s']:.3f} ({', '.join(f'{w:.3f}' for w in cold['first_batch_s'])}) | "
            f"{cold['other_batches_median_s']:.3f} |")
    balanced = next((r for r in result["runs"] if r["label"] == "balanced"), None)
    if balanced is not None:
        first = balanced["ahead"]["first_batch_median_s"]
        lines += ["", f"- first batch of an epoch after the first, workers keeping up (balanced step): "
                      f"{first:.3f} s (target <= 0.2: {'met' if first <= 0.2 else '**missed**'})"]
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
        per_batch = statistics.median([free["ahead"]["other_batches_median_s"],
                                       free["nothing_ahead"]["other_batches_median_s"]])
        runs.append({"label": "balanced", **measure(root, args, 1.25 * per_batch)})
    elif args.step > 0:
        runs.append({"label": "fixed", **measure(root, args, args.step)})
    result = {"name": "epoch_start", "machine": machine_info(args.machine),
              "load_average": [started, load_average()],
              "settings": {"dataset": spec.name, "clips": args.clips, "duration_s": args.duration,
                           "batch_size": args.batch_size,
                           "workers": args.workers, "passes": args.passes},
              "runs": runs}
    publish(result, args.json, markdown(result), None if args.no_md else args.results_md,
            write_md=lambda path, text: append_markdown(path, text, chapter=CHAPTER))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
