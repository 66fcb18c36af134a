"""How daliload starts processes: forkserver (preloaded) or spawn, never fork, and never the main script again.

Every process the package starts (the fallback's decoders, the scan's probes,
transcode, the synthetic dataset's encoders) is a worker of
:class:`daliload.runtime.WorkerPool`, started through :func:`mp_context`
inside :func:`main_script_hidden`:

- ``fork`` is refused: a child forked from a threaded process (FFmpeg,
  OpenBLAS and torch threads) while one of those threads holds a lock
  deadlocks.
- A ``spawn``/``forkserver`` child normally imports the parent's main script
  again (as ``__mp_main__``) before it starts; a script without an
  ``if __name__ == "__main__":`` guard would then run its training once more
  in every worker. :func:`main_script_hidden` starts daliload's children
  without that import; :func:`refuse_bootstrapping_main` stops another
  library's child that re-runs such a script into daliload, naming the fix.
- Workers die with their parent (:func:`die_with_parent`), so a ``kill -9``
  of the training process leaves none behind. Their parent is the
  forkserver, not the training process: each worker lets go of its copy of
  the forkserver's "alive" pipe (:func:`_let_go_of_the_forkserver`), so that
  the forkserver sees the end of that pipe, and exits, when the training
  process ends however it ends (``kill``, ``kill -9``, the OOM killer),
  taking every worker with it, a stopped one too (SIGKILL needs no
  answer). Before, a stopped worker kept the forkserver, itself and the
  resource tracker alive for ever. The forkserver then removes the
  training process's temporary folder (:mod:`daliload.runtime._forkserver`).
- A worker whose supervisor is gone (its pipe closed or reset) exits
  quietly: no traceback of a broken pipe after a ``kill`` of the training
  process.

The one other process, the relay of :mod:`daliload.runtime._native_logs` that keeps
DALI's own lines off a DALI process's stderr, is not a worker: it must
outlive a crash of that process to pass on its last words, and ends with
the pipe it reads.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.machinery
import logging
import multiprocessing as mp
import os
import signal
import socket
import sys
from multiprocessing.connection import Connection
from types import FrameType
from typing import Callable, Iterator, Literal

from daliload.runtime._native_logs import configure_worker
from daliload.stream import transfer_counts

logger = logging.getLogger(__name__)

StartMethod = Literal["forkserver", "spawn"]

#: What every daliload forkserver imports once, so that each worker it forks (scan
#: probes, fallback decoders, the synthetic dataset's encoders) starts with them
#: loaded: ~0.1 s instead of ~3.5 s re-importing torch (measured on 2 cores).
#: One forkserver serves a whole process and keeps the preload list of the first
#: pool that started it, so every daliload pool asks for this same list.
FORKSERVER_PRELOAD: tuple[str, ...] = ("torch", "av", "numpy", "daliload.runtime._forkserver")

#: What spawn/forkserver children are told the main module is while daliload starts
#: them: multiprocessing never re-imports a main module whose spec is named
#: ``__main__`` (that is how ``python -m package`` runs ``package/__main__.py``).
_UNIMPORTED_MAIN_SPEC = importlib.machinery.ModuleSpec("__main__", None)
GUARD = 'if __name__ == "__main__":'
_PR_SET_PDEATHSIG = 1
#: What a pool's worker says besides results: it is ready; it could not start (with why); it started a task.
READY = "__ready__"
FAILED = "__failed__"  # (FAILED, "ExcType: message")
STARTED = "__started__"  # (STARTED, task_id)


def mp_context(start_method: StartMethod | None = None):
    """The multiprocessing context daliload's pools use: forkserver (preloaded) where available, else spawn.

    Raises:
        ValueError: ``start_method`` is not ``"forkserver"`` or ``"spawn"`` (never ``"fork"``).
    """
    if start_method is None:
        start_method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
    if start_method not in ("forkserver", "spawn"):
        raise ValueError(f"start_method must be 'forkserver' or 'spawn' (never 'fork'), got {start_method!r}")
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload(list(FORKSERVER_PRELOAD))
    return ctx


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError) as err:  # exotic libc: orphans then exit on EOF instead
        logger.debug("prctl(PR_SET_PDEATHSIG) unavailable: %s", err)


@contextlib.contextmanager
def main_script_hidden(hide: bool = True) -> Iterator[None]:
    """Start ``spawn``/``forkserver`` processes inside this block so they do not re-run the main script.

    Such a child imports the parent's main script again (as ``__mp_main__``)
    before it starts, to unpickle objects defined there; a script without an
    ``if __name__ == "__main__":`` guard then re-runs its training in every
    worker. While processes start here, the main module's spec is named
    ``__main__``, which multiprocessing treats like a package's ``__main__.py``
    and does not import in the child (``multiprocessing.spawn``, the same in
    CPython 3.8-3.13). Only for children whose target and arguments are
    importable by name: an object defined in the main script cannot be
    unpickled there.

    Args:
        hide: False makes the block do nothing (for callers whose function
            lives in the main script).
    """
    main = sys.modules.get("__main__")
    if not hide or main is None:
        yield
        return
    saved = getattr(main, "__spec__", None)
    main.__spec__ = _UNIMPORTED_MAIN_SPEC
    try:
        yield
    finally:
        main.__spec__ = saved


def _reimported_main_frame() -> FrameType | None:
    """The top-level frame of the parent's main script when this child is re-running it, else None."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == "__mp_main__":
            return frame
        frame = frame.f_back
    return None


