"""How a training job gets its manifest: one check of the dataset per job, however many loaders it builds.

A job's loaders each ask for the manifest of the same root
(``examples/train_ddp.py`` builds three); :func:`ensure_manifest` checks the
dataset for changes once and answers the others from that:

- in one process, the later calls find the check done (per root and manifest,
  as long as neither was made again or written since);
- under ``torch.distributed``, global rank 0 checks while the others wait
  (up to :data:`SCAN_WAIT_S`, on a gloo group of their own) and get its answer;
- without a process group (ranks started by ``torchrun`` before
  ``init_process_group``, or a SLURM array), the ranks take turns on a file
  lock, and a rank that finds the manifest checked by another process of the
  same job moments ago (:func:`job_key`: ``torchrun``'s run id, SLURM's job
  and step) uses it as it is.

Where the manifest is::

    ScanSpec(manifest_path=...)             when given
    ROOT/.daliload/manifest.sqlite          when it exists, even on read-only storage
    ROOT/.daliload/manifest.sqlite          when ROOT is writable (created by the first scan)
    ~/.cache/daliload/manifests/...         otherwise (see :func:`.scan.cache_manifest_path`)

A manifest on read-only storage is read in place when no file changed since
it was written; when some did, a copy in the per-user cache is brought up to
date (only the changed files are probed) and used instead, and later jobs use
that copy while the read-only one stays as it is.

A manifest given to a loader as its root (:func:`check_manifest`) is
trusted after a cheap check: it is a whole scan, not one shard's, and a
sample of its files still has the size and mtime it recorded.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Sequence

from daliload import runtime
from daliload.dataset import VideoIndex, decoded_path, printable_path
from daliload.failures import Failure
from daliload.prescreen.manifest import Manifest
from daliload.prescreen.rules import Device, check_device
from daliload.prescreen.scan import ScanSpec, cache_manifest_path, check_changes, check_root, scan
from daliload.prescreen.scan_lock import (first_scan_notice, progress_choice, report_while, reporting, say,
                                           scan_lock)
from daliload.prescreen.sqlite_file import stamp
from daliload.runtime import refuse_bootstrapping_main
from daliload.stream import check_stores, is_remote, stat_video

logger = logging.getLogger(__name__)

#: How long other ranks wait for rank 0's scan in :func:`ensure_manifest` (seconds).
SCAN_WAIT_S = 12 * 3600
#: A check by another process of the same job counts for this long after it finished (seconds).
JOB_CHECK_FRESH_S = 600.0
#: Files of a manifest given as the source whose size and mtime are compared with the files.
SAMPLE_FILES = 64
#: The pre-screen's options when none are given.
DEFAULT_SPEC = ScanSpec()


@dataclass(frozen=True)
class _Checked:
    """A check this process did: which splits, how deep, the manifest it answered, and what the root and
    that manifest were then (a root made again, or a manifest written or deleted since, is checked again)."""

    splits: frozenset[str]
    deep: bool
    path: Path
    seen: tuple

    def holds(self, splits: Sequence[str], deep: bool, root: Path | None) -> bool:
        return (set(splits) <= self.splits and (self.deep or not deep)
                and _identity(root, self.path) == self.seen)


def _identity(root: Path | None, manifest: Path) -> tuple:
    """The root folder's device and inode, and the manifest's :func:`~.sqlite_file.stamp` (``None``: gone)."""
    try:
        folder = os.stat(root) if root is not None else None
        file = stamp(manifest)
    except OSError:
        return (None,)
    return (folder.st_dev, folder.st_ino) if folder is not None else None, file


_checked: dict[tuple[str, str], _Checked] = {}
_checked_lock = threading.Lock()


def job_key() -> str | None:
    """What the processes of one job share and those of another job do not, or ``None``.

    ``torchrun``'s run id (a new one per ``--standalone`` run), else SLURM's
    job and step, else ``MASTER_ADDR:MASTER_PORT`` of a job of several processes.
    """
    run = os.environ.get("TORCHELASTIC_RUN_ID")
    if run and run != "none":
        return f"torchrun:{run}"
    if os.environ.get("SLURM_JOB_ID"):
        return f"slurm:{os.environ['SLURM_JOB_ID']}.{os.environ.get('SLURM_STEP_ID', '')}"
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if addr and port and runtime.world_size() > 1:
        return f"master:{addr}:{port}"
    return None


def ensure_manifest(
    root: str | bytes | os.PathLike,
    *,
    device: Device,
    scan: ScanSpec = DEFAULT_SPEC,
    splits: Sequence[str] = ("train", "val"),
    progress: bool | None = None,
) -> Path:
    """Bring the manifest of ``root`` up to date, once per job, and return its path.

    Under an initialized ``torch.distributed`` process group, global rank 0
    checks (probing only new or changed files) while the other ranks wait for it
    and then get its manifest path; if rank 0 fails, every rank raises. Without
    a process group this process checks, unless another process of the same
    job just did (see the module docstring).

    Args:
        root: dataset root (``bytes`` are read as :func:`os.fsdecode` reads them).
        device: ``"gpu"``, ``"gpu:<generation>"`` or ``"cpu"``, as in :func:`~daliload.prescreen.scan`.
        scan: where the manifest lives, whether to deep-check, how many probe
            processes, whether to check for changes (:class:`ScanSpec`).
        splits: as in :func:`~daliload.prescreen.scan`.
        progress: the scan's progress bar (files probed of those to probe, on stderr) and its few lines
            (before a first scan, how to run it ahead; on waiting ranks, what they wait for). ``None``
            (default): ``DALILOAD_PROGRESS`` when set (``1`` on, ``0`` off), else the bar when stderr is a
            terminal and the lines on. ``False``: the lines go to this module's logger, and no bar.

    Returns:
        The manifest's path (rank 0's, on every rank): the root's own, the one
        given, or the per-user cache copy of a read-only one whose files changed.

    Raises:
        RuntimeError: on ranks other than 0, when rank 0's scan failed.
        ValueError: ``root`` is a file, not a folder (the message says what to pass);
            on ranks other than 0, ``root`` is not rank 0's (its manifest would be the wrong one).
        FileNotFoundError: ``root`` does not exist.
        PermissionError: ``root`` has no manifest and none can be written where it goes
            (the message says to pass ``ScanSpec(manifest_path=...)``).
    """
    root = decoded_path(root)
    refuse_bootstrapping_main(f"A daliload loader (its scan of {printable_path(root)})")
    check_device(device)
    progress = progress_choice(progress)
    if not runtime.is_distributed():
        return _ensure_here(root, device, scan, splits, progress)
    # A first scan of a large dataset outlasts the default group's timeout (often 10
    # minutes with NCCL): the other ranks wait on a gloo group that allows SCAN_WAIT_S.
    group = runtime.patient_group(SCAN_WAIT_S)
    # The root rank 0 checked comes with its answer: a rank given another root must not read its manifest.
    status: tuple[str, str, str] = ("ok", "", os.path.realpath(root))
    if runtime.rank() == 0:
        try:
            status = ("ok", str(_ensure_here(root, device, scan, splits, progress)), status[2])
        except BaseException as err:
            # release the waiting ranks
            runtime.broadcast_object(("error", f"{type(err).__name__}: {err}", ""), group=group)
            raise
        status = runtime.broadcast_object(status, group=group)
    else:  # says once, then every few minutes, whom and which manifest it waits for, and how far rank 0 is
        done = threading.Event()
        where = (Path(os.path.abspath(decoded_path(scan.manifest_path))) if scan.manifest_path is not None
                 else find_manifest(root, scan.fold))
        threading.Thread(target=report_while, args=(done, where, Path(os.path.abspath(root)), "global rank 0",
                                                    _talks(progress)),
                         name="daliload-scan-wait", daemon=True).start()
        try:
            status = runtime.broadcast_object(status, group=group)
        finally:
            done.set()
    if status[0] != "ok":
        raise RuntimeError(f"rank 0 failed to scan {root}: {status[1]}")
    if status[2] != os.path.realpath(root):
        raise ValueError(f"rank {runtime.rank()} was given root {root}, global rank 0 {status[2]}: every rank "
                         f"must read the same dataset (its manifest is rank 0's, {status[1]}); pass one root")
    return Path(status[1])


def _talks(progress: bool | None) -> bool:
    """Whether this process says on stderr what it waits for: one process a node (ranks numbered node by node,
    as torchrun does), the lowest local rank that waits: 1 on global rank 0's node, 0 on the others."""
    first_node = runtime.rank() == runtime.local_rank()
    return progress is not False and runtime.local_rank() == (1 if first_node and runtime.world_size() > 1 else 0)


