"""Faults from outside the training loop (issue 46): a stopped worker, a killed stderr relay, SIGTERM, kill -9.

Each case is a plain training script run through ``KineticsDALILoader`` in its own
session, as in ``test_exits.py`` (whose helpers these share): on DALI's route
(VP9 files, DALI's CPU decoder and its window cutters) or the fallback's (H.264
files, PyAV in worker processes). What a user must get whatever the fault: an
exit within a hang bound, the message that says what happened (and no raw
traceback of a worker), no process of the loader's left running, and no
temporary folder of multiprocessing's (``$TMPDIR/pymp-*``) left behind.

- F1: the stderr relay killed: what the script writes to stderr afterwards,
  its last traceback too, still reaches the console;
- F2: workers stopped (SIGSTOP), then an exception or Ctrl-C in the loop:
  the script exits (multiprocessing's exit hook used to join the stopped
  worker for ever);
- F7: SIGTERM mid-epoch and ``kill -9`` of a scan: no worker's traceback,
  no folder left;
- F8: a busy fallback worker stopped past its time limit: the healthy file
  it was decoding is not blamed;
- F9: SIGTERM while workers are stopped: nothing outlives the script (the
  forkserver, the resource tracker and the stopped workers used to).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from test_exits import EXIT_WITHIN_S, _no_process_left, _session_processes, _start, _until_marked
from helpers.procs import running

from daliload.synth import SynthSpec, generate_dataset

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc, stops processes")

MARK = "FAULT-NOW"
HELPERS = Path(__file__).parent / "helpers"

SCRIPT = textwrap.dedent("""\
    import functools
    import multiprocessing
    import os
    import sys
    import time

    from daliload import DecodeSpec, KineticsDALILoader

    root, how, go = sys.argv[1], sys.argv[2], sys.argv[3]
    loader = KineticsDALILoader(root, split="train", batch_size=2, clip_len=8, frame_stride=2, crop_size=48,
                                device="cpu", decode=DecodeSpec(fallback_workers=2, timeout_s=3.0))
    if how == "stall":
        sys.path.insert(0, sys.argv[4])
        from stopping_rows import stopping_rows

        loader.sources.fallback.use_task_fn(functools.partial(stopping_rows, marker=go))
        for videos, labels in loader:
            pass
        stats = loader.stats()
        print("FAILURES", [(f.path, f.kind) for f in stats.failures], "QUARANTINED", list(stats.quarantined),
              flush=True)
        print("SCRIPT-END", flush=True)
        sys.exit(0)
    for epoch in range(1000):
        loader.set_epoch(epoch)
        for i, (videos, labels) in enumerate(loader):
            if epoch == 1 and i == 0:  # the second epoch, with batches in flight
                print("PIDS", *[p.pid for p in multiprocessing.active_children()], flush=True)
                print("{mark}", flush=True)
                if how != "sigterm":  # that one goes on training, workers busy, until it is killed
                    while not os.path.exists(go):
                        time.sleep(0.05)
                if how == "raise":
                    raise ValueError("the training step failed")
                if how == "stderr":
                    print("WRITTEN-TO-STDERR-AFTER", file=sys.stderr, flush=True)
                    raise ValueError("the training step failed after the relay died")
            time.sleep(0.05)  # the training step
""").replace("{mark}", MARK)


def _dataset(root: Path, codec: str) -> Path:
    spec = SynthSpec(num_classes=2, clips_per_class=3, val_fraction=0.0, width=96, height=64, duration_s=1.0,
                     codec_mix={codec: 1.0}, broken_fraction=0.0, seed=5)
    generate_dataset(root, spec, workers=2, progress=False)
    return root


def _clips(root: Path, make_clip, codec: str) -> Path:
    """Six clips with a keyframe every 10 frames, so that DALI's windows are cut (in worker processes)."""
    for i in range(6):
        clip = make_clip(codec=codec, num_frames=48, width=96, height=64, gop=10, class_id=i % 2, seed=i)
        folder = root / "train" / f"class{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(clip, folder / f"clip{i}{clip.suffix}")
    return root


@pytest.fixture(scope="module")
def datasets(tmp_path_factory, make_clip) -> dict[str, Path]:
    """Route name -> a root whose every file takes that route on the CPU, scanned once here."""
    from daliload import KineticsDALILoader

    roots = {"dali": _clips(tmp_path_factory.mktemp("vp9"), make_clip, "vp9"),
             "fallback": _clips(tmp_path_factory.mktemp("h264"), make_clip, "h264")}
    for route, root in roots.items():
        loader = KineticsDALILoader(root, "train", batch_size=2, clip_len=8, device="cpu")
        assert {v.route for v in loader.videos} == {route}, f"{root}: expected every file on route {route}"
        loader.close()
    return roots


