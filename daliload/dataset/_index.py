"""The dataset index: which video files a split holds, and their labels.

Layouts are records of a registry (:mod:`daliload.dataset._registry`,
:data:`LAYOUTS`): the three Kinetics layouts below (a Kinetics download
usually has the first two, and ``daliload synth`` writes all three), a
``path label`` file per split (:mod:`._pathlabel`), and the official downloads
of UCF101, HMDB51 and Something-Something v2 (:mod:`._official`); each is
drawn in its module and in ``docs/datasets.md``::

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
layout (``train``, ``val`` and ``test``, whichever exist, and the one asked
for), so train and val always agree. To pin the map across machines or dataset versions, store it
once and pass it back::

    index = load_index(root, "train")
    save_classes(index.classes, "runs/exp1/classes.txt")   # anywhere writable
    val = load_index(root, "val", classes=load_classes("runs/exp1/classes.txt"))

Nothing is ever written under ``ROOT``, which may be read-only.

The records and the reader of each layout are in :mod:`daliload.dataset._layouts`;
this module registers them, picks the layout of a split and reads and writes class maps.
"""

from __future__ import annotations

import logging
import os
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from daliload.dataset._official import HMDB51, SSV2, UCF101
from daliload.dataset._pathlabel import PATH_LABEL, load_classes, save_classes
from daliload.dataset._shards import SHARDS
from daliload.dataset._paths import decoded_path, printable_path
from daliload.dataset._registry import (LAYOUTS, DatasetLayout, detect_layout, get_layout, list_files,
                                        register_layout, resolve_split, rewrite_video_names)
from daliload.dataset._layouts import (
    CSV_REQUIRED,
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

#: A layout's name (see :data:`LAYOUTS`), or ``"auto"`` / ``None``: detect it.
Layout = str


# The registry, in detection order: today's three first (a Kinetics root keeps the layout it always had).
for _layout in (
    DatasetLayout("csv", lambda root, split, fold: default_csv(root, split),
                  lambda root, split, fold, classes: load_csv(root, split, default_csv(root, split), classes),
                  lambda root: list_files(root / "annotations", "*.csv", "annotations/"),
                  describe="ROOT/annotations/<split>.csv (label,youtube_id,time_start,time_end[,split])"),
    DatasetLayout("folders", lambda root, split, fold: root / split,
                  lambda root, split, fold, classes: load_folders(root, split, classes), lambda root: [],
                  describe="ROOT/<split>/<class name>/<video>"),
    DatasetLayout("list", lambda root, split, fold: root / f"{split}list.txt",
                  lambda root, split, fold, classes: load_list(root, split, root / f"{split}list.txt", classes),
                  lambda root: list_files(root, "*list.txt"), rewrite=True,
                  describe="ROOT/<split>list.txt of '<path> <label index>' lines"),
    PATH_LABEL, UCF101, HMDB51, SSV2, SHARDS,
):
    register_layout(_layout)


def load_index(
    root: str | bytes | os.PathLike,
    split: str = "train",
    *,
    layout: Layout | None = None,
    fold: int | None = None,
    annotations: str | os.PathLike | None = None,
    list_file: str | os.PathLike | None = None,
    classes: Sequence[str] | None = None,
) -> DatasetIndex:
    """Index one split of a dataset, in any layout of the registry (drawn in the module docstring and in
    ``docs/datasets.md``).

    Args:
        root: dataset root (``bytes`` are read as :func:`os.fsdecode` reads them).
        split: any name (``"train"``, ``"val"``, ``"test"``, ``"holdout"``); ``"validate"`` and
            ``"validation"`` mean ``"val"``. For UCF101 and HMDB51, ``"trainlist02"`` is
            ``split="train", fold=2``.
        layout: a name of :data:`LAYOUTS` (``"folders"``, ``"csv"``, ``"list"``, ``"path_label"``,
            ``"ucf101"``, ``"hmdb51"``, ``"ssv2"``), or ``None``/``"auto"`` (default): ``annotations``
            or ``list_file`` if given, else the first layout whose split file or folder exists, in
            that order (``ROOT/annotations/<split>.csv``, ``ROOT/<split>/``, ``ROOT/<split>list.txt``,
            ``ROOT/<split>.csv`` or ``.txt``, ``ucfTrainTestlist/``, ``testTrainMulti_7030_splits/``,
            ``labels/<split>.json``).
        fold: for UCF101 and HMDB51, the official fold (1..3); default 1. Refused by other layouts.
        annotations: the split's CSV, if not ``ROOT/annotations/<split>.csv``.
            Its directory is where the other splits' CSVs are looked for.
        list_file: the split's list file, if not ``ROOT/<split>list.txt``.
        classes: a stored class map (see :func:`load_classes`) to use instead of
            computing one from all splits.

    Returns:
        :class:`DatasetIndex` with records sorted by path.

    Raises:
        FileNotFoundError: ``root``, or the file or folder the layout needs, is missing (the
            message names it; with no layout given, every layout and the path it looked for).
        ValueError: unknown layout; a fold out of range; the split has no videos; a CSV lacks
            columns; a line is malformed or its label out of range; a class is not in ``classes``.
    """
    root_path = Path(os.path.abspath(decoded_path(root)))
    if not root_path.is_dir():
        raise FileNotFoundError(f"dataset root {root_path} does not exist or is not a directory")
    chosen = None if layout in (None, "auto") else get_layout(layout)
    if classes is not None:
        classes = tuple(classes)
        if not classes:
            raise ValueError("classes= is empty; pass the stored class map or None")
    if chosen is None and (annotations is not None or list_file is not None):
        chosen = LAYOUTS["csv" if annotations is not None else "list"]
    if chosen is None:
        chosen = detect_layout(root_path, split, fold)
    split, fold = resolve_split(chosen, split, fold)

    if chosen.name == "csv" and annotations is not None:
        index = load_csv(root_path, split, Path(annotations), classes)
    elif chosen.name == "list" and list_file is not None:
        index = load_list(root_path, split, Path(list_file), classes)
    else:
        index = chosen.read(root_path, split, fold, classes)
    if index.layout not in ("folders", "shards"):  # these collect what they skip while listing
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


def layout_of(root: str | bytes | os.PathLike, split: str, layout: Layout | None = None,
              fold: int | None = None) -> tuple[str, str, int | None]:
    """``(layout name, split, fold)`` as :func:`load_index` would read them: the layout detected when
    ``layout`` is None, ``"trainlist02"`` of UCF101 as ``("ucf101", "train", 2)``.

    Raises:
        FileNotFoundError, ValueError: as :func:`load_index`.
    """
    root_path = Path(os.path.abspath(decoded_path(root)))
    chosen = get_layout(layout) if layout not in (None, "auto") else detect_layout(root_path, split, fold)
    split, fold = resolve_split(chosen, split, fold)
    return chosen.name, split, fold


__all__ = ["VideoRecord", "DatasetIndex", "Skipped", "load_index", "layout_of", "save_classes", "load_classes",
           "SPLITS", "CSV_REQUIRED", "VIDEO_EXTENSIONS", "Layout", "LAYOUTS", "DatasetLayout", "register_layout",
           "rewrite_video_names"]
