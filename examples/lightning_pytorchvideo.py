"""PyTorchVideo's Kinetics tutorial under PyTorch Lightning, with KineticsDALILoader in place of its dataset.

The tutorial (pytorchvideo.org, "Training a PyTorchVideo classification
model") builds ``pytorchvideo.data.Kinetics`` with
``make_clip_sampler("random", 2)`` and a transform chain
(``UniformTemporalSubsample(8)``, ``x / 255``, ``Normalize((0.45,) * 3,
(0.225,) * 3)``, ``RandomShortSideScale(256, 320)``, ``RandomCrop(224)``,
``RandomHorizontalFlip``) inside a ``DataLoader``, and its LightningModule
reads ``batch["video"]`` and ``batch["label"]``. Here the data module returns
a loader with those settings as arguments, and the module is the tutorial's,
unchanged but for the model (``examples/models.py``'s small 3D CNN in place of
``create_resnet``, so that it trains on a CPU) and the validation step's
batch size::

    python examples/lightning_pytorchvideo.py --root /data/kinetics400 --devices 8 --epochs 45
    # on a CPU, 2 DDP processes (gloo) on `daliload demo`'s data:
    python examples/lightning_pytorchvideo.py --root demo_out/data --accelerator cpu --devices 2 --epochs 2 \\
        --batch-size 2 --crop-size 32 --short-side 40 48
    # resume, mid-epoch or at an epoch's end, from a Lightning checkpoint:
    python examples/lightning_pytorchvideo.py ... --ckpt-path OUT/checkpoints/last.ckpt

The tutorial's choices, as the loader's arguments:

- ``make_clip_sampler("random", 2)`` + ``UniformTemporalSubsample(8)``: one
  random 2-second window per video per epoch, 8 frames spread over it:
  ``clip_len=8, frame_stride=1, target_fps=4`` (a frame every 1/4 s whatever
  each video's frame rate). The "uniform" sampler of its validation set (every 2-second
  window of each video) is multi-view evaluation: ``views=(num_windows, 1)``
  (here one centre window, the loader's default for a val split).
- ``RandomShortSideScale(256, 320)`` + ``RandomCrop(224)`` + flip:
  ``AugmentSpec(crop_mode="short_side_jitter", short_side_range=(256, 320),
  crop_size=224, flip_prob=0.5)`` (the default mode). Validation: the val
  split's centre crop is the largest centred square, i.e.
  ``ShortSideScale(224)`` + ``CenterCrop(224)``; the tutorial's
  ``ShortSideScale(256)`` + ``CenterCrop(224)`` keeps a little less of the
  frame.
- ``x / 255`` + ``Normalize((0.45,) * 3, (0.225,) * 3)``:
  ``OutputSpec(mean=(0.45,) * 3, std=(0.225,) * 3)`` (0..1 units, as the tutorial writes them).
- Dict batches with ``"video"`` (B, C, T, H, W) and ``"label"``:
  ``batch_keys=("video", "label")``.
- The val split's padding rows (repeats that keep the ranks' batch counts
  equal) are left out of its batches (``label_padding="drop"``, the default
  when a loader evaluates), so the tutorial's ``validation_step`` runs
  unchanged and Lightning, which weights a logged mean by the batch's size,
  counts every video once. Where a padding row must stay (``batch_size=1``),
  it carries ``padding_label=-100``, which ``F.cross_entropy`` ignores.

Lightning calls ``loader.sampler.set_epoch`` before each epoch and saves the
loader's ``state_dict`` in every checkpoint (see
``examples/lightning_datamodule.py``): resuming from a mid-epoch checkpoint
goes on with the next batch.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint

from daliload import AugmentSpec, DecodeSpec, KineticsDALILoader, OutputSpec, load_index
from daliload.examples.models import Small3DCNN

#: The tutorial's Normalize((0.45, 0.45, 0.45), (0.225, 0.225, 0.225)), in its 0..1 units.
PYTORCHVIDEO_NORMALIZE = OutputSpec(mean=(0.45,) * 3, std=(0.225,) * 3)


class KineticsDataModule(L.LightningDataModule):
    """The tutorial's data module: a train and a val loader, dict batches ``{"video", "label"}``."""

    def __init__(self, data_path: str, *, batch_size: int = 8, clip_len: int = 8, clip_duration: float = 2.0,
                 crop_size: int = 224, short_side: tuple[int, int] = (256, 320), seed: int = 0,
                 device: str = "auto", fallback_workers: int = 2, routing: str = "auto") -> None:
        super().__init__()
        self.data_path = data_path
        self.options = dict(batch_size=batch_size, clip_len=clip_len, frame_stride=1,
                            target_fps=clip_len / clip_duration,
                            seed=seed, device=device, output=PYTORCHVIDEO_NORMALIZE, batch_keys=("video", "label"),
                            padding_label=-100,
                            decode=DecodeSpec(fallback_workers=fallback_workers, routing=routing))
        self.crop_size, self.short_side = crop_size, short_side
        self.loaders: list[KineticsDALILoader] = []

    def train_dataloader(self) -> KineticsDALILoader:
        augment = AugmentSpec(crop_mode="short_side_jitter", short_side_range=self.short_side,
                              crop_size=self.crop_size, flip_prob=0.5)
        return self._keep(KineticsDALILoader(self.data_path, "train", augment=augment, **self.options))

    def val_dataloader(self) -> KineticsDALILoader:
        # The centre window and the largest centred crop (the tutorial's ShortSideScale(256) + CenterCrop(224)
        # crops a fixed short side; AugmentSpec(crop_mode="center") keeps the whole short side). Padding rows,
        # which only keep the ranks' batch counts equal, are left out of evaluation batches by default, so the
        # tutorial's validation step and Lightning's weighting by batch size count every video once.
        return self._keep(KineticsDALILoader(self.data_path, "val", crop_size=self.crop_size, **self.options))

    def _keep(self, loader: KineticsDALILoader) -> KineticsDALILoader:
        self.loaders.append(loader)
        return loader

    def teardown(self, stage: str) -> None:
        for loader in self.loaders:  # the decoders' processes end with the fit
            loader.close()
        self.loaders.clear()