class Run:
    """One script in its own session, with its own ``TMPDIR`` (to see what multiprocessing leaves there)."""

    def __init__(self, tmp_path: Path, root: Path, how: str) -> None:
        self.tmp = tmp_path / "tmp"
        self.tmp.mkdir()
        self.go = tmp_path / "go"
        script = tmp_path / "train.py"
        script.write_text(SCRIPT)
        self.proc = _start([sys.executable, str(script), str(root), how, str(self.go), str(HELPERS)],
                           TMPDIR=str(self.tmp))
        self.lines: list[str] = []
        self.pids: list[int] = []

    def until_marked(self) -> float:
        self.lines, marked = _until_marked(self.proc, MARK)
        self.pids = [int(pid) for line in self.lines if line.startswith("PIDS") for pid in line.split()[1:]]
        return marked

    def stop_workers(self) -> None:
        assert self.pids, "the script named no worker to stop:\n" + "".join(self.lines)[-3000:]
        for pid in self.pids:
            os.kill(pid, signal.SIGSTOP)

    def finish(self, since: float, limit_s: float = EXIT_WITHIN_S) -> str:
        """The whole output, once the script has exited within ``limit_s`` and left nothing behind."""
        output = "".join(self.lines) + _exited(self.proc, since, limit_s)
        _folder_goes(self.tmp)
        return output


def _exited(proc: subprocess.Popen, since: float, limit_s: float) -> str:
    """The rest of ``proc``'s output, once it has exited within ``limit_s`` of ``since`` and nothing of its
    session runs on; a test failure (not a hang) otherwise."""
    try:
        proc.wait(timeout=max(0.1, since + limit_s - time.monotonic()))
    except subprocess.TimeoutExpired:
        _kill_session(proc.pid)
        proc.wait()
        pytest.fail(f"still running {limit_s:g} s after the fault:\n{proc.stdout.read()[-3000:]}")
    try:
        _no_process_left(proc.pid)
    finally:
        _kill_session(proc.pid)  # a leftover holds the output pipe open: reading it would wait for ever
    return proc.stdout.read()


@pytest.fixture
def start():
    """``start(tmp_path, root, how) -> Run``; whatever of its session still runs at the test's end is killed
    (a failed test must not leave a script waiting, or stopped workers, to the rest of the suite)."""
    runs: list[Run] = []

    def run(tmp_path: Path, root: Path, how: str) -> Run:
        runs.append(Run(tmp_path, root, how))
        return runs[-1]

    yield run
    for each in runs:
        _kill_session(each.proc.pid)
        each.proc.wait()


def _kill_session(sid: int) -> None:
    for line in _session_processes(sid):
        try:
            os.kill(int(line.split()[0]), signal.SIGKILL)
        except ProcessLookupError:
            pass


def _no_worker_traceback(output: str) -> None:
    """No worker's traceback of its broken pipe, nothing multiprocessing's resource tracker says it cleaned."""
    for noise in ("Traceback", "BrokenPipeError", "ConnectionResetError", "Process daliload-worker", "leaked",
                  "resource_tracker"):
        assert noise not in output, output[-3000:]


# -- F2, F9: stopped workers --------------------------------------------------------------------------------

def test_an_exception_with_stopped_window_cutters_ends_the_script(start, datasets, tmp_path):
    """F2: multiprocessing's exit hook sent the stopped cutters SIGTERM (which waits for a SIGCONT) and
    joined them: the traceback printed and the script never exited."""
    run = start(tmp_path, datasets["dali"], "raise")
    marked = run.until_marked()
    run.stop_workers()
    run.go.touch()
    output = run.finish(marked)
    assert run.proc.returncode == 1, output[-3000:]
    assert "ValueError: the training step failed" in output


def test_ctrl_c_with_stopped_window_cutters_ends_the_script(start, datasets, tmp_path):
    run = start(tmp_path, datasets["dali"], "sigint")
    marked = run.until_marked()
    run.stop_workers()
    os.killpg(run.proc.pid, signal.SIGINT)  # Ctrl-C: the whole process group
    output = run.finish(marked)
    assert run.proc.returncode != 0 and "KeyboardInterrupt" in output, output[-3000:]


@pytest.mark.parametrize("route", ["dali", "fallback"])
def test_sigterm_while_workers_are_stopped_leaves_nothing_running(start, datasets, tmp_path, route):
    """F9: the stopped workers held the forkserver's 'alive' pipe, so it never saw the script go, and
    the workers (its children, dying with it) never died: all of it, the resource tracker and the stderr
    relay with them, outlived the script."""
    run = start(tmp_path, datasets[route], "wait")
    marked = run.until_marked()
    run.stop_workers()
    os.kill(run.proc.pid, signal.SIGTERM)  # `kill PID`
    output = run.finish(marked)
    assert run.proc.returncode == -signal.SIGTERM, output[-3000:]
    _no_worker_traceback(output)


