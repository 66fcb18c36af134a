"""The registry of dataset layouts: one record per layout says how a split is found, read and transcoded.

A :class:`DatasetLayout` names a layout (``"folders"``, ``"ucf101"``, ...),
the path that marks a split of it under a root (a folder or a split file:
what detection looks for, and what an error names when it is missing), how
a split is read into a :class:`~daliload.dataset.DatasetIndex`, and which
other files ``daliload transcode`` copies beside the videos. :data:`LAYOUTS`
holds them in detection order; :func:`register_layout` adds one.
:func:`detect_layout` picks the first whose mark exists, and
:func:`resolve_split` reads a split name and a fold the way the layout
means them (``"trainlist02"`` of UCF101 is ``("train", 2)``).

The layouts themselves are drawn in :mod:`daliload.dataset._index` (the
Kinetics three), :mod:`daliload.dataset._official` (UCF101, HMDB51,
Something-Something v2) and :mod:`daliload.dataset._pathlabel` (a file of
``path label`` lines).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from daliload.dataset._layouts import SPLIT_ALIASES, VIDEO_EXTENSIONS

if TYPE_CHECKING:
    from daliload.dataset._layouts import DatasetIndex

#: ``read(root, split, fold, classes)``: the split's index (``fold`` is None for a layout without folds).
Reader = Callable[[Path, str, "int | None", "tuple[str, ...] | None"], "DatasetIndex"]


@dataclass(frozen=True)
class DatasetLayout:
    """One dataset layout, as the registry knows it.

    Attributes:
        name: what ``layout=`` takes (``"ucf101"``).
        mark: ``mark(root, split, fold)``: the file or folder whose existence
            says that ``root`` holds ``split`` in this layout (detection looks
            for it; errors name it).
        read: ``read(root, split, fold, classes)``: the split's
            :class:`~daliload.dataset.DatasetIndex`; ``classes`` a stored
            class map or None.
        side_files: ``side_files(root)``: the files besides the videos that
            ``daliload transcode`` copies (relative paths, ``/``-separated).
        rewrite: whether those files name videos with their extension (each
            such name is given the output's ``.mp4``); False: copied as they are.
        folds: how many official train/test folds the layout has (0: none;
            then ``fold=`` is refused).
        describe: one line for errors and docs: where a split lives.
    """

    name: str
    mark: Callable[[Path, str, "int | None"], Path]
    read: Reader
    side_files: Callable[[Path], list[str]]
    rewrite: bool = False
    folds: int = 0
    describe: str = ""

    def has_split(self, root: Path, split: str, fold: int | None) -> bool:
        return self.mark(root, split, fold).exists()


#: Every layout, in detection order (the first whose mark exists wins).
LAYOUTS: dict[str, DatasetLayout] = {}


def register_layout(layout: DatasetLayout) -> DatasetLayout:
    """Add ``layout`` to :data:`LAYOUTS` (after the others: detection tries it last).

    Raises:
        ValueError: a layout of that name is registered already, or the name is ``"auto"``.
    """
    if layout.name in LAYOUTS or layout.name == "auto" or not layout.name:
        raise ValueError(f"layout name {layout.name!r} is taken; registered: {', '.join(LAYOUTS)}")
    LAYOUTS[layout.name] = layout
    return layout


def get_layout(name: str) -> DatasetLayout:
    """The layout called ``name``.

    Raises:
        ValueError: no such layout (the message names the registered ones).
    """
    try:
        return LAYOUTS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown layout {name!r}; choose from {', '.join(LAYOUTS)} "
                         f"(or None / 'auto' to detect it)") from None


def check_split(split: object) -> str:
    """A split name: any non-empty name of a file (``"train"``, ``"holdout"``, ``"trainlist02"``);
    ``"validate"`` and ``"validation"`` mean ``"val"``.

    Raises:
        ValueError: not a string, empty, or holding a path separator.
    """
    if not isinstance(split, str) or not split.strip() or "/" in split or "\\" in split or "\0" in split \
            or split.startswith("."):
        raise ValueError(f"split must be a name such as 'train', 'val', 'test' or 'trainlist02', got {split!r}")
    return SPLIT_ALIASES.get(split, split)


_FOLD_NAME = re.compile(r"(train|test)(?:list|_split|split)?0*([1-9][0-9]*)")


def resolve_split(layout: DatasetLayout, split: str, fold: int | None) -> tuple[str, int | None]:
    """``(split, fold)`` as ``layout`` reads them: for a layout with folds, ``"trainlist02"`` is
    ``("train", 2)`` and no fold means fold 1; without folds, ``fold`` must be None.

    Raises:
        ValueError: ``fold`` outside ``1..layout.folds``, given to a layout without folds, or other
            than the one the split's name says.
    """
    split = check_split(split)
    if not layout.folds:
        if fold is not None:
            folded = ", ".join(n for n, lay in LAYOUTS.items() if lay.folds)
            raise ValueError(f"fold={fold!r} is for layouts with official folds ({folded}); the {layout.name} "
                             f"layout has none: leave fold out")
        return split, None
    if fold is not None and (isinstance(fold, bool) or not isinstance(fold, int) or not 1 <= fold <= layout.folds):
        raise ValueError(f"fold must be 1..{layout.folds} for the {layout.name} layout, got {fold!r}")
    named = _FOLD_NAME.fullmatch(split)
    if named:
        if fold is not None and fold != int(named[2]):
            raise ValueError(f"split {split!r} is fold {int(named[2])} but fold={fold}: give one of them")
        fold = int(named[2])
        if not 1 <= fold <= layout.folds:
            raise ValueError(f"split {split!r} names fold {fold}; the {layout.name} layout has folds "
                             f"1..{layout.folds}")
        split = named[1]
    return split, fold if fold is not None else 1


def detect_layout(root: Path, split: str, fold: int | None = None) -> DatasetLayout:
    """The first layout of :data:`LAYOUTS` whose mark for ``split`` exists under ``root``.

    Raises:
        FileNotFoundError: none does; the message names every layout and the path it looked for.
        ValueError: a bad split name or fold.
    """
    check_split(split)
    looked = []
    for layout in LAYOUTS.values():
        if fold is not None and not layout.folds:
            continue  # a fold: only a layout with folds
        name, layout_fold = resolve_split(layout, split, fold)
        if layout.has_split(root, name, layout_fold):
            return layout
        looked.append(f"{layout.name} ({layout.mark(root, name, layout_fold)})")
    raise FileNotFoundError(f"no {split!r} split under {root} in any layout: looked for " + ", ".join(looked)
                            + "; pass layout= to read it as one of them and be told what is missing")


_VIDEO_NAME = re.compile(r"(?<=[^\s/.])\.(" + "|".join(sorted(e[1:] for e in VIDEO_EXTENSIONS)) + r")(?=[\s,\"']|$)",
                         re.IGNORECASE | re.MULTILINE)


def rewrite_video_names(text: str, extension: str = ".mp4") -> str:
    """``text`` (a list, split file or CSV) with every video file name's extension made ``extension``
    (what a transcode writes); labels, order and line ends kept.

    >>> rewrite_video_names("train/a b/x.webm 3\\nnotes.txt 1\\nApplyLipstick/v_a.avi,2\\n")
    'train/a b/x.mp4 3\\nnotes.txt 1\\nApplyLipstick/v_a.mp4,2\\n'
    """
    return _VIDEO_NAME.sub(extension, text)


def side_files(root: Path) -> list[tuple[str, bool]]:
    """``(relative path, rewrite)`` of every file beside the videos of ``root`` that some layout reads,
    sorted (what ``daliload transcode`` copies)."""
    found: dict[str, bool] = {}
    for layout in LAYOUTS.values():
        for rel in layout.side_files(root):
            found[rel] = found.get(rel, False) or layout.rewrite
    return sorted(found.items())


def list_files(folder: Path, pattern: str, prefix: str = "") -> list[str]:
    """``prefix`` + the names of the regular files in ``folder`` matching ``pattern``, sorted."""
    if not folder.is_dir():
        return []
    return [prefix + p.name for p in sorted(folder.glob(pattern)) if p.is_file()]
