"""The dataset index: which video files a split holds, and their labels.

Three layouts are understood; a Kinetics download usually has the first two,
and ``daliload synth`` writes all three::

    ROOT/
      train/                                   "folders": ROOT/<split>/<class name>/<file>
        abseiling/
          --07WQ2iBlw_000001_000011.mp4        <youtube_id>_<start:06d>_<end:06d>.<ext>
          ...                                  (other names are fine; the id and
        air drumming/                           times are then None)
          ...
      val/
        ...
      annotations/                             "csv": one CSV per split
        train.csv                              label,youtube_id,time_start,time_end[,split]
        val.csv                                abseiling,--07WQ2iBlw,1,11,train
        test.csv                               (label is the class NAME)
      trainlist.txt                            "list": "<path> <label index>" per line;
      vallist.txt                              path relative to ROOT (may hold spaces)

Whatever the layout, every entry of ``ROOT/<split>/`` and its class folders
that the index does not hold is listed in :attr:`DatasetIndex.skipped` with
its reason (``"not a video extension: .txt"``, ``"not in the annotation CSV"``),
so a scan can say what it did not look at. Raw elementary streams
(``.h264``, ``.264``, ``.h265``, ``.265``, ``.hevc``) count as videos.

A CSV row points at ``ROOT/<split>/<label>/<youtube_id>_<start:06d>_<end:06d>.*``
(or the same name directly in ``ROOT/<split>/``). Rows whose file is missing
are kept in :attr:`DatasetIndex.missing` and counted in a warning, never
dropped silently. If a CSV has a ``split`` column, only rows of the requested
split are used, so one combined CSV works too.

Class indices are positions in the sorted class names of *all* splits of the
layout (``train``, ``val`` and ``test``, whichever exist), so train and val
always agree. To pin the map across machines or dataset versions, store it
once and pass it back::

    index = load_index(root, "train")
    save_classes(index.classes, "runs/exp1/classes.txt")   # anywhere writable
    val = load_index(root, "val", classes=load_classes("runs/exp1/classes.txt"))

Nothing is ever written under ``ROOT``, which may be read-only.

The records and the reader of each layout are in :mod:`daliload.dataset._layouts`;
this module picks the layout of a split and reads and writes class maps.
"""

from __future__ import annotations

import logging
import os
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Literal, Sequence

from daliload.dataset._paths import decoded_path, printable_path
from daliload.dataset._layouts import (
    CSV_REQUIRED,
    SPLIT_ALIASES,
    SPLITS,
    VIDEO_EXTENSIONS,
    DatasetIndex,
    Skipped,
    VideoRecord,
    default_csv,
    load_csv,
    load_folders,
    load_list,
    unindexed,
)

logger = logging.getLogger(__name__)

Layout = Literal["auto", "folders", "csv", "list"]
_LAYOUTS = ("auto", "folders", "csv", "list")


def save_classes(classes: Sequence[str], path: str | os.PathLike) -> None:
    """Write the class map, one name per line in label order (UTF-8).

    Raises:
        ValueError: a name is empty, has a line break or is listed twice.
    """
    for name in classes:
        if not name or "\n" in name or "\r" in name or name != name.strip():
            raise ValueError(f"class name {name!r} cannot be stored one per line "
                             f"(empty, line break or surrounding spaces)")
    if len(set(classes)) != len(classes):
        repeated = sorted(n for n in set(classes) if list(classes).count(n) > 1)
        raise ValueError(f"class names repeat: {repeated}")
    Path(path).write_text("".join(f"{name}\n" for name in classes), encoding="utf-8")


def load_classes(path: str | os.PathLike) -> tuple[str, ...]:
    """Read a class map written by :func:`save_classes`.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: the file is empty or lists a class twice.
    """
    names = tuple(line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines()
                  if line.strip())
    if not names:
        raise ValueError(f"class map {path} lists no classes")
    if len(set(names)) != len(names):
        raise ValueError(f"class map {path} lists a class twice")
    return names


