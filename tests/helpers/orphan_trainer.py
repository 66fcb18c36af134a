"""Run by tests/test_fallback_orphans.py: iterate a fallback loader until killed.

Usage: orphan_trainer.py CLIP_PATH READY_FILE. Writes READY_FILE once the first
batch arrived (the workers are up), then keeps iterating forever.
"""

import sys
from pathlib import Path

from daliload.plan import CropBox, OutputSpec, Sample
from fallback import make_fallback_loader

if __name__ == "__main__":
    clip, ready = sys.argv[1], Path(sys.argv[2])
    samples = [Sample(i, 0, clip, 0, 0, 2, 4, CropBox.full()) for i in range(64)]
    loader = make_fallback_loader(samples, OutputSpec(size=(32, 32)), batch_size=2, num_workers=2)
    while True:
        for _ in loader:
            ready.touch()
