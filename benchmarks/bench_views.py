"""Multi-view evaluation: all views of a video at once against one decode per view, on both decoders.

``python -m benchmarks.bench_views`` (options: ``--help``) generates a small
Kinetics-like set (10-second 340x256 clips: H.264 with a keyframe every 250
frames for the fallback, VP9 for DALI, which decodes VP9 on the CPU) and
plans every video with ``views=(T, S)`` (default 10 x 3, SlowFast's test
protocol) exactly as the loader does (:func:`daliload.plan.make_val_plan`).
Then, on the same views, each way against its baseline with the same
parallelism (one process; for DALI the same batch of ``T * S`` samples on the
same ``--dali-threads``), so that a ratio measures what sharing a video buys,
not more threads at work:

- fallback, together: :func:`fallback.views.decode_views`, one open and one
  ascending pass per video, each frame decoded at most once;
- fallback, each view on its own: :func:`fallback.source.decode_sample` per
  view, one open and one decode per view, as a loop over single-view loaders
  would: each temporal window decoded ``S`` times, once per spatial crop;
- fallback, each window once (mmaction2's way: ``SampleFrames`` then
  ``ThreeCrop``): one open and one decode per temporal window, its ``S``
  crops cut from the decoded frames with the same transform
  (:func:`fallback.views.decode_views` given that window's ``S`` views). The
  baseline a skeptic asks for: it decodes what the recipes decode, so the
  ratio against it measures what one pass over the file buys beyond not
  decoding a window three times;
- DALI, together: one batch of the video's ``T * S`` views, its file read once
  and its bytes given to every view (what :class:`daliload.dali.DaliClipDecoder`
  does for a multi-view batch);
- DALI, each view on its own: the same batch of ``T * S`` views, the file read
  once per view (each view names the file through its own symbolic link, so
  each gets its own bytes, as single-view loaders would read them).
  ``fn.decoders.video`` decodes every sample on its own either way (from the
  file's first frame: it has no frame index), so this pair measures the shared
  read alone. (An earlier baseline sent one view per batch to the same
  pipeline: one busy thread against two, which measured thread parallelism.)

Views/s is views decoded (crop, resize and normalise included) per second,
median (min-max) of ``--runs`` timed runs after a warm-up; the ways of a
decoder run interleaved, one run of each per round in a rotated order, and
each ratio's range is taken round by round. Writes ``--json``
(default ``benchmarks/results/views.json``), its section of
``benchmarks/RESULTS.md`` and README.md's ``views`` figures (between its
markers), all from this one run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import time
from pathlib import Path
from typing import Callable

from benchmarks.metrics import summarize
from benchmarks.report import add_output_options, append_markdown, load_average, publish, record_section, write_marked
from benchmarks.machine import machine_info, machine_line, versions_line
from daliload.plan import AugmentSpec, ClipSpec, OutputSpec, VideoInfo, make_val_plan
from daliload.prescreen import probe_file
from daliload.synth.dataset import SynthSpec, generate_dataset
from fallback.options import FallbackOptions
from fallback.source import decode_sample
from fallback.views import decode_views

CHAPTER = "## Multi-view evaluation: `python -m benchmarks.bench_views`"
OUTPUT = OutputSpec(size=(224, 224), dtype="float16")  # the dtype its published runs used
CLIP = ClipSpec(clip_len=16, frame_stride=4)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_views", description=__doc__.split("\n")[0])
    parser.add_argument("--views", type=int, nargs=2, default=(10, 3), metavar=("T", "S"))
    parser.add_argument("--videos", type=int, default=3, help="videos per codec (default 3)")
    parser.add_argument("--runs", type=int, default=3, help="timed runs (default 3)")
    parser.add_argument("--dali-threads", type=int, default=2)
    parser.add_argument("--data-dir", default="bench_out/views", help="where the dataset is generated")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per video (default 10)")
    add_output_options(parser, "views", no_md_help="do not touch RESULTS.md or README.md")
    parser.add_argument("--readme", default=str(Path(__file__).resolve().parent.parent / "docs" / "evaluation.md"),
                        help="the page whose views figures (between its markers) this run rewrites "
                             "(default docs/evaluation.md)")
    parser.add_argument("--report-from", default=None, metavar="JSON",
                        help="write the sections from a stored run's JSON instead of measuring")
    args = parser.parse_args(argv)
    if args.videos < 1 or args.runs < 1 or args.dali_threads < 1 or min(args.views) < 1 or args.duration <= 0:
        parser.error("--videos, --runs, --dali-threads and --views must be >= 1, --duration > 0")
    return args


def make_videos(args: argparse.Namespace, codec: str) -> list[VideoInfo]:
    root = Path(args.data_dir) / f"{codec}-{args.videos}-{args.duration:g}s"
    if not (root / "done").exists():
        shutil.rmtree(root, ignore_errors=True)
        spec = SynthSpec(num_classes=args.videos, clips_per_class=1, val_fraction=0.0, width=340, height=256,
                         duration_s=args.duration, codec_mix={codec: 1.0}, seed=5)
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


def timed(ways: dict[str, tuple[Callable[[list[list]], int], list[list]]], runs: int) -> dict:
    """Each way ``name -> (work, groups)`` warmed up, then ``runs`` rounds of one run per way, the order
    rotated each round (a machine whose speed drifts moves every way of a round alike); per way its views/s,
    and ``ratios``: together over each other way, one ratio per round."""
    from benchmarks.interleave import rotated, round_ratio

    for work, groups in ways.values():
        work(groups[:1])  # warm-up on one video: caches, DALI's first batch
    rates: dict[str, list[float]] = {name: [] for name in ways}
    views: dict[str, int] = {}
    for number in range(runs):
        for name in rotated(list(ways), number):
            work, groups = ways[name]
            started = time.perf_counter()
            views[name] = work(groups)
            rates[name].append(views[name] / (time.perf_counter() - started))
    out: dict = {}
    for name, values in rates.items():
        summary = summarize(values)
        out[name] = {"views_per_s": values, "median": summary.median, "min": summary.low, "max": summary.high,
                     "views": views[name]}
    out["ratios"] = {f"together_over_{name}": round_ratio(rates["together"], values)
                     for name, values in rates.items() if name != "together"}
    return out


def fallback_rows(groups: list[list], runs: int, spatial: int) -> dict:
    """The fallback's three ways on the same views; ``spatial``: S, the crops of each temporal window."""
    options = FallbackOptions()

    def together(part: list[list]) -> int:
        return sum(len(decode_views(group, OUTPUT, options)[0]) for group in part)

    def each_on_its_own(part: list[list]) -> int:
        return sum(1 for group in part for sample in group if decode_sample(sample, OUTPUT, options) is not None)

    def each_window_once(part: list[list]) -> int:  # views are temporal-major: window t is views t*S .. t*S+S-1
        return sum(len(decode_views(group[t:t + spatial], OUTPUT, options)[0])
                   for group in part for t in range(0, len(group), spatial))

    return timed({"together": (together, groups), "each_on_its_own": (each_on_its_own, groups),
                  WINDOW_ONCE: (each_window_once, groups)}, runs)


