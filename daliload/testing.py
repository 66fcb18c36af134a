"""Test support: make chosen files' decodes crash, exit or hang inside the fallback's worker processes.

A test double for the fallback's worker task, not a switch in the decode
path: :func:`inject_faults` gives a loader's (or a source's) workers
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
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import time
from typing import Any, Sequence

from fallback.decode import DecodeError
from fallback.source import FallbackSource, decode_rows

ACTIONS = ("kill", "segv", "exit", "hang", "fail")


def inject_faults(target: Any, faults: dict[str, str]) -> None:
    """Make the decodes of ``faults``' paths misbehave in ``target``'s fallback workers.

    Args:
        target: a :class:`~daliload.KineticsDALILoader` or a :class:`~fallback.source.FallbackSource`.
        faults: ``path -> action`` (see the module docstring).

    Raises:
        ValueError: an unknown action.
    """
    bad = {path: action for path, action in faults.items() if action not in ACTIONS}
    if bad:
        raise ValueError(f"unknown fault action(s) {bad}; actions are {ACTIONS}")
    source = target if isinstance(target, FallbackSource) else target.sources.fallback
    source.use_task_fn(functools.partial(faulty_rows, faults=dict(faults)))


def faulty_rows(task: tuple, fds: Sequence[int] = (), *, faults: dict[str, str], **kwargs: Any) -> list:
    """:func:`fallback.source.decode_rows`, misbehaving first when the task's file is one of ``faults``."""
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
    raise DecodeError(path, f"test fault {action!r}")
