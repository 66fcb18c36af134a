"""``daliload demo``: the whole product in one command, on any machine.

Four steps, each printed as it runs:

1. **generate** a small Kinetics-like dataset (:mod:`daliload.synth`): a few
   motion classes, H.264 and VP9 files, and a few broken ones;
2. **scan** it (:mod:`daliload.prescreen`): every file is routed to DALI, to
   the PyAV fallback, or out (with the reason);
3. **train** the DDP example (``examples/train_ddp.py``, installed as
   :mod:`daliload.examples.train_ddp`) on it for a few minutes, in this
   process, exactly as ``torchrun --nproc_per_node=1`` would;
4. **report**: validation top-1 against chance, the loader's DALI and fallback
   shares, rejected and failed files with reasons, throughput, and a folder::

    OUT/
      data/                 the generated dataset (and .daliload/manifest.sqlite)
      dataset_spec.txt      the spec it was generated from (a re-run with the
                            same spec reuses the data)
      run/                  checkpoint.pt and metrics.json of the training script
      report/
        contact_sheet.png   augmented training clips: label, file, decoder, source frames
        training_curve.png  loss and top-1 per epoch, chance level, multi-view top-1
        metrics.json        every number printed, and the per-epoch history

The defaults fit a 2-core CPU machine in under 10 minutes: 6 classes of 32
files at 170x128 (half of Kinetics' 340x256, and inside NVDEC's VP9 minimum of
128x128 on a GPU), 8-frame clips at stride 8 cropped to 80x80, 15 epochs of the
small 3D CNN, decoded as users' runs decode them: DALI where the scan routed a
file, the PyAV fallback in its worker processes (``DecodeSpec``'s default)
for the rest. On 2 cores those processes share the cores with the training
step and do not make the demo faster (on a busy machine they made it slower
than ``--fallback-workers 0``, the debugging mode): the demo shows the mode a
user runs. Training stops at a time cap (``--minutes``) after the epoch past
which another would overrun it; the demo then says how many of the planned
epochs ran, and the report records both. docs/demo.md gives a run's figures,
written from its ``metrics.json`` by ``python -m benchmarks.demo_section``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from daliload.commands._demo_machine import load_average, machine_facts

logger = logging.getLogger(__name__)

HELP = "generate a small dataset, scan it, train the DDP example on it for minutes, write a report"


@dataclass(frozen=True)
class DemoConfig:
    """What the demo generates and how it trains (defaults: the 2-core CPU setting).

    Attributes:
        out: output folder (see the module docstring).
        num_classes: motion classes (chance is about ``1 / num_classes``).
        clips_per_class: files per class over train and val.
        val_fraction: share of each class's files in val.
        width, height: generated frame size in pixels.
        duration_s: generated clip length in seconds.
        codec_mix: codec -> share of the normal files.
        broken_fraction: share of all files that are broken or odd.
        epochs: training epochs (the cosine LR schedule spans them).
        minutes: training time budget; training stops early after the epoch
            past which another would overrun it.
        batch_size, clip_len, frame_stride, crop_size, short_side, lr, model:
            passed to the training script.
        fallback_workers, dali_threads: decoding parallelism per rank.
        seed: dataset and training seed.
        synth_workers: encoder processes for the dataset.
    """

    out: str = "demo_out"
    num_classes: int = 6
    clips_per_class: int = 32
    val_fraction: float = 0.25
    width: int = 170
    height: int = 128
    duration_s: float = 3.0
    codec_mix: tuple[tuple[str, float], ...] = (("h264", 0.5), ("vp9", 0.5))
    broken_fraction: float = 0.04
    epochs: int = 15
    minutes: float = 6.0
    batch_size: int = 8
    clip_len: int = 8
    frame_stride: int = 8
    crop_size: int = 80
    short_side: tuple[int, int] = (88, 112)
    lr: float = 0.05
    model: str = "small3d"
    fallback_workers: int = 2  # DecodeSpec's default: the mode users get (0 decodes in the training process)
    dali_threads: int = 2
    seed: int = 0
    synth_workers: int = 2


@dataclass(frozen=True)
class DemoResult:
    """The headline numbers of a demo run (everything else is in ``report/metrics.json``).

    Attributes:
        val_top1: validation top-1 after the last epoch, 0..1 (one centred view per video).
        multiview_top1: the same model's top-1 over 3 x 3 views per video
            (temporal windows from the first frame to the last, three crops),
            ``nan`` when it did not run.
        chance: share of the largest class among the usable val videos.
        epochs: epochs trained (fewer than ``epochs_planned`` when the time cap cut training short).
        epochs_planned: epochs asked for (:attr:`DemoConfig.epochs`).
        stopped_early: why training stopped before ``epochs_planned``, or ``None``.
        clips_per_s: training throughput over all epochs, clips/s (all ranks).
        dali_share: share of training clips DALI decoded, over all epochs.
        report_dir: the report folder.
        seconds: wall time of the whole demo.
    """

    val_top1: float
    multiview_top1: float
    chance: float
    epochs: int
    epochs_planned: int
    stopped_early: str | None
    clips_per_s: float
    dali_share: float
    report_dir: str
    seconds: float


def run_demo(config: DemoConfig, *, echo: Callable[[str], None] = logger.info) -> DemoResult:
    """Generate, scan, train and report (see the module docstring).

    Args:
        config: what to generate and how to train.
        echo: receives each progress and result line (the CLI prints them).

    Returns:
        :class:`DemoResult`; ``OUT/report/metrics.json`` holds everything else.
    """
    import torch

    started = time.perf_counter()
    load_start = load_average()
    out = Path(config.out).absolute()
    data, run_dir, report_dir = out / "data", out / "run", out / "report"
    report_dir.mkdir(parents=True, exist_ok=True)
    device = "gpu" if torch.cuda.is_available() else "cpu"
    seconds: dict[str, float] = {}

    t0 = time.perf_counter()
    dataset = _generate(config, out, data, echo)
    seconds["generate"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    scanned = _scan(data, device, echo)
    seconds["scan"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    metrics = _train(config, data, run_dir, echo)
    seconds["train"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    history = metrics["history"]
    last = history[-1]
    pictures = _draw(config, data, report_dir, metrics, chance=scanned["chance"])
    throughput = _throughput(history)
    loader = _loader_totals(metrics, data)
    seconds["report"] = time.perf_counter() - t0
    seconds["total"] = time.perf_counter() - started

    report = {
        "machine": machine_facts(device, load_start),
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(config).items()},
        "dataset": dataset,
        "scan": {k: v for k, v in scanned.items() if k != "chance"},
        "training": {"epochs_run": len(history), "epochs_planned": config.epochs,
                     "stopped_early": metrics.get("stopped_early"), "time_cap_minutes": config.minutes,
                     "fallback_workers": config.fallback_workers, "val_top1": last.get("val_top1"),
                     "multiview": metrics.get("multiview"),
                     "chance": scanned["chance"], **throughput, "history": history},
        "loader": loader,
        "report": pictures,
        "seconds": seconds,
    }
    (report_dir / "metrics.json").write_text(json.dumps(report, indent=2))
    _echo_report(report, report_dir, echo)
    multiview = metrics.get("multiview") or {}
    return DemoResult(val_top1=float(last.get("val_top1", float("nan"))),
                      multiview_top1=float(multiview.get("top1", float("nan"))), chance=scanned["chance"],
                      epochs=len(history), epochs_planned=config.epochs,
                      stopped_early=(metrics.get("stopped_early") or {}).get("reason"),
                      clips_per_s=throughput["clips_per_s"],
                      dali_share=loader["dali_share"],
                      report_dir=str(report_dir), seconds=seconds["total"])


def _generate(config: DemoConfig, out: Path, data: Path, echo) -> dict:
    """Step 1: write the dataset, or reuse one generated from the same spec."""
    from daliload.synth.dataset import generate_dataset, read_report
    from daliload.synth.spec import SynthSpec

    spec = SynthSpec(num_classes=config.num_classes, clips_per_class=config.clips_per_class,
                     val_fraction=config.val_fraction, width=config.width, height=config.height,
                     duration_s=config.duration_s, codec_mix=dict(config.codec_mix),
                     broken_fraction=config.broken_fraction, seed=config.seed)
    spec_file = out / "dataset_spec.txt"
    if spec_file.exists() and spec_file.read_text() == repr(spec) and (data / "synth.tsv").exists():
        echo(f"[1/4] reusing the dataset in {data} (same spec)")
    else:
        echo(f"[1/4] generating {spec.num_files} files ({spec.num_classes} classes, "
             f"{spec.width}x{spec.height}, {spec.duration_s:g} s) in {data}")
        spec_file.unlink(missing_ok=True)  # written back only once the dataset is complete
        generate_dataset(data, spec, workers=config.synth_workers, progress=True)
        spec_file.write_text(repr(spec))
    clips = read_report(data)
    codecs = Counter(c.codec for c in clips if c.broken is None)
    broken = Counter(c.broken for c in clips if c.broken is not None)
    echo(f"      {len(clips)} files: " + ", ".join(f"{k} {n}" for k, n in sorted(codecs.items()))
         + "; broken on purpose: "
         + (", ".join(f"{k} {n}" for k, n in sorted(broken.items())) or "none"))
    return {"root": str(data), "classes": list(spec.class_names), "files": len(clips),
            "codecs": dict(codecs), "broken": dict(broken)}


def _scan(data: Path, device: str, echo) -> dict:
    """Step 2: route every file; the chance level comes from the usable val videos."""
    from daliload.prescreen import ROUTES, Manifest, scan

    echo(f"[2/4] scanning for device {device!r}")
    summary = scan(data, device=device, progress=True)
    with Manifest(summary.manifest_path) as manifest:
        entries = manifest.entries(device=device)
    echo("      routes: " + ", ".join(f"{route} {summary.files.get(route, 0)}" for route in ROUTES)
         + f" ({summary.elapsed_s:.1f} s)")
    for (route, reason), count in sorted(summary.reasons.items()):
        echo(f"        {route}: {count} x {reason}")
    val_labels = Counter(e.label for e in entries if e.split == "val" and e.route != "bad")
    return {
        "device": device,
        "files": dict(summary.files),
        "reasons": [[route, reason, n] for (route, reason), n in sorted(summary.reasons.items())],
        "bad_files": [{"path": os.path.relpath(e.path, data), "reason": e.reason}
                      for e in entries if e.route == "bad"],
        "chance": max(val_labels.values()) / sum(val_labels.values()),
    }


def _train(config: DemoConfig, data: Path, run_dir: Path, echo) -> dict:
    """Step 3: the DDP example, in this process (a one-rank job)."""
    from daliload.examples import train_ddp

    argv = [str(data), "--out", str(run_dir), "--model", config.model,
            "--epochs", str(config.epochs), "--batch-size", str(config.batch_size),
            "--clip-len", str(config.clip_len), "--frame-stride", str(config.frame_stride),
            "--crop-size", str(config.crop_size),
            "--short-side", str(config.short_side[0]), str(config.short_side[1]),
            "--lr", str(config.lr), "--fallback-workers", str(config.fallback_workers),
            "--dali-threads", str(config.dali_threads), "--seed", str(config.seed),
            "--max-minutes", str(config.minutes), "--log-every", "1000"]
    echo("[3/4] training, as: torchrun --nproc_per_node=1 -m daliload.examples.train_ddp "
         + " ".join(shlex.quote(a) for a in argv))
    return train_ddp.main(argv)


def _draw(config: DemoConfig, data: Path, report_dir: Path, metrics: dict, *,
          chance: float) -> dict:  # fmt: skip
    """Step 4's pictures: a contact sheet of augmented training clips and the training curve."""
    from daliload.commands.preview import preview

    sheet = preview(data, report_dir / "contact_sheet.png", split="train", clips=8,
                    frames_per_clip=min(8, config.clip_len), clip_len=config.clip_len,
                    frame_stride=config.frame_stride, crop_size=config.crop_size,
                    short_side_range=config.short_side, seed=config.seed, epoch=0)
    curve = report_dir / "training_curve.png"
    history, stopped = metrics["history"], metrics.get("stopped_early")
    title = f"{config.model} on {config.num_classes} generated classes"
    if stopped:
        title += f": stopped after {len(history)} of {config.epochs} epochs by the {config.minutes:g}-minute cap"
    plot_training_curve(history, curve, chance=chance, multiview=metrics.get("multiview"), title=title)
    return {"contact_sheet": sheet.path, "training_curve": str(curve)}


