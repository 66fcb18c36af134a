"""NVDEC throughput: daliload's DALI path over DALI threads x pipelines, against one pipeline per engine.

``python -m benchmarks.bench_nvdec`` (options: ``--help``) generates (or
reuses) one dataset of :mod:`benchmarks.datasets` (default ``h264-gop250``:
256 H.264 clips, 340x256, 10 s, a keyframe every 250 frames, as Kinetics
downloads have), draws the run's windows, crops and flips the way the loader
does (:func:`daliload.plan.make_train_plan`; once past every file, the next
epoch's draws), then, in this one process:

1. the ceiling: ``fn.decoders.video`` over whole files and nothing else
   (:class:`benchmarks.ceiling.DaliWholeFiles`), one pipeline per NVDEC
   engine, all at once (``--engines``, default the GPU model's count from
   :data:`daliload.prescreen.gpus.NVDEC_ENGINES`), at least ``--min-clips``
   files, after a warm-up epoch;
2. every setting of ``--threads`` x ``--pipelines`` (default {8, 16, 32} x
   {1, 2, 4, 7}, most pipelines first): the loader's DALI path itself
   (:class:`daliload.epoch.EpochPass` over :class:`daliload.dali.DaliSource`
   over :class:`daliload.dali.DaliClipDecoder`, whole files fed, the
   merge's copy into torch memory included) with the loader's prefetch rule
   for that many pipelines (``DecodeSpec.batches_ahead``), a warm-up of a
   few batches, then one timed epoch of at least ``--min-clips`` clips, a
   multiple of ``pipelines x batch`` (each pipeline gets the same number of
   batches, at least two).

Recorded per row: clips/s; decoded frames/s (DALI decodes from frame 0 to
each window's end, ``~``: estimated, :func:`benchmarks.task.from_start_decode_estimate`;
the ceiling's are counted); NVML's decoder utilisation and what it means in
engines: NVML reports the mean over the engines, so ``engines busy = util % x
engines / 100`` (14 % of an H200's 7 is one engine); SM utilisation; peak
device memory above what was in use at the start; DALI wait (host seconds the
pass waited for DALI). The best setting by clips/s is named; it is what
``DecodeSpec(dali_pipelines="auto")`` should become. ``--time-budget``
starts no setting that would not end in time (listed as skipped), and the
JSON (``--json``, default ``benchmarks/results/nvdec-DATASET.json``) is
rewritten after every row, so a run cut short keeps what it measured
(``--report-from`` makes its table). ``--device cpu`` runs the same on
DALI's CPU decoder (VP8/VP9/MJPEG; for tests: no NVDEC figures).
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import math
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Sequence

from benchmarks.datasets import HD_DATASETS, STANDARD, Dataset, loader_order, prepare_dataset, standard_specs
from benchmarks.options import REPO_ROOT, _int_list, _size, int_at_least
from benchmarks.report import add_output_options, append_markdown, load_average, save_result
from benchmarks.machine import machine_info, machine_line, versions_line
from benchmarks.task import TaskSpec, from_start_decode_estimate
from daliload.plan import Sample
from daliload.runtime import usable_cores

CHAPTER = "## NVDEC sweep: `python -m benchmarks.bench_nvdec`"
THREADS = (8, 16, 32)
PIPELINES = (1, 2, 4, 7)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_nvdec", description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default="h264-gop250", choices=list(STANDARD))
    parser.add_argument("--files", type=int_at_least(1), default=None,
                        help="distinct clips generated (default 256; 128 for h264-720p)")
    parser.add_argument("--duration", type=float, default=None,
                        help="seconds per clip (default 10, as Kinetics; 4 for h264-720p)")
    parser.add_argument("--size", type=_size, default=None, help="WIDTHxHEIGHT replacing 340x256 (tests)")
    parser.add_argument("--min-clips", type=int_at_least(1), default=256,
                        help="clips (ceiling: whole files) per timed epoch, at least (default 256)")
    parser.add_argument("--threads", type=_int_list, default=list(THREADS), help="DALI threads (default 8,16,32)")
    parser.add_argument("--pipelines", type=_int_list, default=list(PIPELINES),
                        help="DALI pipelines (default 1,2,4,7)")
    parser.add_argument("--batch-size", type=int_at_least(1), default=32, help="clips per batch (default 32)")
    parser.add_argument("--crop-size", type=int_at_least(8), default=224, help="output size (default 224)")
    parser.add_argument("--ceiling-batch", type=int_at_least(1), default=None,
                        help="whole files per ceiling batch (default 32; 8 for h264-720p: 0.3 GB each decoded)")
    parser.add_argument("--engines", type=int_at_least(1), default=None,
                        help="NVDEC engines (default: the GPU model's, daliload.prescreen.gpus; 1 if unknown)")
    parser.add_argument("--device", choices=("gpu", "cpu"), default="gpu")
    parser.add_argument("--time-budget", type=float, default=None, metavar="S",
                        help="start no row that would not end within S seconds of the start")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-dir", default=str(REPO_ROOT / "bench_out" / "datasets"))
    parser.add_argument("--generate-only", action="store_true", help="make the dataset and stop (no DALI needed)")
    parser.add_argument("--report-from", default=None, metavar="JSON", help="measure nothing: the table of JSON")
    add_output_options(parser, "nvdec")
    args = parser.parse_args(argv)
    hd = args.dataset in HD_DATASETS
    args.files = args.files or (128 if hd else 256)
    args.duration = args.duration or (4.0 if hd else 10.0)
    args.ceiling_batch = args.ceiling_batch or (8 if hd else 32)
    if args.json == parser.get_default("json"):
        args.json = str(Path(args.json).with_name(f"nvdec-{args.dataset}.json"))
    return args


def dataset_for(args: argparse.Namespace) -> Dataset:
    """The run's dataset, generated once (``run_gpu_bench.sh --receive`` makes it ahead, with these options)."""
    spec = standard_specs([args.dataset], num_clips=args.files, num_clips_hd=args.files, duration_s=args.duration,
                          duration_hd_s=args.duration, seed=args.seed, size=args.size)[0]
    return prepare_dataset(spec, args.data_dir, workers=usable_cores())


