"""Every benchmark JSON records the package commit it measured (``git rev-parse HEAD``, "dirty" when the tree is)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from benchmarks.machine import machine_info, machine_line, package_commit

ROOT = Path(__file__).resolve().parents[1]


def test_the_commit_is_this_checkouts_and_says_dirty_when_the_tree_is():
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no", "--", ".",
                            ":(top,exclude)benchmarks/results", ":(top,exclude)benchmarks/RESULTS.md",
                            ":(top,exclude)docs", ":(top,exclude)README.md"],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert package_commit() == head + (" dirty" if dirty else "")
    machine = machine_info("test")
    assert machine["package_commit"] == package_commit()
    assert f"daliload {head[:12]}" in machine_line(machine)


def test_a_checkout_is_dirty_when_its_code_differs_not_when_a_run_wrote_its_outputs(tmp_path):
    """A second run in one checkout measures the commit's code though the first rewrote the results and docs."""
    from benchmarks.machine import commit_of

    def git(*words):
        subprocess.run(["git", "-C", str(tmp_path), *words], check=True, capture_output=True)

    git("init", "-q")
    for name in ("daliload/core.py", "docs/speed.md", "README.md", "benchmarks/results/cpu.json",
                 "benchmarks/RESULTS.md"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("v1\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    for name in ("docs/speed.md", "README.md", "benchmarks/results/cpu.json", "benchmarks/RESULTS.md"):
        (tmp_path / name).write_text("a run's figures\n")
    assert commit_of(tmp_path) == head
    (tmp_path / "daliload/core.py").write_text("v2\n")
    assert commit_of(tmp_path) == head + " dirty"
    assert commit_of(tmp_path / "daliload").startswith(head)  # git finds the checkout from a folder inside it
    assert commit_of(tmp_path.parent / "not-a-checkout-here").startswith("unknown")


def test_every_benchmark_that_writes_its_machine_writes_the_commit():
    """A module that puts a ``"machine"`` entry in its JSON takes it from ``machine_info`` (which holds the
    commit) or writes ``package_commit()`` beside it."""
    missing = []
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        text = path.read_text(encoding="utf-8")
        if re.search(r"\"machine\": (args\.machine|machine_info\()", text) and not re.search(
                r"machine_info\(|package_commit\(", text):
            missing.append(path.name)
        if re.search(r"\"machine\": args\.machine", text) and "package_commit()" not in text:
            missing.append(path.name)
    assert missing == []
