"""DALI fed the window's packets against the whole file, and against the fallback: one plan, interleaved.

``python -m benchmarks.bench_dali_window`` (options: ``--help``) runs
:class:`~daliload.KineticsDALILoader` as users run it, on the CPU (DALI's CPU
decoder: VP9), on the benchmark's ``vp9-gop16`` (a keyframe every 16 frames)
and ``vp9`` (every 250, as downloads arrive) datasets, three ways with the
same plan (seed, epoch, windows, crops and flips) and the same CPU budget
(``--workers`` DALI threads, fallback workers and cut processes); DALI's two
ways pin every clip to DALI (``routing="static"``; both decoders at once is
``benchmarks.bench_routing``):

- ``dali-window``: the default, ``DecodeSpec(dali_feed="window")``: DALI gets
  the packets from the clean keyframe at or before each window (``daliload.stream.cut``);
- ``dali-file``: ``DecodeSpec(dali_feed="file")``: DALI gets whole files and
  decodes from frame 0 (what the loader did before);
- ``fallback``: ``DecodeSpec(decoder="fallback")``: every clip through PyAV.

The cost of a cut is timed on its own too: each clip of the plan cut once in
this process (ms per clip: what a cut process spends). One untimed epoch
each (workers start, the scan), then ``--rounds`` rounds in
which each way runs one epoch, in turn (so a machine that speeds up or slows
down moves all three alike). Per way: clips/s, median and range; frames the
decoders produced per clip (``stats().frames_decoded_dali`` /
``frames_decoded_fallback``). Per round, the ratio of ``dali-window`` to
``fallback`` and to ``dali-file``; the target (``dali-window`` at least
:data:`TARGET` x the fallback on ``vp9-gop16``) is met or missed only when
every round's ratio is on one side of it. Writes ``--json`` (default
``benchmarks/results/dali_window.json``), its section of
``benchmarks/RESULTS.md`` and, with ``--readme docs/performance.md``, that page's
``dali-window`` section, all from this one run.
"""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks.datasets import kinetics_layout, prepare_standard
from benchmarks.options import int_at_least
from benchmarks.report import add_output_options, load_average, publish_run, run_heading
from benchmarks.metrics import verdict
from benchmarks.machine import machine_info
from daliload.loader import DecodeSpec, KineticsDALILoader

CHAPTER = "## DALI fed the window: `python -m benchmarks.bench_dali_window`"
WAYS = ("dali-window", "dali-file", "fallback")
#: The issue's target on the 2-core CPU: DALI with windows over the fallback, VP9 with a keyframe every 16 frames.
TARGET = 0.9
TARGET_DATASET = "vp9-gop16"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_dali_window",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--datasets", default="vp9-gop16,vp9", help="comma-separated (default vp9-gop16,vp9)")
    parser.add_argument("--clips", type=int_at_least(1), default=48, help="videos per dataset (default 48)")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per video (default 10)")
    parser.add_argument("--size", default=None, help="WIDTHxHEIGHT replacing 340x256 (tests use tiny frames)")
    parser.add_argument("--batch-size", type=int_at_least(1), default=8, help="clips per batch (default 8)")
    parser.add_argument("--workers", type=int_at_least(1), default=2,
                        help="DALI threads, fallback workers and cut processes (default 2)")
    parser.add_argument("--rounds", type=int_at_least(1), default=3, help="timed epochs of each way (default 3)")
    parser.add_argument("--data-dir", default="bench_out/datasets", help="where the datasets are generated (cached)")
    parser.add_argument("--readme", default=None, help="a page whose 'dali-window' markers this run's figures "
                                                        "replace (the published run's go in docs/performance.md)")
    add_output_options(parser, "dali_window")
    return parser.parse_args(argv)


