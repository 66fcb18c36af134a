"""The run time under every layer: worker processes, how they start, the job's ranks, native logs, lazy exports.

Modules, by concept:

* :mod:`._workerpool`: :class:`WorkerPool`, the one supervised pool every
  process of the package runs in (the fallback's decoders, the scan's probes,
  the DALI source's cutters, the transcode's and the synthetic dataset's
  encoders), and :class:`TaskOutcome`, what it says about a task;
* :mod:`._processes`: how those processes start (forkserver, never fork,
  never re-running the user's main script): :func:`mp_context`,
  :func:`usable_cores`, :func:`refuse_bootstrapping_main`; and
  :class:`WithPrefetch`, a task function whose worker starts the next task's
  reads while it runs this one;
* :mod:`._forkserver`: preloaded by daliload's forkserver, which then removes
  the training process's ``$TMPDIR/pymp-*`` folder when a signal ended that
  process (no finalizer of its own ran);
* :mod:`._dist`: the job's ranks, read from ``torch.distributed`` or torchrun's
  variables (:func:`rank`, :func:`world_size`, :func:`local_rank`, ...);
* :mod:`._native_logs`: what FFmpeg and DALI print themselves, kept off the
  console (:func:`quiet_dali`); also run as a script by its file path, as the
  stderr relay (so it imports nothing of the package);
* :mod:`._interrupts`: :func:`keep_interrupts`, a Ctrl-C that lands in a
  finalizer (the buffers' give-back) delivered again rather than dropped;
* :mod:`._lazy`: :func:`lazy_exports`, the PEP 562 re-exports of ``daliload``,
  ``fallback`` and :mod:`daliload.dali`.

Nothing here imports torch or a decoder at import time, and the names are
re-exported lazily (PEP 562, as in ``daliload``): ``import daliload`` and
``fallback/`` use :func:`lazy_exports` without paying for multiprocessing,
sockets and ctypes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from daliload.runtime._lazy import lazy_exports

_EXPORTS = {
    "daliload.runtime._dist": ("all_gather_object", "barrier", "broadcast_object", "gather_object", "is_distributed",
                               "local_cuda_device", "local_rank", "patient_group", "rank", "require_cuda",
                               "resolve_device", "world_size"),
    "daliload.runtime._interrupts": ("keep_interrupts",),
    "daliload.runtime._native_logs": ("NATIVE_LOGS_ENV", "StderrFilter", "quiet_dali"),
    "daliload.runtime._processes": ("WithPrefetch", "main_script_hidden", "mp_context", "refuse_bootstrapping_main",
                                    "usable_cores"),
    "daliload.runtime._workerpool": ("TaskOutcome", "WorkerPool"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted([*_MODULE_OF, "lazy_exports"])

if TYPE_CHECKING:  # for type checkers and IDEs; at run time __getattr__ imports on first use
    from daliload.runtime._dist import (all_gather_object, barrier, broadcast_object, gather_object, is_distributed,
                                        local_cuda_device, local_rank, patient_group, rank, require_cuda,
                                        resolve_device, world_size)
    from daliload.runtime._interrupts import keep_interrupts
    from daliload.runtime._native_logs import NATIVE_LOGS_ENV, StderrFilter, quiet_dali
    from daliload.runtime._processes import (WithPrefetch, main_script_hidden, mp_context, refuse_bootstrapping_main,
                                             usable_cores)
    from daliload.runtime._workerpool import TaskOutcome, WorkerPool


__getattr__, __dir__ = lazy_exports(__name__, globals(), _MODULE_OF)