def own_reads(groups: list[list], folder: Path) -> list[list]:
    """The same views, each naming its file through a symbolic link of its own, so that each is read on its own.

    The decoder reads a file once per batch and path; a view with its own path
    gets its own read and its own bytes, as from a single-view loader.
    """
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    out = []
    for group in groups:
        views = []
        for number, sample in enumerate(group):
            link = folder / f"{sample.video_index}-{number}{Path(sample.path).suffix}"
            os.symlink(os.path.abspath(sample.path), link)
            views.append(dataclasses.replace(sample, path=str(link)))
        out.append(views)
    return out


def dali_rows(groups: list[list], runs: int, threads: int, links: Path) -> dict:
    from daliload.dali import is_dali_available
    from daliload.dali import DaliClipDecoder

    if not is_dali_available():
        return {"skipped": "nvidia-dali is not installed"}
    per_video = len(groups[0])
    separate = own_reads(groups, links)
    with DaliClipDecoder(OUTPUT, batch_size=per_video, device="cpu", num_threads=threads) as decoder:
        def batches(part: list[list]) -> int:  # one batch of a video's views at a time
            return sum(len(decoder.decode_batch(group).videos) for group in part)

        return timed({"together": (batches, groups), "each_on_its_own": (batches, separate)}, runs)


