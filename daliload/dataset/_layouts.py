"""A split's records, and how each dataset layout is read into them.

:class:`VideoRecord`, :class:`Skipped` and :class:`DatasetIndex` are what
:func:`daliload.dataset.load_index` returns (the layouts are drawn in
:mod:`daliload.dataset._index`). :func:`load_folders`, :func:`load_csv` and
:func:`load_list` read one split in one layout, with the class map of all
splits or the one given; :func:`unindexed` lists what a split folder holds
that the index does not, and why. What counts as a video file (an extension of
:data:`VIDEO_EXTENSIONS`, not hidden, a regular file) and what a Kinetics file
name says (``<youtube_id>_<start:06d>_<end:06d>``) are decided here.

A file name need not be UTF-8: its ``str`` is the one ``os.scandir`` gives
(bytes that are not UTF-8 decoded with ``surrogateescape``), and the CSV and
list files are read the same way, so the bytes they hold name the same file.
"""

from __future__ import annotations

import csv
import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, NamedTuple

#: The usual split names (Kinetics' three): whose files make one class map, and what a transcode reads by
#: default. A split may have any other name.
SPLITS: tuple[str, ...] = ("train", "val", "test")
#: Columns a CSV must have; ``split`` is optional.
CSV_REQUIRED = ("label", "youtube_id", "time_start", "time_end")
#: File extensions counted as videos in the folders layout (lower case).
VIDEO_EXTENSIONS = frozenset({
    ".mp4", ".webm", ".mkv", ".avi", ".mov", ".m4v", ".flv", ".mpg", ".mpeg", ".ts", ".3gp",
    ".ogv", ".wmv", ".ivf",
    # raw elementary streams: no container, but FFmpeg's demuxers read them
    ".h264", ".264", ".h265", ".265", ".hevc",
})
#: Older Kinetics releases call the val split "validate".
SPLIT_ALIASES = {"validate": "val", "validation": "val"}


class VideoRecord(NamedTuple):
    """One video of a split (a tuple: 650k of them are built at every listing of Kinetics-700).

    Attributes:
        path: absolute path of the file.
        label: class index (position of ``class_name`` in :attr:`DatasetIndex.classes`).
        class_name: class name, e.g. ``"air drumming"``.
        split: the split's name (``"train"``, ``"val"``, ``"test"``, or any other).
        youtube_id: YouTube id when the CSV or the file name gives it, else None.
        time_start, time_end: span in the source video, in seconds, where known.
    """

    path: str
    label: int
    class_name: str
    split: str
    youtube_id: str | None = None
    time_start: float | None = None
    time_end: float | None = None


class Skipped(NamedTuple):
    """A file of a split folder that is not indexed, and why (``"not a video extension: .txt"``)."""

    path: str
    reason: str


@dataclass(frozen=True)
class DatasetIndex:
    """The videos of one split.

    Attributes:
        root: dataset root (absolute).
        split: the split these records are from.
        layout: the layout that was parsed (a name of :data:`daliload.dataset.LAYOUTS`:
            ``"folders"``, ``"csv"``, ``"list"``, ``"path_label"``, ``"ucf101"``, ...).
        classes: class names; position = label index.
        records: the videos, sorted by path.
        missing: absolute paths named by CSV rows (or list lines) whose file
            does not exist, sorted; empty for the folders layout.
        skipped: entries of ``ROOT/<split>/`` and its class folders that are
            not in ``records``, with the reason, sorted by path.
    """

    root: str
    split: str
    layout: str
    classes: tuple[str, ...]
    records: tuple[VideoRecord, ...]
    missing: tuple[str, ...] = ()
    skipped: tuple[Skipped, ...] = ()

    def __len__(self) -> int:
        return len(self.records)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def class_to_idx(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.classes)}


def default_csv(root: Path, split: str) -> Path:
    """The split's annotation CSV: ``ROOT/annotations/<split>.csv``, or an older name's (``validate.csv``) if only
    that one exists."""
    path = root / "annotations" / f"{split}.csv"
    if not path.exists():
        for alias, name in SPLIT_ALIASES.items():
            if name == split and (root / "annotations" / f"{alias}.csv").exists():
                return root / "annotations" / f"{alias}.csv"
    return path


def _class_map(names: Iterable[str], classes: tuple[str, ...] | None) -> tuple[str, ...]:
    return classes if classes is not None else tuple(sorted(set(names)))


def _label_of(name: str, classes: tuple[str, ...], lookup: dict[str, int], where: str) -> int:
    try:
        return lookup[name]
    except KeyError:
        raise ValueError(f"class {name!r} ({where}) is not in the class map of {len(classes)} "
                         f"classes; the stored map is stale or from another dataset") from None