def _throughput(history: list[dict]) -> dict:
    """Clips/s and data wait over all epochs, each epoch weighted by its training time."""
    train_seconds = sum(r["train_seconds"] for r in history)
    return {
        "clips_per_s": sum(r["clips_per_s"] * r["train_seconds"] for r in history) / train_seconds,
        # every epoch has the same number of steps
        "data_wait_ms_per_step": sum(r["data_wait_ms_per_step"] for r in history) / len(history),
        "data_wait_share": sum(r["data_wait_share"] * r["train_seconds"]
                               for r in history) / train_seconds,
    }


def _loader_totals(metrics: dict, data: Path) -> dict:
    """Clips per decoder over all epochs, and the files that failed at run time (last epoch)."""
    history = metrics["history"]
    clips_dali = sum(r["clips_dali"] for r in history)
    clips_fallback = sum(r["clips_fallback"] for r in history)
    failures = sorted({(os.path.relpath(f["path"], data), f["reason"])
                       for stats in metrics["loader_stats"] for f in stats["failures"]})
    return {"clips_dali": clips_dali, "clips_fallback": clips_fallback,
            "dali_share": clips_dali / max(1, clips_dali + clips_fallback),
            "run_time_failures": [{"path": p, "reason": r} for p, r in failures]}


def _echo_report(report: dict, report_dir: Path, echo: Callable[[str], None]) -> None:
    """Step 4's summary lines, from what ``metrics.json`` holds."""
    training, loader, seconds = report["training"], report["loader"], report["seconds"]
    history = training["history"]
    last = history[-1]
    bad_files = report["scan"]["bad_files"]
    failures = loader["run_time_failures"]
    echo(f"[4/4] report in {report_dir}")
    echo("")
    stopped = training["stopped_early"]
    if stopped:
        echo(f"training was cut short: {len(history)} of {training['epochs_planned']} epochs ran (epochs 0-"
             f"{stopped['after_epoch']}); another epoch would have passed the {training['time_cap_minutes']:g}-minute "
             f"cap on this machine. The learning-rate schedule was set for {training['epochs_planned']} epochs, so "
             f"the model is less trained than the defaults intend: give --minutes more time, or fewer --epochs.")
    echo(f"validation top-1: {last.get('val_top1', float('nan')):.3f} after {len(history)} epochs "
         f"(chance {training['chance']:.3f}; {last.get('val_clips', 0)} val videos, one centred view each)")
    multiview = training.get("multiview")
    if multiview:
        views = multiview["views"]
        echo(f"multi-view top-1: {multiview['top1']:.3f} ({views[0]} x {views[1]} views per video, "
             f"{multiview['videos']} videos, each counted once; {multiview['seconds']:.1f} s)")
    echo(f"throughput: {training['clips_per_s']:.1f} clips/s over all epochs (last epoch "
         f"{last['clips_per_s']:.1f}); data wait {training['data_wait_ms_per_step']:.0f} "
         f"ms/step, {training['data_wait_share']:.0%} of the training time")
    echo(f"loader: {loader['clips_dali']} clips by DALI ({report['machine']['device']}), "
         f"{loader['clips_fallback']} by the PyAV fallback "
         f"({loader['dali_share']:.0%} DALI) over all epochs")
    echo(f"rejected by the pre-screen: {len(bad_files)}")
    for bad in bad_files:
        echo(f"  {bad['path']}: {bad['reason']}")
    echo(f"failed at run time and replaced (last epoch): {len(failures)}")
    for failure in failures:
        echo(f"  {failure['path']}: {failure['reason']}")
    echo("time: " + ", ".join(f"{k} {v:.{1 if v < 10 else 0}f} s" for k, v in seconds.items()))


