"""A training process killed with SIGKILL must not leave its fallback workers running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

HELPER = Path(__file__).parent / "helpers" / "orphan_trainer.py"


def processes_with_marker(marker: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker.encode() in (entry / "environ").read_bytes():
                pids.append(int(entry.name))
        except OSError:  # gone, or not ours to read
            continue
    return pids


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_workers_exit_when_the_trainer_is_killed(make_clip, tmp_path):
    clip = make_clip("h264", num_frames=30)
    marker = f"DALILOAD_ORPHAN_TEST={uuid.uuid4().hex}"
    key, value = marker.split("=")
    ready = tmp_path / "ready"
    trainer = subprocess.Popen([sys.executable, str(HELPER), str(clip), str(ready)],
                               env=dict(os.environ, **{key: value}))
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert trainer.poll() is None, "the trainer exited before its first batch"
            assert time.monotonic() < deadline, "no batch within 120 s"
            time.sleep(0.2)
        helpers = [p for p in processes_with_marker(marker) if p != trainer.pid]
        assert len(helpers) >= 2  # the forkserver and its decoding workers
    finally:
        trainer.send_signal(signal.SIGKILL)
        trainer.wait()
    deadline = time.monotonic() + 30
    while processes_with_marker(marker) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = processes_with_marker(marker)
    for pid in left:  # do not leak them into the rest of the run, then fail
        os.kill(pid, signal.SIGKILL)
    assert left == [], f"processes still running 30 s after the trainer was killed: {left}"