def _ratio(rows: dict, baseline: str = "each_on_its_own") -> float:
    return rows["together"]["median"] / rows[baseline]["median"]


def _ratio_text(rows: dict, baseline: str = "each_on_its_own") -> str:
    """The ratio of the medians, and the per-round ratios' range where the run interleaved its ways."""
    rounds = (rows.get("ratios") or {}).get(f"together_over_{baseline}")
    spread = f" ({rounds['min']:.2f}-{rounds['max']:.2f} round by round)" if rounds else ""
    return f"{_ratio(rows, baseline):.2f}x{spread}"


INTERLEAVED = " (interleaved: one run of each way per round, the order rotated)"
#: The mmaction2 baseline's key (runs from before it was added have none).
WINDOW_ONCE = "each_window_once"


def _duration(s: dict) -> str:
    return f"{s.get('duration_s', 10.0):g} s"


def markdown(result: dict) -> str:
    s = result["settings"]
    t, sp = s["views"]
    with_windows = WINDOW_ONCE in result["fallback"]
    lines = [
        f"### Views run `views` — {machine_line(result['machine'])}",
        "",
        f"`python -m benchmarks.bench_views`; {versions_line(result['machine'])}; load average "
        f"{result['load_average']} at the start, {result.get('load_average_after', '?')} at the end. {t} x {sp} "
        f"views per video ({t * sp} clips of {CLIP.clip_len} frames at stride {CLIP.frame_stride}, 224x224, "
        f"normalised float16), {s['videos']} video{'s' * (s['videos'] != 1)} of {_duration(s)} at 340x256 "
        f"per decoder; views/s, median (min-max) of {s['runs']} runs"
        f"{INTERLEAVED if 'ratios' in result['fallback'] else ''}"
        f". Each pair runs with the same "
        f"parallelism: the fallback in one process "
        f"with one decoder thread; DALI with batches of the {t * sp} views of one video on {s['dali_threads']} "
        f"threads both ways, the file read once per batch (together) or once per view (each on its own).",
        "",
        "| decoder (codec) | all views of a video together | each view on its own | ratio | what together shares |"
        + (f" each window once, {sp} crops from it (mmaction2) | together / that |" if with_windows else ""),
        "|---|---|---|---|---|" + ("---|---|" if with_windows else ""),
    ]
    shares = {"fallback": "one open and one pass over the file: each frame decoded at most once",
              "dali": "the file's bytes, read once; DALI decodes every view on its own from the file's start"}
    for key, label in (("fallback", "fallback (H.264, keyframe every 250)"), ("dali", "DALI on the CPU (VP9)")):
        rows = result[key]
        if "skipped" in rows:
            lines.append(f"| {label} | not run: {rows['skipped']} | | | |" + (" | |" if with_windows else ""))
            continue
        a, b = rows["together"], rows["each_on_its_own"]
        row = (f"| {label} | {a['median']:.1f} ({a['min']:.1f}-{a['max']:.1f}) | "
               f"{b['median']:.1f} ({b['min']:.1f}-{b['max']:.1f}) | {_ratio_text(rows)} | {shares[key]} |")
        if with_windows:
            w = rows.get(WINDOW_ONCE)
            # DALI crops inside its pipeline, one crop per decoded sample: it has no way to cut three crops
            # from one decode, so its row has no such baseline.
            row += (f" {w['median']:.1f} ({w['min']:.1f}-{w['max']:.1f}) | {_ratio_text(rows, WINDOW_ONCE)} |"
                    if w else " – (DALI crops in its pipeline, one crop per decode) | – |")
        lines.append(row)
    if with_windows:
        lines += ["", f"Each window once: mmaction2's test pipeline (`SampleFrames`, then `ThreeCrop`): each of "
                  f"the {t} temporal windows decoded once, one open per window, its {sp} crops cut from those "
                  f"frames with the same transform; the baseline that decodes what the recipes decode."]
    return "\n".join(lines) + "\n"


