"""One scan of a manifest at a time; what a scan and the processes that wait for it say on the console.

The scanning process holds an exclusive ``flock`` on ``MANIFEST.lock`` and
keeps a note in that file: who it is (pid, host, job) and how far its scan is
(files probed of those to probe, or still listing). A process that finds the
lock taken reads the note every :data:`REPORT_EVERY_S` seconds and says::

    waiting for the scan of /data/k700 by pid 4121 on node-3 (started 2 min ago): 61,000 of 650,000 files probed

The same report serves ranks that wait for global rank 0 under a process
group (:func:`report_while`), naming the manifest they wait for, and how far
rank 0 is when their node sees its lock file.

A job's first scan of a dataset says before it starts what it does and how
to do it once ahead of the job (:func:`first_scan_notice`). Its progress bar
is on when stderr is a terminal, or when asked (:func:`progress_choice`);
where it is not (a log file), the scan says how far it is every
:data:`REPORT_EVERY_S` seconds instead (:func:`reporting`). The one-line
reports are few (one, then one every :data:`REPORT_EVERY_S`), so they are on
unless progress is turned off.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shlex
import socket
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Callable, Iterator

from daliload.dataset import printable_path

logger = logging.getLogger(__name__)

#: Seconds between two reports of a process that waits (the first comes after :data:`FIRST_REPORT_S`).
REPORT_EVERY_S = 120.0
FIRST_REPORT_S = 2.0
#: The holder rewrites its note at most this often (seconds).
NOTE_EVERY_S = 1.0
#: How often a waiting process tries the lock again (seconds).
POLL_S = 0.2
#: ``1`` shows the scan's progress bar wherever stderr goes, ``0`` turns the bar and the scan's lines off.
PROGRESS_ENV = "DALILOAD_PROGRESS"


def lock_path(manifest: Path) -> Path:
    return manifest.with_name(manifest.name + ".lock")


@contextmanager
def scan_lock(manifest: Path, root: Path, *, job: str | None, progress: bool) -> Iterator[Callable[[int, int], None]]:
    """Hold the scan lock of ``manifest``; wait for it, reporting, if another process holds it.

    Yields:
        ``note(probed, to_probe)``: what the scan calls as it goes, so that
        waiting processes can say how far it is.
    """
    with open(lock_path(manifest), "a+b") as lock:
        _acquire(lock, root, progress)
        try:
            note = _Note(lock, job)
            yield note.update
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _flock(lock: IO[bytes], how: int) -> None:
    """``fcntl.flock``; a file system that gives no ``flock`` raises an error naming the lock file and the fix.

    Raises:
        BlockingIOError: another process holds the lock (``LOCK_NB``).
        OSError: the mount has no ``flock`` (Lustre without ``-o flock``, NFSv3 without ``lockd``).
    """
    try:
        fcntl.flock(lock, how)
    except BlockingIOError:
        raise
    except OSError as err:
        raise OSError(err.errno, f"cannot take the scan lock {lock.name}: {err.strerror}. This file system gives "
                                 "no flock (Lustre: mount with -o flock; NFSv3: run lockd on clients and server); "
                                 "or scan once before the jobs start and pass the manifest file as the loader's "
                                 "root, which takes no lock") from err


def _acquire(lock: IO[bytes], root: Path, progress: bool) -> None:
    try:
        _flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        pass
    started = time.monotonic()
    next_report = started + FIRST_REPORT_S
    while True:
        time.sleep(POLL_S)
        try:
            _flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= next_report:
                say(describe(read_note(lock), root), progress)
                next_report = time.monotonic() + REPORT_EVERY_S
    if time.monotonic() - started >= FIRST_REPORT_S:
        say(f"the scan of {root} by another process finished after {_ago(time.monotonic() - started)}: "
            f"checking the manifest", progress)


class _Note:
    """The holder's note in the lock file, rewritten at most every :data:`NOTE_EVERY_S` seconds."""

    def __init__(self, lock: IO[bytes], job: str | None) -> None:
        self.lock = lock
        self.fields = {"pid": os.getpid(), "host": socket.gethostname(), "job": job, "started": time.time(),
                       "probed": None, "to_probe": None}
        self.written = 0.0
        self._write()

    def update(self, probed: int, to_probe: int) -> None:
        self.fields.update(probed=probed, to_probe=to_probe)
        if time.monotonic() - self.written >= NOTE_EVERY_S or probed == to_probe:
            self._write()

    def _write(self) -> None:
        try:
            self.lock.seek(0)
            self.lock.truncate()
            self.lock.write(json.dumps(self.fields).encode())  # the file is in append mode: at 0 after truncate
            self.lock.flush()
        except OSError as err:  # a full disk must not stop the scan; the waiting processes just learn less
            logger.debug("could not write the scan note in %s: %s", self.lock.name, err)
        self.written = time.monotonic()


