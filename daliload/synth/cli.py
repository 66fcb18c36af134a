"""``daliload synth ROOT``: write a generated Kinetics-like dataset."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter

from daliload.synth.broken import BROKEN_KINDS
from daliload.synth.dataset import generate_dataset
from daliload.synth.encode import CODEC_PRESETS
from daliload.synth.spec import SynthSpec, parse_fps

HELP = "write a generated Kinetics-like dataset (class folders, annotation CSVs, list files)"


def _size(text: str) -> tuple[int, int]:
    try:
        width, height = (int(v) for v in text.lower().split("x"))
    except ValueError as err:
        raise argparse.ArgumentTypeError(
            f"size must be WIDTHxHEIGHT, e.g. 340x256, got {text!r}") from err
    return width, height


def _mix(kind: str, parse_key):
    """argparse type for ``a=0.7,b=0.3`` (a bare ``a`` means share 1)."""

    example = "h264=0.7,vp9=0.3" if kind == "codec" else "30=0.8,25=0.1,29.97=0.1"

    def parse(text: str) -> dict:
        mix = {}
        for item in text.split(","):
            key, _, share = item.strip().partition("=")
            try:
                mix[parse_key(key.strip())] = float(share) if share else 1.0
            except ValueError as err:
                raise argparse.ArgumentTypeError(
                    f"bad {kind} mix item {item!r} in {text!r}: {err}; write e.g. {example}"
                ) from err
        return mix

    return parse


def _codec(name: str) -> str:
    if name not in CODEC_PRESETS:
        raise ValueError(f"unknown codec {name!r}; choose from {', '.join(sorted(CODEC_PRESETS))}")
    return name


def _kinds(text: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in kinds if k not in BROKEN_KINDS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown broken kind(s) {', '.join(unknown)}; choose from {', '.join(BROKEN_KINDS)}")
    return kinds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = SynthSpec()
    parser.add_argument("root", help="dataset directory to write (created if missing)")
    parser.add_argument("--classes", type=int, default=d.num_classes,
                        help="number of classes (%(default)s)")
    parser.add_argument("--clips-per-class", type=int, default=d.clips_per_class,
                        help="files per class over both splits (%(default)s)")
    parser.add_argument("--val-fraction", type=float, default=d.val_fraction,
                        help="share of each class's files in val (%(default)s)")
    parser.add_argument("--size", type=_size, default=(d.width, d.height), metavar="WxH",
                        help=f"frame size (default {d.width}x{d.height})")
    parser.add_argument("--duration", type=float, default=d.duration_s, metavar="SECONDS",
                        help="clip length in seconds (%(default)s)")
    parser.add_argument("--fps", type=_mix("fps", parse_fps), default=None, metavar="FPS=SHARE,...",
                        help="frame-rate mix (default 30=0.8,25=0.1,29.97=0.1)")
    parser.add_argument("--codecs", type=_mix("codec", _codec), default=None,
                        metavar="CODEC=SHARE,...",
                        help="codec mix of the normal files, from "
                             f"{', '.join(sorted(CODEC_PRESETS))} (default h264)")
    parser.add_argument("--broken-fraction", type=float, default=d.broken_fraction,
                        help="share of files that are broken or odd (%(default)s)")
    parser.add_argument("--broken-kinds", type=_kinds, default=BROKEN_KINDS, metavar="KIND,...",
                        help=f"kinds handed out in turn (default all: {','.join(BROKEN_KINDS)})")
    parser.add_argument("--seed", type=int, default=d.seed, help="seed (%(default)s)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                        help="encoder processes (default: CPU count, %(default)s)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    changes = {}
    if args.fps is not None:
        changes["fps_mix"] = args.fps
    if args.codecs is not None:
        changes["codec_mix"] = args.codecs
    try:
        spec = SynthSpec(num_classes=args.classes, clips_per_class=args.clips_per_class,
                         val_fraction=args.val_fraction, width=args.size[0], height=args.size[1],
                         duration_s=args.duration, broken_fraction=args.broken_fraction,
                         broken_kinds=tuple(args.broken_kinds), seed=args.seed, **changes)
    except ValueError as err:
        print(f"daliload synth: error: {err}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    report = generate_dataset(args.root, spec, workers=args.workers, progress=not args.no_progress)
    seconds = time.perf_counter() - started

    splits = Counter(c.split for c in report.clips)
    codecs = Counter(c.codec for c in report.clips if c.broken is None)
    rates = Counter(str(c.fps) for c in report.clips)
    broken = Counter(c.broken for c in report.broken)
    print(f"wrote {len(report.clips)} files to {report.root} in {seconds:.1f} s "
          f"({len(report.clips) / seconds:.1f} files/s, {args.workers} workers)")
    print(f"  {len(report.classes)} classes, {spec.width}x{spec.height}, {spec.duration_s:g} s; "
          + ", ".join(f"{split}: {n}" for split, n in sorted(splits.items())))
    print("  codecs: " + ", ".join(f"{k} {n}" for k, n in sorted(codecs.items())))
    print("  fps: " + ", ".join(f"{k} {n}" for k, n in sorted(rates.items())))
    if broken:
        print("  broken: " + ", ".join(f"{k} {n}" for k, n in sorted(broken.items())))
    print("  index files: " + ", ".join(report.index_files))
    return 0
