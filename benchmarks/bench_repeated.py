"""Repeated sampling: daliload against the recipes' own way, at ``clips_per_video`` k = 1, 2 and 4, interleaved.

``python -m benchmarks.bench_repeated`` (options: ``--help``; ``make bench``
runs it after the main table) runs :class:`~daliload.KineticsDALILoader` as
users run it, on the CPU, on the benchmark's ``h264-gop250`` dataset (every
clip on the PyAV fallback; a keyframe every 250 frames, as Kinetics
downloads) and on ``vp9`` (every clip on DALI's CPU decoder). Every k reads
the SAME ``--videos`` videos (a Kinetics folder layout of links to the first
``--videos`` of the dataset), so an epoch at k has ``videos * k`` clips. The
fallback decodes a video's clips in one pass over the file; DALI reads the
file once for them but decodes each clip by itself.

Beside it, on the same plan (the loader's own plan of the timed epoch, so the
same windows, crops and flips), the peers the recipes use, each decoding the
union of a video's k windows in one call as VideoMAE's loader does with
decord's ``get_batch`` (:mod:`benchmarks.peers.union`: decord,
torchcodec ``get_frames_at``, SPDL), with the fallback's own transform, in a
spawn DataLoader with ``--workers`` workers: as many processes as the
loader's fallback workers (and DALI threads).

Every loader is built once and runs one untimed epoch per k (workers start,
the scan); then ``--rounds`` rounds, in each of which every k runs one epoch
of every loader, the loaders' order rotated by one each round, so a machine
whose speed drifts moves all of them alike. Per loader and k: clips/s, median
and range over the rounds; on the fallback, the frames its decoders produced
per clip (``stats().frames_decoded_fallback``). Per k: daliload over the best
peer (the peer with the highest median), one ratio per round, median and
range; the targets (:data:`PEER_TARGETS`, at k = 2) are met or missed only
when every round's ratio is on one side of the target, otherwise "not
settled". Writes ``--json`` (default ``benchmarks/results/repeated.json``)
and its section of ``benchmarks/RESULTS.md``, both from this one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from benchmarks.datasets import layout_relpath, prepare_standard
from benchmarks.interleave import rotated
from benchmarks.machine import machine_info
from benchmarks.options import int_at_least
from benchmarks.report import add_output_options, load_average, publish_run, run_heading, write_readme_figures
from benchmarks.metrics import verdict
from daliload.loader import DecodeSpec, KineticsDALILoader

CHAPTER = "## Repeated sampling: `python -m benchmarks.bench_repeated`"
KS = (1, 2, 4)
#: The issue's targets on the fallback (H.264, keyframe every 250): clips/s over k = 1's.
TARGETS = {2: 1.6, 4: 2.5}
#: The issue's targets against the recipes' way: daliload over the best peer at k = :data:`PEER_TARGET_K`.
PEER_TARGETS = {"h264-gop250": 1.3, "vp9": 1.2}
PEER_TARGET_K = 2
DALILOAD = "daliload"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from benchmarks.peers.union import UNION_PEERS

    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_repeated", description=__doc__.split("\n")[0])
    parser.add_argument("--datasets", default="h264-gop250,vp9", help="comma-separated (default h264-gop250,vp9)")
    parser.add_argument("--videos", type=int_at_least(1), default=48,
                        help="videos every k reads (default 48): an epoch at k has videos * k clips")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per video (default 10)")
    parser.add_argument("--size", default=None, help="WIDTHxHEIGHT replacing 340x256 (tests use tiny frames)")
    parser.add_argument("--batch-size", type=int, default=8, help="clips per batch, a multiple of 4 (default 8)")
    parser.add_argument("--workers", type=int_at_least(1), default=2,
                        help="fallback workers, DALI threads and every peer's DataLoader workers (default 2)")
    parser.add_argument("--rounds", type=int_at_least(1), default=3,
                        help="timed epochs of every loader at every k, interleaved (default 3)")
    parser.add_argument("--peers", default=",".join(UNION_PEERS),
                        help=f"comma-separated, from {', '.join(UNION_PEERS)} (default: all; '' for none)")
    parser.add_argument("--data-dir", default="bench_out/datasets", help="where the datasets are generated (cached)")
    parser.add_argument("--readme", default=None,
                        help="a page whose 'repeated' markers this run's figures replace (the published run's go in "
                             "docs/using.md)")
    parser.add_argument("--report-from", default=None, metavar="JSON",
                        help="write the sections from a stored run's JSON instead of measuring")
    add_output_options(parser, "repeated")
    args = parser.parse_args(argv)
    if args.batch_size < 1 or args.batch_size % max(KS):
        parser.error(f"--batch-size must be a multiple of {max(KS)} (a video's clips share a batch)")
    args.peers = [p for p in args.peers.split(",") if p]
    unknown = [p for p in args.peers if p not in UNION_PEERS]
    if unknown:
        parser.error(f"--peers: unknown peer {unknown[0]!r}; choose from {', '.join(UNION_PEERS)}")
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


#: The epoch whose plan every loader runs, every round (epoch 0's plan is drawn by the loader's first pass).
EPOCH = 1


def build_loader(root: Path, k: int, args: argparse.Namespace) -> KineticsDALILoader:
    return KineticsDALILoader(root, "train", batch_size=args.batch_size, clip_len=16, frame_stride=4,
                              crop_size=224, device="cpu", clips_per_video=k, last_batch="partial",
                              decode=DecodeSpec(fallback_workers=args.workers, dali_threads=args.workers))


def daliload_epoch(loader: KineticsDALILoader, k: int) -> dict:
    """One epoch of the loader on :data:`EPOCH`'s plan: clips, clips/s, fallback frames per clip, route."""
    loader.set_epoch(EPOCH)
    started = time.perf_counter()
    clips = sum(int(labels.shape[0]) for _, labels in loader)
    elapsed = time.perf_counter() - started
    stats = loader.stats()
    if stats.failures:
        raise RuntimeError(f"k={k}: {len(stats.failures)} video(s) failed: {stats.failures[0].describe()}")
    return {"clips": clips, "clips_per_s": clips / elapsed, "frames_per_clip": stats.frames_decoded_fallback / clips,
            # which decoders took the clips: the files' route, or both where the router shared DALI's files
            "route": "dali" if not stats.clips_fallback else "fallback" if not stats.clips_dali else "both"}


