"""What a measurement records besides time: memory, CPU, GPU; and how runs are summarised.

:class:`ResourceMonitor` samples, on a background thread, the resident memory
of the measuring process and all its descendants (DataLoader workers, DALI
has none) and, on a GPU run, the device's memory and decoder (NVDEC) load.
CPU time is read at the start and end of each timed epoch:

    cores busy = (CPU seconds of the process tree during the epoch) / (epoch wall seconds)

"Process tree" CPU counts the live processes' user+system time plus what their
reaped children used. Summed RSS counts pages shared between processes (the
torch libraries every spawned worker maps) once per process, as ``top`` would.
Without psutil only this process and its reaped children are seen
(``scope`` says which).
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import threading
from dataclasses import dataclass
from typing import Sequence

_MB = 1024 * 1024


@dataclass(frozen=True)
class Summary:
    """Median and spread of one figure over the timed runs.

    Attributes:
        median, low, high: over the runs.
        spread_pct: ``(high - low) / 2 / median * 100``, 0 for one run.
        n: number of runs.
    """

    median: float
    low: float
    high: float
    spread_pct: float
    n: int


def summarize(values: Sequence[float]) -> Summary | None:
    """:class:`Summary` of ``values``; None when there are none."""
    values = [float(v) for v in values]
    if not values:
        return None
    median = statistics.median(values)
    low, high = min(values), max(values)
    spread = (high - low) / 2 / median * 100 if median else 0.0
    return Summary(median=median, low=low, high=high, spread_pct=spread, n=len(values))


@dataclass(frozen=True)
class RunResources:
    """Resources of one timed epoch.

    Attributes:
        cpu_s: CPU seconds of the process tree.
        peak_rss_mb: highest summed RSS seen, MiB.
        gpu_mem_peak_mb: highest device memory in use, MiB (whole device, all processes).
        gpu_mem_base_mb: device memory in use when the monitor started, MiB.
        nvdec_util_pct: mean decoder utilisation over the epoch, percent.
        gpu_util_pct: mean SM utilisation over the epoch, percent.
        samples: monitor samples taken during the epoch.
    """

    cpu_s: float
    peak_rss_mb: float
    gpu_mem_peak_mb: float | None = None
    gpu_mem_base_mb: float | None = None
    nvdec_util_pct: float | None = None
    gpu_util_pct: float | None = None
    samples: int = 0


def physical_gpu(index: int, visible: str | None = None) -> str:
    """What NVML and ``nvidia-smi -i`` call CUDA device ``index`` of this process: a physical index or a UUID.

    CUDA numbers the devices ``CUDA_VISIBLE_DEVICES`` lists, in its order;
    NVML and ``nvidia-smi`` ignore it and number every GPU of the machine. With
    ``CUDA_VISIBLE_DEVICES=2,3`` a rank's ``cuda:0`` is physical GPU 2; read by
    index 0, its NVDEC figures would be another rank's. Entries may be indices
    or UUIDs (``GPU-...``, ``MIG-...``).

    >>> physical_gpu(0, "2,3"), physical_gpu(1, " GPU-5f2e ,GPU-77aa"), physical_gpu(1, None)
    ('2', 'GPU-77aa', '1')

    Raises:
        ValueError: ``index`` is not among the visible devices.
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    if visible is None or not visible.strip():
        return str(index)
    entries = [entry.strip() for entry in visible.split(",")]
    entries = entries[:next((k for k, e in enumerate(entries) if not e or e.startswith("-")), len(entries))]
    if not 0 <= index < len(entries):
        raise ValueError(f"CUDA device {index} is not among CUDA_VISIBLE_DEVICES={visible!r}")
    return entries[index]


