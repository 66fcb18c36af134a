"""A file of ``path label`` lines per split (``layout="path_label"``), and a Python list of pairs as one.

::

    ROOT/
      train.csv            path,label            a header line, or none
      val.csv              clips/a.mp4,3         comma separated (quoted as CSV quotes), or
      test.txt             clips/b c.mp4 3       whitespace separated (.txt): the label is the last field
      classes.txt          optional: one class name per line, in label order
      clips/...            anywhere: a path is relative to ROOT, or absolute

``ROOT/<split>.csv`` is read if it exists, else ``ROOT/<split>.txt``. Labels
are either all integers or all class names (the first row decides):

* class names: indices are positions in ``classes.txt``, or in the sorted
  names of every split's file (``train``, ``val``, ``test`` and this one);
* integers, 0- or 1-based: with ``classes.txt`` (``K`` names) they count
  from 0 unless ``K`` itself appears (then from 1); without it, they count
  from 0 if a 0 appears in any split's file, from 1 if every value
  ``1..max`` appears and no 0, and are refused as ambiguous otherwise (the
  message says how to settle it). Class names then come from ``classes.txt``,
  else from the videos' folders when each label's files share one, else
  they are the label numbers.

A ``root`` given as a list of ``(path, label)`` pairs (:func:`write_pairs`)
becomes such a file, ``<split>.csv`` with absolute paths, in a folder of the
per-user cache named by a digest of its content
(``~/.cache/daliload/lists/<digest>/``, or under ``$XDG_CACHE_HOME``); the
manifest of its scan goes beside it (``.daliload/manifest.sqlite``), unless
``ScanSpec(manifest_path=...)`` puts it elsewhere.
"""

from __future__ import annotations

import csv
import hashlib
import logging
import os
from pathlib import Path
from typing import Sequence

from daliload.dataset._layouts import SPLITS, DatasetIndex, VideoRecord
from daliload.dataset._official import finish_split
from daliload.dataset._registry import DatasetLayout

logger = logging.getLogger(__name__)

_PATH_HEADERS = {"path", "video", "file", "filename", "video_path", "name", "clip"}
_LABEL_HEADERS = {"label", "labels", "class", "class_name", "classname", "category", "target", "label_id"}


def split_file(root: Path, split: str, fold: int | None = None) -> Path:
    """``ROOT/<split>.csv`` if it exists, else ``ROOT/<split>.txt``... or the ``.csv`` that is missing."""
    csv_path = root / f"{split}.csv"
    txt_path = root / f"{split}.txt"
    return txt_path if not csv_path.exists() and txt_path.exists() else csv_path


def read_rows(path: Path) -> list[tuple[int, str, str]]:
    """``(line number, path, label)`` of each row (a header row left out).

    Raises:
        FileNotFoundError: no such file.
        ValueError: a row without a path and a label (the message names the file and line).
    """
    if not path.is_file():
        raise FileNotFoundError(f"split file {path} does not exist")
    rows = []
    # surrogateescape: bytes that are not UTF-8 name the file whose name holds them (as os.scandir decodes it)
    with open(path, encoding="utf-8", errors="surrogateescape", newline="") as f:
        if path.suffix.lower() == ".csv":
            reader = csv.reader(f)
            for fields in reader:
                rows.append((reader.line_num, [x.strip() for x in fields]))
        else:
            rows = [(n, line.strip().rsplit(None, 1)) for n, line in enumerate(f, start=1)]
    out = []
    for number, fields in rows:
        if not fields or fields == [""]:
            continue
        if len(fields) < 2 or not fields[0] or not fields[1]:
            raise ValueError(f"{path} line {number}: expected '<path> <label>' "
                             f"({'comma' if path.suffix.lower() == '.csv' else 'whitespace'} separated), "
                             f"got {', '.join(fields)!r}")
        if not out and (fields[0].lower() in _PATH_HEADERS or fields[1].lower() in _LABEL_HEADERS):
            out.append(None)  # a header: not a video
            continue
        out.append((number, fields[0], fields[1]))
    return [row for row in out if row is not None]


