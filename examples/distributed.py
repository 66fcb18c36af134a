"""The DDP set-up and the checkpoint writes of the training example.

``examples/train_ddp.py`` joins a ``torchrun`` job (NCCL on GPUs, gloo on
CPUs) or runs as one process (:func:`setup_distributed`), gathers per-rank
state (:func:`all_gather`) and replaces its checkpoint atomically
(:func:`save_checkpoint`). Installed as ``daliload.examples.distributed`` (a
symbolic link, like ``train_ddp.py``), which is where the script imports it from.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist


@dataclasses.dataclass(frozen=True)
class DistEnv:
    """Where this process runs: global rank, world size, rank on its node, torch device."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device


def setup_distributed(device: str) -> DistEnv:
    """Join the torchrun job (NCCL on GPUs, gloo on CPUs), or run as a single process."""
    use_cuda = torch.cuda.is_available() if device == "auto" else device == "gpu"
    if use_cuda and not torch.cuda.is_available():
        raise RuntimeError("--device gpu was asked for, but torch sees no GPU")
    if "RANK" not in os.environ:  # plain `python train_ddp.py`
        return DistEnv(0, 1, 0, torch.device("cuda", 0) if use_cuda else torch.device("cpu"))
    local_rank = int(os.environ["LOCAL_RANK"])
    if use_cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    return DistEnv(dist.get_rank(), dist.get_world_size(), local_rank,
                   torch.device("cuda", local_rank) if use_cuda else torch.device("cpu"))


def atomic_write(path: str | os.PathLike, write) -> None:
    """Call ``write(binary_file)`` on a temporary file beside ``path``, then rename it to ``path``.

    A crash or kill at any moment leaves either the old file or the complete
    new one, never a torn one: the data is fsync-ed before ``os.replace`` (an
    atomic rename on POSIX), and the directory after it so the rename is durable.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def save_checkpoint(path: str | os.PathLike, state: dict) -> None:
    atomic_write(path, lambda f: torch.save(state, f))


def all_gather(obj, env: DistEnv) -> list:
    """``obj`` from every rank, in rank order."""
    if env.world_size == 1:
        return [obj]
    out = [None] * env.world_size
    dist.all_gather_object(out, obj)
    return out