class _GpuSampler:
    """Device memory and decoder/SM utilisation via NVML (pynvml), else ``nvidia-smi -lms``, of CUDA device
    ``index`` as this process sees it (:func:`physical_gpu`)."""

    def __init__(self, index: int, interval_s: float) -> None:
        self.source = "none"
        self._nvml = None
        self._smi: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._latest: tuple[float, float, float] | None = None
        gpu = physical_gpu(index)
        try:
            import pynvml
        except ImportError as err:
            reason = f"pynvml not installed ({err})"
        else:
            try:
                pynvml.nvmlInit()
                self._handle = (pynvml.nvmlDeviceGetHandleByIndex(int(gpu)) if gpu.isdigit()
                                else pynvml.nvmlDeviceGetHandleByUUID(gpu))
                self._nvml = pynvml
                self.source = "nvml"
                return
            except pynvml.NVMLError as err:
                reason = f"NVML: {err}"
        smi = shutil.which("nvidia-smi")
        if smi is None:
            self.source = f"none ({reason}; no nvidia-smi)"
            return
        self._smi = subprocess.Popen(
            [smi, "--query-gpu=memory.used,utilization.decoder,utilization.gpu", "--format=csv,noheader,nounits",
             "-lms", str(max(50, int(interval_s * 1000))), "-i", gpu],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.source = "nvidia-smi"
        threading.Thread(target=self._read_smi, daemon=True).start()

    def _read_smi(self) -> None:
        assert self._smi is not None and self._smi.stdout is not None
        for line in self._smi.stdout:
            parts = [p.strip() for p in line.split(",")]
            try:
                values = tuple(float(p) for p in parts[:3])
            except ValueError:  # "[N/A]" on GPUs that do not report a field
                continue
            if len(values) == 3:
                with self._lock:
                    self._latest = values  # type: ignore[assignment]

    def _nvml_value(self, read) -> float | None:
        try:
            return float(read(self._handle))
        except self._nvml.NVMLError:  # a GPU (a MIG slice, say) that does not report this figure
            return None

    def read(self) -> tuple[float, float | None, float | None] | None:
        """``(memory used MiB, decoder %, SM %)`` now (a figure the GPU does not report: None), or None."""
        if self._nvml is not None:
            nvml = self._nvml
            memory = self._nvml_value(lambda h: nvml.nvmlDeviceGetMemoryInfo(h).used / _MB)
            if memory is None:
                return None
            return (memory, self._nvml_value(lambda h: nvml.nvmlDeviceGetDecoderUtilization(h)[0]),
                    self._nvml_value(lambda h: nvml.nvmlDeviceGetUtilizationRates(h).gpu))
        with self._lock:
            return self._latest

    def close(self) -> None:
        if self._smi is not None:
            self._smi.terminate()
            self._smi.wait(timeout=5)
        if self._nvml is not None:
            self._nvml.nvmlShutdown()


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None


def nvdec_failure(runs: Sequence, gpu_source: str | None) -> str | None:
    """Why a row that should decode on NVDEC must be marked failed, or None when NVDEC was seen working.

    ``runs`` are the timed epochs (objects or dicts with ``nvdec_util_pct``:
    the mean NVML decoder utilisation of the epoch). A row whose decoder
    utilisation is 0 in every run decoded nothing on NVDEC (DALI fell back, or
    decoded on the CPU), and one with no decoder figure at all cannot show it
    did: neither may be reported as a DALI/NVDEC figure.
    """
    values = [run["nvdec_util_pct"] if isinstance(run, dict) else run.nvdec_util_pct for run in runs]
    measured = [v for v in values if v is not None]
    if not measured:
        return (f"no NVDEC activity shown: the decoder utilisation was not sampled "
                f"(GPU monitor: {gpu_source or 'none'}; install nvidia-ml-py)")
    if max(measured) <= 0:
        return f"no NVDEC activity: decoder utilisation 0 % in all {len(measured)} timed runs ({gpu_source})"
    return None


def _cuda_index() -> int:
    """NVML index of the CUDA device torch uses (NVML ignores CUDA_VISIBLE_DEVICES)."""
    import torch

    current = torch.cuda.current_device()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if entries and all(e.isdigit() for e in entries) and current < len(entries):
        return int(entries[current])
    return current


class ResourceMonitor:
    """Samples memory (and GPU) in the background; call :meth:`begin_run` / :meth:`end_run` around each epoch.

    Args:
        interval_s: sampling period in seconds.
        gpu: also sample the CUDA device torch uses.
    """

    def __init__(self, *, interval_s: float = 0.05, gpu: bool = False) -> None:
        try:
            import psutil

            self._process = psutil.Process()
            self._psutil = psutil
            self.scope = "process tree (psutil)"
        except ImportError:
            self._process = None
            self._psutil = None
            self.scope = "this process and reaped children only (no psutil)"
        self._interval = interval_s
        self._gpu = _GpuSampler(_cuda_index(), interval_s) if gpu else None
        self.gpu_source = self._gpu.source if self._gpu else None
        self._lock = threading.Lock()
        self._peak_rss = 0.0
        self._gpu_peak: float | None = None
        self._gpu_samples: list[tuple[float | None, float | None]] = []
        self._samples = 0
        self._cpu_start = 0.0
        self._stop = threading.Event()
        # Sampled only between begin_run and end_run: an idle loader of an interleaved group, waiting for
        # its turn, must not spend the cores the running one is timed on.
        self._active = threading.Event()
        first = self._gpu.read() if self._gpu else None
        self.gpu_base_mb = first[0] if first else None
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _tree(self) -> list:
        processes = [self._process]
        try:
            processes += self._process.children(recursive=True)
        except self._psutil.NoSuchProcess:
            pass
        return processes

    def rss_mb(self) -> float:
        if self._psutil is None:
            import resource

            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
        total = 0
        for process in self._tree():
            try:
                total += process.memory_info().rss
            except (self._psutil.NoSuchProcess, self._psutil.AccessDenied):
                continue  # a worker that exited between listing and reading
        return total / _MB

    def cpu_s(self) -> float:
        if self._psutil is None:
            import resource

            own = resource.getrusage(resource.RUSAGE_SELF)
            children = resource.getrusage(resource.RUSAGE_CHILDREN)
            return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
        total = 0.0
        for process in self._tree():
            try:
                t = process.cpu_times()
            except (self._psutil.NoSuchProcess, self._psutil.AccessDenied):
                continue
            total += t.user + t.system + t.children_user + t.children_system
        return total

    def _sample_gpu(self) -> None:
        reading = self._gpu.read() if self._gpu else None
        if reading is not None:
            with self._lock:
                self._gpu_peak = max(self._gpu_peak or 0.0, reading[0])
                self._gpu_samples.append((reading[1], reading[2]))

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            if not self._active.is_set():
                continue
            rss = self.rss_mb()
            self._sample_gpu()
            with self._lock:
                self._samples += 1
                self._peak_rss = max(self._peak_rss, rss)

    def begin_run(self) -> None:
        with self._lock:
            self._peak_rss = self.rss_mb()
            self._gpu_peak = None
            self._gpu_samples = []
            self._samples = 0
        self._cpu_start = self.cpu_s()
        self._active.set()

    def end_run(self) -> RunResources:
        self._active.clear()
        cpu = self.cpu_s() - self._cpu_start
        rss = self.rss_mb()
        self._sample_gpu()  # NVML averages over its last period: this reading covers the epoch's end
        with self._lock:
            peak = max(self._peak_rss, rss)
            decoder = _mean([s[0] for s in self._gpu_samples])
            sm = _mean([s[1] for s in self._gpu_samples])
            return RunResources(cpu_s=cpu, peak_rss_mb=peak, gpu_mem_peak_mb=self._gpu_peak,
                                gpu_mem_base_mb=self.gpu_base_mb, nvdec_util_pct=decoder, gpu_util_pct=sm,
                                samples=self._samples)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        if self._gpu is not None:
            self._gpu.close()


def verdict(ratio: dict, target: float) -> str:
    """A target met or missed only when every round's ratio (``ratio["min"]`` .. ``ratio["max"]``) is on one
    side of it; otherwise not settled."""
    if ratio["min"] >= target:
        return "met"
    if ratio["max"] < target:
        return "**missed**"
    return "not settled (the rounds straddle it)"