#: Ratios within this distance of 1 are reported as no measurable difference (runs on these VMs drift).
NOISE = 0.1


def readme_figures(result: dict) -> str:
    """README's claim about decoding a video's views together, as this run measured it (between ``views`` markers)."""
    s = result["settings"]
    t, sp = s["views"]
    text = (f"Written by `python -m benchmarks.bench_views` from its run's JSON "
            f"(`benchmarks/results/views.json`; "
            f"{machine_line(result['machine'])}, load average {result['load_average']} at the start; table in "
            f"`benchmarks/RESULTS.md`, \"Views run\"): with {t} x {sp} views per video of "
            f"{_duration(s)}, each way against one decode per view with the same parallelism, ")
    fallback, dali = result["fallback"], result["dali"]
    if "skipped" in fallback:
        text += "the fallback did not run; "
    else:
        text += (f"**the fallback's one pass decodes a video's views {_ratio(fallback):.2f}x as fast** "
                 f"({fallback['together']['median']:.1f} against {fallback['each_on_its_own']['median']:.1f} "
                 f"views/s)")
        if WINDOW_ONCE in fallback:
            once = fallback[WINDOW_ONCE]
            text += (f", and {_ratio_text(fallback, WINDOW_ONCE)} mmaction2's way of decoding each temporal "
                     f"window once and cutting its {sp} crops from it ({once['median']:.1f} views/s)")
        text += "; "
    if "skipped" in dali:
        return text + f"DALI did not run ({dali['skipped']})."
    ratio = _ratio(dali)
    figures = (f"{dali['together']['median']:.1f} against {dali['each_on_its_own']['median']:.1f} views/s, "
               f"the same batch of {t * sp} views on {s['dali_threads']} threads")
    if abs(ratio - 1) <= NOISE:
        return text + (f"**reading the file once for all views gains DALI nothing measurable** ({ratio:.2f}x: "
                       f"{figures}): DALI decodes each view on its own.")
    return text + (f"reading the file once for all views makes DALI {ratio:.2f}x as fast ({figures}); DALI still "
                   f"decodes each view on its own.")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results_md = None if args.no_md else args.results_md

    def write_md(path, text):
        append_markdown(path, text, chapter=CHAPTER)

    if args.report_from is not None:
        result = json.loads(Path(args.report_from).read_text(encoding="utf-8"))
        record_section(markdown(result), results_md, write_md=write_md)
    else:
        result = measure(args)
        publish(result, args.json, markdown(result), results_md, write_md=write_md)
    if not args.no_md and not write_marked(args.readme, "views", readme_figures(result)):
        print(f"(no views markers in {args.readme}: README not changed)")
    return 0


def measure(args: argparse.Namespace) -> dict:
    """One run: the fallback's pair on H.264, DALI's pair on VP9."""
    views = (int(args.views[0]), int(args.views[1]))
    result = {"name": "views", "machine": machine_info(args.machine), "load_average": load_average(),
              "settings": {"views": list(views), "videos": args.videos, "runs": args.runs,
                           "dali_threads": args.dali_threads, "duration_s": args.duration}}
    result["fallback"] = fallback_rows(view_groups(make_videos(args, "h264"), views), args.runs, views[1])
    result["dali"] = dali_rows(view_groups(make_videos(args, "vp9"), views), args.runs, args.dali_threads,
                               Path(args.data_dir) / "views-links")
    result["load_average_after"] = load_average()
    return result


if __name__ == "__main__":
    raise SystemExit(main())
