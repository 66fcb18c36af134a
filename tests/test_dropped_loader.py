"""A loader dropped without ``close()`` takes everything it started with it, at once.

Rebuilding the evaluation loader at every evaluation (what overriding
Hugging Face ``Trainer.get_eval_dataloader`` does) or ``del loader`` must leave
threads, open file descriptors and child processes flat, without waiting for
a garbage collection: the script below runs with the collector off, so only
reference counting frees a loader. Both routes run (VP9 through DALI's CPU
decoder and its window cutter, H.264 through the fallback's workers), and
each loader yields a batch before it is dropped, with the pass left open.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from fractions import Fraction

from daliload.synth.content import render_clip
from daliload.synth.encode import default_spec, write_video

SCRIPT = textwrap.dedent("""\
    import gc
    import json
    import os
    import sys
    import threading
    import time

    from daliload import DecodeSpec, KineticsDALILoader

    gc.disable()  # only reference counting frees what a dropped loader held

    def loaders_threads():
        # The stderr relay's watcher lives as long as the process (it starts with the first DALI pipeline).
        return sorted(t.name for t in threading.enumerate()
                      if t.name.startswith("daliload") and t.name != "daliload-stderr-relay")

    def counts():
        # A thread told to end (DALI's waiter, after a batch it was taking off DALI's queue) ends a moment
        # later: wait for that, not for ever; one that was never told to end stays and fails the test.
        deadline = time.monotonic() + 10
        while loaders_threads() and time.monotonic() < deadline:
            time.sleep(0.05)
        children = sum(1 for p in os.listdir("/proc") if p.isdigit() and _parent(p) == os.getpid())
        return [threading.active_count(), len(os.listdir("/proc/self/fd")), children, loaders_threads()]

    def _parent(pid):
        try:
            with open(f"/proc/{pid}/stat") as stat:
                return int(stat.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            return -1

    seen = []
    for i in range(int(sys.argv[2])):
        loader = KineticsDALILoader(sys.argv[1], split="val" if i % 2 else "train", batch_size=2, clip_len=4,
                                    frame_stride=2, crop_size=48, device="cpu",
                                    decode=DecodeSpec(fallback_workers=1, routing="static"))
        videos, labels = next(iter(loader))  # the pass is left open, batches in flight
        stats = loader.stats()
        del loader, videos, labels
        seen.append(counts() + [stats.clips_dali, stats.clips_fallback])  # threads, fds, children, names, ...
    print(json.dumps(seen))
""")


def test_loaders_dropped_without_close_leave_threads_fds_and_processes_flat(tmp_path):
    root = tmp_path / "data"
    for i in range(8):  # VP9 with a keyframe every 8 frames (DALI, cut windows) and H.264 (the fallback)
        codec = "vp9" if i % 2 == 0 else "h264"
        spec = default_spec(codec, fps=Fraction(25), gop=8)
        folder = root / "train" / f"class{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        write_video(folder / f"v{i}.{spec.extension}",
                    render_clip(i % 2, 40, width=64, height=48, fps=25.0, seed=i), spec)
    (root / "val").symlink_to(root / "train", target_is_directory=True)
    script = tmp_path / "drop.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script), str(root), "6"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert any(row[4] > 0 for row in seen) and any(row[5] > 0 for row in seen), seen  # DALI's clips, the fallback's
    first = seen[0][:3]
    # After the first loader only what lives for the process stays (the forkserver, the resource tracker,
    # the native-log relay and their descriptors); each later loader goes with everything it started.
    assert [row[:3] for row in seen] == [first] * len(seen), seen
    assert all(row[3] == [] for row in seen), seen  # no thread of a loader (DALI's waits, its reader) is left