def plan_clips(dataset: Dataset, task: TaskSpec, clips: int) -> list[Sample]:
    """``clips`` samples as the loader plans them: epoch 0's draws over every file, then epoch 1's, ..."""
    from daliload.plan import make_train_plan

    order = loader_order(dataset)
    listed = [dataset.videos[i] for i in order]
    samples: list[Sample] = []
    epoch = 0
    while len(samples) < clips:
        drawn = make_train_plan(listed, seed=task.seed, epoch=epoch, rank=0, world_size=1, clip=task.clip,
                                augment=task.augment)
        samples += [dataclasses.replace(s, position=len(samples) + k, video_index=order[s.video_index],
                                        path=dataset.videos[order[s.video_index]].path) for k, s in enumerate(drawn)]
        epoch += 1
    return samples[:clips]


def timed_clips(pipelines: int, batch_size: int, min_clips: int) -> int:
    """Clips of a setting's timed epoch: at least ``min_clips`` and two batches per pipeline, in whole rounds.

    Example: 32 clips a batch, at least 256: 1, 2 or 4 pipelines time 256 clips; 7 time 448 (2 rounds of 7).
    """
    round_ = pipelines * batch_size
    return max(2, math.ceil(min_clips / round_)) * round_


def why_not_here(device: str) -> str | None:
    """Why DALI cannot decode on ``device`` here, or None."""
    from daliload.dali import INSTALL_HINT, is_dali_available

    if not is_dali_available():
        return f"DALI is not installed; {INSTALL_HINT}"
    if device == "cpu":
        return None
    import torch

    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    try:
        ctypes.CDLL("libnvcuvid.so.1")
    except OSError as err:
        return f"libnvcuvid.so.1 does not load ({err}): no NVDEC here"
    return None


def engines_here(args: argparse.Namespace) -> tuple[int, str]:
    """NVDEC engines to count with, and where the number comes from."""
    if args.engines is not None:
        return args.engines, "--engines"
    if args.device == "cpu":
        return 1, "DALI's CPU decoder (no engines)"
    from daliload.prescreen.gpus import detect_gpu

    gpu = detect_gpu()
    if gpu.nvdec_engines is None:
        return 1, f"{gpu.describe()}: not in daliload.prescreen.gpus.NVDEC_ENGINES; counted as 1"
    return gpu.nvdec_engines, f"{gpu.describe()}: daliload.prescreen.gpus.NVDEC_ENGINES"


def _resources(resources, engines: int) -> dict:
    nvdec = resources.nvdec_util_pct
    peak, base = resources.gpu_mem_peak_mb, resources.gpu_mem_base_mb
    return {"nvdec_util_pct": nvdec, "engines_busy": None if nvdec is None else nvdec * engines / 100,
            "sm_util_pct": resources.gpu_util_pct,
            "gpu_mem_peak_mb": None if peak is None or base is None else peak - base,
            "cpu_s": resources.cpu_s, "peak_rss_mb": resources.peak_rss_mb}


