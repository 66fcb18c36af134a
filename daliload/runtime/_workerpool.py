"""The one supervised process pool of the package: a task that hangs or crashes costs that task only.

``multiprocessing.Pool`` and ``concurrent.futures`` lose the whole pool (or
hang forever) when native code in a worker segfaults or never returns, which
is what a broken video file can make FFmpeg do. :class:`WorkerPool` runs one
task at a time per worker process and supervises each one:

- a task that raises is reported as ``"error"`` with the exception's text;
- a worker that dies mid-task (segfault, ``os.abort``, OOM kill) makes that
  task ``"crash"``; with ``retry_crashed``, a task whose worker a signal
  killed first goes once more to a fresh worker (an OOM kill or an outside
  ``kill`` is not the file's fault; a file that kills two workers is). The
  tasks queued behind it are re-sent. A worker tells the supervisor when it
  starts a task, so only the task it was running is blamed;
- a task with no result ``timeout_s`` after it was sent (or, queued behind
  another, after that one's result came) gets its worker killed and is
  reported as ``"timeout"``; again only that task is lost. The time counts
  from the send, not from the worker's word that it started: a worker
  stopped (``SIGSTOP``) or starved of CPU before it says so is killed at the
  same limit. Such a task is not to blame (it never ran), so it goes once
  more to a fresh worker, with a warning, and is reported as ``"timeout"``
  only when that one does not start it either;
- a task its worker said it started that has no result at its time limit
  is the task's fault (a hang: reported as ``"timeout"``) unless the worker
  could not run it: stopped (``SIGSTOP``: a debugger, Ctrl-Z of one pid, a
  frozen cgroup) or starved, waiting for a CPU for most of that time. Such a
  task, too, goes once more to a fresh worker, with a warning. Blocked is
  not stopped: a decoder waiting on a file that never comes uses no CPU
  either, and that is the file's fault. Linux tells them apart
  (:func:`_cannot_run`: ``/proc/PID/stat``'s state, ``/proc/PID/schedstat``'s
  run-queue wait); elsewhere every such task is a timeout, as before;
- a worker that dies while idle (or is killed while it starts) is replaced,
  with a warning and a pause that doubles with each such death; more than
  :data:`MAX_IDLE_DEATHS` of them within :data:`IDLE_DEATH_WINDOW_S` raise
  (something keeps killing every worker);
- workers that keep failing to start (:data:`MAX_STARTUP_FAILURES` in a row:
  an import error, an exit) raise with the last one's reason.

Two ways to use it. A batch of items::

    with WorkerPool(probe_file, workers=4, timeout_s=30) as pool:
        for outcome in pool.imap_unordered(paths):   # at most workers * tasks_per_worker in flight
            use(outcome.value) if outcome.ok else record(outcome.item, outcome.status, outcome.error)

or persistent workers fed task by task (the fallback decoder's)::

    pool = WorkerPool(decode_rows, workers=2, timeout_s=75, retry_crashed=True)
    task_id = pool.submit(task, fds=(buffer_fd,))    # file descriptors travel with the task
    for outcome in pool.wait():                      # outcomes as they arrive, any task's
        ...
    pool.cancel([task_id])                           # never waits; a running task's result is dropped

A task's file descriptors (a shared-memory buffer it writes its output into,
so that clips never travel through the pipe) are passed over the worker's
socket (``SCM_RIGHTS``); the worker calls ``fn(item, fds)`` and closes them
after. Workers start through :mod:`daliload.runtime._processes` (forkserver, never
fork; never re-running the main script; dying with their parent). ``fn`` and
the items must be picklable (``fn`` a module-level function or a
``functools.partial`` of one).

Closing never waits on a worker that cannot answer: one that is stopped is
killed at once, the others get a second to exit before they are killed.
Every pool still open when the interpreter exits is closed then, before
multiprocessing's own exit hook, which would otherwise ``terminate()`` the
workers (a SIGTERM, which a stopped process never acts on) and then join
them for ever (a stopped window cutter after an exception in the training
loop hung the script after its traceback).
"""

from __future__ import annotations

import atexit
import logging
import time
import weakref
from collections import deque
from multiprocessing.connection import wait
from typing import Any, Callable, Deque, Generic, Iterable, Iterator, Sequence

