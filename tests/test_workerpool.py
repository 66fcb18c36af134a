"""The supervised worker pool: a hanging or crashing task costs that task only."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from daliload.runtime import _workerpool as workerpool
from daliload.runtime import TaskOutcome, WorkerPool


def task(item):
    """Module-level so workers can unpickle it: ``(kind, value)`` -> behaviour."""
    kind, value = item
    if kind == "double":
        return value * 2
    if kind == "pid":
        return os.getpid()
    if kind == "hang":
        time.sleep(3600)
    if kind == "crash":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "raise":
        raise ValueError(f"cannot handle {value}")
    if kind == "sleep":
        time.sleep(value)
        return os.getpid()
    if kind == "crash_once":  # dies the first time this marker file is met, then works
        if not os.path.exists(value):
            open(value, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return os.getpid()
    if kind == "exit":
        os._exit(3)
    raise AssertionError(kind)


def write_to(item, fds):
    """A task with a file descriptor: writes ``item`` into it (module-level, for the workers)."""
    return os.write(fds[0], item.encode())


def drain(pool: WorkerPool) -> list[TaskOutcome]:
    outcomes = []
    while pool.pending:
        outcomes += pool.wait()
    return outcomes


def _by_item(outcomes: list[TaskOutcome]) -> dict:
    return {o.item: o for o in outcomes}


def test_each_failure_costs_only_its_task():
    items = (
        [("double", i) for i in range(12)]
        + [("hang", 0), ("crash", 0), ("raise", 7)]
        + [("double", i) for i in range(100, 106)]
    )
    with WorkerPool(task, workers=2, timeout_s=1.0) as pool:
        outcomes = _by_item(list(pool.imap_unordered(items)))
    assert len(outcomes) == len(items)
    assert outcomes[("hang", 0)].status == "timeout"
    assert outcomes[("hang", 0)].error == "no result after 1 s"
    assert outcomes[("crash", 0)].status == "crash"
    assert outcomes[("crash", 0)].error == "worker died with signal SIGKILL"
    assert outcomes[("raise", 7)].status == "error"
    assert outcomes[("raise", 7)].error == "ValueError: cannot handle 7"
    doubled = {item[1]: o.value for item, o in outcomes.items() if item[0] == "double"}
    assert all(outcomes[("double", i)].ok for i in doubled)
    assert doubled == {i: 2 * i for i in list(range(12)) + list(range(100, 106))}


def test_crashed_worker_is_replaced():
    items = [("pid", 0), ("crash", 1)] + [("pid", i) for i in range(1, 9)]
    with WorkerPool(task, workers=1, timeout_s=10.0) as pool:
        outcomes = list(pool.imap_unordered(items))
    statuses = [o.status for o in outcomes]
    assert statuses.count("crash") == 1 and statuses.count("ok") == 9
    pids_before = {outcomes[0].value}
    pids_after = {o.value for o in outcomes[2:]}
    assert len(pids_after) == 1 and pids_after.isdisjoint(pids_before)


def test_in_flight_items_are_bounded():
    pulled = 0

    def source():
        nonlocal pulled
        for i in range(40):
            pulled += 1
            yield ("double", i)

    workers, depth = 2, 2
    seen = 0
    with WorkerPool(task, workers=workers, timeout_s=10.0, tasks_per_worker=depth) as pool:
        for outcome in pool.imap_unordered(source()):
            seen += 1
            assert outcome.ok
            assert pulled - seen < workers * depth
    assert seen == pulled == 40


def test_breaking_out_stops_the_workers():
    pool = WorkerPool(task, workers=2, timeout_s=10.0)
    outcomes = pool.imap_unordered([("pid", i) for i in range(50)])
    pid = next(outcomes).value
    outcomes.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"worker {pid} still alive after the generator was closed")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"workers": 0}, r"workers must be an int >= 1, got 0"),
        ({"workers": 1, "timeout_s": 0}, r"timeout_s must be > 0 or None, got 0"),
        ({"workers": 1, "start_method": "fork"}, r"never 'fork'\), got 'fork'"),
        ({"workers": 1, "tasks_per_worker": 0}, r"tasks_per_worker must be >= 1, got 0"),
    ],
)
def test_bad_arguments_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        WorkerPool(task, **kwargs)


BROKEN_MODULE = '''\
import multiprocessing as mp
import os
import time

if mp.parent_process() is not None:  # only in the pool's workers
    {action}


def work(item):
    return item
'''


@pytest.mark.parametrize(
    ("name", "action", "reason"),
    [
        ("raises_in_workers", 'raise RuntimeError("no GPU here\\nsecond line")',
         r"The last one: RuntimeError: no GPU here$"),
        ("exits_in_workers", "os._exit(7)",
         r"The last one: worker exited with code 7 before it could report an error"),
        # The case: workers stuck at start (an unguarded script waiting on a lock).
        ("hangs_in_workers", "time.sleep(3600)", r"The last one: not ready after 2 s$"),
    ],
)
def test_workers_that_keep_failing_to_start_give_up_with_the_reason(tmp_path, monkeypatch, name, action, reason):
    """Each new worker fails to import the task's module: the pool stops after a few tries, says why."""
    if name == "hangs_in_workers":
        monkeypatch.setattr(workerpool, "STARTUP_TIMEOUT_S", 2.0)
    (tmp_path / f"{name}.py").write_text(BROKEN_MODULE.format(action=action))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = __import__(name)
    started = time.monotonic()
    with WorkerPool(module.work, workers=2, timeout_s=10.0) as pool:
        with pytest.raises(RuntimeError, match=r"worker processes fail to start \(3 in a row\); giving up") as info:
            list(pool.imap_unordered(range(5)))
    assert time.monotonic() - started < 100  # a hang bound, under the default 120 s start-up limit
    assert re.search(reason, str(info.value)), str(info.value)


