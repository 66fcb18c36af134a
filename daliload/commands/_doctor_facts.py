"""What ``daliload doctor`` reads off the machine (:class:`Machine`), what it is asked about (:class:`Workload`),
the shape of a verdict (:class:`Check`), and the checks that are arithmetic on those facts (memory, cores).
Never raises for a missing GPU, driver, torch or DALI.
"""

from __future__ import annotations

import ctypes
import math
import importlib.metadata
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from daliload.options import DecodeSpec
from daliload.plan import OUTPUT_DTYPES
from daliload.prescreen.gpus import DEFAULT_GPU_GENERATION, GPU_MODELS, GpuTarget, model_from_name
from daliload.runtime import usable_cores
from daliload.runtime._processes import mp_context

Status = Literal["ok", "warn", "fail", "skip"]
#: /dev/shm below this with several GPU ranks on a machine: NCCL's troubleshooting page asks for 1 GB in docker.
NCCL_SHM_BYTES = 1 << 30
#: The fallback's buffers above this share of the machine's memory: warn (the model and the data need the rest).
SHARED_WARN_FRACTION = 0.25
_GB = 1e9
#: DALI wheel -> (extra, oldest driver, CUDA driver API version it needs), as README "Install" says.
DALI_WHEELS = {"nvidia-dali-cuda130": ("cuda13", 580, 13000), "nvidia-dali-cuda120": ("cuda12", 525, 12000)}


@dataclass(frozen=True)
class Check:
    """One check's verdict.

    Attributes:
        name: one of :data:`CHECKS`.
        status: ``"ok"``, ``"warn"``, ``"fail"`` or ``"skip"``.
        detail: what was found (versions, sizes, counts), and why for a skip.
        fix: what to do, for a warn or a fail; ``""`` otherwise.
    """

    name: str
    status: Status
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class Machine:
    """What the checks are decided from, gathered once (:func:`gather`); tests replace fields to fake a GPU.

    Attributes:
        python: ``"3.11.7"``.
        torch: torch's version, or None when it does not import.
        torch_cuda: the CUDA version torch was built for (``"12.8"``), None for a CPU build.
        torch_archs: the GPU architectures torch has kernels for (``"sm_90"``, ``"compute_90"``).
        gpus: GPUs visible (torch's count, else nvidia-smi's).
        gpu_name: GPU 0's name as the driver reports it, or None.
        compute_capability: GPU 0's ``(major, minor)``, or None.
        driver: the driver's version (``"580.65.06"``), or None without one.
        driver_cuda: the CUDA driver API version (``cuDriverGetVersion``: 12040 is 12.4), or None.
        dali: the installed DALI wheel's name (``"nvidia-dali-cuda130"``) or None.
        dali_version: its version, or None.
        cores: CPU cores this process may run on.
        memory_bytes: memory this machine or container may use (the cgroup's limit, else RAM), or None.
        shm_bytes: size of ``/dev/shm``, or None when there is none.
        memfd: whether the fallback's buffers are ``memfd`` files (Linux).
        start_method: how daliload starts processes.
    """

    python: str
    torch: str | None
    torch_cuda: str | None
    torch_archs: tuple[str, ...]
    gpus: int
    gpu_name: str | None
    compute_capability: tuple[int, int] | None
    driver: str | None
    driver_cuda: int | None
    dali: str | None
    dali_version: str | None
    cores: int
    memory_bytes: int | None
    shm_bytes: int | None
    memfd: bool
    start_method: str

    @property
    def gpu(self) -> GpuTarget | None:
        """GPU 0 as the routes know it (:mod:`daliload.prescreen.gpus`), or None without a GPU."""
        if not self.gpus or not self.gpu_name:
            return None
        model = model_from_name(self.gpu_name)
        if model is None:
            return GpuTarget(None, DEFAULT_GPU_GENERATION, assumed=True,
                             detail=f"{self.gpu_name!r} is not a model in daliload.prescreen.gpus")
        return GpuTarget(model, GPU_MODELS[model], detail=f"reported as {self.gpu_name!r}")


@dataclass(frozen=True)
class Workload:
    """The training job the checks size memory and cores for (the loader's defaults unless given).

    Attributes:
        batch_size: clips per batch (``KineticsDALILoader(batch_size=)``, default 32).
        clip_len: frames per clip (default 16).
        crop_size: output side in pixels (default 224).
        fallback_workers: PyAV processes per rank (``DecodeSpec.fallback_workers``, default 2).
        local_ranks: training processes on this machine (default ``LOCAL_WORLD_SIZE``, else the GPUs, else 1).
        dtype: output dtype (``OutputSpec.dtype``, default ``"float32"``).
    """

    batch_size: int = 32
    clip_len: int = 16
    crop_size: int = 224
    fallback_workers: int = DecodeSpec().fallback_workers
    local_ranks: int = 1
    dtype: str = "float32"

    def __post_init__(self) -> None:
        for name in ("batch_size", "clip_len", "crop_size", "local_ranks"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not isinstance(self.fallback_workers, int) or self.fallback_workers < 0:
            raise ValueError(f"fallback_workers must be an integer >= 0, got {self.fallback_workers!r}")
        if self.dtype not in OUTPUT_DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(OUTPUT_DTYPES)}, got {self.dtype!r}")