def refuse_bootstrapping_main(what: str) -> None:
    """Raise if this process is a child still importing its parent's main script.

    A ``spawn``/``forkserver`` child (a DataLoader worker, a ``multiprocessing``
    pool) first re-runs the parent's main script as ``__mp_main__``. If that
    script builds ``what`` outside an ``if __name__ == "__main__":`` guard, the
    child would scan, load and train all over again, or wait forever for the
    manifest lock its parent holds. Call this first thing where ``what`` is
    built; it does nothing in a main process (a script, a torchrun rank, pytest)
    or in a child that has finished starting.

    Raises:
        RuntimeError: naming the script line and the guard that fixes it.
    """
    frame = _reimported_main_frame()
    if frame is None and not getattr(mp.current_process(), "_inheriting", False):
        return
    where = (f"{frame.f_code.co_filename}, line {frame.f_lineno}," if frame is not None
             else "the main script")
    raise RuntimeError(
        f"{what} was started inside a worker process that is re-running {where} at the top level. "
        f"Worker processes started with 'spawn' or 'forkserver' (DataLoader and multiprocessing workers; "
        f"the default start method on Linux from Python 3.14) import the main script again before they "
        f"start, so a script without a guard runs its training once more in every worker. Put the "
        f"script's top-level code under `{GUARD}` (or in a main() function called from there).")


def worker_main(conn: Connection) -> None:
    """A :class:`~daliload.runtime.WorkerPool` worker: receive the function, then run tasks one at a
    time: ``(STARTED, task_id)`` when one starts, ``(task_id, status, value, error)`` when it is done.

    The function is the first message, not a process argument, so an error
    unpickling it (its module fails to import here) can be sent back as
    ``(FAILED, "ExcType: message")``. The worker exits on a ``None`` message
    or when the supervisor's end of the pipe closes (EOF).
    """
    # Ctrl-C goes to the whole process group; the supervisor decides what to stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent()
    _let_go_of_the_forkserver()
    configure_worker()  # FFmpeg (PyAV) prints nothing here unless DALILOAD_NATIVE_LOGS asks
    # The supervisor gone (its end closed, or reset with tasks unread: a kill of the training process) ends
    # the worker quietly; a traceback of that broken pipe would only puzzle the user whose process was killed.
    with contextlib.suppress(EOFError, OSError):
        _serve(conn)


