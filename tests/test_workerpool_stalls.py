"""A worker stopped or starved, before or while it runs its task: the task is not blamed, once.

The limit used to run only once the worker had said it started the task, so a
``SIGSTOP`` of the only worker (or a machine too busy to schedule it) stalled
the pool with no timeout, no kill and no message. A task its worker started and
was then stopped (or starved) in was reported as a timeout, its file blamed. These
stop real workers.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from helpers.procs import running

from daliload.runtime import TaskOutcome, WorkerPool

#: A hang bound, far past the 2 s limit these pools run under: before the fix they waited forever.
HANG_BOUND_S = 120.0


def task(item):
    """Module-level so workers can unpickle it: ``(kind, value)`` -> behaviour."""
    kind, value = item
    if kind == "double":
        return value * 2
    if kind == "pid":
        return os.getpid()
    if kind == "sleep":
        time.sleep(value)
        return os.getpid()
    if kind == "stop_once":  # stops its own worker mid-task the first time this marker file is met, then works
        if not os.path.exists(value):
            open(value, "w").close()
            os.kill(os.getpid(), signal.SIGSTOP)
        return os.getpid()
    if kind == "block":  # blocked on a read that never returns: no CPU used, and the task's own fault
        read_end, write_end = os.pipe()
        os.read(read_end, 1)
    if kind == "crash_once":  # kills its worker the first time this marker file is met, then works
        if not os.path.exists(value):
            open(value, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return os.getpid()
    raise AssertionError(kind)


def drain_within(pool: WorkerPool, bound_s: float = HANG_BOUND_S) -> list[TaskOutcome]:
    """Every pending outcome, or a test failure (not a hang) when they do not come within ``bound_s``."""
    outcomes: list[TaskOutcome] = []
    deadline = time.monotonic() + bound_s
    while pool.pending:
        if time.monotonic() > deadline:
            pytest.fail(f"{pool.pending} task(s) still pending after {bound_s:g} s: a stalled worker was not killed")
        outcomes += pool.wait(timeout=1.0)
    return outcomes


def test_a_worker_stopped_before_it_starts_its_task_is_killed_and_the_task_runs_on_a_fresh_one(caplog):
    with WorkerPool(task, workers=1, timeout_s=2.0, tasks_per_worker=2) as pool:
        pool.submit(("pid", 0))
        [first] = drain_within(pool)
        stopped = first.value
        os.kill(stopped, signal.SIGSTOP)
        try:
            with caplog.at_level("WARNING", logger="daliload.runtime._workerpool"):
                ids = [pool.submit(("double", i)) for i in range(3)]  # two sent to the stopped worker, one unsent
                outcomes = drain_within(pool)
        finally:
            if running(stopped):
                os.kill(stopped, signal.SIGCONT)
        assert sorted(o.task_id for o in outcomes) == ids  # nothing lost
        assert all(o.ok for o in outcomes) and sorted(o.value for o in outcomes) == [0, 2, 4]
        assert not running(stopped) and stopped not in pool.pids and len(pool.pids) == 1
    assert f"worker pid {stopped} did not start its task within 2 s" in caplog.text


def test_a_task_that_met_a_stopped_worker_on_its_one_more_try_is_reported_as_a_timeout(tmp_path):
    """The stall costs the worker, not the task, once: a task whose one more try (here after a crash)
    meets a stalled worker too is reported as a timeout, and the pool goes on with fresh workers."""
    with WorkerPool(task, workers=2, timeout_s=2.0, tasks_per_worker=1, retry_crashed=True) as pool:
        answered: set[int] = set()
        while len(answered) < 2:  # both workers ready (busy tasks, so that one cannot take both)
            for _ in range(2):
                pool.submit(("sleep", 0.3))
            answered |= {o.value for o in drain_within(pool)}
        stopped = pool.pids[1]
        os.kill(stopped, signal.SIGSTOP)  # idle: the crashed task's retry goes to it (its slot-mate just restarts)
        try:
            crashing = pool.submit(("crash_once", str(tmp_path / "marker")))
            [outcome] = drain_within(pool)
        finally:
            if running(stopped):
                os.kill(stopped, signal.SIGCONT)
        assert outcome.task_id == crashing and outcome.status == "timeout"
        assert outcome.error == "no result after 2 s (its worker never started it)"
        assert not running(stopped) and stopped not in pool.pids
        pool.submit(("double", 21))
        assert [o.value for o in drain_within(pool)] == [42]


def test_a_worker_stopped_while_running_its_task_is_killed_and_the_task_retried_on_a_fresh_one(tmp_path, caplog):
    """Issue 46, F8: the task had said it started, so its stall was charged to it (a ``"timeout"``)."""
    with WorkerPool(task, workers=1, timeout_s=2.0) as pool:
        with caplog.at_level("WARNING", logger="daliload.runtime._workerpool"):
            task_id = pool.submit(("stop_once", str(tmp_path / "marker")))
            [outcome] = drain_within(pool)
    assert outcome.task_id == task_id and outcome.ok, outcome
    assert "had no result for its task after 2 s but was stopped" in caplog.text
    assert not running(int(caplog.text.split("worker pid ")[1].split()[0]))


def test_a_task_blocked_in_its_worker_is_its_own_timeout(caplog):
    """Blocked is not stopped: a decoder waiting on a read that never comes uses no CPU either, and that
    is the task's (the file's) fault: a timeout at the first limit, with no second try."""
    with WorkerPool(task, workers=1, timeout_s=2.0) as pool:
        with caplog.at_level("WARNING", logger="daliload.runtime._workerpool"):
            pool.submit(("block", 0))
            [outcome] = drain_within(pool)
    assert outcome.status == "timeout" and outcome.error == "no result after 2 s"
    assert "fresh worker" not in caplog.text


def test_a_task_whose_worker_was_starved_of_cpu_gets_one_more_try(monkeypatch, caplog):
    """A worker that spent most of its task's time waiting for a CPU (here: its run-queue wait made to grow
    with the clock) is not the task's fault either: one more try, then the normal verdict."""
    from daliload.runtime import _workerpool

    monkeypatch.setattr(_workerpool, "_queued_ns", lambda pid: time.monotonic_ns())
    with WorkerPool(task, workers=1, timeout_s=1.0) as pool:
        with caplog.at_level("WARNING", logger="daliload.runtime._workerpool"):
            pool.submit(("sleep", 60))
            [outcome] = drain_within(pool)
    assert outcome.status == "timeout" and outcome.error == "no result after 1 s"
    assert caplog.text.count("but was starved of CPU") == 1
