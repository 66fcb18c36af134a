"""What ``daliload transcode`` costs and what it buys: files/s per core, and the loader on DST against SRC.

``python -m benchmarks.bench_transcode`` (options: ``--help``):

1. generates a raw-download-like dataset: H.264 with a keyframe every 250
   frames (as Kinetics downloads arrive) and VP9, at ``--size``, with some
   4:4:4 and 10-bit files (which NVDEC cannot decode);
2. transcodes it with ``daliload transcode``'s defaults (short side 256,
   GOP 16, libx264 veryfast) with 1 and with ``--workers`` workers, from
   scratch each time, after a warm-up that starts the worker processes:
   files/s, files/s per core, MB/s read, and the CPU seconds per file of the
   whole process tree;
3. runs :class:`~daliload.KineticsDALILoader` on SRC and on DST in this same
   run, with the same settings and seed, alternating SRC and DST epochs:
   clips/s (median of ``--epochs`` epochs after one warm-up, ± half the range);
4. scans DST and SRC for the default GPU and reports the routes.

Writes ``--json`` (default ``benchmarks/results/transcode.json``) and its
section of ``benchmarks/RESULTS.md``, both from this one run.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time
from pathlib import Path

from benchmarks.metrics import ResourceMonitor
from benchmarks.report import add_output_options, append_markdown, load_average, publish, write_marked
from benchmarks.machine import machine_info, machine_line, versions_line
from daliload.loader import DecodeSpec, KineticsDALILoader
from daliload.prescreen import Manifest, scan
from daliload.synth.dataset import SynthSpec, generate_dataset
from daliload.transcode import Shard, TranscodeOptions, transcode_dataset
from daliload.runtime import usable_cores

HERE = Path(__file__).resolve().parent
SECTION = "## Transcode: `python -m benchmarks.bench_transcode`"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_transcode", description=__doc__.split("\n")[0])
    parser.add_argument("--classes", type=int, default=4, help="classes of the generated dataset (default 4)")
    parser.add_argument("--clips-per-class", type=int, default=5, help="clips per class (default 5)")
    parser.add_argument("--size", default="480x360", help="source frame size WxH (default 480x360)")
    parser.add_argument("--duration-s", type=float, default=5.0, help="clip length (default 5 s)")
    parser.add_argument("--workers", type=int, default=usable_cores(), help="transcode and fallback workers")
    parser.add_argument("--epochs", type=int, default=3, help="timed loader epochs per dataset (default 3)")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--device", default="cpu", help="loader device: cpu (default) or cuda")
    parser.add_argument("--data-dir", default="bench_out/transcode", help="where the datasets are written")
    add_output_options(parser, "transcode", no_md_help="do not touch RESULTS.md or README.md")
    parser.add_argument("--readme", default=str(HERE.parent / "docs" / "transcode.md"),
                        help="the page whose transcode figures (between its markers) this run rewrites "
                             "(default docs/transcode.md)")
    return parser.parse_args(argv)


def make_source(args: argparse.Namespace) -> Path:
    width, height = (int(v) for v in args.size.lower().split("x"))
    root = Path(args.data_dir) / f"src-{args.classes}x{args.clips_per_class}-{args.size}-{args.duration_s:g}s"
    if not (root / "done").exists():
        shutil.rmtree(root, ignore_errors=True)
        spec = SynthSpec(num_classes=args.classes, clips_per_class=args.clips_per_class, val_fraction=0.0,
                         width=width, height=height, duration_s=args.duration_s,
                         codec_mix={"h264": 0.7, "vp9": 0.3}, broken_fraction=0.1,
                         broken_kinds=("yuv444", "ten_bit"), seed=5)
        generate_dataset(root, spec, workers=2, progress=False)
        (root / "done").touch()
    return root


def measure_transcode(src: Path, dst: Path, workers: int, monitor: ResourceMonitor) -> dict:
    shutil.rmtree(dst, ignore_errors=True)
    monitor.begin_run()
    started = time.perf_counter()
    summary = transcode_dataset(src, dst, TranscodeOptions(), workers=workers, progress=False)
    wall = time.perf_counter() - started
    used = monitor.end_run()
    done = summary.written + len(summary.bad)
    return {"workers": workers, "wall_s": wall, "files": done, "written": summary.written,
            "bad": len(summary.bad), "failed": len(summary.failed), "files_per_s": done / wall,
            "files_per_s_per_core": done / wall / workers, "mb_in_per_s": summary.bytes_in / 1e6 / wall,
            "bytes_in": summary.bytes_in, "bytes_out": summary.bytes_out,
            "cpu_s_per_file": used.cpu_s / max(1, done), "peak_rss_mb": used.peak_rss_mb}


def new_loader(root: Path, args: argparse.Namespace) -> KineticsDALILoader:
    return KineticsDALILoader(root, "train", batch_size=args.batch_size, clip_len=16, frame_stride=4,
                              crop_size=112, device=args.device,
                              decode=DecodeSpec(fallback_workers=args.workers, max_failure_fraction=1.0))


def run_epoch(loader: KineticsDALILoader, epoch: int) -> dict:
    loader.set_epoch(epoch)
    started = time.perf_counter()
    clips = sum(int((labels >= 0).sum()) for _, labels in loader)
    wall = time.perf_counter() - started
    stats = loader.stats()
    return {"wall_s": wall, "clips": clips, "clips_per_s": clips / wall, "clips_dali": stats.clips_dali,
            "clips_fallback": stats.clips_fallback}


def _spread(values: list[float]) -> dict:
    median = statistics.median(values)
    return {"median": median, "spread_pct": 100 * (max(values) - min(values)) / 2 / median if median else 0.0,
            "runs": values}


def measure_loaders(src: Path, dst: Path, args: argparse.Namespace) -> dict:
    loaders = {"src": new_loader(src, args), "dst": new_loader(dst, args)}
    runs: dict[str, list[dict]] = {name: [] for name in loaders}
    try:
        for epoch in range(args.epochs + 1):  # epoch 0 warms up; SRC and DST take turns
            for name, loader in loaders.items():
                record = run_epoch(loader, epoch)
                if epoch:
                    runs[name].append(record)
    finally:
        for loader in loaders.values():
            loader.close()
    return {name: {"clips_per_s": _spread([r["clips_per_s"] for r in rs]), "clips": rs[0]["clips"],
                   "clips_dali": rs[-1]["clips_dali"], "clips_fallback": rs[-1]["clips_fallback"]}
            for name, rs in runs.items()}


def routes(root: Path, workdir: Path) -> dict:
    manifest_path = workdir / f"{root.name}.manifest.sqlite"
    manifest_path.unlink(missing_ok=True)
    scan(root, device="gpu", splits=("train",), progress=False, manifest_path=manifest_path)
    with Manifest(manifest_path) as manifest:
        found: dict[str, int] = {}
        for entry in manifest.entries(device="gpu"):
            found[entry.route] = found.get(entry.route, 0) + 1
    return found


def markdown(r: dict) -> str:
    one, many = r["transcode"][0], r["transcode"][-1]
    src, dst = r["loader"]["src"], r["loader"]["dst"]
    gain = dst["clips_per_s"]["median"] / src["clips_per_s"]["median"]
    lines = [
        f"### Transcode run `transcode` — {machine_line(r['machine'])}",
        "",
        f"`python -m benchmarks.bench_transcode`; {versions_line(r['machine'])}; load average "
        f"{r['load_average_start']} at the start, {r['load_average_end']} at the end; the run took "
        f"{r['wall_s']:.0f} s. SRC: {r['settings']['dataset']}. DST: `daliload transcode` defaults "
        f"({r['settings']['options']}).",
        "",
        "| transcode | workers | files | wall s | files/s | files/s per core | MB/s read | CPU s/file | "
        "MB in | MB out |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for t in r["transcode"]:
        lines.append(f"| SRC -> DST | {t['workers']} | {t['files']} | {t['wall_s']:.1f} | {t['files_per_s']:.2f} | "
                     f"{t['files_per_s_per_core']:.2f} | {t['mb_in_per_s']:.2f} | {t['cpu_s_per_file']:.2f} | "
                     f"{t['bytes_in'] / 1e6:.1f} | {t['bytes_out'] / 1e6:.1f} |")
    lines += [
        "",
        f"Loader on the {r['settings']['device'].upper()}, same settings and seed on both (clip 16 frames at stride "
        f"4, crop 112, batch {r['settings']['batch_size']}, {r['settings']['workers']} fallback workers), "
        f"median of {r['settings']['epochs']} epochs after a warm-up, SRC and DST epochs alternating:",
        "",
        "| dataset | clips/epoch | clips/s | DALI clips | fallback clips | routes on the default GPU (hopper) |",
        "|---|---|---|---|---|---|",
    ]
    for name, label in (("src", "SRC (raw)"), ("dst", "DST (transcoded)")):
        x = r["loader"][name]
        route_text = ", ".join(f"{k} {v}" for k, v in sorted(r["routes"][name].items()))
        lines.append(f"| {label} | {x['clips']} | {x['clips_per_s']['median']:.1f} "
                     f"±{x['clips_per_s']['spread_pct']:.0f}% | {x['clips_dali']} | {x['clips_fallback']} | "
                     f"{route_text} |")
    lines += ["", f"DST over SRC: **{gain:.2f}x** clips/s. Transcoding cost "
                  f"{one['cpu_s_per_file']:.2f} CPU s per {r['settings']['duration_s']:g}-second file "
                  f"({many['files_per_s']:.2f} files/s on {many['workers']} workers)."]
    return "\n".join(lines) + "\n"


def readme_figures(r: dict) -> str:
    """README's "Transcode" figures, between its ``transcode`` markers (:func:`benchmarks.report.write_marked`)."""
    one, many = r["transcode"][0], r["transcode"][-1]
    src, dst = r["loader"]["src"], r["loader"]["dst"]
    gain = dst["clips_per_s"]["median"] / src["clips_per_s"]["median"]
    fallback_routes = {name: r["routes"][name].get("fallback", 0) for name in ("src", "dst")}
    files = one["files"]
    return (
        f"Written by `python -m benchmarks.bench_transcode` from its run's JSON "
        f"(`benchmarks/results/transcode.json`; {r['machine']['date_utc']}, "
        f"{r['machine'].get('label') or r['machine']['cpu_model']}, load average {r['load_average_start']} at the "
        f"start; full table in `benchmarks/RESULTS.md`): {r['settings']['dataset']} "
        f"transcode at **{one['files_per_s_per_core']:.2f} files/s per core** ({one['cpu_s_per_file']:.2f} CPU s "
        f"per file; {many['files_per_s']:.2f} files/s on {many['workers']} workers). In the same run the loader on "
        f"the {r['settings']['device'].upper()} (16-frame clips at stride 4, same settings and seed) delivers "
        f"**{dst['clips_per_s']['median']:.1f} clips/s on DST against {src['clips_per_s']['median']:.1f} on SRC "
        f"({gain:.2f}x)**. On a Hopper GPU the scan sends {fallback_routes['src']} of SRC's {files} files to the "
        f"fallback and {fallback_routes['dst']} of DST's.\n")


