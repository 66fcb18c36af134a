"""Run under torchrun by tests/test_evaluate.py: evaluate a fixed model on the val split, record the result.

Usage: torchrun ... eval_worker.py MANIFEST OUT_DIR
Writes OUT_DIR/rank<R>.json with the EvalResult's figures (and, on rank 0, the
per-video scores), and OUT_DIR/rank<R>.stderr with what evaluate wrote to stderr
(asked for a progress bar on every rank: only rank 0 shows one).
"""

import json
import sys
from pathlib import Path

import torch.distributed as dist

from daliload.evaluation import evaluate
from daliload.loader import DecodeSpec, KineticsDALILoader
from daliload.plan import AugmentSpec, OutputSpec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from eval_model import ChannelMeans  # noqa: E402 - the tests' deterministic model


def main(manifest: str, out_dir: str) -> None:
    dist.init_process_group("gloo")
    loader = KineticsDALILoader(
        manifest, "val", batch_size=2, clip_len=4, frame_stride=2,
        augment=AugmentSpec(crop_size=(48, 64), crop_mode="center"),
        output=OutputSpec(size=(48, 64), dtype="float32"),
        decode=DecodeSpec(fallback_workers=1, timeout_s=30.0),
    )
    stderr = sys.stderr
    with open(Path(out_dir, f"rank{dist.get_rank()}.stderr"), "w") as sys.stderr:
        result = evaluate(ChannelMeans(), loader, topk=(1, 3), progress=True)
    sys.stderr = stderr
    record = {"rank": dist.get_rank(), "world_size": dist.get_world_size(), "num_videos": result.num_videos,
              "topk": {str(k): v for k, v in result.topk.items()}, "loss": result.loss,
              "per_class_top1": result.per_class_top1, "failed": list(result.failed),
              "scores": None if result.video_scores is None else
              {path: s.tolist() for path, s in result.video_scores.items()}}
    Path(out_dir, f"rank{dist.get_rank()}.json").write_text(json.dumps(record))
    loader.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
