"""A small supervised process pool: a task that hangs or crashes costs that task only.

``multiprocessing.Pool`` and ``concurrent.futures`` lose the whole pool (or
hang forever) when native code in a worker segfaults or never returns, which
is what a broken video file can make FFmpeg do. :class:`WorkerPool` runs one
task at a time per worker process and supervises each one:

- a task that raises is reported as ``"error"`` with the exception's text;
- a worker that dies mid-task (segfault, ``os.abort``, OOM kill) makes that
  task ``"crash"``; the worker is replaced and the tasks queued behind it are
  re-sent to the new one;
- a task that runs longer than ``timeout_s`` gets its worker killed and is
  reported as ``"timeout"``; again only that task is lost.

Memory stays bounded: at most ``workers * tasks_per_worker`` items are pulled
from the input iterable and in flight at once, and outcomes are yielded as they
arrive (unordered). Workers start with ``forkserver`` (or ``spawn``), never
plain ``fork``, so they do not inherit the parent's threads, CUDA state or open
decoders. On Linux a worker also dies with its parent (``PR_SET_PDEATHSIG``),
so killing the parent with SIGKILL leaves no orphans behind.

Example::

    with WorkerPool(probe_file, workers=4, timeout_s=30) as pool:
        for outcome in pool.imap_unordered(paths):
            if outcome.ok:
                use(outcome.value)
            else:
                record(outcome.item, outcome.status, outcome.error)

``fn`` and the items must be picklable (``fn`` a module-level function).
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing as mp
import os
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Deque, Generic, Iterable, Iterator, Literal, Sequence, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

Status = Literal["ok", "error", "timeout", "crash"]
StartMethod = Literal["forkserver", "spawn"]

#: A worker that has not said "ready" after this long is treated as failed to start.
STARTUP_TIMEOUT_S = 120.0
#: Consecutive workers dying before they are ready before the pool gives up.
MAX_STARTUP_FAILURES = 3
_READY = "__ready__"
_PR_SET_PDEATHSIG = 1


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
    """

    item: T
    status: Status
    value: R | None = None
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError) as err:  # exotic libc: orphans then exit on EOF instead
        logger.debug("prctl(PR_SET_PDEATHSIG) unavailable: %s", err)


def _worker_main(conn: Connection, fn: Callable[[Any], Any]) -> None:
    """Worker loop: run tasks one at a time, reply with (task_id, status, value, error).

    The worker exits on a ``None`` message or when the supervisor's end of the
    pipe closes (EOF).
    """
    # Ctrl-C goes to the whole process group; the supervisor decides what to stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    conn.send(_READY)
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        task_id, item = message
        try:
            reply = (task_id, "ok", fn(item), "")
        except Exception as err:  # the task's outcome, reported to the supervisor, not swallowed
            reply = (task_id, "error", None, f"{type(err).__name__}: {err}")
        try:
            conn.send(reply)
        except (TypeError, AttributeError, ValueError) as err:  # result not picklable
            conn.send(
                (
                    task_id,
                    "error",
                    None,
                    f"result could not be sent back: {type(err).__name__}: {err}",
                )
            )


def _exit_description(exitcode: int | None) -> str:
    if exitcode is None:
        return "worker died"
    if exitcode < 0:
        try:
            return f"worker died with signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"worker died with signal {-exitcode}"
    return f"worker exited with code {exitcode}"


@dataclass
class _Worker:
    process: Any
    conn: Connection
    started: float
    ready: bool = False
    queue: Deque[tuple[int, Any]] = field(default_factory=deque)
    head_since: float = 0.0  # when the task at the head of ``queue`` started running


