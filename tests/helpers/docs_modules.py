"""The scripts that live in docs/ (the API page's generator, the site's hooks), imported by path for the tests:
docs/ is not a package."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

DOCS = Path(__file__).resolve().parents[2] / "docs"


def load_docs_module(filename: str) -> ModuleType:
    """``docs/FILENAME`` as a module of its own, run once per call."""
    spec = importlib.util.spec_from_file_location(f"docs_{Path(filename).stem}", DOCS / filename)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