def write_section(path: Path, text: str) -> None:
    """Our section under its own level-2 heading (added once), replaced by each run (report.append_markdown)."""
    if path.exists() and SECTION not in path.read_text(encoding="utf-8"):
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"\n{SECTION}\n\nThe newest run of `python -m benchmarks.bench_transcode`; the section below "
                    f"is replaced by each run.\n")
    append_markdown(path, text)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    load_start = load_average()
    src = make_source(args)
    work = Path(args.data_dir)
    dst = work / "dst"
    # Warm-up: start the worker processes' forkserver (it imports torch once) on a share of about one file.
    transcode_dataset(src, work / "warmup", TranscodeOptions(), shard=Shard(0, args.classes * args.clips_per_class),
                      workers=1, progress=False)
    monitor = ResourceMonitor()
    try:
        sweep = sorted({1, args.workers})
        transcode = [measure_transcode(src, dst, w, monitor) for w in sweep]
    finally:
        monitor.close()
    result = {"name": "transcode", "machine": machine_info(args.machine), "load_average_start": load_start,
              "settings": {"dataset": f"{args.classes * args.clips_per_class} files, {args.size}, "
                                      f"{args.duration_s:g} s at 30 fps, 70 % H.264 (keyframe every 250 frames) "
                                      f"and 30 % VP9, 10 % of them 4:4:4 or 10-bit H.264",
                           "options": TranscodeOptions().describe(), "workers": args.workers,
                           "epochs": args.epochs, "batch_size": args.batch_size, "device": args.device,
                           "duration_s": args.duration_s},
              "transcode": transcode,
              "loader": measure_loaders(src, dst, args),
              "routes": {"src": routes(src, work), "dst": routes(dst, work)}}
    result["load_average_end"] = load_average()
    result["wall_s"] = time.perf_counter() - started
    publish(result, args.json, markdown(result), None if args.no_md else args.results_md, write_md=write_section)
    if not args.no_md:
        write_marked(args.readme, "transcode", readme_figures(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
