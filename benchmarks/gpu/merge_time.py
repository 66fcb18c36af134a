"""The merge's host time on a GPU: a fallback batch from shared memory to the GPU, per host-transfer mode.

Run by ``run_gpu_bench.sh --tests`` (no NVDEC needed); on its own::

    python3 benchmarks/gpu/merge_time.py [--batch 8] [--clip-len 16] [--size 224] [--repeats 2] [--out DIR]

A batch of fallback clips lives in one shared-memory mapping
(:func:`fallback.source.shared_buffer`, filled here as a worker fills it).
The epoch pass's merge (:func:`daliload.epoch._merge.merge`) copies it to the GPU;
how long that holds up the training loop (host time: the call's wall time,
before the copy has finished on the GPU) depends on what the copy reads
(:class:`daliload.epoch.HostTransfer`):

- ``pageable``: the mapping as it is; the driver copies through its own
  staging buffer and returns when done (the old way);
- ``register``: the mapping registered with ``cudaHostRegister`` for the copy
  (daliload's default), unregistered once it has run (timed apart: release);
- ``staging``: a copy into torch's pinned staging memory, then a DMA;
- ``pinned``, for reference: memory that was page-locked already (what a pool of
  registered buffers would give), copied with ``non_blocking=True``.

Each mode is timed twice: with float32 clips (what a CPU host's workers
write) and with uint8 pixels (what a GPU host's workers write,
``FallbackSource(normalize_on="device")``: a quarter of the bytes, and the
merge normalises them on the GPU with :func:`fallback.transform.normalize_pixels`).
Every way's batch is checked against the buffer; the uint8 way's bitwise
against ``normalize_pixels`` run on the CPU (the workers' arithmetic), computed
once and compared with every merge. Prints the tables and writes
``merge.json`` to ``--out``. Medians of ``--repeats`` after one warm-up.

Its seconds count in the visit's tests call (``visit.Assumptions.merge_s``,
15 s with torch's CUDA start), so it does little: 2 dtypes x 4 modes x (1 + 2)
merges of one batch of 8 clips (74 MiB float32, 18 MiB uint8; the training
batch of 32 is four times the bytes, and the copy's time grows with them).
The first version timed 32 merges of up to 294 MiB with a CPU reference
normalisation at each: 15-30 s in a slot budgeted 10.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


MODES = ("pageable", "register", "staging", "pinned")


def measure(batch: int, clip_len: int, size: int, repeats: int, *, device: str = "cuda",
            modes: tuple[str, ...] = MODES, pixels: bool = False) -> dict:
    """Host and total milliseconds of the merge per mode (``device="cpu"``, ``modes=("pageable",)``: a dry run).

    ``pixels``: the buffer holds uint8 pixels the merge normalises (a GPU host's fallback), not float32 clips.
    """
    import torch

    from daliload.epoch import EpochCounters, HostTransfer, PassSetup
    from daliload.epoch._merge import Part, merge
    from daliload.plan import CropBox, OutputSpec, Sample
    from daliload.clips import Decoded
    from fallback.source import shared_buffer
    from fallback.transform import normalize_pixels

    output = OutputSpec(size=(size, size))
    shape = (batch, 3, clip_len, size, size)
    setup = PassSetup(output=output, device=torch.device(device), label_padding=False, mask_failed=False,
                      prefetch=2, num_frames=lambda video: None)
    on_gpu = setup.device.type == "cuda"

    def synchronize() -> None:
        if on_gpu:
            torch.cuda.synchronize()
    samples = [Sample(position=k, video_index=k, path=f"clip{k}", label=k, start_frame=0, frame_stride=1,
                      clip_len=clip_len, crop=CropBox.full()) for k in range(batch)]
    rows = list(range(batch))
    marks = torch.arange(batch, dtype=torch.float32)
    dtype = torch.uint8 if pixels else torch.float32
    # uint8: every value in every channel, so the check covers each of the normalisation's constants
    content = torch.randint(0, 256, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    # The CPU reference of the uint8 way once: normalising 32 clips on the CPU at every merge cost seconds each.
    reference = normalize_pixels(content, output) if pixels else None
    results = {}
    for mode in modes:
        host_ms, total_ms, release_ms = [], [], []
        for repeat in range(1 + repeats):
            if mode == "pinned":
                videos = torch.empty(shape, dtype=dtype, pin_memory=True)
            else:
                videos, fd = shared_buffer(shape, dtype)
                os.close(fd)
            if pixels:
                videos.copy_(content)
            else:
                videos.view(batch, -1)[:] = marks[:, None]  # every byte written, as a worker writes its rows
            host = HostTransfer("pageable" if mode == "pinned" else mode)
            synchronize()
            started = time.perf_counter()
            merged, _, _ = merge(samples, [Part(rows, rows, Decoded(videos, {}, 0, normalized=not pixels))], {},
                                 setup, EpochCounters(), host)
            returned = time.perf_counter()
            synchronize()
            finished = time.perf_counter()
            host.release()
            released = time.perf_counter()
            if pixels:
                if not torch.equal(merged.cpu(), reference):
                    raise RuntimeError(f"{mode}: the batch normalised on {device} is not bitwise the CPU's")
            else:
                got = merged.view(batch, -1)[:, -1].cpu()  # each row's last value: its mark
                if not torch.equal(got, marks):
                    raise RuntimeError(f"{mode}: the batch on the GPU differs from the buffer ({got[:4].tolist()} ...)")
            if repeat:  # the first is the warm-up
                host_ms.append((returned - started) * 1000)
                total_ms.append((finished - started) * 1000)
                release_ms.append((released - finished) * 1000)
            del merged, videos
        results[mode] = {"host_ms": statistics.median(host_ms), "until_on_gpu_ms": statistics.median(total_ms),
                         "release_ms": statistics.median(release_ms), "runs": len(host_ms)}
    return {"batch_shape": list(shape), "dtype": "uint8" if pixels else "float32",
            "batch_mb": batch * 3 * clip_len * size * size * dtype.itemsize / 2**20,
            "gpu": torch.cuda.get_device_name() if on_gpu else "none (dry run)", "modes": results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--clip-len", type=int, default=16)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    import torch

    if not torch.cuda.is_available():
        print("merge timing: torch sees no CUDA device; nothing measured", file=sys.stderr)
        return 1
    result = measure(args.batch, args.clip_len, args.size, args.repeats)
    result["uint8"] = measure(args.batch, args.clip_len, args.size, args.repeats, pixels=True)
    for run, what in ((result, "float32"), (result["uint8"], "uint8, normalised on the GPU by the merge")):
        print(f"merge of one fallback batch {tuple(run['batch_shape'])} {what} ({run['batch_mb']:.0f} MiB) to "
              f"{run['gpu']}, median of {args.repeats}:")
        print(f"  {'mode':<9} {'host ms':>8} {'on GPU ms':>10} {'release ms':>11}")
        for mode, r in run["modes"].items():
            print(f"  {mode:<9} {r['host_ms']:8.1f} {r['until_on_gpu_ms']:10.1f} {r['release_ms']:11.2f}")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "merge.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
