"""The scan: probe every file of a dataset in parallel and keep the manifest up to date.

(About 600 lines for one concept, a scan run: listing, change detection,
probing and the summary; probing in worker processes is :mod:`.probe_pool`,
how a job gets its manifest once is :mod:`.ensure`, merging the manifests of
a scan spread over machines :mod:`.merge`.)

:func:`scan` lists the dataset (through :func:`daliload.index.load_index`, or
an explicit list of records), ``stat``s every file, and probes only files that
are new or whose size or modification time changed (plus files not yet
deep-checked on the device when ``deep=True``, and, with ``retry_bad=True``,
every file marked ``bad``). Probing runs in worker processes
(:mod:`daliload.prescreen.probe_pool`): a file that hangs the probe past
``timeout_s`` is stored as ``bad`` with reason ``"timeout"``, one that kills
its worker as ``bad`` with reason ``"crash"``; the scan goes on, and the next
scans keep those verdicts (two jobs on unchanged files see the same videos)
until ``daliload scan --retry-bad``. Results are committed every
``chunk_size`` files (or every couple of seconds), so a scan stopped at any
point resumes where it stopped.

A scan that finds nothing changed is cheap: it compares a digest of what it
listed (paths, sizes, mtimes, labels) with the one the last scan of the same
splits stored, and writes only its summary. ``shard=Shard(i, n)`` scans the
files of share ``i`` of ``n`` (by path hash, :mod:`daliload.shard`) into a
manifest of their own, which :func:`daliload.prescreen.merge.merge_manifests`
joins with the others'.

Where the manifest goes by default (:func:`default_manifest_path`)::

    ROOT/.daliload/manifest.sqlite                     if ROOT is writable
    $XDG_CACHE_HOME/daliload/manifests/<name>-<hash>.sqlite   otherwise
      (~/.cache when XDG_CACHE_HOME is unset; <hash> is derived from ROOT's
       absolute path, so each dataset gets its own file)

The test-only fault hook (``DALILOAD_TEST_PROBE_FAULT``) is described in
:mod:`daliload.prescreen.probe_pool`; :func:`scan` reads it when it starts.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Sequence

import numpy as np

from daliload import dist
from daliload.prescreen.manifest import Manifest
from daliload.prescreen.probe_pool import FAULT_ENV, ProbeTask, probe_into
from daliload.prescreen.rows import FileRecord
from daliload.prescreen.confirm import confirm_classes, gpu_visible
from daliload.prescreen.gpus import resolve_gpu
from daliload.prescreen.rules import ROUTES, RULES_VERSION, Device, check_device
from daliload.processes import refuse_bootstrapping_main, usable_cores
from daliload.shard import ALL_FILES, Shard

logger = logging.getLogger(__name__)

#: Per-file time limits (seconds) when ``timeout_s`` is not given.
PROBE_TIMEOUT_S = 30.0
DEEP_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class ScanSpec:
    """How a job gets its manifest (:func:`daliload.prescreen.ensure_manifest`).

    Attributes:
        manifest_path: where the manifest lives; default the root's own
            (``ROOT/.daliload/manifest.sqlite``, read in place even on
            read-only storage), else :func:`default_manifest_path`.
        deep: also decode a window at each end of every file and check that seeking to its last
            keyframe is exact (``daliload scan --deep``).
        workers: probing processes; default one per core.
        check: look for changed files before a job uses the manifest (default
            True): a root is listed and compared with it, once per job however
            many loaders the job builds; a manifest given as the source has a
            sample of its files checked, and a warning says if they changed.
            ``False`` trusts the manifest as it is (a root without one is still scanned).
        retry_bad: probe again every file marked ``bad`` (``daliload scan --retry-bad``);
            otherwise a file whose probe timed out or crashed keeps that
            verdict until it changes, so every job sees the same videos.
    """

    manifest_path: str | os.PathLike | None = None
    deep: bool = False
    workers: int | None = None
    check: bool = True
    retry_bad: bool = False


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
        shard: the share of the files scanned (``"I/N"``; ``"0/1"``: all).
        transient: files marked ``bad`` because their probe timed out, crashed
            or raised, kept as they are (``retry_bad`` probes them again).
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
    shard: str = "0/1"
    transient: int = 0

    def format(self) -> str:
        """A short human-readable report (what ``daliload scan`` prints)."""
        lines = [
            f"manifest: {self.manifest_path}",
            f"device: {self.device}{' (deep check)' if self.deep else ''}   "
            f"splits: {', '.join(self.splits)}",
            *([f"routes decided for GPU: {self.gpu}"] if self.gpu else []),
            *([f"shard: {self.shard} of the files (merge the parts: daliload scan --merge PART... "
               "--manifest OUT)"] if self.shard != "0/1" else []),
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
        if self.transient:
            lines += ["", f"{self.transient} file(s) are bad because their probe timed out, crashed or raised; "
                          "they keep that verdict until `daliload scan --retry-bad` probes them again"]
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
    return cache_manifest_path(root_path)


def cache_manifest_path(root: str | os.PathLike) -> Path:
    """The per-user cache file of ``root``'s manifest (for roots on read-only storage)."""
    root_path = Path(os.path.abspath(root))
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    key = hashlib.sha256(str(root_path).encode()).hexdigest()[:16]
    return cache / "daliload" / "manifests" / f"{root_path.name or 'root'}-{key}.sqlite"