class VideoClassificationLightningModule(L.LightningModule):
    """The tutorial's module: ``batch["video"]`` in, cross entropy on ``batch["label"]``."""

    def __init__(self, num_classes: int, lr: float = 0.1, dropout: float = 0.5) -> None:
        super().__init__()
        self.save_hyperparameters()
        # The tutorial: create_resnet(model_depth=50, ...), whose head has dropout 0.5 too.
        self.model = Small3DCNN(num_classes, dropout=dropout)

    def forward(self, x):
        return self.model(x)

    def training_step(self, batch, batch_idx):
        # The model expects a video tensor of shape (B, C, T, H, W), which is the format the loader gives.
        y_hat = self.model(batch["video"])
        loss = F.cross_entropy(y_hat, batch["label"])
        self.log("train_loss", loss.item())
        return loss

    def validation_step(self, batch, batch_idx):
        y_hat = self.model(batch["video"])
        loss = F.cross_entropy(y_hat, batch["label"])
        self.log("val_loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--root", required=True, help="dataset root (train/ and val/ folders) or a `daliload scan` manifest")
    p.add_argument("--out", default="runs/pytorchvideo", help="checkpoints and logs")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--devices", type=int, default=1, help="processes (GPUs, or CPU processes with gloo)")
    p.add_argument("--accelerator", default="auto", choices=("auto", "cpu", "gpu"))
    p.add_argument("--ckpt-path", default=None, help="resume from this Lightning checkpoint")
    p.add_argument("--batch-size", type=int, default=8, help="clips per process per step")
    p.add_argument("--clip-len", type=int, default=8, help="frames per clip (UniformTemporalSubsample)")
    p.add_argument("--clip-duration", type=float, default=2.0, help="seconds a clip spans (make_clip_sampler)")
    p.add_argument("--crop-size", type=int, default=224, help="RandomCrop / CenterCrop size in pixels")
    p.add_argument("--short-side", type=int, nargs=2, default=(256, 320), metavar=("MIN", "MAX"),
                   help="RandomShortSideScale's range in pixels (validation: MIN)")
    p.add_argument("--fallback-workers", type=int, default=2, help="PyAV decoding processes per rank")
    p.add_argument("--routing", choices=("auto", "adaptive", "static"), default="auto",
                   help="static: each clip's decoder pinned, for batches identical bit for bit across runs")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--dropout", type=float, default=0.5,
                   help="before the head (Lightning does not restore the random state on resume: 0 makes a resumed "
                        "run's losses those of the uninterrupted run)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None, *, callbacks: list[L.Callback] = ()) -> L.Trainer:
    """Fit; ``callbacks`` join the Trainer's own (a test records the batches with one)."""
    args = parse_args(argv)
    L.seed_everything(args.seed)
    on_gpu = args.accelerator == "gpu" or (args.accelerator == "auto" and torch.cuda.is_available())
    data = KineticsDataModule(args.root, batch_size=args.batch_size, clip_len=args.clip_len,
                              clip_duration=args.clip_duration, crop_size=args.crop_size,
                              short_side=tuple(args.short_side), seed=args.seed, device="gpu" if on_gpu else "cpu",
                              fallback_workers=args.fallback_workers, routing=args.routing)
    # The head is built before any loader: the classes from the dataset's layout (a listing, no probing).
    num_classes = len(load_index(args.root, "train").classes) if Path(args.root).is_dir() else None
    if num_classes is None:
        raise SystemExit(f"--root {args.root}: this example reads the classes from a dataset folder")
    model = VideoClassificationLightningModule(num_classes, lr=args.lr, dropout=args.dropout)
    out = Path(args.out)
    checkpoints = ModelCheckpoint(dirpath=out / "checkpoints", save_last=True, save_top_k=-1, every_n_epochs=1)
    trainer = L.Trainer(accelerator=args.accelerator, devices=args.devices,
                        strategy="ddp" if args.devices > 1 else "auto", max_epochs=args.epochs,
                        default_root_dir=out, callbacks=[checkpoints, *callbacks], enable_progress_bar=False,
                        logger=False, log_every_n_steps=1)
    trainer.fit(model, datamodule=data, ckpt_path=args.ckpt_path)
    return trainer


if __name__ == "__main__":
    main()
