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

``python -m benchmarks.measure --serve JOB.json`` is the same measurement run
epoch by epoch on request, so that the orchestrator can interleave loaders
(:mod:`benchmarks.interleave`): the process builds the adapter, answers one
JSON line (``{"status": "ready", "setup_s": ...}``, or ``unavailable`` /
``failed`` with the reason, and exits), then for each line ``epoch`` on its
stdin runs one epoch and answers ``{"status": "ok", "run": RunFigures}`` (or
``failed``, and exits), and for ``stop`` closes the adapter and exits. The
answers go to the stdout it started with; everything the libraries print
(file descriptor 1 included) goes to stderr, the log.
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


class Measurement:
    """One job's loader, built and run epoch by epoch: what a one-shot run and a served process share.

    After construction, :attr:`reason` is why it cannot run here (then nothing is built), else None.
    """

    def __init__(self, job: dict) -> None:
        from benchmarks.datasets import load_dataset
        from benchmarks.loaders import LoaderConfig, load_adapter
        from benchmarks.task import read_plan

        self.dataset = load_dataset(job["dataset"])
        self.task, self.samples = read_plan(job["plan"])
        self.config = LoaderConfig(task=self.task, workers=int(job["workers"]), device=job["device"])
        self.cls = load_adapter(job["adapter"])
        # The orchestrator skips the probe once the loader has run in this benchmark
        # (torchcodec's import alone takes seconds).
        self.reason = self.cls.skip_reason(self.dataset.spec, self.config) or (
            self.cls.probe(self.config) if job.get("probe", True) else None)
        self.expected = len(self.dataset.videos) if job.get("kind") == "ceiling" else len(self.samples)
        self.adapter = self.monitor = None
        self.setup_s: float | None = None

    def build(self) -> None:
        """Build the adapter (timed as set-up) and the resource monitor."""
        from benchmarks.metrics import ResourceMonitor

        start = time.perf_counter()
        self.adapter = self.cls(self.dataset, self.samples, self.config)
        self.setup_s = time.perf_counter() - start
        self.monitor = ResourceMonitor(gpu=self.config.device == "cuda")

    def epoch(self) -> RunFigures:
        """One epoch over the whole plan.

        Raises:
            ValueError: the epoch delivered another number of clips than the plan has.
        """
        wall, clips, decoded, resources = _epoch(self.adapter, self.cls.name, self.config.device,
                                                 self.task.output_shape, self.monitor)
        if clips != self.expected:
            raise ValueError(f"{self.cls.name}: an epoch delivered {clips} clips, the plan has {self.expected}")
        return RunFigures(wall_s=wall, clips=clips, frames_decoded=decoded, cpu_s=resources.cpu_s,
                          peak_rss_mb=resources.peak_rss_mb, gpu_mem_peak_mb=resources.gpu_mem_peak_mb,
                          gpu_mem_base_mb=resources.gpu_mem_base_mb, nvdec_util_pct=resources.nvdec_util_pct,
                          gpu_util_pct=resources.gpu_util_pct)

    def close(self) -> None:
        if self.monitor is not None:
            self.monitor.close()
        if self.adapter is not None:
            self.adapter.close()

    def result(self, warmups: list[float], runs: list[RunFigures]) -> MeasureResult:
        """The measurement's result; a GPU row meant for NVDEC whose runs never used it is failed."""
        from benchmarks.metrics import nvdec_failure

        scope, source = self.monitor.scope, self.monitor.gpu_source
        if self.config.device == "cuda" and self.cls.uses_nvdec:
            # A "DALI" row whose runs never used the decoder engines decoded on the CPU or not at all.
            why = nvdec_failure(runs, source)
            if why is not None:
                return MeasureResult(status="failed", reason=why, setup_s=self.setup_s, warmup_wall_s=tuple(warmups),
                                     runs=tuple(runs), monitor_scope=scope, gpu_source=source)
        return MeasureResult(status="ok", setup_s=self.setup_s, warmup_wall_s=tuple(warmups), runs=tuple(runs),
                             monitor_scope=scope, gpu_source=source)


def measure(job: dict) -> MeasureResult:
    """Run one job (see the module docstring) and return its result."""
    measurement = Measurement(job)
    if measurement.reason is not None:
        return MeasureResult(status="unavailable", reason=measurement.reason)
    warmups: list[float] = []
    runs: list[RunFigures] = []
    try:
        measurement.build()
        for index in range(int(job["warmup"]) + int(job["runs"])):
            run = measurement.epoch()
            if index < int(job["warmup"]):
                warmups.append(run.wall_s)
            else:
                runs.append(run)
    finally:
        measurement.close()
    return measurement.result(warmups, runs)


def _failure(err: BaseException) -> str:
    message = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return f"{type(err).__name__}: {message}"[:500]


def serve(job: dict, commands, answer) -> int:
    """The served measurement (see the module docstring): ``commands`` yields lines, ``answer(dict)`` replies."""
    try:
        measurement = Measurement(job)
        if measurement.reason is not None:
            answer({"status": "unavailable", "reason": measurement.reason})
            return 0
        measurement.build()
    except Exception as err:  # the measurement boundary: report the failure, the run goes on
        traceback.print_exc()
        answer({"status": "failed", "reason": _failure(err)})
        return 0
    answer({"status": "ready", "setup_s": measurement.setup_s, "monitor_scope": measurement.monitor.scope,
            "gpu_source": measurement.monitor.gpu_source})
    try:
        for line in commands:
            if line.strip() == "stop":
                break
            if line.strip() != "epoch":
                answer({"status": "failed", "reason": f"unknown command {line.strip()!r}"})
                return 1
            try:
                run = measurement.epoch()
            except Exception as err:  # the measurement boundary, as above
                traceback.print_exc()
                answer({"status": "failed", "reason": _failure(err)})
                return 0
            answer({"status": "ok", "run": asdict(run)})
    finally:
        measurement.close()
    return 0


def _serve_main(job_path: str) -> int:
    import os

    with open(job_path, encoding="utf-8") as f:
        job = json.load(f)
    # Answers go to the stdout this process started with; what anything else prints, native libraries
    # included, goes to stderr (the log), so it cannot break an answer.
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def answer(message: dict) -> None:
        replies.write(json.dumps(message) + "\n")
        replies.flush()

    return serve(job, sys.stdin, answer)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] == "--serve":
        return _serve_main(argv[1])
    if len(argv) != 1:
        print("usage: python -m benchmarks.measure [--serve] JOB.json", file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as f:
        job = json.load(f)
    try:
        result = measure(job)
    except Exception as err:  # the measurement boundary: record the failure, the run goes on
        traceback.print_exc()
        result = MeasureResult(status="failed", reason=_failure(err))
    with open(job["out"], "w", encoding="utf-8") as f:
        json.dump(asdict(result), f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
