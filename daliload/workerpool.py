"""A small supervised process pool: a task that hangs or crashes costs that task only.

(About 500 lines for one concept, how daliload starts and supervises worker
processes: the pool, its start-up checks, the shared forkserver context and
the main-script guard belong together, since each depends on how the others
start processes.)

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

Workers start under :func:`main_script_hidden`, so they never re-run a main
script that lacks an ``if __name__ == "__main__":`` guard; one that fails to
start sends its error back, and after :data:`MAX_STARTUP_FAILURES` failed
starts in a row the pool raises with it. Where another library's child process
re-runs such a script into daliload, :func:`refuse_bootstrapping_main` stops it.

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

import contextlib
import ctypes
import importlib.machinery
import logging
import multiprocessing as mp
import os
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from types import FrameType
from typing import Any, Callable, Deque, Generic, Iterable, Iterator, Literal, TypeVar

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
_FAILED = "__failed__"  # (_FAILED, "ExcType: message"): the worker could not start
#: What spawn/forkserver children are told the main module is while daliload starts
#: them: multiprocessing never re-imports a main module whose spec is named
#: ``__main__`` (that is how ``python -m package`` runs ``package/__main__.py``).
_UNIMPORTED_MAIN_SPEC = importlib.machinery.ModuleSpec("__main__", None)
_GUARD = 'if __name__ == "__main__":'
_PR_SET_PDEATHSIG = 1


#: What every daliload forkserver imports once, so that each worker it forks (scan
#: probes, fallback decoders, the synthetic dataset's encoders) starts with them
#: loaded: ~0.1 s instead of ~3.5 s re-importing torch (measured on 2 cores).
#: One forkserver serves a whole process and keeps the preload list of the first
#: pool that started it, so every daliload pool asks for this same list
#: (:func:`mp_context`); a dataset generated before training no longer leaves
#: every later epoch's workers importing torch again.
FORKSERVER_PRELOAD: tuple[str, ...] = ("torch", "av", "numpy")


def mp_context(start_method: StartMethod | None = None):
    """The multiprocessing context daliload's pools use: forkserver (preloaded) where available, else spawn.

    Raises:
        ValueError: ``start_method`` is not ``"forkserver"`` or ``"spawn"`` (never ``"fork"``).
    """
    if start_method is None:
        start_method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
    if start_method not in ("forkserver", "spawn"):
        raise ValueError(f"start_method must be 'forkserver' or 'spawn' (never 'fork'), got {start_method!r}")
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload(list(FORKSERVER_PRELOAD))
    return ctx


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


@contextlib.contextmanager
def main_script_hidden(hide: bool = True) -> Iterator[None]:
    """Start ``spawn``/``forkserver`` processes inside this block so they do not re-run the main script.

    Such a child imports the parent's main script again (as ``__mp_main__``)
    before it starts, to unpickle objects defined there; a script without an
    ``if __name__ == "__main__":`` guard then re-runs its training in every
    worker. While processes start here, the main module's spec is named
    ``__main__``, which multiprocessing treats like a package's ``__main__.py``
    and does not import in the child (``multiprocessing.spawn``, the same in
    CPython 3.8-3.13). Only for children whose target and arguments are
    importable by name: an object defined in the main script cannot be
    unpickled there.

    Args:
        hide: False makes the block do nothing (for callers whose function
            lives in the main script).
    """
    main = sys.modules.get("__main__")
    if not hide or main is None:
        yield
        return
    saved = getattr(main, "__spec__", None)
    main.__spec__ = _UNIMPORTED_MAIN_SPEC
    try:
        yield
    finally:
        main.__spec__ = saved


def _reimported_main_frame() -> FrameType | None:
    """The top-level frame of the parent's main script when this child is re-running it, else None."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == "__mp_main__":
            return frame
        frame = frame.f_back
    return None


