"""The whole loader under faults: memory over many epochs, and what finding a bad file costs.

``python -m benchmarks.bench_faults`` (options: ``--help``) runs, on a generated
Kinetics-like dataset (VP9, which DALI decodes on the CPU, and H.264, which the
fallback decodes):

1. **Memory**: :class:`~daliload.KineticsDALILoader` as users run it, for
   ``--epochs`` epochs (default 20); the peak RSS of the whole process tree
   (trainer, fallback workers, forkserver) per epoch. It must stay flat: the
   table gives the growth from the first epochs to the last ones.
2. **Culprit search**: a DALI-route file overwritten after the scan. One clean
   epoch, then the same epoch again meeting the bad file, and once more (the
   file now goes to the fallback). DALI 2.4 reports such a file as "Failed to
   create video decoder for "memory file"", naming no sample, so the loader
   bisects the batch; a second variant makes the error name the file, as DALI
   does for some errors ("sample #i"). ``stats().isolation_s`` is the time
   spent isolating; the rest of the extra time is decoding the file again in a
   supervised worker, failing, and decoding its replacement.

Writes ``--json`` (default ``benchmarks/results/faults.json``) and its section of
``benchmarks/RESULTS.md``, both from this one run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
from pathlib import Path

from benchmarks.metrics import ResourceMonitor
from benchmarks.report import add_output_options, load_average, publish
from benchmarks.machine import machine_info, machine_line, versions_line
from daliload.loader import DecodeSpec, KineticsDALILoader
from daliload.dali import DaliBatchError
from daliload.synth.dataset import SynthSpec, generate_dataset



def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_faults", description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=20, help="epochs of the memory run (default 20)")
    parser.add_argument("--classes", type=int, default=6, help="classes of the generated dataset (default 6)")
    parser.add_argument("--clips-per-class", type=int, default=6, help="clips per class (default 6)")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2, help="fallback workers (default 2)")
    parser.add_argument("--data-dir", default="bench_out/faults", help="where the dataset is generated")
    add_output_options(parser, "faults")
    return parser.parse_args(argv)


def make_dataset(args: argparse.Namespace) -> Path:
    root = Path(args.data_dir) / f"data-{args.classes}x{args.clips_per_class}"
    if not (root / "done").exists():
        shutil.rmtree(root, ignore_errors=True)
        spec = SynthSpec(num_classes=args.classes, clips_per_class=args.clips_per_class, val_fraction=0.0,
                         width=160, height=120, duration_s=3.0, codec_mix={"h264": 0.5, "vp9": 0.5},
                         broken_fraction=0.0, seed=3)
        generate_dataset(root, spec, workers=2, progress=False)
        (root / "done").touch()
    return root


def new_loader(source, args: argparse.Namespace) -> KineticsDALILoader:
    return KineticsDALILoader(source, "train", batch_size=args.batch_size, clip_len=8, frame_stride=4,
                              crop_size=112, device="cpu",
                              decode=DecodeSpec(fallback_workers=args.workers, max_failure_fraction=1.0,
                                                # DALI meets its culprits: each DALI-route file to DALI
                                                routing="static"))


def run_epoch(loader: KineticsDALILoader, monitor: ResourceMonitor, epoch: int) -> dict:
    loader.set_epoch(epoch)
    monitor.begin_run()
    started = time.perf_counter()
    clips = sum(len(labels) for _, labels in loader)
    wall = time.perf_counter() - started
    used = monitor.end_run()
    stats = loader.stats()
    return {"epoch": epoch, "wall_s": wall, "clips": clips, "clips_per_s": clips / wall,
            "peak_rss_mb": used.peak_rss_mb, "isolation_s": stats.isolation_s,
            "clips_dali": stats.clips_dali, "clips_redecoded": stats.clips_redecoded,
            "failures": len(stats.failures), "rerouted": list(stats.rerouted)}


def memory_run(root: Path, args: argparse.Namespace, monitor: ResourceMonitor) -> dict:
    loader = new_loader(root, args)
    epochs = [run_epoch(loader, monitor, e) for e in range(args.epochs)]
    loader.close()
    k = max(1, min(5, args.epochs // 4))
    first = statistics.median(e["peak_rss_mb"] for e in epochs[:k])
    last = statistics.median(e["peak_rss_mb"] for e in epochs[-k:])
    return {"epochs": epochs, "window": k, "first_peak_rss_mb": first, "last_peak_rss_mb": last,
            "growth_mb": last - first, "clips_per_epoch": epochs[0]["clips"]}


def _name_culprit(loader: KineticsDALILoader, victim: str) -> None:
    """Make DALI's errors name the bad file (DALI 2.4's "memory file" errors name none): no bisection needed."""
    decoder = loader.sources.dali().decoder
    real = decoder.result

    def named(*a, **kw):
        try:
            return real(*a, **kw)
        except DaliBatchError as err:
            culprit = next((s for s in err.samples if s.path == victim), None)
            raise DaliBatchError(err.samples, err.reason, culprit=culprit) from err

    decoder.result = named


def culprit_run(root: Path, args: argparse.Namespace, monitor: ResourceMonitor) -> dict:
    results = {}
    for variant in ("dali", "named"):
        copy = Path(args.data_dir) / f"culprit-{variant}"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(root, copy, ignore=shutil.ignore_patterns(".daliload"))
        loader = new_loader(copy, args)
        victim = sorted(v.path for v in loader.videos if v.route == "dali")[0]
        if variant == "named":
            _name_culprit(loader, victim)
        clean = run_epoch(loader, monitor, 0)
        Path(victim).write_bytes(b"\x1aE\xdf\xa3 broken after the scan " * 300)
        broken = run_epoch(loader, monitor, 0)  # the same plan as the clean epoch
        after = run_epoch(loader, monitor, 0)
        results[variant] = {"victim": os.path.basename(victim), "clean": clean, "broken": broken, "after": after}
        loader.close()
    return results


def markdown(result: dict) -> str:
    mem, cul = result["memory"], result["culprit"]
    lines = [
        f"### Faults run `faults` — {machine_line(result['machine'])}",
        "",
        f"`python -m benchmarks.bench_faults`; {versions_line(result['machine'])}; "
        f"load average {result['load_average']}. Whole loader on the CPU (DALI decodes VP9, the fallback "
        f"H.264), {mem['clips_per_epoch']} clips per epoch, batch {result['settings']['batch_size']}, "
        f"{result['settings']['workers']} fallback workers.",
        "",
        f"Memory over {len(mem['epochs'])} epochs (peak RSS of the process tree): median of the first "
        f"{mem['window']} epochs {mem['first_peak_rss_mb']:.0f} MiB, of the last {mem['window']} "
        f"{mem['last_peak_rss_mb']:.0f} MiB, growth {mem['growth_mb']:+.0f} MiB; per epoch: "
        + ", ".join(f"{e['peak_rss_mb']:.0f}" for e in mem["epochs"]) + " MiB.",
        "",
        "A DALI-route file overwritten after the scan (same plan in every epoch):",
        "",
        "| DALI's error | clean epoch, s | epoch meeting the file, s | isolating it, s | next epoch, s | "
        "rerouted | clips DALI kept |",
        "|---|---|---|---|---|---|---|",
    ]
    for variant, label in (("dali", "DALI 2.4's own (names no file: the loader bisects the batch)"),
                           ("named", "one that names the file (simulated)")):
        r = cul[variant]
        lines.append(f"| {label} | {r['clean']['wall_s']:.2f} | {r['broken']['wall_s']:.2f} | "
                     f"{r['broken']['isolation_s']:.2f} | {r['after']['wall_s']:.2f} | "
                     f"{len(r['broken']['rerouted'])} | {r['broken']['clips_dali']} of {r['clean']['clips_dali']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    root = make_dataset(args)
    monitor = ResourceMonitor()
    try:
        result = {"name": "faults", "machine": machine_info(args.machine),
                  "load_average": load_average(),
                  "settings": {"epochs": args.epochs, "batch_size": args.batch_size, "workers": args.workers,
                               "dataset": f"{args.classes} classes x {args.clips_per_class} clips, 160x120, 3 s"},
                  "memory": memory_run(root, args, monitor),
                  "culprit": culprit_run(root, args, monitor)}
    finally:
        monitor.close()
    publish(result, args.json, markdown(result), None if args.no_md else args.results_md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
