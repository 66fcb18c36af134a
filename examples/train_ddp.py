"""Train a video classifier with DDP, fed by KineticsDALILoader.

An ordinary PyTorch DDP training script; the loader is its only data code. Run
it with torchrun (one process per GPU, or a few on a CPU with the gloo
backend), or with plain ``python`` for one process::

    torchrun --nproc_per_node=8 examples/train_ddp.py /data/kinetics700 \\
        --model r2plus1d_18 --epochs 45 --batch-size 32 --clip-len 16 --crop-size 112 \\
        --short-side 128 160
    # on a CPU, the data `daliload demo` generates (val top-1 0.96 in about a minute on 2 cores):
    torchrun --nproc_per_node=2 examples/train_ddp.py demo_out/data --device cpu --epochs 15 \\
        --batch-size 4 --clip-len 8 --frame-stride 8 --crop-size 80 --short-side 88 112 \\
        --lr 0.05 --fallback-workers 0
    # the same command with --resume continues from OUT/checkpoint.pt after a stop;
    # --log tensorboard (or wandb) also sends the numbers to a tracker (examples/tracking.py)

What it writes under ``--out`` (rank 0 only)::

    OUT/
      checkpoint.pt     model, optimizer, LR schedule, AMP scaler, the epoch done,
                        every rank's loader state and the history so far;
                        replaced atomically after every epoch
      metrics.json      arguments, classes, one record per epoch (loss, train and
                        val top-1, clips/s, data wait, DALI share), loader stats,
                        the final multi-view top-1 (``--views``), and
                        ``stopped_early`` when ``--max-minutes`` cut the run short
      tensorboard/ or wandb/   with ``--log tensorboard`` or ``--log wandb``

The same file is installed as ``daliload.examples.train_ddp`` (a symbolic
link; see that package's docstring), which is what ``daliload demo`` runs.
Beside it, and installed the same way: the models (``examples/models.py``),
the DDP set-up and checkpoint writes (``examples/distributed.py``) and
experiment tracking (``examples/tracking.py``, ``--log``). This file is the
loop: arguments, loaders, train and evaluate, resume, one epoch after another.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from daliload import AugmentSpec, DecodeSpec, EvalResult, KineticsDALILoader, evaluate
from daliload.examples.distributed import DistEnv, all_gather, atomic_write, save_checkpoint, setup_distributed
from daliload.examples.models import MODELS, build_model, check_model_name
from daliload.examples.tracking import TRACKERS, WANDB_MODES, Tracker, check_tracker, open_tracker
from daliload.loader import PADDING_LABEL

CHECKPOINT_NAME = "checkpoint.pt"
METRICS_NAME = "metrics.json"


# --------------------------------------------------------------------------------------
# Train and evaluate
# --------------------------------------------------------------------------------------


def timed(iterable):
    """Yield ``(seconds this process waited for the item, item)``."""
    iterator = iter(iterable)
    while True:
        start = time.perf_counter()
        try:
            item = next(iterator)
        except StopIteration:
            return
        yield time.perf_counter() - start, item


def amp_dtype_for(env: DistEnv, amp: bool) -> torch.dtype | None:
    """AMP on a GPU only: bfloat16 where supported (no loss scaling needed), else float16."""
    if not amp or env.device.type != "cuda":
        return None
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def autocast(amp_dtype: torch.dtype | None):
    return torch.autocast("cuda", dtype=amp_dtype) if amp_dtype is not None else nullcontext()


def prepare(videos: torch.Tensor, labels: torch.Tensor, env: DistEnv, amp_dtype):
    videos = videos.to(env.device, non_blocking=True)  # float32, the loader's default: autocast casts from there
    return videos, labels.to(env.device, non_blocking=True).long()


def train_one_epoch(model, loader, optimizer, scheduler, scaler, env: DistEnv, amp_dtype,
                    epoch: int, log_every: int, log, tracker: Tracker) -> dict:
    model.train()
    steps, data_wait = len(loader), 0.0
    totals = torch.zeros(3, device=env.device)  # loss sum, correct, clips
    started = window_start = time.perf_counter()
    window_wait, window_clips = 0.0, 0
    for step, (wait, (videos, labels)) in enumerate(timed(loader), start=1):
        data_wait += wait
        window_wait += wait
        videos, labels = prepare(videos, labels, env, amp_dtype)
        with autocast(amp_dtype):
            logits = model(videos)
            # Training batches carry no padding label; ignore_index keeps a loader
            # built with label_padding=True safe anyway.
            loss = F.cross_entropy(logits, labels, ignore_index=PADDING_LABEL)
        optimizer.zero_grad(set_to_none=True)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        scheduler.step()

        keep = labels != PADDING_LABEL
        correct = (logits.detach().argmax(1) == labels)[keep].sum()
        totals += torch.stack([loss.detach() * keep.sum(), correct, keep.sum()]).float()
        window_clips += len(labels)
        if step % log_every == 0:
            now = time.perf_counter()
            figures = {"train/loss": loss.item(), "train/lr": scheduler.get_last_lr()[0],
                       "train/clips_per_s": window_clips * env.world_size / (now - window_start),
                       "train/data_wait_ms": 1000 * window_wait / log_every}
            log(f"epoch {epoch} step {step}/{steps}  loss {figures['train/loss']:.3f}  "
                f"lr {figures['train/lr']:.4f}  {figures['train/clips_per_s']:.1f} clips/s  "
                f"data wait {figures['train/data_wait_ms']:.0f} ms/step")
            tracker.scalars(figures, step=epoch * steps + step)
            window_start, window_wait, window_clips = now, 0.0, 0
    seconds = time.perf_counter() - started
    if env.world_size > 1:
        dist.all_reduce(totals)
    loss_sum, correct, clips = totals.tolist()
    return {
        "train_loss": loss_sum / max(clips, 1),
        "train_top1": correct / max(clips, 1),
        "train_seconds": seconds,
        "clips_per_s": steps * loader.batch_size * env.world_size / seconds,  # all ranks
        "data_wait_ms_per_step": 1000 * data_wait / max(steps, 1),
        "data_wait_share": data_wait / seconds,
    }


def validate(model, loader, amp_dtype, *, views_per_forward: int | None = None) -> EvalResult:
    """Top-1/top-5 over the split with :func:`daliload.evaluate`: every video exactly once across the ranks.

    The loader pads each rank's share (and the last batch) so DDP ranks stay in
    step; ``evaluate`` drops that padding (and clips that failed to decode) by
    the loader's plan, scores multi-view batches per video, and raises if the
    ranks together did not see each video of the split exactly once. It feeds
    the model its own dtype (float16 or bfloat16 clips would become float32), and
    rank 0 shows a progress bar on a terminal.
    """
    with autocast(amp_dtype):
        return evaluate(model, loader, topk=(1, 5), views_per_forward=views_per_forward)


def evaluate_epoch(model, loader, amp_dtype) -> dict:
    started = time.perf_counter()
    result = validate(model, loader, amp_dtype)
    return {"val_top1": result.top1, "val_clips": result.num_videos, "val_seconds": time.perf_counter() - started}


def evaluate_views(args, model, env: DistEnv, amp_dtype, log) -> dict:
    """The final multi-view evaluation: ``--views T S`` per video, softmax scores averaged per video."""
    views = tuple(args.views)
    per_video = views[0] * views[1]
    loader = KineticsDALILoader(args.root, "val", crop_size=args.crop_size, views=views,
                                **loader_options(args, env, batch_size=max(1, args.batch_size // per_video)))
    started = time.perf_counter()
    result = validate(model, loader, amp_dtype, views_per_forward=args.batch_size)
    loader.close()
    record = {"views": list(views), "top1": result.top1, "top5": result.top5,
              "mean_class_top1": result.mean_class_top1, "videos": result.num_videos,
              "failed": list(result.failed), "seconds": time.perf_counter() - started}
    log(f"multi-view evaluation ({views[0]} x {views[1]} views per video): {result.format()}")
    return record


def cosine_with_warmup(optimizer, total_steps: int, warmup_steps: int):
    """Linear warm-up to the base LR over ``warmup_steps``, then cosine decay to 0 at the end.

    The schedule is a pure function of the step count, which the scheduler's
    state_dict carries, so a resumed job continues it exactly.
    """

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


# --------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Train a video classifier with DDP, fed by KineticsDALILoader.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("root", help="dataset root (scanned on first use) or a `daliload scan` manifest")
    p.add_argument("--out", default="runs/train_ddp", help="checkpoint and metrics directory")
    p.add_argument("--model", default="small3d", choices=MODELS)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32, help="clips per rank per step")
    p.add_argument("--clip-len", type=int, default=16, help="frames per clip")
    p.add_argument("--frame-stride", type=int, default=4, help="source frames between clip frames")
    p.add_argument("--crop-size", type=int, default=224, help="output height and width in pixels")
    p.add_argument("--short-side", type=int, nargs=2, default=(256, 320), metavar=("MIN", "MAX"),
                   help="training scale jitter: short side in pixels before the random crop")
    p.add_argument("--lr", type=float, default=0.1, help="peak learning rate")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=1e-4)
    p.add_argument("--warmup-epochs", type=float, default=1.0, help="linear LR warm-up (0: none)")
    p.add_argument("--no-amp", dest="amp", action="store_false", help="no mixed precision on a GPU")
    p.add_argument("--no-val", dest="val", action="store_false", help="skip validation")
    p.add_argument("--views", type=int, nargs=2, default=(3, 3), metavar=("T", "S"),
                   help="views per video of the final multi-view evaluation: T windows from the first frame "
                        "to the last, S crops along the long side (0 0: none)")
    p.add_argument("--device", default="auto", choices=("auto", "gpu", "cpu"),
                   help="auto: a GPU if torch sees one")
    p.add_argument("--fallback-workers", type=int, default=2,
                   help="PyAV decoding processes per rank (0: decode in the training process)")
    p.add_argument("--dali-threads", type=int, default=4, help="DALI decoding threads per rank")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", nargs="?", const="auto", default=None, metavar="CHECKPOINT",
                   help=f"resume from CHECKPOINT (no value: OUT/{CHECKPOINT_NAME} if it exists)")
    p.add_argument("--max-minutes", type=float, default=None,
                   help="stop after the first epoch past which another would overrun this budget")
    p.add_argument("--log-every", type=int, default=10, help="steps between progress lines")
    p.add_argument("--log", default="none", choices=TRACKERS,
                   help="also log to TensorBoard (OUT/tensorboard) or Weights & Biases (OUT/wandb); "
                        "needs `pip install tensorboard` or `pip install wandb`")
    p.add_argument("--wandb-project", default="daliload", help="Weights & Biases project (--log wandb)")
    p.add_argument("--wandb-mode", default="offline", choices=WANDB_MODES,
                   help="offline: files only, upload later with `wandb sync`; online: log live")
    args = p.parse_args(argv)
    for name in ("epochs", "batch_size", "clip_len", "frame_stride", "crop_size", "log_every"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if min(args.views) < 0 or (min(args.views) == 0 and max(args.views) != 0):
        p.error(f"--views needs two integers >= 1 (or 0 0 for none), got {args.views[0]} {args.views[1]}")
    return args


def loader_options(args, env: DistEnv, **overrides) -> dict:
    return dict(
        batch_size=args.batch_size, clip_len=args.clip_len, frame_stride=args.frame_stride,
        seed=args.seed, device="gpu" if env.device.type == "cuda" else "cpu",
        decode=DecodeSpec(fallback_workers=args.fallback_workers, dali_threads=args.dali_threads)) | overrides


def build_loaders(args, env: DistEnv):
    """The only data code: one KineticsDALILoader per split."""
    options = loader_options(args, env)
    augment = AugmentSpec(crop_size=args.crop_size, short_side_range=tuple(args.short_side))
    train_loader = KineticsDALILoader(args.root, "train", augment=augment, **options)
    val_loader = None
    if args.val:
        val_loader = KineticsDALILoader(args.root, "val", crop_size=args.crop_size, **options)
    return train_loader, val_loader


@dataclasses.dataclass
class Training:
    """The model and what optimises it: everything a checkpoint holds besides the loaders."""

    model: nn.Module  # wrapped in DistributedDataParallel when world_size > 1
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler | None  # float16 autocast only
    amp_dtype: torch.dtype | None

    @property
    def unwrapped(self) -> nn.Module:
        """The model without its DDP wrapper (what a checkpoint stores)."""
        return self.model.module if isinstance(self.model, DistributedDataParallel) else self.model


def build_training(args, env: DistEnv, num_classes: int, steps_per_epoch: int) -> Training:
    """Model (DDP-wrapped across ranks), SGD with Nesterov, warm-up + cosine LR, AMP scaler."""
    model = build_model(args.model, num_classes).to(env.device)
    if env.world_size > 1:
        device_ids = [env.local_rank] if env.device.type == "cuda" else None
        model = DistributedDataParallel(model, device_ids=device_ids)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                                weight_decay=args.weight_decay, nesterov=True)
    scheduler = cosine_with_warmup(optimizer, args.epochs * steps_per_epoch,
                                   round(args.warmup_epochs * steps_per_epoch))
    amp_dtype = amp_dtype_for(env, args.amp)
    scaler = torch.amp.GradScaler("cuda") if amp_dtype == torch.float16 else None
    return Training(model, optimizer, scheduler, scaler, amp_dtype)


def resume(args, out: Path, training: Training, train_loader, env: DistEnv, log) -> tuple[int, list]:
    """Load ``--resume``'s checkpoint, if any; returns ``(first epoch to run, history so far)``."""
    checkpoint_path = out / CHECKPOINT_NAME if args.resume == "auto" else Path(args.resume or "")
    if args.resume is None or (args.resume == "auto" and not checkpoint_path.exists()):
        return 0, []
    if not checkpoint_path.is_file():
        raise FileNotFoundError(f"--resume: no checkpoint at {checkpoint_path}")
    # weights_only=False: our own file, which also holds plain Python objects (history, args).
    checkpoint = torch.load(checkpoint_path, map_location=env.device, weights_only=False)
    if len(checkpoint["loader"]) != env.world_size:
        saved_ranks = len(checkpoint["loader"])
        raise ValueError(f"{checkpoint_path} was written by a job of {saved_ranks} ranks, this "
                         f"one has {env.world_size}: resume with as many processes")
    training.unwrapped.load_state_dict(checkpoint["model"])
    training.optimizer.load_state_dict(checkpoint["optimizer"])
    training.scheduler.load_state_dict(checkpoint["scheduler"])
    if training.scaler is not None and checkpoint["scaler"] is not None:
        training.scaler.load_state_dict(checkpoint["scaler"])
    train_loader.load_state_dict(checkpoint["loader"][env.rank])  # where this rank's plan is
    log(f"resumed from {checkpoint_path} after epoch {checkpoint['epoch']}")
    return checkpoint["epoch"] + 1, checkpoint["history"]