def _split_dirs(root: Path, split: str) -> list[Path]:
    """The folders of the usual splits and of ``split`` (a free name: ``"holdout"``)."""
    return [root / s for s in dict.fromkeys((*SPLITS, split)) if (root / s).is_dir()]


def _parse_name(path: Path) -> tuple[str | None, float | None, float | None]:
    """YouTube id and times from a Kinetics file name, or Nones."""
    return _parse_stem(path.stem)


def _parse_stem(stem: str) -> tuple[str | None, float | None, float | None]:
    """:func:`_parse_name` of a file name without its extension: ``<11 chars>_<6 digits>_<6 digits>``."""
    # Sliced rather than matched: a regex costs about 2 us a name, 1.3 s per listing of Kinetics-700.
    if len(stem) != 25 or stem[11] != "_" or stem[18] != "_" or "\n" in stem[:11]:
        return None, None, None
    start, end = stem[12:18], stem[19:25]
    if not (start.isdecimal() and end.isdecimal()):  # what a regex's \d takes
        return None, None, None
    return stem[:11], float(start), float(end)


def _empty_split(root: Path, split: str, layout: str, source: Path, missing: int = 0) -> ValueError:
    extra = f" ({missing} listed file(s) are missing)" if missing else ""
    return ValueError(f"split {split!r} is empty: no videos found in {root / split} "
                      f"via the {layout} layout ({source}){extra}")


def _empty_folders(root: Path, split: str, skipped: list[Skipped]) -> ValueError:
    """The folders layout found no video: what the split folder holds instead, and where videos go."""
    loose = sum(1 for e in skipped if e.reason == _UNLISTED["folders"]
                and os.path.splitext(e.path)[1].lower() in VIDEO_EXTENSIONS)
    inside = len(skipped) - sum(1 for e in skipped if e.reason == _UNLISTED["folders"])
    found = (f"it holds {loose} video file(s) directly, outside class folders" if loose else
             f"its class folders hold no video ({inside} other entries)" if inside else "it holds no video")
    return ValueError(
        f"split {split!r} is empty: no videos found in {root / split} via the folders layout "
        f"({root / split}/<class name>/<video>): {found}. Put each video in a folder named after its "
        f"class, or name them in {default_csv(root, split)} (columns label,youtube_id,time_start,time_end) "
        f"or {root / f'{split}list.txt'} ('<path> <label index>' lines)")


def load_folders(root: Path, split: str, classes: tuple[str, ...] | None) -> DatasetIndex:
    """The folders layout, listed with ``os.scandir`` (its entries know whether they are folders without a
    ``stat``), in one pass that also collects what is skipped."""
    split_dir = root / split
    if not split_dir.is_dir():
        raise FileNotFoundError(f"split folder {split_dir} does not exist")
    names = (e.name for s in _split_dirs(root, split) for e in _entries(s) if _kind(e)[0])
    classes = _class_map(names, classes)
    lookup = {name: i for i, name in enumerate(classes)}
    records, skipped = [], []
    for class_dir in _entries(split_dir):
        if not _kind(class_dir)[0]:
            skipped.append(Skipped(class_dir.path, _UNLISTED["folders"]))
            continue
        label = None
        for entry in _entries(class_dir.path):
            why = _why_not_a_video(entry.name, *_kind(entry))
            if why:
                skipped.append(Skipped(entry.path, why))
                continue
            if label is None:
                label = _label_of(class_dir.name, classes, lookup, f"folder {class_dir.path}")
            stem = entry.name.rpartition(".")[0]
            records.append(VideoRecord(entry.path, label, class_dir.name, split, *_parse_stem(stem)))
    if not records:
        raise _empty_folders(root, split, skipped)
    records.sort(key=lambda r: r.path)
    return DatasetIndex(str(root), split, "folders", classes, tuple(records), skipped=tuple(sorted(skipped)))


def _entries(folder: str | os.PathLike) -> list[os.DirEntry]:
    """The entries of ``folder``, sorted by name."""
    with os.scandir(folder) as it:
        return sorted(it, key=lambda e: e.name)


def _not_a_video(path: Path) -> str:
    """Why an entry of a class folder cannot be a video, or ``""``."""
    return _why_not_a_video(path.name, *_kind(path))