def measure_ceiling(dataset: Dataset, args: argparse.Namespace, engines: int, monitor) -> dict:
    """Whole files, one pipeline per engine at once, at least ``--min-clips`` files: a warm-up epoch, one timed."""
    from benchmarks.ceiling import DaliWholeFiles, DaliWholeFilesCPU
    from benchmarks.loaders import LoaderConfig

    base = DaliWholeFilesCPU if args.device == "cpu" else DaliWholeFiles
    ceiling_cls = type("Ceiling", (base,), {"max_pipelines": engines, "batch_size": args.ceiling_batch})
    rounds = math.ceil(args.min_clips / len(dataset.videos))
    files = SimpleNamespace(videos=list(dataset.videos) * rounds)
    config = LoaderConfig(task=TaskSpec(batch_size=args.batch_size, seed=args.seed), workers=16, device="cpu")
    started = time.perf_counter()
    ceiling = ceiling_cls(files, [], config)
    setup_s = time.perf_counter() - started
    try:
        warm = time.perf_counter()
        list(ceiling.epoch())
        warmup_s = time.perf_counter() - warm
        monitor.begin_run()
        start = time.perf_counter()
        batches = list(ceiling.epoch())
        wall = time.perf_counter() - start
        resources = monitor.end_run()
        pipelines, threads = len(ceiling._pipelines), ceiling.num_threads
    finally:
        ceiling.close()
    clips, frames = sum(b.num_clips for b in batches), sum(b.frames_decoded for b in batches)
    return {"status": "ok", "pipelines": pipelines, "threads": threads, "batch_size": args.ceiling_batch,
            "files": clips, "frames": frames, "wall_s": wall, "setup_s": setup_s, "warmup_s": warmup_s,
            "clips_per_s": clips / wall, "frames_per_s": frames / wall, **_resources(resources, engines)}


def measure_setting(threads: int, pipelines: int, samples: list[Sample], dataset: Dataset, args: argparse.Namespace,
                    engines: int, monitor) -> dict:
    """One setting through the loader's DALI path: build, warm up on a few batches, one timed epoch."""
    import numpy as np
    import torch

    from daliload.dali import DaliSource
    from daliload.epoch import EpochCounters, EpochPass, PassSetup, Routes
    from daliload.failures import FailureBudget
    from daliload.options import DecodeSpec
    from daliload.dali import DaliClipDecoder
    from fallback.source import FallbackSource

    task = TaskSpec(batch_size=args.batch_size, crop_size=args.crop_size, seed=args.seed)
    frames_of = {v.path: v.num_frames for v in dataset.videos}
    prefetch = DecodeSpec(dali_threads=threads, dali_pipelines=pipelines, fallback_workers=0).batches_ahead(
        task.batch_size, pipelines=pipelines)
    batches = [samples[i:i + task.batch_size] for i in range(0, len(samples), task.batch_size)]
    gpu = args.device == "gpu"
    setup = PassSetup(output=task.output, device=torch.device("cuda" if gpu else "cpu"), label_padding=False,
                      mask_failed=False, prefetch=prefetch,
                      num_frames=lambda video: dataset.videos[video].num_frames)
    started = time.perf_counter()
    decoder = DaliClipDecoder(task.output, batch_size=task.batch_size, device=args.device, num_threads=threads,
                              prefetch_queue_depth=prefetch, pipelines=pipelines, num_frames=frames_of)
    source = DaliSource(decoder, clip_timeout_s=60.0)
    fallback = FallbackSource(task.output, workers=0)  # decodes in this process what DALI fails on (counted)
    setup_s = time.perf_counter() - started
    on_dali = np.ones(len(dataset.videos), dtype=bool)

    def one_pass(chunk: list[list[Sample]]) -> tuple[EpochCounters, FailureBudget, int]:
        plan = [s for batch in chunk for s in batch]
        counters, budget = EpochCounters(), FailureBudget(len(dataset.videos), max_fraction=None)
        clips = 0
        routes = Routes(on_dali, policy="static")  # NVDEC is what is measured: every clip to DALI
        for _, labels, _ in EpochPass(setup, chunk, plan, routes=routes, budget=budget, counters=counters,
                                      fallback=fallback, dali=source):
            clips += int(labels.shape[0])
        if gpu:
            torch.cuda.synchronize()
        return counters, budget, clips

    try:
        warm = time.perf_counter()
        one_pass(batches[:2 * pipelines])
        warmup_s = time.perf_counter() - warm
        monitor.begin_run()
        start = time.perf_counter()
        counters, budget, clips = one_pass(batches)
        wall = time.perf_counter() - start
        resources = monitor.end_run()
    finally:
        source.close()
        fallback.close()
    decoded = sum(from_start_decode_estimate(s.frame_indices(frames_of[s.path])) for s in samples)
    return {"status": "ok", "threads": threads, "pipelines": pipelines, "prefetch": prefetch, "clips": clips,
            "frames_estimated": decoded, "wall_s": wall, "setup_s": setup_s, "warmup_s": warmup_s,
            "clips_per_s": clips / wall, "frames_per_s": decoded / wall, "dali_wait_s": counters.dali_wait_s,
            "clips_dali": counters.clips_dali, "clips_redecoded": counters.clips_redecoded,
            "failures": len(budget.failures), **_resources(resources, engines)}


