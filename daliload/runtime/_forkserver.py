"""Imported by the forkserver daliload starts (one of its preloads): it tidies after a training process killed.

multiprocessing's forkserver listens on a socket in the training process's
temporary folder (``$TMPDIR/pymp-*``), which that process removes at its
normal exit (a multiprocessing finalizer). A process ended by a signal
(``kill``, ``kill -9``, the OOM killer, a job scheduler's SIGTERM) runs no
finalizer, and the folder stayed behind, one a run. The forkserver outlives
it by a moment: it exits when the last holder of its "alive" pipe does,
which, since daliload's workers let go of theirs
(:func:`daliload.runtime._processes.worker_main`), is the training process
itself. On that exit, if the training process is gone, the forkserver
removes its socket and the folder, if nothing else is left in it. While the
training process lives (a forkserver stopped some other way) the folder is
left to it.

The folder may not be that process's own: a child started by
multiprocessing (a ``torch.multiprocessing.spawn`` rank, a DataLoader
worker) inherits its parent's folder, and the forkserver it starts listens
there too; the parent, still running, needs its folder (and its own
forkserver's socket in it) after that child is gone. So the forkserver of
such a child (its parent's command line is multiprocessing's) removes
nothing, and no forkserver removes a folder something else is still in.

Importing this module anywhere else does nothing.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import time

#: How long the forkserver waits, at its exit, to see the training process gone (the kernel closes a dying
#: process's descriptors, which ends the forkserver, a moment before it hands its children to another parent).
ORPHANED_WITHIN_S = 2.0


def _in_forkserver() -> bool:
    """Whether this process is a forkserver importing its preloads (``multiprocessing.forkserver.main``)."""
    forkserver = sys.modules.get("multiprocessing.forkserver")
    main = getattr(forkserver, "main", None)
    frame = sys._getframe(1)
    while frame is not None:
        if main is not None and frame.f_code is main.__code__:
            return True
        frame = frame.f_back
    return False


def _started_by_a_multiprocessing_child(parent: int) -> bool:
    """Whether ``parent`` is a process multiprocessing started (spawn, forkserver), by its command line."""
    try:
        with open(f"/proc/{parent}/cmdline", "rb") as cmdline:
            args = cmdline.read()
    except OSError:  # not Linux, or gone already: nothing is removed
        return True
    return b"--multiprocessing-fork" in args or b"multiprocessing.forkserver" in args


def _remove_temp_dir_if_orphaned(parent: int) -> None:
    """At the forkserver's exit: remove its socket and the ``pymp-*`` folder, if ``parent`` is gone and the
    folder is empty then."""
    forkserver = sys.modules.get("multiprocessing.forkserver")
    address = getattr(getattr(forkserver, "_forkserver", None), "_forkserver_address", None)
    if not isinstance(address, str) or not address or address.startswith("\0"):
        return  # an abstract socket: no folder
    folder = os.path.dirname(address)
    if not os.path.basename(folder).startswith("pymp-"):
        return
    deadline = time.monotonic() + ORPHANED_WITHIN_S
    while os.getppid() == parent and time.monotonic() < deadline:
        time.sleep(0.01)
    if os.getppid() == parent:
        return  # it still runs: the folder is its own to remove
    with contextlib.suppress(OSError):
        os.unlink(address)
    with contextlib.suppress(OSError):  # not empty: something else's, left alone
        os.rmdir(folder)


if _in_forkserver() and not _started_by_a_multiprocessing_child(os.getppid()):
    atexit.register(_remove_temp_dir_if_orphaned, os.getppid())
