"""Train with Hugging Face Accelerate, fed by KineticsDALILoader: a plain loop that calls nothing daliload-specific.

Launch one process per GPU (or a few CPU processes, gloo) with ``accelerate
launch`` or ``torchrun``; plain ``python`` runs one process::

    accelerate launch --multi_gpu --num_processes 8 examples/accelerate_train.py --root /data/kinetics700 --epochs 45
    # on a CPU, 2 processes (gloo) on the data `daliload demo` generates; use torchrun there:
    # `accelerate launch --cpu --num_processes 2` starts one process (Accelerate 1.15, without `accelerate config`)
    torchrun --nproc_per_node=2 examples/accelerate_train.py --root demo_out/data --epochs 5 \\
        --batch-size 4 --clip-len 8 --frame-stride 8 --crop-size 80
    # resume after a stop, from the state saved at the end of an epoch:
    torchrun --nproc_per_node=2 examples/accelerate_train.py ... --resume OUT/epoch2

How the loader fits Accelerate's loop:

- It is built after ``Accelerator()``, which joins the launcher's process
  group, so it takes its rank and world size from ``torch.distributed``.
- ``accelerator.prepare(...)`` wraps torch ``DataLoader`` objects (to shard
  and move them) and hands anything else back untouched: the loader already
  yields this rank's share, on ``cuda:LOCAL_RANK`` (or the CPU).
- The loop calls no ``set_epoch``: a pass over the loader that nothing set an
  epoch for draws the epoch after the previous pass's, so pass ``n`` draws
  epoch ``n``, a fresh and deterministic plan, as a ``DataLoader`` over a
  ``RandomSampler`` would give.
- ``accelerator.register_for_checkpointing(loader)`` stores the loader's
  ``state_dict()`` in ``save_state`` and loads it back in ``load_state``.
  Accelerate writes that file from the main process only; the state has no
  rank in it (epoch, batch, and what must match: seed, world size, the video
  list), so every rank loads it and resumes its own share. Saved at the end of
  epoch ``e``, it holds ``epoch e + 1, batch 0``: the next pass draws the plan
  the uninterrupted run's epoch ``e + 1`` drew.

Writes ``OUT/epoch<E>/`` (Accelerate's ``save_state``) at the end of each
epoch. Needs ``pip install accelerate``; the model is ``examples/models.py``'s
(imported as ``daliload.examples.models``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F
from accelerate import Accelerator

from daliload import AugmentSpec, DecodeSpec, KineticsDALILoader, evaluate
from daliload.examples.models import build_model


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--root", required=True, help="dataset root (scanned on first use) or a `daliload scan` manifest")
    p.add_argument("--out", default="runs/accelerate", help="where each epoch's state is saved")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--resume", default=None, metavar="DIR", help="an OUT/epoch<E> folder to continue from")
    p.add_argument("--cpu", action="store_true", help="train on the CPU even where a GPU is visible")
    p.add_argument("--batch-size", type=int, default=8, help="clips per process per step")
    p.add_argument("--clip-len", type=int, default=16, help="frames per clip")
    p.add_argument("--frame-stride", type=int, default=4, help="source frames between clip frames")
    p.add_argument("--crop-size", type=int, default=112, help="output height and width in pixels")
    p.add_argument("--fallback-workers", type=int, default=2, help="PyAV decoding processes per rank")
    p.add_argument("--routing", choices=("auto", "adaptive", "static"), default="auto",
                   help="static: each clip's decoder pinned, for batches identical bit for bit across runs")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-val", dest="val", action="store_false", help="skip validation")
    return p.parse_args(argv)


def build_loaders(args: argparse.Namespace, device: str) -> tuple[KineticsDALILoader, KineticsDALILoader | None]:
    """The only data code: the train loader (and the val one), for this process's rank."""
    options = dict(batch_size=args.batch_size, clip_len=args.clip_len, frame_stride=args.frame_stride,
                   seed=args.seed, device=device, decode=DecodeSpec(fallback_workers=args.fallback_workers,
                                                                       routing=args.routing))
    augment = AugmentSpec(crop_size=args.crop_size, crop_mode="random_resized", area_range=(0.3, 1.0))
    train_loader = KineticsDALILoader(args.root, "train", augment=augment, **options)
    val_loader = KineticsDALILoader(args.root, "val", crop_size=args.crop_size, **options) if args.val else None
    return train_loader, val_loader


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    accelerator = Accelerator(cpu=args.cpu or not torch.cuda.is_available())
    torch.manual_seed(args.seed)
    # After Accelerator(): the process group is up, so the loaders take their rank from it.
    train_loader, val_loader = build_loaders(args, "gpu" if accelerator.device.type == "cuda" else "cpu")

    model = build_model("small3d", len(train_loader.classes))  # float32; the loader's batches are float32
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    # The loader comes back as it went in (it is no torch DataLoader); the model comes back DDP-wrapped.
    model, optimizer, train_loader = accelerator.prepare(model, optimizer, train_loader)
    accelerator.register_for_checkpointing(train_loader)

    first_epoch = 0
    if args.resume:
        accelerator.load_state(args.resume)
        first_epoch = train_loader.state_dict()["epoch"]  # the epoch the loader's next pass draws
        accelerator.print(f"resumed from {args.resume} at epoch {first_epoch}")

    out = Path(args.out)
    for epoch in range(first_epoch, args.epochs):
        model.train()
        loss_sum, steps = torch.zeros((), device=accelerator.device), 0
        for videos, labels in train_loader:  # this pass draws epoch `epoch`: nothing to call
            loss = F.cross_entropy(model(videos), labels)
            optimizer.zero_grad(set_to_none=True)
            accelerator.backward(loss)
            optimizer.step()
            loss_sum, steps = loss_sum + loss.detach(), steps + 1
        line = f"epoch {epoch}: loss {accelerator.reduce(loss_sum / max(steps, 1), 'mean').item():.3f}"
        if val_loader is not None:
            # Every val video exactly once across the ranks (padding dropped); the same result on every rank.
            line += f"  val top-1 {evaluate(accelerator.unwrap_model(model), val_loader, topk=(1,)).top1:.3f}"
        accelerator.print(line)
        accelerator.save_state(str(out / f"epoch{epoch}"))

    train_loader.close()
    if val_loader is not None:
        val_loader.close()
    accelerator.end_training()


if __name__ == "__main__":
    main()
