"""The training loops people already have, run for real with no daliload-specific call in them.

``examples/lightning_datamodule.py`` (PyTorch Lightning's Trainer, strategy
"ddp") and ``examples/accelerate_train.py`` (a plain Accelerate loop under
torchrun), each as 2 CPU processes (gloo) for 2 epochs on a small generated
dataset (H.264 through the PyAV fallback, VP9 through DALI's CPU decoder). A
small script per test imports the example and records, on every rank, each
training batch as the loop got it: its labels, a checksum of its pixels and
its dtype. Those must be, epoch by epoch, what a plain loop that calls
``loader.set_epoch(e)`` gets on that rank (the reference, built here with
``RANK``/``WORLD_SIZE`` in the environment), so epoch 1 is a new plan and not a
replay of epoch 0; and a run resumed from a checkpoint (Lightning's at the end
of epoch 0 or after its first step, Accelerate's ``save_state`` at the end of
epoch 0) must go on with the batches the uninterrupted run trained on.

No time is asserted; the subprocess time limits only bound a hang.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from daliload.synth import SynthSpec, generate_dataset

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
WORLD_SIZE = 2
EPOCHS = 2
#: 12 training videos, 6 per rank: 3 batches of 2 per epoch; 4-frame 32x32 clips keep a step cheap.
#: ``--routing static``: batches are compared by pixel checksums, so each clip's decoder is pinned (with the
#: default adaptive routing a VP9 clip may come from DALI in one run and the fallback in another).
OPTIONS = ["--batch-size", "2", "--clip-len", "4", "--frame-stride", "2", "--crop-size", "32",
           "--fallback-workers", "1", "--seed", "5", "--routing", "static"]
#: A hang bound for one 2-process run (about 20 s on an idle 2-core machine), not a speed target; two of
#: them fit in pytest's 600 s per test.
RUN_LIMIT_S = 240

# Run as `python SCRIPT RECORD_DIR ARGS...`; Lightning's DDP launcher starts rank 1 with the same command line.
LIGHTNING_SCRIPT = textwrap.dedent("""\
    import json
    import sys
    from pathlib import Path

    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    sys.path.insert(0, {examples!r})
    import lightning_datamodule as example


    class RecordBatches(L.Callback):
        def __init__(self, folder):
            self.folder, self.epochs = Path(folder), {{}}

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            videos, labels = batch
            self.epochs.setdefault(str(trainer.current_epoch), []).append({{
                "labels": labels.tolist(), "checksum": float(videos.double().sum()), "dtype": str(videos.dtype),
                "model_dtype": str(next(pl_module.parameters()).dtype)}})

        def on_train_end(self, trainer, pl_module):
            record = {{"world_size": trainer.world_size, "epochs": self.epochs}}
            (self.folder / f"rank{{trainer.global_rank}}.json").write_text(json.dumps(record))


    if __name__ == "__main__":
        # Test-only, beside the example's end-of-epoch checkpoints: one after every step, to resume mid-epoch.
        steps = ModelCheckpoint(dirpath=Path(sys.argv[1], "steps"), filename="step{{step}}",
                                auto_insert_metric_name=False, every_n_train_steps=1, save_top_k=-1)
        example.main(sys.argv[2:], callbacks=[RecordBatches(sys.argv[1]), steps])
""").format(examples=str(EXAMPLES))

# Run under torchrun as `SCRIPT RECORD_DIR ARGS...`: the example's loaders, built by its own code, record each pass.
ACCELERATE_SCRIPT = textwrap.dedent("""\
    import json
    import os
    import sys
    from pathlib import Path

    sys.path.insert(0, {examples!r})
    import accelerate_train as example


    class RecordingLoader(example.KineticsDALILoader):
        passes = []

        def __iter__(self):
            batches = super().__iter__()
            return self._record(batches) if self.split == "train" else batches

        def _record(self, batches):
            got = []
            self.passes.append(got)
            for videos, labels in batches:
                got.append({{"labels": labels.tolist(), "checksum": float(videos.double().sum()),
                             "dtype": str(videos.dtype)}})
                yield videos, labels


    if __name__ == "__main__":
        example.KineticsDALILoader = RecordingLoader
        example.main(sys.argv[2:])
        record = {{"world_size": int(os.environ["WORLD_SIZE"]), "passes": RecordingLoader.passes}}
        Path(sys.argv[1], f"rank{{os.environ['RANK']}}.json").write_text(json.dumps(record))
