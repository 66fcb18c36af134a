"""SIGINT to the training process alone (``kill -INT PID``, not Ctrl-C to the whole group): the main process
stops with its KeyboardInterrupt, the workers say nothing (no ``BrokenPipeError`` traceback), none is left.

Workers ignore SIGINT (Ctrl-C reaches the whole process group, and the supervisor
decides what stops), so here they learn of the end only from their pipe closing.
The script runs in a session of its own, which is how its processes are found
afterwards; it is stopped while it iterates (DALI's and the fallback's work in
flight) and while its first scan probes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent("""\
    import sys
    from daliload import DecodeSpec, KineticsDALILoader, ScanSpec
    from daliload.testing import probe_faults

    if __name__ == "__main__":
        with probe_faults({"*": "slow"}):  # the first scan lasts a few seconds
            loader = KineticsDALILoader(sys.argv[1], "train", batch_size=2, clip_len=4, frame_stride=2,
                                        crop_size=32, device="cpu", scan=ScanSpec(manifest_path=sys.argv[2], workers=2),
                                        decode=DecodeSpec(fallback_workers=2, routing="static"))
        print("iterating", file=sys.stderr, flush=True)
        while True:
            for batch in loader:
                pass
""")


def _session(sid: int) -> list[str]:
    """The live processes of session ``sid``: ``"pid state command"`` (zombies left out: they have exited)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                command = cmdline.read().replace(b"\0", b" ").decode(errors="replace")[:200]
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            found.append(f"{pid} {fields[0]} {command}")
    return found


@pytest.mark.parametrize("when", ["iterating", "scanning"])
def test_sigint_to_the_main_process_alone_ends_it_quietly_with_no_process_left(small_kinetics, tmp_path, when):
    marker = b"iterating" if when == "iterating" else b"scan cpu"  # its progress bar: probing
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(small_kinetics), str(tmp_path / "m.sqlite")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                            env=dict(os.environ, DALILOAD_PROGRESS="1"))
    seen = b""
    try:
        while marker not in seen:
            chunk = proc.stderr.read1(4096)
            assert chunk, seen.decode(errors="replace")[-3000:]
            seen += chunk
        time.sleep(0.5)  # in the middle of it
        os.kill(proc.pid, signal.SIGINT)
        _, rest = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    err = (seen + rest).decode(errors="replace")
    assert proc.returncode == -signal.SIGINT, err[-3000:]  # what an uncaught KeyboardInterrupt exits with
    assert err.count("Traceback (most recent call last)") == 1 and err.rstrip().endswith("KeyboardInterrupt"), \
        err[-3000:]
    assert "BrokenPipeError" not in err and "Exception in thread" not in err, err[-3000:]
    deadline = time.monotonic() + 30
    while _session(proc.pid) and time.monotonic() < deadline:  # the workers end when they see their pipe close
        time.sleep(0.1)
    assert _session(proc.pid) == []


def test_a_ctrl_c_that_lands_in_a_finalizer_is_delivered_again_not_dropped():
    """CI saw one SIGINT land inside the give-back of a batch's buffer (a weakref.finalize callback): Python
    reported it as unraisable and dropped it, and the loop ran on. With the loader's hook it is raised again in
    the main thread once the finalizer returns."""
    script = textwrap.dedent("""
        import sys, time, weakref
        if sys.argv[1] == "hooked":
            from daliload.runtime import keep_interrupts
            keep_interrupts()
        class Batch: pass
        def give_back():
            raise KeyboardInterrupt  # as when SIGINT arrives while the finalizer runs
        batch = Batch()
        weakref.finalize(batch, give_back)
        try:
            del batch
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                time.sleep(0.01)
            print("ran on")
        except KeyboardInterrupt:
            print("interrupted")
    """)
    outs = {how: subprocess.run([sys.executable, "-c", script, how], capture_output=True, text=True, timeout=60,
                                cwd=Path(__file__).resolve().parents[1]).stdout.strip() for how in ("hooked", "plain")}
    assert outs == {"hooked": "interrupted", "plain": "ran on"}
