"""Train with PyTorch Lightning, fed by KineticsDALILoader: a LightningDataModule and nothing daliload-specific.

The loaders are plain iterables returned from ``train_dataloader()`` and
``val_dataloader()``; Lightning's own calls advance, save and restore them::

    python examples/lightning_datamodule.py --root /data/kinetics700 --devices 8 --epochs 45
    # on a CPU, 2 DDP processes (gloo) on the data `daliload demo` generates:
    python examples/lightning_datamodule.py --root demo_out/data --accelerator cpu --devices 2 \\
        --epochs 5 --batch-size 4 --clip-len 8 --frame-stride 8 --crop-size 80
    # resume after a stop, from the checkpoint written at the end of an epoch:
    python examples/lightning_datamodule.py ... --ckpt-path OUT/checkpoints/epoch2.ckpt

What Lightning calls, and why each works with no daliload hook:

- ``train_dataloader()`` / ``val_dataloader()``: Lightning calls them after its
  strategy has set up the process group (``Trainer.fit`` runs
  ``strategy.setup_environment()`` first), so a loader built there takes its
  rank and world size from ``torch.distributed``. Lightning injects a
  ``DistributedSampler`` into ``torch.utils.data.DataLoader`` objects only; this
  loader is not one, and splits the epoch between ranks itself.
- ``loader.sampler.set_epoch(epoch)``: before every training epoch the fit loop
  calls ``set_epoch`` on each train dataloader's ``sampler``
  (``lightning.fabric.utilities.data._set_sampler_epoch``), as it does for a
  ``DistributedSampler``; ``loader.sampler`` passes it to the loader, so each
  epoch draws its own plan. (It does the same for the val loader before each
  evaluation; a val split's plan is the same every epoch.) Lightning also
  calls a bare ``iter()`` on each loader to check it is iterable, and again at
  each epoch start; the loader starts a pass at its first batch, not at
  ``iter()``, so those calls draw nothing.
- ``loader.state_dict()`` / ``load_state_dict()``: a loader with both is
  "stateful" to Lightning (>= 2.2), which stores the train loader's state in
  every checkpoint (the fit loop's ``combined_loader`` entry) and, on
  ``--ckpt-path``, loads it back before the first resumed epoch's
  ``set_epoch``; ``set_epoch`` with the saved epoch keeps the saved position.
  Rank 0 writes the checkpoint and every rank loads rank 0's state: it holds
  no rank (epoch, batch, and what must match: seed, world size, the video
  list), so each rank resumes its own share. A checkpoint written at the end
  of epoch ``e`` holds ``epoch e + 1, batch 0``: the resumed run's first epoch
  is the plan the uninterrupted run's epoch ``e + 1`` had.

Mid-epoch checkpoints (``ModelCheckpoint(every_n_train_steps=...)``) are exact
too. Lightning's ``_PrefetchDataFetcher`` (``lightning/pytorch/loops/fetchers.py``)
fetches a batch ahead only from an iterable without ``len()``, to know which
batch is the last; this loader has ``len()``, so nothing is fetched ahead and
the state saved after step ``n`` of an epoch resumes at its batch ``n``, the
first one not trained on. (Checked with Lightning 2.6: behind a wrapper without
``len()`` the saved state is one batch past the last step, and a resumed run
would skip that batch.)

Writes under ``--out``: ``checkpoints/epoch<E>.ckpt`` at the end of each
epoch, and Lightning's CSV logs (``lightning_logs/``). Needs ``pip install
lightning``; the model is ``examples/models.py``'s (imported as
``daliload.examples.models``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from daliload import AugmentSpec, DecodeSpec, KineticsDALILoader, Manifest, load_index
from daliload.examples.models import build_model
from daliload.loader import PADDING_LABEL


class KineticsDataModule(L.LightningDataModule):
    """The train and val splits of a Kinetics-style root, one :class:`KineticsDALILoader` each."""

    def __init__(self, root: str, *, batch_size: int, clip_len: int, frame_stride: int, crop_size: int,
                 seed: int = 0, device: str = "auto", fallback_workers: int = 2, routing: str = "auto") -> None:
        super().__init__()
        self.root = root
        self.options = dict(batch_size=batch_size, clip_len=clip_len, frame_stride=frame_stride, seed=seed,
                            device=device, decode=DecodeSpec(fallback_workers=fallback_workers, routing=routing))
        self.crop_size = crop_size
        # The model's head is built before any loader (Lightning configures the optimizer first), so the
        # classes come from the dataset's layout (a listing of the files, no probing) or the manifest given.
        if Path(root).is_file():
            with Manifest(root) as manifest:
                self.classes = manifest.classes()
        else:
            self.classes = load_index(root, "train").classes
        self._loaders: list[KineticsDALILoader] = []

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def train_dataloader(self) -> KineticsDALILoader:
        # Called once per fit (reload_dataloaders_every_n_epochs=0), after the process group is up.
        # Rank 0 scans the dataset (only changed files, after the first time); the others wait for it.
        augment = AugmentSpec(crop_size=self.crop_size, crop_mode="random_resized", area_range=(0.3, 1.0))
        return self._keep(KineticsDALILoader(self.root, "train", augment=augment, **self.options))

    def val_dataloader(self) -> KineticsDALILoader:
        # Padding (the repeats that keep ranks in step) carries label -1: validation_step leaves it out.
        return self._keep(KineticsDALILoader(self.root, "val", crop_size=self.crop_size, **self.options))

    def _keep(self, loader: KineticsDALILoader) -> KineticsDALILoader:
        if loader.classes != self.classes:
            raise ValueError(f"{self.root}: the manifest's classes ({len(loader.classes)}) are not the "
                             f"dataset layout's ({len(self.classes)}); the model's head would be wrong")
        self._loaders.append(loader)
        return loader

    def teardown(self, stage: str) -> None:
        # The fallback's worker processes and DALI's pipeline end with the fit, not at interpreter exit.
        for loader in self._loaders:
            loader.close()
        self._loaders.clear()


class VideoClassifier(L.LightningModule):
    """``examples/models.py``'s small 3D CNN, float32, trained with SGD; the batch goes in as it comes."""

    def __init__(self, num_classes: int, lr: float = 0.05, model: str = "small3d") -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model = build_model(model, num_classes)

    def forward(self, videos: torch.Tensor) -> torch.Tensor:
        return self.model(videos)

    def training_step(self, batch, batch_idx):
        videos, labels = batch  # float32 (B, C, T, H, W), int64: the loader's default, what the model takes
        loss = F.cross_entropy(self(videos), labels, ignore_index=PADDING_LABEL)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        videos, labels = batch
        keep = labels != PADDING_LABEL
        if not keep.any():  # a batch of padding only (a rank's share rounded up)
            return
        correct = (self(videos).argmax(1) == labels)[keep].float().mean()
        self.log("val_top1", correct, batch_size=int(keep.sum()), sync_dist=True, prog_bar=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9, weight_decay=1e-4)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--root", required=True, help="dataset root (scanned on first use) or a `daliload scan` manifest")
    p.add_argument("--out", default="runs/lightning", help="checkpoints and logs")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--devices", type=int, default=1, help="processes (GPUs, or CPU processes with gloo)")
    p.add_argument("--accelerator", default="auto", choices=("auto", "cpu", "gpu"))
    p.add_argument("--ckpt-path", default=None, help="resume from this Lightning checkpoint")
    p.add_argument("--batch-size", type=int, default=8, help="clips per process per step")
    p.add_argument("--clip-len", type=int, default=16, help="frames per clip")
    p.add_argument("--frame-stride", type=int, default=4, help="source frames between clip frames")
    p.add_argument("--crop-size", type=int, default=112, help="output height and width in pixels")
    p.add_argument("--fallback-workers", type=int, default=2, help="PyAV decoding processes per rank")
    p.add_argument("--routing", choices=("auto", "adaptive", "static"), default="auto",
                   help="static: each clip's decoder pinned, for batches identical bit for bit across runs")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress-bar", dest="progress_bar", action="store_false")
    return p.parse_args(argv)


