"""The Hugging Face ``Trainer`` and a PyTorchVideo-style Lightning module, run for real and resumed mid-epoch.

``examples/hf_trainer.py`` (``Trainer`` under torchrun, a tiny randomly
initialised VideoMAE, dict batches ``pixel_values``/``labels``) and
``examples/lightning_pytorchvideo.py`` (PyTorchVideo's Kinetics tutorial,
dict batches ``video``/``label``, Lightning's DDP), each as 2 CPU processes
(gloo) on the small generated dataset of ``test_training_loops.py``. A script
per test imports the example and records, on every rank, each training step:
its labels, a checksum of its pixels and its loss. An uninterrupted run must
train epoch by epoch on what a plain ``set_epoch`` loop gets on that rank; a
run resumed from a checkpoint written in the middle of epoch 1 must train on
the uninterrupted run's remaining batches, in order, with the same losses:
``Trainer`` resumes through Accelerate's ``skip_first_batches`` (the loader's
``dataset`` and ``batch_sampler``), Lightning through the loader's
``state_dict``, and neither example has a daliload-specific callback.

No time is asserted; the subprocess time limits only bound a hang.
"""

from __future__ import annotations

import math
import sys
import textwrap
from pathlib import Path

import pytest
from torch.utils.data import DataLoader
from test_training_loops import EXAMPLES, WORLD_SIZE, _as_rank, _example, _records, _run
from test_training_loops import dataset  # noqa: F401  (the module's fixture, shared by name)

from daliload import DecodeSpec, KineticsDALILoader, OutputSpec

pytestmark = pytest.mark.slow

#: HF: 16-frame clips (VideoMAE's num_frames) at stride 1 fit the 1 s, 30 frame videos. Batches of 3: 2 per
#: epoch on each rank's 6 training videos, and one val batch of each rank's 2 val videos plus a padding row.
HF_OPTIONS = ["--batch-size", "3", "--clip-len", "16", "--frame-stride", "1", "--crop-size", "32",
              "--fallback-workers", "1", "--seed", "5", "--routing", "static"]
HF_EPOCHS = 3
#: Lightning, PyTorchVideo-style: 8 frames over 0.5 s (the tutorial's 2 s do not fit 1 s videos), short side 40-48.
#: No dropout: Lightning does not restore the random state on resume, so dropout masks (not the batches) would
#: make the resumed run's losses differ.
PTV_OPTIONS = ["--batch-size", "3", "--clip-len", "8", "--clip-duration", "0.5", "--crop-size", "32",
               "--short-side", "40", "48", "--fallback-workers", "1", "--seed", "5", "--routing", "static",
               "--dropout", "0"]
PTV_EPOCHS = 3

# Run under torchrun as `SCRIPT RECORD_DIR ARGS...`: the example's Trainer, with each training step recorded.
HF_SCRIPT = textwrap.dedent("""\
    import json
    import os
    import sys
    from pathlib import Path

    sys.path.insert(0, {examples!r})
    import hf_trainer as example


    class RecordingTrainer(example.VideoTrainer):
        steps = []

        def training_step(self, model, inputs, num_items_in_batch=None):
            loss = super().training_step(model, inputs, num_items_in_batch)
            self.steps.append({{"step": self.state.global_step, "labels": inputs["labels"].tolist(),
                                "checksum": float(inputs["pixel_values"].double().sum()), "loss": float(loss)}})
            return loss


    if __name__ == "__main__":
        example.VideoTrainer = RecordingTrainer
        trainer = example.main(sys.argv[2:])
        evals = [e for e in trainer.state.log_history if "eval_accuracy" in e]
        record = {{"world_size": int(os.environ["WORLD_SIZE"]), "steps": RecordingTrainer.steps, "evals": evals}}
        Path(sys.argv[1], f"rank{{os.environ['RANK']}}.json").write_text(json.dumps(record))
""").format(examples=str(EXAMPLES))