def run_epoch(epoch: int, training: Training, train_loader, val_loader, env: DistEnv, args,
              log, tracker: Tracker) -> tuple[dict, list]:
    """Train one epoch (and validate); returns its record and every rank's loader stats."""
    train_loader.set_epoch(epoch)
    record = {"epoch": epoch, "lr": training.scheduler.get_last_lr()[0]}
    record.update(train_one_epoch(training.model, train_loader, training.optimizer,
                                  training.scheduler, training.scaler, env, training.amp_dtype,
                                  epoch, args.log_every, log, tracker))
    stats = all_gather(train_loader.stats(), env)
    record["clips_dali"] = sum(s.clips_dali for s in stats)
    record["clips_fallback"] = sum(s.clips_fallback for s in stats)
    record["decode_failures"] = sum(len(s.failures) for s in stats)
    if val_loader is not None:
        record.update(evaluate_epoch(training.unwrapped, val_loader, training.amp_dtype))
    record["dali_share"] = record["clips_dali"] / max(1, record["clips_dali"] + record["clips_fallback"])
    tracker.scalars({f"epoch/{k}": v for k, v in record.items() if k != "epoch" and v is not None},
                    step=(epoch + 1) * len(train_loader))
    return record, stats


def save_epoch(out: Path, epoch: int, training: Training, loader_states: list, metrics: dict) -> None:
    """Rank 0's end of an epoch: the checkpoint, then ``metrics.json``, each written atomically."""
    args, history = metrics["args"], metrics["history"]
    save_checkpoint(out / CHECKPOINT_NAME, {
        "model": training.unwrapped.state_dict(), "optimizer": training.optimizer.state_dict(),
        "scheduler": training.scheduler.state_dict(),
        "scaler": training.scaler.state_dict() if training.scaler is not None else None,
        "epoch": epoch, "loader": loader_states, "history": history,
        "args": args, "classes": metrics["classes"]})
    text = json.dumps(metrics, indent=2).encode()
    atomic_write(out / METRICS_NAME, lambda f: f.write(text))


