"""Run under torchrun by tests/test_loader_ddp.py: iterate the loader and record what each rank got.

Usage: torchrun ... loader_worker.py ROOT OUT_DIR EPOCHS
Writes OUT_DIR/rank<R>.json with, per epoch, the batch count, the plan samples,
the failures, and whether every decoded clip showed exactly the frames of the
sample filling its slot (its own, or its replacement's).

FAULT_RANK=R and FAULT_SPEC="path=action;..." make those files' decodes crash or
hang on rank R only (daliload.testing.inject_faults).
"""

import json
import os
import sys
from pathlib import Path

import torch.distributed as dist

from daliload.framecode import read_code
from daliload.loader import DecodeSpec, KineticsDALILoader
from daliload.plan import AugmentSpec, OutputSpec
from daliload.testing import inject_faults


def main(root: str, out_dir: str, epochs: int) -> None:
    dist.init_process_group("gloo")
    loader = KineticsDALILoader(
        root, "train", batch_size=2, clip_len=4, frame_stride=3, seed=7,
        augment=AugmentSpec(crop_size=(48, 64), crop_mode="center"),
        output=OutputSpec(size=(48, 64), mean=(0, 0, 0), std=(1, 1, 1), dtype="float32"),
        decode=DecodeSpec(max_failure_fraction=1.0, timeout_s=5.0),
    )
    if os.environ.get("FAULT_RANK") == str(dist.get_rank()):
        inject_faults(loader, dict(entry.rsplit("=", 1) for entry in os.environ["FAULT_SPEC"].split(";")))
    frames = {v.path: v.num_frames for v in loader.videos}
    record = {"rank": dist.get_rank(), "world_size": dist.get_world_size(), "num_videos": len(loader.videos),
              "paths": sorted(frames), "epochs": []}
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        plan = loader.plan()
        batches, rows = 0, []
        for (videos, labels), batch in zip(loader, plan):
            batches += 1
            rows.append((videos.clone(), labels.clone(), batch))
        used = dict(loader.stats().replacements)
        by_position = {s.position: s for b in plan for s in b}
        mismatches = []
        for videos, labels, batch in rows:
            for k, slot in enumerate(batch):
                sample = by_position[used.get(slot.position, slot.position)]
                codes = [read_code(videos[k][:, t], layout="CHW") for t in range(videos.shape[2])]
                want = sample.frame_indices(frames[sample.path])
                if [c.index for c in codes] != want or any(c.flipped != sample.flip for c in codes) \
                        or int(labels[k]) != sample.label:
                    mismatches.append(sample.path)
        record["epochs"].append({
            "batches": batches, "len": len(loader), "mismatches": mismatches,
            "samples": [[s.path, s.start_frame, s.flip, s.is_padding] for b in plan for s in b],
            "failures": [[f.path, f.reason] for f in loader.stats().failures],
        })
    Path(out_dir, f"rank{dist.get_rank()}.json").write_text(json.dumps(record))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
