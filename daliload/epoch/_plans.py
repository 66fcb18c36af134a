"""A rank's plans by epoch, drawn once each and kept only while a pass can use them."""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Callable

from daliload.plan import Sample


class EpochPlans:
    """This rank's plans by epoch: at most two, the one in use and the next one, drawn ahead in a daemon thread.

    A rank of 64 draws its share of a 650k-video epoch in about 0.1 s; one
    rank alone makes ~600k :class:`Sample` objects (a few seconds, some
    hundred MB), and that is worth doing while the previous epoch runs. A
    plan is a pure function of the epoch (the videos, seed, rank and specs
    are the loader's, fixed), so a plan drawn ahead is the plan. Plans are
    not kept beyond that: a pass moving on to an epoch drops the others, and
    looking at other epochs' plans (:meth:`KineticsDALILoader.plan`) keeps
    only the latest two.

    Args:
        draw: ``epoch -> batches``.
    """

    #: Plans kept at most: the pass's and the one drawn ahead (or looked at) next.
    KEEP = 2

    def __init__(self, draw: Callable[[int], list[list[Sample]]]) -> None:
        self._draw = draw
        self._done: OrderedDict[int, list[list[Sample]] | BaseException] = OrderedDict()
        self._ahead: dict[int, threading.Thread] = {}
        self._lock = threading.Lock()

    def get(self, epoch: int, *, forget_others: bool = True) -> list[list[Sample]]:
        """The plan of ``epoch`` (waits for it if it is being drawn ahead), kept for later calls.

        A pass moving on to ``epoch`` forgets the others (``forget_others``); a
        look at a plan (:meth:`KineticsDALILoader.plan`) keeps the latest two.
        """
        thread = self._ahead.pop(epoch, None)
        if thread is not None:
            thread.join()
        with self._lock:
            plan = self._done.get(epoch)
            if forget_others:
                self._done.clear()  # the caller moves on to this epoch: older plans are not needed again
        if plan is None or isinstance(plan, BaseException):
            plan = self._draw(epoch)  # a failure ahead is raised here, in the caller's thread
        self._keep(epoch, plan)
        return plan

    def kept(self) -> list[int]:
        """The epochs whose plans are kept, oldest first."""
        with self._lock:
            return list(self._done)

    def draw_ahead(self, epoch: int) -> None:
        """Start drawing ``epoch``'s plan in a daemon thread, unless it is drawn or being drawn."""
        with self._lock:
            if epoch in self._done or epoch in self._ahead:
                return
            thread = threading.Thread(target=self._store, args=(epoch,), name="daliload-plan-ahead", daemon=True)
            self._ahead[epoch] = thread
        thread.start()

    def _keep(self, epoch: int, plan: list[list[Sample]] | BaseException) -> None:
        with self._lock:
            self._done[epoch] = plan
            self._done.move_to_end(epoch)
            while len(self._done) > self.KEEP:
                self._done.popitem(last=False)

    def _store(self, epoch: int) -> None:
        try:
            plan: list[list[Sample]] | BaseException = self._draw(epoch)
        except BaseException as err:  # noqa: BLE001 - kept for get(), which draws again and raises there
            plan = err
        self._keep(epoch, plan)


def weakly(method: Callable) -> Callable:
    """``method`` of an object, holding the object weakly (a callable kept by the object itself makes no cycle)."""
    ref, name = weakref.WeakMethod(method), method.__qualname__

    def call(*args, **kwargs):
        bound = ref()
        if bound is None:
            raise ReferenceError(f"{name}: its object is gone")
        return bound(*args, **kwargs)
    return call
