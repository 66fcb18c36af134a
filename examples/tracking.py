"""Experiment tracking for the training example: TensorBoard or Weights & Biases, when asked (``--log``).

``examples/train_ddp.py`` always writes ``OUT/metrics.json``; ``--log`` sends
the same numbers to a tracker as well, from rank 0 only::

    --log tensorboard   event files in OUT/tensorboard; no network needed.
                        View them with: tensorboard --logdir OUT/tensorboard
    --log wandb         a Weights & Biases run under OUT/wandb, offline by
                        default (--wandb-mode offline: no account, no network);
                        upload it later with: wandb sync OUT/wandb/offline-run-*
                        (--wandb-mode online logs live; --wandb-project names
                        the project)

Both libraries are optional dependencies, imported only when asked for; a
missing one stops the script before any data work with the ``pip install``
that fixes it (:func:`check_tracker`).

What is logged, against the global training step (``epoch * steps_per_epoch +
step``): every ``--log-every`` steps ``train/loss``, ``train/lr``,
``train/clips_per_s`` and ``train/data_wait_ms``; after each epoch the epoch's
record (``epoch/train_loss``, ``epoch/val_top1``, ``epoch/dali_share`` ...);
after the last one ``eval/multiview_top1`` and ``eval/multiview_top5``. A
resumed job goes on at the step it reached: TensorBoard appends to the same
folder, Weights & Biases starts a new run (group them by ``--out``'s name).

Installed as ``daliload.examples.tracking`` (a symbolic link, like
``train_ddp.py``), which is where the training script imports it from.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Mapping

TRACKERS = ("none", "tensorboard", "wandb")
WANDB_MODES = ("offline", "online")

_INSTALL = {
    "tensorboard": ("tensorboard", "pip install tensorboard"),
    "wandb": ("wandb", "pip install wandb"),
}


class Tracker:
    """Logs nothing: what ``--log none`` and every rank but 0 get."""

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        """Record ``values`` (name -> number) at global step ``step``."""

    def close(self) -> None:
        """Write out what is buffered."""


class TensorBoardTracker(Tracker):
    """Event files in ``log_dir`` (``torch.utils.tensorboard.SummaryWriter``)."""

    def __init__(self, log_dir: Path, config: Mapping[str, object]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(log_dir))
        self._writer.add_text("args", "\n".join(f"    {k}: {v}" for k, v in config.items()))

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        for name, value in values.items():
            self._writer.add_scalar(name, value, step)

    def close(self) -> None:
        self._writer.close()


class WandbTracker(Tracker):
    """A Weights & Biases run under ``out/wandb`` (``mode="offline"``: files only, ``wandb sync`` uploads them).

    ``wandb.init(dir=out)`` makes the ``wandb`` folder inside ``out`` itself.
    """

    def __init__(self, out: Path, config: Mapping[str, object], *, project: str, mode: str) -> None:
        import wandb

        self._run = wandb.init(project=project, dir=str(out), config=dict(config), mode=mode)

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        self._run.log(dict(values), step=step)

    def close(self) -> None:
        self._run.finish()


def check_tracker(name: str) -> None:
    """Fail before any data work if tracker ``name`` cannot run here, naming the ``pip install`` that fixes it.

    Raises:
        ValueError: an unknown name.
        ImportError: its library is not installed.
    """
    if name not in TRACKERS:
        raise ValueError(f"unknown tracker {name!r} for --log; choose from {', '.join(TRACKERS)}")
    if name == "none":
        return
    module, fix = _INSTALL[name]
    try:
        importlib.import_module(module)
    except ImportError as err:
        raise ImportError(f"--log {name} needs the {module} package, which is not installed: {fix} "
                          f"(or leave out --log)") from err


def open_tracker(name: str, out: Path, config: Mapping[str, object], *, rank: int,
                 wandb_project: str = "daliload", wandb_mode: str = "offline") -> Tracker:
    """The tracker ``--log name`` asks for on rank 0 (writing under ``out``), a silent one elsewhere.

    Raises:
        ValueError: an unknown name or ``wandb_mode``.
        ImportError: its library is not installed (see :func:`check_tracker`).
    """
    check_tracker(name)
    if wandb_mode not in WANDB_MODES:
        raise ValueError(f"unknown --wandb-mode {wandb_mode!r}; choose from {', '.join(WANDB_MODES)}")
    if rank != 0 or name == "none":
        return Tracker()
    if name == "tensorboard":
        return TensorBoardTracker(out / "tensorboard", config)
    return WandbTracker(out, config, project=wandb_project, mode=wandb_mode)
