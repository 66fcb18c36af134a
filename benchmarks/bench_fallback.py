"""Benchmark the PyAV fallback against the blog's approach and against plain PyAV decoding.

Input: generated Kinetics-like clips (340x256, 10 s at 30 fps, H.264 High with
B-frames and a keyframe every 250 frames, as YouTube downloads have). One plan
of random windows (16 frames at stride 4, random 224/256 crop, random flip) is
drawn once and every method loads the same windows. Measured, in one run:

* ``ceiling``: plain sequential PyAV decoding, one process, one thread, no RGB
  conversion: frames/s.
* ``per_clip``: one clip at a time in this process, ``decode_sample`` with
  ``skip_nonref`` on and off, against a plain PyAV loop that opens the file and
  decodes the frames the clip had to get through (from the start, or the
  keyframe before the window, to the window's last frame), no conversion.
* ``loaders``: the blog's approach (``__getitem__`` decodes the whole file to
  a list of RGB frames, then indexes it), a DataLoader, and the fallback as
  the loader runs it (:class:`fallback.FallbackSource` under the loader's
  epoch pass), with the same workers and batch size; one warm-up pass
  (workers start), then timed passes.
* ``memory``: peak RSS of a fresh process after 500 and after N decodes.

Run: ``python -m benchmarks.bench_fallback`` (about 5 minutes on 2 cores).
Writes ``benchmarks/results/fallback.json``, prints the markdown and puts it in
``benchmarks/RESULTS.md`` as the section ``### Fallback run `fallback` — ...``,
replacing the previous run's (``--no-md``: print only; ``--report-from JSON``:
rebuild the section from an earlier run's JSON).
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import platform
import random
import resource
import statistics
import tempfile
import time
from pathlib import Path

import av
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from daliload.plan import CropBox, OutputSpec, Sample
from daliload.synth import default_spec, render_clip, write_video
from fallback import apply_plan, decode_sample, decode_window, probe_hint
from benchmarks.machine import package_commit

WIDTH, HEIGHT, NUM_FRAMES, FPS = 340, 256, 300, 30
CLIP_LEN, STRIDE, CROP = 16, 4, 224


# --------------------------------------------------------------------------------------
# data and plan


def make_videos(root: Path, count: int) -> list[str]:
    """``count`` H.264 clips (GOP 250, 3 B-frames), reused if already there."""
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        path = root / f"clip{i:03d}_class{i % 9}.mp4"
        if not path.exists():
            frames = render_clip(i % 9, NUM_FRAMES, width=WIDTH, height=HEIGHT, fps=FPS, seed=i)
            write_video(path, frames, default_spec("h264", gop=250, bframes=3))
        paths.append(str(path))
    return paths


def make_plan(paths: list[str], num_clips: int, seed: int) -> list[Sample]:
    rng = random.Random(seed)
    span = (CLIP_LEN - 1) * STRIDE + 1
    samples = []
    for position in range(num_clips):
        video = position % len(paths)
        h, w = CROP / HEIGHT, CROP / WIDTH
        y0, x0 = rng.uniform(0, 1 - h), rng.uniform(0, 1 - w)
        samples.append(Sample(position=position, video_index=video, path=paths[video], label=video % 9,
                              start_frame=rng.randrange(0, NUM_FRAMES - span + 1), frame_stride=STRIDE,
                              clip_len=CLIP_LEN, crop=CropBox(y0, x0, y0 + h, x0 + w),
                              flip=rng.random() < 0.5))
    return samples


# --------------------------------------------------------------------------------------
# the blog's approach


class BlogDataset(Dataset):
    """Decode the whole file into a list of RGB frames in ``__getitem__``, then index it."""

    def __init__(self, samples: list[Sample], output: OutputSpec) -> None:
        self.samples, self.output = samples, output

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        sample = self.samples[index]
        with av.open(sample.path) as container:
            stream = container.streams.video[0]
            stream.codec_context.thread_count = 1
            frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(stream)]
        clip = np.stack([frames[i] for i in sample.frame_indices(len(frames))])
        return apply_plan(clip, sample, self.output), sample.label, len(frames)


# --------------------------------------------------------------------------------------
# measurements


def plain_decode(path: str, num_frames: int | None = None, from_pts: int | None = None) -> int:
    """Plain PyAV: open, optionally seek to ``from_pts``, decode (one thread, no conversion).

    Counts frames from ``from_pts`` on and stops after ``num_frames`` (all if ``None``).
    """
    with av.open(path) as container:
        stream = container.streams.video[0]
        stream.codec_context.thread_count = 1
        if from_pts is not None:
            container.seek(from_pts, stream=stream)
        count = 0
        for frame in container.decode(stream):
            if from_pts is not None and frame.pts < from_pts:
                continue
            count += 1
            if num_frames is not None and count >= num_frames:
                break
    return count


def frame_pts(path: str) -> list[int]:
    with av.open(path) as container:
        stream = container.streams.video[0]
        return sorted(p.pts for p in container.demux(stream) if p.size and not p.is_discard)


def measure_ceiling(paths: list[str], runs: int) -> dict:
    rates = []
    for _ in range(runs):
        start = time.perf_counter()
        frames = sum(plain_decode(p) for p in paths)
        rates.append(frames / (time.perf_counter() - start))
    return {"frames_per_s": statistics.median(rates), "min": min(rates), "max": max(rates), "runs": runs,
            "what": "sequential PyAV decode of every file, 1 process, 1 thread, no RGB"}


def measure_per_clip(samples: list[Sample], output: OutputSpec, ceiling_fps: float, runs: int) -> dict:
    """Each clip alone, in this process; the same windows for every variant, interleaved.

    The span of a clip is what any exact decoder has to get through: from the
    keyframe at or before the window to the window's last frame. ``plain_span``
    is plain PyAV doing just that (open, seek to that keyframe, decode the span,
    no conversion), the reference for "time per clip".
    """
    files = {s.path for s in samples}
    hints = {p: probe_hint(p) for p in files}
    pts = {p: frame_pts(p) for p in files}
    jobs = []
    for s in samples:
        entry = max(k for k in hints[s.path].keyframe_indices if k <= s.start_frame)
        last = s.frame_indices(NUM_FRAMES)[-1]
        jobs.append((s, last - entry + 1, None if entry == 0 else pts[s.path][entry]))
    times = {"skip_nonref": [], "no_skip": [], "plain_span": []}
    decode_times = {"skip_nonref": [], "no_skip": []}
    decoded = {"skip_nonref": [], "no_skip": []}
    for _ in range(runs):
        for s, span, entry_pts in jobs:
            for name, skip in (("skip_nonref", True), ("no_skip", False)):
                start = time.perf_counter()
                clip = decode_window(s.path, s.frame_indices(), skip_nonref=skip)
                decoded_at = time.perf_counter()
                apply_plan(clip.frames, s, output)
                times[name].append(time.perf_counter() - start)
                decode_times[name].append(decoded_at - start)
                decoded[name].append(clip.num_frames_decoded)
            start = time.perf_counter()
            plain_decode(s.path, span, entry_pts)
            times["plain_span"].append(time.perf_counter() - start)
    span_mean = float(np.mean([span for _, span, _ in jobs]))
    plain_ms = 1000 * float(np.mean(times["plain_span"]))
    result = {"clips": len(samples), "runs": runs, "span_frames_per_clip": span_mean,
              "plain_span_ms_per_clip": plain_ms}
    for name in ("skip_nonref", "no_skip"):
        ms = 1000 * float(np.mean(times[name]))
        decode_ms = 1000 * float(np.mean(decode_times[name]))
        frames = float(np.mean(decoded[name]))
        result[name] = {
            "ms_per_clip": ms,
            "decode_ms_per_clip": decode_ms,
            "decode_ratio_vs_plain_span_measured": decode_ms / plain_ms,
            "clips_per_s": 1000 / ms,
            "frames_decoded_per_clip": frames,
            "decoded_frames_per_s": frames * 1000 / ms,
            "ratio_vs_plain_span_measured": ms / plain_ms,
            "ratio_vs_ceiling_span": ms / (1000 * span_mean / ceiling_fps),
            "ratio_vs_ceiling_decoded": ms / (1000 * frames / ceiling_fps),
        }
    result["skip_gain"] = result["no_skip"]["ms_per_clip"] / result["skip_nonref"]["ms_per_clip"]
    return result


class FallbackPasses:
    """Passes over ``samples`` through the fallback as the loader runs it: a FallbackSource under an epoch pass."""

    def __init__(self, samples, output, *, batch_size: int, workers: int, skip_nonref: bool) -> None:
        from daliload.epoch import PassSetup
        from fallback.options import FallbackOptions
        from fallback.source import FallbackSource

        self.samples = list(samples)
        self.batches = [self.samples[i:i + batch_size] for i in range(0, len(self.samples), batch_size)]
        self.source = FallbackSource(output, FallbackOptions(skip_nonref=skip_nonref, timeout_s=60.0), workers=workers)
        self.setup = PassSetup(output=output, device=torch.device("cpu"), label_padding=False, mask_failed=False,
                               prefetch=2, num_frames=lambda video: None)

    def __iter__(self):
        from daliload.epoch import EpochCounters, EpochPass, Routes
        from daliload.failures import FailureBudget

        self.budget = FailureBudget(len({s.path for s in self.samples}), max_fraction=1.0)
        self.counters = EpochCounters()
        return iter(EpochPass(self.setup, self.batches, self.samples, routes=Routes(), budget=self.budget,
                              counters=self.counters, fallback=self.source))

    def close(self) -> None:
        self.source.close()


def time_passes(loader, frames_of_pass, passes: int) -> dict:
    """One warm-up pass (workers start), then ``passes`` timed passes."""
    for _ in loader:
        pass
    rates, frames_per_clip = [], []
    for _ in range(passes):
        start = time.perf_counter()
        clips, frames = 0, 0
        for batch in loader:
            clips += len(batch[1])
            frames += frames_of_pass(batch)
        elapsed = time.perf_counter() - start
        frames = frames or frames_of_pass(None)
        rates.append(clips / elapsed)
        frames_per_clip.append(frames / clips)
    cps, fpc = statistics.median(rates), statistics.median(frames_per_clip)
    return {"clips_per_s": cps, "min": min(rates), "max": max(rates), "passes": passes,
            "frames_decoded_per_clip": fpc, "decoded_frames_per_s": cps * fpc}


def measure_loaders(samples, output, workers: int, batch_size: int, passes: int) -> dict:
    out = {"workers": workers, "batch_size": batch_size}
    blog = DataLoader(BlogDataset(samples, output), batch_size=batch_size, num_workers=workers,
                      multiprocessing_context="forkserver", persistent_workers=True, prefetch_factor=2)
    out["blog"] = time_passes(blog, lambda batch: int(batch[2].sum()), passes)
    del blog
    for name, skip in (("fallback", True), ("fallback_no_skip", False)):
        loader = FallbackPasses(samples, output, batch_size=batch_size, workers=workers, skip_nonref=skip)
        # frames come from the pass's counters, which cover the pass just finished
        out[name] = time_passes(loader, lambda batch, loader=loader: 0 if batch is not None
                                else loader.counters.frames_decoded_fallback, passes)
        out[name]["failures"] = len(loader.budget.failures)
        loader.close()
    out["ratio_fallback_over_blog"] = out["fallback"]["clips_per_s"] / out["blog"]["clips_per_s"]
    return out


def _memory_child(paths: list[str], decodes: int, checkpoint: int, queue) -> None:
    torch.set_num_threads(1)
    output = OutputSpec(size=(112, 112))
    rng = random.Random(0)

    def peak_mb() -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    marks = {}
    start = time.perf_counter()
    for i in range(1, decodes + 1):
        path = paths[i % len(paths)]
        s = Sample(position=i, video_index=0, path=path, label=0, start_frame=rng.randrange(0, 60),
                   frame_stride=2, clip_len=8, crop=CropBox(0.1, 0.1, 0.9, 0.9), flip=bool(i % 2))
        decode_sample(s, output)
        if i in (checkpoint, decodes):
            marks[i] = peak_mb()
    queue.put({"decodes": decodes, "checkpoint": checkpoint, "peak_rss_mb_at_checkpoint": marks[checkpoint],
               "peak_rss_mb_at_end": marks[decodes], "growth_mb": marks[decodes] - marks[checkpoint],
               "seconds": time.perf_counter() - start})


def measure_memory(root: Path, decodes: int, checkpoint: int) -> dict:
    """Peak RSS of a fresh process decoding small clips ``decodes`` times (windows, transform)."""
    small = []
    for i, codec in enumerate(["h264", "h264", "vp9"]):
        path = root / f"small{i}.{default_spec(codec).extension}"
        if not path.exists():
            write_video(path, render_clip(i, 72, width=160, height=128, seed=i), default_spec(codec, gop=25))
        small.append(str(path))
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_memory_child, args=(small, decodes, checkpoint, queue))
    child.start()
    result = queue.get()
    child.join()
    result["clips"] = "160x128, 72 frames, H.264 and VP9, GOP 25; 8 frames at stride 2 to 112x112"
    return result


# --------------------------------------------------------------------------------------
# report


def markdown(r: dict) -> str:
    pc, ld, mem, ce = r["per_clip"], r["loaders"], r["memory"], r["ceiling"]
    lines = [
        f"### Fallback run `fallback` — {r['machine']}, {r['date']}",
        "",
        "`python -m benchmarks.bench_fallback`; " + ", ".join(f"{k} {v}" for k, v in r["versions"].items())
        + (f"; {r['seconds']:.0f} s." if "seconds" in r else "."),
        "",
        *([f"Load average (1 min) {r['load_average_1min']['start']:.1f} at the start, "
           f"{r['load_average_1min']['end']:.1f} at the end, on {r['load_average_1min']['cores']} cores.", ""]
          if "load_average_1min" in r else []),
        f"{r['params']['videos']} generated clips {WIDTH}x{HEIGHT}, {NUM_FRAMES} frames, H.264 GOP 250 with "
        f"B-frames; {r['params']['clips']} windows of {CLIP_LEN} frames at stride {STRIDE}.",
        f"Ceiling (plain sequential PyAV, 1 process, 1 thread, no RGB): {ce['frames_per_s']:.0f} frames/s "
        f"(min {ce['min']:.0f}, max {ce['max']:.0f}).",
        "",
        f"| loader ({ld['workers']} workers, batch {ld['batch_size']}) | clips/s (min-max) | decoded frames/s "
        f"| frames decoded per clip |",
        "|---|---|---|---|",
    ]
    for name, label in (("blog", "blog: whole file to a list, then index"),
                        ("fallback", "fallback (skip_nonref on)"),
                        ("fallback_no_skip", "fallback (skip_nonref off)")):
        m = ld[name]
        lines.append(f"| {label} | {m['clips_per_s']:.1f} ({m['min']:.1f}-{m['max']:.1f}) | "
                     f"{m['decoded_frames_per_s']:.0f} | {m['frames_decoded_per_clip']:.1f} |")
    lines += [
        "",
        f"fallback / blog: **{ld['ratio_fallback_over_blog']:.2f}x** clips/s (target >= 2.5x).",
        "",
        "| one clip in-process | ms/clip: decode (+ transform) | frames decoded "
        "| vs plain PyAV on the same span, measured: decode (+ transform) "
        "| vs ceiling x span | vs ceiling x frames decoded |",
        "|---|---|---|---|---|---|",
    ]
    for name in ("skip_nonref", "no_skip"):
        m = pc[name]
        lines.append(f"| {name} | {m['decode_ms_per_clip']:.1f} ({m['ms_per_clip']:.1f}) | "
                     f"{m['frames_decoded_per_clip']:.1f} | {m['decode_ratio_vs_plain_span_measured']:.2f}x "
                     f"({m['ratio_vs_plain_span_measured']:.2f}x) | {m['ratio_vs_ceiling_span']:.2f}x | "
                     f"{m['ratio_vs_ceiling_decoded']:.2f}x |")
    lines += [
        "",
        f"Span (keyframe before the window to its last frame): {pc['span_frames_per_clip']:.1f} frames/clip; "
        f"plain PyAV opens and decodes it in {pc['plain_span_ms_per_clip']:.1f} ms. skip_nonref speed-up: "
        f"{pc['skip_gain']:.2f}x (target for time per clip: <= 1.25x plain PyAV).",
        "",
        f"Memory: peak RSS {mem['peak_rss_mb_at_checkpoint']:.0f} MB after {mem['checkpoint']} decodes, "
        f"{mem['peak_rss_mb_at_end']:.0f} MB after {mem['decodes']} (growth {mem['growth_mb']:.1f} MB; "
        f"target < 100 MB).",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--videos", type=int, default=16, help="generated clips (default 16)")
    parser.add_argument("--clips", type=int, default=64, help="windows in the plan (default 64)")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers for both loaders")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--passes", type=int, default=3, help="timed passes per loader after a warm-up")
    parser.add_argument("--runs", type=int, default=3, help="repeats of the in-process measurements")
    parser.add_argument("--memory-decodes", type=int, default=5000)
    parser.add_argument("--memory-checkpoint", type=int, default=500)
    parser.add_argument("--data-dir", type=Path, default=None, help="keep/reuse generated clips here")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--machine", default="2-core CPU VM, no GPU")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "fallback.json")
    parser.add_argument("--results-md", type=Path, default=Path(__file__).parent / "RESULTS.md",
                        help="markdown file whose `### Fallback run` section the run replaces")
    parser.add_argument("--no-md", action="store_true", help="print the markdown only")
    parser.add_argument("--report-from", type=Path, default=None, metavar="JSON",
                        help="measure nothing: write the section of an earlier run's JSON")
    args = parser.parse_args(argv)
    if args.report_from is not None:
        return _report(json.loads(args.report_from.read_text()), args)

    torch.set_num_threads(1)
    started = time.perf_counter()
    load_start = os.getloadavg()[0]  # a shared machine: how busy it was, to read the numbers by
    with tempfile.TemporaryDirectory(prefix="bench_fallback_") as tmp:
        root = args.data_dir or Path(tmp)
        paths = make_videos(root, args.videos)
        samples = make_plan(paths, args.clips, args.seed)
        output = OutputSpec(size=(CROP, CROP))
        result = {
            "benchmark": "fallback", "machine": args.machine, "package_commit": package_commit(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "versions": {"python": platform.python_version(), "av": av.__version__, "torch": torch.__version__,
                         "ffmpeg": ".".join(map(str, av.library_versions["libavcodec"]))},
            "params": {"videos": args.videos, "clips": args.clips, "clip_len": CLIP_LEN, "stride": STRIDE,
                       "size": [WIDTH, HEIGHT], "num_frames": NUM_FRAMES, "gop": 250, "bframes": 3,
                       "output": [CROP, CROP], "seed": args.seed},
        }
        result["memory"] = measure_memory(root, args.memory_decodes, args.memory_checkpoint)
        result["ceiling"] = measure_ceiling(paths, args.runs)
        result["per_clip"] = measure_per_clip(samples, output, result["ceiling"]["frames_per_s"], args.runs)
        result["loaders"] = measure_loaders(samples, output, args.workers, args.batch_size, args.passes)
    result["seconds"] = time.perf_counter() - started
    result["load_average_1min"] = {"start": load_start, "end": os.getloadavg()[0], "cores": os.cpu_count()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"(wrote {args.out}; {result['seconds']:.0f} s)\n")
    return _report(result, args)


def _report(result: dict, args: argparse.Namespace) -> int:
    """Print the run's markdown and, unless ``--no-md``, put it in ``--results-md`` (replacing the last run's)."""
    from benchmarks.report import record_section

    record_section(markdown(result), None if args.no_md else args.results_md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