def plot_training_curve(history: list[dict], path: str | os.PathLike, *,
                        chance: float | None = None, multiview: dict | None = None, title: str = "") -> None:
    """Loss (left axis) and train/val top-1 (right axis) per epoch, as a 700x400 PNG.

    Epochs are numbered as the training script prints them (from 0), on whole
    numbers only; the legend sits under the axes, where it covers no line.

    Args:
        history: the per-epoch records of the training script's ``metrics.json``
            (``epoch``, ``train_loss``, ``train_top1``, optionally ``val_top1``).
        path: PNG to write.
        chance: drawn as a dashed line on the top-1 axis when given.
        multiview: the script's final multi-view record (``views``, ``top1``),
            drawn as one point at the last epoch, when given.
        title: figure title.
    """
    from daliload.commands.preview import _pyplot

    plt = _pyplot()
    figure = training_curve_figure(history, chance=chance, multiview=multiview, title=title)
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path)
    finally:
        plt.close(figure)


def training_curve_figure(history: list[dict], *, chance: float | None = None, multiview: dict | None = None,
                          title: str = ""):
    """The matplotlib figure :func:`plot_training_curve` writes (the caller closes it)."""
    from matplotlib.ticker import MaxNLocator

    from daliload.commands.preview import _pyplot

    plt = _pyplot()
    epochs = [r["epoch"] for r in history]
    figure, loss_axis = plt.subplots(figsize=(7, 4), dpi=100)
    try:
        loss_axis.plot(epochs, [r["train_loss"] for r in history], color="tab:red", marker="o",
                       label="train loss (left axis)")
        loss_axis.set_xlabel("epoch")
        loss_axis.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
        loss_axis.set_xlim(epochs[0] - 0.5, epochs[-1] + 0.5)  # a lone epoch gets no fractional ticks either
        loss_axis.set_ylabel("cross-entropy loss", color="tab:red")
        loss_axis.set_ylim(bottom=0)
        top1_axis = loss_axis.twinx()
        top1_axis.plot(epochs, [r["train_top1"] for r in history], color="tab:blue", marker=".",
                       label="train top-1")
        if all("val_top1" in r for r in history):
            top1_axis.plot(epochs, [r["val_top1"] for r in history], color="tab:green", marker="s",
                           label="val top-1 (1 view per video)")
        if multiview:
            views = multiview["views"]
            top1_axis.plot([epochs[-1]], [multiview["top1"]], color="tab:purple", marker="*", markersize=13,
                           linestyle="none", zorder=5,
                           label=f"val top-1, {views[0]} x {views[1]} views per video (after training)")
        if chance is not None:
            top1_axis.axhline(chance, color="grey", linestyle="--", label=f"chance top-1 ({chance:.2f})")
        top1_axis.set_ylim(0, 1.02)
        top1_axis.set_ylabel("top-1")
        handles, labels = loss_axis.get_legend_handles_labels()
        more_handles, more_labels = top1_axis.get_legend_handles_labels()
        figure.legend(handles + more_handles, labels + more_labels, loc="lower center", ncol=3, fontsize=7,
                      frameon=False)
        figure.suptitle(title, fontsize=10)
        figure.tight_layout(rect=(0, 0.11, 1, 1))
    except BaseException:
        plt.close(figure)
        raise
    return figure


