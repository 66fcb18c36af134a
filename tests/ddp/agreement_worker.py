"""Run under torchrun by tests/test_rank_agreement.py: build loaders whose options differ on rank 1, in turn.

Usage: torchrun --nproc_per_node=2 agreement_worker.py ROOT OTHER_ROOT OUT_DIR
Each case builds a loader on both ranks, rank 1 with one option (or two) changed;
the refusal each rank raised (its type and message) goes to OUT_DIR/rank<R>.json,
with, at the end, an agreeing loader's len() and a sum over the process group: a
refused construction must leave the group in step for the next one.
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from daliload import AugmentSpec, DecodeSpec, KineticsDALILoader
from daliload.prescreen import ensure_manifest

#: name -> (rank 0's options, rank 1's): only what differs; the rest is BASE.
CASES = {
    "batch_size": ({"batch_size": 2}, {"batch_size": 3}),
    "seed": ({"seed": 7}, {"seed": 8}),
    "root": ({}, {"root": "OTHER"}),
    "split": ({"split": "train"}, {"split": "val"}),
    "clip_len and crop_size": ({}, {"clip_len": 6, "augment": AugmentSpec(crop_size=32, crop_mode="center")}),
}
BASE = {"split": "train", "batch_size": 2, "clip_len": 4, "frame_stride": 2, "seed": 7, "device": "cpu",
        "augment": AugmentSpec(crop_size=48, crop_mode="center"), "decode": DecodeSpec(fallback_workers=1)}


def main(root: str, other: str, out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    record = {"rank": rank, "cases": {}}
    for name, options in CASES.items():
        kw = {"root": root, **BASE, **options[rank]}
        if kw["root"] == "OTHER":
            kw["root"] = other
        try:
            loader = KineticsDALILoader(**kw)
        except (ValueError, RuntimeError) as err:
            record["cases"][name] = [type(err).__name__, str(err)]
        else:
            record["cases"][name] = ["built", len(loader)]
            loader.close()
    # Called on its own, the manifest check does not hand rank 0's manifest to a rank given another root.
    try:
        record["ensure_manifest"] = ["returned", str(ensure_manifest(other if rank else root, device="cpu"))]
    except ValueError as err:
        record["ensure_manifest"] = ["ValueError", str(err)]
    loader = KineticsDALILoader(root, **{k: v for k, v in BASE.items() if k != "root"})
    total = torch.tensor([len(loader)])
    dist.all_reduce(total)
    record["agreed"] = {"len": len(loader), "sum": int(total)}
    loader.close()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(record))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
