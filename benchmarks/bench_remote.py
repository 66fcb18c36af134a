"""Reading clips from an S3 store: daliload against the ways peers read, with a delay per request and a cap.

``python -m benchmarks.bench_remote`` (options: ``--help``) generates a
Kinetics-like dataset (:func:`daliload.synth.dataset.generate_dataset`:
300-frame files, 10 s at 30 fps, a keyframe every 16 frames, H.264 and VP9
half each; 4 classes x 4 clips by default), packs it into tar shards
(``daliload pack``: :func:`daliload.commands.pack.pack_dataset`), and puts
both in moto's S3 server on 127.0.0.1 (buckets ``files`` and ``shards``).
Each store configuration of ``--stores`` (default ``0,20,50,20@20``: a delay
of 0, 20 or 50 ms per request, no cap, then 20 ms with an overall cap of
20 MB/s) is a :class:`benchmarks.remote_store.ThrottledProxy` in front of
it, which counts the requests and body bytes it serves.

Rows (:mod:`benchmarks.peers.remote_peers`), all on the same plan: the
windows, crops and flips of daliload's own plan for epoch 0 (its defaults),
which every daliload row checks it draws itself:

==========================  ======================================================
``daliload local``          the loader on the local files (no store)
``daliload s3``             the loader with its root in the store (``s3://files``)
``daliload s3 shards``      the loader on the shards in the store (``s3://shards``)
``torchcodec``              ``VideoDecoder(fsspec.open(uri))``, its defaults
``whole object``            one GET of the object, PyAV from memory (webdataset's way)
==========================  ======================================================

The daliload rows run with their defaults (2 fallback workers); the peers in
``--workers`` (default 2) spawned DataLoader workers. Per store configuration
every row's process is started and built (not timed: daliload's scan and its
mirror of the root are set-up), runs ``--warmup`` untimed epochs, then
``--rounds`` timed rounds of one epoch each, rows in turn, the order rotated
every round (:mod:`benchmarks.interleave`); ratios are taken round by round.

Figures per row and store (:mod:`benchmarks.remote_report`): clips/s; bytes
served per clip, over the file's size and over the least
(:mod:`benchmarks.remote_least`: the window's packets from its entry keyframe,
plus each file's header once); requests per clip; for daliload also its own
``stats()`` counters (``remote_bytes``, ``remote_requests``) against the
proxy's. The targets (PASS/FAIL) are printed and go in the JSON.

Writes ``--json`` (default ``benchmarks/results/remote.json``), its section
of ``benchmarks/RESULTS.md`` and, with ``--readme docs/remote.md``, that page's
``remote`` section, all from this one run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from dataclasses import asdict
from pathlib import Path

from benchmarks.interleave import LoaderProcess, rotated
from benchmarks.machine import machine_info
from benchmarks.options import int_at_least
from benchmarks.remote_report import CHAPTER, evaluate, figures, markdown, readme_figures, target_lines
from benchmarks.remote_store import ThrottledProxy, client_env, moto_store, parse_stores, upload
from benchmarks.report import add_output_options, load_average, publish_run

_PEERS = "benchmarks.peers.remote_peers"
#: row -> (adapter, where daliload's root is: "local", "files" or "shards")
ROWS: dict[str, tuple[str, str]] = {
    "daliload local": (f"{_PEERS}:DaliloadRemote", "local"),
    "daliload s3": (f"{_PEERS}:DaliloadRemote", "files"),
    "daliload s3 shards": (f"{_PEERS}:DaliloadRemote", "shards"),
    "torchcodec": (f"{_PEERS}:TorchcodecFsspec", "files"),
    "whole object": (f"{_PEERS}:WholeObject", "files"),
}
BUCKETS = {"files": "files", "shards": "shards"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_remote", description=__doc__.split("\n")[0])
    parser.add_argument("--classes", type=int_at_least(1), default=4, help="classes (default 4)")
    parser.add_argument("--clips-per-class", type=int_at_least(1), default=4, help="clips per class (default 4)")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per clip at 30 fps (default 10)")
    parser.add_argument("--size", default="340x256", help="WIDTHxHEIGHT of the clips (default 340x256)")
    parser.add_argument("--gop", type=int_at_least(1), default=16, help="frames between keyframes (default 16)")
    parser.add_argument("--codecs", default="h264,vp9", help="comma-separated, in equal shares (default h264,vp9)")
    parser.add_argument("--stores", default="0,20,50,20@20",
                        help="store configurations: delay per request in ms, optionally @ an overall cap in MB/s "
                             "(default 0,20,50,20@20)")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated of: {', '.join(ROWS)}")
    parser.add_argument("--rounds", type=int_at_least(1), default=3, help="timed rounds (default 3)")
    parser.add_argument("--warmup", type=int_at_least(0), default=1, help="untimed epochs first (default 1)")
    parser.add_argument("--batch-size", type=int_at_least(1), default=4, help="clips per batch (default 4)")
    parser.add_argument("--clip-len", type=int_at_least(1), default=16, help="frames per clip (default 16)")
    parser.add_argument("--frame-stride", type=int_at_least(1), default=4, help="default 4")
    parser.add_argument("--crop-size", type=int_at_least(8), default=112, help="output size in pixels (default 112)")
    parser.add_argument("--workers", type=int_at_least(1), default=2,
                        help="DataLoader workers of the peers (default 2: daliload's default fallback workers)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a set-up or an epoch may take")
    parser.add_argument("--data-dir", default="bench_out/remote", help="where the dataset is generated (cached)")
    parser.add_argument("--readme", default=None, help="a page whose 'remote' markers this run's figures replace "
                                                        "(the published run's go in docs/remote.md)")
    add_output_options(parser, "remote")
    args = parser.parse_args(argv)
    args.store_configs = parse_stores(args.stores)
    args.row_names = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [r for r in args.row_names if r not in ROWS]
    if unknown or not args.row_names:
        parser.error(f"--rows: unknown row(s) {unknown}; choose from {', '.join(ROWS)}")
    try:
        width, height = (int(x) for x in args.size.lower().split("x"))
    except ValueError:
        parser.error(f"--size: {args.size!r} is not WIDTHxHEIGHT, e.g. 340x256")
    args.width, args.height = width, height
    return args


def make_dataset(args: argparse.Namespace) -> tuple[Path, Path]:
    """The generated dataset (``files``, with the run's ``meta.json``) and its shards, made once per spec."""
    from daliload.commands.pack import pack_dataset
    from daliload.synth.dataset import generate_dataset
    from daliload.synth.spec import SynthSpec

    codecs = [c.strip() for c in args.codecs.split(",") if c.strip()]
    folder = Path(args.data_dir) / (f"{args.classes}x{args.clips_per_class}-{args.width}x{args.height}-"
                                    f"{args.duration:g}s-gop{args.gop}-{'+'.join(codecs)}-s{args.seed}")
    files, shards = folder / "files", folder / "shards"
    if not (folder / "done").exists():
        shutil.rmtree(folder, ignore_errors=True)
        spec = SynthSpec(num_classes=args.classes, clips_per_class=args.clips_per_class, val_fraction=0.0,
                         width=args.width, height=args.height, duration_s=args.duration, fps_mix={30: 1.0},
                         codec_mix={c: 1.0 for c in codecs}, seed=args.seed, gop=args.gop)
        generate_dataset(files, spec, workers=2, progress=False)
        pack_dataset(files, shards, progress=False)
        write_meta(files, args, codecs)
        (folder / "done").touch()
    return files, shards


def write_meta(files: Path, args: argparse.Namespace, codecs: list[str]) -> None:
    """``files/meta.json``: the videos (sorted by path, as daliload lists them) for the measuring processes."""
    from benchmarks.datasets import META_NAME, BenchVideo, Dataset, DatasetSpec, probe_keyframes
    from daliload.synth.dataset import read_report

    videos = []
    for clip in sorted(read_report(files), key=lambda c: c.path):
        num_frames, keyframes = probe_keyframes(files / clip.path)
        videos.append(BenchVideo(path=str(files / clip.path), label=clip.label, num_frames=num_frames, fps=30.0,
                                 width=args.width, height=args.height, keyframes=keyframes,
                                 size_bytes=(files / clip.path).stat().st_size))
    spec = DatasetSpec(name="remote", codec="+".join(codecs), width=args.width, height=args.height, gop=args.gop,
                       num_clips=len(videos), duration_s=args.duration, fps=30, seed=args.seed,
                       description=f"{args.width}x{args.height} {' and '.join(codecs)}, keyframe every {args.gop}")
    dataset = Dataset(spec=spec, root=str(files), videos=tuple(videos))
    (files / META_NAME).write_text(json.dumps(dataset.to_json()), encoding="utf-8")


def _row_env(row: str, endpoint: str, files: Path, work: Path) -> dict:
    where = ROWS[row][1]
    source = str(files) if where == "local" else f"s3://{BUCKETS[where]}"
    return client_env(endpoint) | {
        "BENCH_REMOTE_SOURCE": source, "BENCH_REMOTE_ROOT": str(files.resolve()),
        "BENCH_REMOTE_PREFIX": f"s3://{BUCKETS['files']}", "BENCH_REMOTE_STATS": str(work / f"{_stem(row)}.stats"),
        "XDG_CACHE_HOME": str(work.parent / "cache")}  # the mirrors of the roots and their manifests


def _stem(row: str) -> str:
    return row.replace(" ", "-")


def _last_stats(work: Path, row: str) -> dict | None:
    path = work / f"{_stem(row)}.stats"
    if not path.exists():
        return None
    lines = path.read_text(encoding="utf-8").strip().splitlines()
    return json.loads(lines[-1]) if lines else None


def measure_store(proxy: ThrottledProxy, rows: list[str], files: Path, plan: Path, args, work: Path) -> dict:
    """Every row against one store configuration: set-up, warm-up, then interleaved timed rounds."""
    work.mkdir(parents=True, exist_ok=True)
    records: dict[str, dict] = {row: {"status": "ok", "runs": []} for row in rows}
    processes: dict[str, LoaderProcess] = {}
    try:
        for row in rows:  # one at a time: no two scans of a root at once
            job = work / f"{_stem(row)}.job.json"
            job.write_text(json.dumps({"adapter": ROWS[row][0], "kind": "loader", "dataset": str(files),
                                       "plan": str(plan), "workers": args.workers, "device": "cpu"}))
            before = proxy.counts()
            process = LoaderProcess(job, work / f"{_stem(row)}.log", args.timeout,
                                    env=_row_env(row, proxy.endpoint, files, work))
            answer = process.started()
            setup = proxy.counts() - before
            records[row] |= {"setup_requests": setup.requests, "setup_bytes": setup.body_bytes}
            if answer["status"] != "ready":
                records[row] |= {"status": answer["status"], "reason": answer.get("reason")}
                process.stop()
                continue
            records[row]["setup_s"] = answer["setup_s"]
            processes[row] = process
        for round_number in range(args.warmup + args.rounds):
            timed = round_number >= args.warmup
            for row in rotated(list(processes), round_number):
                before = proxy.counts()
                answer = processes[row].epoch()
                served = proxy.counts() - before
                if answer["status"] != "ok":
                    records[row] |= {"status": answer["status"], "reason": answer.get("reason")}
                    processes.pop(row).stop()
                    continue
                if timed:
                    records[row]["runs"].append(answer["run"] | {
                        "round": round_number - args.warmup, "requests": served.requests, "heads": served.heads,
                        "body_bytes": served.body_bytes, "daliload_stats": _last_stats(work, row)})
    finally:
        for process in processes.values():
            process.stop()
    return records


def make_plan_file(files: Path, args, out: Path) -> tuple[object, list]:
    """The run's plan (daliload's own for epoch 0: the videos in its order, its seed) written to ``out``."""
    from benchmarks.datasets import load_dataset
    from benchmarks.task import TaskSpec, make_plan, write_plan

    dataset = load_dataset(files)
    task = TaskSpec(clip_len=args.clip_len, frame_stride=args.frame_stride, crop_size=args.crop_size,
                    short_side_range=(args.crop_size, args.crop_size * 5 // 4), batch_size=args.batch_size,
                    seed=args.seed)
    samples = make_plan(dataset.videos, task)  # the videos are in the loader's order (sorted paths)
    write_plan(out, samples, task)
    return dataset, samples


def run(args: argparse.Namespace) -> dict:
    """The whole benchmark; returns the result (the JSON)."""
    from benchmarks.remote_least import least_for_plan

    started_at, load_start = time.time(), load_average()
    files, shards = make_dataset(args)
    work = Path(args.data_dir) / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    dataset, samples = make_plan_file(files, args, work / "plan.json")
    num_frames = {v.path: v.num_frames for v in dataset.videos}
    least = least_for_plan((s.path, s.frame_indices(num_frames[s.path])) for s in samples)
    stores = {}
    with moto_store() as (client, endpoint):
        upload(client, files, BUCKETS["files"])
        upload(client, shards, BUCKETS["shards"])
        for config in args.store_configs:
            with ThrottledProxy(endpoint, config) as proxy:
                rows = measure_store(proxy, args.row_names, files, work / "plan.json", args,
                                     work / _stem(config.name.replace(",", "").replace("/", "")))
            stores[config.name] = {"config": asdict(config), "rows": rows}
    result = {"name": "remote", "machine": machine_info(args.machine), "load_average": [load_start, load_average()],
              "elapsed_s": round(time.time() - started_at),
              "settings": {"classes": args.classes, "clips_per_class": args.clips_per_class, "clips": len(samples),
                           "duration_s": args.duration, "fps": 30, "size": f"{args.width}x{args.height}",
                           "gop": args.gop, "codecs": args.codecs, "rounds": args.rounds, "warmup": args.warmup,
                           "batch_size": args.batch_size, "clip_len": args.clip_len,
                           "frame_stride": args.frame_stride, "crop_size": args.crop_size, "workers": args.workers,
                           "seed": args.seed, "rows": args.row_names, "bandwidth_cap": "overall (all connections)",
                           "s3fs_block_size": _s3fs_block_size()},
              "least": asdict(least) | {"per_clip": least.per_clip, "windows_per_clip": least.windows_per_clip,
                                         "file_per_clip": least.file_per_clip},
              "stores": stores}
    for store in stores.values():
        for row in store["rows"].values():
            row["figures"] = figures(row, result["least"])
    result["targets"] = evaluate(result)
    return result


def _s3fs_block_size() -> int | None:
    try:
        import s3fs
    except ImportError:
        return None
    return s3fs.S3FileSystem.default_block_size


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    publish_run(result, args, markdown(result), chapter=CHAPTER, marker="remote", figures=readme_figures)
    print("\n".join(target_lines(result)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