def load_index(
    root: str | bytes | os.PathLike,
    split: str = "train",
    *,
    layout: Layout = "auto",
    annotations: str | os.PathLike | None = None,
    list_file: str | os.PathLike | None = None,
    classes: Sequence[str] | None = None,
) -> DatasetIndex:
    """Index one split of a Kinetics-style dataset (layouts in the module docstring).

    Args:
        root: dataset root (``bytes`` are read as :func:`os.fsdecode` reads them).
        split: ``"train"``, ``"val"`` or ``"test"`` (``"validate"`` means ``"val"``).
        layout: ``"auto"`` (default) uses, in this order, ``annotations`` or
            ``list_file`` if given, else ``ROOT/annotations/<split>.csv``, else
            ``ROOT/<split>/``, else ``ROOT/<split>list.txt``.
        annotations: the split's CSV, if not ``ROOT/annotations/<split>.csv``.
            Its directory is where the other splits' CSVs are looked for.
        list_file: the split's list file, if not ``ROOT/<split>list.txt``.
        classes: a stored class map (see :func:`load_classes`) to use instead of
            computing one from all splits.

    Returns:
        :class:`DatasetIndex` with records sorted by path.

    Raises:
        FileNotFoundError: ``root``, or the file or folder the layout needs, is missing.
        ValueError: unknown split or layout; the split has no videos; a CSV lacks
            columns; a list line is malformed; a class is not in ``classes``.
    """
    root_path = Path(os.path.abspath(decoded_path(root)))
    if not root_path.is_dir():
        raise FileNotFoundError(f"dataset root {root_path} does not exist or is not a directory")
    split = _check_split(split)
    if layout not in _LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; choose from {', '.join(_LAYOUTS)}")
    if classes is not None:
        classes = tuple(classes)
        if not classes:
            raise ValueError("classes= is empty; pass the stored class map or None")

    csv_path = Path(annotations) if annotations is not None else default_csv(root_path, split)
    list_path = Path(list_file) if list_file is not None else root_path / f"{split}list.txt"
    if layout == "auto":
        layout = _pick_layout(root_path, split, csv_path, list_path,
                              annotations is not None, list_file is not None)

    if layout == "folders":
        index = load_folders(root_path, split, classes)
    elif layout == "csv":
        index = load_csv(root_path, split, csv_path, classes)
    else:
        index = load_list(root_path, split, list_path, classes)
    if index.layout != "folders":  # the folders layout collects what it skips while listing
        index = replace(index, skipped=unindexed(root_path / split, index))
    if index.skipped:
        logger.info("%d entries of %s are not indexed (see DatasetIndex.skipped)", len(index.skipped),
                    printable_path(root_path / split))
    if index.missing:
        shown = ", ".join(map(printable_path, index.missing[:3])) + (", ..." if len(index.missing) > 3 else "")
        warnings.warn(f"{len(index.missing)} file(s) of split {split!r} listed in the "
                      f"{index.layout} index are missing from {printable_path(root_path)}: {shown} "
                      f"(see DatasetIndex.missing)", stacklevel=2)
    return index


def _check_split(split: str) -> str:
    split = SPLIT_ALIASES.get(split, split)
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; allowed: {', '.join(SPLITS)}")
    return split


def _pick_layout(root: Path, split: str, csv_path: Path, list_path: Path,
                 csv_given: bool, list_given: bool) -> str:
    if csv_given:
        return "csv"
    if list_given:
        return "list"
    if csv_path.is_file():
        return "csv"
    if (root / split).is_dir():
        return "folders"
    if list_path.is_file():
        return "list"
    raise FileNotFoundError(
        f"no {split!r} split under {root}: looked for {csv_path}, {root / split}/ and {list_path}")


__all__ = ["VideoRecord", "DatasetIndex", "Skipped", "load_index", "save_classes", "load_classes", "SPLITS",
           "CSV_REQUIRED", "VIDEO_EXTENSIONS", "Layout"]
