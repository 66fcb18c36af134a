"""A folder made read-only for the test's process: a read-only bind mount as root, else its mode."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest


class read_only:
    """``folder`` read-only for this process: a read-only bind mount (root), else its mode (others)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def __enter__(self):
        self.mounted = False
        if os.geteuid() == 0:
            done = subprocess.run(["mount", "--bind", "-o", "ro", str(self.folder), str(self.folder)],
                                  capture_output=True)
            if done.returncode != 0:
                pytest.skip(f"cannot make a read-only bind mount here: {done.stderr.decode().strip()}")
            self.mounted = True
        else:
            self._modes = {p: p.stat().st_mode for p in (self.folder, *self.folder.rglob("*"))}
            for path in sorted(self._modes, reverse=True):  # files and subfolders before their folder
                path.chmod(0o555 if path.is_dir() else 0o444)
        return self

    def __exit__(self, *exc):
        if self.mounted:
            subprocess.run(["umount", str(self.folder)], check=True)
        else:
            for path, mode in sorted(self._modes.items()):
                path.chmod(mode)
