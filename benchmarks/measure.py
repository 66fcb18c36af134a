"""One measurement, in a fresh process: ``python -m benchmarks.measure JOB.json``.

The orchestrator (:mod:`benchmarks.harness`) starts one such process per
(loader, dataset, workers), so each loader gets a clean interpreter (no
library loaded by an earlier loader, no memory left over) and its peak RSS is
its own. The job file says what to run; the result file gets a
:class:`MeasureResult` as JSON::

    job = {"adapter": "blog-pyav", "kind": "loader", "dataset": "<dataset folder>",
           "plan": "<plan.json>", "workers": 2, "device": "cpu", "warmup": 1, "runs": 3,
           "probe": True, "out": "<result.json>"}

Each epoch (warm-up ones too) runs the adapter over the whole plan; only the
``runs`` epochs after the warm-up are reported. A loader that cannot run here
is reported ``unavailable`` with its reason; one that raises is ``failed`` with
the error (and the traceback on stderr, which the orchestrator keeps in a log).
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Literal

Status = Literal["ok", "unavailable", "failed", "skipped"]


@dataclass(frozen=True)
class RunFigures:
    """One timed epoch.

    Attributes:
        wall_s: seconds from asking for the first batch to having the last one
            (on the run's device, synchronised).
        clips: clips delivered (files, for a ceiling).
        frames_decoded: frames the loader reports decoding, None if it cannot tell.
        cpu_s, peak_rss_mb, gpu_mem_peak_mb, gpu_mem_base_mb, nvdec_util_pct,
            gpu_util_pct: see :class:`benchmarks.metrics.RunResources`.
    """

    wall_s: float
    clips: int
    frames_decoded: int | None
    cpu_s: float
    peak_rss_mb: float
    gpu_mem_peak_mb: float | None = None
    gpu_mem_base_mb: float | None = None
    nvdec_util_pct: float | None = None
    gpu_util_pct: float | None = None


@dataclass(frozen=True)
class MeasureResult:
    """What one measurement process reports.

    Attributes:
        status: ``ok``, ``unavailable`` (cannot run here), ``failed`` (raised).
        reason: why, for anything but ``ok``.
        setup_s: seconds to build the loader (not in any epoch).
        warmup_wall_s: wall seconds of each warm-up epoch.
        runs: the timed epochs.
        monitor_scope: what the memory/CPU figures cover.
        gpu_source: where GPU figures come from (``nvml``, ``nvidia-smi``), None on CPU.
    """

    status: Status
    reason: str | None = None
    setup_s: float | None = None
    warmup_wall_s: tuple[float, ...] = ()
    runs: tuple[RunFigures, ...] = field(default_factory=tuple)
    monitor_scope: str | None = None
    gpu_source: str | None = None


def _check_batch(batch, output_shape: tuple[int, ...], adapter: str) -> None:
    videos = batch.videos
    if videos is None:
        return
    shape = tuple(videos.shape)
    if shape[1:] != output_shape or shape[0] != batch.num_clips:
        raise ValueError(f"{adapter}: batch has shape {shape}, the task asks for "
                         f"({batch.num_clips}, {', '.join(map(str, output_shape))})")


def _epoch(adapter, name: str, device: str, output_shape, monitor) -> tuple[float, int, int | None, object]:
    if device == "cuda":  # a CPU ceiling never needs torch: its process starts seconds faster
        import torch

    clips = 0
    decoded: int | None = 0
    monitor.begin_run()
    start = time.perf_counter()
    for batch in adapter.epoch():
        _check_batch(batch, output_shape, name)
        if device == "cuda" and batch.videos is not None and batch.videos.device.type != "cuda":
            # What a training loop does with CPU batches: asynchronous when they are pinned (DataLoader peers).
            batch.videos.to("cuda", non_blocking=True)
        clips += batch.num_clips
        decoded = None if decoded is None or batch.frames_decoded is None else decoded + batch.frames_decoded
    if device == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - start
    return wall, clips, decoded, monitor.end_run()


def measure(job: dict) -> MeasureResult:
    """Run one job (see the module docstring) and return its result."""
    from benchmarks.datasets import load_dataset
    from benchmarks.loaders import LoaderConfig, load_adapter
    from benchmarks.metrics import ResourceMonitor, nvdec_failure
    from benchmarks.task import read_plan

    dataset = load_dataset(job["dataset"])
    task, samples = read_plan(job["plan"])
    config = LoaderConfig(task=task, workers=int(job["workers"]), device=job["device"])
    cls = load_adapter(job["adapter"])
    # The orchestrator skips the probe once the loader has run in this benchmark
    # (torchcodec's import alone takes seconds).
    reason = cls.skip_reason(dataset.spec, config) or (cls.probe(config) if job.get("probe", True) else None)
    if reason is not None:
        return MeasureResult(status="unavailable", reason=reason)
    is_ceiling = job.get("kind") == "ceiling"
    expected = len(dataset.videos) if is_ceiling else len(samples)

    start = time.perf_counter()
    adapter = cls(dataset, samples, config)
    setup_s = time.perf_counter() - start
    monitor = ResourceMonitor(gpu=config.device == "cuda")
    warmups: list[float] = []
    runs: list[RunFigures] = []
    try:
        for index in range(int(job["warmup"]) + int(job["runs"])):
            wall, clips, decoded, resources = _epoch(adapter, cls.name, config.device, task.output_shape, monitor)
            if clips != expected:
                raise ValueError(f"{cls.name}: an epoch delivered {clips} clips, the plan has {expected}")
            if index < int(job["warmup"]):
                warmups.append(wall)
                continue
            runs.append(RunFigures(
                wall_s=wall, clips=clips, frames_decoded=decoded, cpu_s=resources.cpu_s,
                peak_rss_mb=resources.peak_rss_mb, gpu_mem_peak_mb=resources.gpu_mem_peak_mb,
                gpu_mem_base_mb=resources.gpu_mem_base_mb, nvdec_util_pct=resources.nvdec_util_pct,
                gpu_util_pct=resources.gpu_util_pct))
    finally:
        monitor.close()
        adapter.close()
    if config.device == "cuda" and cls.uses_nvdec:
        # A "DALI" row whose runs never used the decoder engines decoded on the CPU or not at all.
        why = nvdec_failure(runs, monitor.gpu_source)
        if why is not None:
            return MeasureResult(status="failed", reason=why, setup_s=setup_s, warmup_wall_s=tuple(warmups),
                                 runs=tuple(runs), monitor_scope=monitor.scope, gpu_source=monitor.gpu_source)
    return MeasureResult(status="ok", setup_s=setup_s, warmup_wall_s=tuple(warmups), runs=tuple(runs),
                         monitor_scope=monitor.scope, gpu_source=monitor.gpu_source)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m benchmarks.measure JOB.json", file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as f:
        job = json.load(f)
    try:
        result = measure(job)
    except Exception as err:  # the measurement boundary: record the failure, the run goes on
        traceback.print_exc()
        message = str(err).strip().splitlines()[0] if str(err).strip() else ""
        result = MeasureResult(status="failed", reason=f"{type(err).__name__}: {message}"[:500])
    with open(job["out"], "w", encoding="utf-8") as f:
        json.dump(asdict(result), f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
