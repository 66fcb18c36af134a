"""One worker process of :class:`~daliload.runtime.WorkerPool` as its supervisor sees it, and what a task becomes.

What the pool's supervisor keeps per worker (:class:`_Worker`), the outcome it
reports per task (:class:`TaskOutcome`), and the readings and acts on a
worker's process that do not depend on the pool: its state and run-queue
wait from ``/proc`` (stopped, starved), sending it a task with its file
descriptors, joining it once killed without waiting for ever, and saying how
it died.
"""

from __future__ import annotations

import logging
import signal
import socket
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, Deque, Generic, Literal, TypeVar

logger = logging.getLogger("daliload.runtime._workerpool")  # the pool's warnings, under one logger

T = TypeVar("T")
R = TypeVar("R")

Status = Literal["ok", "error", "timeout", "crash"]

#: How long :meth:`WorkerPool.close` gives a killed worker to be gone before it stops waiting for it.
KILLED_GONE_WITHIN_S = 5.0

_Task = tuple  # (task_id, item, fds)


@dataclass(frozen=True)
class TaskOutcome(Generic[T, R]):
    """What became of one task.

    Attributes:
        item: the input item.
        status: ``"ok"``, ``"error"`` (the function raised), ``"timeout"`` or
            ``"crash"`` (the worker process died).
        value: the function's return value when ``status == "ok"``.
        error: what went wrong otherwise, e.g. ``"ValueError: bad file"`` or
            ``"worker died with signal SIGSEGV"``.
        task_id: what :meth:`WorkerPool.submit` returned for it.
    """

    item: T
    status: Status
    value: R | None = None
    error: str = ""
    task_id: int = -1

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass
class _Worker:
    process: Any
    conn: Connection
    started: float
    ready: bool = False
    startup_error: str = ""  # why it could not start, when it said so
    queue: Deque[_Task] = field(default_factory=deque)  # sent, not answered; the head runs once it says so
    running: int | None = None  # the task id it said it started, until its answer
    # When the head of the queue became the head (sent to an idle worker, or the one before it answered): its
    # time limit counts from then, not from the worker's "started", which a stopped worker never sends.
    head_since: float = 0.0
    sock: socket.socket | None = None  # the connection as a socket, to pass file descriptors
    # When the running task started, and the worker's run-queue wait then (ns; None where unknown): the
    # time limit asks how much of the task's time the worker spent waiting for a CPU.
    running_since: float = 0.0
    queued_ns_then: int | None = None


def _proc_stat_state(pid: int | None) -> str:
    """The state letter of ``/proc/PID/stat`` (``"R"``, ``"S"``, ``"D"``, ``"T"``...), ``""`` where unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError, UnicodeDecodeError):
        return ""


def _stopped(pid: int | None) -> bool:
    """Whether ``pid`` is stopped (SIGSTOP, SIGTSTP, a frozen cgroup's ``T``, a debugger's ``t``)."""
    return _proc_stat_state(pid) in ("T", "t")


def _queued_ns(pid: int | None) -> int | None:
    """Nanoseconds ``pid`` has spent runnable but waiting for a CPU (``/proc/PID/schedstat``), or None."""
    try:
        with open(f"/proc/{pid}/schedstat", "rb") as schedstat:
            return int(schedstat.read().split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _join_killed(process: Any) -> None:
    """Wait for a worker asked to exit or killed, but not for ever: one stuck in the kernel past a SIGKILL
    (a hung network file system) is let go of, so that multiprocessing's exit hook does not join it."""
    process.join(KILLED_GONE_WITHIN_S)
    if process.is_alive():
        logger.warning("worker pid %s is still there %g s after SIGKILL (stuck in the kernel?); leaving it",
                       process.pid, KILLED_GONE_WITHIN_S)
        _forget_child(process)


def _forget_child(process: Any) -> None:
    """Take ``process`` off multiprocessing's list of children, which its exit hook joins."""
    import multiprocessing.process

    multiprocessing.process._children.discard(process)


def _send(worker: _Worker, task: _Task) -> None:
    task_id, item, fds = task
    worker.conn.send((task_id, item, len(fds)))
    if fds:
        if worker.sock is None:
            worker.sock = socket.fromfd(worker.conn.fileno(), socket.AF_UNIX, socket.SOCK_STREAM)
        socket.send_fds(worker.sock, [b"F"], list(fds))


def _close_worker(worker: _Worker) -> None:
    if worker.sock is not None:
        worker.sock.close()
    worker.conn.close()


def _exit_description(exitcode: int | None) -> str:
    if exitcode is None:
        return "worker died"
    if exitcode < 0:
        try:
            return f"worker died with signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"worker died with signal {-exitcode}"
    return f"worker exited with code {exitcode}"