# Run as `python SCRIPT RECORD_DIR ARGS...`; Lightning's DDP launcher starts rank 1 with the same command line.
PTV_SCRIPT = textwrap.dedent("""\
    import json
    import sys
    from pathlib import Path

    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    sys.path.insert(0, {examples!r})
    import lightning_pytorchvideo as example


    class RecordSteps(L.Callback):
        def __init__(self, folder):
            self.folder, self.steps = Path(folder), []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.steps.append({{"epoch": trainer.current_epoch, "batch": batch_idx,
                                "labels": batch["label"].tolist(), "checksum": float(batch["video"].double().sum()),
                                "loss": float(outputs["loss"])}})

        def on_train_end(self, trainer, pl_module):
            record = {{"world_size": trainer.world_size, "steps": self.steps}}
            (self.folder / f"rank{{trainer.global_rank}}.json").write_text(json.dumps(record))


    if __name__ == "__main__":
        # Test-only: a checkpoint after every step, to resume mid-epoch.
        steps = ModelCheckpoint(dirpath=Path(sys.argv[1], "steps"), filename="step{{step}}",
                                auto_insert_metric_name=False, every_n_train_steps=1, save_top_k=-1)
        example.main(sys.argv[2:], callbacks=[RecordSteps(sys.argv[1]), steps])
""").format(examples=str(EXAMPLES))


def _reference(build, keys: tuple[str, str], epochs: int) -> list[list[list[dict]]]:
    """``[rank][epoch]``: each batch's labels and pixel checksum as a plain ``set_epoch`` loop over ``build()`` gets
    them on that rank, checked against the loader's plan."""
    videos_key, labels_key = keys
    ranks = []
    for rank in range(WORLD_SIZE):
        loader = _as_rank(rank, build)
        epochs_got = []
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            batches = [{"labels": b[labels_key].tolist(), "checksum": float(b[videos_key].double().sum())}
                       for b in loader]
            assert [b["labels"] for b in batches] == [[s.label for s in batch] for batch in loader.plan(epoch)]
            epochs_got.append(batches)
        loader.close()
        assert epochs_got[0] != epochs_got[1], "the premise: epoch 1's plan is not epoch 0's"
        ranks.append(epochs_got)
    return ranks


def _check_steps(got: list[dict], want: list[dict], what: str, *, losses: bool = True) -> None:
    """The same batches (labels, pixel checksums up to summation order) and, with ``losses``, the same losses."""
    def same(g: dict, w: dict) -> bool:
        return (g["labels"] == w["labels"]
                and g["checksum"] == pytest.approx(w["checksum"], rel=1e-9, abs=1e-6)
                and (not losses or g["loss"] == pytest.approx(w["loss"], rel=1e-6)))
    ok = len(got) == len(want) and all(same(g, w) for g, w in zip(got, want))
    shown = ("labels", "loss") if losses else ("labels",)
    assert ok, (f"{what}: got {[[g.get(k) for k in shown] for g in got]}; "
                f"want {[[w.get(k) for k in shown] for w in want]}")


# --------------------------------------------------------------------------------------
# The attributes Accelerate's skip_first_batches reads, in one process
# --------------------------------------------------------------------------------------