from daliload.runtime._processes import FAILED, READY, STARTED, StartMethod, main_script_hidden, mp_context, worker_main
from daliload.stream import TransferCounts, add_transfer_counts
from daliload.runtime._workers import (R, T, TaskOutcome, _close_worker,
                                       _exit_description, _join_killed, _queued_ns, _send, _stopped,
                                       _Task, _Worker)

logger = logging.getLogger(__name__)

#: A worker that has not said "ready" after this long is treated as failed to start.
STARTUP_TIMEOUT_S = 120.0
#: Consecutive workers dying before they are ready before the pool gives up.
MAX_STARTUP_FAILURES = 3
#: Deaths of idle workers (killed from outside while not running a task) tolerated within
#: :data:`IDLE_DEATH_WINDOW_S` before the pool gives up.
MAX_IDLE_DEATHS = 30
IDLE_DEATH_WINDOW_S = 60.0
#: The pause before replacing a worker that died idle: doubles with each recent death, up to the cap.
IDLE_RESTART_PAUSE_S = (0.05, 2.0)

#: The share of a running task's time its worker may spend waiting for a CPU before a task past its time
#: limit is put down to a starved worker rather than to the task.
STARVED_SHARE = 0.5


class WorkerPool(Generic[T, R]):
    """Supervised worker processes running ``fn`` on items (see the module docstring).

    Args:
        fn: module-level function of one item (``fn(item, fds)`` for tasks
            submitted with file descriptors).
        workers: number of worker processes (>= 1).
        timeout_s: seconds one task may take, from its send (or from the
            result of the task before it on the same worker), before its
            worker is killed; ``None`` waits forever.
        start_method: ``"forkserver"`` (default where available) or ``"spawn"``.
        tasks_per_worker: tasks sent ahead to each worker (>= 1); 2 hides the
            round-trip latency; more keeps a worker busy while its caller is
            away from the pool (tasks are sent only from the caller's calls).
        retry_crashed: give a task whose worker a signal killed one more try
            on a fresh worker before reporting ``"crash"``.

    Workers start on first use and run until :meth:`close` (the context
    manager's exit); a closed pool starts new ones when used again.

    Raises:
        ValueError: for a bad ``workers``, ``timeout_s``, ``start_method`` or
            ``tasks_per_worker``.
        RuntimeError: from :meth:`wait` and :meth:`imap_unordered`, when
            :data:`MAX_STARTUP_FAILURES` workers in a row fail to start, or
            idle workers keep dying; the message says why.
    """

    def __init__(self, fn: Callable[..., R], *, workers: int, timeout_s: float | None = None,
                 start_method: StartMethod | None = None, tasks_per_worker: int = 2,
                 retry_crashed: bool = False) -> None:
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
        self._retry_crashed = retry_crashed
        self._workers: list[_Worker | None] = []  # None: a slot waiting for its restart pause
        self._restart_at: dict[int, float] = {}  # slot -> when its worker starts again
        self._unsent: Deque[_Task] = deque()
        self._outstanding: set[int] = set()  # submitted, neither reported nor cancelled
        self._retried: set[int] = set()
        self._idle_deaths: Deque[float] = deque()
        self._startup_failures = 0
        self._next_id = 0
        self._running = False
        _OPEN_POOLS.add(self)

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> "WorkerPool[T, R]":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pids(self) -> list[int]:
        """Pids of the running workers (empty before the first task and after :meth:`close`)."""
        return [w.process.pid for w in self._workers if w is not None and w.process.is_alive()]

    @property
    def pending(self) -> int:
        """Tasks submitted and neither reported nor cancelled."""
        return len(self._outstanding)

    def close(self) -> None:
        """Stop all workers (asking first, then killing after a second; a stopped one at once); forget
        every task."""
        workers = [w for w in self._workers if w is not None]
        self._workers, self._restart_at = [], {}
        self._unsent.clear()
        self._outstanding.clear()
        for worker in workers:
            if _stopped(worker.process.pid):
                worker.process.kill()  # it would never read the request below
                continue
            try:
                worker.conn.send(None)
            except (OSError, ValueError):
                pass  # already gone
        deadline = time.monotonic() + 1.0
        for worker in workers:
            worker.process.join(max(0.0, deadline - time.monotonic()))
            if worker.process.is_alive():
                worker.process.kill()
        for worker in workers:
            _join_killed(worker.process)
            _close_worker(worker)

    # -- tasks one by one --------------------------------------------------------------------

    def submit(self, item: T, *, fds: Sequence[int] = (), urgent: bool = False) -> int:
        """Queue ``item`` (with ``fds``, which must stay open until its outcome); returns its task id.

        ``urgent`` tasks go before every task not yet sent to a worker.
        """
        task_id, self._next_id = self._next_id, self._next_id + 1
        task = (task_id, item, tuple(fds))
        self._unsent.appendleft(task) if urgent else self._unsent.append(task)
        self._outstanding.add(task_id)
        self.start()
        self._fill()
        return task_id

    def cancel(self, task_ids: Iterable[int]) -> None:
        """Forget these tasks without waiting: unsent ones are dropped, a running one's outcome is ignored."""
        dropped = set(task_ids) & self._outstanding
        if dropped:
            self._outstanding -= dropped
            self._unsent = deque(t for t in self._unsent if t[0] not in dropped)

    def wait(self, timeout: float | None = None) -> list[TaskOutcome[T, R]]:
        """Supervise until at least one outcome arrives (or ``timeout`` passes); return those that did.

        Returns an empty list at once when nothing is pending.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._outstanding:
            outcomes = self._step(deadline)
            if outcomes or (deadline is not None and time.monotonic() >= deadline):
                return outcomes
        return []

    # -- a batch of items --------------------------------------------------------------------

    def imap_unordered(self, items: Iterable[T]) -> Iterator[TaskOutcome[T, R]]:
        """Run ``fn`` on every item; yield each outcome as soon as it is known.

        Items are pulled lazily, at most ``workers * tasks_per_worker`` at a time.
        Closing the generator early (``break``, an exception, Ctrl-C) stops the workers.
        """
        if self._running:
            raise RuntimeError("WorkerPool.imap_unordered is already running; one run at a time")
        self._running = True
        source, exhausted = iter(items), False
        try:
            while True:
                while not exhausted and len(self._outstanding) < self._num_workers * self._depth:
                    try:
                        self.submit(next(source))
                    except StopIteration:
                        exhausted = True
                if exhausted and not self._outstanding:
                    return
                yield from self.wait()
        finally:
            self._running = False
            self.close()

    # -- the supervisor ----------------------------------------------------------------------

    def start(self) -> list[int]:
        """Start the workers now rather than with the first task; their pids."""
        if not self._workers:
            self._workers = [self._spawn() for _ in range(self._num_workers)]
        return self.pids

    def _spawn(self) -> _Worker:
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(target=worker_main, args=(child_conn,), name="daliload-worker", daemon=True)
        with main_script_hidden(getattr(self._fn, "__module__", None) != "__main__"):
            process.start()
        child_conn.close()
        worker = _Worker(process=process, conn=parent_conn, started=time.monotonic())
        try:
            parent_conn.send(self._fn)
        except (OSError, ValueError):
            pass  # it died already; the supervisor sees its sentinel
        return worker

    def _fill(self) -> None:
        """Send unsent tasks to ready workers, up to ``tasks_per_worker`` each."""
        for worker in self._workers:
            while worker is not None and worker.ready and len(worker.queue) < self._depth and self._unsent:
                task = self._unsent.popleft()
                if task[0] not in self._outstanding:
                    continue  # cancelled after a dead worker gave it back
                if not worker.queue:
                    worker.head_since = time.monotonic()
                worker.queue.append(task)
                try:
                    _send(worker, task)
                except OSError:
                    break  # it died; its sentinel reports it and the task goes back

    def _step(self, deadline: float | None) -> list[TaskOutcome[T, R]]:
        """One round: send, wait for news (or the next time limit), collect outcomes, replace the dead."""
        self.start()
        self._fill()
        live = [w for w in self._workers if w is not None]
        wakeups = [t for t in (deadline, self._next_limit()) if t is not None]
        wait_s = None if not wakeups else max(0.0, min(wakeups) - time.monotonic())
        ready = set(wait([h for w in live for h in (w.conn, w.process.sentinel)], timeout=wait_s))
        outcomes: list[TaskOutcome[T, R]] = []
        for worker in live:
            died = worker.process.sentinel in ready
            if worker.conn in ready or died:
                try:
                    while worker.conn.poll():  # everything it sent before (possibly) dying
                        self._on_message(worker, worker.conn.recv(), outcomes)
                except (EOFError, OSError):
                    died = True
            if died:
                self._on_death(worker, outcomes)
        now = time.monotonic()
        for worker in [w for w in self._workers if w is not None]:
            if not worker.ready and now - worker.started > STARTUP_TIMEOUT_S:
                self._replace(worker, why=f"not ready after {STARTUP_TIMEOUT_S:g} s")
            elif worker.queue and self._timeout_s is not None and now - worker.head_since > self._timeout_s:
                self._on_time_limit(worker, outcomes)
        for slot, when in list(self._restart_at.items()):
            if now >= when:
                del self._restart_at[slot]
                self._workers[slot] = self._spawn()
        return outcomes

    def _next_limit(self) -> float | None:
        """When the supervisor must look again: a start-up or task time limit, or a restart."""
        limits = list(self._restart_at.values())
        for worker in self._workers:
            if worker is None:
                continue
            if not worker.ready:
                limits.append(worker.started + STARTUP_TIMEOUT_S)
            elif worker.queue and self._timeout_s is not None:
                limits.append(worker.head_since + self._timeout_s)
        return min(limits) if limits else None

    def _on_time_limit(self, worker: _Worker, outcomes: list) -> None:
        """The head of ``worker``'s queue has had its time: kill the worker, and report or retry the task.

        A task the worker said it started is a hang, reported as a timeout,
        unless the worker was stopped or starved (:func:`_cannot_run`). Such a
        task, and one the worker never started (it was stopped or starved
        before it could say so), goes back, with the rest of the queue, for
        one more try on a fresh worker; a second such stall, or a stall on its
        one more try after a crash, reports it as a timeout.
        """
        task_id, item, _ = worker.queue[0]
        cannot_run = _cannot_run(worker) if worker.running == task_id else ""
        if cannot_run and task_id not in self._retried and task_id in self._outstanding:
            self._retried.add(task_id)
            logger.warning("worker pid %s had no result for its task after %g s but was %s; killing it, the "
                           "task goes to a fresh worker", worker.process.pid, self._timeout_s, cannot_run)
        elif worker.running == task_id:
            worker.queue.popleft()
            self._report(outcomes, TaskOutcome(item, "timeout", error=f"no result after {self._timeout_s:g} s",
                                               task_id=task_id))
        elif task_id in self._retried or task_id not in self._outstanding:
            worker.queue.popleft()
            self._report(outcomes, TaskOutcome(item, "timeout", task_id=task_id,
                                               error=f"no result after {self._timeout_s:g} s (its worker never "
                                                     f"started it)"))
        else:
            self._retried.add(task_id)
            logger.warning("worker pid %s did not start its task within %g s of its sending (stopped, or starved "
                           "of CPU?); killing it, the task goes to a fresh worker", worker.process.pid,
                           self._timeout_s)
        self._replace(worker)  # gives the tasks still queued back, in order

    def _report(self, outcomes: list, outcome: TaskOutcome) -> None:
        """Keep ``outcome`` unless its task was cancelled meanwhile."""
        if outcome.task_id in self._outstanding:
            self._outstanding.discard(outcome.task_id)
            self._retried.discard(outcome.task_id)
            outcomes.append(outcome)

    def _on_message(self, worker: _Worker, message: Any, outcomes: list) -> None:
        if isinstance(message, tuple) and message[:1] == (FAILED,):
            worker.startup_error = message[1]  # the process exits next; the supervisor replaces it
            return
        if message == READY:
            worker.ready = True
            self._startup_failures = 0
            return
        if isinstance(message, tuple) and message[:1] == (STARTED,):
            worker.running = message[1]  # its time runs from the send already (head_since)
            worker.running_since = time.monotonic()
            worker.queued_ns_then = _queued_ns(worker.process.pid)
            return
        task_id, status, value, error, read = message
        if read is not None:  # the task's reads from remote stores, counted as this process's
            add_transfer_counts(TransferCounts(*read))
        head_id, item, _ = worker.queue.popleft()
        if head_id != task_id:  # cannot happen: workers run their queue in order
            raise RuntimeError(f"worker pid {worker.process.pid} answered task {task_id}, expected {head_id}")
        worker.running = None
        worker.head_since = time.monotonic()  # the next task's time starts now, not while this one ran
        self._report(outcomes, TaskOutcome(item, status, value, error, task_id))

    def _on_death(self, worker: _Worker, outcomes: list) -> None:
        """A worker died: its running task crashed (or gets one more try), the rest go back; replace it.

        Only the task it said it had started is blamed: one merely sent to it
        goes back untouched, and the death counts as an idle one.
        """
        worker.process.join(1.0)  # so that exitcode says how it died
        how = _exit_description(worker.process.exitcode)
        signalled = (worker.process.exitcode or 0) < 0
        if worker.ready and worker.queue and worker.running == worker.queue[0][0]:
            task = worker.queue.popleft()
            if self._retry_crashed and signalled and task[0] not in self._retried and task[0] in self._outstanding:
                self._retried.add(task[0])
                logger.warning("a worker died (%s) while running a task; trying it once more on a fresh worker",
                               how.removeprefix("worker died with "))
                self._unsent.appendleft(task)
            else:
                self._report(outcomes, TaskOutcome(task[1], "crash", error=how, task_id=task[0]))
            self._replace(worker)
        elif worker.ready or signalled:  # a signal while it started is no failure to start
            self._replace(worker, idle=how)
        else:
            self._replace(worker)

    def _replace(self, worker: _Worker, *, why: str = "", idle: str = "") -> None:
        """Kill ``worker``, give its unsent tasks back, start a new one (after a pause if it died idle).

        Raises:
            RuntimeError: the :data:`MAX_STARTUP_FAILURES`-th worker in a row
                that never became ready, or idle workers dying too often.
        """
        if worker.process.is_alive():
            worker.process.kill()
        _join_killed(worker.process)
        _close_worker(worker)
        slot = self._workers.index(worker)
        self._unsent.extendleft(reversed(worker.queue))
        worker.queue.clear()
        if not worker.ready and not idle:
            self._startup_failures += 1
            why = worker.startup_error or why or (
                f"{_exit_description(worker.process.exitcode)} before it could report an error; see stderr")
            logger.warning("worker pid %s failed to start: %s", worker.process.pid, why)
            if self._startup_failures >= MAX_STARTUP_FAILURES:
                raise RuntimeError(f"worker processes fail to start ({self._startup_failures} in a row); "
                                   f"giving up. The last one: {why}")
        if idle:
            now = time.monotonic()
            self._idle_deaths.append(now)
            while self._idle_deaths and now - self._idle_deaths[0] > IDLE_DEATH_WINDOW_S:
                self._idle_deaths.popleft()
            recent = len(self._idle_deaths)
            if recent > MAX_IDLE_DEATHS:
                raise RuntimeError(f"{recent} idle worker processes died within {IDLE_DEATH_WINDOW_S:g} s (the "
                                   f"last: {idle}); something keeps killing them (memory?); giving up")
            pause = min(IDLE_RESTART_PAUSE_S[1], IDLE_RESTART_PAUSE_S[0] * 2 ** (recent - 1))
            logger.warning("an idle worker process died (%s); starting another in %.1f s", idle, pause)
            self._workers[slot] = None
            self._restart_at[slot] = now + pause
            return
        self._workers[slot] = self._spawn()


#: Pools not yet garbage-collected, closed at the interpreter's exit (see the module docstring).
_OPEN_POOLS: "weakref.WeakSet[WorkerPool]" = weakref.WeakSet()


def _close_open_pools() -> None:
    for pool in list(_OPEN_POOLS):
        try:
            pool.close()
        except Exception as err:  # noqa: BLE001 - the next pool must still be closed; the process is exiting
            logger.debug("closing a worker pool at exit failed: %s", err)


# multiprocessing.util registered its exit hook when this module imported multiprocessing.connection;
# atexit runs the last registered first, so this one closes the pools before that one joins their workers.
atexit.register(_close_open_pools)


def _cannot_run(worker: _Worker) -> str:
    """Why ``worker`` could not run its task (``"stopped"``, ``"starved of CPU..."``), or ``""`` if it could.

    Only a stopped or starved worker is excused: one blocked (``S``/``D``:
    waiting on a read, a lock, a file that never ends) or busy on a CPU
    (``R``) for its whole time is what its task did to it.
    """
    pid = worker.process.pid
    if _stopped(pid):
        return "stopped (SIGSTOP, a debugger or a frozen cgroup?)"
    queued = _queued_ns(pid)
    ran_s = time.monotonic() - worker.running_since
    if queued is None or worker.queued_ns_then is None or ran_s <= 0:
        return ""
    waited_s = (queued - worker.queued_ns_then) / 1e9
    if waited_s > STARVED_SHARE * ran_s:
        return f"starved of CPU ({waited_s:.1f} s of {ran_s:.1f} s waiting for one)"
    return ""
