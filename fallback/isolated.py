"""Decode a few samples outside the training process: a crash or a hang costs the sample, not the run.

The loader decodes some samples itself rather than through
:class:`~fallback.FallbackLoader`: a DALI batch's files that DALI could not
decode, files moved off DALI in the middle of an epoch, and the replacement
search once the fallback loader has nothing decodable left. Run in the
training process, FFmpeg could segfault the run, or hang it where the
cooperative time limit (checked between packets) never fires.
:class:`IsolatedDecoder` runs them in a supervised pool
(:class:`daliload.workerpool.WorkerPool`: a worker that dies or overruns the
time limit is replaced, and only its sample fails):

    decoder = IsolatedDecoder(output, DecodeOptions(timeout_s=60), workers=2)
    for sample, result in decoder.decode(samples):
        video if isinstance(result, torch.Tensor) else failure (a Failure record)

Each call starts its workers (forkserver, with torch and PyAV preloaded: about
0.1-0.3 s) and stops them; this path only runs after something failed, so no
process is kept idle for it. ``workers=0`` decodes in this process: the
unprotected debugging mode (``DecodeSpec(fallback_workers=0)``).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Sequence

import numpy as np
import torch

from daliload.failures import REASON_TIMEOUT, REASON_WORKER_DIED, Failure
from daliload.plan import OutputSpec, Sample
from daliload.workerpool import WorkerPool
from fallback.dataset import DecodeOptions, decode_sample, inject_fault
from fallback.decode import DecodeError

#: What one task carries: the sample, the output spec, its decode options, a test-only fault.
_Task = tuple[Sample, OutputSpec, DecodeOptions, "str | None"]


def _decode_task(task: _Task) -> tuple[str, np.ndarray | str]:
    """Worker side: ``("ok", clip as numpy)`` or ``("failed", reason)`` for a file that does not decode."""
    sample, output, decode, fault = task
    if fault is not None:
        inject_fault(fault, sample.path)
    try:
        # numpy crosses the pipe by value; a torch tensor would go through shared-memory handles.
        return "ok", decode_sample(sample, output, decode).numpy()
    except DecodeError as err:
        return "failed", err.reason


class IsolatedDecoder:
    """Decode samples in supervised worker processes (see the module docstring).

    Args:
        output: what every clip is turned into.
        decode: threads, time limit and seek hints; the pool kills a decode
            still running at ``1.25 * timeout_s + 0.5`` seconds.
        workers: processes per call (at most one per sample); 0 decodes in
            this process, unprotected.
        faults: test-only ``path -> action`` (see :mod:`fallback.dataset`).
    """

    def __init__(self, output: OutputSpec, decode: DecodeOptions, *, workers: int = 2,
                 faults: dict[str, str] | None = None) -> None:
        if not isinstance(workers, int) or workers < 0:
            raise ValueError(f"workers must be an integer >= 0, got {workers!r}")
        self.output = output
        self.decode_options = decode
        self.workers = workers
        self.faults = dict(faults or {})

    def decode(self, samples: Sequence[Sample]) -> list[tuple[Sample, torch.Tensor | Failure]]:
        """Each sample with its clip, or the :class:`~daliload.failures.Failure` that stopped it; in order."""
        if not samples:
            return []
        tasks = [self._task(s) for s in samples]
        if self.workers == 0:
            return [(s, self._here(task)) for s, task in zip(samples, tasks)]
        limit = None if self.decode_options.timeout_s is None else self.decode_options.timeout_s * 1.25 + 0.5
        results: dict[int, torch.Tensor | Failure] = {}
        with WorkerPool(_decode_task, workers=min(self.workers, len(tasks)), timeout_s=limit) as pool:
            for outcome in pool.imap_unordered(tasks):
                sample = outcome.item[0]
                results[id(outcome.item)] = self._result(sample, outcome, limit)
        return [(s, results[id(task)]) for s, task in zip(samples, tasks)]

    def _task(self, sample: Sample) -> _Task:
        # Only this sample's seek hint travels (the whole dataset's would be pickled per task).
        hint = self.decode_options.hint(sample.path)
        decode = dataclasses.replace(self.decode_options, hints={sample.path: hint} if hint else None)
        return sample, self.output, decode, self.faults.get(sample.path)

    @staticmethod
    def _result(sample: Sample, outcome, limit: float | None) -> torch.Tensor | Failure:
        if outcome.status == "ok":
            status, value = outcome.value
            if status == "ok":
                return torch.from_numpy(value)
            return Failure(sample.path, value, sample.position)
        if outcome.status == "timeout":
            reason = f"{REASON_TIMEOUT}: decode still running after {limit:g} s; worker killed"
        elif outcome.status == "crash":
            how = outcome.error.removeprefix("worker died with ").replace("worker exited with code", "exit code")
            reason = f"{REASON_WORKER_DIED} ({how}) while decoding this sample"
        else:
            reason = f"decode raised {outcome.error}"
        return Failure(sample.path, reason, sample.position)

    @staticmethod
    def _here(task: _Task) -> torch.Tensor | Failure:
        sample, output, decode, fault = task
        if fault is not None:
            inject_fault(fault, sample.path)
        try:
            return decode_sample(sample, output, decode)
        except DecodeError as err:
            return Failure(sample.path, err.reason, sample.position)

    def __repr__(self) -> str:
        return f"IsolatedDecoder(workers={self.workers}, timeout_s={self.decode_options.timeout_s}, pid={os.getpid()})"