def test_skip_first_batches_starts_at_the_batch_after_without_decoding_the_skipped(dataset):  # noqa: F811
    """``skip_first_batches(loader, n)`` gives a ``DataLoader`` whose batches are the loader's from batch ``n`` on,
    of the epoch set on the sampler inside it (where ``Trainer`` sets it); it decodes none of the first ``n``; the
    loader's state during it is the one a checkpoint there would save; the loader's next pass is the next epoch."""
    accelerate = pytest.importorskip("accelerate")
    loader = KineticsDALILoader(dataset, "train", batch_size=2, clip_len=4, frame_stride=2, crop_size=32, seed=5,
                                device="cpu", batch_keys=("pixel_values", "labels"),
                                output=OutputSpec(layout="TCHW"), decode=DecodeSpec(fallback_workers=1,
                                                                                     routing="static"))
    assert len(loader.dataset) == len(loader.videos) == 12 and loader.dataset[3] == loader.videos[3]
    # What a DataLoader built with num_workers=0 says, where accelerate and Lightning read it.
    assert (loader.batch_size, loader.drop_last, loader.num_workers, loader.prefetch_factor) == (2, False, 0, None)
    assert len(loader.batch_sampler) == len(loader) and callable(loader.sampler.set_epoch)
    loader.set_epoch(1)
    want = [(b["labels"].tolist(), float(b["pixel_values"].double().sum())) for b in loader]
    plan = loader.plan(1)

    skipping = accelerate.skip_first_batches(loader, 2)
    assert len(skipping) == len(loader) - 2
    skipping.batch_sampler.batch_sampler.set_epoch(1)  # what Trainer does before iterating it
    got, states = [], []
    for batch in skipping:
        got.append((batch["labels"].tolist(), float(batch["pixel_values"].double().sum())))
        states.append((loader.state_dict()["epoch"], loader.state_dict()["next_batch"]))
    assert got == want[2:]
    assert states == [(1, 3), (1, 4), (1, 5), (2, 0)]
    stats = loader.stats()  # the pass skip_first_batches' DataLoader drove
    assert (stats.epoch, stats.clips_dali + stats.clips_fallback) == (1, sum(len(b) for b in plan[2:])), \
        "the skipped batches were decoded"
    assert [list(b) for b in loader.batch_sampler] == [[s.video_index for s in b] for b in loader.plan(2)]
    assert loader.state_dict()["epoch"] == 2 and sum(1 for _ in loader) == len(loader)

    # Built by hand, the DataLoader gives the loader's own batches, whatever pass of the loader ran between.
    loader.set_epoch(3)
    by_hand = DataLoader(loader.dataset, batch_sampler=loader.batch_sampler, collate_fn=loader.collate_fn)
    batches = iter(by_hand)
    first = next(batches)["labels"].tolist()
    loader.set_epoch(3)
    assert sum(1 for _ in loader) == len(loader)  # ends the pass the DataLoader started
    rest = [b["labels"].tolist() for b in batches]
    assert [first, *rest] == [[s.label for s in b] for b in loader.plan(3)]

    with pytest.raises(TypeError, match=r"batch_sampler=loader.batch_sampler, collate_fn=loader.collate_fn"):
        loader.dataset.__getitems__([0, 1])
    loader.close()


# --------------------------------------------------------------------------------------
# Hugging Face Trainer
# --------------------------------------------------------------------------------------


def _hf(folder: Path, dataset: Path, *extra: str) -> list[dict]:  # noqa: F811
    folder.mkdir(exist_ok=True)
    script = folder / "hf_run.py"
    script.write_text(HF_SCRIPT)
    _run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={WORLD_SIZE}",
          str(script), str(folder), "--root", str(dataset), "--out", str(folder / "out"), "--epochs", str(HF_EPOCHS),
          "--cpu", "--save-steps", "1", *HF_OPTIONS, *extra], cwd=folder)
    return _records(folder)


