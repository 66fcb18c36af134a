"""Waiting for DALI with a time limit, and exiting when DALI is stuck.

DALI's ``Pipeline.outputs()`` blocks until a batch is done, with no time
limit. :class:`Waiter` runs those calls on one daemon thread, in order, so
that the caller can give a wait up (:class:`~daliload.dali.DaliTimeoutError`),
and every other call on a pipeline too (feeding a batch and scheduling its
run), so that a pipeline is only ever called from that one thread; a thread
stuck inside DALI cannot be stopped, so the decoder is unusable afterwards
and the run ends, loudly. At exit DALI shuts every pipeline down and waits
for the batches it is running, forever for a stuck one:
:func:`exit_without_waiting_for` makes such a process exit without that wait.
Batches of an abandoned pass are handed to the waiter to be taken off DALI's
queue (``discard=True``), in order, so that nothing waits for them; at exit
they get a few seconds to finish (:func:`_drain_at_exit`: a thread still
inside DALI when the interpreter finalizes aborts the process).
"""

from __future__ import annotations

import atexit
import concurrent.futures
import logging
import os
import queue
import sys
import threading
import time
import weakref

logger = logging.getLogger(__name__)


class Waiter:
    """One daemon thread that runs every call on DALI's pipelines (the waits among them), one at a time, in order.

    A daemon, unlike ``ThreadPoolExecutor``'s threads (joined at interpreter
    exit), so a wait stuck inside DALI cannot keep the process from exiting.
    The thread keeps no reference to a call once it has run: the last
    reference to a DALI pipeline must not be dropped on this thread while the
    interpreter exits (see :func:`_drain_at_exit`).
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._done = threading.Condition()
        self._queued = 0  # submitted calls not finished yet (under _done)
        self.busy = False  # inside a call to DALI
        if not _LIVE_WAITERS:
            atexit.register(_drain_at_exit)  # after DALI's own hook (DALI is imported first), so run before it
        _LIVE_WAITERS.add(self)
        threading.Thread(target=self._run, name="daliload-dali-wait", daemon=True).start()

    def _run(self) -> None:
        while True:
            fn, future = self._jobs.get()
            if fn is None:
                return
            self.busy = True
            try:
                if future is None:  # a discarded batch: taken off DALI's queue, nobody waits for it
                    try:
                        fn()
                    except Exception as err:  # noqa: BLE001 - the result of a dropped batch, failed or not
                        logger.debug("a discarded DALI batch failed: %s", err)
                elif future.set_running_or_notify_cancel():
                    try:
                        future.set_result(fn())
                    except BaseException as err:  # noqa: BLE001 - handed to the waiting caller
                        future.set_exception(err)
            finally:
                fn = future = None  # a pipeline whose owner let it go is freed here, not at exit
                self.busy = False
                with self._done:
                    self._queued -= 1
                    self._done.notify_all()

    def submit(self, fn, *, discard: bool = False) -> concurrent.futures.Future | None:
        """Queue ``fn``; its future, or ``None`` when ``discard`` (run it, drop its result)."""
        future: concurrent.futures.Future | None = None if discard else concurrent.futures.Future()
        with self._done:
            self._queued += 1
        self._jobs.put((fn, future))
        return future

    def drain(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for every submitted call to finish; whether they did."""
        with self._done:
            return self._done.wait_for(lambda: self._queued == 0, timeout_s)

    def close(self) -> None:
        self._jobs.put((None, None))


#: Every waiter not yet garbage (the thread of one holds it until closed).
_LIVE_WAITERS: weakref.WeakSet[Waiter] = weakref.WeakSet()
#: How long exit waits for DALI to finish the batches an abandoned pass dropped.
EXIT_DRAIN_S = 5.0


def _drain_at_exit() -> None:
    """Let the waiters finish their calls into DALI before the interpreter exits, or exit at once.

    Registered with the first waiter, after DALI's own exit hook (DALI is
    imported first), so it runs before DALI shuts its pipelines down, which
    waits for the batches they are running.

    - A waiter whose wait timed out (:func:`exit_without_waiting_for`) and is
      still inside DALI: the process exits at once, without that wait.
    - A daemon thread that returns from DALI's C++ code (a batch's outputs, a
      pipeline's destructor) while the interpreter is finalizing is ended by
      Python inside a C++ destructor, and the process aborts ("terminate
      called without an active exception", status 134). So the batches an
      abandoned pass dropped get :data:`EXIT_DRAIN_S` to finish, then the
      process exits without them, as after a time-out.
    """
    if any(waiter.busy for waiter in _STUCK_WAITERS):
        _exit_now("exiting without waiting for DALI: a batch past its time limit is still running")
    deadline = time.monotonic() + EXIT_DRAIN_S
    for waiter in list(_LIVE_WAITERS):
        if waiter in _STUCK_WAITERS:
            continue  # it finished its stuck call; what was queued behind it is not waited for
        if not waiter.drain(max(0.0, deadline - time.monotonic())):
            _exit_now("exiting without waiting for DALI: dropped batches are still decoding")


#: Waiters whose wait for DALI timed out (see :func:`exit_without_waiting_for`).
_STUCK_WAITERS: list[Waiter] = []


def exit_without_waiting_for(waiter: Waiter) -> None:
    """Make the process exit without waiting for DALI's work once ``waiter``'s wait timed out.

    At exit DALI shuts every pipeline down (its own ``atexit`` hook), which
    waits for the batches it is running: forever for one stuck inside a
    decoder, and minutes for one that is merely slow (a 10,000-frame window
    was seen to take that long). After a :class:`DaliTimeoutError` the run
    cannot go on anyway, so :func:`_drain_at_exit` ends the process at once
    while DALI is still busy: status 1 if an uncaught exception is ending the
    script (the usual case: the ``DaliTimeoutError`` itself), else 0. Output
    streams and logging are flushed first; the worker processes die with
    their parent.
    """
    _STUCK_WAITERS.append(waiter)


def _exit_now(why: str) -> None:
    """End the process at once: status 1 if an uncaught exception is ending the script, else 0."""
    status = 1 if getattr(sys, "last_value", None) is not None else 0
    logger.warning("%s", why)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass  # closed or replaced: nothing to flush
    os._exit(status)
