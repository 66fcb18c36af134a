"""Multi-view evaluation: all views of a video at once against one decode per view, on both decoders.

``python -m benchmarks.bench_views`` (options: ``--help``) generates a small
Kinetics-like set (10-second 340x256 clips: H.264 with a keyframe every 250
frames for the fallback, VP9 for DALI, which decodes VP9 on the CPU) and
plans every video with ``views=(T, S)`` (default 10 x 3, SlowFast's test
protocol) exactly as the loader does (:func:`daliload.plan.make_val_plan`).
Then, on the same views:

- fallback, together: :func:`fallback.views.decode_views`, one open and one
  ascending pass per video, each frame decoded at most once;
- fallback, one by one: :func:`fallback.source.decode_sample` per view, as a
  loop over single-view loaders would;
- DALI, together: one batch of the video's ``T * S`` views, its file read once;
- DALI, one by one: a batch of one view at a time.

Views/s is views decoded (crop, resize and normalise included) per second in
one process, median (min-max) of ``--runs`` timed runs after a warm-up. Writes
``--json`` (default ``benchmarks/results/views.json``) and its section of
``benchmarks/RESULTS.md``, both from this one run.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path
from typing import Callable

from benchmarks.metrics import summarize
from benchmarks.report import (add_output_options, append_markdown, load_average, machine_info, machine_line, publish,
                               versions_line)
from daliload.plan import AugmentSpec, ClipSpec, OutputSpec, VideoInfo, make_val_plan
from daliload.prescreen import probe_file
from daliload.synth.dataset import SynthSpec, generate_dataset
from fallback.source import DecodeOptions, decode_sample
from fallback.views import decode_views

CHAPTER = "## Multi-view evaluation: `python -m benchmarks.bench_views`"
OUTPUT = OutputSpec(size=(224, 224))
CLIP = ClipSpec(clip_len=16, frame_stride=4)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_views", description=__doc__.split("\n")[0])
    parser.add_argument("--views", type=int, nargs=2, default=(10, 3), metavar=("T", "S"))
    parser.add_argument("--videos", type=int, default=3, help="videos per codec (default 3)")
    parser.add_argument("--runs", type=int, default=3, help="timed runs (default 3)")
    parser.add_argument("--dali-threads", type=int, default=2)
    parser.add_argument("--data-dir", default="bench_out/views", help="where the dataset is generated")
    add_output_options(parser, "views")
    return parser.parse_args(argv)


def make_videos(args: argparse.Namespace, codec: str) -> list[VideoInfo]:
    root = Path(args.data_dir) / f"{codec}-{args.videos}"
    if not (root / "done").exists():
        shutil.rmtree(root, ignore_errors=True)
        spec = SynthSpec(num_classes=args.videos, clips_per_class=1, val_fraction=0.0, width=340, height=256,
                         duration_s=10.0, codec_mix={codec: 1.0}, seed=5)
        generate_dataset(root, spec, workers=2, progress=False)
        (root / "done").touch()
    videos = []
    for number, path in enumerate(sorted(p for p in root.rglob("*") if p.suffix in (".mp4", ".webm", ".mkv"))):
        facts = probe_file(path)
        videos.append(VideoInfo(str(path), number, facts.num_frames, facts.fps, facts.width, facts.height))
    return videos


def view_groups(videos: list[VideoInfo], views: tuple[int, int]) -> list[list]:
    """Each video's views, planned as the loader plans them."""
    plan = make_val_plan(videos, rank=0, world_size=1, clip=CLIP, augment=AugmentSpec(crop_size=224),
                         views=views)
    per_video = views[0] * views[1]
    return [plan[i:i + per_video] for i in range(0, len(plan), per_video)]


def timed(work: Callable[[list[list]], int], groups: list[list], runs: int) -> dict:
    work(groups[:1])  # warm-up on one video: caches, DALI's first batch
    rates = []
    for _ in range(runs):
        started = time.perf_counter()
        views = work(groups)
        rates.append(views / (time.perf_counter() - started))
    summary = summarize(rates)
    return {"views_per_s": rates, "median": summary.median, "min": summary.low, "max": summary.high}


def fallback_rows(groups: list[list], runs: int) -> dict:
    options = DecodeOptions()

    def together(part: list[list]) -> int:
        return sum(len(decode_views(group, OUTPUT, options)[0]) for group in part)

    def one_by_one(part: list[list]) -> int:
        return sum(1 for group in part for sample in group if decode_sample(sample, OUTPUT, options) is not None)

    return {"together": timed(together, groups, runs), "one_by_one": timed(one_by_one, groups, runs)}


def dali_rows(groups: list[list], runs: int, threads: int) -> dict:
    from daliload.dali_errors import is_dali_available
    from daliload.pipeline import DaliClipDecoder

    if not is_dali_available():
        return {"skipped": "nvidia-dali is not installed"}
    per_video = len(groups[0])
    with DaliClipDecoder(OUTPUT, batch_size=per_video, device="cpu", num_threads=threads) as decoder:
        def together(part: list[list]) -> int:
            return sum(len(decoder.decode_batch(group).videos) for group in part)

        def one_by_one(part: list[list]) -> int:
            return sum(len(decoder.decode_batch([sample]).videos) for group in part for sample in group)

        return {"together": timed(together, groups, runs), "one_by_one": timed(one_by_one, groups, runs)}


def markdown(result: dict) -> str:
    s = result["settings"]
    t, sp = s["views"]
    lines = [
        f"### Views run `views` — {machine_line(result['machine'])}",
        "",
        f"`python -m benchmarks.bench_views`; {versions_line(result['machine'])}; load average "
        f"{result['load_average']}. {t} x {sp} views per video ({t * sp} clips of {CLIP.clip_len} frames at "
        f"stride {CLIP.frame_stride}, 224x224, normalised float16), {s['videos']} videos of 10 s at 340x256 per "
        f"decoder, one process; views/s, median (min-max) of {s['runs']} runs.",
        "",
        "| decoder (codec) | all views of a video at once | one decode per view | ratio |",
        "|---|---|---|---|",
    ]
    for key, label in (("fallback", "fallback (H.264, keyframe every 250)"), ("dali", "DALI on the CPU (VP9)")):
        rows = result[key]
        if "skipped" in rows:
            lines.append(f"| {label} | not run: {rows['skipped']} | | |")
            continue
        a, b = rows["together"], rows["one_by_one"]
        lines.append(f"| {label} | {a['median']:.1f} ({a['min']:.1f}-{a['max']:.1f}) | "
                     f"{b['median']:.1f} ({b['min']:.1f}-{b['max']:.1f}) | {a['median'] / b['median']:.2f}x |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    views = (int(args.views[0]), int(args.views[1]))
    result = {"name": "views", "machine": machine_info(args.machine),
              "load_average": load_average(),
              "settings": {"views": list(views), "videos": args.videos, "runs": args.runs,
                           "dali_threads": args.dali_threads}}
    result["fallback"] = fallback_rows(view_groups(make_videos(args, "h264"), views), args.runs)
    result["dali"] = dali_rows(view_groups(make_videos(args, "vp9"), views), args.runs, args.dali_threads)
    result["load_average_after"] = load_average()
    publish(result, args.json, markdown(result), None if args.no_md else args.results_md,
            write_md=lambda path, text: append_markdown(path, text, chapter=CHAPTER))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
