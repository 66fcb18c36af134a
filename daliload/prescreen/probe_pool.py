"""Probing many files in worker processes, and storing what comes back as it comes.

:func:`probe_into` runs one :class:`ProbeTask` per file in a
:class:`daliload.runtime.WorkerPool` (:func:`run_probe_task` is what a
worker runs: the probe, then the deep check if asked) and commits the results
to the manifest every ``chunk_size`` files or every :data:`COMMIT_EVERY_S`
seconds, so a scan stopped at any point resumes where it stopped.

A probe that fails never stops the scan; the file is stored as ``bad``:

=========================  ====================================================
the worker ...             the file's reason
=========================  ====================================================
hangs past ``timeout_s``   ``"timeout"``
dies (segfault, OOM kill)  ``"crash"``
raises                     ``"probe error: <the exception>"`` (warned once, counted)
=========================  ====================================================

Cheap probes travel in batches (:class:`ProbeBatch`, up to :data:`BATCH_FILES`
files a task), so that the scanning process spends a few microseconds per
file on sending tasks and receiving results instead of a fraction of a
millisecond, which capped a scan near 2,600 files/s whatever the cores. A
batch that hangs, crashes or raises as a whole is tried again a file at a
time, so a file's verdict (``timeout``, ``crash``) is only ever its own; a
file that hangs thus costs two time limits (its batch's, then its own).

A deep check whose worker hangs or dies is first tried once more with
``allow_dali=False``: DALI is the likely culprit, and the file may still
decode in the fallback. On a GPU the DALI half of the deep check does not run
in the probe workers at all but in one worker for the GPU
(:mod:`daliload.prescreen.gpu_stage`), so a scan opens one DALI pipeline per
GPU, whatever its number of probe workers.

What a probe worker runs is :data:`worker_task` (:func:`run_probe_work`):
a test double stands in for it, as for the fallback's workers, to make
chosen files hang, crash or raise (:func:`daliload.testing.probe_faults`);
nothing in the probe path itself knows about faults. ``workers=0`` probes in
this process with :func:`run_probe_task`, never a double.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Callable, Iterator, NamedTuple

from daliload.prescreen.deep import deep_check, with_seek_check
from daliload.prescreen.gpu_stage import DaliCheck, GpuStage
from daliload.prescreen.manifest import Manifest
from daliload.prescreen.probe import ProbeResult, probe_file
from daliload.prescreen.rows import FileRecord, Probed, ProbeRows, RouteRow
from daliload.prescreen.gpus import parse_route_target
from daliload.prescreen.rules import Device, route_for
from daliload.runtime import TaskOutcome, WorkerPool

logger = logging.getLogger(__name__)

#: Seconds between commits even when a chunk is not full (a slow scan still saves progress).
COMMIT_EVERY_S = 2.0
#: Most files in one task of cheap probes (a batch's time limit is one file's: it fails over to single files).
BATCH_FILES = 16


class ProbeTask(NamedTuple):
    """One file for a worker: probe it and, if ``deep_device`` is set, deep-check it there.

    A NamedTuple, not a dataclass: it crosses the process boundary twice per file.
    """

    index: int  # position of the file's FileRecord in the scanner's list
    path: str
    deep_device: Device | None = None
    allow_dali: bool = True
    device_id: int = 0
    #: GPU deep check with probe workers: a DALI-routed file comes back as a DaliCheck for
    #: the GPU's own worker (module docstring) instead of being decoded here.
    dali_elsewhere: bool = False


class ProbeBatch(NamedTuple):
    """Several cheap probes for one worker: one message each way instead of one per file."""

    tasks: tuple[ProbeTask, ...]


def run_probe_work(item: ProbeTask | ProbeBatch, probe: Callable[[ProbeTask], tuple | DaliCheck] | None = None
                   ) -> tuple | DaliCheck | list[tuple[str, object]]:  # fmt: skip
    """Worker entry point: ``probe`` (default :func:`run_probe_task`) for a task; for a batch, ``("ok", rows)``
    or ``("error", "Type: message")`` per task, in order (an exception costs its file only)."""
    probe = probe or run_probe_task
    if isinstance(item, ProbeTask):
        return probe(item)
    out: list[tuple[str, object]] = []
    for task in item.tasks:
        try:
            out.append(("ok", probe(task)))
        except Exception as err:  # noqa: BLE001 - that file's outcome, reported to the scanner as its verdict
            out.append(("error", f"{type(err).__name__}: {err}"))
    return out


def run_probe_task(task: ProbeTask) -> tuple | DaliCheck:
    """Worker entry point: probe one file (and deep-check it if asked).

    Returns:
        :meth:`ProbeRows.as_tuple` of the result (plain tuples pickle fast), or,
        for a DALI-routed file of a task with ``dali_elsewhere``, the
        :class:`~daliload.prescreen.gpu_stage.DaliCheck` still to run.
    """
    facts = probe_file(task.path)
    deep: tuple[RouteRow, ...] = ()
    if task.deep_device is not None:
        # Seeking to the last keyframe must give what a decode from the start gives; a file
        # where it does not is marked unsafe_seek, and route_for keeps it off DALI.
        facts = with_seek_check(facts)
        route, reason = route_for(facts, task.deep_device)
        if route == "dali" and task.dali_elsewhere and task.allow_dali:
            return DaliCheck(task, facts, reason)
        device = parse_route_target(task.deep_device)[0]  # "gpu:ada" decodes on the "gpu"
        result = deep_check(facts, route, reason, device, allow_dali=task.allow_dali,
                            device_id=task.device_id)  # fmt: skip
        deep = ((task.deep_device, result.route, result.reason, int(result.checked)),)
        if result.num_frames is not None:  # the end is damaged: the file is as long as what decodes
            facts = replace(facts, num_frames=result.num_frames)
    return ProbeRows.of(facts, deep).as_tuple()


#: What the probe workers run per task or batch (read when a scan starts its pool); a test double may
#: stand in for it (:func:`daliload.testing.probe_faults`).
worker_task: Callable[[ProbeTask | ProbeBatch], object] = run_probe_work


def _failed(task: ProbeTask, reason: str) -> ProbeRows:
    return ProbeRows.of(ProbeResult(task.path, reason=reason))


def _execute(tasks: list[ProbeTask], workers: int, timeout_s: float
             ) -> Iterator[tuple[ProbeTask, ProbeRows]]:  # fmt: skip
    """Run the tasks; failures become ``bad`` files.

    A deep check that crashed or hung its worker is tried once more without DALI.
    A GPU deep check's DALI half runs in the GPU's own worker (:class:`GpuStage`).
    """
    if workers == 0:
        for task in tasks:
            yield task, ProbeRows(*run_probe_task(task))
        return
    if any(task.deep_device and parse_route_target(task.deep_device)[0] == "gpu" for task in tasks):
        tasks = [task._replace(dali_elsewhere=True) for task in tasks]
    retry: list[ProbeTask] = []
    errors = [0]
    stage = GpuStage(timeout_s=timeout_s)
    # The forkserver started here also serves the loader's fallback workers later in this
    # process: WorkerPool preloads what they all need (daliload.runtime._processes.FORKSERVER_PRELOAD).
    try:
        with WorkerPool(worker_task, workers=min(workers, max(1, len(tasks))), timeout_s=timeout_s) as pool:
            for attempt in (_batched(tasks, workers), retry):
                for outcome in pool.imap_unordered(attempt) if attempt else ():
                    if isinstance(outcome.item, ProbeBatch):
                        yield from _unbatched(outcome, retry, errors)
                    elif outcome.ok and isinstance(outcome.value, DaliCheck):
                        stage.submit(outcome.value)
                    else:
                        yield from _settled(outcome, outcome.item, retry, errors)
                    for done in stage.ready():
                        yield from _settled(done, done.item.task, retry, errors)
        for done in stage.finish():
            yield from _settled(done, done.item.task, retry, errors)
    finally:
        stage.close()
    if errors[0]:
        logger.warning("%d file(s) made the probe raise; they are stored as bad with reason "
                       "'probe error'", errors[0])  # fmt: skip


def _batched(tasks: list[ProbeTask], workers: int) -> list[ProbeTask | ProbeBatch]:
    """Cheap probes in batches of up to :data:`BATCH_FILES`, small enough that every worker gets a few
    (deep checks and GPU work stay one file a task)."""
    size = min(BATCH_FILES, len(tasks) // (4 * max(1, workers)))
    if size < 2 or any(task.deep_device for task in tasks):
        return list(tasks)
    return [ProbeBatch(tuple(tasks[i:i + size])) for i in range(0, len(tasks), size)]


def _unbatched(outcome: TaskOutcome, retry: list[ProbeTask], errors: list[int]
               ) -> Iterator[tuple[ProbeTask, ProbeRows]]:  # fmt: skip
    """Each file's rows of a batch; a batch that failed as a whole goes back a file at a time (``retry``)."""
    batch: ProbeBatch = outcome.item
    if not outcome.ok:
        logger.info("a batch of %d probes: %s (%s); probing them one by one", len(batch.tasks), outcome.status,
                    outcome.error)
        retry.extend(batch.tasks)
        return
    for task, (status, value) in zip(batch.tasks, outcome.value):
        if status == "ok":
            yield task, ProbeRows(*value)
        else:
            errors[0] += 1
            logger.warning("probe of %s raised %s", task.path, value)
            yield task, _failed(task, f"probe error: {value}")