def _estimate_s(rows: list[dict], pipelines: int, clips: int) -> float:
    """Seconds a setting will take, from the rows measured so far (0 before the first)."""
    done = [r for r in rows if r["status"] == "ok"]
    if not done:
        return 0.0
    # Fewer pipelines keep fewer engines busy: scale the slowest per-clip time seen by the pipeline ratio.
    per_clip = max(r["wall_s"] / r["clips"] * max(1.0, r["pipelines"] / pipelines) for r in done)
    overhead = max(r["setup_s"] + r["warmup_s"] for r in done)
    return overhead + per_clip * clips * 1.1


def best_row(rows: list[dict]) -> dict | None:
    ok = [r for r in rows if r["status"] == "ok"]
    return max(ok, key=lambda r: r["clips_per_s"]) if ok else None


def run(args: argparse.Namespace) -> dict:
    """Measure what the options ask for; returns the result (also in ``args.json`` after every row)."""
    from benchmarks.metrics import ResourceMonitor

    started = time.monotonic()
    result = {"name": f"nvdec-{args.dataset}", "machine": machine_info(args.machine),
              "load_average": [load_average(), None], "status": "ok", "reason": None,
              "settings": {"dataset": args.dataset, "files": args.files, "duration_s": args.duration,
                           "min_clips": args.min_clips,
                           "batch_size": args.batch_size, "crop_size": args.crop_size, "device": args.device,
                           "threads": args.threads, "pipelines": args.pipelines, "ceiling_batch": args.ceiling_batch,
                           "time_budget_s": args.time_budget},
              "ceiling": None, "rows": []}
    why = why_not_here(args.device)
    if why is not None:  # before the dataset: nothing here could use it
        result.update(status="unavailable", reason=why)
        _write(result, args)
        return result
    dataset = dataset_for(args)
    result["settings"]["description"] = dataset.spec.description
    engines, source = engines_here(args)
    result["settings"].update(engines=engines, engines_from=source)
    task = TaskSpec(batch_size=args.batch_size, crop_size=args.crop_size, seed=args.seed)
    settings = [(t, p) for p in sorted(args.pipelines, reverse=True) for t in sorted(args.threads)]
    samples = plan_clips(dataset, task, max(timed_clips(p, args.batch_size, args.min_clips) for _, p in settings))
    monitor = ResourceMonitor(gpu=args.device == "gpu")
    try:
        try:
            result["ceiling"] = measure_ceiling(dataset, args, engines, monitor)
        except Exception as err:  # noqa: BLE001 - a row that fails is recorded with its error; the sweep goes on
            result["ceiling"] = {"status": "failed", "reason": f"{type(err).__name__}: {err}"[:500]}
        _write(result, args)
        print(f"  ceiling: {_line(result['ceiling'])}", flush=True)
        for threads, pipelines in settings:
            clips = timed_clips(pipelines, args.batch_size, args.min_clips)
            elapsed = time.monotonic() - started
            if args.time_budget is not None and elapsed + _estimate_s(result["rows"], pipelines, clips) > \
                    args.time_budget:
                row = {"status": "skipped", "threads": threads, "pipelines": pipelines,
                       "reason": f"would end past the time budget of {args.time_budget:g} s"}
            else:
                try:
                    row = measure_setting(threads, pipelines, samples[:clips], dataset, args, engines, monitor)
                except Exception as err:  # noqa: BLE001 - as above
                    row = {"status": "failed", "threads": threads, "pipelines": pipelines,
                           "reason": f"{type(err).__name__}: {err}"[:500]}
            result["rows"].append(row)
            _write(result, args)
            print(f"  {threads} threads x {pipelines} pipelines: {_line(row)}", flush=True)
    finally:
        monitor.close()
    best = best_row(result["rows"])
    result["best"] = None if best is None else {"threads": best["threads"], "pipelines": best["pipelines"],
                                                "clips_per_s": best["clips_per_s"]}
    result["load_average"][1] = load_average()
    result["elapsed_s"] = round(time.monotonic() - started, 1)
    _write(result, args)
    return result


