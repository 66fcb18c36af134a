"""Windows past a file's end on DALI: DALI's own edge padding against the decoder's frame counts.

``python -m benchmarks.bench_padding`` (options: ``--help``) makes one VP9
clip (DALI decodes VP9 on the CPU; default 10 s at 30 fps, 340x256, a keyframe
every 250 frames, as Kinetics downloads have) and decodes windows of
``--clip-len`` frames at ``--stride`` whose last ``P`` frames lie past its end,
for several ``P``, through :class:`daliload.dali.DaliClipDecoder` twice:

- DALI pads (no ``num_frames``): ``start_frame``/``sequence_length`` with
  ``pad_mode="edge"``; DALI decodes the file again for every repeat;
- frame counts (``num_frames={path: N}``): DALI decodes the frames that
  exist, each once, and the decoder repeats the last one in torch.

Both give the same clip (checked here on every window, pixel for pixel, and
by ``tests/test_pipeline.py``). Milliseconds per clip (one clip per batch,
one DALI thread, 224x224 normalised float16), median (min-max) of ``--runs``
after a warm-up; "passes" is that time over the time of one pass of the
whole file (the in-range window that ends on the last frame, which DALI
reaches by decoding from frame 0). Writes ``--json`` (default
``benchmarks/results/padding.json``) and its section of ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import time
from fractions import Fraction
from pathlib import Path

import torch

from benchmarks.metrics import summarize
from benchmarks.report import add_output_options, load_average, publish_run
from benchmarks.machine import machine_info, machine_line, versions_line
from daliload.plan import CropBox, OutputSpec, Sample

CHAPTER = "## Windows past a file's end on DALI: `python -m benchmarks.bench_padding`"
OUTPUT = OutputSpec(size=(224, 224), dtype="float16")  # the dtype its published runs used


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_padding", description=__doc__.split("\n")[0])
    parser.add_argument("--frames", type=int, default=300, help="frames in the clip (default 300: 10 s at 30 fps)")
    parser.add_argument("--size", default="340x256", help="WIDTHxHEIGHT of the clip (default 340x256)")
    parser.add_argument("--clip-len", type=int, default=16, help="frames per clip (default 16)")
    parser.add_argument("--stride", type=int, default=4, help="frame stride (default 4)")
    parser.add_argument("--padded", type=int, nargs="+", default=None, metavar="P",
                        help="frames past the end per window (default: 0, 1, then every quarter of the clip)")
    parser.add_argument("--runs", type=int, default=5, help="timed decodes per window and way (default 5)")
    parser.add_argument("--data-dir", default="bench_out/padding", help="where the clip is made")
    add_output_options(parser, "padding")
    args = parser.parse_args(argv)
    width, _, height = args.size.partition("x")
    if not (width.isdigit() and height.isdigit()):
        parser.error(f"--size: expected WIDTHxHEIGHT, e.g. 340x256, got {args.size!r}")
    args.size = (int(width), int(height))
    if args.padded is None:
        args.padded = sorted({0, 1, *(args.clip_len * q // 4 for q in (1, 2, 3)), args.clip_len - 1})
    for name in ("frames", "clip_len", "stride", "runs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    bad = [p for p in args.padded if not 0 <= p < args.clip_len]
    if bad:
        parser.error(f"--padded: each P must be 0 .. clip_len - 1 ({args.clip_len - 1}), got {bad}")
    if (args.clip_len - 1) * args.stride >= args.frames:
        parser.error(f"--frames {args.frames} is too short for a window of {args.clip_len} frames at stride "
                     f"{args.stride}: no window would end inside the clip")
    return args


def make_clip(args: argparse.Namespace) -> Path:
    from daliload.synth import default_spec, render_clip, write_video

    width, height = args.size
    path = Path(args.data_dir) / f"vp9-{args.frames}f-{width}x{height}.webm"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name("partial-" + path.name)
        frames = render_clip(1, args.frames, width=width, height=height, fps=30.0, seed=0)
        write_video(partial, frames, default_spec("vp9", fps=Fraction(30), gop=250))
        partial.replace(path)
    return path


def window(path: Path, num_frames: int, padded: int, clip_len: int, stride: int) -> Sample:
    """The window whose last in-range frame is the file's last and whose last ``padded`` frames lie past it."""
    inside = clip_len - padded
    start = num_frames - 1 - (inside - 1) * stride
    return Sample(position=0, video_index=0, path=str(path), label=0, start_frame=start, frame_stride=stride,
                  clip_len=clip_len, crop=CropBox.full())


