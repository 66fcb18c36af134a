"""Where this process sits in a distributed job (rank, GPU), and how to wait for the others.

Reads ``torch.distributed`` when a process group is initialized, else the
variables ``torchrun`` sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``), else
defaults to a single process (rank 0 of 1). ``torch`` is imported only if it
is already loaded or installed; nothing here initializes a process group.
"""

from __future__ import annotations

import contextlib
import os
from datetime import timedelta
from typing import Any, TypeVar

T = TypeVar("T")


def _dist() -> Any | None:
    """``torch.distributed`` if it is available and initialized, else ``None``."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if dist.is_available() and dist.is_initialized():
        return dist
    return None


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError as err:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from err


def require_cuda() -> None:
    """Raise ``ValueError`` unless torch sees a CUDA GPU (what ``device="gpu"`` needs)."""
    import torch

    if not torch.cuda.is_available():
        raise ValueError("device='gpu' needs a CUDA GPU visible to torch; use device='cpu', or 'auto' "
                         "to pick the GPU only when there is one")


def local_cuda_device() -> int:
    """This process's GPU: the current CUDA device when the script has chosen one, else ``LOCAL_RANK`` modulo
    the visible GPUs.

    A script that called ``torch.cuda.set_device(k)`` has said where its
    tensors live: the batches go there too. GPU 0 is where CUDA starts
    whoever touches it (daliload itself, asking a GPU's name), so a current
    device of 0 says nothing: then ``LOCAL_RANK``, which is what ``torchrun``
    scripts pass to ``set_device``. Some launchers show each process only its
    own GPU (SLURM ``--gpus-per-task``), where ``LOCAL_RANK`` can exceed the
    visible count: it wraps around.

    Raises:
        ValueError: no CUDA GPU is visible.
    """
    require_cuda()
    import torch

    current = torch.cuda.current_device() if torch.cuda.is_initialized() else 0
    return current if current != 0 else local_rank() % torch.cuda.device_count()


def resolve_device(device: object) -> tuple[str, int | None]:
    """``("gpu", index)`` or ``("cpu", None)`` for a loader's ``device``, in any form torch takes.

    ``"auto"`` (a GPU when torch sees one), ``"gpu"``, ``"cuda"`` (this
    process's GPU: :func:`local_cuda_device`), ``"cuda:N"`` and
    ``torch.device("cuda", N)`` (GPU ``N``), ``torch.device("cuda")``,
    ``"cpu"`` and ``torch.device("cpu")``.

    Raises:
        ValueError: another value, or a GPU that torch does not see (the
            message names the value and the forms taken).
        TypeError: neither a string nor a ``torch.device``.
    """
    import torch

    if isinstance(device, str):
        name = device.strip().lower()
        if name == "auto":
            return ("gpu", local_cuda_device()) if torch.cuda.is_available() else ("cpu", None)
        if name == "gpu":
            return "gpu", local_cuda_device()
        try:
            parsed = torch.device(name)
        except RuntimeError as err:
            raise ValueError(f"device must be 'auto', 'gpu', 'cpu', 'cuda', 'cuda:N' or a torch.device, "
                             f"got {device!r}") from err
    elif isinstance(device, torch.device):
        parsed = device
    else:
        raise TypeError(f"device must be a string ('auto', 'gpu', 'cpu', 'cuda', 'cuda:N') or a torch.device, "
                        f"got {type(device).__name__} {device!r}")
    if parsed.type == "cpu":
        return "cpu", None
    if parsed.type != "cuda":
        raise ValueError(f"device must be a CUDA GPU or the CPU (DALI decodes on NVIDIA GPUs), got {device!r}")
    if parsed.index is None:
        return "gpu", local_cuda_device()
    require_cuda()
    if not 0 <= parsed.index < torch.cuda.device_count():
        raise ValueError(f"device {device!r}: torch sees {torch.cuda.device_count()} GPU(s) here "
                         f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})")
    return "gpu", parsed.index


def is_distributed() -> bool:
    """Whether a ``torch.distributed`` process group is initialized."""
    return _dist() is not None


def rank() -> int:
    """Global rank of this process (0 when not distributed)."""
    dist = _dist()
    return dist.get_rank() if dist is not None else _env_int("RANK", 0)


def world_size() -> int:
    """Number of processes in the job (1 when not distributed)."""
    dist = _dist()
    return dist.get_world_size() if dist is not None else _env_int("WORLD_SIZE", 1)


def local_rank() -> int:
    """Rank of this process on its node: its GPU index (``LOCAL_RANK``, default 0)."""
    return _env_int("LOCAL_RANK", 0)


def barrier() -> None:
    """Wait until every rank gets here; a no-op without a process group.

    The wait is bounded by the ``timeout`` given to ``init_process_group``.
    """
    dist = _dist()
    if dist is not None:
        dist.barrier()


def broadcast_object(obj: T, *, src: int = 0, group: Any | None = None) -> T:
    """Send a picklable object from rank ``src`` to every rank; returns it on all.

    Also a barrier: every rank waits until ``src`` has sent. Without a process
    group it returns ``obj`` unchanged.
    """
    dist = _dist()
    if dist is None:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src, group=group)
    return box[0]


def _object_device(dist: Any, group: Any | None) -> Any:
    """Where an object collective runs: under NCCL, this rank's GPU (``local_cuda_device``).

    NCCL moves pickled objects through the *current* CUDA device; a script that
    never called ``torch.cuda.set_device`` would have every rank use GPU 0.
    """
    import torch

    if "nccl" in str(dist.get_backend(group)) and torch.cuda.is_available():
        return torch.cuda.device(local_cuda_device())
    return contextlib.nullcontext()


def all_gather_object(obj: T, *, group: Any | None = None) -> list[T]:
    """Every rank's ``obj``, in rank order, on every rank; ``[obj]`` without a process group."""
    dist = _dist()
    if dist is None:
        return [obj]
    gathered: list[Any] = [None] * dist.get_world_size(group)
    with _object_device(dist, group):
        dist.all_gather_object(gathered, obj, group=group)
    return gathered


def gather_object(obj: T, *, dst: int = 0, group: Any | None = None) -> list[T] | None:
    """Every rank's ``obj``, in rank order, on rank ``dst``; ``None`` on the others.

    Without a process group: ``[obj]``.
    """
    dist = _dist()
    if dist is None:
        return [obj]
    gathered: list[Any] | None = [None] * dist.get_world_size(group) if dist.get_rank() == dst else None
    with _object_device(dist, group):
        dist.gather_object(obj, gathered, dst=dst, group=group)
    return gathered


def patient_group(timeout_s: float) -> Any | None:
    """A gloo process group whose collectives wait up to ``timeout_s`` seconds.

    For waits longer than the default group allows (its timeout is often 10
    minutes with NCCL), such as ranks waiting for rank 0 to scan a dataset.
    Every rank must call this at the same point. ``None`` without a process group.
    """
    dist = _dist()
    if dist is None:
        return None
    return dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
