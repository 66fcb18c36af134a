"""Both decoders at once: the default routing against each decoder alone, one plan, interleaved.

``python -m benchmarks.bench_routing`` (options: ``--help``) runs
:class:`~daliload.KineticsDALILoader` as users run it, on the CPU (DALI's CPU
decoder takes VP9; H.264 is the fallback's only), with the same plan (seed,
epoch, windows, crops and flips) every way:

- ``one each``: one DALI thread and one fallback worker (each path alone
  fills one of the 2 cores: a stand-in for a GPU node, where NVDEC and the
  CPU cores do not compete), three ways: ``auto`` (``DecodeSpec``'s default
  routing, adaptive here: the decoders have a core each), ``static`` (every
  DALI-route clip to DALI: the fallback's worker idles) and ``fallback``
  (``decoder="fallback"``, its one worker). Target: ``auto`` at least
  :data:`TARGET` x ``fallback`` on ``vp9`` (a keyframe every 250 frames).
- ``defaults``: the loader's default threads and workers (``DecodeSpec()``),
  the same three ways (``auto`` resolves to ``measured`` where DALI's CPU
  threads and the workers outnumber the cores: each codec to the decoder the
  run measures faster; the untimed epoch is where it first measures).
  Target: ``auto`` at least :data:`DEFAULTS_TARGET` x the faster of ``static`` and ``fallback``, on
  every dataset.

One untimed epoch per way (workers start, the scan), then ``--rounds`` rounds
in which every way runs one epoch, in turn. Per way: clips/s, median and
range, and the share of clips the fallback decoded (``stats()``). Ratios are
per round; a target is met or missed only when every round is on one side of
it. Writes ``--json`` (default ``benchmarks/results/routing.json``), its
section of ``benchmarks/RESULTS.md`` and, with ``--readme docs/performance.md``,
that page's ``routing`` section, all from this one run.
"""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks.datasets import kinetics_layout, prepare_standard
from benchmarks.machine import machine_info
from benchmarks.options import int_at_least
from benchmarks.report import add_output_options, load_average, publish_run, run_heading
from benchmarks.metrics import verdict
from daliload.loader import DecodeSpec, KineticsDALILoader

CHAPTER = "## Both decoders at once: `python -m benchmarks.bench_routing`"
WAYS = ("auto", "static", "fallback")
SETUPS = ("one each", "defaults")
#: The issue's target: one DALI thread and one fallback worker, the default routing over the fallback alone, VP9.
TARGET = 1.6
TARGET_DATASET = "vp9"
#: With the default threads and workers: never below this times the faster decoder alone.
DEFAULTS_TARGET = 0.95


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_routing", description=__doc__.split("\n")[0])
    parser.add_argument("--datasets", default="vp9,h264-gop250", help="comma-separated (default vp9,h264-gop250)")
    parser.add_argument("--clips", type=int_at_least(1), default=48, help="videos per dataset (default 48)")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per video (default 10)")
    parser.add_argument("--size", default=None, help="WIDTHxHEIGHT replacing 340x256 (tests use tiny frames)")
    parser.add_argument("--batch-size", type=int_at_least(1), default=8, help="clips per batch (default 8)")
    parser.add_argument("--rounds", type=int_at_least(1), default=3, help="timed epochs of each way (default 3)")
    parser.add_argument("--setups", default=",".join(SETUPS), help="comma-separated of: one each, defaults")
    parser.add_argument("--data-dir", default="bench_out/datasets", help="where the datasets are generated (cached)")
    parser.add_argument("--readme", default=None, help="a page whose 'routing' markers this run's figures replace "
                                                        "(the published run's go in docs/performance.md)")
    add_output_options(parser, "routing")
    return parser.parse_args(argv)


def decode_spec(setup: str, way: str) -> DecodeSpec:
    sizes = {"dali_threads": 1, "fallback_workers": 1} if setup == "one each" else {}
    if way == "fallback":
        return DecodeSpec(decoder="fallback", fallback_workers=sizes.get("fallback_workers", 2))
    return DecodeSpec(routing=way, **sizes)  # "auto": the default


def build(root, setup: str, way: str, args: argparse.Namespace) -> KineticsDALILoader:
    return KineticsDALILoader(root, "train", batch_size=args.batch_size, clip_len=16, frame_stride=4, crop_size=224,
                              device="cpu", last_batch="partial", decode=decode_spec(setup, way))


def one_epoch(loader: KineticsDALILoader, epoch: int) -> dict:
    loader.set_epoch(epoch)
    started = time.perf_counter()
    clips = sum(int(labels.shape[0]) for _, labels in loader)
    elapsed = time.perf_counter() - started
    stats = loader.stats()
    if stats.failures:
        raise RuntimeError(f"{len(stats.failures)} video(s) failed: {stats.failures[0].describe()}")
    return {"clips": clips, "clips_per_s": clips / elapsed, "dali_clips": stats.clips_dali,
            "fallback_clips": stats.clips_fallback, "moved_clips": stats.clips_moved, "routing": stats.routing}


