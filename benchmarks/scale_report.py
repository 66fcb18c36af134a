"""What ``python -m benchmarks.bench_scale`` reports: its set-up, targets, figures and tables.

:func:`figures` turns one run's measurements into the table's figures;
:func:`markdown` writes its section of ``benchmarks/RESULTS.md`` and
:func:`readme_figures` README's table, both with the targets (the issue's at
650k videos, scaled to the run's size: :func:`target`).
"""

from __future__ import annotations

from benchmarks.machine import machine_line
from benchmarks.report import run_heading
from benchmarks.scale_tree import NUM_CLASSES, VAL_PER_100

#: Videos of the tree every file of which a first scan probes (the probe's rate does not depend on N), and the
#: shards a shard's scan of it is one of.
FRESH_FILES = 2000
FRESH_SHARDS = 4
#: Loader options of every measurement (small clips: the first batch is not the point here).
LOADER_OPTIONS = {"batch_size": 8, "clip_len": 8, "frame_stride": 2, "crop_size": 112}

#: name -> (fixed part, per video, unit, what): the issue's targets at 650k, as fixed + per_video * N.
TARGETS = {
    "construct_s": (0.5, 2.5 / 650_000, "s", "loader construction from the manifest"),
    "construct_mb_w64": (40.0, 300.0 / 2**20, "MiB", "memory construction adds, rank of 64"),
    "plan_split_s": (0.05, 0.95 / 650_000, "s", "one epoch's plan, whole split, one process"),
    "plan_rank64_s": (0.02, 0.08 / 650_000, "s", "a rank of 64 draws its share"),
    "job_start_s": (2.0, 8.0 / 650_000, "s", "job start from the root, three loaders, unchanged data"),
}


def target(name: str, videos: int) -> float:
    fixed, per_video, _, _ = TARGETS[name]
    return fixed + per_video * videos


def figures(m: dict, videos: int) -> dict:
    """The table's figures of one run's measurements."""
    w64 = m["construct"]["64"]
    return {
        "rescan_s": m["rescan"]["wall_s"], "rescan_probed": m["rescan"]["probed"],
        "rescan_peak_mb": m["rescan"]["peak_rss_bytes"] / 2**20,
        "construct_s": m["construct"]["1"]["construct_s"], "construct_s_w64": w64["construct_s"],
        "construct_mb_w1": m["construct"]["1"]["added_bytes"] / 2**20, "construct_mb_w64": w64["added_bytes"] / 2**20,
        "construct_bytes_per_video_w64": w64["added_bytes"] / videos,
        "gc_tracked_w1": m["construct"]["1"]["gc_tracked"], "gc_full_s_w1": m["construct"]["1"]["gc_full_s"],
        "plan_split_s": m["plan"]["median_s"], "plan_split_us_per_sample": 1e6 * m["plan"]["median_s"]
        / max(1, m["plan"]["samples"]), "plan_rank64_s": w64["rank_plan_s"],
        "plan_rank1_s": m["construct"]["1"]["rank_plan_s"],
        "job_start_s": m["job_start"]["wall_s"],
        "two_ranks_s": [r["wall_s"] for r in m["two_ranks_no_group"]],
        "first_batch_s_w1": m["construct"]["1"]["first_batch_s"], "first_batch_s_w64": w64["first_batch_s"],
        "first_batch_mb_w1": m["construct"]["1"]["added_after_first_batch_bytes"] / 2**20,
        "first_batch_mb_w64": w64["added_after_first_batch_bytes"] / 2**20,
        "manifest_mb": m["manifest_bytes"] / 2**20,
        "fresh_files_per_s": FRESH_FILES / m["fresh_scan"]["whole"]["wall_s"],
        "fresh_parent_ms": m["fresh_scan"]["whole"]["parent_ms_per_file"],
        "fresh_shard_s": m["fresh_scan"]["shard"].get("wall_s"), "fresh_whole_s": m["fresh_scan"]["whole"]["wall_s"],
    }


