"""The supervised worker pool: a hanging or crashing task costs that task only."""

from __future__ import annotations

import os
import signal
import time

import pytest

from daliload.workerpool import TaskOutcome, WorkerPool


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
    raise AssertionError(kind)


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