def _ensure_here(root: str | os.PathLike, device: Device, spec: ScanSpec, splits: Sequence[str],
                 progress: bool | None) -> Path:  # fmt: skip
    """:func:`ensure_manifest` in this process."""
    root = check_root(root)
    given = spec.manifest_path is not None
    path = Path(os.path.abspath(decoded_path(spec.manifest_path))) if given else find_manifest(root, spec.fold)
    key = (str(root), str(path))
    with _checked_lock:
        done = _checked.get(key)
    if done is not None and done.holds(splits, spec.deep, root) and not spec.retry_bad:
        return done.path
    if not spec.check and path.is_file() and not spec.retry_bad:
        result = path  # trusted as it is: ScanSpec(check=False)
    elif writable(path):
        _scan_one_at_a_time(root, path, device, spec, splits, progress)
        result = path
    elif not path.is_file():
        raise unwritable_manifest(root, path, given=given)
    else:
        result = _read_only(root, path, device, spec, splits, progress)
    with _checked_lock:
        _checked[key] = _Checked(frozenset(splits), spec.deep, result, _identity(root, result))
    return result


def find_manifest(root: str | os.PathLike, fold: int | None = None) -> Path:
    """The manifest of ``root`` (of ``fold``) when no path is given: its own if it exists (even on read-only
    storage), else :func:`~daliload.prescreen.default_manifest_path`."""
    from daliload.prescreen.scan import default_manifest_path
    from daliload.prescreen.scan_listing import manifest_name

    local = Path(os.path.abspath(root)) / ".daliload" / manifest_name(fold)
    return local if local.is_file() else default_manifest_path(root, fold)


