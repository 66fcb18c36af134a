"""Test support: make chosen files' decodes and probes crash, exit or hang inside the worker processes.

Test doubles for the workers' task, not switches in the decode or probe path.

:func:`inject_faults` gives a loader's (or a source's) fallback workers
:func:`faulty_rows` to run instead of :func:`fallback.source.decode_rows`;
it misbehaves for the named files and decodes every other one as usual::

    loader = KineticsDALILoader(root, "train", ...)
    inject_faults(loader, {"/data/a.mp4": "segv", "/data/b.mp4": "hang"})
    for videos, labels in loader:   # a.mp4 kills its worker, b.mp4 hangs until the time limit
        ...

Actions: ``"kill"`` (SIGKILL), ``"segv"`` (a real segmentation fault),
``"exit"`` (``os._exit(3)``), ``"hang"`` (sleeps for an hour), ``"fail"``
(fails like a file that does not decode). Paths need not exist: a plan may
name ``"fault:kill"`` to hit a worker at a chosen slot.

:func:`probe_faults` does the same for the scan's probe workers, for the
files whose name matches a glob, while its block runs::

    with probe_faults({"stuck*": "hang", "boom*": "crash"}):
        scan(root, device="cpu", timeout_s=2.0)   # stuck*: bad "timeout", boom*: bad "crash"

Probe actions (:data:`PROBE_ACTIONS`): ``"hang"`` (sleeps forever),
``"crash"`` (SIGKILL), ``"raise"`` (``RuntimeError``), ``"slow"`` (sleeps
:data:`SLOW_PROBE_S` first, so that a test can stop a scan mid-way). They
apply in worker processes only: a scan with ``workers=0`` probes in the
calling process, as it always does.

Nothing here is imported by the package; the fallback and the pre-screen are
imported when a double is installed or run.
"""

from __future__ import annotations

import contextlib
import ctypes
import fnmatch
import functools
import os
import signal
import time
from typing import Any, Iterator, Sequence

ACTIONS = ("kill", "segv", "exit", "hang", "fail")
#: What :func:`probe_faults` can make a probe do.
PROBE_ACTIONS = ("hang", "crash", "raise", "slow")
#: Seconds a ``"slow"`` probe sleeps before probing.
SLOW_PROBE_S = 0.2


def inject_faults(target: Any, faults: dict[str, str]) -> None:
    """Make the decodes of ``faults``' paths misbehave in ``target``'s fallback workers.

    Args:
        target: a :class:`~daliload.KineticsDALILoader` (its ``sources.fallback``)
            or a :class:`~fallback.source.FallbackSource`.
        faults: ``path -> action`` (see the module docstring).

    Raises:
        ValueError: an unknown action.
    """
    from fallback.source import FallbackSource

    bad = {path: action for path, action in faults.items() if action not in ACTIONS}
    if bad:
        raise ValueError(f"unknown fault action(s) {bad}; actions are {ACTIONS}")
    source = target if isinstance(target, FallbackSource) else target.sources.fallback
    source.use_task_fn(functools.partial(faulty_rows, faults=dict(faults)))


def faulty_rows(task: tuple, fds: Sequence[int] = (), *, faults: dict[str, str], **kwargs: Any) -> list:
    """:func:`fallback.source.decode_rows`, misbehaving first when the task's file is one of ``faults``."""
    from fallback.source import decode_rows

    path = task[1][0].path
    if path in faults:
        misbehave(faults[path], path)
    return decode_rows(task, fds, **kwargs)


def misbehave(action: str, path: str) -> None:
    """Do what ``action`` says, in this process, while "decoding" ``path``."""
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "segv":
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core dump to wait for
        ctypes.string_at(0)  # reads address 0: a genuine SIGSEGV
    elif action == "exit":
        os._exit(3)
    elif action == "hang":
        time.sleep(3600)
    from fallback.decode import DecodeError

    raise DecodeError(path, f"test fault {action!r}")


@contextlib.contextmanager
def probe_faults(faults: dict[str, str]) -> Iterator[None]:
    """While the block runs, the scan's probe workers misbehave on the files whose name matches a glob.

    Args:
        faults: ``glob -> action`` (:data:`PROBE_ACTIONS`), the glob matched
            against each file's name, in order (a ``"slow"`` file goes on to
            the next rule).

    Raises:
        ValueError: an unknown action.
    """
    bad = {pattern: action for pattern, action in faults.items() if action not in PROBE_ACTIONS}
    if bad:
        raise ValueError(f"unknown probe fault action(s) {bad}; actions are {PROBE_ACTIONS}")
    from daliload.prescreen import probe_pool

    real = probe_pool.worker_task
    probe_pool.worker_task = functools.partial(
        probe_pool.run_probe_work, probe=functools.partial(faulty_probe, faults=dict(faults)))
    try:
        yield
    finally:
        probe_pool.worker_task = real


def faulty_probe(task: Any, *, faults: dict[str, str]) -> Any:
    """:func:`daliload.prescreen.probe_pool.run_probe_task`, misbehaving first when the file's name matches."""
    from daliload.prescreen.probe_pool import run_probe_task

    name = os.path.basename(task.path)
    for pattern, action in faults.items():
        if fnmatch.fnmatch(name, pattern):
            if action == "hang":
                while True:
                    time.sleep(3600)
            if action == "crash":
                os.kill(os.getpid(), signal.SIGKILL)
            if action == "slow":
                time.sleep(SLOW_PROBE_S)
            if action == "raise":
                raise RuntimeError(f"test fault on {name}")
    return run_probe_task(task)