def _kind(entry: os.DirEntry | Path) -> tuple[bool, bool, str]:
    """``(is a folder, is a regular file, why neither can be told)`` of an entry, links followed.

    ``os.DirEntry`` answers from the listing for what is not a link (no ``stat``:
    650k files); following a link loop (``a.mp4 -> b.mp4 -> a.mp4``) or a link
    this user may not follow raises there, where ``Path.is_file`` would answer
    ``False`` without saying why.
    """
    try:
        if isinstance(entry, os.DirEntry):
            return entry.is_dir(), entry.is_file(), ""
        mode = os.stat(entry).st_mode
    except FileNotFoundError:
        return False, False, ""  # a link to nothing: "not a regular file (... or broken link)"
    except OSError as err:
        if err.errno == errno.ELOOP:
            return False, False, "a symbolic link loop (too many levels of symbolic links)"
        return False, False, f"cannot be looked at: {err.strerror}"
    return stat.S_ISDIR(mode), stat.S_ISREG(mode), ""


def _why_not_a_video(name: str, is_dir: bool, is_file: bool, unknown: str = "") -> str:
    """Why an entry called ``name`` cannot be a video, or ``""``: ``is_file`` says it is a regular file
    (a link to one counts), ``is_dir`` a folder, ``unknown`` why ``stat`` could not tell (see :func:`_kind`)."""
    if name.startswith("."):
        return "hidden file"
    if is_dir:
        return "a folder inside a class folder (not searched)"
    dot = name.rfind(".")
    suffix = name[dot:] if dot > 0 else ""  # os.path.splitext's answer for a name that is not hidden
    if suffix.lower() not in VIDEO_EXTENSIONS:
        return f"not a video extension: {suffix or '(none)'}"
    if not is_file:
        # A FIFO, socket or device named like a video (or a link to nothing): probing it would hang
        # until the probe's time limit, at every scan.
        return unknown or "not a regular file (a FIFO, socket, device or broken link)"
    return ""


_UNLISTED = {"folders": "not in a class folder", "csv": "not in the annotation CSV", "list": "not in the list file"}


def unindexed(split_dir: Path, index: DatasetIndex) -> tuple[Skipped, ...]:
    """Entries of ``split_dir`` and its class folders that ``index`` does not hold, with why, sorted."""
    if not split_dir.is_dir():
        return ()
    indexed = {r.path for r in index.records}
    unlisted = _UNLISTED.get(index.layout, f"not in the {index.layout} split file")
    skipped = []
    for entry in split_dir.iterdir():
        if not entry.is_dir():  # directly in the split folder
            if str(entry) not in indexed:
                reason = unlisted if index.layout == "folders" else (_not_a_video(entry) or unlisted)
                skipped.append(Skipped(str(entry), reason))
            continue
        skipped += [Skipped(str(path), _not_a_video(path) or unlisted) for path in entry.iterdir()
                    if str(path) not in indexed]
    return tuple(sorted(skipped))


def _read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    # surrogateescape: bytes that are not UTF-8 name the file whose name holds them (as os.scandir decodes it)
    with open(path, encoding="utf-8", errors="surrogateescape", newline="") as f:
        reader = csv.DictReader(f)
        columns = [c.strip() for c in (reader.fieldnames or [])]
        rows = [{k.strip(): (v or "").strip() for k, v in row.items() if k is not None}
                for row in reader]
    missing = [c for c in CSV_REQUIRED if c not in columns]
    if missing:
        raise ValueError(f"annotation CSV {path} lacks column(s) {', '.join(missing)}: it has "
                         f"{', '.join(columns) or 'no header'}; expected "
                         f"{','.join(CSV_REQUIRED)}[,split]")
    return columns, rows


def load_csv(root: Path, split: str, csv_path: Path,
             classes: tuple[str, ...] | None) -> DatasetIndex:
    if not csv_path.is_file():
        raise FileNotFoundError(f"annotation CSV {csv_path} does not exist")
    columns, rows = _read_csv(csv_path)
    if "split" in columns:
        rows = [r for r in rows if SPLIT_ALIASES.get(r["split"], r["split"]) == split]
    if classes is None:
        names = {r["label"] for r in rows}
        for other in SPLITS:  # the other splits' CSVs beside this one
            other_path = csv_path.parent / f"{other}.csv"
            if other != split and other_path.is_file():
                names |= {r["label"] for r in _read_csv(other_path)[1] if r["label"]}
        classes = _class_map(names, None)
    lookup = {name: i for i, name in enumerate(classes)}

    records, missing = [], []
    folders: dict[Path, dict[str, str]] = {}
    for line, row in enumerate(rows, start=2):
        where = f"{csv_path} line {line}"
        try:
            start, end = float(row["time_start"]), float(row["time_end"])
        except ValueError as err:
            raise ValueError(f"{where}: time_start/time_end must be numbers, got "
                             f"{row['time_start']!r}, {row['time_end']!r}") from err
        label = _label_of(row["label"], classes, lookup, where)
        stem = f"{row['youtube_id']}_{int(start):06d}_{int(end):06d}"
        candidates = (root / split / row["label"], root / split)
        found = None
        for folder in candidates:
            if folder not in folders:
                folders[folder] = _stems(folder)
            found = folders[folder].get(stem)
            if found is not None:
                break
        if found is None:
            missing.append(str(candidates[0] / f"{stem}.*"))
            continue
        records.append(
            VideoRecord(found, label, row["label"], split, row["youtube_id"], start, end))
    if not records:
        raise _empty_split(root, split, "csv", csv_path, len(missing))
    records.sort(key=lambda r: r.path)
    return DatasetIndex(str(root), split, "csv", classes, tuple(records), tuple(sorted(missing)))


