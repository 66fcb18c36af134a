"""A loader dropped without ``close()`` takes everything it started with it, at once.

Rebuilding the evaluation loader at every evaluation (what overriding
Hugging Face ``Trainer.get_eval_dataloader`` does) or ``del loader`` must leave
threads, open file descriptors and child processes flat, without waiting for
a garbage collection: the script below runs with the collector off, so only
reference counting frees a loader. Both routes run (VP9 through DALI's CPU
decoder and its window cutter, H.264 through the fallback's workers), and
each loader yields a batch before it is dropped, with the pass left open
(every other pair of loaders is dropped before the iterator over it, as a
training loop that still holds the evaluation loader's iterator does).

Threads are counted twice: Python's (``threading.enumerate``) and the
process's own (``/proc/self/task``: DALI's and FFmpeg's native threads too).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from fractions import Fraction
from pathlib import Path

import pytest

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
        return [len(threading.enumerate()), len(os.listdir("/proc/self/fd")), children, loaders_threads(),
                len(os.listdir("/proc/self/task"))]

    def _parent(pid):
        try:
            with open(f"/proc/{pid}/stat") as stat:
                return int(stat.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            return -1

    before = counts()  # before any loader: torch and daliload imported
    seen = []
    for i in range(int(sys.argv[2])):
        loader = KineticsDALILoader(sys.argv[1], split="val" if i % 2 else "train", batch_size=2, clip_len=4,
                                    frame_stride=2, crop_size=48, device="cpu",
                                    decode=DecodeSpec(fallback_workers=1, routing="static"))
        batches = iter(loader)
        videos, labels = next(batches)  # the pass is left open, batches in flight
        stats = loader.stats()
        if i % 4 < 2:
            del loader, batches, videos, labels
        else:  # the iterator last: it holds the pass, not the loader
            del videos, labels, loader, batches
        # threads, fds, children, names, tasks, DALI's clips, the fallback's clips
        seen.append(counts() + [stats.clips_dali, stats.clips_fallback])
    print(json.dumps({"before": before, "seen": seen}))
""")


@pytest.fixture(scope="module")
def two_routes(tmp_path_factory) -> Path:
    """8 clips, train and val: VP9 with a keyframe every 8 frames (DALI, cut windows), H.264 (the fallback)."""
    root = tmp_path_factory.mktemp("dropped") / "data"
    for i in range(8):
        codec = "vp9" if i % 2 == 0 else "h264"
        spec = default_spec(codec, fps=Fraction(25), gop=8)
        folder = root / "train" / f"class{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        write_video(folder / f"v{i}.{spec.extension}",
                    render_clip(i % 2, 40, width=64, height=48, fps=25.0, seed=i), spec)
    (root / "val").symlink_to(root / "train", target_is_directory=True)
    return root


def _drop(root: Path, tmp_path: Path, loaders: int) -> tuple[list, list]:
    """Build and drop ``loaders`` loaders in a fresh interpreter: ``(before any, after each)``."""
    script = tmp_path / "drop.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script), str(root), str(loaders)], capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, DALILOAD_PROGRESS="0"))
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    return out["before"], out["seen"]


def test_loaders_dropped_without_close_leave_threads_fds_and_processes_flat(two_routes, tmp_path):
    _, seen = _drop(two_routes, tmp_path, 6)
    assert any(row[5] > 0 for row in seen) and any(row[6] > 0 for row in seen), seen  # DALI's clips, the fallback's
    first = seen[0][:3]
    # After the first loader only what lives for the process stays (the forkserver, the resource tracker,
    # the native-log relay and their descriptors); each later loader goes with everything it started.
    assert [row[:3] for row in seen] == [first] * len(seen), seen
    assert all(row[3] == [] for row in seen), seen  # no thread of a loader (DALI's waits, its reader) is left


@pytest.mark.slow
def test_a_hundred_loaders_built_and_dropped_in_a_row_hold_resources_flat(two_routes, tmp_path):
    """Each loader decodes a batch (its DALI pipeline and its fallback worker start), then goes by ``del``."""
    before, seen = _drop(two_routes, tmp_path, 100)
    assert sum(row[5] for row in seen) >= 100 and sum(row[6] for row in seen) >= 50, seen  # both routes ran
    # The first loader starts what lives as long as the process: the forkserver, the resource tracker and
    # the native-log relay (3 children), the relay's watcher thread and their descriptors. From then on, flat.
    threads, fds, children, _, tasks = seen[0][:5]
    assert children - before[2] <= 3 and threads - before[0] <= 1, (before, seen[0])
    slack = 2  # a thread of the process's own (torch's, the interpreter's) may come or go
    for after in (seen[9], seen[99]):
        assert after[2] == children and after[3] == [], (seen[0], after)
        assert abs(after[0] - threads) <= slack and abs(after[4] - tasks) <= slack, (seen[0], after)
        assert abs(after[1] - fds) <= slack, (seen[0], after)