def timed(decoder, sample: Sample, runs: int) -> tuple[dict, torch.Tensor]:
    clip = decoder.decode_batch([sample]).videos  # warm-up
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        decoder.decode_batch([sample])
        times.append((time.perf_counter() - started) * 1000)
    summary = summarize(times)
    return {"ms": times, "median": summary.median, "min": summary.low, "max": summary.high}, clip


def measure(args: argparse.Namespace, path: Path) -> list[dict]:
    from daliload.dali import DaliClipDecoder

    rows = []
    options = {"batch_size": 1, "device": "cpu", "num_threads": 1}
    with DaliClipDecoder(OUTPUT, **options) as padded_by_dali, \
            DaliClipDecoder(OUTPUT, **options, num_frames={str(path): args.frames}) as counted:
        one_pass, _ = timed(padded_by_dali, window(path, args.frames, 0, args.clip_len, args.stride), args.runs)
        for padded in args.padded:
            sample = window(path, args.frames, padded, args.clip_len, args.stride)
            dali, dali_clip = timed(padded_by_dali, sample, args.runs)
            ours, our_clip = timed(counted, sample, args.runs)
            if not torch.equal(dali_clip, our_clip):
                raise RuntimeError(f"P={padded}: the two ways gave different clips for {sample.frame_indices()}")
            rows.append({"padded": padded, "start_frame": sample.start_frame, "dali_pads": dali, "counts": ours,
                         "dali_pads_passes": dali["median"] / one_pass["median"],
                         "counts_passes": ours["median"] / one_pass["median"]})
    return [{"one_pass": one_pass}, *rows]


def markdown(result: dict) -> str:
    s = result["settings"]
    lines = [
        f"### Padding run `padding` — {machine_line(result['machine'])}",
        "",
        f"`python -m benchmarks.bench_padding`; {versions_line(result['machine'])}; load average "
        f"{result['load_average']}. One VP9 clip of {s['frames']} frames at {s['size'][0]}x{s['size'][1]} "
        f"(keyframe every 250), windows of {s['clip_len']} frames at stride {s['stride']} ending on its last "
        f"frame then P frames past it, 224x224 float16, one clip per batch, DALI on the CPU with one thread; "
        f"ms per clip, median (min-max) of {s['runs']} runs; passes: over one decode of the whole file "
        f"({result['one_pass']['median']:.1f} ms). Same clips both ways (checked).",
        "",
        "| frames past the end (P) | DALI pads (edge) | passes | frame counts (repeat in torch) | passes | speed-up |",
        "|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        a, b = row["dali_pads"], row["counts"]
        lines.append(f"| {row['padded']} | {a['median']:.1f} ({a['min']:.1f}-{a['max']:.1f}) | "
                     f"{row['dali_pads_passes']:.1f} | {b['median']:.1f} ({b['min']:.1f}-{b['max']:.1f}) | "
                     f"{row['counts_passes']:.1f} | {a['median'] / b['median']:.1f}x |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from daliload.dali import is_dali_available

    if not is_dali_available():
        print("nvidia-dali is not installed: nothing to measure (pip install 'daliload[cuda13]')")
        return 1
    result = {"name": "padding", "machine": machine_info(args.machine), "load_average": load_average(),
              "settings": {"frames": args.frames, "size": list(args.size), "clip_len": args.clip_len,
                           "stride": args.stride, "padded": args.padded, "runs": args.runs}}
    one_pass, *rows = measure(args, make_clip(args))
    result.update(one_pass=one_pass["one_pass"], rows=rows, load_average_after=load_average())
    publish_run(result, args, markdown(result), chapter=CHAPTER)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
