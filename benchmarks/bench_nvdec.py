"""NVDEC throughput: daliload's DALI path over DALI threads x pipelines, against one pipeline per engine.

``python -m benchmarks.bench_nvdec`` (options: ``--help``) generates (or
reuses) one dataset of :mod:`benchmarks.datasets` (default ``h264-gop250``:
256 H.264 clips, 340x256, 10 s, a keyframe every 250 frames, as Kinetics
downloads have), then, in this one process:

1. the ceiling: ``fn.decoders.video`` over whole files and nothing else
   (:class:`benchmarks.ceiling.DaliWholeFiles`), one pipeline per NVDEC
   engine, all at once (``--engines``, default the GPU model's count from
   :data:`daliload.prescreen.gpus.NVDEC_ENGINES`), at least ``--min-clips``
   files, after a warm-up epoch;
2. every setting of ``--threads`` x ``--pipelines`` (default {8, 16, 32} x
   {1, 2, 4, 7}, most pipelines first): the loader itself
   (:class:`daliload.KineticsDALILoader` on the dataset's Kinetics layout)
   pinned to DALI (``routing="static"``) with that many DALI threads and
   pipelines, fed what the loader feeds DALI (``--feed``, default
   ``window``: each window's packets, cut by ``--cut-workers`` of the
   fallback's processes, as ``DecodeSpec`` does by default; ``file``: whole
   files), its prefetch rule for that many pipelines, the merge into torch
   memory included; a warm-up epoch, then whole epochs until at least
   ``--min-clips`` clips and two batches per pipeline.

Recorded per row: clips/s; decoded frames/s (the loader's own count of what
DALI decoded, ``stats().frames_decoded_dali``; the ceiling's are counted
too); clips DALI got as a cut; NVML's decoder utilisation and what it means in
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
import json
import math
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Sequence

from benchmarks.datasets import HD_DATASETS, STANDARD, Dataset, prepare_dataset, standard_specs
from benchmarks.options import REPO_ROOT, _int_list, _size, int_at_least
from benchmarks.report import add_output_options, append_markdown, load_average, save_result
from benchmarks.machine import machine_info, machine_line, versions_line
from benchmarks.task import TaskSpec
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
    parser.add_argument("--feed", choices=("window", "file"), default="window",
                        help="what DALI is fed: each window's packets (the loader's default) or whole files")
    parser.add_argument("--cut-workers", type=int_at_least(0), default=None,
                        help="the fallback's processes, who cut the windows (default: DecodeSpec's fallback_workers)")
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
    if args.cut_workers is None:
        from daliload.options import DecodeSpec

        args.cut_workers = DecodeSpec().fallback_workers
    if args.json == parser.get_default("json"):
        args.json = str(Path(args.json).with_name(f"nvdec-{args.dataset}.json"))
    return args


def dataset_for(args: argparse.Namespace) -> Dataset:
    """The run's dataset, generated once (``run_gpu_bench.sh --receive`` makes it ahead, with these options)."""
    spec = standard_specs([args.dataset], num_clips=args.files, num_clips_hd=args.files, duration_s=args.duration,
                          duration_hd_s=args.duration, seed=args.seed, size=args.size)[0]
    return prepare_dataset(spec, args.data_dir, workers=usable_cores())


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


def scan_once(dataset: Dataset, device: str) -> float:
    """The loader's manifest of the dataset, written before any row (each setting's loader reuses it): seconds."""
    from benchmarks.datasets import kinetics_layout
    from daliload.prescreen import scan

    started = time.perf_counter()
    scan(kinetics_layout(dataset), device=device, splits=("train",), progress=False)
    return round(time.perf_counter() - started, 2)


def timed_epochs(pipelines: int, batch_size: int, min_clips: int, files: int) -> int:
    """Epochs a setting times: enough for :func:`timed_clips` (each epoch is one clip of every file)."""
    return math.ceil(timed_clips(pipelines, batch_size, min_clips) / files)


