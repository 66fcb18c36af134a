"""Run by tests/test_fallback_orphans.py: decode with the fallback's workers until killed.

Usage: orphan_trainer.py CLIP_PATH READY_FILE. Writes READY_FILE once the first
group arrived (the workers are up), then keeps decoding forever.
"""

import sys
from pathlib import Path

from daliload.plan import CropBox, OutputSpec, Sample
from fallback import FallbackSource

if __name__ == "__main__":
    clip, ready = sys.argv[1], Path(sys.argv[2])
    samples = [Sample(i, 0, clip, 0, 0, 2, 4, CropBox.full()) for i in range(64)]
    source = FallbackSource(OutputSpec(size=(32, 32)), workers=2)
    while True:
        for ticket in [source.submit(samples[i:i + 2]) for i in range(0, len(samples), 2)]:
            source.collect(ticket)
            ready.touch()
