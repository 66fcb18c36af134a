"""A Ctrl-C that lands while Python runs a finalizer is delivered again, not lost.

The loader gives the fallback's shared buffers back through ``weakref.finalize``
callbacks, which run in the training loop's thread whenever a batch's tensors
go, many times an epoch. A SIGINT whose ``KeyboardInterrupt`` is raised inside
such a callback is not an error Python can propagate: it reports it as
unraisable ("Exception ignored in: <finalize object ...>") and drops it, and the
loop runs on as if Ctrl-C had never been pressed (CI saw the run go on for the
two minutes of a test's limit). :func:`keep_interrupts` chains a hook to
``sys.unraisablehook`` that, for a ``KeyboardInterrupt`` only, asks the main
thread to be interrupted again (``_thread.interrupt_main``, from a timer
thread 10 ms later: called in the hook itself it would raise at once, inside
the hook, and be dropped again; by then the finalizer has returned); every
other unraisable exception goes to the hook that was there before.
"""

from __future__ import annotations

import _thread
import sys
import threading

_installed = False


def keep_interrupts() -> None:
    """Install the hook (once per process; the hook already there still gets every other unraisable exception)."""
    global _installed
    if _installed:
        return
    previous = sys.unraisablehook

    def hook(unraisable) -> None:  # noqa: ANN001 - sys.UnraisableHookArgs
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            again = threading.Timer(0.01, _thread.interrupt_main)  # raised in the main thread, past the finalizer
            again.daemon = True
            again.start()
            return
        previous(unraisable)

    sys.unraisablehook = hook
    _installed = True