def _write(result: dict, args: argparse.Namespace) -> None:
    save_result(result, args.json)


def _fmt(value: float | None, digits: int = 0, suffix: str = "") -> str:
    return "–" if value is None else f"{value:.{digits}f}{suffix}"


def _line(row: dict | None) -> str:
    if row is None or row["status"] != "ok":
        return f"{(row or {}).get('status', 'not run')}: {(row or {}).get('reason')}"
    return (f"{row['clips_per_s']:.1f} clips/s, {row['frames_per_s']:.0f} decoded frames/s, NVDEC "
            f"{_fmt(row['nvdec_util_pct'], 0, ' %')} = {_fmt(row['engines_busy'], 1)} engines busy, SM "
            f"{_fmt(row['sm_util_pct'], 0, ' %')}, peak device memory +{_fmt(row['gpu_mem_peak_mb'], 0)} MiB")


def markdown(result: dict) -> str:
    s = result["settings"]
    command = f"python -m benchmarks.bench_nvdec --dataset {s['dataset']}"
    lines = [f"### NVDEC sweep `{result['name']}` — {machine_line(result['machine'])}", "",
             f"`{command}`; {versions_line(result['machine'])}; load average {result['load_average'][0]} at the "
             f"start. {s['files']} clips ({s.get('description', s['dataset'])}, {s['duration_s']:g} s each); "
             f"batches of {s['batch_size']}, {s['crop_size']}x{s['crop_size']} float32 out, one timed epoch per row "
             f"after a warm-up. Decoded frames/s of the settings are estimated (`~`: DALI decodes from frame 0 to each "
             f"window's end); engines busy = NVML decoder % x {s.get('engines', '?')} engines / 100 "
             f"({s.get('engines_from', '')}).", ""]
    if result["status"] != "ok":
        return "\n".join(lines + [f"Not measured: {result['reason']}.", ""])
    ceiling = result["ceiling"] or {"status": "not run", "reason": None}
    ceiling_fps = ceiling.get("frames_per_s") if ceiling["status"] == "ok" else None
    lines += ["| DALI threads | pipelines | clips/s | decoded frames/s | x ceiling (frames) | NVDEC % | engines busy "
              "| SM % | peak device MiB | DALI wait s | status |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]

    def row_line(threads, pipelines, row, frames_mark):
        if row["status"] != "ok":
            return f"| {threads} | {pipelines} | | | | | | | | | {row['status']}: {row.get('reason')} |"
        ratio = _fmt(row["frames_per_s"] / ceiling_fps, 2) if ceiling_fps else "–"
        return (f"| {threads} | {pipelines} | {row['clips_per_s']:.1f} | {frames_mark}{row['frames_per_s']:.0f} | "
                f"{ratio} | {_fmt(row['nvdec_util_pct'])} | {_fmt(row['engines_busy'], 1)} | "
                f"{_fmt(row['sm_util_pct'])} | {_fmt(row['gpu_mem_peak_mb'])} | {_fmt(row.get('dali_wait_s'), 1)} | "
                f"ok |")

    lines.append(row_line(ceiling.get("threads", "–"), f"{ceiling.get('pipelines', '–')} (ceiling: whole files)",
                          ceiling, ""))
    for row in result["rows"]:
        lines.append(row_line(row["threads"], row["pipelines"], row, "~"))
    best = result.get("best")
    lines += ["", f"Best setting: {best['threads']} DALI threads x {best['pipelines']} pipelines, "
                  f"{best['clips_per_s']:.1f} clips/s." if best else "", ""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report_from:
        result = json.loads(Path(args.report_from).read_text(encoding="utf-8"))
    elif args.generate_only:
        dataset = dataset_for(args)
        print(f"dataset {args.dataset}: {len(dataset.videos)} clips, {dataset.total_frames} frames in {dataset.root}")
        return 0
    else:
        result = run(args)
    text = markdown(result)
    print(text)
    Path(args.json).with_suffix(".md").write_text(text, encoding="utf-8")
    if not args.no_md and result["status"] == "ok":
        append_markdown(args.results_md, text, chapter=CHAPTER)
    return 0 if result["status"] == "ok" else 1


if __name__ == "__main__":
    raise SystemExit(main())
