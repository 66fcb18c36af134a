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

:func:`slow_decoder` makes one of a loader's two decoders deliver at a set
pace: at most one clip every ``seconds_per_clip``, one after another, on top
of its own work, so that a test of routing by measured speed knows which
decoder is the faster (and can swap them mid-run)::

    dali = slow_decoder(loader, "dali", 0.05)      # DALI now delivers at most 20 clips/s
    ...
    dali.seconds_per_clip = 0.0                    # and now as fast as it decodes
    slow_decoder(loader, "fallback", 0.05)

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


class SlowSource:
    """A loader's clip source, delivering each group no sooner than ``seconds_per_clip`` per clip after the
    groups before it (a serial queue beside the source's own work); everything else as the source does.

    Attributes:
        seconds_per_clip: the pace; change it at any time (groups already submitted keep theirs).
    """

    def __init__(self, source: Any, seconds_per_clip: float) -> None:
        self.source, self.seconds_per_clip = source, seconds_per_clip
        self._ready: dict[int, float] = {}  # ticket -> when the group may be delivered
        self._busy_until = 0.0

    def submit(self, samples: Sequence[Any], *, urgent: bool = False) -> int:
        ticket = self.source.submit(samples, urgent=urgent)
        self._busy_until = max(time.monotonic(), self._busy_until) + self.seconds_per_clip * len(samples)
        self._ready[ticket] = self._busy_until
        return ticket

    def collect(self, ticket: int) -> Any:
        decoded = self.source.collect(ticket)
        time.sleep(max(0.0, self._ready.pop(ticket, 0.0) - time.monotonic()))
        return decoded

    def cancel(self) -> None:
        self._ready.clear()
        self._busy_until = 0.0
        self.source.cancel()

    def __getattr__(self, name: str) -> Any:  # load(), close(), worker_pids, isolation_s, ...
        return getattr(self.source, name)


def slow_decoder(loader: Any, decoder: str, seconds_per_clip: float) -> SlowSource:
    """Make ``loader``'s ``decoder`` (``"dali"`` or ``"fallback"``) deliver at most one clip per
    ``seconds_per_clip`` (see :class:`SlowSource`); called again for the same decoder, it sets the new pace.

    Raises:
        ValueError: an unknown decoder, or a negative pace.
    """
    if decoder not in ("dali", "fallback"):
        raise ValueError(f"decoder must be 'dali' or 'fallback', got {decoder!r}")
    if not seconds_per_clip >= 0:
        raise ValueError(f"seconds_per_clip must be >= 0, got {seconds_per_clip!r}")
    sources = loader.sources
    if decoder == "fallback":
        if not isinstance(sources.fallback, SlowSource):
            sources.fallback = SlowSource(sources.fallback, seconds_per_clip)
        sources.fallback.seconds_per_clip = seconds_per_clip
        return sources.fallback
    current = sources.__dict__.get("dali")
    slow = getattr(current, "slow", None)
    if slow is None:
        build = sources.dali
        slow = SlowSource(None, seconds_per_clip)

        def dali() -> SlowSource:
            slow.source = build()  # the one DALI source, built on first use
            return slow
        dali.slow = slow  # type: ignore[attr-defined]
        sources.dali = dali
    slow.seconds_per_clip = seconds_per_clip
    return slow


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
