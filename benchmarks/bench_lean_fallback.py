"""The fallback's workers on a GPU host: CPU time per clip when they normalise, and when the merge does it.

``python -m benchmarks.bench_lean_fallback`` (options: ``--help``) decodes one
plan of the loader's (16 frames at stride 4, 224 crop, float32, Kinetics mean
and std) with two :class:`~fallback.source.FallbackSource`\\ s built as the
loader builds its own (seek hints and frame counts from its manifest,
``--workers`` processes), one per way:

- ``worker``: ``normalize_on="worker"``, what a CPU host runs: each worker
  crops, resizes, flips and normalises, and writes float32 clips;
- ``device``: ``normalize_on="device"``, what a GPU host runs: each worker
  crops, resizes and flips, and writes uint8 pixels; the merge normalises
  them on the GPU (not run here: this measures the workers).

What is measured is the workers' own CPU time (user + system, from
``/proc/PID/stat`` of each worker, before and after a pass over the plan),
per clip, so the machine's other jobs do not count; the wall time of a pass
is recorded too. One untimed pass each (the workers start), then
``--passes`` passes over the plan in rounds of ``--round-groups`` groups: in
each round both ways decode the same groups, one after the other, the order
alternating from round to round, so that a machine whose other jobs come and
go (a shared VM) loads both ways alike. Per way: ms per clip, median
(min-max) of the rounds; per round, the saving (``worker`` minus
``device``), paired.
Bytes per clip, from the shapes the sources write (what crosses PCIe per
fallback clip), and the cost of :func:`fallback.transform.normalize_pixels` on
this CPU in one thread (what the GPU takes over; informational). Writes
``--json`` (default ``benchmarks/results/lean_fallback.json``), its section of
``benchmarks/RESULTS.md`` and, with ``--readme docs/performance.md``, that
page's ``lean-fallback`` section, all from this one run.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time

import torch

from benchmarks.datasets import kinetics_layout, prepare_standard
from benchmarks.machine import machine_info
from benchmarks.options import int_at_least
from benchmarks.report import add_output_options, load_average, publish_run, run_heading
from daliload.loader import DecodeSpec, KineticsDALILoader
from daliload.plan import OutputSpec, Sample
from fallback.source import FallbackSource
from fallback.transform import apply_plan, clip_shape, normalize_pixels, output_dtype, pixel_spec

CHAPTER = "## The fallback on a GPU host: `python -m benchmarks.bench_lean_fallback`"
WAYS = ("worker", "device")
_TICKS = os.sysconf("SC_CLK_TCK")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_lean_fallback",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--datasets", default="h264-gop250,vp9", help="comma-separated (default h264-gop250,vp9)")
    parser.add_argument("--clips", type=int_at_least(1), default=48, help="videos per dataset (default 48)")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per video (default 10)")
    parser.add_argument("--size", default=None, help="WIDTHxHEIGHT replacing 340x256 (tests use tiny frames)")
    parser.add_argument("--crop", type=int_at_least(1), default=224, help="crop size in pixels (default 224)")
    parser.add_argument("--batch-size", type=int_at_least(1), default=8, help="clips per group (default 8)")
    parser.add_argument("--workers", type=int_at_least(1), default=2, help="fallback workers (default 2)")
    parser.add_argument("--passes", type=int_at_least(1), default=8,
                        help="timed passes over the plan of each way (default 8)")
    parser.add_argument("--round-groups", type=int_at_least(1), default=2,
                        help="groups each way decodes per round before the other way's turn (default 2)")
    parser.add_argument("--data-dir", default="bench_out/datasets", help="where the datasets are generated (cached)")
    parser.add_argument("--readme", default=None, help="a page whose 'lean-fallback' markers this run's figures "
                                                        "replace (the published run's go in docs/performance.md)")
    add_output_options(parser, "lean_fallback")
    return parser.parse_args(argv)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far, in seconds (``/proc/PID/stat``, clock ticks)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime: fields 14 and 15 of stat(5)


def one_pass(source: FallbackSource, groups: list[list[Sample]]) -> dict:
    """Every group through ``source``, two in flight; the workers' CPU seconds and the wall time it took."""
    pids = source.worker_pids
    before = {pid: cpu_seconds(pid) for pid in pids}
    started = time.perf_counter()
    tickets, failed, clips, nbytes = [], 0, 0, 0
    for group in groups:
        tickets.append(source.submit(group))
        if len(tickets) > 1:
            decoded = source.collect(tickets.pop(0))
            failed, clips, nbytes = failed + len(decoded.failures), clips + len(decoded.videos), \
                nbytes + decoded.videos.nbytes
    for ticket in tickets:
        decoded = source.collect(ticket)
        failed, clips, nbytes = failed + len(decoded.failures), clips + len(decoded.videos), \
            nbytes + decoded.videos.nbytes
    wall = time.perf_counter() - started
    if source.worker_pids != pids:
        raise RuntimeError(f"a worker was replaced during the pass ({pids} -> {source.worker_pids}): not comparable")
    if failed:
        raise RuntimeError(f"{failed} clip(s) failed to decode: the benchmark wants every clip decoded")
    cpu = sum(cpu_seconds(pid) - before[pid] for pid in pids)
    return {"clips": clips, "cpu_ms_per_clip": 1000 * cpu / clips, "wall_s": wall, "bytes_per_clip": nbytes / clips}