def writable(path: Path) -> bool:
    """Whether a scan can write ``path`` (and its journal beside it), or create it."""
    if path.exists():
        return os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)
    folder = path.parent
    while not folder.exists():
        folder = folder.parent
    return os.access(folder, os.W_OK)


def unwritable_manifest(root: Path, path: Path, *, given: bool, changed: int = 0,
                        read_only: Path | None = None) -> PermissionError:
    """The error for a manifest that must be written at ``path`` and cannot be, naming the option that fixes it.

    ``given``: ``path`` is the user's ``ScanSpec(manifest_path=...)``; otherwise
    it is where the manifest of a root on read-only storage goes (the per-user
    cache, :func:`~.scan.cache_manifest_path`). ``read_only``: the root's own
    manifest, found but out of date (``changed`` files differ).
    """
    where = printable_path(path)
    fix = ("give the manifest a writable path: ScanSpec(manifest_path=PATH) (`daliload scan ROOT --manifest "
           "PATH`), or scan where the dataset is writable and pass the manifest file as the loader's root")
    if given:
        why = f"the manifest {where} does not exist and its folder cannot be written"
    elif read_only is not None:
        why = (f"{changed} file(s) of {printable_path(root)} changed since its manifest {printable_path(read_only)} "
               f"(on read-only storage) was written, and its updated copy {where} cannot be written either "
               "(the per-user cache: $XDG_CACHE_HOME or ~/.cache)")
    else:
        why = (f"{printable_path(root)} is on read-only storage and has no manifest of its own "
               f"(.daliload/manifest.sqlite), and the one in the per-user cache, {where}, cannot be written "
               "either ($XDG_CACHE_HOME or ~/.cache)")
    return PermissionError(errno.EACCES, f"no manifest can be written for this dataset: {why}; {fix}")


def _read_only(root: Path, path: Path, device: Device, spec: ScanSpec, splits: Sequence[str],
               progress: bool | None) -> Path:  # fmt: skip
    """The manifest of ``root`` on read-only storage: in place if no file changed, else an updated cache copy."""
    cache = cache_manifest_path(root, spec.fold)
    origin = {"path": str(path), "size": path.stat().st_size, "mtime_ns": path.stat().st_mtime_ns}
    if cache.is_file() and _copied_from(cache) == origin:
        _scan_one_at_a_time(root, cache, device, spec, splits, progress)  # the copy this dataset moved to
        return cache
    changed = check_changes(root, path, device=device, splits=splits, deep=spec.deep, layout=spec.layout,
                            fold=spec.fold)
    if changed == 0 and not spec.retry_bad:
        logger.info("manifest %s is on read-only storage and up to date: read in place", printable_path(path))
        return path
    if not writable(cache):
        raise unwritable_manifest(root, cache, given=False, changed=changed, read_only=path)
    logger.warning("%d file(s) of %s changed since its manifest %s was written, which is on read-only storage: "
                   "updating a copy in %s (only those files are probed)", changed, printable_path(root),
                   printable_path(path), printable_path(cache))
    copy_to_cache(path, cache)
    _scan_one_at_a_time(root, cache, device, spec, splits, progress)
    return cache


