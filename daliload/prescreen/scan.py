"""The scan: probe every file of a dataset in parallel and keep the manifest up to date.

:func:`scan` runs a scan from its options to its :class:`ScanSummary`; the
options a job passes are a :class:`ScanSpec`. What it covers and which files
changed is :mod:`.scan_listing`; probing in worker processes is
:mod:`.probe_pool`, how a job gets its manifest once is :mod:`.ensure`,
merging the manifests of a scan spread over machines :mod:`.merge`.

:func:`scan` lists the dataset (through :func:`daliload.dataset.load_index`, or
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
files of share ``i`` of ``n`` (by path hash, :mod:`daliload.dataset._shard`) into a
manifest of their own, which :func:`daliload.prescreen.merge.merge_manifests`
joins with the others'.

Where the manifest goes by default (:func:`default_manifest_path`)::

    ROOT/.daliload/manifest.sqlite                     if ROOT is writable
    $XDG_CACHE_HOME/daliload/manifests/<name>-<hash>.sqlite   otherwise
      (~/.cache when XDG_CACHE_HOME is unset; <hash> is derived from ROOT's
       absolute path, so each dataset gets its own file)

Tests make chosen files' probes hang, crash or raise with a test double of
the probe workers' task (:func:`daliload.testing.probe_faults`), not with a
switch in the scan.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from daliload import runtime
from daliload.prescreen.manifest import Manifest
from daliload.prescreen.probe_pool import ProbeTask, probe_into
from daliload.prescreen.confirm import confirm_classes, gpu_visible
from daliload.prescreen.gpus import resolve_gpu
from daliload.prescreen.rules import ROUTES, Device, check_device
from daliload.prescreen.scan_listing import (
    Changes,
    cache_manifest_path,
    check_changes,
    check_root,
    default_manifest_path,
    find_changes,
    list_source,
    listing_digest,
    stat_records,
)
from daliload.runtime import refuse_bootstrapping_main, usable_cores
from daliload.dataset import ALL_FILES, Shard, get_layout, printable_path

__all__ = ["PROBE_TIMEOUT_S", "DEEP_TIMEOUT_S", "ScanSpec", "ScanSummary", "scan", "default_workers",
           "totals_from_json", "default_manifest_path", "cache_manifest_path", "check_root", "check_changes"]


#: Per-file time limits (seconds) when ``timeout_s`` is not given.
PROBE_TIMEOUT_S = 30.0
DEEP_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class ScanSpec:
    """How a job gets its manifest (:func:`daliload.prescreen.ensure_manifest`).

    Attributes:
        manifest_path: where the manifest lives; default the root's own
            (``ROOT/.daliload/manifest.sqlite``, read in place even on
            read-only storage), else :func:`default_manifest_path`. A root on
            read-only storage with no manifest (or an out-of-date one) and no
            writable per-user cache needs one (the loader's ``PermissionError`` says so).
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
        layout: how the root is read: a name of :data:`daliload.dataset.LAYOUTS`
            (``"ucf101"``, ``"path_label"``, ...); ``None`` (default) detects it per split.
        fold: the official fold of UCF101 or HMDB51 (1..3; ``None``: 1). A
            fold's splits differ from another's, so each fold has a manifest of
            its own (``manifest-fold2.sqlite`` beside ``manifest.sqlite``).
    """

    manifest_path: str | os.PathLike | None = None
    deep: bool = False
    workers: int | None = None
    check: bool = True
    retry_bad: bool = False
    layout: str | None = None
    fold: int | None = None

    def __post_init__(self) -> None:
        if self.layout not in (None, "auto"):
            get_layout(self.layout)  # an unknown name is refused here, with the names there are
        if self.fold is not None and (isinstance(self.fold, bool) or not isinstance(self.fold, int) or self.fold < 1):
            raise ValueError(f"fold must be a number >= 1 (UCF101 and HMDB51 have 1..3) or None, got {self.fold!r}")


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
            f"manifest: {printable_path(self.manifest_path)}",  # stdout may take strict UTF-8 only
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
        lines += [""] + [f"  {printable_path(path)}: {reason}" for path, reason in self.skipped[:shown]]
        if len(self.skipped) > shown:
            lines.append(f"  ... and {len(self.skipped) - shown} more (all in --json)")
        return lines


def default_workers() -> int:
    """Worker processes for a scan: the CPU cores this process may use."""
    return usable_cores()


def scan(
    source: str | os.PathLike | Iterable[Any],
    *,
    manifest_path: str | os.PathLike | None = None,
    device: Device,
    deep: bool = False,
    workers: int | None = None,
    splits: Sequence[str] = ("train", "val"),
    progress: bool | None = True,
    timeout_s: float | None = None,
    chunk_size: int = 256,
    gpu_model: str | None = None,
    retry_bad: bool = False,
    shard: Shard = ALL_FILES,
    job: str | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    layout: str | None = None,
    fold: int | None = None,
) -> ScanSummary:
    """Probe a dataset's files and write or update its manifest.

    Args:
        source: the dataset root (listed with :func:`daliload.dataset.load_index`),
            or records with ``path``, ``label``, ``class_name`` and ``split``
            attributes (``youtube_id``, ``time_start``, ``time_end`` optional),
            such as :class:`daliload.dataset.VideoRecord`.
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
        progress: show a progress bar (rate, ETA) on stderr; ``None``: only when stderr is a terminal.
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
        layout, fold: how a root is read (:class:`ScanSpec`); default: detected, fold 1.

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
    listing = list_source(source, splits, manifest_path, layout=layout, fold=fold)
    if shard.count > 1 and listing.root is None:
        raise ValueError(f"shard={shard} needs a dataset root (a share is chosen by the path under the root)")
    listed = stat_records(listing.records, listing.root, shard)
    digest = listing_digest(listed, splits=listing.splits, shard=shard, deep_device=device if deep else None)
    device_id = runtime.local_rank()
    with Manifest(listing.manifest_path, writable=True) as manifest:
        _check_part(manifest, shard, listing.root)
        known = manifest.current_meta("listing")
        unchanged = not retry_bad and known is not None and known.get("digest") == digest
        changes = Changes([], [], None) if unchanged else find_changes(manifest, listed, device, deep, retry_bad)
        manifest.update_meta(changes.relabelled)
        tasks = [ProbeTask(i, rec.path, device if deep else None, device_id=device_id)
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
