"""Repeated sampling: clips/s at ``clips_per_video`` k = 1, 2 and 4, the same number of clips per epoch.

``python -m benchmarks.bench_repeated`` (options: ``--help``; ``make bench``
runs it after the main table) runs :class:`~daliload.KineticsDALILoader` as
users run it, on the CPU, on the benchmark's ``h264-gop250`` dataset (every
clip on the PyAV fallback; a keyframe every 250 frames, as Kinetics
downloads) and on ``vp9`` (every clip on DALI's CPU decoder). For each k the
loader reads the first ``clips / k`` videos of the dataset (a Kinetics folder
layout of links), so every k makes the same ``--clips`` clips per epoch: k = 1
decodes each of 64 videos once, k = 4 each of 16 videos once for 4 clips. The
fallback decodes a video's clips in one pass over the file; DALI reads the
file once for them but decodes each clip by itself.

Per k: one untimed epoch (workers start, the scan), then ``--runs`` timed
epochs: clips/s (median and range) and, on the fallback, the frames its
decoders produced per clip (``stats().frames_decoded_fallback``). Writes
``--json`` (default ``benchmarks/results/repeated.json``) and its section of
``benchmarks/RESULTS.md``, both from this one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from benchmarks.datasets import layout_relpath, prepare_standard
from benchmarks.machine import machine_info
from benchmarks.report import add_output_options, append_markdown, load_average, publish, run_heading, write_marked
from daliload.loader import DecodeSpec, KineticsDALILoader

CHAPTER = "## Repeated sampling: `python -m benchmarks.bench_repeated`"
KS = (1, 2, 4)
#: The issue's targets on the fallback (H.264, keyframe every 250): clips/s over k = 1's.
TARGETS = {2: 1.6, 4: 2.5}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_repeated", description=__doc__.split("\n")[0])
    parser.add_argument("--datasets", default="h264-gop250,vp9", help="comma-separated (default h264-gop250,vp9)")
    parser.add_argument("--clips", type=int, default=64, help="clips per epoch, for every k (default 64)")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per video (default 10)")
    parser.add_argument("--size", default=None, help="WIDTHxHEIGHT replacing 340x256 (tests use tiny frames)")
    parser.add_argument("--batch-size", type=int, default=8, help="clips per batch, a multiple of 4 (default 8)")
    parser.add_argument("--workers", type=int, default=2, help="fallback workers and DALI threads (default 2)")
    parser.add_argument("--runs", type=int, default=3, help="timed epochs per k (default 3)")
    parser.add_argument("--data-dir", default="bench_out/datasets", help="where the datasets are generated (cached)")
    parser.add_argument("--readme", default=None,
                        help="a page whose 'repeated' markers this run's figures replace (the published run's go in "
                             "docs/using.md)")
    parser.add_argument("--report-from", default=None, metavar="JSON",
                        help="write the sections from a stored run's JSON instead of measuring")
    add_output_options(parser, "repeated")
    args = parser.parse_args(argv)
    if args.batch_size % max(KS):
        parser.error(f"--batch-size must be a multiple of {max(KS)} (a video's clips share a batch)")
    if args.clips % max(KS) or args.clips < max(KS):
        parser.error(f"--clips must be a positive multiple of {max(KS)} (each k reads clips / k videos)")
    if args.runs < 1:
        parser.error("--runs must be >= 1")
    return args


def subset_layout(dataset, count: int) -> Path:
    """A Kinetics folder layout of the dataset's first ``count`` videos (links, made once)."""
    root = Path(dataset.root) / f"kinetics-first{count}"
    for video in dataset.videos[:count]:
        link = root / layout_relpath(video)
        if not (link.is_symlink() or link.exists()):
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(video.path, link.parent))
    return root


def measure(root: Path, k: int, args: argparse.Namespace) -> dict:
    """One untimed epoch, then ``args.runs`` timed ones, of the loader at ``clips_per_video=k``."""
    loader = KineticsDALILoader(root, "train", batch_size=args.batch_size, clip_len=16, frame_stride=4,
                                crop_size=224, device="cpu", clips_per_video=k, last_batch="partial",
                                decode=DecodeSpec(fallback_workers=args.workers, dali_threads=args.workers))
    try:
        rates, frames, clips = [], [], 0
        for epoch in range(args.runs + 1):
            loader.set_epoch(epoch)
            started = time.perf_counter()
            clips = sum(int(labels.shape[0]) for _, labels in loader)
            elapsed = time.perf_counter() - started
            stats = loader.stats()
            if stats.failures:
                raise RuntimeError(f"k={k}: {len(stats.failures)} video(s) failed: {stats.failures[0].describe()}")
            if epoch:
                rates.append(clips / elapsed)
                frames.append(stats.frames_decoded_fallback / clips)
        route = "fallback" if stats.clips_fallback else "dali"
    finally:
        loader.close()
    return {"k": k, "videos": len(loader.videos), "clips_per_epoch": clips, "route": route,
            "clips_per_s": statistics.median(rates), "min": min(rates), "max": max(rates), "runs": rates,
            "fallback_frames_per_clip": statistics.median(frames) if route == "fallback" else None}