""").format(examples=str(EXAMPLES))


# --------------------------------------------------------------------------------------
# Fixtures: the dataset, the reference plans, the uninterrupted Lightning run
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    """4 classes x 4 clips of 1 s at 128x96, half H.264 (fallback) and half VP9 (DALI on a CPU): 12 train, 4 val."""
    root = tmp_path_factory.mktemp("training_loops") / "data"
    spec = SynthSpec(num_classes=4, clips_per_class=4, val_fraction=0.25, width=128, height=96,
                     duration_s=1.0, codec_mix={"h264": 0.5, "vp9": 0.5}, seed=3)
    generate_dataset(root, spec, workers=2, progress=False)
    return root


def _explicit_epochs(loader) -> list[list[dict]]:
    """What a plain loop with ``loader.set_epoch(e)`` gets: per epoch, each batch's labels and checksum."""
    epochs = []
    for epoch in range(EPOCHS):
        loader.set_epoch(epoch)
        plan = loader.plan(epoch)
        batches = [{"labels": labels.tolist(), "checksum": float(videos.double().sum())} for videos, labels in loader]
        assert [b["labels"] for b in batches] == [[s.label for s in batch] for batch in plan]
        epochs.append(batches)
    loader.close()
    assert epochs[0] != epochs[1], "the premise of every test here: epoch 1's plan is not epoch 0's"
    return epochs


def _as_rank(rank: int, build):
    """``build()`` as rank ``rank`` of :data:`WORLD_SIZE` (no process group here: the loader reads the environment)."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RANK", str(rank))
        env.setenv("WORLD_SIZE", str(WORLD_SIZE))
        env.setenv("LOCAL_RANK", "0")
        return build()


def _example(name: str, needs: str):
    """Import ``examples/<name>.py`` (skipped where ``needs``, which the test extra installs, is missing)."""
    pytest.importorskip(needs, reason=f"examples/{name}.py needs {needs} (in the test extra)")
    sys.path.insert(0, str(EXAMPLES))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(EXAMPLES))


@pytest.fixture(scope="module")
def lightning_reference(dataset) -> list[list[list[dict]]]:
    """``[rank][epoch]``: the batches of explicit ``set_epoch`` loops over the Lightning example's train loader."""
    example = _example("lightning_datamodule", "lightning")
    args = example.parse_args(["--root", str(dataset), *OPTIONS])

    def build():
        data = example.KineticsDataModule(
            str(dataset), batch_size=args.batch_size, clip_len=args.clip_len, frame_stride=args.frame_stride,
            crop_size=args.crop_size, seed=args.seed, device="cpu", fallback_workers=0)
        return data.train_dataloader()

    return [_explicit_epochs(_as_rank(rank, build)) for rank in range(WORLD_SIZE)]


@pytest.fixture(scope="module")
def accelerate_reference(dataset) -> list[list[list[dict]]]:
    """``[rank][epoch]``: the same for the Accelerate example's train loader."""
    example = _example("accelerate_train", "accelerate")
    args = example.parse_args(["--root", str(dataset), *OPTIONS, "--no-val", "--fallback-workers", "0"])
    return [_explicit_epochs(_as_rank(rank, lambda: example.build_loaders(args, "cpu")[0]))
            for rank in range(WORLD_SIZE)]