def test_workers_do_not_rerun_the_main_script(tmp_path):
    """An unguarded script whose top level starts a pool: the workers never run that top level."""
    script = tmp_path / "unguarded_pool.py"
    script.write_text(
        "import os\n"
        "from daliload.runtime._workerpool import WorkerPool\n"
        "print('top level ran in', os.getpid(), flush=True)\n"
        "with WorkerPool(abs, workers=2, timeout_s=20) as pool:\n"
        "    print(sorted(o.value for o in pool.imap_unordered([-1, -2, -3])), flush=True)\n"
    )
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("top level ran in") == 1, proc.stdout
    assert "[1, 2, 3]" in proc.stdout


def test_tasks_carry_file_descriptors_to_the_worker():
    """How the fallback's workers get the shared buffer they write clips into."""
    read_end, write_end = os.pipe()
    try:
        with WorkerPool(write_to, workers=1, timeout_s=30.0) as pool:
            pool.submit("hello", fds=(write_end,))
            [outcome] = drain(pool)
        assert outcome.ok and outcome.value == 5
        assert os.read(read_end, 5) == b"hello"
    finally:
        os.close(read_end)
        os.close(write_end)


def test_a_task_whose_worker_a_signal_killed_gets_one_more_try(tmp_path):
    """An OOM kill or an outside kill is not the task's fault: one more try on a fresh worker."""
    with WorkerPool(task, workers=1, timeout_s=30.0, retry_crashed=True) as pool:
        pool.submit(("crash_once", str(tmp_path / "a")))
        pool.submit(("crash", 0))  # a task that kills every worker is reported after its second try
        pool.submit(("exit", 0))  # an exit code is the task's own doing: reported at once
        outcomes = {o.item[0]: o for o in drain(pool)}
    assert outcomes["crash_once"].ok
    assert outcomes["crash"].status == "crash" and outcomes["crash"].error == "worker died with signal SIGKILL"
    assert outcomes["exit"].status == "crash" and outcomes["exit"].error == "worker exited with code 3"
    with WorkerPool(task, workers=1, timeout_s=30.0) as pool:  # without retry_crashed: reported at once
        pool.submit(("crash_once", str(tmp_path / "b")))
        [outcome] = drain(pool)
    assert outcome.status == "crash"


def test_cancelled_tasks_are_dropped_and_urgent_ones_go_first():
    with WorkerPool(task, workers=1, timeout_s=30.0, tasks_per_worker=1) as pool:
        busy = pool.submit(("sleep", 0.5))
        later = [pool.submit(("double", i)) for i in range(4)]
        urgent = pool.submit(("double", 100), urgent=True)
        pool.cancel([busy, later[0]])  # never waits: the running one's result is ignored when it comes
        assert pool.pending == 4
        outcomes = drain(pool)
    assert [o.task_id for o in outcomes] == [urgent, *later[1:]]
    assert [o.value for o in outcomes] == [200, 2, 4, 6]


