"""The DALI half of a GPU deep scan: one supervised worker, so one DALI pipeline, per GPU.

A ``--deep`` scan on the CPU runs the whole check (:mod:`.deep`) in each probe
worker. On a GPU that would open one DALI pipeline, with its CUDA context, its
NVDEC sessions and its device memory, per probe worker: sixteen scan workers
would hold sixteen contexts on one GPU for checks that take a few milliseconds
each. So a GPU deep scan splits the check:

- the probe workers probe, run the seek check and route the file; a file the
  rules send to DALI comes back as a :class:`DaliCheck` instead of its rows
  (:func:`daliload.prescreen.probe_pool.run_probe_task`);
- :class:`GpuStage` runs those checks in one :class:`~daliload.runtime.WorkerPool`
  worker for the scan's GPU, on a thread of the scanner, while the probe
  workers go on with the next files. The worker builds its pipeline once and
  keeps it (:func:`daliload.prescreen.deep.dali_check`);
- a DALI check that crashes or hangs its worker costs that worker only: the
  file is checked once more without DALI (the fallback's decode, in a fresh
  worker), as a crashed probe worker's deep check is.

One worker per GPU also serialises the checks on that GPU, which is what a
single pipeline does anyway; a check decodes two 8-frame windows.
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import replace
from typing import Any, Callable, Iterator, NamedTuple

from daliload.prescreen.deep import deep_check
from daliload.prescreen.gpus import parse_route_target
from daliload.prescreen.probe import ProbeResult
from daliload.prescreen.rows import ProbeRows
from daliload.runtime import TaskOutcome, WorkerPool

logger = logging.getLogger(__name__)

#: Seconds :meth:`GpuStage.close` waits for the thread after an early stop (Ctrl-C, an error).
_STOP_WAIT_S = 1.0
_DONE = object()


class DaliCheck(NamedTuple):
    """A probed file whose rules route is DALI on a GPU, waiting for its DALI check.

    Attributes:
        task: the probe task (a :class:`daliload.prescreen.probe_pool.ProbeTask`;
            its ``deep_device``, ``device_id`` and ``allow_dali`` apply).
        facts: the probe's facts, after the seek check.
        reason: the rules' reason for the ``dali`` route.
    """

    task: Any
    facts: ProbeResult
    reason: str


def run_dali_check(check: DaliCheck) -> tuple:
    """Worker entry point: the deep check of one DALI-routed file on the GPU.

    Returns:
        :meth:`ProbeRows.as_tuple` of the file, with the deep route row.
    """
    task = check.task
    device = parse_route_target(task.deep_device)[0]
    result = deep_check(check.facts, "dali", check.reason, device, allow_dali=task.allow_dali,
                        device_id=task.device_id)  # fmt: skip
    facts = check.facts if result.num_frames is None else replace(check.facts, num_frames=result.num_frames)
    return ProbeRows.of(facts, ((task.deep_device, result.route, result.reason, int(result.checked)),)
                        ).as_tuple()  # fmt: skip


class GpuStage:
    """Runs :class:`DaliCheck` items in one worker process, fed while the probe goes on.

    Args:
        timeout_s: per-file limit, as for the probe workers.
        check: what the worker runs (default :func:`run_dali_check`; a
            module-level function of one :class:`DaliCheck` returning a rows
            tuple, for tests).

    Use::

        stage = GpuStage(timeout_s=120)
        try:
            for ...:                        # the probe pool's outcomes
                stage.submit(check)
                yield from stage.ready()    # outcomes known so far, never blocks
            yield from stage.finish()       # waits for the rest
        finally:
            stage.close()

    Every submitted check gives one :class:`~daliload.runtime.TaskOutcome`
    whose ``item`` is the :class:`DaliCheck` (after a retry, the retried one,
    with ``task.allow_dali`` false). An error inside the stage itself (the
    worker cannot start) is raised from :meth:`ready` or :meth:`finish`.
    """

    def __init__(self, *, timeout_s: float | None, check: Callable[[DaliCheck], tuple] = run_dali_check) -> None:
        self._inbox: queue.Queue = queue.Queue()
        self._outbox: queue.Queue = queue.Queue()
        self._timeout_s = timeout_s
        self._check = check
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._finished = False

    def submit(self, check: DaliCheck) -> None:
        """Queue one file's DALI check (starts the worker on the first one)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="daliload-gpu-deep-check", daemon=True)
            self._thread.start()
        self._inbox.put(check)

    def ready(self) -> Iterator[TaskOutcome]:
        """The outcomes that have arrived, without waiting."""
        while True:
            try:
                item = self._outbox.get_nowait()
            except queue.Empty:
                return
            yield from self._deliver(item)

    def finish(self) -> Iterator[TaskOutcome]:
        """No more checks: wait for the outstanding ones and yield their outcomes."""
        if self._thread is None:
            return
        self._inbox.put(None)
        while not self._finished:
            yield from self._deliver(self._outbox.get())

    def close(self) -> None:
        """Stop the thread and its worker (also after an early stop)."""
        if self._thread is None:
            return
        self._stop.set()
        self._inbox.put(None)
        self._thread.join(_STOP_WAIT_S)
        if self._thread.is_alive():
            logger.info("the GPU deep-check worker is still finishing a file; it stops when that file ends")

    def _deliver(self, item: Any) -> Iterator[TaskOutcome]:
        if item is _DONE:
            self._finished = True
        elif isinstance(item, BaseException):
            raise RuntimeError(f"the GPU deep check stopped: {item}") from item
        else:
            yield item

    def _inputs(self) -> Iterator[DaliCheck]:
        while not self._stop.is_set():
            check = self._inbox.get()
            if check is None:
                return
            yield check

    def _run(self) -> None:
        retry: list[DaliCheck] = []
        try:
            # tasks_per_worker=1: the pool only waits on the inbox while nothing is in flight,
            # so a check that hangs is always seen by the pool's timeout.
            with WorkerPool(self._check, workers=1, timeout_s=self._timeout_s, tasks_per_worker=1) as pool:
                for outcome in pool.imap_unordered(self._inputs()):
                    check: DaliCheck = outcome.item
                    if outcome.status in ("timeout", "crash") and check.task.allow_dali:
                        logger.info("%s during the DALI deep check of %s; retrying without DALI",
                                    outcome.status, check.facts.path)  # fmt: skip
                        retry.append(check._replace(task=check.task._replace(allow_dali=False)))
                    else:
                        self._outbox.put(outcome)
                if retry and not self._stop.is_set():
                    for outcome in pool.imap_unordered(retry):
                        self._outbox.put(outcome)
        except BaseException as err:  # noqa: B036 - handed to the scanner's thread, which raises it
            self._outbox.put(err)
        finally:
            self._outbox.put(_DONE)
