"""Which files a transcode writes where, and the dataset layout files it copies.

The files are those :func:`daliload.dataset.load_index` finds for each split
(``train``, ``val``, ``test``, whichever exist, or the ``--split`` ones; every
fold of UCF101 and HMDB51), with whatever layout the split has, so the output
holds exactly what training on the source reads. Each keeps its path relative to the root; only the extension
becomes ``.mp4``::

    SRC/train/abseiling/--07WQ2iBlw_000001_000011.webm
    DST/train/abseiling/--07WQ2iBlw_000001_000011.mp4

The layout files are copied beside them, as the registry of layouts
(:func:`daliload.dataset.side_files`) names them: those that find a video by
its name without extension as they are (``annotations/*.csv``, whose rows name
a YouTube id and times; Something-Something's ``labels/*.json``), those that
name a video file (``<split>list.txt``, ``<split>.csv``/``.txt``, UCF101's
``ucfTrainTestlist/``, HMDB51's split files) with each video name's extension
rewritten to ``.mp4``. Two sources that would become one output
(``a.webm`` and ``a.mkv``) are a clash: the first in path order is written,
the other is reported as failed.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from daliload.dataset import LAYOUTS, SPLITS, layout_of, load_index, rewrite_video_names, side_files
from daliload.transcode.encode import FileJob
from daliload.transcode.options import ALL_FILES, Shard, TranscodeOptions

OUTPUT_EXTENSION = ".mp4"


@dataclass(frozen=True)
class TranscodePlan:
    """What one share of a transcode does.

    Attributes:
        src_root, dst_root: absolute roots.
        splits: the splits read.
        jobs: this share's files, sorted by path.
        clashes: ``(rel, reason)`` of this share's files that would overwrite another's output.
        layout_files: relative paths of the files beside the videos that the layouts read
            (annotation CSVs, list and split files, label files), to copy.
        total_files: files of all shares.
    """

    src_root: str
    dst_root: str
    splits: tuple[str, ...]
    jobs: tuple[FileJob, ...]
    clashes: tuple[tuple[str, str], ...]
    layout_files: tuple[str, ...]
    total_files: int


def output_rel(rel: str) -> str:
    """The output path of a source path, both relative: the extension becomes ``.mp4``."""
    return PurePosixPath(rel).with_suffix(OUTPUT_EXTENSION).as_posix()


def plan_transcode(src: str | os.PathLike, dst: str | os.PathLike, options: TranscodeOptions, *,
                   splits: tuple[str, ...] = (), shard: Shard = ALL_FILES) -> TranscodePlan:
    """Find the files of ``src`` and this share's jobs.

    Raises:
        FileNotFoundError: ``src`` is not a directory, or a split asked for is missing.
        ValueError: ``dst`` is ``src`` or inside it; ``src`` has no split at all.
    """
    src_root, dst_root = Path(os.path.abspath(src)), Path(os.path.abspath(dst))
    if not src_root.is_dir():
        raise FileNotFoundError(f"transcode source {src_root} does not exist or is not a directory")
    if dst_root == src_root or src_root in dst_root.parents:
        raise ValueError(f"transcode output {dst_root} is the source or inside it; choose a folder outside "
                         f"{src_root}")
    found = _index_files(src_root, splits)
    if not found:
        looked = "; ".join(f"{layout.name}: {layout.describe}" for layout in LAYOUTS.values())
        raise ValueError(f"{src_root} holds no split ({', '.join(splits or SPLITS)}) in any layout ({looked})")
    outputs: dict[str, str] = {}
    jobs, clashes = [], []
    for rel in sorted(found):
        out = output_rel(rel)
        first = outputs.setdefault(out, rel)
        if not shard.holds(rel):
            continue
        if first != rel:
            clashes.append((rel, f"name clash: {first} also becomes {out}; rename one of them"))
            continue
        jobs.append(FileJob(str(src_root / rel), str(dst_root / out), rel, options, out))
    return TranscodePlan(str(src_root), str(dst_root), tuple(sorted({s for s in found.values()})), tuple(jobs),
                         tuple(clashes), tuple(rel for rel, _ in side_files(src_root)), len(found))


def _index_files(root: Path, splits: tuple[str, ...]) -> dict[str, str]:
    """Relative path -> split of every video the index finds."""
    found: dict[str, str] = {}
    for split in splits or SPLITS:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # missing files: the index of DST warns about them again
                name, _, fold = layout_of(root, split)
                # Every fold: a video HMDB51 leaves out of fold 1 is in fold 2's
                indexes = [load_index(root, split, fold=f) for f in range(1, LAYOUTS[name].folds + 1)] \
                    if fold is not None else [load_index(root, split)]
        except (FileNotFoundError, ValueError):
            if splits:
                raise
            continue  # this split does not exist in the source
        for index in indexes:
            for record in index.records:
                found[Path(record.path).relative_to(root).as_posix()] = index.split
    return found


def copy_layout_files(plan: TranscodePlan) -> None:
    """Copy the files the layouts read into the output root (video names made ``.mp4`` where they are
    named with their extension), each atomically."""
    rewrite = dict(side_files(Path(plan.src_root)))
    for rel in plan.layout_files:
        text = (Path(plan.src_root) / rel).read_text(encoding="utf-8", errors="surrogateescape")
        if rewrite.get(rel, False):
            text = rewrite_list(text)
        target = Path(plan.dst_root) / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.partial-{os.getpid()}")
        with open(tmp, "w", encoding="utf-8", errors="surrogateescape", newline="") as f:
            f.write(text)
        os.replace(tmp, target)


def rewrite_list(text: str) -> str:
    """A list or split file's text with every video name's extension made ``.mp4`` (labels and order kept).

    >>> rewrite_list("train/a b/x.webm 3\\nnotes.txt 1\\n")
    'train/a b/x.mp4 3\\nnotes.txt 1\\n'
    """
    return rewrite_video_names(text, OUTPUT_EXTENSION)