def _codec_mix(text: str) -> tuple[tuple[str, float], ...]:
    from daliload.synth.encode import CODEC_PRESETS

    mix = []
    for item in text.split(","):
        codec, _, share = item.strip().partition("=")
        if codec not in CODEC_PRESETS:
            raise argparse.ArgumentTypeError(f"unknown codec {codec!r} in {text!r}; choose from "
                                             f"{', '.join(sorted(CODEC_PRESETS))}")
        try:
            mix.append((codec, float(share) if share else 1.0))
        except ValueError as err:
            raise argparse.ArgumentTypeError(
                f"bad share in {item!r}; write e.g. h264=0.5,vp9=0.5") from err
    return tuple(mix)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = DemoConfig()
    parser.add_argument("--out", default=d.out, help="output folder (%(default)s)")
    parser.add_argument("--classes", type=int, default=d.num_classes,
                        help="motion classes (%(default)s)")
    parser.add_argument("--clips-per-class", type=int, default=d.clips_per_class,
                        help="files per class over train and val (%(default)s)")
    parser.add_argument("--codecs", type=_codec_mix, default=d.codec_mix, metavar="CODEC=SHARE,...",
                        help="codec mix of the normal files (h264=0.5,vp9=0.5)")
    parser.add_argument("--broken-fraction", type=float, default=d.broken_fraction,
                        help="share of broken or odd files (%(default)s)")
    parser.add_argument("--epochs", type=int, default=d.epochs, help="epochs (%(default)s)")
    parser.add_argument("--minutes", type=float, default=d.minutes,
                        help="training time budget; stops early past it (%(default)s)")
    parser.add_argument("--model", default=d.model,
                        help="small3d, or r3d_18 / r2plus1d_18 with torchvision (%(default)s)")
    parser.add_argument("--batch-size", type=int, default=d.batch_size,
                        help="clips per step (%(default)s)")
    parser.add_argument("--fallback-workers", type=int, default=d.fallback_workers,
                        help="PyAV decoding processes; 0 decodes in the training process "
                             "(%(default)s)")
    parser.add_argument("--seed", type=int, default=d.seed, help="(%(default)s)")


def run(args: argparse.Namespace) -> int:
    try:
        config = DemoConfig(out=args.out, num_classes=args.classes,
                            clips_per_class=args.clips_per_class, codec_mix=args.codecs,
                            broken_fraction=args.broken_fraction, epochs=args.epochs,
                            minutes=args.minutes, model=args.model, batch_size=args.batch_size,
                            fallback_workers=args.fallback_workers, seed=args.seed)
        from daliload.examples.train_ddp import check_model_name

        check_model_name(config.model)  # before minutes of data generation
        run_demo(config, echo=lambda line: print(line, flush=True))
    except (ValueError, ImportError, FileNotFoundError) as err:
        print(f"daliload demo: error: {err}", file=sys.stderr)
        return 2
    return 0