def _run(cmd: list[str], cwd: Path) -> None:
    """Run ``cmd`` in a session of its own; on a hang, end that whole session (every rank and decoder worker)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=RUN_LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"{cmd[1]} still running after {RUN_LIMIT_S} s:\n{output[-4000:]}")
    finally:
        if proc.poll() is None:  # interrupted otherwise (pytest's own time limit, Ctrl-C): leave nothing behind
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    log = cwd / "output.log"
    log.write_text(output)
    assert proc.returncode == 0, f"{cmd[1]} exited with {proc.returncode} (all of it in {log}):\n{output[-8000:]}"


def _records(folder: Path) -> list[dict]:
    records = [json.loads((folder / f"rank{r}.json").read_text()) for r in range(WORLD_SIZE)]
    assert [r["world_size"] for r in records] == [WORLD_SIZE] * WORLD_SIZE
    return records


def _lightning(folder: Path, dataset: Path, *extra: str) -> list[dict]:
    script = folder / "lightning_run.py"
    script.write_text(LIGHTNING_SCRIPT)
    _run([sys.executable, str(script), str(folder), "--root", str(dataset), "--out", str(folder / "out"),
          "--accelerator", "cpu", "--devices", str(WORLD_SIZE), "--epochs", str(EPOCHS), "--no-progress-bar",
          *OPTIONS, *extra], cwd=folder)
    return _records(folder)


def _check_same(got: list[dict], want: list[dict], what: str) -> None:
    """The same batches: labels equal, pixel checksums equal up to summation order."""
    same = len(got) == len(want) and all(
        g["labels"] == w["labels"] and g["checksum"] == pytest.approx(w["checksum"], rel=1e-9, abs=1e-6)
        for g, w in zip(got, want))
    assert same, (f"{what}: got labels {[g['labels'] for g in got]}, checksums {[g['checksum'] for g in got]}; "
                  f"want {[w['labels'] for w in want]}, {[w['checksum'] for w in want]}")


@pytest.fixture(scope="module")
def lightning_run(dataset, lightning_reference, tmp_path_factory) -> tuple[Path, list[dict]]:
    """The uninterrupted Lightning run: ``(its folder, its per-rank records)``."""
    folder = tmp_path_factory.mktemp("lightning_full")
    return folder, _lightning(folder, dataset)


# --------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------


def test_lightning_ddp_trains_each_epoch_on_its_own_plan(lightning_run, lightning_reference):
    """Trainer(strategy="ddp") on 2 CPU processes: epoch e's batches on rank r are the plan set_epoch(e) gives.

    Lightning reaches the loader only through ``loader.sampler.set_epoch`` and
    ``iter()``; a loader that replayed epoch 0 (as one did before
    ``loader.sampler`` existed) fails the epoch 1 comparison.
    """
    _, records = lightning_run
    for rank, record in enumerate(records):
        got = [record["epochs"][str(e)] for e in range(EPOCHS)]
        assert got[0] != got[1], f"rank {rank}: epoch 1 replayed epoch 0's batches"
        for epoch in range(EPOCHS):
            _check_same(got[epoch], lightning_reference[rank][epoch], f"rank {rank} epoch {epoch} vs set_epoch")
        # The loader's default batch goes into the float32 model as it comes, with no cast in the example.
        assert {(b["dtype"], b["model_dtype"]) for e in got for b in e} == {("torch.float32", "torch.float32")}


def test_lightning_resumed_from_an_epoch_end_checkpoint_trains_the_next_epoch(
        lightning_run, dataset, lightning_reference, tmp_path):
    """``--ckpt-path`` the end-of-epoch-0 checkpoint: the resumed run's epoch 1 is the uninterrupted run's epoch 1."""
    full_folder, full = lightning_run
    checkpoint = full_folder / "out" / "checkpoints" / "epoch0.ckpt"
    assert checkpoint.is_file()
    resumed = _lightning(tmp_path, dataset, "--ckpt-path", str(checkpoint))
    for rank in range(WORLD_SIZE):
        assert sorted(resumed[rank]["epochs"]) == ["1"], "the resumed run trains only epoch 1"
        epoch1 = resumed[rank]["epochs"]["1"]
        _check_same(epoch1, full[rank]["epochs"]["1"], f"rank {rank} resumed epoch 1 vs uninterrupted")
        _check_same(epoch1, lightning_reference[rank][1], f"rank {rank} resumed epoch 1 vs set_epoch(1)")


def test_lightning_resumed_mid_epoch_continues_at_the_next_batch(lightning_run, dataset, lightning_reference, tmp_path):
    """A checkpoint after step 1 of epoch 0: the resumed run trains epoch 0 from its batch 1, then epoch 1.

    Lightning fetches no batch ahead from a loader with ``len()``
    (``_PrefetchDataFetcher``), so the loader state a checkpoint holds is
    right after the batch its last step trained on.
    """
    full_folder, full = lightning_run
    resumed = _lightning(tmp_path, dataset, "--ckpt-path", str(full_folder / "steps" / "step1.ckpt"))
    for rank in range(WORLD_SIZE):
        epochs = resumed[rank]["epochs"]
        assert sorted(epochs) == ["0", "1"]
        _check_same(epochs["0"], full[rank]["epochs"]["0"][1:], f"rank {rank} resumed epoch 0 vs its batches 1..")
        _check_same(epochs["1"], lightning_reference[rank][1], f"rank {rank} epoch 1 after a mid-epoch resume")


def _accelerate(folder: Path, dataset: Path, *extra: str) -> list[dict]:
    folder.mkdir(exist_ok=True)
    script = folder / "accelerate_run.py"
    script.write_text(ACCELERATE_SCRIPT)
    _run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={WORLD_SIZE}",
          str(script), str(folder), "--root", str(dataset), "--out", str(folder / "out"), "--epochs", str(EPOCHS),
          "--cpu", *OPTIONS, *extra], cwd=folder)
    return _records(folder)


def test_accelerate_loop_trains_each_pass_on_a_new_epoch_and_resumes(dataset, accelerate_reference, tmp_path):
    """An Accelerate loop under torchrun that calls nothing: pass e draws epoch e's plan; ``load_state`` of the
    end-of-epoch-0 state (``register_for_checkpointing(loader)``) makes the next pass epoch 1's."""
    full = _accelerate(tmp_path / "full", dataset)
    for rank, record in enumerate(full):
        passes = record["passes"]
        assert len(passes) == EPOCHS
        assert passes[0] != passes[1], f"rank {rank}: the second pass replayed the first one's batches"
        for epoch in range(EPOCHS):
            _check_same(passes[epoch], accelerate_reference[rank][epoch], f"rank {rank} pass {epoch} vs set_epoch")
        assert {b["dtype"] for p in passes for b in p} == {"torch.float32"}

    resumed = _accelerate(tmp_path / "resumed", dataset, "--resume", str(tmp_path / "full" / "out" / "epoch0"))
    for rank, record in enumerate(resumed):
        assert len(record["passes"]) == 1, "the resumed run trains only epoch 1"
        _check_same(record["passes"][0], accelerate_reference[rank][1], f"rank {rank} resumed pass vs set_epoch(1)")