def read_note(lock: IO[bytes] | Path) -> dict | None:
    """The holder's note, or ``None`` (no note yet, half written, or no lock file)."""
    try:
        if isinstance(lock, Path):
            text = lock.read_bytes()
        else:
            lock.seek(0)
            text = lock.read()
        return json.loads(text) if text else None
    except (OSError, ValueError):
        return None


def describe(note: dict | None, root: Path) -> str:
    """What a waiting process says about the scan it waits for."""
    if not note:
        return f"waiting for another process's scan of {root} (it has not said how far it is)"
    return f"waiting for the scan of {root} by {_who(note)}: {_how_far(note)}"


def _who(note: dict) -> str:
    who = f"pid {note.get('pid')} on {note.get('host')}" + (f" (job {note['job']})" if note.get("job") else "")
    return f"{who} (started {_ago(time.time() - float(note.get('started') or time.time()))} ago)"


def _how_far(note: dict) -> str:
    if note.get("to_probe") is None:
        return "listing the files and comparing them with the manifest"
    return f"{note['probed']:,} of {note['to_probe']:,} files probed"


def report_while(done: threading.Event, manifest: Path, root: Path, who: str, progress: bool) -> None:
    """Report once after :data:`FIRST_REPORT_S`, then every :data:`REPORT_EVERY_S` seconds until ``done`` is
    set: this process waits for ``who``'s check of ``root`` and its manifest, and how far that scan is when
    this node sees its lock file (a daemon thread of a waiting rank)."""
    if done.wait(FIRST_REPORT_S):
        return
    while True:
        note = read_note(lock_path(manifest))
        text = f"waiting for {who}'s check of {root}, which writes the manifest {manifest}"
        if note:
            text += f": its scan by {_who(note)}: {_how_far(note)}"
        say(text, progress)
        if done.wait(REPORT_EVERY_S):
            return


def progress_choice(progress: bool | None) -> bool | None:
    """The progress setting a scan runs with: ``progress`` when given, else :data:`PROGRESS_ENV` when set
    (``1``: on, ``0``: off), else ``None``: the bar where stderr is a terminal (tqdm's ``disable=None``),
    and the few one-line reports on.

    Raises:
        ValueError: :data:`PROGRESS_ENV` is set to something else than ``0`` or ``1``.
    """
    if progress is not None:
        return progress
    value = os.environ.get(PROGRESS_ENV, "").strip()
    if value in ("", "0", "1"):
        return None if not value else value == "1"
    raise ValueError(f"environment variable {PROGRESS_ENV}={value!r} must be 1 (progress bar on, wherever stderr "
                     "goes) or 0 (bar and scan notices off); unset, the bar shows when stderr is a terminal")


def reporting(note: Callable[[int, int], None], root: Path, progress: bool | None) -> Callable[[int, int], None]:
    """``note`` (the lock file's), and where no bar shows by default (stderr no terminal: a log file, CI),
    a line every :data:`REPORT_EVERY_S` seconds of how far the scan of ``root`` is, so that a log says more
    than its start."""
    if progress is not None or sys.stderr is None or sys.stderr.isatty():
        return note
    said = [time.monotonic()]

    def update(probed: int, to_probe: int) -> None:
        note(probed, to_probe)
        if probed < to_probe and time.monotonic() - said[0] >= REPORT_EVERY_S:
            say(f"scan of {root}: {probed:,} of {to_probe:,} files probed", progress)
            said[0] = time.monotonic()

    return update


def first_scan_notice(root: Path, manifest: Path) -> str:
    """What a job's first scan of ``root`` says before it starts: what it does, and how to do it once ahead."""
    command = f"daliload scan {shlex.quote(str(root))} --manifest {shlex.quote(str(manifest))}"
    return (f"first scan of {root}: every video is probed once (codec, size, frames, keyframes) and the verdicts "
            f"kept in the manifest {manifest}; later jobs reuse it and probe only new or changed files. On a large "
            "dataset this takes a while, and other ranks wait for it: to run it once ahead of training, "
            f"`{command}`, then pass that manifest file to the loader as its root")


def say(text: str, progress: bool | None) -> None:
    """One line on stderr beside the progress bars (a log record when progress is off: ``False``)."""
    text = printable_path(text)  # a stream that encodes strictly refuses a name's bytes that are not UTF-8
    if progress is not False:
        print(f"daliload: {text}", file=sys.stderr, flush=True)
    else:
        logger.info(text)


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"
