"""Where the cuts of DALI's batches are made: worker processes, ahead of DALI.

The DALI source hands DALI, per sample, the packets its window needs instead
of the whole file (``daliload.stream.cut``). A cut is about 3-10 ms of PyAV work per
clip, most of it holding the GIL: made in the training process it would slow
the training loop, so :class:`WindowCutter` makes them in supervised worker
processes (:class:`~daliload.runtime.WorkerPool`) while earlier batches
decode, and the DALI source feeds a batch to DALI once its cuts are in::

    DaliSource.submit(batch i)   -> WindowCutter.submit: one task per sample (path, frames, the file's hint)
    DaliSource.collect(batch j)  -> batches up to j whose cuts are in are fed to DALI, in order
                                    (a cut that failed, crashed or timed out: that sample's whole file)

With ``workers=0`` the cuts are made in the calling thread, at submit (a
debugging mode, like the fallback's).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from daliload.runtime import WorkerPool

logger = logging.getLogger(__name__)

#: ``(path, frames) -> the item of a cut task``, or ``None`` when a cut gains nothing (the loader adds the
#: file's seek hint, and knows from it when the window's entry is the file's first frame).
ItemOf = Callable[[str, Sequence[int]], Any]


@dataclass
class _Group:
    size: int
    tasks: dict[int, int] = field(default_factory=dict)  # task id -> row
    cuts: dict[int, Any] = field(default_factory=dict)  # row -> the task's value (None: the whole file)


class WindowCutter:
    """Cut tasks for groups of samples, made ahead in worker processes (see the module docstring).

    Args:
        task_fn: the cut, a module-level function of one item (``daliload.stream.cut.cut_task``).
        item_of: ``(path, frames) -> item`` for ``task_fn``.
        workers: processes; 0 cuts in the calling thread.
        timeout_s: a cut past this time is given up (its worker killed) and
            that sample's whole file is used.
    """

    def __init__(self, task_fn: Callable[..., Any], *, item_of: ItemOf, workers: int, timeout_s: float) -> None:
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 0:
            raise ValueError(f"workers must be an integer >= 0, got {workers!r}")
        self._fn = task_fn
        self._item_of = item_of
        # Three tasks per worker: while one runs, the one behind it is there for the worker's look-ahead
        # (a remote window read ahead, daliload.runtime.WithPrefetch) and a third keeps the pipe from running dry.
        self._pool = WorkerPool(task_fn, workers=workers, timeout_s=timeout_s, tasks_per_worker=3) if workers else None
        self._groups: dict[int, _Group] = {}
        self._task_group: dict[int, int] = {}
        self._next = 0
        self.failed = 0  # cuts that failed, crashed or timed out (the whole file was used)

    def submit(self, rows: Sequence[tuple[str, Sequence[int]]]) -> int:
        """Start the cuts of one group, ``(path, frames)`` per row; returns its handle."""
        handle, self._next = self._next, self._next + 1
        group = _Group(len(rows))
        self._groups[handle] = group
        for row, (path, frames) in enumerate(rows):
            item = self._item_of(path, frames)
            if item is None:
                group.cuts[row] = None
            elif self._pool is None:
                group.cuts[row] = self._fn(item)
            else:
                task = self._pool.submit(item)
                group.tasks[task] = row
                self._task_group[task] = handle
        return handle

    def ready(self, handle: int) -> bool:
        """Whether every cut of the group is in (never waits)."""
        self._gather(timeout=0)
        group = self._groups[handle]
        return not group.tasks

    def take(self, handle: int) -> list[Any]:
        """The group's cuts by row (``None``: use the whole file), waiting for those still being made."""
        group = self._groups[handle]
        while group.tasks:
            self._gather(timeout=None)
        del self._groups[handle]
        return [group.cuts.get(row) for row in range(group.size)]

    def cancel(self, handles: Sequence[int]) -> None:
        """Drop these groups without waiting for their cuts."""
        for handle in handles:
            group = self._groups.pop(handle, None)
            if group is None:
                continue
            if self._pool is not None:
                self._pool.cancel(group.tasks)
            for task in group.tasks:
                self._task_group.pop(task, None)

    def close(self) -> None:
        self.cancel(list(self._groups))
        if self._pool is not None:
            self._pool.close()

    def _give_up(self) -> None:
        """Every cut still being made becomes the whole file, and no more are made."""
        for group in self._groups.values():
            group.tasks.clear()
        self._task_group.clear()
        self._pool.close()
        self._pool = None
        self._fn = lambda item: None

    def _gather(self, timeout: float | None) -> None:
        if self._pool is None or not self._task_group:
            return
        try:
            outcomes = self._pool.wait(timeout=timeout)
        except RuntimeError as err:  # workers that cannot start: DALI decodes whole files for the rest of the run
            logger.warning("the processes that cut DALI's windows cannot run (%s); DALI decodes whole files", err)
            self._give_up()
            return
        for outcome in outcomes:
            handle = self._task_group.pop(outcome.task_id, None)
            group = self._groups.get(handle) if handle is not None else None
            if group is None:
                continue  # a cancelled group's
            row = group.tasks.pop(outcome.task_id)
            if outcome.ok:
                group.cuts[row] = outcome.value
            else:
                self.failed += 1
                logger.debug("cut of %s %s (%s): the whole file goes to DALI", outcome.item[0], outcome.status,
                             outcome.error)
