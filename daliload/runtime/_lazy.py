"""Lazy re-exports for a package's ``__init__`` (PEP 562): a public name is imported on first use.

Both ``daliload`` and ``fallback`` export names from their submodules this way,
so ``import daliload`` stays cheap and ``fallback/`` can import
:mod:`daliload.plan` without pulling in the loader.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping


def lazy_exports(package: str, namespace: dict[str, Any], module_of: Mapping[str, str]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:  # fmt: skip
    """The ``__getattr__`` and ``__dir__`` of ``package``, whose ``namespace`` (its ``globals()``) exports
    ``name`` from module ``module_of[name]``.

    An exported name is imported on first access and then stored in the
    namespace, so later accesses do not come back here.
    """
    def __getattr__(name: str) -> Any:
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(module_of))

    return __getattr__, __dir__