def measure_setting(threads: int, pipelines: int, dataset: Dataset, args: argparse.Namespace, engines: int,
                    monitor) -> dict:
    """One setting through the loader itself, pinned to DALI: build, a warm-up epoch, then the timed epochs.

    The loader is :class:`daliload.KineticsDALILoader` as a user builds it on the dataset's Kinetics layout,
    with ``DecodeSpec(routing="static", dali_threads=threads, dali_pipelines=pipelines, dali_feed=--feed,
    fallback_workers=--cut-workers)``: every clip to DALI (NVDEC is what is measured), fed what the loader
    feeds it (by default each window's packets, cut by the fallback's workers), its prefetch rule for that many
    pipelines, the merge into torch memory included. Clips and DALI's decoded frames are the loader's own
    counts (``stats()``), summed over the timed epochs.
    """
    import torch

    from benchmarks.datasets import kinetics_layout
    from daliload.loader import DecodeSpec, KineticsDALILoader

    task = TaskSpec(batch_size=args.batch_size, crop_size=args.crop_size, seed=args.seed)
    decode = DecodeSpec(routing="static", dali_threads=threads, dali_pipelines=pipelines, dali_feed=args.feed,
                        fallback_workers=args.cut_workers)
    gpu = args.device == "gpu"
    epochs = timed_epochs(pipelines, args.batch_size, args.min_clips, len(dataset.videos))
    started = time.perf_counter()
    loader = KineticsDALILoader(kinetics_layout(dataset), "train", batch_size=task.batch_size,
                                clip_len=task.clip_len, frame_stride=task.frame_stride, seed=task.seed,
                                augment=task.augment, output=task.output, device="gpu" if gpu else "cpu",
                                decode=decode, last_batch="partial")
    setup_s = time.perf_counter() - started

    def one_epoch(epoch: int) -> dict:
        """The epoch's clips and the loader's counts of it."""
        loader.set_epoch(epoch)
        clips = 0
        for _, labels in loader:
            clips += int(labels.shape[0])
        if gpu:
            torch.cuda.synchronize()
        stats = loader.stats()
        return {"clips": clips, "clips_dali": stats.clips_dali, "clips_dali_cut": stats.clips_dali_cut,
                "frames": stats.frames_decoded_dali, "dali_wait_s": stats.dali_wait_s,
                "failures": len(stats.failures)}

    try:
        warm = time.perf_counter()
        one_epoch(0)  # builds DALI's pipelines and the cutter's workers
        warmup_s = time.perf_counter() - warm
        monitor.begin_run()
        start = time.perf_counter()
        timed = [one_epoch(epoch) for epoch in range(1, epochs + 1)]
        wall = time.perf_counter() - start
        resources = monitor.end_run()
    finally:
        loader.close()
    totals = {key: sum(figures[key] for figures in timed) for key in timed[0]}
    return {"status": "ok", "threads": threads, "pipelines": pipelines, "feed": args.feed,
            "cut_workers": args.cut_workers, "prefetch": decode.batches_ahead(task.batch_size, pipelines=pipelines),
            "epochs": epochs, **totals, "wall_s": wall, "setup_s": setup_s, "warmup_s": warmup_s,
            "clips_per_s": totals["clips"] / wall, "frames_per_s": totals["frames"] / wall,
            **_resources(resources, engines)}


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
                           "feed": args.feed, "cut_workers": args.cut_workers,
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
    result["settings"]["scan_s"] = scan_once(dataset, args.device)
    engines, source = engines_here(args)
    result["settings"].update(engines=engines, engines_from=source)
    settings = [(t, p) for p in sorted(args.pipelines, reverse=True) for t in sorted(args.threads)]
    monitor = ResourceMonitor(gpu=args.device == "gpu")
    try:
        try:
            result["ceiling"] = measure_ceiling(dataset, args, engines, monitor)
        except Exception as err:  # noqa: BLE001 - a row that fails is recorded with its error; the sweep goes on
            result["ceiling"] = {"status": "failed", "reason": f"{type(err).__name__}: {err}"[:500]}
        _write(result, args)
        print(f"  ceiling: {_line(result['ceiling'])}", flush=True)
        for threads, pipelines in settings:
            clips = timed_epochs(pipelines, args.batch_size, args.min_clips, len(dataset.videos)) * \
                len(dataset.videos)
            elapsed = time.monotonic() - started
            if args.time_budget is not None and elapsed + _estimate_s(result["rows"], pipelines, clips) > \
                    args.time_budget:
                row = {"status": "skipped", "threads": threads, "pipelines": pipelines,
                       "reason": f"would end past the time budget of {args.time_budget:g} s"}
            else:
                try:
                    row = measure_setting(threads, pipelines, dataset, args, engines, monitor)
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


