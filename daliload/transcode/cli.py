"""``daliload transcode SRC DST``: the command line of :func:`daliload.transcode.transcode_dataset`."""

from __future__ import annotations

import argparse
import errno
import sys

from daliload.transcode.options import ENCODERS, TranscodeOptions, parse_fps, parse_shard, resolve_encoder
from daliload.transcode.run import DEFAULT_TIMEOUT_S, transcode_dataset
from daliload.runtime import usable_cores

HELP = "re-encode a dataset to H.264 8-bit 4:2:0 MP4 with short keyframe intervals, same layout (resumable)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("src", metavar="SRC", help="source dataset root, in any layout (docs/datasets.md)")
    parser.add_argument("dst", metavar="DST", help="output root, outside SRC (created)")
    parser.add_argument("--short-side", type=int, default=256, metavar="N",
                        help="short side of the output in pixels, even (default 256; 0 keeps the size)")
    parser.add_argument("--gop", type=int, default=16, metavar="N", help="keyframe interval in frames (default 16)")
    parser.add_argument("--fps", default="keep", metavar="keep|N",
                        help="'keep' (default) keeps every frame and its timestamp; N resamples to N fps")
    parser.add_argument("--crf", type=int, default=23, help="constant quality, 0..51 (default 23; NVENC: cq)")
    parser.add_argument("--preset", default=None,
                        help="encoder preset (default veryfast for libx264, p4 for NVENC)")
    parser.add_argument("--bframes", type=int, default=2, metavar="N", help="B-frames in a row (default 2)")
    parser.add_argument("--encoder", choices=ENCODERS, default="auto",
                        help="auto (default): NVENC if FFmpeg has it and a GPU is visible, else libx264")
    parser.add_argument("--workers", type=int, default=None, metavar="N",
                        help=f"worker processes (default: usable cores, {usable_cores()} here)")
    parser.add_argument("--split", action="append", default=[],
                        help="split to transcode (repeatable; default every split of train, val, test SRC has, "
                             "every fold of UCF101 and HMDB51)")
    parser.add_argument("--shard", default="0/1", metavar="I/N",
                        help="do only share I of N (0 <= I < N), a deterministic split of the files by path "
                             "for N machines or an array job (default 0/1: all)")
    parser.add_argument("--keep-audio", action="store_true", help="keep the audio, re-encoded to AAC "
                                                                  "(dropped by default)")
    parser.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                        help=f"seconds one file may take before it is reported as failed (default "
                             f"{DEFAULT_TIMEOUT_S:g})")
    parser.add_argument("--json", default=None, metavar="PATH", help="write one JSON record per file (JSON Lines)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    """Exit status: 0 when every file was written, skipped or is bad; 1 when some failed; 2 for bad arguments."""
    try:
        options = TranscodeOptions(short_side=args.short_side, gop=args.gop, fps=parse_fps(args.fps), crf=args.crf,
                                   preset=args.preset, bframes=args.bframes, encoder=resolve_encoder(args.encoder),
                                   keep_audio=args.keep_audio)
        shard = parse_shard(args.shard)
        summary = transcode_dataset(args.src, args.dst, options, splits=tuple(args.split), shard=shard,
                                    workers=args.workers, timeout_s=args.timeout_s, progress=not args.no_progress,
                                    json_path=args.json)
    except (ValueError, FileNotFoundError) as err:
        print(f"daliload transcode: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        if err.errno != errno.ENOSPC:
            raise
        print(f"daliload transcode: error: {err.strerror}", file=sys.stderr)  # a full disk: which file, what to do
        return 1
    print(summary.format())
    return 1 if summary.failed else 0