def default_workers() -> int:
    """Worker processes for a scan: the CPU cores this process may use."""
    return usable_cores()


def check_root(root: str | os.PathLike) -> Path:
    """``root`` as an absolute path, if it is a folder.

    Raises:
        FileNotFoundError: it does not exist.
        ValueError: it is a file (a video, say), with what to pass instead.
    """
    path = Path(os.path.abspath(root))
    if path.is_dir():
        return path
    if path.exists():
        raise ValueError(f"dataset root {path} is a file, not a folder: pass the folder that holds train/ and val/ "
                         f"(or the annotation CSVs or list files), e.g. {path.parent}, or a manifest written by "
                         "`daliload scan` (a .sqlite file)")
    raise FileNotFoundError(f"dataset root {path} does not exist")


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
    return _Listing(records, classes or (), found, missing, manifest_path, tuple(sorted(skipped)), str(root))


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


class _Listed(NamedTuple):
    """The files a scan covers, sorted by path, with what ``stat`` said of each (-1: it could not be read)."""

    records: list[Any]
    sizes: np.ndarray
    mtimes: np.ndarray

    def file_record(self, i: int) -> FileRecord:
        rec = self.records[i]
        return FileRecord(rec.path, int(self.sizes[i]), int(self.mtimes[i]), rec.split, int(rec.label),
                          rec.class_name, getattr(rec, "youtube_id", None), getattr(rec, "time_start", None),
                          getattr(rec, "time_end", None))

    def file_records(self) -> list[FileRecord]:
        return [self.file_record(i) for i in range(len(self.records))]


def _stat_records(records: Sequence[Any], root: str | None, shard: Shard) -> _Listed:
    """``stat`` each record of ``shard`` (files of a root are in a share by their path under it)."""
    if root is None:  # explicit records: make their paths absolute, as the manifest keeps them
        records = [rec._replace(path=os.path.abspath(rec.path)) if hasattr(rec, "_replace")
                   else _Record(os.path.abspath(rec.path), rec) for rec in records]
    elif shard.count > 1:
        records = [rec for rec in records if shard.holds(os.path.relpath(rec.path, root).replace(os.sep, "/"))]
    if any(records[i].path > records[i + 1].path for i in range(len(records) - 1)):
        records = sorted(records, key=lambda r: r.path)
    sizes, mtimes = np.empty(len(records), np.int64), np.empty(len(records), np.int64)
    for i, rec in enumerate(records):
        try:
            st = os.stat(rec.path)
            sizes[i], mtimes[i] = st.st_size, st.st_mtime_ns
        except OSError:
            sizes[i] = mtimes[i] = -1  # the probe will say why it cannot be opened
    return _Listed(list(records), sizes, mtimes)


class _Record:
    """A record given by the caller, with its path made absolute."""

    def __init__(self, path: str, rec: Any) -> None:
        self.path, self._rec = path, rec

    def __getattr__(self, name: str) -> Any:
        return getattr(self._rec, name)