_ROWS = [
    ("re-scan, nothing changed: wall s (files probed; peak RSS MiB)",
     lambda f: f"{f['rescan_s']:.2f} ({f['rescan_probed']}; {f['rescan_peak_mb']:.0f})", None),
    ("loader construction from the manifest: wall s, world size 1 / 64",
     lambda f: f"{f['construct_s']:.2f} / {f['construct_s_w64']:.2f}", "construct_s"),
    ("memory construction adds, MiB: world size 1", lambda f: f"{f['construct_mb_w1']:.1f}", None),
    ("memory construction adds, MiB: world size 64 (bytes per video)",
     lambda f: f"{f['construct_mb_w64']:.1f} ({f['construct_bytes_per_video_w64']:.0f})", "construct_mb_w64"),
    ("objects the garbage collector tracks after construction (a full collection, s), world size 1",
     lambda f: f"{f['gc_tracked_w1']:,} ({f['gc_full_s_w1']:.2f})", None),
    ("one epoch's plan, whole split, one process: s (us per sample)",
     lambda f: f"{f['plan_split_s']:.2f} ({f['plan_split_us_per_sample']:.1f})", "plan_split_s"),
    ("this rank's plan (`loader.plan(0)`): s, world size 64",
     lambda f: f"{f['plan_rank64_s']:.3f}", "plan_rank64_s"),
    ("this rank's plan (`loader.plan(0)`): s, world size 1", lambda f: f"{f['plan_rank1_s']:.2f}", None),
    ("job start from the root (train, val, val with views), unchanged data: s",
     lambda f: f"{f['job_start_s']:.2f}", "job_start_s"),
    ("two ranks without a process group, each from the root: s",
     lambda f: " / ".join(f"{s:.2f}" for s in f["two_ranks_s"]), None),
    ("first batch after construction: s, world size 1 / 64",
     lambda f: f"{f['first_batch_s_w1']:.2f} / {f['first_batch_s_w64']:.2f}", None),
    ("memory added by construction and the first batch, MiB: world size 1 / 64",
     lambda f: f"{f['first_batch_mb_w1']:.0f} / {f['first_batch_mb_w64']:.0f}", None),
    ("manifest file: MiB", lambda f: f"{f['manifest_mb']:.1f}", None),
    (f"first scan of {FRESH_FILES:,} files, 2 workers: files/s (the scanning process's CPU per file, ms)",
     lambda f: f"{f['fresh_files_per_s']:.0f} ({f['fresh_parent_ms']:.3f})", None),
    (f"first scan of those files: whole, s / one shard of {FRESH_SHARDS}, s",
     lambda f: f"{f['fresh_whole_s']:.1f} / " + ("n/a" if f["fresh_shard_s"] is None else f"{f['fresh_shard_s']:.1f}"),
     None),
]


def markdown(result: dict) -> str:
    videos, f = result["videos"], result["figures"]
    base = result.get("baseline")
    m = result["measurements"]
    lines = [
        *run_heading(
            "Scale", f"scale-{videos}", f"python -m benchmarks.bench_scale --videos {videos}", result,
            f"A tree of {videos:,} hardlinks of {len(m['sources'])} source clips in {NUM_CLASSES} class folders "
            f"({100 - VAL_PER_100} % train: {m['construct']['1']['videos']:,} decodable train videos), the "
            "manifest replicated from the project's scan of the sources and re-scanned; each figure from a fresh "
            f"process (`torch` and DALI imported first). Loaders on the CPU, batch {LOADER_OPTIONS['batch_size']}, "
            f"{LOADER_OPTIONS['clip_len']} frames, one fallback worker. Package measured: "
            f"`{m['package']['commit']}`" + (f"; before: `{base['measurements']['package']['commit']}`, "
                                             f"{base['machine']['date_utc']}" if base else "") + "."),
        "",
        "| step | " + ("before | " if base else "") + "this run | target at this size |",
        "|---|" + ("---|" if base else "") + "---|---|",
    ]
    for label, cell, key in _ROWS:
        goal = ""
        if key is not None:
            value, limit = f[key], target(key, videos)
            unit = TARGETS[key][2]
            goal = f"<= {limit:.3g} {unit}: " + ("met" if value <= limit else "**missed**")
        before = f"{_cell(cell, base['figures'])} | " if base else ""
        lines.append(f"| {label} | {before}{cell(f)} | {goal} |")
    lines += ["", "Targets are the issue's at 650k videos, scaled as fixed + per video x N: "
              + "; ".join(f"{what}: {fixed:g} {unit} + {per * 650_000:.4g} {unit} per 650k videos"
                          for (fixed, per, unit, what) in TARGETS.values()) + "."]
    return "\n".join(lines) + "\n"


def readme_figures(result: dict) -> str:
    """README's figures of a run (and of its baseline), between its ``scale`` markers."""
    videos, f, base = result["videos"], result["figures"], result.get("baseline")
    m = result["measurements"]
    head = (f"Written by `python -m benchmarks.bench_scale --videos {videos}` from its run's JSON "
            f"(`benchmarks/results/scale-{videos}.json`; "
            f"{result['machine']['date_utc']}, {machine_line(result['machine']).split(';')[0]}, package "
            f"`{m['package']['commit']}`" + (f", before: `{base['measurements']['package']['commit']}`" if base else "")
            + f"): {videos:,} videos, {m['construct']['1']['videos']:,} of them in train.")
    lines = [head, "", "| step | " + ("before | " if base else "") + "now | target |",
             "|---|" + ("---|" if base else "") + "---|---|"]
    for label, cell, key in _ROWS:
        goal = ""
        if key is not None:
            goal = f"<= {target(key, videos):.3g} {TARGETS[key][2]}: " + (
                "met" if f[key] <= target(key, videos) else "**missed**")
        lines.append(f"| {label} | " + (f"{_cell(cell, base['figures'])} | " if base else "") + f"{cell(f)} | {goal} |")
    return "\n".join(lines) + "\n"


def _cell(cell, figures: dict) -> str:
    try:
        return cell(figures)
    except (KeyError, TypeError, ValueError):
        return "n/a"


def missed_targets(figures: dict, videos: int) -> list[str]:
    """``"<what>: <value> > <target>"`` for each target (scaled to ``videos``) the figures miss."""
    return [f"{what}: {figures[key]:.3g} > {target(key, videos):.3g} {unit}"
            for key, (_, _, unit, what) in TARGETS.items() if figures[key] > target(key, videos)]