class WithPrefetch:
    """A worker's task function that looks ahead: ``prefetch(item)`` for a task already sent behind the one running.

    The worker takes that task off its pipe early and calls ``prefetch`` on
    it (which must return at once: it starts reads in threads, say a remote
    window's, so they overlap this task's decoding), then runs both in order.
    A task taken early is not started: if the worker dies, the pool sends it
    again, as every task queued behind the one that died.

    Args:
        fn: the task function (module-level, or a ``functools.partial`` of one).
        prefetch: a module-level function of one item; what it raises is ignored (the task meets it itself).
    """

    def __init__(self, fn: Callable, prefetch: Callable) -> None:
        self.fn, self.prefetch = fn, prefetch

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


def _serve(conn: Connection) -> None:
    """:func:`worker_main`'s work, until a ``None`` message or the end of the pipe (``EOFError``)."""
    try:
        fn = conn.recv()
    except (EOFError, OSError):
        raise
    except Exception as err:  # reported to the supervisor, which gives up after a few tries
        conn.send((FAILED, _first_line(err)))
        return
    conn.send(READY)
    prefetch = getattr(fn, "prefetch", None)
    ahead: list = []  # a task taken off the pipe early, with its descriptors (or None: the end)
    sock: list[socket.socket] = []  # the pipe as a socket, made for the first task with descriptors
    while True:
        message, fds = ahead.pop() if ahead else _receive(conn, sock)
        if message is None:
            return
        task_id, item, num_fds = message
        if prefetch is not None and conn.poll():  # the next task is here: start its reads now
            ahead.append(_receive(conn, sock))
            if ahead[0][0] is not None:
                with contextlib.suppress(Exception):
                    prefetch(ahead[0][0][1])
        conn.send((STARTED, task_id))  # so that a death from now on is this task's, and its time runs
        before = transfer_counts()
        try:
            reply = (task_id, "ok", fn(item, fds) if num_fds else fn(item), "")
        except Exception as err:  # the task's outcome, reported to the supervisor, not swallowed
            reply = (task_id, "error", None, f"{type(err).__name__}: {err}")
        finally:
            for fd in fds:
                os.close(fd)
        # What the task read from remote stores goes back with it: the training process counts it (stats()).
        read = [now - then for now, then in zip(transfer_counts(), before)]
        reply += (tuple(read) if any(read) else None,)
        try:
            conn.send(reply)
        except (TypeError, AttributeError, ValueError) as err:  # result not picklable
            conn.send((task_id, "error", None, f"result could not be sent back: {type(err).__name__}: {err}",
                       reply[-1]))


def _receive(conn: Connection, sock: list[socket.socket]) -> tuple:
    """The next message and the file descriptors that travel with it (over the same socket, ``sock[0]``,
    made once)."""
    message = conn.recv()
    if message is None or not message[2]:
        return message, []
    if not sock:
        sock.append(socket.fromfd(conn.fileno(), socket.AF_UNIX, socket.SOCK_STREAM))
    _, fds, _, _ = socket.recv_fds(sock[0], 1, message[2])
    return message, fds


def _let_go_of_the_forkserver() -> None:
    """Close this worker's copy of the write end of the forkserver's "alive" pipe.

    A forkserver child is handed that descriptor so that it could ask the same
    forkserver for children of its own; daliload's workers never do (a pool
    started in a worker starts a forkserver of its own). Held here, it keeps
    the forkserver running after the training process is gone for as long as
    this worker lives, and the worker, whose parent is that forkserver, lives
    on with it when it is stopped or stuck: neither would ever end.
    """
    forkserver = sys.modules.get("multiprocessing.forkserver")
    server = getattr(forkserver, "_forkserver", None)
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is None or getattr(server, "_forkserver_pid", None) is not None:
        return  # not a forkserver's child (spawn), or a process that runs a forkserver of its own
    with contextlib.suppress(OSError):
        os.close(fd)
    server._forkserver_alive_fd = None


def _first_line(err: BaseException) -> str:
    """``"ExcType: first line of the message"``."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__