def build(root, way: str, args: argparse.Namespace) -> KineticsDALILoader:
    # DALI's ways pin every clip to DALI (routing="static"): what is measured is how DALI is fed.
    decode = {"dali-window": DecodeSpec(dali_feed="window", dali_threads=args.workers,
                                        fallback_workers=args.workers, routing="static"),
              "dali-file": DecodeSpec(dali_feed="file", dali_threads=args.workers, fallback_workers=args.workers,
                                      routing="static"),
              "fallback": DecodeSpec(decoder="fallback", fallback_workers=args.workers)}[way]
    return KineticsDALILoader(root, "train", batch_size=args.batch_size, clip_len=16, frame_stride=4, crop_size=224,
                              device="cpu", last_batch="partial", decode=decode)


def one_epoch(loader: KineticsDALILoader, epoch: int) -> dict:
    loader.set_epoch(epoch)
    started = time.perf_counter()
    clips = sum(int(labels.shape[0]) for _, labels in loader)
    elapsed = time.perf_counter() - started
    stats = loader.stats()
    if stats.failures:
        raise RuntimeError(f"{len(stats.failures)} video(s) failed: {stats.failures[0].describe()}")
    frames = stats.frames_decoded_dali + stats.frames_decoded_fallback
    return {"clips": clips, "clips_per_s": clips / elapsed, "frames_per_clip": frames / clips,
            "dali_clips": stats.clips_dali, "cut_clips": stats.clips_dali_cut}


def cut_cost(loader: KineticsDALILoader) -> dict:
    """What cutting costs: each DALI-route clip of epoch 1's plan cut once in this process, timed (ms per clip).

    The loader makes its cuts in worker processes, beside DALI; this is the CPU time one of them spends per clip.
    """
    from daliload.prescreen import probe_file
    from daliload.stream.cut import cut_window
    from daliload.stream.numbering import StreamHint

    hints, times, cut = {}, [], 0
    for batch in loader.plan(1):
        for sample in batch:
            if sample.path not in hints:
                facts = probe_file(sample.path)
                hints[sample.path] = StreamHint(facts.keyframes, facts.fps, facts.num_frames)
            hint = hints[sample.path]
            frames = [min(i, hint.num_frames - 1) for i in sample.frame_indices(hint.num_frames)]
            started = time.perf_counter()
            made = cut_window(sample.path, min(frames), max(frames), hint)
            times.append(1000 * (time.perf_counter() - started))
            cut += made is not None
    return {"clips": len(times), "cut": cut, "ms_per_clip": statistics.median(times),
            "ms_per_cut_clip_mean": sum(times) / max(1, cut)}


def measure(root, args: argparse.Namespace) -> dict:
    """Each way: an untimed epoch, then one timed epoch per round, the ways in turn, all on epoch 1's plan."""
    loaders = {way: build(root, way, args) for way in WAYS}
    try:
        plans = {way: [(s.path, s.start_frame, s.crop, s.flip) for b in loader.plan(1) for s in b]
                 for way, loader in loaders.items()}
        if len({tuple(p) for p in plans.values()}) != 1:
            raise RuntimeError("the three ways planned different clips")
        for loader in loaders.values():
            one_epoch(loader, 1)  # untimed: workers start
        cost = cut_cost(loaders["dali-window"])
        runs = {way: [] for way in WAYS}
        for _ in range(args.rounds):
            for way, loader in loaders.items():
                runs[way].append(one_epoch(loader, 1))
    finally:
        for loader in loaders.values():
            loader.close()
    out = {}
    for way, rows in runs.items():
        rates = [r["clips_per_s"] for r in rows]
        out[way] = {"clips_per_s": statistics.median(rates), "min": min(rates), "max": max(rates), "runs": rates,
                    "frames_per_clip": statistics.median(r["frames_per_clip"] for r in rows),
                    "dali_clips": rows[-1]["dali_clips"], "cut_clips": rows[-1]["cut_clips"],
                    "clips": rows[-1]["clips"]}
    out["cut_cost"] = cost
    for other in ("fallback", "dali-file"):
        ratios = [w / o for w, o in zip(out["dali-window"]["runs"], out[other]["runs"])]
        out[f"window_over_{other.replace('-', '_')}"] = {"median": statistics.median(ratios), "min": min(ratios),
                                                          "max": max(ratios)}
    return out