def copy_to_cache(path: Path, cache: Path) -> None:
    """Copy a read-only manifest to ``cache``, recording which file (size, mtime) it was copied from."""
    origin = {"path": str(path), "size": path.stat().st_size, "mtime_ns": path.stat().st_mtime_ns}
    cache.parent.mkdir(parents=True, exist_ok=True)
    partial = cache.with_name(cache.name + ".copy")
    shutil.copyfile(path, partial)
    with Manifest(partial, writable=True) as copy, copy._transaction() as conn:
        conn.execute("INSERT OR REPLACE INTO meta VALUES ('copied_from', ?)", (json.dumps(origin),))
    os.replace(partial, cache)


def _copied_from(path: Path) -> dict | None:
    with Manifest(path) as manifest:
        text = manifest._meta("copied_from")
    return json.loads(text) if text else None


def _scan_one_at_a_time(root: Path, path: Path, device: Device, spec: ScanSpec, splits: Sequence[str],
                        progress: bool | None) -> None:  # fmt: skip
    """:func:`scan` under an exclusive lock on ``path`` + ``".lock"``, unless this job just checked it.

    One scan per manifest at a time, also across processes that share no process
    group (torchrun ranks before init_process_group, several jobs on one dataset):
    the others wait here; a process of the same job then finds the manifest
    checked moments ago and uses it, another job checks it again (nothing to probe).
    A first scan (no manifest yet, or one no scan finished) says first what it
    does and how to run it ahead of the job (:func:`.scan_lock.first_scan_notice`).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    job = job_key()
    with scan_lock(path, root, job=job, progress=_talks(progress)) as note:
        if job is not None and _checked_by(path, job, device, spec, splits):
            logger.info("manifest %s was checked moments ago by another process of this job (%s)",
                        printable_path(path), job)
            return
        if _never_scanned(path):
            say(first_scan_notice(root, path), progress)
        note = reporting(note, root, progress)  # and, where no bar shows, a line every few minutes
        scan(root, manifest_path=path, device=device, deep=spec.deep, workers=spec.workers, splits=splits,
             progress=progress, retry_bad=spec.retry_bad, job=job, on_progress=note, layout=spec.layout,
             fold=spec.fold)


def _never_scanned(path: Path) -> bool:
    """Whether no scan finished writing ``path`` (it does not exist, or a first scan was stopped)."""
    if not path.is_file():
        return True
    with Manifest(path) as manifest:
        return not manifest.last_scan


def _checked_by(path: Path, job: str, device: Device, spec: ScanSpec, splits: Sequence[str]) -> bool:
    """Whether the last write to ``path`` was a scan by ``job``, moments ago, covering this request."""
    if not path.is_file():
        return False
    with Manifest(path) as manifest:
        last = manifest.current_meta("last_scan")
    return (last is not None and last.get("job") == job and last.get("device") == device
            and set(splits) <= set(last.get("asked", ())) and (last.get("deep") or not spec.deep)
            and time.time() - last.get("finished_at", 0) < JOB_CHECK_FRESH_S)


def check_manifest(path: str | os.PathLike, *, scan: ScanSpec = DEFAULT_SPEC, sample: int = SAMPLE_FILES) -> Path:
    """A manifest given as a source, trusted after a cheap check; returns its absolute path.

    It must be a whole scan (a shard's manifest is refused, with how to merge
    the shards). With ``scan.check`` (the default), ``sample`` of its files,
    spread over it, must still have the size and mtime it recorded; if not, a
    warning says how many differ and how to bring it up to date. Done once per
    process and manifest.

    Raises:
        ValueError: a shard's manifest; not a manifest.
        FileNotFoundError: no such file.
    """
    path = Path(os.path.abspath(decoded_path(path)))
    key = ("", str(path))
    with _checked_lock:
        done = _checked.get(key)
    if done is not None and done.holds((), False, None):
        return path
    with Manifest(path) as manifest:
        part = manifest.part
        if part is not None and part["shard"] != "0/1":
            raise ValueError(f"manifest {path} is shard {part['shard']} of a scan of {part['root']}: merge every "
                             "shard's manifest with `daliload scan --merge PART... --manifest OUT` and pass OUT")
        rows = manifest.sample(sample) if scan.check else []
    # Objects in a store are not looked up here (a request each; the loader reaches each store once instead).
    changed = [file for file, size, mtime in rows if not is_remote(file) and _size_and_mtime(file) != (size, mtime)]
    if changed:
        shown = printable_path(path)
        warnings.warn(f"manifest {shown} may be out of date: {len(changed)} of {len(rows)} files sampled changed "
                      f"or are gone since it was written (first: {printable_path(changed[0])}); bring it up to "
                      f"date with `daliload scan ROOT --manifest {shown}` (ScanSpec(check=False) skips this check)",
                      RuntimeWarning, stacklevel=3)
    with _checked_lock:
        _checked[key] = _Checked(frozenset(), False, path, _identity(None, path))
    return path


def _size_and_mtime(path: str) -> tuple[int, int]:
    try:
        return stat_video(path)  # a shard's member: its size, the shard's mtime
    except OSError:
        return -1, -1


def forget_checks() -> None:
    """Forget the checks this process did (the next :func:`ensure_manifest` checks again); for tests."""
    with _checked_lock:
        _checked.clear()


#: What a loader takes for a manifest rather than a dataset root (``KineticsDALILoader(root)``).
MANIFEST_SUFFIXES = (".sqlite", ".sqlite3", ".db")


class SplitVideos(NamedTuple):
    """A split's videos as a job reads them from its manifest (:func:`split_videos`).

    Attributes:
        manifest_path: the manifest read.
        classes: the class names, by label.
        videos: the decodable videos (every route but ``bad``), as columns;
            row ``i`` is ``Sample.video_index`` ``i`` of every plan drawn from them.
        rejected: ``(path, reason)`` of the files the pre-screen marked ``bad``.
    """

    manifest_path: Path
    classes: tuple[str, ...]
    videos: VideoIndex
    rejected: tuple[Failure, ...]


def split_videos(root: Path, split: str, *, device: Device, scan: ScanSpec) -> SplitVideos:
    """Scan ``root`` if it is a dataset root (:func:`ensure_manifest`; a manifest: :func:`check_manifest`), then
    read ``split``'s videos for ``device`` from the manifest. On global rank 0, one logged WARNING says how
    many files the pre-screen rejected, and how to list them.

    Raises:
        ValueError: ``split`` is not in the manifest, or has no decodable video.
    """
    if root.is_file() and root.suffix in MANIFEST_SUFFIXES:
        manifest_path = Path(check_manifest(root, scan=scan))
    else:
        manifest_path = Path(ensure_manifest(root, device=device, scan=scan,
                                             splits=tuple(dict.fromkeys(("train", "val", split)))))
    with Manifest(manifest_path) as manifest:
        known_splits = manifest.splits()
        if split not in known_splits:
            raise ValueError(f"split {split!r} is not in the manifest {manifest_path}; "
                             f"it has: {', '.join(known_splits) or 'no split'}")
        index = manifest.video_index(split, device=device)
        classes = manifest.classes()
    rejected = tuple(Failure(path, reason) for path, reason in index.rejected())
    videos = index.decodable()
    check_stores(videos.paths)  # videos by URI: each store reached once now (a wrong bucket, refused credentials)
    if not len(videos):
        raise ValueError(f"split {split!r} of {manifest_path} has no decodable video "
                         f"({len(rejected)} rejected by the pre-screen)")
    if rejected and runtime.rank() == 0:  # a WARNING: on the console by default, in the job's log when configured
        logger.warning("daliload's pre-screen left out %d file(s) of split %r that no decoder here reads (manifest "
                       "%s); list them with loader.stats().rejected or `daliload scan ROOT --json FILE` (route "
                       "'bad')", len(rejected), split, printable_path(manifest_path))
    return SplitVideos(manifest_path, tuple(classes), videos, rejected)


def split_codecs(manifest_path: str | os.PathLike, split: str, videos: VideoIndex) -> list[str]:
    """The codec of each of ``videos`` (a split's index read from ``manifest_path``), by ``video_index``.

    One query of the split's ``(path, codec)`` rows in path order, merged with the index's paths (sorted the
    same way); a file the manifest no longer lists gets ``""``. What routing by measured speed groups clips by
    (``daliload.epoch.Routes``), read once per loader when it is first needed.
    """
    with Manifest(Path(manifest_path)) as manifest:
        rows = manifest._conn.execute("SELECT path, codec FROM files WHERE split = ? ORDER BY path",
                                      (split,)).fetchall()
    codec_of = dict(rows)
    return [codec_of.get(path) or "" for path in videos.paths]
