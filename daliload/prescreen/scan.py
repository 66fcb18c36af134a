"""The scan: probe every file of a dataset in parallel and keep the manifest up to date.

(About 520 lines for one concept, a scan run: listing, change detection,
probing, the summary and ``ensure_manifest``'s once-per-job rule; probing in
worker processes is :mod:`.probe_pool`.)

:func:`scan` lists the dataset (through :func:`daliload.index.load_index`, or
an explicit list of records), ``stat``s every file, and probes only files that
are new or whose size or modification time changed (plus files not yet
deep-checked on the device when ``deep=True``, and files whose last probe
hung, crashed or raised). Probing runs in worker processes
(:mod:`daliload.prescreen.probe_pool`): a file that hangs the probe past
``timeout_s`` is stored as ``bad`` with reason ``"timeout"``, one that kills
its worker as ``bad`` with reason ``"crash"``; the scan goes on. Results are
committed every ``chunk_size`` files (or every couple of seconds), so a scan
stopped at any point resumes where it stopped.

Where the manifest goes by default (:func:`default_manifest_path`)::

    ROOT/.daliload/manifest.sqlite                     if ROOT is writable
    $XDG_CACHE_HOME/daliload/manifests/<name>-<hash>.sqlite   otherwise
      (~/.cache when XDG_CACHE_HOME is unset; <hash> is derived from ROOT's
       absolute path, so each dataset gets its own file)

:func:`ensure_manifest` is how a training job gets its manifest: it takes
the pre-screen options as one :class:`ScanSpec`, lets one scan of a manifest
run at a time (a file lock), and under ``torch.distributed`` scans on global
rank 0 only; the other ranks wait and then read. In a multi-node job whose
ROOT is not writable, pass a ``ScanSpec(manifest_path=...)`` on a shared file
system.

The test-only fault hook (``DALILOAD_TEST_PROBE_FAULT``) is described in
:mod:`daliload.prescreen.probe_pool`; :func:`scan` reads it when it starts.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

from daliload import dist
from daliload.prescreen.manifest import Manifest
from daliload.prescreen.probe_pool import FAULT_ENV, ProbeTask, probe_into
from daliload.prescreen.rows import FileRecord
from daliload.prescreen.confirm import confirm_classes, gpu_visible
from daliload.prescreen.gpus import resolve_gpu
from daliload.prescreen.rules import ROUTES, Device, check_device
from daliload.processes import refuse_bootstrapping_main, usable_cores

logger = logging.getLogger(__name__)

#: How long other ranks wait for rank 0's scan in :func:`ensure_manifest` (seconds).
SCAN_WAIT_S = 12 * 3600

#: Per-file time limits (seconds) when ``timeout_s`` is not given.
PROBE_TIMEOUT_S = 30.0
DEEP_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class ScanSpec:
    """How the pre-screen runs when a job is given a dataset root (:func:`ensure_manifest`).

    Attributes:
        manifest_path: where the manifest lives; default
            :func:`default_manifest_path` of the root.
        deep: also decode a window at each end of every file and check that seeking to its last
            keyframe is exact (``daliload scan --deep``).
        workers: probing processes; default one per core.
    """

    manifest_path: str | os.PathLike | None = None
    deep: bool = False
    workers: int | None = None


@dataclass(frozen=True)
class ScanSummary:
    """What a scan found.

    Attributes:
        manifest_path: the manifest written.
        device: the route target routes are summarized for.
        gpu: on a GPU target, the GPU the routes are for (and whether it was assumed).
        deep: whether the deep check ran.
        splits: the splits scanned.
        total: files in those splits.
        probed: files probed this time (new, changed, or not yet deep-checked).
        reused: files taken unchanged from the manifest.
        removed: manifest rows dropped because their file left the dataset.
        missing: files the dataset index lists that do not exist (never stored).
        skipped: ``(path, reason)`` of every entry of a split folder that was
            not scanned (not a video extension, hidden, outside a class
            folder), sorted by path; never stored in the manifest.
        files: files per route (``dali``, ``fallback``, ``bad``).
        hours: hours of video per route.
        reasons: files per ``(route, reason)``, for non-empty reasons.
        elapsed_s: wall time of the scan in seconds.
    """

    manifest_path: Path
    device: Device
    deep: bool
    splits: tuple[str, ...]
    total: int
    probed: int
    reused: int
    removed: int
    missing: int
    files: Mapping[str, int] = field(default_factory=dict)
    hours: Mapping[str, float] = field(default_factory=dict)
    reasons: Mapping[tuple[str, str], int] = field(default_factory=dict)
    elapsed_s: float = 0.0
    skipped: tuple[tuple[str, str], ...] = ()
    gpu: str = ""

    def format(self) -> str:
        """A short human-readable report (what ``daliload scan`` prints)."""
        lines = [
            f"manifest: {self.manifest_path}",
            f"device: {self.device}{' (deep check)' if self.deep else ''}   "
            f"splits: {', '.join(self.splits)}",
            *([f"routes decided for GPU: {self.gpu}"] if self.gpu else []),
            f"files: {self.total} ({self.probed} probed, {self.reused} unchanged, "
            f"{self.removed} removed, "
            f"{self.missing} listed but missing) in {self.elapsed_s:.1f} s",
            "",
            "| route | files | hours |",
            "|---|---:|---:|",
        ]
        for route in ROUTES:
            lines.append(
                f"| {route} | {self.files.get(route, 0)} | {self.hours.get(route, 0.0):.2f} |"
            )
        if self.reasons:
            lines += ["", "| route | reason | files |", "|---|---|---:|"]
            for (route, reason), count in sorted(
                self.reasons.items(), key=lambda kv: (-kv[1], kv[0])
            ):
                lines.append(f"| {route} | {reason} | {count} |")
        return "\n".join(lines + self._format_skipped())

    def _format_skipped(self, shown: int = 10) -> list[str]:
        """The files not scanned: a count per reason, then the first ``shown`` with their reason."""
        if not self.skipped:
            return []
        counts: dict[str, int] = {}
        for _, reason in self.skipped:
            counts[reason] = counts.get(reason, 0) + 1
        lines = ["", f"skipped, not scanned: {len(self.skipped)} file(s)", "", "| reason | files |", "|---|---:|"]
        lines += [f"| {reason} | {n} |" for reason, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
        lines += [""] + [f"  {path}: {reason}" for path, reason in self.skipped[:shown]]
        if len(self.skipped) > shown:
            lines.append(f"  ... and {len(self.skipped) - shown} more (all in --json)")
        return lines


def default_manifest_path(root: str | os.PathLike) -> Path:
    """Where the manifest of ``root`` lives by default (see the module docstring)."""
    root_path = Path(os.path.abspath(root))
    local = root_path / ".daliload"
    if os.access(local if local.is_dir() else root_path, os.W_OK):
        return local / "manifest.sqlite"
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    key = hashlib.sha256(str(root_path).encode()).hexdigest()[:16]
    return cache / "daliload" / "manifests" / f"{root_path.name or 'root'}-{key}.sqlite"


def default_workers() -> int:
    """Worker processes for a scan: the CPU cores this process may use."""
    return usable_cores()


def _records_from_root(root: Path, splits: Sequence[str], manifest_path: str | os.PathLike) -> _Listing:
    """What a scan of ``root`` covers, through the dataset index."""
    from daliload.index import load_index

    records: list[Any] = []
    classes: tuple[str, ...] | None = None
    found: list[str] = []
    missing = 0
    skipped: list[tuple[str, str]] = []
    first_error: FileNotFoundError | None = None
    for split in splits:
        try:
            index = load_index(root, split)
        except FileNotFoundError as err:
            first_error = first_error or err
            logger.info("split %r skipped: %s", split, err)
            continue
        if classes is not None and index.classes != classes:
            raise ValueError(
                f"split {split!r} of {root} has a different class map than the other splits"
            )
        classes = index.classes
        records.extend(index.records)
        found.append(index.split)
        missing += len(index.missing)
        skipped += index.skipped
    if not found:
        raise FileNotFoundError(
            f"none of the splits {list(splits)} found under {root}: {first_error}"
        ) from first_error
    return _Listing(records, classes or (), found, missing, manifest_path, tuple(sorted(skipped)))


def _classes_from_records(records: Sequence[Any]) -> tuple[str, ...]:
    """The class map of explicit records: ``classes[label] = class_name`` ("" for unused labels)."""
    names: dict[int, str] = {}
    for rec in records:
        previous = names.setdefault(int(rec.label), rec.class_name)
        if previous != rec.class_name:
            raise ValueError(
                f"label {rec.label} names two classes: {previous!r} and {rec.class_name!r} "
                f"({rec.path})"
            )
    return tuple(names.get(i, "") for i in range(max(names) + 1)) if names else ()


def _file_record(rec: Any) -> FileRecord:
    path = os.path.abspath(rec.path)
    try:
        st = os.stat(path)
        size, mtime = st.st_size, st.st_mtime_ns
    except OSError:
        size, mtime = -1, -1  # the probe will say why it cannot be opened
    return FileRecord(
        path,
        size,
        mtime,
        rec.split,
        int(rec.label),
        rec.class_name,
        getattr(rec, "youtube_id", None),
        getattr(rec, "time_start", None),
        getattr(rec, "time_end", None),
    )


def scan(
    source: str | os.PathLike | Iterable[Any],
    *,
    manifest_path: str | os.PathLike | None = None,
    device: Device,
    deep: bool = False,
    workers: int | None = None,
    splits: Sequence[str] = ("train", "val"),
    progress: bool = True,
    timeout_s: float | None = None,
    chunk_size: int = 256,
    gpu_model: str | None = None,
) -> ScanSummary:
    """Probe a dataset's files and write or update its manifest.

    Args:
        source: the dataset root (listed with :func:`daliload.index.load_index`),
            or records with ``path``, ``label``, ``class_name`` and ``split``
            attributes (``youtube_id``, ``time_start``, ``time_end`` optional),
            such as :class:`daliload.index.VideoRecord`.
        manifest_path: the SQLite file; default :func:`default_manifest_path`
            of the root (required when ``source`` is a list of records).
        device: route for ``"gpu"`` (DALI with NVDEC), ``"gpu:<generation>"``
            or ``"cpu"``. Routes for ``"gpu"`` and ``"cpu"`` are stored for every
            file (other generations are routed from the stored facts when
            asked for); this one is summarized and deep-checked.
        gpu_model: with ``device="gpu"``, the GPU the routes are for: a model
            (``"H200"``, ``"L40S"``), a generation, or ``"auto"`` (the visible
            GPU); see :mod:`daliload.prescreen.gpus`. ``None``: the default
            generation (no AV1), which the summary says was assumed.
        deep: also decode a window at each end of each file with its routed
            decoder and reroute on failure (see :mod:`daliload.prescreen.deep`).
        workers: probe processes; default one per usable CPU core; ``0`` probes
            in this process (no timeout protection; for debugging).
        splits: the splits to scan; splits a root does not have are skipped
            (at least one must exist). Records of other splits are ignored.
        progress: show a progress bar (rate, ETA) on stderr.
        timeout_s: per-file limit in seconds; default 30 (120 with ``deep``).
        chunk_size: files per committed transaction.

    Returns:
        :class:`ScanSummary`.

    Raises:
        ValueError: bad ``device``, ``workers``, ``chunk_size``; records given
            without ``manifest_path``; no record in ``splits``; ``deep`` on a
            GPU target where torch sees no GPU.
        FileNotFoundError: the root has none of ``splits``.
    """
    refuse_bootstrapping_main("A daliload scan")
    device, gpu = _route_target(device, gpu_model)
    device, workers, splits, timeout_s = _checked_options(device, workers, chunk_size, splits,
                                                          deep, timeout_s)  # fmt: skip
    started = time.monotonic()
    listing = _list_source(source, splits, manifest_path)
    fault = os.environ.get(FAULT_ENV, "")
    device_id = dist.local_rank()
    with Manifest(listing.manifest_path, writable=True) as manifest:
        changes = _find_changes(manifest, listing.records, device, deep)
        manifest.update_meta(changes.relabelled)
        tasks = [ProbeTask(i, rec.path, device if deep else None, device_id=device_id, fault=fault)
                 for i, rec in enumerate(changes.to_probe)]  # fmt: skip
        probe_into(
            manifest,
            changes.to_probe,
            tasks,
            workers=workers,
            timeout_s=timeout_s,
            progress=progress,
            chunk_size=chunk_size,
            desc=f"scan {device}{' deep' if deep else ''}",
        )
        removed = manifest.remove_missing(changes.listed, listing.splits)
        manifest.set_classes(listing.classes)
        if device.startswith("gpu") and gpu_visible():
            # The table's promise checked on this GPU: one test decode per new class, cached.
            confirm_classes(manifest, device, device_id=device_id)
            gpu += "; each class confirmed by a test decode on this GPU"
        files, hours, reasons = manifest.route_totals(device, listing.splits)
        summary = ScanSummary(
            manifest_path=manifest.path,
            device=device,
            deep=deep,
            splits=tuple(listing.splits),
            total=len(changes.listed),
            probed=len(tasks),
            reused=len(changes.listed) - len(tasks),
            removed=removed,
            missing=listing.missing,
            files=files,
            hours=hours,
            reasons=reasons,
            elapsed_s=time.monotonic() - started,
            skipped=listing.skipped,
            gpu=gpu,
        )
        manifest.finish_scan(
            {
                "device": device,
                "deep": deep,
                "splits": list(listing.splits),
                "total": len(changes.listed),
                "probed": len(tasks),
                "finished_at": time.time(),
            }
        )
    return summary


def _route_target(device: Device, gpu_model: str | None) -> tuple[Device, str]:
    """The route target of ``device`` and ``gpu_model``, and a phrase naming the GPU (``""`` on the CPU)."""
    if gpu_model is not None and device != "gpu":
        raise ValueError(f"gpu_model={gpu_model!r} needs device='gpu', got device={device!r}")
    if device == "gpu":
        target = resolve_gpu(gpu_model)
        return ("gpu" if target.assumed else target.route_target), target.describe()
    if device.startswith("gpu:"):
        return device, resolve_gpu(device[4:]).describe()
    return device, ""


def _checked_options(
    device: Device,
    workers: int | None,
    chunk_size: int,
    splits: Sequence[str],
    deep: bool,
    timeout_s: float | None,
) -> tuple[Device, int, Sequence[str], float]:
    """:func:`scan`'s options validated, defaults filled in: ``(device, workers, splits, timeout_s)``."""
    device = check_device(device)
    if workers is None:
        workers = default_workers()
    if not isinstance(workers, int) or workers < 0:
        raise ValueError(f"workers must be an int >= 0, got {workers!r}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if isinstance(splits, str):
        splits = (splits,)
    if not splits:
        raise ValueError("splits is empty; name at least one split, e.g. ('train',)")
    timeout_s = (
        timeout_s if timeout_s is not None else (DEEP_TIMEOUT_S if deep else PROBE_TIMEOUT_S)
    )
    if deep and device.startswith("gpu") and not _cuda_visible():
        raise ValueError(f"a deep scan for device {device!r} decodes on the GPU, and torch sees no CUDA GPU "
                         f"here; run it on a GPU host, or scan without deep (routes from the probe's facts)")
    return device, workers, splits, timeout_s


def _cuda_visible() -> bool:
    import torch

    return torch.cuda.is_available()


class _Listing(NamedTuple):
    """What a scan covers, before any file is looked at."""

    records: list[Any]  # the dataset index's records of the scanned splits
    classes: tuple[str, ...]  # the class map: classes[label] = class name
    splits: list[str]  # the splits found (a root may lack some of those asked for)
    missing: int  # files the index lists that do not exist
    manifest_path: str | os.PathLike
    skipped: tuple[tuple[str, str], ...] = ()  # entries of split folders not scanned, with the reason


def _list_source(source: str | os.PathLike | Iterable[Any], splits: Sequence[str],
                 manifest_path: str | os.PathLike | None) -> _Listing:  # fmt: skip
    """List a dataset root through its index, or take explicit records (see :func:`scan`)."""
    if isinstance(source, (str, os.PathLike)):
        root = Path(os.path.abspath(source))
        return _records_from_root(root, splits, manifest_path if manifest_path is not None
                                  else default_manifest_path(root))
    all_records = list(source)
    records = [r for r in all_records if r.split in splits]
    if all_records and not records:
        raise ValueError(
            f"none of the {len(all_records)} records is in splits {tuple(splits)}; "
            f"pass splits= with their split names"
        )
    if manifest_path is None:
        raise ValueError(
            "manifest_path is required when scanning a list of records (there is no root "
            "to put the manifest under)"
        )
    return _Listing(records, _classes_from_records(records), sorted({r.split for r in records}), 0,
                    manifest_path)  # fmt: skip


class _Changes(NamedTuple):
    """How the listed files compare with the manifest."""

    to_probe: list[FileRecord]  # new, changed, or due a (deep) probe again
    relabelled: list[FileRecord]  # unchanged files whose index metadata changed
    listed: set[str]  # absolute paths of every listed file


def _find_changes(manifest: Manifest, records: Sequence[Any], device: Device, deep: bool) -> _Changes:
    """``stat`` every listed file and decide which ones to probe.

    A stored file is reused when its size and mtime are unchanged, it is
    deep-checked on ``device`` if ``deep`` asks for that, and its stored verdict
    is not a hung, crashed or raising probe (:meth:`Manifest.transient_failures`).
    """
    known = manifest.known_files()
    retry = manifest.transient_failures()
    changes = _Changes([], [], set())
    for rec in records:
        file_rec = _file_record(rec)
        changes.listed.add(file_rec.path)
        old = known.get(file_rec.path)
        if (
            old is not None
            and (old.size_bytes, old.mtime_ns) == (file_rec.size_bytes, file_rec.mtime_ns)
            and (not deep or device in old.deep_devices)
            and file_rec.path not in retry
        ):
            if old.meta != file_rec.meta():
                changes.relabelled.append(file_rec)
            continue
        changes.to_probe.append(file_rec)
    return changes


def ensure_manifest(
    root: str | os.PathLike,
    *,
    device: Device,
    scan: ScanSpec = ScanSpec(),
    splits: Sequence[str] = ("train", "val"),
    progress: bool | None = None,
) -> Path:
    """Bring the manifest of ``root`` up to date, once per job, and return its path.

    Under an initialized ``torch.distributed`` process group, global rank 0
    scans (probing only new or changed files) while the other ranks wait for it
    (up to :data:`SCAN_WAIT_S`, on a gloo group of their own) and then get its manifest path; if
    rank 0 fails, every rank raises. Without a process group this process scans.

    Args:
        root: dataset root.
        device: ``"gpu"`` or ``"cpu"``, as in :func:`scan`.
        scan: where the manifest lives (default :func:`default_manifest_path`
            on rank 0), whether to deep-check, how many probe processes.
        splits: as in :func:`scan`.
        progress: progress bar; default on rank 0 only.

    Returns:
        The manifest's path (rank 0's, on every rank).

    Raises:
        RuntimeError: on ranks other than 0, when rank 0's scan failed.
    """
    refuse_bootstrapping_main(f"A daliload loader (its scan of {root})")
    check_device(device)
    path = Path(scan.manifest_path) if scan.manifest_path is not None else default_manifest_path(root)
    progress = True if progress is None else progress
    if not dist.is_distributed():
        _scan_one_at_a_time(root, path, device, scan, splits, progress)
        return path
    # A first scan of a large dataset outlasts the default group's timeout (often 10
    # minutes with NCCL): the other ranks wait on a gloo group that allows SCAN_WAIT_S.
    group = dist.patient_group(SCAN_WAIT_S)
    status: tuple[str, str] = ("ok", str(path))
    if dist.rank() == 0:
        try:
            _scan_one_at_a_time(root, path, device, scan, splits, progress)
        except BaseException as err:
            # release the waiting ranks
            dist.broadcast_object(("error", f"{type(err).__name__}: {err}"), group=group)
            raise
    status = dist.broadcast_object(status, group=group)
    if status[0] != "ok":
        raise RuntimeError(f"rank 0 failed to scan {root}: {status[1]}")
    return Path(status[1])


def _scan_one_at_a_time(root: str | os.PathLike, path: Path, device: Device, spec: ScanSpec,
                        splits: Sequence[str], progress: bool) -> None:  # fmt: skip
    """:func:`scan` under an exclusive lock on ``path`` + ``".lock"``.

    One scan per manifest at a time, also across processes that share no process
    group (torchrun ranks before init_process_group, several jobs on one dataset):
    the others wait here, then find nothing left to probe and read the same result.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            scan(root, manifest_path=path, device=device, deep=spec.deep, workers=spec.workers,
                 splits=splits, progress=progress)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