def _ratio(r: dict) -> str:
    return f"{r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f})"


def markdown(result: dict) -> str:
    s = result["settings"]
    lines = [
        *run_heading(
            "DALI-window", "dali_window", "python -m benchmarks.bench_dali_window", result,
            f"KineticsDALILoader on the CPU (DALI's CPU decoder), {s['clips']} videos of {s['duration_s']:g} s per "
            f"dataset, batch {s['batch_size']}, 16 frames at stride 4, 224 crop, {s['workers']} DALI threads = "
            f"fallback workers = cut processes; the same plan for every way; one untimed epoch each, then "
            f"{s['rounds']} rounds of one epoch per way, in turn. clips/s: median (min-max); ratios per round."),
        "",
        "| dataset | DALI, window (default) | DALI, whole file | fallback | frames decoded per clip: window / "
        "file / fallback | clips cut | cutting, ms per clip (one process) | window / fallback | window / file |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in result["datasets"].items():
        cells = [f"{row[w]['clips_per_s']:.1f} ({row[w]['min']:.1f}-{row[w]['max']:.1f})" for w in WAYS]
        frames = " / ".join(f"{row[w]['frames_per_clip']:.0f}" for w in WAYS)
        cut = f"{row['dali-window']['cut_clips']} of {row['dali-window']['dali_clips']}"
        cost = row["cut_cost"]
        lines.append(f"| `{name}` | " + " | ".join(cells) + f" | {frames} | {cut} | "
                     f"{cost['ms_per_clip']:.1f} (median; {cost['cut']} of {cost['clips']} cut) | "
                     f"{_ratio(row['window_over_fallback'])} | {_ratio(row['window_over_dali_file'])} |")
    if TARGET_DATASET in result["datasets"]:
        ratio = result["datasets"][TARGET_DATASET]["window_over_fallback"]
        lines += ["", f"Target: DALI fed windows at least {TARGET:g}x the fallback's clips/s on `{TARGET_DATASET}`, "
                  f"same plan: {_ratio(ratio)}, {verdict(ratio, TARGET)}."]
    return "\n".join(lines) + "\n"


def readme_figures(result: dict) -> str:
    parts = []
    for name, row in result["datasets"].items():
        w, f, b = row["dali-window"], row["dali-file"], row["fallback"]
        parts.append(f"on `{name}` DALI decodes {w['frames_per_clip']:.0f} frames per clip fed windows against "
                     f"{f['frames_per_clip']:.0f} fed whole files, and delivers {w['clips_per_s']:.1f} clips/s "
                     f"against {f['clips_per_s']:.1f} ({_ratio(row['window_over_dali_file'])}); the fallback "
                     f"{b['clips_per_s']:.1f} (window / fallback {_ratio(row['window_over_fallback'])})")
    m = result["machine"]
    return (f"Written by `python -m benchmarks.bench_dali_window` from its run's JSON "
            f"(`benchmarks/results/dali_window.json`; {m['date_utc']}, "
            f"{result['settings']['workers']} DALI threads = fallback workers, DALI's CPU decoder): "
            + "; ".join(parts) + ".\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = [n for n in args.datasets.split(",") if n]
    started = load_average()
    datasets = {}
    for dataset in prepare_standard(args.datasets, clips=args.clips, duration_s=args.duration, size=args.size,
                                    data_dir=args.data_dir):
        datasets[dataset.spec.name] = measure(kinetics_layout(dataset), args)
    result = {"name": "dali_window", "machine": machine_info(args.machine), "load_average": [started, load_average()],
              "settings": {"datasets": names, "clips": args.clips, "duration_s": args.duration,
                           "batch_size": args.batch_size, "workers": args.workers, "rounds": args.rounds},
              "datasets": datasets}
    text = markdown(result)
    publish_run(result, args, text, chapter=CHAPTER, marker="dali-window", figures=readme_figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
