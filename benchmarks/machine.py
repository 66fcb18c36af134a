"""The machine a run ran on: :func:`machine_info` (CPU, cores, memory, GPU, versions, date, and the package
commit measured: :func:`package_commit`) and the lines
that name it in tables, plots and headings (:func:`machine_line`, :func:`versions_line`).

Below :mod:`benchmarks.report` and :mod:`benchmarks.summary`, which both label what they write with it.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import os
import platform
import shutil
import subprocess

from daliload.runtime import usable_cores

_PACKAGES = ("torch", "av", "numpy", "nvidia-dali-cuda130", "nvidia-dali-cuda120", "torchcodec", "decord",
             "spdl", "spdl_io", "spdl_core", "psutil")


#: What a benchmark run writes (its results, its sections of the docs): changed, they leave the code measured
#: the commit's, so they do not make a run "dirty" (a run after another in one checkout measures clean code).
OUTPUTS = ("benchmarks/results", "benchmarks/RESULTS.md", "docs", "README.md")


def package_commit() -> str:
    """The commit of the daliload checkout this process imports (``git rev-parse HEAD``), with ``" dirty"``
    when its tracked files other than benchmark outputs (:data:`OUTPUTS`) differ from it; ``"unknown (...)"``
    outside a git checkout (an installed wheel)."""
    import daliload

    return commit_of(os.path.dirname(os.path.dirname(os.path.abspath(daliload.__file__))))


def commit_of(folder: str | os.PathLike) -> str:
    """:func:`package_commit` of the checkout at ``folder``."""
    git = shutil.which("git")
    if git is None:
        return "unknown (no git)"
    try:
        head = subprocess.run([git, "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=30, check=False)
        if head.returncode != 0:
            return f"unknown (not a git checkout: {folder})"
        status = subprocess.run([git, "-C", str(folder), "status", "--porcelain", "--untracked-files=no", "--",
                                 ".", *(f":(top,exclude){path}" for path in OUTPUTS)],
                                capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"unknown ({err})"
    return head.stdout.strip() + (" dirty" if status.stdout.strip() else "")


def machine_info(label: str = "") -> dict:
    """CPU model, cores, memory, GPU, library versions, the date (UTC) of this machine, and the package
    commit this process measures (``package_commit``: every benchmark JSON that records its machine has it)."""
    cpu_model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu_model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    memory_gib = None
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    memory_gib = round(int(line.split()[1]) / 1024 / 1024, 1)
                    break
    except OSError:
        pass
    versions = {}
    for package in _PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            continue
    try:
        import av

        versions["ffmpeg (PyAV)"] = str(av.ffmpeg_version_info)
    except ImportError:
        pass
    gpu = None
    smi = shutil.which("nvidia-smi")
    if smi:
        result = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30, check=False)
        if result.returncode == 0 and result.stdout.strip():
            gpu = result.stdout.strip().splitlines()[0]
    usable = usable_cores()
    return {
        "label": label,
        "cpu_model": cpu_model,
        "cpu_cores": os.cpu_count(),
        "cpu_cores_usable": usable,
        "memory_gib": memory_gib,
        "gpu": gpu,
        "python": platform.python_version(),
        "versions": versions,
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "package_commit": package_commit(),
    }


def machine_line(machine: dict) -> str:
    """One line naming the machine, e.g. for table captions and plot titles."""
    label = f"{machine['label']}: " if machine.get("label") else ""
    gpu = machine.get("gpu") or "no GPU"
    commit = machine.get("package_commit")
    return (f"{label}{machine['cpu_model']}, {machine['cpu_cores_usable']} cores usable "
            f"({machine['cpu_cores']} online), {machine.get('memory_gib')} GiB RAM, {gpu}; {machine['date_utc']}"
            + (f"; daliload {commit[:12]}{' (dirty)' if commit.endswith(' dirty') else ''}"
               if commit and not commit.startswith("unknown") else ""))


def versions_line(machine: dict) -> str:
    parts = [f"Python {machine['python']}"] + [f"{k} {v}" for k, v in machine["versions"].items()]
    return ", ".join(parts)
