"""Every use of torch's private DataLoader machinery, in one place.

The fallback loader supervises DataLoader workers (a hung decode is killed, a
dead worker costs one sample, not the epoch). torch has no public API for
that, so this module reaches into its multi-process iterator
(``_MultiProcessingDataLoaderIter``). Checked against torch 2.13.0, the version
CI installs; nothing else in the repository touches these names. What is used:

* ``loader._iterator``: the iterator a DataLoader with persistent workers
  keeps between passes;
* ``iterator._workers``: the worker ``multiprocessing.Process`` objects (pid,
  exitcode) of a multi-process iterator;
* ``iterator._shutdown_workers()``: torch's own clean-up of those workers (its
  ``__del__`` calls it too);
* ``iterator._worker_pids_set`` and
  ``torch.utils.data._utils.signal_handling._set_worker_pids`` /
  ``_remove_worker_pids``: the registration that lets torch's SIGCHLD handler
  raise when a worker dies;
* the text of torch's worker-loss errors ("DataLoader worker (pid(s) N)
  exited unexpectedly" / "is killed by signal");
* ``torch.UntypedStorage._new_shared``: a new shared-memory storage, what
  ``default_collate`` batches into inside a worker (a tensor already in
  shared memory leaves the worker as a file descriptor, without a copy).

:func:`check_iterator` verifies the attributes on every new iterator and
raises a RuntimeError naming the torch version if an upgrade removed one, so
a torch upgrade fails loudly at the first epoch instead of losing the
supervision silently; ``tests/test_fallback_torch_internals.py`` checks the
same against a real worker death.
"""

from __future__ import annotations

import math
import re
from typing import Any

import torch
from torch.utils.data._utils import signal_handling

_ITERATOR_ATTRIBUTES = ("_workers", "_shutdown_workers", "_worker_pids_set")
_MODULE_FUNCTIONS = ("_set_worker_pids", "_remove_worker_pids")


def check_iterator(iterator: Any) -> None:
    """Raise if a multi-process DataLoader iterator lacks what the supervision uses.

    Single-process iterators (no ``_workers``) are not supervised and pass.

    Raises:
        RuntimeError: this torch version changed its DataLoader internals.
    """
    if not hasattr(iterator, "_workers"):
        return
    missing = [name for name in _ITERATOR_ATTRIBUTES if not hasattr(iterator, name)]
    missing += [f"signal_handling.{name}" for name in _MODULE_FUNCTIONS if not hasattr(signal_handling, name)]
    if missing:
        raise RuntimeError(
            f"torch {torch.__version__} changed the DataLoader internals the fallback's worker "
            f"supervision relies on (missing: {', '.join(missing)}); see fallback/_torch_internals.py")


def persistent_iterator(loader: Any) -> Any | None:
    """The iterator a DataLoader keeps between passes (persistent workers), if any."""
    return getattr(loader, "_iterator", None)


def workers(iterator: Any) -> list:
    """The worker processes of a DataLoader iterator (empty for a single-process one)."""
    return list(getattr(iterator, "_workers", []))


def shutdown(iterator: Any) -> None:
    """Stop the workers of a DataLoader iterator with torch's own clean-up."""
    stop = getattr(iterator, "_shutdown_workers", None)
    if stop is not None:
        stop()


def register_worker_pids(iterator: Any) -> None:
    """Let torch's SIGCHLD handler raise for this iterator's workers (only while waiting on it)."""
    procs = getattr(iterator, "_workers", None)
    if procs and not getattr(iterator, "_worker_pids_set", True):
        signal_handling._set_worker_pids(id(iterator), tuple(w.pid for w in procs))
        iterator._worker_pids_set = True


def unregister_worker_pids(iterator: Any) -> None:
    """Undo :func:`register_worker_pids`."""
    if getattr(iterator, "_worker_pids_set", False):
        signal_handling._remove_worker_pids(id(iterator))
        iterator._worker_pids_set = False


def is_worker_loss(err: BaseException) -> bool:
    """Whether ``err`` is torch's report of a DataLoader worker that died."""
    text = str(err)
    return "DataLoader worker" in text and ("exited unexpectedly" in text or "killed by signal" in text)


def pids_in_error(error: BaseException | None) -> list[int]:
    """The worker pids a torch worker-loss error names (empty if none)."""
    if error is None:
        return []
    match = re.search(r"pid\(?s?\)? ([\d, ]+)", str(error))
    return [int(p) for p in re.findall(r"\d+", match.group(1))] if match else []


def shared_empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised contiguous tensor in new shared memory (as ``default_collate`` makes in a worker)."""
    storage = torch.UntypedStorage._new_shared(math.prod(shape) * dtype.itemsize)
    return torch.empty(0, dtype=dtype).set_(storage).view(shape)