def markdown(result: dict) -> str:
    s = result["settings"]
    lines = [
        *run_heading(
            "Repeated-sampling", "repeated", "python -m benchmarks.bench_repeated", result,
            f"KineticsDALILoader on the CPU, {s['clips']} clips per epoch for every k (the first clips / k videos "
            f"of each dataset, {s['duration_s']:g} s each), batch {s['batch_size']}, {s['workers']} fallback "
            f"workers / DALI threads, 16 frames at stride 4, 224 crop; one untimed epoch, then {s['runs']} timed: "
            "clips/s, median (min-max)."),
        "",
        "| dataset (route) | k = 1 | k = 2 | k = 4 | k = 2 / k = 1 | k = 4 / k = 1 | frames decoded per clip "
        "(fallback), k = 1 / 2 / 4 |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, rows in result["datasets"].items():
        by_k = {row["k"]: row for row in rows}
        cells = [f"{by_k[k]['clips_per_s']:.1f} ({by_k[k]['min']:.1f}-{by_k[k]['max']:.1f})" for k in KS]
        frames = " / ".join(f"{by_k[k]['fallback_frames_per_clip']:.0f}" if by_k[k]["fallback_frames_per_clip"]
                            is not None else "-" for k in KS)
        ratios = [f"{by_k[k]['clips_per_s'] / by_k[1]['clips_per_s']:.2f}x" for k in (2, 4)]
        lines.append(f"| `{name}` ({by_k[1]['route']}) | " + " | ".join(cells + ratios) + f" | {frames} |")
    target = result.get("targets")
    if target:
        lines += ["", "Targets on the fallback (`h264-gop250`): "
                  + "; ".join(f"k = {k}: {target[str(k)]['ratio']:.2f}x of k = 1 (target >= {TARGETS[k]:g}x: "
                              f"{'met' if target[str(k)]['met'] else '**missed**'})" for k in (2, 4)) + "."]
    return "\n".join(lines) + "\n"


def readme_figures(result: dict) -> str:
    """The page's figures of a run: clips/s at each k over k = 1's, per dataset."""
    parts = []
    for name, rows in result["datasets"].items():
        by_k = {row["k"]: row for row in rows}
        ratios = ", ".join(f"k = {k} {by_k[k]['clips_per_s'] / by_k[1]['clips_per_s']:.2f}x" for k in (2, 4))
        parts.append(f"on `{name}` ({by_k[1]['route']}) {ratios} the clips/s of k = 1 "
                     f"({by_k[1]['clips_per_s']:.1f})")
    s = result["settings"]
    return (f"Measured by `python -m benchmarks.bench_repeated` (`benchmarks/results/repeated.json`; "
            f"{result['machine']['date_utc']}, {s['clips']} clips per epoch, {s['workers']} workers, the loader on "
            f"the CPU): " + "; ".join(parts) + ".\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report_from is not None:
        import json

        result = json.loads(Path(args.report_from).read_text())
        if args.readme is not None and not write_marked(args.readme, "repeated", readme_figures(result)):
            print(f"bench_repeated: {args.readme} has no repeated markers; not written")
        return 0
    names = [n for n in args.datasets.split(",") if n]
    started = load_average()
    datasets = {}
    for dataset in prepare_standard(args.datasets, clips=args.clips, duration_s=args.duration, size=args.size,
                                    data_dir=args.data_dir):
        datasets[dataset.spec.name] = [measure(subset_layout(dataset, args.clips // k), k, args) for k in KS]
    result = {"name": "repeated", "machine": machine_info(args.machine), "load_average": [started, load_average()],
              "settings": {"datasets": names, "clips": args.clips, "duration_s": args.duration,
                           "batch_size": args.batch_size, "workers": args.workers, "runs": args.runs},
              "datasets": datasets}
    if "h264-gop250" in datasets:
        by_k = {row["k"]: row for row in datasets["h264-gop250"]}
        result["targets"] = {str(k): {"ratio": by_k[k]["clips_per_s"] / by_k[1]["clips_per_s"],
                                      "met": by_k[k]["clips_per_s"] / by_k[1]["clips_per_s"] >= TARGETS[k]}
                             for k in (2, 4)}
    publish(result, args.json, markdown(result), None if args.no_md else args.results_md,
            write_md=lambda path, text: append_markdown(path, text, chapter=CHAPTER))
    if args.readme is not None and not write_marked(args.readme, "repeated", readme_figures(result)):
        print(f"bench_repeated: {args.readme} has no repeated markers; not written")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