def main(argv: list[str] | None = None, *, callbacks: list[L.Callback] = ()) -> L.Trainer:
    """Fit; ``callbacks`` join the Trainer's own (a test records the batches with one)."""
    args = parse_args(argv)
    L.seed_everything(args.seed)
    # Under strategy="ddp" Lightning starts the other processes by running this script again.
    on_gpu = args.accelerator == "gpu" or (args.accelerator == "auto" and torch.cuda.is_available())
    data = KineticsDataModule(args.root, batch_size=args.batch_size, clip_len=args.clip_len,
                              frame_stride=args.frame_stride, crop_size=args.crop_size, seed=args.seed,
                              device="gpu" if on_gpu else "cpu", fallback_workers=args.fallback_workers,
                              routing=args.routing)
    model = VideoClassifier(data.num_classes, lr=args.lr)
    out = Path(args.out)
    checkpoints = ModelCheckpoint(dirpath=out / "checkpoints", filename="epoch{epoch}", auto_insert_metric_name=False,
                                  save_top_k=-1, every_n_epochs=1, save_on_train_epoch_end=True)
    trainer = L.Trainer(
        accelerator=args.accelerator, devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",  # gloo on CPUs, NCCL on GPUs
        max_epochs=args.epochs, default_root_dir=out, logger=CSVLogger(out),
        callbacks=[checkpoints, *callbacks], enable_progress_bar=args.progress_bar, log_every_n_steps=1)
    trainer.fit(model, datamodule=data, ckpt_path=args.ckpt_path)
    return trainer


if __name__ == "__main__":
    main()