def _is_index(text: str) -> bool:
    return text.lstrip("-").isdecimal()


def _split_rows(root: Path, split: str, rows: list) -> dict[Path, list]:
    """This split's rows, and every other split's file beside it (they share one class map)."""
    files = {split_file(root, split): rows}
    for other in SPLITS:
        path = split_file(root, other)
        if other != split and path.is_file() and path not in files:
            files[path] = read_rows(path)
    return files


def _base(files: dict[Path, list], classes_file: tuple[str, ...] | None, where: Path) -> int:
    """0 or 1: what the integer labels of ``files`` count from (see the module docstring)."""
    values = {int(label) for rows in files.values() for _, _, label in rows}
    if 0 in values:
        return 0
    if classes_file is not None:
        return 1 if len(classes_file) in values else 0
    if values == set(range(1, max(values) + 1)):
        logger.info("labels of %s are 1..%d with no 0: read as 1-based", where, max(values))
        return 1
    gaps = sorted(set(range(1, max(values) + 1)) - values)[:5]
    raise ValueError(f"labels of {where} are integers with no 0 and gaps ({', '.join(map(str, gaps))} missing of "
                     f"1..{max(values)}): cannot tell whether they count from 0 or from 1; write "
                     f"{where.parent / 'classes.txt'} (one class name per line, in label order), whose length "
                     "settles it, or use class names as labels")


def _names_by_folder(entries: list[tuple[str, int]], count: int) -> tuple[str, ...]:
    """Class names for label indices: the videos' folder names when each label's files share one and no two
    labels share one; else the numbers."""
    names: dict[int, set[str]] = {}
    for path, label in entries:
        names.setdefault(label, set()).add(Path(path).parent.name)
    chosen = {label: next(iter(n)) for label, n in names.items() if len(n) == 1}
    if len(chosen) == count and len(set(chosen.values())) == count and all(chosen.values()):
        return tuple(chosen[i] for i in range(count))
    return tuple(str(i) for i in range(count))


def read_path_label(root: Path, split: str, fold: int | None, classes: tuple[str, ...] | None) -> DatasetIndex:
    path = split_file(root, split)
    rows = read_rows(path)
    if classes is None and (root / "classes.txt").is_file():
        classes_file: tuple[str, ...] | None = load_classes(root / "classes.txt")
    else:
        classes_file = classes
    numeric = bool(rows) and _is_index(rows[0][2])
    files = _split_rows(root, split, rows)
    for where, others in files.items():
        for number, _, label in others:
            if numeric and (not _is_index(label) or int(label) < 0):
                raise ValueError(f"{where} line {number}: label {label!r} is not a class index >= 0 (the file's "
                                 "labels are integers: its first row's is); give every row an index, or every "
                                 "row a class name")
    if numeric:
        base = _base(files, classes_file, path) if rows else 0
        count = max(int(label) for rows_ in files.values() for _, _, label in rows_) + 1 - base
        found = classes_file or _names_by_folder([(p, int(label) - base) for rows_ in files.values()
                                                  for _, p, label in rows_], count)
        basis = f"{base}-based" + (f", {len(classes_file)} classes in classes.txt" if classes_file else "")
        labelled = []
        for number, rel, text in rows:
            label = int(text) - base
            if not 0 <= label < len(found):
                raise ValueError(f"{path} line {number}: label {text} is outside the class map of {len(found)} "
                                 f"classes (labels read as {basis})")
            labelled.append((rel, label))
    else:
        found = classes_file or tuple(sorted({label for rows_ in files.values() for _, _, label in rows_}))
        lookup = {name: i for i, name in enumerate(found)}
        labelled = []
        for number, rel, name in rows:
            if name not in lookup:
                raise ValueError(f"{path} line {number}: class {name!r} is not in the class map of {len(found)} "
                                 f"classes ({'classes.txt' if classes_file else 'classes='})")
            labelled.append((rel, lookup[name]))
    records, missing = [], []
    for rel, label in labelled:
        video = root / rel
        if not video.is_file():
            missing.append(str(video))
            continue
        records.append(VideoRecord(os.path.abspath(video), label, found[label], split))
    return finish_split(root, split, "path_label", path, tuple(found), records, missing)


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


