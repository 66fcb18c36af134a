"""Fine-tune a Hugging Face video model with transformers' Trainer, fed by KineticsDALILoader: no daliload glue.

The Hugging Face VideoMAE fine-tuning guide with its PyTorchVideo datasets
swapped for two loaders; ``Trainer`` is told about them where its docs say to
(``get_train_dataloader`` / ``get_eval_dataloader``), and nothing else changes::

    torchrun --nproc_per_node=8 examples/hf_trainer.py --root /data/kinetics700 \\
        --model MCG-NJU/videomae-base --epochs 4
    # on a CPU, 2 processes (gloo), a tiny randomly initialised VideoMAE, on `daliload demo`'s data:
    torchrun --nproc_per_node=2 examples/hf_trainer.py --root demo_out/data --epochs 2 --batch-size 2 --crop-size 32
    # resume after a stop, mid-epoch or not, exactly where the checkpoint was written:
    torchrun --nproc_per_node=2 examples/hf_trainer.py ... --resume OUT/checkpoint-3

What ``Trainer`` reads from the loader, and why each works as it is:

- Batches are dicts ``{"pixel_values": (B, T, C, H, W), "labels": (B,)}``
  (``batch_keys``, ``OutputSpec(layout="TCHW")``): ``model(**batch)`` as
  VideoMAE takes it; no collator. The loader is built after
  ``TrainingArguments``, which joins torchrun's process group, so it takes its
  rank and world size from ``torch.distributed`` and yields this rank's share
  on this rank's device: ``Trainer`` (through Accelerate) wraps only torch
  ``DataLoader`` objects.
- ``len(loader)`` gives the steps per epoch; ``loader.set_epoch(epoch)``,
  called by ``Trainer`` before each epoch, draws that epoch's plan.
- Resuming mid-epoch: ``Trainer`` calls Accelerate's ``skip_first_batches(loader,
  n)``, which reads ``loader.dataset``, ``loader.batch_sampler`` and the other
  ``DataLoader`` attributes and builds a ``DataLoader`` that yields the loader's
  batches from batch ``n``; the loader decodes none of the ``n`` it skips. So
  the resumed run trains on the batches the uninterrupted run would have
  trained on, in the same order. Leave ``ignore_data_skip`` off: with it
  ``Trainer`` starts the epoch again from its first batch, counts the steps it
  had already done, and stops short.
- Evaluation: the val loader's padding rows (repeats that keep the ranks'
  batch counts equal) carry ``padding_label=-100``, the label Hugging Face
  losses ignore, and ``compute_metrics`` leaves them out of the accuracy; the
  val loader is built once, not at each evaluation.

Writes Trainer checkpoints (``OUT/checkpoint-<step>``) every ``--save-steps``
steps, or at each epoch's end. Needs ``pip install transformers``; ``--model
tiny`` (default) is a small randomly initialised VideoMAE that trains on a CPU.
"""

from __future__ import annotations

import argparse

import torch
from transformers import Trainer, TrainingArguments, VideoMAEConfig, VideoMAEForVideoClassification

from daliload import DecodeSpec, KineticsDALILoader, OutputSpec

#: ``VideoMAEImageProcessor``'s defaults (0..1 units), for the randomly initialised model.
TINY_MEAN, TINY_STD = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)


class VideoTrainer(Trainer):
    """``Trainer`` given its train and eval loaders where its docs say to override; ``loader.dataset`` (the split's
    videos) is the dataset ``Trainer`` counts and checks for."""

    def __init__(self, *args, train_loader: KineticsDALILoader, eval_loader: KineticsDALILoader | None = None,
                 **kwargs) -> None:
        super().__init__(*args, train_dataset=train_loader.dataset,
                         eval_dataset=eval_loader.dataset if eval_loader is not None else None, **kwargs)
        self.train_loader, self.eval_loader = train_loader, eval_loader

    def get_train_dataloader(self) -> KineticsDALILoader:
        return self.train_loader

    def get_eval_dataloader(self, eval_dataset=None) -> KineticsDALILoader:
        return self.eval_loader


def compute_metrics(prediction) -> dict:
    """Top-1 accuracy over the rows that are not padding (label -100)."""
    logits, labels = prediction.predictions, prediction.label_ids
    keep = labels != -100
    return {"accuracy": float((logits.argmax(-1)[keep] == labels[keep]).mean()) if keep.any() else 0.0}


def build_model(name: str, num_classes: int, clip_len: int, crop_size: int) -> VideoMAEForVideoClassification:
    """``tiny``: a randomly initialised 2-layer VideoMAE for ``clip_len`` frames of ``crop_size`` pixels; else a
    checkpoint with a new head of ``num_classes``, as the fine-tuning guide loads it."""
    if name == "tiny":
        config = VideoMAEConfig(image_size=crop_size, patch_size=8, num_frames=clip_len, tubelet_size=2,
                                hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                num_labels=num_classes,
                                # transformers 5.24 saves the q/v biases as q_bias/v_bias and loads them back
                                # under other names (a resumed model would start them again from zero)
                                qkv_bias=False)
        return VideoMAEForVideoClassification(config)
    return VideoMAEForVideoClassification.from_pretrained(name, num_labels=num_classes, ignore_mismatched_sizes=True)


