"""``daliload bench``: says where the benchmarks are and how to run them.

The benchmarks live in ``benchmarks/`` beside the package in the source
repository. They import the package; the installed package never imports
them (docs/architecture.md, "Layers"), and they are not part of the wheel. So this
command runs nothing: it names the folder and the two ways to run it from the
repository root, and exits with status 2.
"""

from __future__ import annotations

import argparse
import sys

HELP = "where the benchmarks are and how to run them (python -m benchmarks or make bench, from the repository root)"
MESSAGE = ("daliload bench: the benchmarks are not part of the installed package; they live in benchmarks/ "
           "of the daliload source repository. Run them from the repository root with "
           "`python -m benchmarks` (see `python -m benchmarks --help` for the options) or `make bench` "
           "(sets up .venv, adds the optional peers, runs the CPU benchmark).")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """No options: the benchmark's own are those of ``python -m benchmarks``."""


def run(args: argparse.Namespace) -> int:
    print(MESSAGE, file=sys.stderr)
    return 2