def main(argv: list[str] | None = None) -> dict:
    """Train; returns what ``metrics.json`` holds (on every rank)."""
    args = parse_args(argv)
    check_model_name(args.model)  # before any data work
    check_tracker(args.log)
    env = setup_distributed(args.device)
    log = (lambda msg: print(msg, flush=True)) if env.rank == 0 else (lambda msg: None)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)

    train_loader, val_loader = build_loaders(args, env)
    classes = list(train_loader.classes)
    steps_per_epoch = len(train_loader)
    training = build_training(args, env, len(classes), steps_per_epoch)
    start_epoch, history = resume(args, out, training, train_loader, env, log)

    num_params = sum(p.numel() for p in training.unwrapped.parameters())
    log(f"{len(classes)} classes; {steps_per_epoch} steps/epoch of {args.batch_size} clips x "
        f"{env.world_size} rank(s); model {args.model} ({num_params / 1e6:.2f} M params) on "
        f"{env.device}" + (f" with {training.amp_dtype} autocast" if training.amp_dtype else ""))
    metrics = {"args": vars(args), "classes": classes, "world_size": env.world_size,
               "history": history, "loader_stats": []}
    if start_epoch >= args.epochs:
        log(f"nothing to do: the checkpoint is at epoch {start_epoch - 1} "
            f"of --epochs {args.epochs}")
    tracker = open_tracker(args.log, out, vars(args), rank=env.rank, wandb_project=args.wandb_project,
                           wandb_mode=args.wandb_mode)
    started = time.perf_counter()
    for epoch in range(start_epoch, args.epochs):
        record, stats = run_epoch(epoch, training, train_loader, val_loader, env, args, log, tracker)
        history.append(record)
        log(_epoch_line(record))

        loader_states = all_gather(train_loader.state_dict(), env)
        loader_stats = [dataclasses.asdict(s) | {"dali_share": s.dali_share} for s in stats]
        metrics = {"args": vars(args), "classes": classes, "world_size": env.world_size,
                   "history": history, "loader_stats": loader_stats}
        stop = (args.max_minutes is not None and epoch + 1 < args.epochs
                and _next_epoch_overruns(started, epoch + 1 - start_epoch, args.max_minutes, env))
        if stop:
            reason = f"another epoch would overrun --max-minutes {args.max_minutes:g}"
            metrics["stopped_early"] = {"after_epoch": epoch, "epochs_run": len(history),
                                        "epochs_planned": args.epochs, "reason": reason}
        if env.rank == 0:
            save_epoch(out, epoch, training, loader_states, metrics)
        if stop:
            log(f"stopping after epoch {epoch} ({len(history)} of {args.epochs} epochs): {reason}")
            break

    if val_loader is not None and min(args.views) > 0:
        metrics["multiview"] = evaluate_views(args, training.unwrapped, env, training.amp_dtype, log)
        tracker.scalars({f"eval/multiview_{k}": metrics["multiview"][k] for k in ("top1", "top5")
                         if metrics["multiview"][k] is not None}, step=len(history) * steps_per_epoch)
        if env.rank == 0:
            atomic_write(out / METRICS_NAME, lambda f: f.write(json.dumps(metrics, indent=2).encode()))
    tracker.close()
    if metrics["loader_stats"]:
        log("loader, last epoch (rank 0):\n" + train_loader.stats().format())
    train_loader.close()
    if val_loader is not None:
        val_loader.close()
    if env.world_size > 1:
        dist.barrier()
        dist.destroy_process_group()
    return metrics


def _epoch_line(r: dict) -> str:
    line = f"epoch {r['epoch']} done: loss {r['train_loss']:.3f}  train top-1 {r['train_top1']:.3f}"
    if "val_top1" in r:
        line += f"  val top-1 {r['val_top1']:.3f} ({r['val_clips']} videos)"
    return (line + f"  {r['clips_per_s']:.1f} clips/s  data wait {r['data_wait_ms_per_step']:.0f} "
            f"ms/step ({r['data_wait_share']:.0%} of the epoch)")


def _next_epoch_overruns(started: float, epochs_done: int, max_minutes: float,
                         env: DistEnv) -> bool:
    """Rank 0 decides, so every rank stops after the same epoch."""
    elapsed = time.perf_counter() - started
    overrun = elapsed * (epochs_done + 1) / epochs_done > 60 * max_minutes
    stop = torch.tensor([float(overrun)], device=env.device)
    if env.world_size > 1:
        dist.broadcast(stop, src=0)
    return bool(stop.item())


if __name__ == "__main__":
    main()