def listing_digest(listed: _Listed, *, splits: Sequence[str], shard: Shard, deep_device: str | None) -> str:
    """A digest of what a scan listed: every file's path, size, mtime and index metadata, and what was asked.

    Equal digests, with nothing written to the manifest since the scan that
    stored it, mean a scan has nothing to do. About 1 us a file.
    """
    records = listed.records
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{RULES_VERSION}|{sorted(splits)}|{shard}|{deep_device}|{len(records)}".encode())
    h.update("\0".join(r.path for r in records).encode("utf-8", "surrogateescape"))
    h.update(listed.sizes.tobytes())
    h.update(listed.mtimes.tobytes())
    h.update("\0".join(f"{r.split}\t{r.label}\t{r.class_name}\t{getattr(r, 'youtube_id', None)}\t"
                       f"{getattr(r, 'time_start', None)}\t{getattr(r, 'time_end', None)}"
                       for r in records).encode("utf-8", "surrogateescape"))
    return h.hexdigest()


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
    retry_bad: bool = False,
    shard: Shard = ALL_FILES,
    job: str | None = None,
    on_progress: Callable[[int, int], None] | None = None,
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
            file, and for this target too; this one is summarized and deep-checked.
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
        retry_bad: probe again every file marked ``bad`` (a probe that timed
            out or crashed keeps its verdict otherwise).
        shard: scan only this share of a root's files (by path hash) into a
            manifest of their own; :func:`daliload.prescreen.merge.merge_manifests`
            joins the shares' manifests. Default: every file.
        job: names the job this scan checks the dataset for (recorded in the
            summary; :func:`~daliload.prescreen.ensure_manifest` uses it).
        on_progress: called with ``(files probed, files to probe)`` as the
            probe goes (what a process waiting for this scan is told).

    Returns:
        :class:`ScanSummary`.

    Raises:
        ValueError: bad ``device``, ``workers``, ``chunk_size``; records given
            without ``manifest_path`` or with a ``shard``; no record in
            ``splits``; ``deep`` on a GPU target where torch sees no GPU; a
            manifest that holds another shard or root; a root that is a file.
        FileNotFoundError: the root, or all of ``splits`` under it, is missing.
        OSError: ``ENOSPC``, the manifest's disk is full (what was stored is kept).
    """
    refuse_bootstrapping_main("A daliload scan")
    device, gpu = _route_target(device, gpu_model)
    device, workers, splits, timeout_s = _checked_options(device, workers, chunk_size, splits,
                                                          deep, timeout_s)  # fmt: skip
    started = time.monotonic()
    listing = _list_source(source, splits, manifest_path)
    if shard.count > 1 and listing.root is None:
        raise ValueError(f"shard={shard} needs a dataset root (a share is chosen by the path under the root)")
    listed = _stat_records(listing.records, listing.root, shard)
    digest = listing_digest(listed, splits=listing.splits, shard=shard, deep_device=device if deep else None)
    fault = os.environ.get(FAULT_ENV, "")
    device_id = dist.local_rank()
    with Manifest(listing.manifest_path, writable=True) as manifest:
        _check_part(manifest, shard, listing.root)
        known = manifest.current_meta("listing")
        unchanged = not retry_bad and known is not None and known.get("digest") == digest
        changes = _Changes([], [], None) if unchanged else _find_changes(manifest, listed, device, deep, retry_bad)
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
            on_progress=on_progress,
        )
        removed = 0 if unchanged else manifest.remove_missing({r.path for r in listed.records}, listing.splits)
        manifest.set_classes(listing.classes)
        manifest.route_every_file_for(device)
        if device.startswith("gpu") and gpu_visible():
            # The table's promise checked on this GPU: one test decode per new class, cached.
            confirm_classes(manifest, device, device_id=device_id)
            gpu += "; each class confirmed by a test decode on this GPU"
        totals = known["totals"] if unchanged and known.get("device") == device else None
        files_, hours, reasons = totals_from_json(totals) if totals else manifest.route_totals(device, listing.splits)
        transient = len(manifest.transient_failures())
        summary = ScanSummary(
            manifest_path=manifest.path,
            device=device,
            deep=deep,
            splits=tuple(listing.splits),
            total=len(listed.records),
            probed=len(tasks),
            reused=len(listed.records) - len(tasks),
            removed=removed,
            missing=listing.missing,
            files=files_,
            hours=hours,
            reasons=reasons,
            elapsed_s=time.monotonic() - started,
            skipped=listing.skipped,
            gpu=gpu,
            shard=str(shard),
            transient=transient,
        )
        manifest.finish_scan(
            {
                "device": device,
                "deep": deep,
                "splits": list(listing.splits),
                "asked": list(splits),
                "total": len(listed.records),
                "probed": len(tasks),
                "shard": str(shard),
                "job": job,
                "finished_at": time.time(),
            },
            listing={"digest": digest, "device": device,
                     "totals": [dict(files_), dict(hours), [[*key, n] for key, n in reasons.items()]]},
        )
    return summary


def totals_from_json(totals: list) -> tuple[dict[str, int], dict[str, float], dict[tuple[str, str], int]]:
    """:meth:`Manifest.route_totals` as a scan stored it with its listing."""
    files, hours, reasons = totals
    return dict(files), dict(hours), {(route, reason): n for route, reason, n in reasons}


def _check_part(manifest: Manifest, shard: Shard, root: str | None) -> None:
    """Record which share of which root a manifest holds; refuse to mix shares in one manifest.

    A scan of all the files may move a manifest to another root (the files
    of the old one are then removed as missing); a share's manifest holds
    that share of that root only.
    """
    if root is None:
        return
    part = manifest.part
    mine = {"shard": str(shard), "root": root}
    if part == mine:
        return
    if shard.count == 1 and (part is None or part["shard"] == "0/1"):
        manifest.set_part(str(shard), root)
        return
    if part is None and len(manifest) == 0:
        manifest.set_part(str(shard), root)
        return
    what = "files" if part is None else ("all files" if part["shard"] == "0/1" else f"shard {part['shard']}")
    of = "" if part is None else f" of {part['root']}"
    raise ValueError(f"manifest {manifest.path} holds {what}{of}; this scan is of shard {shard} of {root}: give "
                     "each shard its own --manifest, and merge them with `daliload scan --merge`")


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
    root: str | None = None  # the dataset root (absolute), when the source is one


def _list_source(source: str | os.PathLike | Iterable[Any], splits: Sequence[str],
                 manifest_path: str | os.PathLike | None) -> _Listing:  # fmt: skip
    """List a dataset root through its index, or take explicit records (see :func:`scan`)."""
    if isinstance(source, (str, os.PathLike)):
        root = check_root(source)
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
    listed: set[str] | None  # absolute paths of every listed file (None: the listing did not change)


def _find_changes(manifest: Manifest, listed: _Listed, device: Device, deep: bool, retry_bad: bool) -> _Changes:
    """Compare the ``stat``-ed files with the manifest and decide which ones to probe.

    A stored file is reused when its size and mtime are unchanged, it is
    deep-checked on ``device`` if ``deep`` asks for that, and (with
    ``retry_bad``) it is not marked ``bad``.
    """
    known = manifest.known_files(deep=deep)
    retry = manifest.bad_files() if retry_bad else set()
    changes = _Changes([], [], set())
    sizes, mtimes = listed.sizes.tolist(), listed.mtimes.tolist()
    for i, rec in enumerate(listed.records):
        old = known.get(rec.path)
        if old is not None and old[0] == sizes[i] and old[1] == mtimes[i] \
                and (not deep or device in old.deep_devices) and rec.path not in retry:
            file_rec = listed.file_record(i)
            if tuple(old[2]) != file_rec.meta():
                changes.relabelled.append(file_rec)
            continue
        changes.to_probe.append(listed.file_record(i))
    return changes


def check_changes(source: str | os.PathLike, manifest_path: str | os.PathLike, *, device: Device,
                  splits: Sequence[str], deep: bool = False) -> int:
    """How many files a scan of ``source`` into ``manifest_path`` would probe, relabel or remove (0: none).

    Reads the manifest only (it may be on read-only storage).
    """
    listing = _list_source(source, splits, manifest_path)
    with Manifest(manifest_path) as manifest:
        part = manifest.part
        shard = Shard(*map(int, part["shard"].split("/"))) if part else ALL_FILES
        listed = _stat_records(listing.records, listing.root, shard)
        digest = listing_digest(listed, splits=listing.splits, shard=shard, deep_device=device if deep else None)
        known = manifest.current_meta("listing")
        if known is not None and known.get("digest") == digest:
            return 0
        changes = _find_changes(manifest, listed, device, deep, retry_bad=False)
        stored = {path for path, split in manifest.paths_and_splits() if split in listing.splits}
    return len(changes.to_probe) + len(changes.relabelled) + len(stored - {r.path for r in listed.records})