def normalize_cost(samples: list[Sample], output: OutputSpec, count: int = 8) -> float:
    """ms per clip that :func:`~fallback.transform.normalize_pixels` takes on this CPU, one thread (median)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        frames = torch.randint(0, 256, (samples[0].clip_len, 256, 340, 3), dtype=torch.uint8)
        pixels = apply_plan(frames, samples[0], pixel_spec(output))
        out = torch.empty(pixels.shape, dtype=output_dtype(output))
        times = []
        for _ in range(count):
            started = time.perf_counter()
            normalize_pixels(pixels, output, out=out)
            times.append(1000 * (time.perf_counter() - started))
    finally:
        torch.set_num_threads(threads)
    return statistics.median(times)


def measure(root, args: argparse.Namespace) -> dict:
    """Both ways on one plan: an untimed pass each, then rounds of a few groups per way, the order alternating."""
    loader = KineticsDALILoader(root, "train", batch_size=args.batch_size, clip_len=16, frame_stride=4,
                                crop_size=args.crop, device="cpu", last_batch="partial",
                                decode=DecodeSpec(decoder="fallback", fallback_workers=args.workers))
    try:
        samples = [s for batch in loader.plan(1) for s in batch]
        output = loader.output
        sources = {way: FallbackSource(output, workers=args.workers, hint_of=loader.sources.fallback.hint_of,
                                       frames_of=loader.sources.frames_of, normalize_on=way) for way in WAYS}
    finally:
        loader.close()
    groups = [samples[i:i + args.batch_size] for i in range(0, len(samples), args.batch_size)]
    runs: dict[str, list[dict]] = {way: [] for way in WAYS}
    try:
        for source in sources.values():
            source.start()
            one_pass(source, groups)  # untimed: imports, first pages
        rounds = [groups[i:i + args.round_groups] for i in range(0, len(groups), args.round_groups)] * args.passes
        for r, chunk in enumerate(rounds):
            for way in (WAYS if r % 2 == 0 else WAYS[::-1]):
                runs[way].append(one_pass(sources[way], chunk))
    finally:
        for source in sources.values():
            source.close()
    out: dict = {"clips": len(samples), "rounds": len(rounds),
                 "output": {"size": list(output.size), "dtype": output.dtype, "layout": output.layout}}
    for way, rows in runs.items():
        ms = [row["cpu_ms_per_clip"] for row in rows]
        written = sources[way].written
        shape_bytes = math.prod(clip_shape(samples[0].clip_len, written)) * output_dtype(written).itemsize
        if any(row["bytes_per_clip"] != shape_bytes for row in rows):
            raise RuntimeError(f"{way}: the groups' bytes per clip are not the shapes' {shape_bytes}")
        out[way] = {"cpu_ms_per_clip": statistics.median(ms), "min": min(ms), "max": max(ms), "runs": ms,
                    "wall_s": [row["wall_s"] for row in rows], "dtype": written.dtype, "bytes_per_clip": shape_bytes}
    saved = [w - d for w, d in zip(out["worker"]["runs"], out["device"]["runs"])]
    out["saved_ms_per_clip"] = {"median": statistics.median(saved), "min": min(saved), "max": max(saved),
                                "runs": saved}
    out["normalize_pixels_cpu_ms_per_clip"] = normalize_cost(samples, output)
    return out


def _ms(row: dict, key: str = "cpu_ms_per_clip") -> str:
    return f"{row[key]:.1f} ({row['min']:.1f} to {row['max']:.1f})"


def _saved(saved: dict) -> str:
    """The paired saving: median, quartiles, range, and how many rounds saved anything (a noisy VM's spread)."""
    runs = saved["runs"]
    q1, _, q3 = statistics.quantiles(runs, n=4) if len(runs) > 1 else (runs[0],) * 3
    return (f"{saved['median']:.1f} (quartiles {q1:.1f} to {q3:.1f}, range {saved['min']:.1f} to {saved['max']:.1f}; "
            f"{sum(x > 0 for x in runs)} of {len(runs)} rounds > 0)")


def markdown(result: dict) -> str:
    s = result["settings"]
    lines = [
        *run_heading(
            "Lean fallback", "lean_fallback", "python -m benchmarks.bench_lean_fallback", result,
            f"Two FallbackSources as the loader builds them ({s['workers']} workers, the manifest's seek hints), "
            f"{s['clips']} videos of {s['duration_s']:g} s per dataset, one 16-frame window at stride 4 per clip, "
            f"{s['crop']} crop, float32 output, groups of {s['batch_size']}; one untimed pass each, then "
            f"{s['passes']} passes over the plan in rounds of {s['round_groups']} groups per way, the order "
            "alternating. Worker CPU time (user + system, `/proc/PID/stat`) per clip: median (min-max) of the "
            "rounds; the saving is paired per round."),
        "",
        "| dataset | clips x passes (rounds) | workers normalise (CPU host), ms | merge normalises (GPU host), ms | "
        "saved per clip, ms | bytes per clip: float32 / uint8 | `normalize_pixels` on this CPU, ms per clip "
        "(one thread, into memory already mapped) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, row in result["datasets"].items():
        saved = row["saved_ms_per_clip"]
        lines.append(f"| `{name}` | {row['clips']} x {result['settings']['passes']} ({row['rounds']}) | "
                     f"{_ms(row['worker'])} | {_ms(row['device'])} | "
                     f"{_saved(saved)} | "
                     f"{row['worker']['bytes_per_clip']:,} / {row['device']['bytes_per_clip']:,} | "
                     f"{row['normalize_pixels_cpu_ms_per_clip']:.2f} |")
    lines += ["", "Not measured here (no GPU): what the normalise costs on the GPU stream, and the copy of the "
              "uint8 clips over PCIe; the GPU run must time both (`benchmarks/gpu/merge_time.py` times the merge)."]
    return "\n".join(lines) + "\n"


def readme_figures(result: dict) -> str:
    parts = []
    for name, row in result["datasets"].items():
        w, d, saved = row["worker"], row["device"], row["saved_ms_per_clip"]
        parts.append(f"on `{name}` a worker spends {_ms(w)} ms of CPU per clip normalising and {_ms(d)} leaving "
                     f"it to the merge; saved per clip, paired by round: {_saved(saved)} ms")
    m, s = result["machine"], result["settings"]
    first = next(iter(result["datasets"].values()))
    start, end = result["load_average"]
    return (f"Written by `python -m benchmarks.bench_lean_fallback` from its run's JSON "
            f"(`benchmarks/results/lean_fallback.json`; {m['date_utc']}, {s['workers']} workers, load average "
            f"{start} at the start and {end} at the end; worker CPU time per clip, median (min-max) of the "
            f"rounds of {s['round_groups'] * s['batch_size']} clips per way): " + "; ".join(parts)
            + f". A clip crosses to the GPU as {first['device']['bytes_per_clip']:,} bytes of uint8 instead of "
            f"{first['worker']['bytes_per_clip']:,} of float32; `normalize_pixels` on this CPU takes "
            f"{first['normalize_pixels_cpu_ms_per_clip']:.2f} ms per clip in one thread into memory already mapped "
            "(the work the GPU takes over; a worker also writes a quarter of the bytes into shared memory).\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = [n for n in args.datasets.split(",") if n]
    started = load_average()
    datasets = {}
    for dataset in prepare_standard(args.datasets, clips=args.clips, duration_s=args.duration, size=args.size,
                                    data_dir=args.data_dir):
        datasets[dataset.spec.name] = measure(kinetics_layout(dataset), args)
    result = {"name": "lean_fallback", "machine": machine_info(args.machine),
              "load_average": [started, load_average()],
              "settings": {"datasets": names, "clips": args.clips, "duration_s": args.duration, "crop": args.crop,
                           "batch_size": args.batch_size, "workers": args.workers, "passes": args.passes,
                           "round_groups": args.round_groups},
              "datasets": datasets}
    text = markdown(result)
    publish_run(result, args, text, chapter=CHAPTER, marker="lean-fallback", figures=readme_figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
