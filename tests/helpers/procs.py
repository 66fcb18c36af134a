"""A process's state as ``/proc/PID/stat`` gives it, for tests that wait for processes to start or go."""

from __future__ import annotations


def proc_state(pid: int) -> str:
    """The state letter of ``pid`` (``"R"``, ``"S"``, ``"Z"``...), ``""`` once it is gone.

    A process reaped between the open and the read makes the read fail with ESRCH (ProcessLookupError), not
    the open with ENOENT: both mean gone.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return ""


def running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, or a process reaped, does not)."""
    return proc_state(pid) not in ("", "Z", "X")