# -- F7: quiet exits ----------------------------------------------------------------------------------------

def test_sigterm_mid_epoch_exits_without_a_worker_traceback_or_a_temporary_folder(start, datasets, tmp_path):
    """F7: busy workers met their supervisor's pipe reset and printed a ConnectionResetError traceback."""
    run = start(tmp_path, datasets["fallback"], "sigterm")
    marked = run.until_marked()
    time.sleep(0.3)  # training on, the workers decoding ahead
    os.kill(run.proc.pid, signal.SIGTERM)
    output = run.finish(marked)
    assert run.proc.returncode == -signal.SIGTERM, output[-3000:]
    _no_worker_traceback(output)


SCAN_SCRIPT = textwrap.dedent("""\
    import sys

    from daliload import KineticsDALILoader, ScanSpec
    from daliload.testing import probe_faults

    with probe_faults({"*": "slow"}):  # a scan long enough to be killed in the middle of
        KineticsDALILoader(sys.argv[1], "train", batch_size=2, clip_len=8, device="cpu", scan=ScanSpec(workers=2))
""")


def test_kill_9_of_a_scan_leaves_no_traceback_process_or_folder(tmp_path):
    """F7: ``kill -9`` of a scan: its probe workers exit without a traceback, its folder goes."""
    root = _dataset(tmp_path / "fresh", "h264")  # never scanned: the script's loader scans it
    script = tmp_path / "scan.py"
    script.write_text(SCAN_SCRIPT)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = _start([sys.executable, str(script), str(root)], TMPDIR=str(tmp))
    try:
        deadline = time.monotonic() + 120.0
        while not _probing(proc.pid):  # the forkserver and its probe workers are up
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            assert time.monotonic() < deadline, "no probe worker within 120 s"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        rest = _exited(proc, time.monotonic(), EXIT_WITHIN_S)
        _no_worker_traceback(rest)
        _folder_goes(tmp)
    finally:
        _kill_session(proc.pid)


def _probing(sid: int) -> bool:
    """Whether a worker forked by the session's forkserver runs (3 processes: the script, the forkserver,
    the resource tracker, and then workers)."""
    return sum("forkserver" in line for line in _session_processes(sid)) >= 2


def _folder_goes(tmp: Path, within_s: float = 10.0) -> None:
    """Multiprocessing's ``pymp-*`` folder in ``tmp`` is gone (the forkserver removes it as it exits)."""
    deadline = time.monotonic() + within_s
    while left := sorted(p.name for p in tmp.glob("pymp-*")):
        assert time.monotonic() < deadline, f"left in $TMPDIR: {left}"
        time.sleep(0.1)


# -- F8: a stopped worker's file is not blamed --------------------------------------------------------------

def test_a_busy_fallback_worker_stopped_past_its_time_limit_does_not_fail_its_file(start, datasets, tmp_path):
    """F8: the file a stopped worker was decoding was reported as a timeout and quarantined for the run;
    it now goes to a fresh worker, with a warning, and decodes."""
    run = start(tmp_path, datasets["fallback"], "stall")
    rest = _exited(run.proc, time.monotonic(), 120.0)
    assert run.proc.returncode == 0, rest[-3000:]
    assert run.go.exists(), "no worker was stopped"
    assert "FAILURES [] QUARANTINED []" in rest, rest[-3000:]
    assert "but was stopped" in rest and "the task goes to a fresh worker" in rest, rest[-3000:]


# -- F1: the stderr relay killed ----------------------------------------------------------------------------

def test_stderr_outlives_its_relay(start, datasets, tmp_path):
    """F1: with the relay killed, everything the script wrote to stderr afterwards went into a pipe
    nobody read: its warnings, its log lines and its last traceback (exit 1 and no word)."""
    run = start(tmp_path, datasets["dali"], "stderr")
    marked = run.until_marked()
    [relay] = [int(line.split()[0]) for line in _session_processes(run.proc.pid) if "_native_logs.py" in line]
    os.kill(relay, signal.SIGKILL)  # the OOM killer, a stray kill -9
    deadline = time.monotonic() + 10.0
    while running(relay) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # the script's watch puts stderr back as the relay's end of the pipe goes
    run.go.touch()
    output = run.finish(marked)
    assert run.proc.returncode == 1, output[-3000:]
    assert f"the process that filtered DALI's own lines out of stderr (pid {relay}) has died" in output
    assert "WRITTEN-TO-STDERR-AFTER" in output
    assert "ValueError: the training step failed after the relay died" in output