_FEEDS = {"window": "each window's packets", "file": "whole files"}


def _cutters(settings: dict) -> str:
    return f" (cut by {settings['cut_workers']} fallback processes)" if settings.get("feed") == "window" else ""


def markdown(result: dict) -> str:
    s = result["settings"]
    command = f"python -m benchmarks.bench_nvdec --dataset {s['dataset']}"
    lines = [f"### NVDEC sweep `{result['name']}` — {machine_line(result['machine'])}", "",
             f"`{command}`; {versions_line(result['machine'])}; load average {result['load_average'][0]} at the "
             f"start. {s['files']} clips ({s.get('description', s['dataset'])}, {s['duration_s']:g} s each); "
             f"batches of {s['batch_size']}, {s['crop_size']}x{s['crop_size']} float32 out. Each setting is the "
             f"loader pinned to DALI, fed {_FEEDS.get(s.get('feed', 'file'))}"
             f"{_cutters(s)}, timed over whole epochs after a warm-up epoch; decoded frames are the loader's count "
             f"(the ceiling's: every frame of whole files); engines busy = NVML decoder % x "
             f"{s.get('engines', '?')} engines / 100 "
             f"({s.get('engines_from', '')}).", ""]
    if result["status"] != "ok":
        return "\n".join(lines + [f"Not measured: {result['reason']}.", ""])
    ceiling = result["ceiling"] or {"status": "not run", "reason": None}
    ceiling_fps = ceiling.get("frames_per_s") if ceiling["status"] == "ok" else None
    lines += ["| DALI threads | pipelines | clips/s | decoded frames/s | frames a clip | clips fed a cut "
              "| x ceiling (frames) | NVDEC % | engines busy | SM % | peak device MiB | DALI wait s | status |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def row_line(threads, pipelines, row):
        if row["status"] != "ok":
            return f"| {threads} | {pipelines} | | | | | | | | | | | {row['status']}: {row.get('reason')} |"
        ratio = _fmt(row["frames_per_s"] / ceiling_fps, 2) if ceiling_fps else "–"
        clips = row.get("clips") or row.get("files") or 0
        cut = f"{row['clips_dali_cut']} of {clips}" if "clips_dali_cut" in row else "–"
        per_clip = _fmt(row["frames"] / clips if clips else None)
        return (f"| {threads} | {pipelines} | {row['clips_per_s']:.1f} | {row['frames_per_s']:.0f} | {per_clip} | "
                f"{cut} | "
                f"{ratio} | {_fmt(row['nvdec_util_pct'])} | {_fmt(row['engines_busy'], 1)} | "
                f"{_fmt(row['sm_util_pct'])} | {_fmt(row['gpu_mem_peak_mb'])} | {_fmt(row.get('dali_wait_s'), 1)} | "
                f"ok |")

    lines.append(row_line(ceiling.get("threads", "–"), f"{ceiling.get('pipelines', '–')} (ceiling: whole files)",
                          ceiling))
    for row in result["rows"]:
        lines.append(row_line(row["threads"], row["pipelines"], row))
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