def _settled(outcome: TaskOutcome, task: ProbeTask, retry: list[ProbeTask], errors: list[int]
             ) -> Iterator[tuple[ProbeTask, ProbeRows]]:  # fmt: skip
    """The rows ``outcome`` settles for ``task``; or nothing, when it goes to ``retry``."""
    failed = outcome.status in ("timeout", "crash")
    if outcome.ok:
        yield task, ProbeRows(*outcome.value)
    elif failed and task.deep_device and task.allow_dali:
        logger.info("%s during the deep check of %s; retrying without DALI", outcome.status, task.path)
        retry.append(task._replace(allow_dali=False))
    elif failed:
        logger.info("%s: %s (%s)", outcome.status, task.path, outcome.error)
        yield task, _failed(task, outcome.status)
    else:
        errors[0] += 1
        logger.warning("probe of %s raised %s", task.path, outcome.error)
        yield task, _failed(task, f"probe error: {outcome.error}")


def probe_into(
    manifest: Manifest,
    records: list[FileRecord],
    tasks: list[ProbeTask],
    *,
    workers: int,
    timeout_s: float,
    progress: bool | None,
    chunk_size: int,
    desc: str,
    on_progress: Callable[[int, int], None] | None = None,
) -> None:
    """Probe ``tasks`` and commit the results in chunks (also when interrupted).

    Args:
        manifest: open for writing.
        records: what the scanner knows of each file; ``tasks[i].index`` points into it.
        tasks: one per file to probe.
        workers: worker processes; ``0`` probes in this process (no time limit).
        timeout_s: per-file limit in seconds.
        progress: show a progress bar on stderr, labelled ``desc``; ``None``: when stderr is a terminal.
        chunk_size: files per committed transaction.
        on_progress: called with ``(files probed, files to probe)`` at the start and after each file.
    """
    if not tasks:
        return
    from tqdm.auto import tqdm

    buffer: list[Probed] = []
    last_commit = time.monotonic()
    report = on_progress or (lambda probed, total: None)
    report(0, len(tasks))
    disable = None if progress is None else not progress  # None: tqdm shows the bar when stderr is a terminal
    with tqdm(total=len(tasks), unit="file", desc=desc, disable=disable, smoothing=0.1) as bar:
        try:
            for task, rows in _execute(tasks, workers, timeout_s):
                buffer.append(Probed(records[task.index], rows))
                bar.update()
                report(bar.n, len(tasks))
                if len(buffer) >= chunk_size or time.monotonic() - last_commit > COMMIT_EVERY_S:
                    manifest.write_probed(buffer)
                    buffer.clear()
                    last_commit = time.monotonic()
        finally:
            # Also on Ctrl-C: what was probed is kept, and a re-run resumes after it.
            if buffer:
                manifest.write_probed(buffer)