def test_hf_trainer_trains_each_epoch_on_its_plan_and_resumes_mid_epoch_exactly(dataset, tmp_path):  # noqa: F811
    """``Trainer`` under torchrun (2 gloo processes): step ``s`` trains on batch ``s % 2`` of epoch ``s // 2``'s
    plan; resumed from ``checkpoint-3`` (epoch 1, after its first batch) with no callback, it trains steps 3..5 on
    the same batches as the uninterrupted run, with the same losses. Each epoch's evaluation runs unchanged on
    batches with a padding row (label -100, which VideoMAE's loss ignores)."""
    example = _example("hf_trainer", "transformers")
    args = example.parse_args(["--root", str(dataset), *HF_OPTIONS, "--cpu", "--no-eval", "--fallback-workers", "0"])
    reference = _reference(lambda: example.build_loaders(args)[0], ("pixel_values", "labels"), HF_EPOCHS)
    per_epoch = len(reference[0][0])

    full = _hf(tmp_path / "full", dataset)
    for rank, record in enumerate(full):
        steps = record["steps"]
        assert [s["step"] for s in steps] == list(range(HF_EPOCHS * per_epoch))
        for epoch in range(HF_EPOCHS):
            _check_steps(steps[epoch * per_epoch:(epoch + 1) * per_epoch], reference[rank][epoch],
                         f"rank {rank} epoch {epoch} vs set_epoch", losses=False)
        evals = record["evals"]
        assert len(evals) == HF_EPOCHS, "an evaluation at each epoch's end"
        assert all(math.isfinite(e["eval_loss"]) and 0 <= e["eval_accuracy"] <= 1 for e in evals), evals

    checkpoint = tmp_path / "full" / "out" / f"checkpoint-{per_epoch + 1}"
    assert checkpoint.is_dir()
    resumed = _hf(tmp_path / "resumed", dataset, "--resume", str(checkpoint))
    for rank in range(WORLD_SIZE):
        steps = resumed[rank]["steps"]
        assert [s["step"] for s in steps] == list(range(per_epoch + 1, HF_EPOCHS * per_epoch))
        _check_steps(steps, full[rank]["steps"][per_epoch + 1:], f"rank {rank} resumed vs uninterrupted")


# --------------------------------------------------------------------------------------
# PyTorchVideo's tutorial under Lightning
# --------------------------------------------------------------------------------------


def _ptv(folder: Path, dataset: Path, *extra: str) -> list[dict]:  # noqa: F811
    folder.mkdir(exist_ok=True)
    script = folder / "ptv_run.py"
    script.write_text(PTV_SCRIPT)
    _run([sys.executable, str(script), str(folder), "--root", str(dataset), "--out", str(folder / "out"),
          "--accelerator", "cpu", "--devices", str(WORLD_SIZE), "--epochs", str(PTV_EPOCHS), *PTV_OPTIONS, *extra],
         cwd=folder)
    return _records(folder)


def test_pytorchvideo_lightning_module_trains_each_epoch_and_resumes_mid_epoch_exactly(dataset, tmp_path):  # noqa: F811
    """The tutorial's module and data module under ``Trainer(strategy="ddp")``, 2 gloo processes: each epoch is
    the plan ``set_epoch`` gives; resumed from the checkpoint after step 3 (epoch 1, after its first batch) it trains
    the rest of epoch 1 and epoch 2 on the uninterrupted run's batches, with the same losses. Validation batches
    carry a padding row (label -100): the tutorial's validation step runs on them unchanged."""
    example = _example("lightning_pytorchvideo", "lightning")
    args = example.parse_args(["--root", str(dataset), *PTV_OPTIONS])

    def build():
        data = example.KineticsDataModule(
            str(dataset), batch_size=args.batch_size, clip_len=args.clip_len, clip_duration=args.clip_duration,
            crop_size=args.crop_size, short_side=tuple(args.short_side), seed=args.seed, device="cpu",
            fallback_workers=0, routing=args.routing)
        return data.train_dataloader()

    reference = _reference(build, ("video", "label"), PTV_EPOCHS)
    per_epoch = len(reference[0][0])

    full = _ptv(tmp_path / "full", dataset)
    for rank, record in enumerate(full):
        steps = record["steps"]
        for epoch in range(PTV_EPOCHS):
            _check_steps([s for s in steps if s["epoch"] == epoch], reference[rank][epoch],
                         f"rank {rank} epoch {epoch} vs set_epoch", losses=False)

    resumed = _ptv(tmp_path / "resumed", dataset, "--ckpt-path",
                   str(tmp_path / "full" / "steps" / f"step{per_epoch + 1}.ckpt"))
    for rank in range(WORLD_SIZE):
        steps = resumed[rank]["steps"]
        assert [(s["epoch"], s["batch"]) for s in steps] == [(e, b) for e in range(1, PTV_EPOCHS)
                                                             for b in range(per_epoch) if (e, b) != (1, 0)]
        _check_steps(steps, full[rank]["steps"][per_epoch + 1:], f"rank {rank} resumed vs uninterrupted")