def peer_epoch(peer, k: int, expected: int) -> dict:
    started = time.perf_counter()
    clips = sum(int(labels.shape[0]) for _, labels in peer.epoch(f"k={k}"))
    elapsed = time.perf_counter() - started
    if clips != expected:
        raise RuntimeError(f"k={k}: a peer delivered {clips} clips, the plan has {expected}")
    return {"clips": clips, "clips_per_s": clips / elapsed}


def _spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": values}


def measure(root: Path, args: argparse.Namespace) -> list[dict]:
    """Every k's row: daliload and each peer on the same plan, interleaved (see the module docstring)."""
    from benchmarks.peers.union import UNION_PEERS, UnionLoader

    loaders = {k: build_loader(root, k, args) for k in KS}
    peers: dict[str, UnionLoader] = {}
    try:
        plans = {k: loader.plan(EPOCH) for k, loader in loaders.items()}
        num_frames = {v.path: v.num_frames for v in loaders[1].videos}
        for name in args.peers:
            why_not = UNION_PEERS[name][1]()
            if why_not is not None:
                print(f"bench_repeated: peer {name} cannot run here: {why_not}", flush=True)
                continue
            peers[name] = UnionLoader(name, {f"k={k}": plan for k, plan in plans.items()}, num_frames,
                                      loaders[1].output, workers=args.workers)
        expected = {k: sum(len(b) for b in plan) for k, plan in plans.items()}
        ways = [DALILOAD, *peers]

        def run(way: str, k: int) -> dict:
            if way == DALILOAD:
                return daliload_epoch(loaders[k], k)
            return peer_epoch(peers[way], k, expected[k])

        for k in KS:  # untimed: workers start, the scan, the first decode of each file
            for way in ways:
                run(way, k)
        runs: dict[int, dict[str, list[dict]]] = {k: {way: [] for way in ways} for k in KS}
        orders = []
        for number in range(args.rounds):
            order = rotated(ways, number)
            orders.append(order)
            for k in KS:
                for way in order:
                    runs[k][way].append(run(way, k))
    finally:
        for peer in peers.values():
            peer.close()
        for loader in loaders.values():
            loader.close()
    return [_row(k, runs[k], len(loaders[k].videos), orders) for k in KS]


def _row(k: int, runs: dict[str, list[dict]], videos: int, orders: list[list[str]]) -> dict:
    """One k's figures: daliload's (the old keys), each peer's, and daliload over the best peer per round."""
    own = runs[DALILOAD]
    rates = [r["clips_per_s"] for r in own]
    route = own[-1]["route"]
    row = {"k": k, "videos": videos, "clips_per_epoch": own[-1]["clips"], "route": route,
           "clips_per_s": statistics.median(rates), "min": min(rates), "max": max(rates), "runs": rates,
           "fallback_frames_per_clip": statistics.median(r["frames_per_clip"] for r in own)
           if route == "fallback" else None,
           "peers": {}, "best_peer": None, "over_best_peer": None, "orders": orders}
    for name, peer_runs in runs.items():
        if name != DALILOAD:
            row["peers"][name] = _spread([r["clips_per_s"] for r in peer_runs]) | {"clips": peer_runs[-1]["clips"]}
    if row["peers"]:
        best = max(row["peers"], key=lambda name: row["peers"][name]["median"])
        row["best_peer"] = best
        row["over_best_peer"] = _spread([o / p for o, p in zip(rates, row["peers"][best]["runs"])])
    return row


