"""A training script without ``if __name__ == "__main__":`` either trains or stops fast, never hangs.

spawn/forkserver children import the parent's main script again before they
start. The scripts below are run as real subprocesses (as a user runs them),
on the tiny generated dataset, with a fresh manifest each, so both the scan's
workers and the fallback's DataLoader workers start.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

GUARD = 'if __name__ == "__main__":'
#: How long a script may take to fail (a hang bound: a child re-running training would take minutes);
#: one that trains may take longer (2 cores, shared).
FAIL_WITHIN_S = 60.0
TRAIN_LIMIT_S = 300.0

#: Like the README's first block: build the loader and train at the top level.
TRAINING = """\
loader = KineticsDALILoader(ROOT, split="train", batch_size=4, clip_len=4, frame_stride=2,
                            crop_size=32, device="cpu", scan=ScanSpec(manifest_path=MANIFEST, workers=2),
                            decode=DecodeSpec(fallback_workers=2))
for epoch in range(1):
    loader.set_epoch(epoch)
    for videos, labels in loader:
        assert videos.shape[0] == 4
stats = loader.stats()
print("TRAINED", stats.clips_dali + stats.clips_fallback, stats.failures)
"""
HEADER = """\
import multiprocessing as mp
import sys

from daliload import DecodeSpec, KineticsDALILoader, ScanSpec

ROOT, MANIFEST = sys.argv[1], sys.argv[2]
"""


def _run(script: Path, root: Path, manifest: Path) -> tuple[subprocess.CompletedProcess, float]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    started = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, str(script), str(root), str(manifest)], capture_output=True,
                              text=True, timeout=TRAIN_LIMIT_S, env=env)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"{script.name} neither trained nor stopped in {TRAIN_LIMIT_S:g} s; stderr:\n"
                    f"{(err.stderr or b'')[-3000:]!r}")
    return proc, time.monotonic() - started


def _write(tmp_path: Path, name: str, body: str) -> Path:
    script = tmp_path / name
    script.write_text(HEADER + body)
    return script


def _trained_or_stopped_fast(proc: subprocess.CompletedProcess, elapsed_s: float) -> None:
    """The contract: it trained, or it exited non-zero within FAIL_WITHIN_S naming the guard."""
    if proc.returncode == 0:
        assert "TRAINED" in proc.stdout, proc.stdout
        return
    assert elapsed_s < FAIL_WITHIN_S, f"failed only after {elapsed_s:.0f} s:\n{proc.stderr[-3000:]}"
    assert GUARD in proc.stderr, proc.stderr[-3000:]


def test_unguarded_training_script_trains_or_stops_fast(small_kinetics, tmp_path):
    script = _write(tmp_path, "train_unguarded.py", TRAINING)
    proc, elapsed = _run(script, small_kinetics, tmp_path / "manifest.sqlite")
    _trained_or_stopped_fast(proc, elapsed)
    # What daliload does today: its own workers do not re-run the script, so it trains, once.
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("TRAINED") == 1, proc.stdout


def test_guarded_training_script_trains(small_kinetics, tmp_path):
    script = _write(tmp_path, "train_guarded.py", f"{GUARD}\n" + textwrap.indent(TRAINING, "    "))
    proc, _ = _run(script, small_kinetics, tmp_path / "manifest.sqlite")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("TRAINED") == 1, proc.stdout


def test_a_foreign_worker_rerunning_the_script_stops_at_once_with_the_fix(small_kinetics, tmp_path):
    """A spawn child daliload did not start (here a bare Process) re-runs the script into the loader."""
    body = TRAINING.split("for epoch")[0] + textwrap.dedent("""\
        child = mp.get_context("spawn").Process(target=print, args=("child ran",))
        child.start()
        child.join(120)  # a child that did not stop leaves exitcode None: status 0, which fails below
        sys.exit(3 if child.exitcode else 0)
        """)
    script = _write(tmp_path, "spawns_unguarded.py", body)
    proc, _ = _run(script, small_kinetics, tmp_path / "manifest.sqlite")
    assert proc.returncode == 3, proc.stderr[-3000:]  # the child ended, with an error
    # The loader's constructor stops the child first, before it scans or imports DALI.
    assert "RuntimeError: A KineticsDALILoader was started inside a worker process" in proc.stderr
    assert f"{script}, line 7," in proc.stderr  # the loader's line in the script
    assert GUARD in proc.stderr


def test_an_unguarded_script_can_generate_the_dataset_too(tmp_path):
    """generate_dataset starts a process pool: its workers must not re-run the script either."""
    script = tmp_path / "make_data.py"
    script.write_text(textwrap.dedent("""\
        import sys
        from daliload.synth.dataset import SynthSpec, generate_dataset

        spec = SynthSpec(num_classes=2, clips_per_class=2, width=64, height=48, duration_s=1.0,
                         broken_fraction=0.0, seed=1)
        print("MADE", generate_dataset(sys.argv[1], spec, workers=2, progress=False).root)
        """))
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "data")], capture_output=True, text=True,
                          timeout=TRAIN_LIMIT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("MADE") == 1  # the top level ran once, in the parent only