# --- facts -----------------------------------------------------------------------------------------


def _torch_facts() -> dict:
    try:
        import torch
    except ImportError:
        return {"torch": None, "torch_cuda": None, "torch_archs": (), "gpus": 0, "gpu_name": None,
                "compute_capability": None}
    facts = {"torch": torch.__version__, "torch_cuda": torch.version.cuda, "torch_archs": (), "gpus": 0,
             "gpu_name": None, "compute_capability": None}
    if torch.version.cuda is not None and torch.cuda.is_available():
        facts.update(torch_archs=tuple(torch.cuda.get_arch_list()), gpus=torch.cuda.device_count(),
                     gpu_name=torch.cuda.get_device_name(0),
                     compute_capability=tuple(torch.cuda.get_device_capability(0)))
    return facts


def _nvidia_smi() -> tuple[list[str], str | None]:
    """GPU names and the driver version nvidia-smi reports; ``([], None)`` without it."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return [], None
    rows = [line.rsplit(",", 1) for line in out.strip().splitlines() if "," in line]
    return [name.strip() for name, _ in rows], (rows[0][1].strip() if rows else None)


def _driver_cuda() -> int | None:
    """The CUDA driver API version (``cuDriverGetVersion``), or None without ``libcuda``."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    version = ctypes.c_int()
    return version.value if cuda.cuDriverGetVersion(ctypes.byref(version)) == 0 and version.value else None


def _dali_wheel() -> tuple[str | None, str | None]:
    for name in DALI_WHEELS:
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None, None


def _memory_bytes() -> int | None:
    """The memory this process's container may use: the cgroup's limit where one is set, else the RAM."""
    limits = []
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    limits.append(int(line.split()[1]) * 1024)
    except OSError:
        pass
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text(encoding="ascii").strip()
        except OSError:
            continue
        if text.isdigit():
            limits.append(int(text))  # v1's "no limit" is a huge number, which the RAM undercuts
        break
    return min(limits) if limits else None


def _shm_bytes() -> int | None:
    try:
        stat = os.statvfs("/dev/shm")
    except OSError:
        return None
    return stat.f_frsize * stat.f_blocks


def gather() -> Machine:
    """The facts of this machine. Never raises for a missing GPU, driver, torch or DALI."""
    facts = _torch_facts()
    names, driver = _nvidia_smi()
    if not facts["gpus"] and names:  # the driver sees GPUs that torch does not (a CPU build of torch)
        facts.update(gpus=len(names), gpu_name=names[0])
    dali, dali_version = _dali_wheel()
    return Machine(python=".".join(map(str, sys.version_info[:3])), driver=driver, driver_cuda=_driver_cuda(),
                   dali=dali, dali_version=dali_version, cores=usable_cores(), memory_bytes=_memory_bytes(),
                   shm_bytes=_shm_bytes(), memfd=hasattr(os, "memfd_create"),
                   start_method=mp_context().get_start_method(), **facts)


def default_local_ranks(machine: Machine) -> int:
    """``LOCAL_WORLD_SIZE`` (what torchrun sets) when set, else one rank per GPU, else 1."""
    text = os.environ.get("LOCAL_WORLD_SIZE", "")
    if text.isdigit() and int(text) >= 1:
        return int(text)
    return max(1, machine.gpus)


# --- the checks of memory and cores: arithmetic on the facts (doctor.py's docstring works it out) ----------


def shared_bytes_per_rank(m: Machine, w: Workload) -> tuple[int, int, int]:
    """``(bytes per batch, batches held, bytes per rank)`` of the fallback's shared buffers at worst (see the
    module docstring): every clip on the fallback, as many batches as the loader keeps in flight."""
    on_gpu = bool(m.gpus and m.torch_cuda)
    itemsize = 1 if on_gpu or w.dtype == "uint8" else (4 if w.dtype == "float32" else 2)  # uint8 pixels on a GPU
    per_batch = w.batch_size * 3 * w.clip_len * w.crop_size * w.crop_size * itemsize
    decode = DecodeSpec(fallback_workers=w.fallback_workers)
    gpu = m.gpu
    pipelines = decode.dali_pipelines_for("gpu" if on_gpu else "cpu", gpu.nvdec_engines if gpu else None)
    # Ahead, and about two more: the ring of reused buffers (the loader's keep_buffers) keeps on a GPU host those
    # whose copies to the device still run, on the CPU the one handed out and the one the loop just dropped.
    held = decode.batches_ahead(w.batch_size, pipelines=pipelines) + 2
    return per_batch, held, per_batch * held