def _spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def measure(root, setups: list[str], args: argparse.Namespace) -> dict:
    """Every (setup, way): an untimed epoch, then one timed epoch per round, all in turn, on epoch 1's plan."""
    loaders = {(setup, way): build(root, setup, way, args) for setup in setups for way in WAYS}
    try:
        plans = {key: [(s.path, s.start_frame, s.crop, s.flip) for b in loader.plan(1) for s in b]
                 for key, loader in loaders.items()}
        if len({tuple(p) for p in plans.values()}) != 1:
            raise RuntimeError("the ways planned different clips")
        for loader in loaders.values():
            one_epoch(loader, 1)  # untimed: workers start
        runs = {key: [] for key in loaders}
        for _ in range(args.rounds):
            for key, loader in loaders.items():
                runs[key].append(one_epoch(loader, 1))
    finally:
        for loader in loaders.values():
            loader.close()
    out: dict = {}
    for setup in setups:
        row: dict = {}
        for way in WAYS:
            rows = runs[(setup, way)]
            rates = [r["clips_per_s"] for r in rows]
            row[way] = {**_spread(rates), "clips_per_s": statistics.median(rates), "runs": rates,
                        "fallback_share": statistics.median(r["fallback_clips"] / r["clips"] for r in rows),
                        "moved_clips": rows[-1]["moved_clips"], "clips": rows[-1]["clips"],
                        "routing": rows[-1]["routing"]}
        auto = row["auto"]["runs"]
        row["auto_over_fallback"] = _spread([a / f for a, f in zip(auto, row["fallback"]["runs"])])
        row["auto_over_static"] = _spread([a / s for a, s in zip(auto, row["static"]["runs"])])
        row["auto_over_faster"] = _spread([a / max(s, f) for a, s, f in
                                           zip(auto, row["static"]["runs"], row["fallback"]["runs"])])
        out[setup] = row
    return out


def _ratio(r: dict) -> str:
    return f"{r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f})"


def _rate(r: dict) -> str:
    return f"{r['clips_per_s']:.1f} ({r['min']:.1f}-{r['max']:.1f})"


def targets(result: dict) -> list[str]:
    """The targets as sentences, each met, missed or not settled."""
    lines = []
    target = result["datasets"].get(TARGET_DATASET, {}).get("one each")
    if target:
        ratio = target["auto_over_fallback"]
        lines.append(f"Target: one DALI thread and one fallback worker, the default routing "
                     f"({target['auto']['routing']} here) at least {TARGET:g}x the fallback alone on "
                     f"`{TARGET_DATASET}`: {_ratio(ratio)}, {verdict(ratio, TARGET)}.")
    for name, row in result["datasets"].items():
        if "defaults" in row:
            ratio = row["defaults"]["auto_over_faster"]
            lines.append(f"Target: with the defaults ({row['defaults']['auto']['routing']} routing here), at least "
                         f"{DEFAULTS_TARGET:g}x the faster decoder alone on `{name}`: {_ratio(ratio)}, "
                         f"{verdict(ratio, DEFAULTS_TARGET)}.")
    return lines


def markdown(result: dict) -> str:
    s = result["settings"]
    lines = [
        *run_heading(
            "routing", "routing", "python -m benchmarks.bench_routing", result,
            f"KineticsDALILoader on the CPU (DALI's CPU decoder takes VP9; H.264 only the fallback), {s['clips']} "
            f"videos of {s['duration_s']:g} s per dataset, batch {s['batch_size']}, 16 frames at stride 4, 224 crop; "
            f"the same plan every way; one untimed epoch each, then {s['rounds']} rounds of one epoch per way, in "
            "turn. clips/s: median (min-max); ratios per round; auto: the default routing, and what it resolved "
            "to; fallback share: clips the fallback decoded."),
        "",
        "| dataset | threads / workers | auto (default) | static: DALI alone | fallback alone | auto: routing, "
        "fallback share | auto / fallback | auto / static | auto / faster alone |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, rows in result["datasets"].items():
        for setup, row in rows.items():
            cells = " | ".join(_rate(row[w]) for w in WAYS)
            lines.append(f"| `{name}` | {setup} | {cells} | {row['auto']['routing']}, "
                         f"{row['auto']['fallback_share']:.0%} | {_ratio(row['auto_over_fallback'])} | "
                         f"{_ratio(row['auto_over_static'])} | {_ratio(row['auto_over_faster'])} |")
    return "\n".join(lines + [""] + targets(result)) + "\n"


def readme_figures(result: dict) -> str:
    m = result["machine"]
    parts = []
    for name, rows in result["datasets"].items():
        for setup, row in rows.items():
            parts.append(f"`{name}`, {setup}: the default routing ({row['auto']['routing']}) "
                         f"{row['auto']['clips_per_s']:.1f} clips/s (the fallback took "
                         f"{row['auto']['fallback_share']:.0%}), DALI alone {row['static']['clips_per_s']:.1f}, the "
                         f"fallback alone {row['fallback']['clips_per_s']:.1f} (default / faster alone "
                         f"{_ratio(row['auto_over_faster'])})")
    return (f"Written by `python -m benchmarks.bench_routing` from its run's JSON (`benchmarks/results/routing.json`;"
            f" {m['date_utc']}, {m['cpu_cores_usable']} cores, DALI's CPU decoder): " + "; ".join(parts) + ". "
            + " ".join(targets(result)) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = [n for n in args.datasets.split(",") if n]
    setups = [s.strip() for s in args.setups.split(",") if s.strip()]
    unknown = [s for s in setups if s not in SETUPS]
    if unknown:
        raise SystemExit(f"bench_routing: unknown setup(s) {unknown}; choose from {', '.join(SETUPS)}")
    started = load_average()
    datasets = {}
    for dataset in prepare_standard(args.datasets, clips=args.clips, duration_s=args.duration, size=args.size,
                                    data_dir=args.data_dir):
        datasets[dataset.spec.name] = measure(kinetics_layout(dataset), setups, args)
    result = {"name": "routing", "machine": machine_info(args.machine), "load_average": [started, load_average()],
              "settings": {"datasets": names, "clips": args.clips, "duration_s": args.duration,
                           "batch_size": args.batch_size, "rounds": args.rounds, "setups": setups},
              "datasets": datasets}
    text = markdown(result)
    publish_run(result, args, text, chapter=CHAPTER, marker="routing", figures=readme_figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
