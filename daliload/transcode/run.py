"""Run a transcode: plan, skip what the record says is done, transcode the rest in supervised workers."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Iterable

from daliload.transcode.encode import FileJob, remove_partials, transcode_file
from daliload.transcode.options import ALL_FILES, Shard, TranscodeOptions
from daliload.transcode.plan import copy_layout_files, plan_transcode
from daliload.transcode.record import Record
from daliload.transcode.summary import FileResult, TranscodeSummary
from daliload.runtime import usable_cores
from daliload.runtime import WorkerPool

#: Seconds one file may take before its worker is killed and the file reported as failed.
DEFAULT_TIMEOUT_S = 600.0


def transcode_dataset(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    options: TranscodeOptions | None = None,
    *,
    splits: Iterable[str] = (),
    shard: Shard = ALL_FILES,
    workers: int | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    progress: bool = True,
    json_path: str | os.PathLike | None = None,
) -> TranscodeSummary:
    """Transcode a dataset root into ``dst`` with the same layout (see :mod:`daliload.transcode`).

    Args:
        src: the source dataset root (read only).
        dst: the output root (created).
        options: how to encode (default :class:`TranscodeOptions()`: H.264, short side 256, GOP 16).
        splits: splits to transcode (default: every split the source has).
        shard: this run's share of the files (default all).
        workers: worker processes (default: the usable cores).
        timeout_s: seconds one file may take; past that its worker is killed and
            the file is reported as failed.
        progress: show a tqdm bar (files, MB/s of source read, ETA) on stderr.
        json_path: write one JSON record per file (JSON Lines) there.

    Returns:
        The summary; files that failed are in ``summary.failed`` (a re-run retries them).

    Raises:
        FileNotFoundError, ValueError: a bad source, output or split (see :func:`.plan.plan_transcode`).
    """
    started = time.monotonic()
    options = options if options is not None else TranscodeOptions()
    workers = workers if workers is not None else usable_cores()
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    plan = plan_transcode(src, dst, options, splits=tuple(splits), shard=shard)
    Path(plan.dst_root).mkdir(parents=True, exist_ok=True)
    copy_layout_files(plan)
    results = [FileResult(rel, "failed", reason=reason) for rel, reason in plan.clashes]
    with Record(plan.dst_root, shard) as record:
        todo = []
        for job in plan.jobs:
            stat = os.stat(job.src)
            previous = record.done(job.rel, stat.st_size, stat.st_mtime_ns, options.key())
            if previous is not None:
                results.append(previous)
            else:
                todo.append(job)
        results += _run_jobs(todo, record, workers=workers, timeout_s=timeout_s, progress=progress)
    summary = TranscodeSummary(tuple(sorted(results, key=lambda r: r.rel)), time.monotonic() - started,
                               layout_files=plan.layout_files, options=options.describe(), shard=str(shard))
    if json_path is not None:
        Path(json_path).write_text("".join(r.to_json() + "\n" for r in summary.results), encoding="utf-8")
    return summary


def _run_jobs(jobs: list[FileJob], record: Record, *, workers: int, timeout_s: float,
              progress: bool) -> list[FileResult]:
    """Transcode ``jobs`` in a :class:`WorkerPool`; record each result as it arrives."""
    from tqdm import tqdm

    results: list[FileResult] = []
    if not jobs:
        return results
    started = time.monotonic()
    bytes_in = 0
    bar = tqdm(total=len(jobs), unit="file", desc="transcode", disable=not progress, dynamic_ncols=True)
    try:
        with WorkerPool(transcode_file, workers=min(workers, len(jobs)), timeout_s=timeout_s) as pool:
            for outcome in pool.imap_unordered(jobs):
                result = outcome.value if outcome.ok else _failed(outcome.item, outcome.status, outcome.error)
                record.put(result)
                results.append(result)
                bytes_in += result.bytes_in
                bar.update()
                bar.set_postfix_str(f"{bytes_in / 1e6 / max(1e-9, time.monotonic() - started):.2f} MB/s, "
                                    f"{sum(r.status == 'failed' for r in results)} failed")
    finally:
        bar.close()
    return results


def _failed(job: FileJob, status: str, error: str) -> FileResult:
    """The result of a file whose worker raised, timed out or crashed (its half-written output removed)."""
    remove_partials(Path(job.dst))
    try:
        stat = os.stat(job.src)
        size, mtime = stat.st_size, stat.st_mtime_ns
    except OSError:
        size, mtime = 0, 0
    reason = error if status == "error" else f"{status}: {error}"
    return FileResult(job.rel, "failed", reason=reason, src_size=size, src_mtime_ns=mtime, bytes_in=size,
                      options_key=job.options.key())
