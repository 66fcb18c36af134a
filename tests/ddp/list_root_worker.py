"""Run under torchrun by tests/test_layouts_registry.py: a list of (path, label) pairs as the root, on 2 gloo ranks.

Usage: torchrun --nproc_per_node=2 list_root_worker.py CLIPS_DIR OUT_DIR
Both ranks give the same pairs (rank 1 in reverse order, with relative paths):
rank 0 scans, rank 1 waits for its manifest; the ranks agree (they compare the
root the list becomes) and each writes what it read to OUT_DIR/rank<R>.json.
"""

import json
import os
import sys
from pathlib import Path

import torch.distributed as dist

from daliload import AugmentSpec, DecodeSpec, KineticsDALILoader


def main(clips: str, out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    files = sorted(Path(clips).rglob("*.avi"))
    pairs = [(str(p), p.parent.name) for p in files]
    if rank == 1:
        os.chdir(clips)
        pairs = [(os.path.relpath(p, clips), label) for p, label in reversed(pairs)]
    loader = KineticsDALILoader(pairs, "train", batch_size=1, clip_len=4, frame_stride=2, device="cpu",
                                augment=AugmentSpec(crop_size=32, crop_mode="center"),
                                decode=DecodeSpec(fallback_workers=1))
    labels = [int(labels[0]) for _, labels in loader]
    record = {"rank": rank, "manifest": str(loader.manifest_path), "classes": list(loader.classes),
              "videos": len(loader.index), "labels": labels}
    loader.close()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(record))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
