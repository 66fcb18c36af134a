"""Loaders measured epoch by epoch in turn: one long-lived process per loader, fed "run one epoch" commands.

A machine whose speed drifts 5-25 % over minutes (a shared VM) moves a
loader measured in one block of epochs by as much as loaders differ. So the
harness measures the loaders of one dataset (and worker count) as a group::

    start every loader's process, each builds its loader     (set-up, not timed)
    warm-up: each loader one epoch, in turn                  (--warmup rounds, untimed)
    round r = 0 .. runs-1: each loader one epoch, in turn,   (timed)
              the order rotated left by r
    stop every process

so each round's epochs ran minutes apart at most, and a ratio between two
loaders is taken round by round (:func:`round_ratio`): its spread over the
rounds shows whether the machine or the loaders decided it.

Why a long-lived child per loader (``python -m benchmarks.measure --serve``)
rather than one process per epoch: a loader is built once and keeps its
workers, caches and DALI pipeline between its epochs, as in training, and
an epoch never pays a process start, an import of torch or a warm-up of its
own; the isolation stays what it was (each loader in its own interpreter,
its peak RSS its own process tree's, a crash or a hang ending only its own
process). The timeout is per answer: set-up or one epoch that takes longer
than ``--timeout`` seconds kills that loader's process group (its workers
too), the loader is reported failed with the reason, and the others go on.
The cost: every loader of a group is alive at once (its idle workers hold
memory; the resource monitor of an idle one does not sample).
"""

from __future__ import annotations

import json
import os
import select
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence


class LoaderProcess:
    """One loader's measuring process: ``python -m benchmarks.measure --serve JOB`` (its own session).

    Args:
        job_file: the job (see :mod:`benchmarks.measure`).
        log_file: where its stderr (and anything its libraries print) goes.
        timeout: seconds each answer may take.
    """

    def __init__(self, job_file: Path, log_file: Path, timeout: float, *, env: dict | None = None) -> None:
        self.log_file = log_file
        self.timeout = timeout
        self._log = open(log_file, "w", encoding="utf-8")
        # Its own session, so a timeout can end the process AND its spawned workers.
        self._process = subprocess.Popen([sys.executable, "-m", "benchmarks.measure", "--serve", str(job_file)],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, env=env,
                                         start_new_session=True)
        self._buffer = b""

    def _answer(self) -> dict:
        """The next answer line; a failed answer when the process ends, or outlasts the timeout (killed)."""
        deadline = time.monotonic() + self.timeout
        out = self._process.stdout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                return {"status": "failed", "reason": f"timed out after {self.timeout:g} s (killed)"}
            ready, _, _ = select.select([out], [], [], left)
            if not ready:
                continue
            chunk = os.read(out.fileno(), 65536)
            if not chunk:  # the process ended without answering
                code = self._process.wait()
                tail = self.log_file.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-1:]
                return {"status": "failed", "reason": f"measurement process exited with {code}: "
                                                      f"{' '.join(tail)[:300]} (log: {self.log_file})"}
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def started(self) -> dict:
        """The set-up's answer: ``ready`` (with ``setup_s``), ``unavailable`` or ``failed``."""
        return self._answer()

    def epoch(self) -> dict:
        """Run one epoch: ``{"status": "ok", "run": RunFigures}`` or ``failed`` with the reason."""
        try:
            self._process.stdin.write(b"epoch\n")
            self._process.stdin.flush()
        except BrokenPipeError:
            return self._answer()  # it ended: its exit status and log say why
        return self._answer()

    def stop(self) -> None:
        """Ask it to close its loader and exit; kill it if it does not within the timeout."""
        if self._process.poll() is None:
            try:
                self._process.stdin.write(b"stop\n")
                self._process.stdin.close()
                self._process.wait(timeout=self.timeout)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.kill()
        self._log.close()

    def kill(self) -> None:
        if self._process.poll() is None:
            os.killpg(self._process.pid, signal.SIGKILL)
            self._process.wait()


def rotated(items: Sequence, round_number: int) -> list:
    """``items`` rotated left by ``round_number``: each runs first once every ``len(items)`` rounds.

    Worked example: ``["a", "b", "c"]`` in round 0, 1, 2, 3: abc, bca, cab, abc.
    """
    items = list(items)
    shift = round_number % len(items) if items else 0
    return items[shift:] + items[:shift]


def round_ratio(numerator: Sequence[float], denominator: Sequence[float]) -> dict | None:
    """Per-round ratios of two loaders' clips/s (the same rounds), as ``{median, min, max, runs}``; None if none."""
    ratios = [a / b for a, b in zip(numerator, denominator) if b]
    if not ratios:
        return None
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios), "runs": ratios}
