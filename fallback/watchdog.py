"""Supervise one DataLoader iterator: cut hung decodes, name what a dead worker held.

The main-process half of the fallback's crash isolation (the worker half is
:mod:`fallback.progress`). :class:`Watchdog` wraps ``next(iterator)``:

* a daemon thread polls the progress board and SIGKILLs a worker whose current
  decode is older than ``1.25 * timeout_s + 0.5`` (the decoder's own
  cooperative deadline at ``timeout_s`` usually fires first, and then no
  worker is lost);
* a worker death (signal, exit, or the kill above) surfaces from ``next`` as
  :class:`WorkerLost`, and :meth:`Watchdog.culprits` names the samples it
  cost, with :data:`~daliload.failures.REASON_TIMEOUT` or
  :data:`~daliload.failures.REASON_WORKER_DIED` reasons.

torch raises a worker's death from its SIGCHLD handler, which would land in
the consumer's code between batches; the worker pids are registered with that
handler only while the watchdog waits inside ``next``.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Any

from daliload.failures import REASON_TIMEOUT, REASON_WORKER_DIED
from fallback import _torch_internals as internals
from fallback.progress import BUSY, ProgressBoard

logger = logging.getLogger(__name__)

#: How long a lost connection to a worker may wait for that worker's death to show.
_DEATH_GRACE_S = 2.0


class WorkerLost(Exception):
    """The DataLoader lost a worker; ``__cause__`` is torch's error."""


class Watchdog:
    """Runs one DataLoader iterator (see the module docstring).

    Args:
        iterator: a fresh DataLoader iterator.
        board: the dataset's progress board (``None`` without workers).
        timeout_s: per-sample decode limit; ``None``: no hang detection.
    """

    def __init__(self, iterator: Any, board: ProgressBoard | None, timeout_s: float | None) -> None:
        internals.check_iterator(iterator)
        self.iterator = iterator
        self.board = board
        self.timeout_s = timeout_s
        self._timed_out: dict[int, tuple[int, float]] = {}  # worker id -> (slot, seconds)
        self._stop = threading.Event()
        self._thread = None
        internals.unregister_worker_pids(iterator)
        if board is not None and timeout_s is not None:
            self._thread = threading.Thread(target=self._watch, name="fallback-watchdog", daemon=True)
            self._thread.start()

    def next(self) -> Any:
        """``next(iterator)``; a worker's death raises :class:`WorkerLost`."""
        internals.register_worker_pids(self.iterator)
        try:
            return next(self.iterator)
        except RuntimeError as err:
            if self.board is not None and internals.is_worker_loss(err):
                raise WorkerLost() from err
            raise
        except (ConnectionError, EOFError, FileNotFoundError) as err:
            # A worker that dies right after queueing a batch takes the batch's
            # shared-memory handle with it; that is a worker loss too.
            if self.board is not None and self._wait_for_a_death(_DEATH_GRACE_S):
                raise WorkerLost() from err
            raise
        finally:
            internals.unregister_worker_pids(self.iterator)

    def stop(self) -> None:
        """Stop the hang-detection thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def culprits(self, error: BaseException | None) -> list[tuple[int, str]]:
        """``(slot, reason)`` for each sample whose worker died or was cut."""
        dead = self._dead_workers(error)
        found = []
        for worker_id in range(self.board.num_workers):
            pid, slot, _started, state = self.board.read(worker_id)
            if worker_id in self._timed_out:
                slot, seconds = self._timed_out[worker_id]
                found.append((slot, f"{REASON_TIMEOUT}: decode still running after {seconds:.1f} s; "
                                    f"worker killed"))
            elif pid in dead and state == BUSY and slot >= 0:
                found.append((slot, f"{REASON_WORKER_DIED} ({dead[pid]}) while decoding this sample"))
        return found

    # -- internals --------------------------------------------------------------------

    def _wait_for_a_death(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while True:
            if any(p.exitcode is not None for p in internals.workers(self.iterator)):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)

    def _dead_workers(self, error: BaseException | None) -> dict[int, str]:
        dead: dict[int, str] = {}
        for process in internals.workers(self.iterator):
            process.join(timeout=0)
            code = process.exitcode
            if code is not None:
                dead[process.pid] = (f"signal {signal.Signals(-code).name}" if code < 0
                                     else f"exit code {code}")
        for pid in internals.pids_in_error(error):
            dead.setdefault(pid, "exited unexpectedly")
        return dead

    def _watch(self) -> None:
        limit = self.timeout_s * 1.25 + 0.5
        poll = min(0.5, max(0.05, self.timeout_s / 10))
        while not self._stop.wait(poll):
            now = time.monotonic()
            for worker_id in range(self.board.num_workers):
                pid, slot, started, state = self.board.read(worker_id)
                if state != BUSY or pid <= 0 or now - started <= limit or not _alive(pid):
                    continue  # a dead worker is the DataLoader's to report, not a timeout
                # Re-read: the worker may have moved on between the two reads.
                if self.board.read(worker_id)[1:] != (slot, started, state):
                    continue
                self._timed_out[worker_id] = (slot, now - started)
                self.board.mark_timed_out(worker_id)
                logger.warning("worker %d (pid %d) stuck on slot %d for %.1f s: killing it",
                               worker_id, pid, slot, now - started)
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass  # died on its own meanwhile


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (not gone, not a zombie), without reaping it."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rsplit(b")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    except (OSError, IndexError):
        return True  # no procfs: assume alive, the timeout still applies
    return state not in (b"Z", b"X")
