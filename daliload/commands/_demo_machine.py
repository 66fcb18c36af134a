"""What a ``daliload demo`` report says about where it ran: the machine, how busy it was, and which daliload.

The package is named by its version and, for a git checkout, its commit
(``dirty`` when tracked files differ from it), so a figure copied from a demo
report (``benchmarks/results/demo.json``) names the code that made it. An
installed package has no commit: ``None``.
"""

from __future__ import annotations

import datetime
import os
import platform
import shutil
import subprocess
from pathlib import Path


def machine_facts(device: str, load_start: list[float] | None) -> dict:
    """The report's ``machine`` entry, taken at the run's end (``load_start``: :func:`load_average` at its start)."""
    import torch

    import daliload

    return {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "dali": dali_version(), "device": device,
            "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
            "load_average_start": load_start, "load_average_end": load_average(),
            "package": {"version": daliload.__version__, "commit": package_commit()}}


def package_commit() -> str | None:
    """The commit of the daliload checkout this process imports, ``" dirty"`` appended when its tracked files
    differ from it; ``None`` for an installed package (or where git is missing)."""
    folder = Path(__file__).resolve().parents[2]
    git = shutil.which("git")
    if git is None or not (folder / ".git").exists():
        return None
    try:
        head = subprocess.run([git, "-C", str(folder), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=30, check=False)
        status = subprocess.run([git, "-C", str(folder), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + (" dirty" if status.stdout.strip() else "")


def load_average() -> list[float] | None:
    """1, 5 and 15-minute load averages, to tell a busy machine's run from a quiet one's."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def dali_version() -> str | None:
    try:
        import nvidia.dali as dali
    except ImportError:
        return None
    return dali.__version__
