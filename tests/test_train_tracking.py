"""The training example's ``--log tensorboard|wandb``, its time cap, and the installed copies of the examples."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from daliload.examples import tracking, train_ddp

REPO = Path(__file__).resolve().parents[1]
ARGS = ["--device", "cpu", "--batch-size", "4", "--clip-len", "4", "--frame-stride", "4", "--crop-size", "48",
        "--short-side", "56", "64", "--fallback-workers", "0", "--dali-threads", "1"]


def test_the_installed_examples_are_the_repositorys():
    """``daliload demo`` runs ``daliload.examples.train_ddp``: it must be the file users read in ``examples/``."""
    for name in ("train_ddp.py", "tracking.py", "models.py", "distributed.py"):
        assert (REPO / "daliload" / "examples" / name).read_bytes() == (REPO / "examples" / name).read_bytes()


def test_tensorboard_gets_every_step_line_and_epoch_record(small_kinetics, tmp_path, capsys):
    pytest.importorskip("tensorboard", reason="--log tensorboard needs tensorboard (in the test extra)")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    # --max-minutes that no epoch fits: with one epoch planned there is nothing to stop, and nothing is said.
    metrics = train_ddp.main([str(small_kinetics), "--out", str(out), "--epochs", "1", "--views", "1", "1",
                              "--log", "tensorboard", "--log-every", "1", "--max-minutes", "0.0001", *ARGS])
    assert "stopping" not in capsys.readouterr().out and "stopped_early" not in metrics
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    (record,) = metrics["history"]
    assert {"train/loss", "train/lr", "train/clips_per_s", "train/data_wait_ms", "epoch/train_loss",
            "epoch/val_top1", "epoch/dali_share", "eval/multiview_top1"} <= set(events.Tags()["scalars"])
    losses = events.Scalars("train/loss")
    per_epoch = len(losses)  # --log-every 1: one point per step, steps 1..N
    assert [e.step for e in losses] == list(range(1, per_epoch + 1))
    (val,) = events.Scalars("epoch/val_top1")
    assert val.step == per_epoch and val.value == pytest.approx(record["val_top1"])
    (multiview,) = events.Scalars("eval/multiview_top1")
    assert multiview.value == pytest.approx(metrics["multiview"]["top1"])
    assert json.loads((out / "metrics.json").read_text())["args"]["log"] == "tensorboard"


class FakeWandb(types.ModuleType):
    """Stands in for ``wandb``: records ``init``'s arguments and every ``log``."""

    def __init__(self) -> None:
        super().__init__("wandb")
        self.inits: list[dict] = []
        self.logged: list[tuple[dict, int]] = []
        self.finished = 0

    def init(self, **kwargs):
        self.inits.append(kwargs)
        fake = self

        class Run:
            def log(self, values, step):
                fake.logged.append((values, step))

            def finish(self):
                fake.finished += 1

        return Run()


def test_wandb_runs_offline_by_default_under_out(tmp_path, monkeypatch):
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    tracker = tracking.open_tracker("wandb", tmp_path, {"lr": 0.1}, rank=0)
    tracker.scalars({"train/loss": 1.5}, step=3)
    tracker.close()
    # wandb makes its "wandb" folder inside dir: the run lands in tmp_path/wandb/offline-run-*.
    assert fake.inits == [{"project": "daliload", "dir": str(tmp_path), "config": {"lr": 0.1}, "mode": "offline"}]
    assert fake.logged == [({"train/loss": 1.5}, 3)] and fake.finished == 1
    tracking.open_tracker("wandb", tmp_path, {}, rank=0, wandb_project="k700", wandb_mode="online").close()
    assert fake.inits[-1]["mode"] == "online" and fake.inits[-1]["project"] == "k700"
    # Other ranks log nothing and never start a run.
    silent = tracking.open_tracker("wandb", tmp_path, {}, rank=1)
    silent.scalars({"train/loss": 1.0}, step=1)
    silent.close()
    assert len(fake.inits) == 2 and len(fake.logged) == 1
    with pytest.raises(ValueError, match="unknown --wandb-mode 'shared'; choose from offline, online"):
        tracking.open_tracker("wandb", tmp_path, {}, rank=0, wandb_mode="shared")
    with pytest.raises(ValueError, match="unknown tracker 'mlflow' for --log"):
        tracking.open_tracker("mlflow", tmp_path, {}, rank=0)


@pytest.mark.parametrize("name", ["tensorboard", "wandb"])
def test_a_missing_tracker_stops_before_any_data_work_naming_the_install(name, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, name, None)  # as on a machine without it
    with pytest.raises(ImportError, match=rf"--log {name} needs the {name} package, which is not installed: "
                                          rf"pip install {name}"):
        train_ddp.main([str(tmp_path / "no_such_root"), "--out", str(tmp_path / "out"), "--log", name])
    with pytest.raises(SystemExit):
        train_ddp.parse_args(["root", "--log", "mlflow"])
    assert "invalid choice: 'mlflow'" in capsys.readouterr().err