def _cell(figures: dict) -> str:
    return f"{figures['median']:.1f} ({figures['min']:.1f}-{figures['max']:.1f})"


def _ratio(r: dict) -> str:
    return f"{r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f})"


def _old_markdown_rows(result: dict) -> list[str]:
    """The table of a run before the peers (``settings["clips"]``: the first clips / k videos per k)."""
    lines = ["| dataset (route) | k = 1 | k = 2 | k = 4 | k = 2 / k = 1 | k = 4 / k = 1 | frames decoded per clip "
             "(fallback), k = 1 / 2 / 4 |", "|---|---|---|---|---|---|---|"]
    for name, rows in result["datasets"].items():
        by_k = {row["k"]: row for row in rows}
        cells = [f"{by_k[k]['clips_per_s']:.1f} ({by_k[k]['min']:.1f}-{by_k[k]['max']:.1f})" for k in KS]
        frames = " / ".join(f"{by_k[k]['fallback_frames_per_clip']:.0f}" if by_k[k]["fallback_frames_per_clip"]
                            is not None else "-" for k in KS)
        ratios = [f"{by_k[k]['clips_per_s'] / by_k[1]['clips_per_s']:.2f}x" for k in (2, 4)]
        lines.append(f"| `{name}` ({by_k[1]['route']}) | " + " | ".join(cells + ratios) + f" | {frames} |")
    return lines


def markdown(result: dict) -> str:
    s = result["settings"]
    if "videos" not in s:  # a run of the version before the peers
        description = (f"KineticsDALILoader on the CPU, {s['clips']} clips per epoch for every k (the first clips / k "
                       f"videos of each dataset, {s['duration_s']:g} s each), batch {s['batch_size']}, "
                       f"{s['workers']} fallback workers / DALI threads, 16 frames at stride 4, 224 crop; one untimed "
                       f"epoch, then {s['runs']} timed: clips/s, median (min-max).")
        rows = _old_markdown_rows(result)
    else:
        peers = s["peers"]
        description = (
            f"KineticsDALILoader on the CPU against the peers decoding the union of a video's k windows in one call "
            f"(VideoMAE's way), all on the loader's plan and with the fallback's transform: the same {s['videos']} "
            f"videos of {s['duration_s']:g} s for every k (videos * k clips per epoch), batch {s['batch_size']}, "
            f"{s['workers']} fallback workers = DALI threads = each peer's DataLoader workers, 16 frames at stride "
            f"4, 224 crop; one untimed epoch per loader and k, then {s['rounds']} rounds of one epoch per loader "
            f"and k, the loaders' order rotated each round. clips/s: median (min-max); daliload / best peer: the "
            f"ratio per round to the peer with the best median. Peers: "
            + "; ".join(f"`{name}` {line}" for name, line in s.get("peer_summaries", {}).items()) + ".")
        rows = ["| dataset (route) | k | videos | clips per epoch | daliload | " + " | ".join(peers)
                + " | daliload / best peer | daliload / its k = 1 | fallback frames decoded per clip |",
                "|---|---|---|---|---|" + "---|" * len(peers) + "---|---|---|"]
        for name, ks in result["datasets"].items():
            by_k = {row["k"]: row for row in ks}
            for row in ks:
                cells = [_cell(row["peers"][p]) if p in row["peers"] else "not run" for p in peers]
                best = f"{_ratio(row['over_best_peer'])} (`{row['best_peer']}`)" if row["best_peer"] else "-"
                frames = "-" if row["fallback_frames_per_clip"] is None else f"{row['fallback_frames_per_clip']:.0f}"
                rows.append(f"| `{name}` ({row['route']}) | {row['k']} | {row['videos']} | {row['clips_per_epoch']} "
                            f"| {row['clips_per_s']:.1f} ({row['min']:.1f}-{row['max']:.1f}) | " + " | ".join(cells)
                            + f" | {best} | {row['clips_per_s'] / by_k[1]['clips_per_s']:.2f}x | {frames} |")
    lines = [*run_heading("Repeated-sampling", "repeated", "python -m benchmarks.bench_repeated", result,
                          description), "", *rows]
    target = result.get("targets")
    if target:
        lines += ["", "Targets on the fallback (`h264-gop250`): "
                  + "; ".join(f"k = {k}: {target[str(k)]['ratio']:.2f}x of k = 1 (target >= {TARGETS[k]:g}x: "
                              f"{'met' if target[str(k)]['met'] else '**missed**'})" for k in (2, 4)) + "."]
    for name, t in (result.get("peer_targets") or {}).items():
        lines += ["", f"Target on `{name}`: daliload at least {t['target']:g}x the best peer at k = {t['k']}: "
                  + (f"{_ratio(t['ratio'])} against `{t['best_peer']}`, {t['verdict']}." if t["ratio"]
                     else "no peer ran.")]
    return "\n".join(lines) + "\n"


