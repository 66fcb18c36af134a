"""What a loader's ``root``, ``split``, ``layout=`` and ``fold=`` name, before any scan.

:func:`loader_source` turns them into the root to scan (a dataset folder, a
manifest file, or the folder a list of ``(path, label)`` pairs is written to:
:func:`daliload.dataset.write_pairs`), the split's name as the manifest keeps
it (``"trainlist02"`` of UCF101 is ``"train"`` of fold 2, ``"validation"`` is
``"val"``) and the :class:`~daliload.prescreen.ScanSpec` that carries the
layout and the fold to the scan.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from pathlib import Path

from daliload.dataset import check_split, get_layout, layout_of, write_pairs
from daliload.prescreen.remote_root import mirror_root
from daliload.prescreen.scan import ScanSpec
from daliload.stream import is_remote

#: A split name that names a fold (``"trainlist02"``, ``"test_split3"``): read through the layout even
#: when none is given.
_FOLDED = re.compile(r"(train|test)(list|_split|split)0*[1-9][0-9]*")


def loader_source(root: object, split: str, unknown: dict[str, object], scan: object, *,
                  layout: str | None, fold: int | None) -> tuple[Path, str, object]:
    """``(root, split, scan)`` for a loader (see the module docstring); ``scan`` stays as given when
    there is nothing to add to it (its type is the loader's to check).

    The deprecated ``source=`` (taken out of ``unknown``) stands for ``root``, with a ``DeprecationWarning``.

    Raises:
        TypeError: no root, or both ``root`` and ``source=``; a bad pair in a list root.
        ValueError: an unknown layout, a bad fold, a layout or fold given with a manifest, or one that
            differs from ``scan``'s.
        FileNotFoundError: the root (or a file of a list root) does not exist.
    """
    if "source" in unknown:
        if root is not None:
            raise TypeError("KineticsDALILoader() got both root and source=, its old name: pass root only")
        root = unknown.pop("source")
        warnings.warn("KineticsDALILoader(source=...) is deprecated: the dataset root (or manifest) is root, the "
                      "first argument: KineticsDALILoader(root, ...) or root=", DeprecationWarning, stacklevel=3)
    if root is None:
        raise TypeError("KineticsDALILoader() missing its first argument, root: the dataset root or a manifest")
    if scan is not None and not isinstance(scan, ScanSpec):  # the loader refuses it next, saying what to write
        return (root if isinstance(root, (list, tuple)) else Path(root)), split, scan
    spec = scan if isinstance(scan, ScanSpec) else None
    if spec is not None:
        layout, fold = _one("layout", layout, spec.layout), _one("fold", fold, spec.fold)
    if layout is not None or fold is not None:
        spec = dataclasses.replace(spec or ScanSpec(), layout=layout, fold=fold)  # checks them
    split = check_split(split)
    if isinstance(root, (list, tuple)):
        if layout not in (None, "path_label"):
            raise ValueError(f"a list of (path, label) pairs is read as layout 'path_label', not {layout!r}")
        root, spec = write_pairs(root, split), dataclasses.replace(spec or ScanSpec(), layout="path_label")
        return root, split, spec
    if isinstance(root, str) and is_remote(root):
        root = mirror_root(root)  # a root in a store: its names mirrored locally, its videos read from the store
    root = Path(root)
    if not root.exists():
        raise FileNotFoundError(f"dataset root or manifest not found: {root}")
    if not root.is_dir():
        if layout is not None or fold is not None:
            raise ValueError(f"layout= and fold= say how a dataset root is read; {root} is a manifest, whose scan "
                             "read it already: leave them out")
        return root, split, scan
    if layout is not None or fold is not None or _FOLDED.fullmatch(split):
        name, split, fold = layout_of(root, split, layout, fold)
        mark = get_layout(name).mark(root, split, fold)
        if layout is not None and not mark.exists():  # named here, not as a split the manifest lacks
            raise FileNotFoundError(f"no {split!r} split of the {name} layout under {root}: {mark} does not exist")
        spec = dataclasses.replace(spec or ScanSpec(), layout=layout, fold=fold)
    return root, split, spec if spec is not None else scan


def scan_splits(root: Path, splits: tuple[str, ...], layout: str | None,
                fold: int | None) -> tuple[tuple[str, ...], int | None]:
    """The splits a scan of ``root`` covers, named as the manifest keeps them, and the fold they are of
    (``fold``, or the one their names say: ``("trainlist02", "testlist02")`` is ``("train", "test")`` of 2).

    Raises:
        ValueError: split names of different folds, or a bad layout or fold.
    """
    named, folds = [], set()
    for split in splits:
        split = check_split(split)
        if layout is not None or fold is not None or _FOLDED.fullmatch(split):
            try:
                _, split, split_fold = layout_of(root, split, layout, fold)
            except FileNotFoundError:  # a split the root lacks: the scan skips it and says so
                split_fold = fold
            folds.add(split_fold)
        named.append(split)
    folds.discard(None)
    if len(folds) > 1:
        raise ValueError(f"splits {', '.join(splits)} are of folds {sorted(folds)}: a scan covers one fold (each "
                         "fold has a manifest of its own); scan each fold on its own")
    return tuple(dict.fromkeys(named)), (folds.pop() if folds else fold)


def _one(name: str, given: object, in_spec: object) -> object:
    """The loader's ``layout=`` or ``fold=`` and its ``ScanSpec``'s: one of them, or the same."""
    if given is not None and in_spec is not None and given != in_spec:
        raise ValueError(f"{name}={given!r} but scan=ScanSpec({name}={in_spec!r}): give it once")
    return given if given is not None else in_spec


__all__ = ["loader_source", "scan_splits"]