def check_shared_memory(m: Machine, w: Workload) -> Check:
    per_batch, held, per_rank = shared_bytes_per_rank(m, w)
    total = per_rank * w.local_ranks
    dtype = "uint8" if (m.gpus and m.torch_cuda) else w.dtype
    detail = (f"the fallback's buffers: {held} batches x {per_batch / _GB:.2f} GB ({w.batch_size} clips x 3 x "
              f"{w.clip_len} x {w.crop_size}^2 {dtype}) = {per_rank / _GB:.2f} GB a rank, "
              f"{total / _GB:.2f} GB for {w.local_ranks} rank(s)")
    where = "memfd: counted in the machine's memory, not in /dev/shm" if m.memfd else "temporary files"
    if m.memory_bytes is None:
        return Check("shared memory", "skip", f"{detail}; the memory limit is unknown here")
    detail += f" ({where}; {m.memory_bytes / _GB:.1f} GB usable)"
    fix = (f"lower --batch-size/--clip-len/--crop-size or the ranks, or give the container more memory "
           f"(docker run --memory=..., at least {math.ceil(total / SHARED_WARN_FRACTION / _GB)} GB for this); "
           "--shm-size does not help: these buffers are not in /dev/shm")
    if total > m.memory_bytes:
        return Check("shared memory", "fail", detail + ": more than the machine has", fix)
    if total > SHARED_WARN_FRACTION * m.memory_bytes:
        return Check("shared memory", "warn", detail + f": over {SHARED_WARN_FRACTION:.0%} of it", fix)
    return Check("shared memory", "ok", detail)


def check_dev_shm(m: Machine, w: Workload) -> Check:
    nccl = bool(m.gpus) and w.local_ranks > 1
    if m.shm_bytes is None:
        if nccl:
            return Check("/dev/shm", "fail", f"no /dev/shm: NCCL between the {w.local_ranks} local ranks needs it",
                         "mount one: docker run --shm-size=1g (or --ipc=host)")
        return Check("/dev/shm", "skip", "no /dev/shm; daliload's buffers do not use it (memfd)")
    size = f"{m.shm_bytes / _GB:.2f} GB"
    if not nccl:
        why = "one rank" if w.local_ranks == 1 else "no GPU, so no NCCL"
        return Check("/dev/shm", "ok", f"{size}; daliload's batches do not use it (memfd), and {why}: "
                     "nothing else here needs it")
    if m.shm_bytes < NCCL_SHM_BYTES:
        return Check("/dev/shm", "warn", f"{size}, less than the 1 GB NCCL asks for in a container, for "
                     f"{w.local_ranks} local ranks (NCCL fails to initialise when a segment does not fit: "
                     "'failed to extend /dev/shm/nccl-...')",
                     "docker run --shm-size=1g --ulimit memlock=-1 (or --ipc=host); on Kubernetes, an emptyDir "
                     "with medium: Memory at /dev/shm")
    return Check("/dev/shm", "ok", f"{size}; enough for NCCL between {w.local_ranks} local ranks "
                 "(daliload's batches do not use it: memfd)")


def check_cores(m: Machine, w: Workload) -> Check:
    per_rank = m.cores / w.local_ranks
    detail = (f"{m.cores} core(s) for {w.local_ranks} rank(s): {per_rank:.1f} a rank; "
              f"fallback_workers={w.fallback_workers} a rank")
    if w.fallback_workers > per_rank:
        more = "more cores a rank (SLURM --cpus-per-task, docker --cpus)"
        fix = f"DecodeSpec(fallback_workers={math.floor(per_rank)}), or {more}" if per_rank >= 1 else \
            f"{more} or fewer ranks on this machine; DecodeSpec(fallback_workers=1) meanwhile"
        return Check("cores", "warn", detail + ": more workers than cores, so they share cores and the fallback "
                     "is slower, not faster", fix)
    idle = math.floor(per_rank) - 1 - w.fallback_workers  # a core a rank kept for the training loop and DALI
    if m.gpus and idle >= 2:
        return Check("cores", "warn", detail + f": {idle} core(s) a rank left idle. On a GPU host the fallback can "
                     "be the faster decoder (the first GPU visit: NVDEC through DALI 2.4 was the slower one on "
                     "Kinetics-sized H.264; benchmarks/RESULTS.md, 'GPU visits'), and the default routing sends "
                     "each codec to the decoder measured faster, so its workers are worth the cores",
                     f"DecodeSpec(fallback_workers={math.floor(per_rank) - 1})")
    return Check("cores", "ok", detail)
