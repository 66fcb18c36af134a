"""Kinetics-700 at full size: job start, the index per rank, the epoch plan, on a tree of N videos.

``python -m benchmarks.bench_scale --videos N`` (options: ``--help``) builds a
Kinetics-700-shaped tree of ``N`` videos under ``--work`` (default: a fresh
folder under the system's temporary folder, removed at the end unless
``--keep``)::

    WORK/sources/             the source clips (generated, or copied from --clips)
    WORK/seed/train/...       one link of each source: the tree the real scan probes
    WORK/tree/                the dataset root
      train/action 000/<youtube id>_000000_000010.mp4   hardlinks of the sources,
      ...                                               700 class folders, 94 % train
      val/action 000/...
      .daliload/manifest.sqlite

Hardlinks share their source's size and mtime, so every video of the tree has
exactly the facts its source has. The manifest is made the way the issue
measured it: the project's own scan probes the sources (``WORK/seed``), its
rows are replicated for every video of the tree, and the tree is then
re-scanned for real (which must probe nothing). A first re-scan settles what
a scan writes once (nothing, or a changed layout); the second is the one
reported.

Each measurement runs in a fresh process (``--child``), so memory and time
are the process's own, with ``torch``, daliload and DALI imported before it starts:

- re-scan, nothing changed: wall time, files probed, peak RSS;
- loader construction from the manifest, ``train`` split, at world sizes 1 and
  64 (rank 0, from ``RANK``/``WORLD_SIZE``, no process group): wall time,
  resident memory it adds, objects the garbage collector tracks; then this
  rank's plan of epoch 0 (``loader.plan(0)``) and the first batch
  (fallback on the CPU, one worker);
- one epoch's plan of the whole split in one process;
- job start from the root: the three loaders ``examples/train_ddp.py`` builds
  (train, val, val with views) in one process;
- two ranks without a process group (``WORLD_SIZE=2``) building a loader
  from the root at the same time;
- the manifest's size;
- a first scan of a tree of :data:`FRESH_FILES` videos (every file probed):
  files/s and the scanning process's own CPU time per file (which capped the
  rate whatever the workers), then one shard of :data:`FRESH_SHARDS` of it.

Targets are the issue's, for 650k videos; at other sizes each is scaled as
``fixed + per_video * N`` (the fixed part is what does not grow with the
dataset: imports aside, opening files, starting a process), printed with the
table. ``--baseline JSON`` adds a column with an earlier run of the same size
(e.g. of the commit before a change, run with that commit's package on the
path: the JSON records which package it measured).

Writes ``--json`` (default ``benchmarks/results/scale-N.json``) and its
section of ``benchmarks/RESULTS.md`` (``### Scale run `scale-N```), both from
this one run.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.scale_report import (FRESH_FILES, FRESH_SHARDS, LOADER_OPTIONS, figures, markdown, missed_targets,
                                     readme_figures)
from benchmarks.options import int_at_least
from benchmarks.scale_tree import build_tree, replicate_manifest, seed_manifest, source_clips
from benchmarks.report import add_output_options, load_average, publish_run
from benchmarks.machine import machine_info

CHAPTER = "## Kinetics-700 at full size: `python -m benchmarks.bench_scale`"
WORLD_SIZES = (1, 64)
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_scale", description=__doc__.split("\n")[0])
    parser.add_argument("--videos", type=int_at_least(1), default=10_000, help="videos in the tree (default 10000)")
    parser.add_argument("--clips", type=Path, default=None,
                        help="a folder of real clips to link (its video files, recursively); default: generated")
    parser.add_argument("--work", type=Path, default=None,
                        help="where the tree goes (default: a new folder in the system's temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the tree and its manifest afterwards")
    parser.add_argument("--data-dir", default="bench_out/datasets", help="cache of the generated source clips")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="an earlier run's JSON, of the same --videos, shown beside this run's figures")
    parser.add_argument("--readme", default=None,
                        help="a page whose 'scale' markers this run's figures replace (the 650k run's go in "
                             "docs/scale.md)")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when a target (scaled to --videos) is missed, naming it (what CI runs)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child-args", default="{}", help=argparse.SUPPRESS)
    add_output_options(parser, "scale")
    args = parser.parse_args(argv)
    if args.json.endswith("results/scale.json"):
        args.json = args.json[:-len("scale.json")] + f"scale-{args.videos}.json"
    return args


# -- measurements, each in a child process ------------------------------------------------------

def _rss_bytes() -> int:
    with open("/proc/self/status", encoding="utf-8") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _package() -> dict:
    """Which daliload this process measures: its folder and that checkout's commit."""
    import daliload

    folder = Path(daliload.__file__).resolve().parent.parent
    commit = subprocess.run(["git", "-C", str(folder), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=False).stdout.strip()
    return {"folder": str(folder), "commit": commit or "unknown"}


def child_rescan(a: dict) -> dict:
    from daliload.prescreen import scan

    started = time.perf_counter()
    summary = scan(a["root"], manifest_path=a["manifest"], device="cpu", workers=2, progress=False)
    return {"wall_s": time.perf_counter() - started, "probed": summary.probed, "total": summary.total,
            "peak_rss_bytes": _peak_rss_bytes()}


def child_construct(a: dict) -> dict:
    """One rank's loader from the manifest: construction, this rank's plan, the first batch."""
    os.environ.update({"RANK": "0", "WORLD_SIZE": str(a["world_size"]), "LOCAL_RANK": "0"})
    from daliload.loader import DecodeSpec, KineticsDALILoader

    gc.collect()
    before = _rss_bytes()
    started = time.perf_counter()
    loader = KineticsDALILoader(a["manifest"], "train", device="cpu", decode=DecodeSpec(fallback_workers=1),
                                **LOADER_OPTIONS)
    construct_s = time.perf_counter() - started
    gc.collect()
    added = _rss_bytes() - before
    tracked = len(gc.get_objects())
    started = time.perf_counter()
    gc_s = _time_collect()
    started = time.perf_counter()
    plan = loader.plan(0)
    plan_s = time.perf_counter() - started
    samples = sum(len(b) for b in plan)
    del plan
    started = time.perf_counter()
    iterator = iter(loader)
    next(iterator)
    first_batch_s = time.perf_counter() - started
    after_batch = _rss_bytes() - before
    iterator.close()
    loader.close()
    return {"videos": len(loader.videos), "construct_s": construct_s, "added_bytes": added,
            "gc_tracked": tracked, "gc_full_s": gc_s, "rank_plan_s": plan_s, "rank_samples": samples,
            "first_batch_s": first_batch_s, "added_after_first_batch_bytes": after_batch,
            "peak_rss_bytes": _peak_rss_bytes()}


def _time_collect() -> float:
    started = time.perf_counter()
    gc.collect()
    return time.perf_counter() - started


def child_plan(a: dict) -> dict:
    """One epoch's plan of the whole split in one process, from the manifest's videos."""
    from daliload import plan as plan_module
    from daliload.plan import AugmentSpec, ClipSpec

    clip = ClipSpec(clip_len=LOADER_OPTIONS["clip_len"], frame_stride=LOADER_OPTIONS["frame_stride"])
    augment = AugmentSpec(crop_size=LOADER_OPTIONS["crop_size"])
    videos = _train_videos(a["manifest"])
    draw = getattr(plan_module, "draw_train_epoch", None)
    runs = []
    for epoch in range(3):
        started = time.perf_counter()
        if draw is not None:  # the vectorised draw: every rank's samples as columns
            drawn = draw(videos, seed=0, epoch=epoch, world_size=1, clip=clip, augment=augment)
            count = len(drawn)
        else:  # before it: Sample objects, one process is world size 1
            count = len(plan_module.make_train_plan(videos, seed=0, epoch=epoch, rank=0, world_size=1,
                                                    clip=clip, augment=augment))
        runs.append(time.perf_counter() - started)
    return {"videos": len(videos), "samples": count, "runs_s": runs, "median_s": sorted(runs)[1],
            "vectorised": draw is not None}


def _train_videos(manifest: str):
    """The split's decodable videos as the loader holds them: its columns if it has them, else entries."""
    from daliload.prescreen import Manifest

    with Manifest(manifest) as m:
        if hasattr(m, "video_index"):
            return m.video_index("train", device="cpu").decodable().columns
        return [e for e in m.entries("train", device="cpu") if e.route != "bad"]


def child_job_start(a: dict) -> dict:
    """The three loaders ``examples/train_ddp.py`` builds, from the root, in one process."""
    from daliload.loader import DecodeSpec, KineticsDALILoader

    options = dict(device="cpu", decode=DecodeSpec(fallback_workers=1), **LOADER_OPTIONS)
    started = time.perf_counter()
    walls = []
    for split, extra in (("train", {}), ("val", {}), ("val", {"views": (3, 3)})):
        t = time.perf_counter()
        KineticsDALILoader(a["root"], split, **options, **extra).close()
        walls.append(time.perf_counter() - t)
    return {"wall_s": time.perf_counter() - started, "loaders_s": walls, "peak_rss_bytes": _peak_rss_bytes()}


def child_rank(a: dict) -> dict:
    """One of several ranks without a process group building a loader from the root."""
    os.environ.update({"RANK": str(a["rank"]), "WORLD_SIZE": str(a["world_size"]), "LOCAL_RANK": str(a["rank"]),
                       "TORCHELASTIC_RUN_ID": a["run_id"]})  # as torchrun sets them before init_process_group
    from daliload.loader import DecodeSpec, KineticsDALILoader

    started = time.perf_counter()
    KineticsDALILoader(a["root"], "train", device="cpu", decode=DecodeSpec(fallback_workers=1),
                       **LOADER_OPTIONS).close()
    return {"wall_s": time.perf_counter() - started}


def child_fresh_scan(a: dict) -> dict:
    """A first scan of a tree of ``files`` videos (every file probed), whole or one shard of it."""
    from daliload.prescreen import scan

    kwargs = {}
    if a["shard"] != "0/1":
        import inspect

        if "shard" not in inspect.signature(scan).parameters:  # a daliload from before shards (a --baseline run)
            return {"unsupported": "this daliload's scan has no shards"}
        from daliload.dataset import parse_shard

        kwargs["shard"] = parse_shard(a["shard"])
    before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    summary = scan(a["root"], manifest_path=a["manifest"], device="cpu", workers=2, progress=False, **kwargs)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    parent_s = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return {"wall_s": wall, "probed": summary.probed, "parent_cpu_s": parent_s,
            "parent_ms_per_file": 1000 * parent_s / max(1, summary.probed)}


CHILDREN = {"fresh_scan": child_fresh_scan, "rescan": child_rescan, "construct": child_construct, "plan": child_plan,
            "job_start": child_job_start, "rank": child_rank}


def run_child(kind: str, **child_args) -> dict:
    return _finish(_start(kind, **child_args))


def _start(kind: str, **child_args) -> subprocess.Popen:
    command = [sys.executable, "-m", "benchmarks.bench_scale", "--child", kind, "--child-args",
               json.dumps(child_args)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"bench_scale child {proc.args[4]} failed ({proc.returncode}):\n{err[-4000:]}")
    return json.loads(out.strip().splitlines()[-1])


def child_main(kind: str, child_args: str) -> int:
    import torch  # noqa: F401 - imported before measuring, as a training script has it

    import daliload.loader  # noqa: F401
    import daliload.prescreen  # noqa: F401
    from daliload.dali import is_dali_available

    is_dali_available()  # DALI's import (about 90 MiB, whatever the dataset) is not the loader's to count

    result = CHILDREN[kind](json.loads(child_args))
    print(json.dumps(result))
    return 0


# -- the run --------------------------------------------------------------------------------

def measure(args: argparse.Namespace, work: Path) -> dict:
    sources = source_clips(args, work)
    root = work / "tree"
    started = time.perf_counter()
    build_tree(root, sources, args.videos)
    tree_s = time.perf_counter() - started
    started = time.perf_counter()
    seed = seed_manifest(work, sources)
    manifest = replicate_manifest(seed, work / "seed", root, sources, args.videos)
    manifest_s = time.perf_counter() - started
    fresh = {}
    fresh_root = work / "fresh"
    build_tree(fresh_root, sources, FRESH_FILES)
    for name, shard in (("whole", "0/1"), ("shard", f"0/{FRESH_SHARDS}")):
        fresh[name] = run_child("fresh_scan", root=str(fresh_root), manifest=str(work / f"fresh-{name}.sqlite"),
                                shard=shard)
    settle = run_child("rescan", root=str(root), manifest=str(manifest))
    rescan = run_child("rescan", root=str(root), manifest=str(manifest))
    construct = {str(w): run_child("construct", manifest=str(manifest), world_size=w) for w in WORLD_SIZES}
    plan = run_child("plan", manifest=str(manifest))
    job = run_child("job_start", root=str(root))
    ranks = [_start("rank", root=str(root), rank=r, world_size=2, run_id=f"bench-{os.getpid()}") for r in range(2)]
    ranks = [_finish(p) for p in ranks]
    return {"sources": [p.name for p in sources], "tree_s": tree_s, "manifest_build_s": manifest_s,
            "manifest_bytes": manifest.stat().st_size, "settle_rescan": settle, "rescan": rescan,
            "construct": construct, "plan": plan, "job_start": job, "two_ranks_no_group": ranks, "fresh_scan": fresh,
            "package": _package()}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        return child_main(args.child, args.child_args)
    baseline = json.loads(args.baseline.read_text()) if args.baseline is not None else None
    if baseline is not None and baseline.get("videos") != args.videos:
        raise SystemExit(f"bench_scale: --baseline {args.baseline} is a run of {baseline.get('videos')} videos, "
                         f"this one has {args.videos}")
    work = args.work or Path(tempfile.mkdtemp(prefix=f"daliload-scale-{args.videos}-"))
    if (work / "tree").exists():
        raise SystemExit(f"bench_scale: {work / 'tree'} exists; give an empty --work folder")
    started = load_average()
    try:
        measured = measure(args, work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    result = {"name": f"scale-{args.videos}", "videos": args.videos, "machine": machine_info(args.machine),
              "load_average": [started, load_average()], "measurements": measured,
              "figures": figures(measured, args.videos)}
    if baseline is not None:
        result["baseline"] = {k: baseline[k] for k in ("machine", "measurements", "figures")}
    publish_run(result, args, markdown(result), chapter=CHAPTER, marker="scale", figures=readme_figures)
    missed = missed_targets(result["figures"], args.videos)
    if args.check and missed:
        print("bench_scale: missed " + "; ".join(missed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