def normalization(model: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The mean and std (0..1 units) the model was trained with: its image processor's, as the guide reads them."""
    if model == "tiny":
        return TINY_MEAN, TINY_STD
    from transformers import AutoImageProcessor

    processor = AutoImageProcessor.from_pretrained(model)
    return tuple(processor.image_mean), tuple(processor.image_std)


def build_loaders(args: argparse.Namespace) -> tuple[KineticsDALILoader, KineticsDALILoader | None]:
    """The only data code: two loaders whose batches are what VideoMAE's ``forward`` takes."""
    mean, std = normalization(args.model)
    output = OutputSpec(layout="TCHW", mean=mean, std=std)  # the processor's 0..1 units, taken as they are
    # The Trainer gathers every rank's evaluation batch into one tensor, so evaluation batches keep their size:
    # padding rows stay, labelled -100 (label_padding=True), which its loss and compute_metrics leave out.
    options = dict(batch_size=args.batch_size, clip_len=args.clip_len, frame_stride=args.frame_stride,
                   crop_size=args.crop_size, seed=args.seed, output=output, padding_label=-100, label_padding=True,
                   batch_keys=("pixel_values", "labels"), device="cpu" if args.cpu else "auto",
                   decode=DecodeSpec(fallback_workers=args.fallback_workers, routing=args.routing))
    train = KineticsDALILoader(args.root, "train", **options)
    val = KineticsDALILoader(args.root, "val", **options) if args.eval else None
    return train, val


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--root", required=True, help="dataset root (scanned on first use) or a `daliload scan` manifest")
    p.add_argument("--out", default="runs/hf_trainer", help="checkpoints")
    p.add_argument("--model", default="tiny", help="'tiny' (random init) or a checkpoint, e.g. MCG-NJU/videomae-base")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--resume", default=None, metavar="DIR", help="an OUT/checkpoint-<step> folder to continue from")
    p.add_argument("--save-steps", type=int, default=0, help="checkpoint every N steps (0: at each epoch's end)")
    p.add_argument("--cpu", action="store_true", help="train on the CPU even where a GPU is visible")
    p.add_argument("--batch-size", type=int, default=8, help="clips per process per step")
    p.add_argument("--clip-len", type=int, default=16, help="frames per clip (the model's num_frames)")
    p.add_argument("--frame-stride", type=int, default=4, help="source frames between clip frames")
    p.add_argument("--crop-size", type=int, default=224, help="output height and width in pixels")
    p.add_argument("--fallback-workers", type=int, default=2, help="PyAV decoding processes per rank")
    p.add_argument("--routing", choices=("auto", "adaptive", "static"), default="auto",
                   help="static: each clip's decoder pinned, for batches identical bit for bit across runs")
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-eval", dest="eval", action="store_false", help="skip evaluation")
    return p.parse_args(argv)


def main(argv: list[str] | None = None, *, callbacks: list = ()) -> VideoTrainer:
    """Train (and resume); ``callbacks`` join the Trainer's (a test records the steps with one)."""
    args = parse_args(argv)
    args.cpu = args.cpu or not torch.cuda.is_available()
    training = TrainingArguments(
        output_dir=args.out, per_device_train_batch_size=args.batch_size, per_device_eval_batch_size=args.batch_size,
        num_train_epochs=args.epochs, learning_rate=args.lr, seed=args.seed, use_cpu=args.cpu,
        save_strategy="steps" if args.save_steps else "epoch", save_steps=args.save_steps or 500,
        eval_strategy="epoch" if args.eval else "no", logging_steps=1, report_to="none",
        remove_unused_columns=False, ddp_find_unused_parameters=False, disable_tqdm=True)
    # After TrainingArguments (the process group is up): the loaders take their rank from it.
    train_loader, val_loader = build_loaders(args)
    model = build_model(args.model, len(train_loader.classes), args.clip_len, args.crop_size)
    model.config.id2label = dict(enumerate(train_loader.classes))
    model.config.label2id = {name: i for i, name in enumerate(train_loader.classes)}
    trainer = VideoTrainer(model=model, args=training, train_loader=train_loader, eval_loader=val_loader,
                           compute_metrics=compute_metrics, callbacks=list(callbacks))
    trainer.train(resume_from_checkpoint=args.resume)
    train_loader.close()
    if val_loader is not None:
        val_loader.close()
    return trainer


if __name__ == "__main__":
    main()
