"""``daliload bench``: the benchmarks of a source checkout (``python -m benchmarks``).

The benchmarks live in ``benchmarks/`` beside the package in the repository
and are not part of the wheel, so an installed daliload does not depend on
them. In a checkout (an editable install, or running from the repository
root) this command takes the same options as ``python -m benchmarks``;
elsewhere it says where to get them.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

HELP = "benchmark daliload against other video loaders (source checkout only; see python -m benchmarks)"
_CHECKOUT = Path(__file__).resolve().parent.parent
_MISSING = ("daliload bench: the benchmarks ship only in the source repository, not in the installed "
            "package. Clone the repository and run `python -m benchmarks --help` from its root "
            "(or `pip install -e .` there, then `daliload bench`).")


def _harness():
    """benchmarks.harness, or None when this is not a source checkout."""
    if (_CHECKOUT / "benchmarks" / "harness.py").exists() and str(_CHECKOUT) not in sys.path:
        sys.path.insert(0, str(_CHECKOUT))
    try:
        return importlib.import_module("benchmarks.harness")
    except ModuleNotFoundError as err:
        if err.name not in ("benchmarks", "benchmarks.harness"):
            raise
        return None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    harness = _harness()
    if harness is not None:
        harness.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    harness = _harness()
    if harness is None:
        print(_MISSING, file=sys.stderr)
        return 2
    return harness.run(args)