def readme_figures(result: dict) -> str:
    """The page's figures of a run: clips/s at each k over k = 1's, per dataset, and daliload over the best peer."""
    parts = []
    for name, rows in result["datasets"].items():
        by_k = {row["k"]: row for row in rows}
        ratios = ", ".join(f"k = {k} {by_k[k]['clips_per_s'] / by_k[1]['clips_per_s']:.2f}x" for k in (2, 4))
        part = (f"on `{name}` ({by_k[1]['route']}) {ratios} the clips/s of k = 1 "
                f"({by_k[1]['clips_per_s']:.1f})")
        if by_k[1].get("best_peer"):  # a run with the peers
            part += "; daliload / the best peer decoding the union of the windows: " + ", ".join(
                f"k = {k} {_ratio(by_k[k]['over_best_peer'])} (`{by_k[k]['best_peer']}`)" for k in KS)
        parts.append(part)
    s = result["settings"]
    if "videos" in s:
        what = (f"the same {s['videos']} videos for every k, {s['workers']} workers, the loader on the CPU, "
                f"{s['rounds']} interleaved rounds, median (min-max)")
    else:
        what = f"{s['clips']} clips per epoch, {s['workers']} workers, the loader on the CPU"
    return (f"Measured by `python -m benchmarks.bench_repeated` (`benchmarks/results/repeated.json`; "
            f"{result['machine']['date_utc']}, {what}): " + "; ".join(parts) + ".\n")


def judge(datasets: dict) -> tuple[dict, dict]:
    """The targets: k over k = 1 on the fallback (:data:`TARGETS`) and daliload over the best peer
    (:data:`PEER_TARGETS`, met or missed only when every round is on one side)."""
    targets, peer_targets = {}, {}
    if "h264-gop250" in datasets:
        by_k = {row["k"]: row for row in datasets["h264-gop250"]}
        targets = {str(k): {"ratio": by_k[k]["clips_per_s"] / by_k[1]["clips_per_s"],
                            "met": by_k[k]["clips_per_s"] / by_k[1]["clips_per_s"] >= TARGETS[k]} for k in (2, 4)}
    for name, target in PEER_TARGETS.items():
        if name in datasets:
            row = {r["k"]: r for r in datasets[name]}[PEER_TARGET_K]
            ratio = row["over_best_peer"]
            peer_targets[name] = {"k": PEER_TARGET_K, "target": target, "best_peer": row["best_peer"],
                                  "ratio": ratio, "verdict": verdict(ratio, target) if ratio else "not measured"}
    return targets, peer_targets


def main(argv: list[str] | None = None) -> int:
    from benchmarks.peers.union import UNION_PEERS

    args = parse_args(argv)
    if args.report_from is not None:
        import json

        result = json.loads(Path(args.report_from).read_text())
        if args.readme is not None:
            write_readme_figures(args.readme, "repeated", readme_figures(result))
        return 0
    names = [n for n in args.datasets.split(",") if n]
    started = load_average()
    datasets = {}
    for dataset in prepare_standard(args.datasets, clips=args.videos, duration_s=args.duration, size=args.size,
                                    data_dir=args.data_dir):
        datasets[dataset.spec.name] = measure(subset_layout(dataset, args.videos), args)
        print(f"bench_repeated: {dataset.spec.name} done, load average {load_average()}", flush=True)
    result = {"name": "repeated", "machine": machine_info(args.machine), "load_average": [started, load_average()],
              "settings": {"datasets": names, "videos": args.videos, "duration_s": args.duration,
                           "batch_size": args.batch_size, "workers": args.workers, "rounds": args.rounds,
                           "peers": args.peers,
                           "peer_summaries": {name: UNION_PEERS[name][2] for name in args.peers}},
              "datasets": datasets}
    result["targets"], result["peer_targets"] = judge(datasets)
    publish_run(result, args, markdown(result), chapter=CHAPTER, marker="repeated", figures=readme_figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