class WorkerPool(Generic[T, R]):
    """Supervised pool of worker processes running ``fn`` on items.

    Args:
        fn: module-level function of one item.
        workers: number of worker processes (>= 1).
        timeout_s: seconds one task may run before its worker is killed;
            ``None`` waits forever.
        start_method: ``"forkserver"`` (default where available) or ``"spawn"``.
        tasks_per_worker: tasks queued per worker (>= 1); 2 hides the
            round-trip latency, more only raises memory.
        preload: modules the forkserver imports once, so each new worker
            starts with them loaded (ignored for ``spawn``).

    Raises:
        ValueError: for a bad ``workers``, ``timeout_s``, ``start_method`` or
            ``tasks_per_worker``.
    """

    def __init__(
        self,
        fn: Callable[[T], R],
        *,
        workers: int,
        timeout_s: float | None = None,
        start_method: StartMethod | None = None,
        tasks_per_worker: int = 2,
        preload: Sequence[str] = (),
    ) -> None:
        if not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be an int >= 1, got {workers!r}")
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 or None, got {timeout_s!r}")
        if tasks_per_worker < 1:
            raise ValueError(f"tasks_per_worker must be >= 1, got {tasks_per_worker!r}")
        if start_method is None:
            start_method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
        if start_method not in ("forkserver", "spawn"):
            raise ValueError(
                f"start_method must be 'forkserver' or 'spawn' (never 'fork'), got {start_method!r}"
            )
        self._fn = fn
        self._num_workers = workers
        self._timeout_s = timeout_s
        self._depth = tasks_per_worker
        self._ctx = mp.get_context(start_method)
        if start_method == "forkserver" and preload:
            self._ctx.set_forkserver_preload(list(preload))
        self._workers: list[_Worker] = []
        self._startup_failures = 0
        self._running = False

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> "WorkerPool[T, R]":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop all workers (asking first, then killing after a second)."""
        workers, self._workers = self._workers, []
        for worker in workers:
            try:
                worker.conn.send(None)
            except (OSError, ValueError):
                pass  # already gone
        deadline = time.monotonic() + 1.0
        for worker in workers:
            worker.process.join(max(0.0, deadline - time.monotonic()))
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()
            worker.conn.close()

    def _spawn(self) -> _Worker:
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(
            target=_worker_main, args=(child_conn, self._fn), name="daliload-worker", daemon=True
        )
        process.start()
        child_conn.close()
        return _Worker(process=process, conn=parent_conn, started=time.monotonic())

    def _replace(self, worker: _Worker, pending: Deque[tuple[int, Any]]) -> None:
        """Kill ``worker``, give its unstarted tasks back to ``pending``, start a new one."""
        if worker.process.is_alive():
            worker.process.kill()
        worker.process.join()
        worker.conn.close()
        if not worker.ready:
            self._startup_failures += 1
            if self._startup_failures >= MAX_STARTUP_FAILURES:
                raise RuntimeError(
                    f"worker processes fail to start "
                    f"({_exit_description(worker.process.exitcode)}, "
                    f"{self._startup_failures} in a row); their error is on stderr"
                )
        pending.extendleft(reversed(worker.queue))
        worker.queue.clear()
        self._workers[self._workers.index(worker)] = self._spawn()

    # -- the supervisor loop -----------------------------------------------------------------

    def imap_unordered(self, items: Iterable[T]) -> Iterator[TaskOutcome[T, R]]:
        """Run ``fn`` on every item; yield each outcome as soon as it is known.

        Items are pulled lazily, at most ``workers * tasks_per_worker`` at a time.
        Closing the generator early (``break``, an exception, Ctrl-C) stops the workers.
        """
        if self._running:
            raise RuntimeError("WorkerPool.imap_unordered is already running; one run at a time")
        self._running = True
        source = iter(items)
        pending: Deque[tuple[int, Any]] = deque()  # (task_id, item) taken back from dead workers
        next_id = 0
        exhausted = False
        try:
            self._workers = [self._spawn() for _ in range(self._num_workers)]
            while True:
                # Fill every ready worker's queue.
                for worker in self._workers:
                    while worker.ready and len(worker.queue) < self._depth:
                        if pending:
                            task = pending.popleft()
                        elif not exhausted:
                            try:
                                task = (next_id, next(source))
                            except StopIteration:
                                exhausted = True
                                break
                            next_id += 1
                        else:
                            break
                        if not worker.queue:
                            worker.head_since = time.monotonic()
                        worker.queue.append(task)
                        try:
                            worker.conn.send(task)
                        except (OSError, ValueError):
                            break  # it died; the sentinel below reports it
                if exhausted and not pending and not any(w.queue for w in self._workers):
                    return
                yield from self._wait_and_collect(pending)
        finally:
            self._running = False
            self.close()

    def _next_deadline(self) -> float | None:
        deadlines = []
        for worker in self._workers:
            if not worker.ready:
                deadlines.append(worker.started + STARTUP_TIMEOUT_S)
            elif worker.queue and self._timeout_s is not None:
                deadlines.append(worker.head_since + self._timeout_s)
        return min(deadlines) if deadlines else None

    def _wait_and_collect(self, pending: Deque[tuple[int, Any]]) -> Iterator[TaskOutcome[T, R]]:
        deadline = self._next_deadline()
        wait_s = None if deadline is None else max(0.0, deadline - time.monotonic())
        handles: list[Any] = []
        for worker in self._workers:
            handles.append(worker.conn)
            handles.append(worker.process.sentinel)
        ready = set(wait(handles, timeout=wait_s))

        for worker in list(self._workers):
            died = worker.process.sentinel in ready
            if worker.conn in ready or died:
                # Read everything it sent before (possibly) dying.
                try:
                    while worker.conn.poll():
                        message = worker.conn.recv()
                        outcome = self._on_message(worker, message)
                        if outcome is not None:
                            yield outcome
                except (EOFError, OSError):
                    died = True
            if died:
                worker.process.join(1.0)  # so exitcode says how it died
                if worker.queue and worker.ready:
                    task_id, item = worker.queue.popleft()
                    yield TaskOutcome(
                        item, "crash", error=_exit_description(worker.process.exitcode)
                    )
                self._replace(worker, pending)

        now = time.monotonic()
        for worker in list(self._workers):
            if not worker.ready and now - worker.started > STARTUP_TIMEOUT_S:
                logger.warning(
                    "worker pid %s not ready after %.0f s; restarting it",
                    worker.process.pid,
                    STARTUP_TIMEOUT_S,
                )
                self._replace(worker, pending)
            elif (
                worker.ready
                and worker.queue
                and self._timeout_s is not None
                and now - worker.head_since > self._timeout_s
            ):
                task_id, item = worker.queue.popleft()
                yield TaskOutcome(item, "timeout", error=f"no result after {self._timeout_s:g} s")
                self._replace(worker, pending)

    def _on_message(self, worker: _Worker, message: Any) -> TaskOutcome[T, R] | None:
        if message == _READY:
            worker.ready = True
            self._startup_failures = 0
            worker.head_since = time.monotonic()
            return None
        task_id, status, value, error = message
        head_id, item = worker.queue.popleft()
        if head_id != task_id:  # cannot happen: workers run their queue in order
            raise RuntimeError(
                f"worker pid {worker.process.pid} answered task {task_id}, expected {head_id}"
            )
        worker.head_since = time.monotonic()
        return TaskOutcome(item, status, value, error)