def _stems(folder: Path) -> dict[str, str]:
    """Video files in ``folder`` by stem (first in name order wins)."""
    if not folder.is_dir():
        return {}
    stems: dict[str, str] = {}
    for path in sorted(folder.iterdir()):
        if path.suffix.lower() in VIDEO_EXTENSIONS and path.is_file():
            stems.setdefault(path.stem, str(path))
    return stems


def _read_list(path: Path) -> list[tuple[str, int, int]]:
    """``(relative path, label, line number)`` per non-empty line."""
    entries = []
    with open(path, encoding="utf-8", errors="surrogateescape") as f:  # as in _read_csv
        for number, line in enumerate(f, start=1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            rel, _, label = line.rstrip().rpartition(" ")
            if not rel or not label.lstrip("-").isdigit():
                raise ValueError(
                    f"{path} line {number}: expected '<path> <label index>', got {line!r}")
            if int(label) < 0:
                raise ValueError(f"{path} line {number}: label index must be >= 0, got {label}")
            entries.append((rel, int(label), number))
    return entries


def load_list(root: Path, split: str, list_path: Path,
              classes: tuple[str, ...] | None) -> DatasetIndex:
    if not list_path.is_file():
        raise FileNotFoundError(f"list file {list_path} does not exist")
    entries = _read_list(list_path)
    base = 0
    if classes is None:
        # Lists carry indices only; names come from the parent folders
        # (<split>/<class>/<file>) of this and the other splits' lists.
        seen: dict[int, tuple[str, str]] = {}
        fix = (f"to name the labels otherwise, write them one per line in label order in {root / 'classes.txt'} "
               f"and rename the list {root / f'{split}.txt'} (the path_label layout, docs/datasets.md)")
        for other in dict.fromkeys((*SPLITS, split)):
            other_path = list_path if other == split else list_path.parent / f"{other}list.txt"
            if other != split and not other_path.is_file():
                continue
            for rel, label, number in (entries if other == split else _read_list(other_path)):
                name = Path(rel).parent.name
                where = f"{other_path} line {number}"
                if label in seen and seen[label][0] != name:
                    raise ValueError(f"{where}: label {label} is folder {name!r} here but {seen[label][0]!r} at "
                                     f"{seen[label][1]}; {fix}")
                seen.setdefault(label, (name, where))
        if seen and 0 not in seen and sorted(seen) == list(range(1, max(seen) + 1)):
            base = 1  # no list names a 0 and every label from 1 up is named: counted from 1 (UCF101's lists)
            seen = {label - 1: named for label, named in seen.items()}
        gaps = sorted(set(range(max(seen) + 1)) - set(seen)) if seen else []
        if gaps:
            raise ValueError(f"{list_path}: no file names the class of label(s) {gaps[:10]} (labels counted from 0; "
                             f"from 1 when no list has a 0 and every label from 1 up is named); {fix}")
        classes = tuple(seen[i][0] for i in range(len(seen)))
    records, missing = [], []
    for rel, label, number in entries:
        if not 0 <= label - base < len(classes):
            raise ValueError(f"{list_path} line {number}: label {label} is outside the class map "
                             f"of {len(classes)} classes (labels counted from {base})")
        path = root / rel
        if not path.is_file():
            missing.append(str(path))
            continue
        records.append(VideoRecord(str(path), label - base, classes[label - base], split, *_parse_name(path)))
    if not records:
        raise _empty_split(root, split, "list", list_path, len(missing))
    records.sort(key=lambda r: r.path)
    return DatasetIndex(str(root), split, "list", classes, tuple(records), tuple(sorted(missing)))