def test_idle_workers_killed_from_outside_are_replaced_with_a_warning(caplog, monkeypatch):
    monkeypatch.setattr(workerpool, "IDLE_RESTART_PAUSE_S", (0.05, 0.2))
    with WorkerPool(task, workers=2, timeout_s=30.0) as pool:
        pool.submit(("pid", 0))
        drain(pool)
        victim = pool.pids[0]
        os.kill(victim, signal.SIGKILL)
        time.sleep(0.5)
        with caplog.at_level("WARNING", logger="daliload.runtime._workerpool"):
            ids = [pool.submit(("sleep", 0.2)) for _ in range(6)]
            outcomes = drain(pool)
            deadline = time.monotonic() + 10
            while len(pool.pids) < 2 and time.monotonic() < deadline:  # the replacement starts after a pause
                pool.submit(("pid", 0))
                drain(pool)
        assert sorted(o.task_id for o in outcomes) == ids and all(o.ok for o in outcomes)
        assert victim not in pool.pids and len(pool.pids) == 2
    assert "an idle worker process died (worker died with signal SIGKILL)" in caplog.text


def test_idle_workers_that_keep_dying_end_the_pool_with_the_reason(monkeypatch):
    monkeypatch.setattr(workerpool, "IDLE_RESTART_PAUSE_S", (0.01, 0.01))
    monkeypatch.setattr(workerpool, "MAX_IDLE_DEATHS", 2)
    with WorkerPool(task, workers=1, timeout_s=30.0) as pool:
        with pytest.raises(RuntimeError, match=r"3 idle worker processes died within 60 s \(the last: worker "
                                               r"died with signal SIGKILL\); something keeps killing them"):
            for _ in range(10):
                pool.submit(("pid", 0))
                pid = drain(pool)[0].value
                os.kill(pid, signal.SIGKILL)
                time.sleep(0.2)


def seen_ahead(item):
    """Whether ``item``'s marker file was made (by :func:`mark_ahead`) before this task started; then sleeps."""
    path, pause, fd_task = item
    found = os.path.exists(path)
    time.sleep(pause)
    return found


def mark_ahead(item):
    """The look-ahead of :func:`seen_ahead`: makes the marker; an item named ``raise`` raises."""
    if "raise" in item[0]:
        raise RuntimeError("a failing look-ahead is ignored")
    open(item[0], "w").close()


def test_a_worker_starts_the_queued_tasks_look_ahead_while_it_runs_the_one_before(tmp_path):
    """How a fallback worker reads a remote window ahead: the task behind the running one gets its prefetch call
    first; every task still runs once, in order, with its own descriptors, and a look-ahead that raises is
    ignored."""
    from daliload.runtime import WithPrefetch

    items = [(str(tmp_path / f"{'raise' if i == 3 else 'ok'}{i}"), 0.3, i) for i in range(6)]
    # three per worker: when a task starts, the one behind it has been sent (with two, it is often on its way)
    with WorkerPool(WithPrefetch(seen_ahead, mark_ahead), workers=1, timeout_s=30.0, tasks_per_worker=3) as pool:
        for item in items:
            pool.submit(item)
        outcomes = _by_item(drain(pool))
    assert all(o.ok for o in outcomes.values()) and len(outcomes) == 6
    assert outcomes[items[0]].value is False  # the first task had nothing before it
    assert outcomes[items[3]].value is False  # its look-ahead raised: it ran anyway
    assert sum(outcomes[item].value for item in items[1:]) >= 3  # the others were marked while one ran


def test_a_task_taken_ahead_keeps_its_file_descriptors():
    read_end, write_end = os.pipe()
    try:
        from daliload.runtime import WithPrefetch

        with WorkerPool(WithPrefetch(write_to, len), workers=1, timeout_s=30.0, tasks_per_worker=3) as pool:
            for word in ("one", "two", "three"):
                pool.submit(word, fds=(write_end,))
            assert sorted(o.value for o in drain(pool)) == [3, 3, 5]
        assert sorted(os.read(read_end, 11).decode()) == sorted("onetwothree")
    finally:
        os.close(read_end)
        os.close(write_end)