def refuse_bootstrapping_main(what: str) -> None:
    """Raise if this process is a child still importing its parent's main script.

    A ``spawn``/``forkserver`` child (a DataLoader worker, a ``multiprocessing``
    pool) first re-runs the parent's main script as ``__mp_main__``. If that
    script builds ``what`` outside an ``if __name__ == "__main__":`` guard, the
    child would scan, load and train all over again, or wait forever for the
    manifest lock its parent holds. Call this first thing where ``what`` is
    built; it does nothing in a main process (a script, a torchrun rank, pytest)
    or in a child that has finished starting.

    Raises:
        RuntimeError: naming the script line and the guard that fixes it.
    """
    frame = _reimported_main_frame()
    if frame is None and not getattr(mp.current_process(), "_inheriting", False):
        return
    where = (f"{frame.f_code.co_filename}, line {frame.f_lineno}," if frame is not None
             else "the main script")
    raise RuntimeError(
        f"{what} was started inside a worker process that is re-running {where} at the top level. "
        f"Worker processes started with 'spawn' or 'forkserver' (DataLoader and multiprocessing workers; "
        f"the default start method on Linux from Python 3.14) import the main script again before they "
        f"start, so a script without a guard runs its training once more in every worker. Put the "
        f"script's top-level code under `{_GUARD}` (or in a main() function called from there).")


def _worker_main(conn: Connection) -> None:
    """Worker loop: receive the function, then run tasks one at a time, replying
    ``(task_id, status, value, error)``.

    The function is the first message, not a process argument, so an error
    unpickling it (its module fails to import here) can be sent back as
    ``(_FAILED, "ExcType: message")``. The worker exits on a ``None`` message
    or when the supervisor's end of the pipe closes (EOF).
    """
    # Ctrl-C goes to the whole process group; the supervisor decides what to stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    try:
        fn = conn.recv()
    except EOFError:
        return
    except Exception as err:  # reported to the supervisor, which gives up after a few tries
        conn.send((_FAILED, _first_line(err)))
        return
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


def _first_line(err: BaseException) -> str:
    """``"ExcType: first line of the message"``."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


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
    startup_error: str = ""  # why it could not start, when it said so
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

    Workers do not re-run the main script (see the module docstring) unless
    ``fn`` is defined there.

    Raises:
        ValueError: for a bad ``workers``, ``timeout_s``, ``start_method`` or
            ``tasks_per_worker``.
        RuntimeError: from :meth:`imap_unordered`, when
            :data:`MAX_STARTUP_FAILURES` workers in a row fail to start; the
            message says why the last one failed.
    """

    def __init__(
        self,
        fn: Callable[[T], R],
        *,
        workers: int,
        timeout_s: float | None = None,
        start_method: StartMethod | None = None,
        tasks_per_worker: int = 2,
    ) -> None:
        if not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be an int >= 1, got {workers!r}")
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 or None, got {timeout_s!r}")
        if tasks_per_worker < 1:
            raise ValueError(f"tasks_per_worker must be >= 1, got {tasks_per_worker!r}")
        self._ctx = mp_context(start_method)
        self._fn = fn
        self._num_workers = workers
        self._timeout_s = timeout_s
        self._depth = tasks_per_worker
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
            target=_worker_main, args=(child_conn,), name="daliload-worker", daemon=True
        )
        with main_script_hidden(getattr(self._fn, "__module__", None) != "__main__"):
            process.start()
        child_conn.close()
        worker = _Worker(process=process, conn=parent_conn, started=time.monotonic())
        try:
            parent_conn.send(self._fn)
        except (OSError, ValueError):
            pass  # it died already; the supervisor loop sees its sentinel
        return worker

    def _replace(self, worker: _Worker, pending: Deque[tuple[int, Any]], *, why: str = "") -> None:
        """Kill ``worker``, give its unstarted tasks back to ``pending``, start a new one.

        Raises:
            RuntimeError: the worker never became ready, the
                :data:`MAX_STARTUP_FAILURES`-th in a row; no new one is started.
        """
        if worker.process.is_alive():
            worker.process.kill()
        worker.process.join()
        worker.conn.close()
        if not worker.ready:
            self._startup_failures += 1
            why = worker.startup_error or why or (
                f"{_exit_description(worker.process.exitcode)} before it could report an error; "
                f"see stderr")
            logger.warning("worker pid %s failed to start: %s", worker.process.pid, why)
            if self._startup_failures >= MAX_STARTUP_FAILURES:
                raise RuntimeError(
                    f"worker processes fail to start ({self._startup_failures} in a row); "
                    f"giving up. The last one: {why}"
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
                self._replace(worker, pending, why=f"not ready after {STARTUP_TIMEOUT_S:g} s")
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
        if isinstance(message, tuple) and message[:1] == (_FAILED,):
            worker.startup_error = message[1]  # the process exits next; the supervisor replaces it
            return None
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