def _side_files(root: Path) -> list[str]:
    if not root.is_dir():
        return []
    return [p.name for p in sorted(root.iterdir()) if p.suffix.lower() in (".csv", ".txt")
            and not p.name.endswith("list.txt") and p.is_file()]


PATH_LABEL = DatasetLayout("path_label", split_file, read_path_label, _side_files, rewrite=True,
                           describe="ROOT/<split>.csv or ROOT/<split>.txt of '<path> <label>' lines")


def lists_folder() -> Path:
    """Where lists of pairs given as a root are kept: ``$XDG_CACHE_HOME/daliload/lists`` (``~/.cache``)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "daliload" / "lists"


def write_pairs(pairs: Sequence, split: str) -> Path:
    """The root of a list of ``(path, label)`` pairs: a folder holding them as ``<split>.csv`` (see the module
    docstring), made once per content; labels are all class indices (0-based) or all class names.

    Raises:
        TypeError: a pair that is not ``(path, label)``, or labels of both kinds.
        ValueError: an empty list, or a negative label.
        FileNotFoundError: a file of the list does not exist (the first ones are named).
    """
    if not len(pairs):
        raise ValueError("root is an empty list; give (path, label) pairs")
    entries: list[tuple[str, int | str]] = []
    for i, pair in enumerate(pairs):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2 or not isinstance(pair[0], (str, os.PathLike)):
            raise TypeError(f"root[{i}] is {pair!r:.80}; each item of a list root is a (path, label) pair")
        label = pair[1]
        if isinstance(label, bool) or not isinstance(label, (int, str)) or (isinstance(label, str) and not label):
            raise TypeError(f"root[{i}] has label {label!r}: a label is a class index (int) or a class name (str)")
        if isinstance(label, int) and label < 0:
            raise ValueError(f"root[{i}] has label {label}: class indices are >= 0")
        if entries and isinstance(label, int) != isinstance(entries[0][1], int):
            raise TypeError(f"root[{i}] has label {label!r} but root[0] {entries[0][1]!r}: give every pair a class "
                            "index, or every pair a class name")
        entries.append((os.path.abspath(os.fspath(pair[0])), label))
    gone = [p for p, _ in entries if not os.path.isfile(p)]
    if gone:
        raise FileNotFoundError(f"{len(gone)} file(s) of the list given as root do not exist: "
                                + ", ".join(gone[:3]) + (", ..." if len(gone) > 3 else ""))
    lines = ["path,label"]
    lines += [_csv_line(p, str(label)) for p, label in sorted(entries, key=lambda e: e[0])]
    classes = None
    if isinstance(entries[0][1], int):  # indices as given: a class map as long as they need says they count from 0
        count = max(int(label) for _, label in entries) + 1
        classes = _names_by_folder([(p, int(label)) for p, label in entries], count)
    text = "\n".join(lines) + "\n"
    digest = hashlib.sha256(f"{split}\0{text}\0{classes}".encode("utf-8", "surrogateescape")).hexdigest()[:20]
    folder = lists_folder() / digest
    if not (folder / f"{split}.csv").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        if classes is not None:
            _write_atomically(folder / "classes.txt", "".join(f"{name}\n" for name in classes))
        _write_atomically(folder / f"{split}.csv", text)
    return folder


def _csv_line(*fields: str) -> str:
    import io

    out = io.StringIO()
    csv.writer(out, lineterminator="").writerow(fields)
    return out.getvalue()


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.partial-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8", errors="surrogateescape", newline="") as f:
        f.write(text)
    os.replace(tmp, path)
