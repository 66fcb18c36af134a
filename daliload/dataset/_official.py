"""The official downloads of UCF101, HMDB51 and Something-Something v2, unpacked under a root, as layouts.

UCF101 (``layout="ucf101"``; ``UCF101.rar`` and ``UCF101TrainTestSplits-RecognitionTask.zip``)::

    ROOT/
      UCF-101/
        ApplyEyeMakeup/
          v_ApplyEyeMakeup_g01_c01.avi
          ...
        ...
      ucfTrainTestlist/
        classInd.txt            "1 ApplyEyeMakeup": the class of each label, 1-based
        trainlist01.txt         "ApplyEyeMakeup/v_ApplyEyeMakeup_g08_c01.avi 1" (1-based label)
        testlist01.txt          "ApplyEyeMakeup/v_ApplyEyeMakeup_g01_c01.avi" (class from the folder)
        trainlist02.txt ... testlist03.txt

HMDB51 (``layout="hmdb51"``; ``hmdb51_org.rar`` with its inner archives unpacked, and
``test_train_splits.rar``)::

    ROOT/
      hmdb51/
        brush_hair/
          April_09_brush_hair_u_nm_np1_ba_goo_0.avi
          ...
      testTrainMulti_7030_splits/
        brush_hair_test_split1.txt     "April_09_brush_hair_u_nm_np1_ba_goo_0.avi 1"
        ...                            1 = train, 2 = test, 0 = in neither (this fold)

Something-Something v2 (``layout="ssv2"``)::

    ROOT/
      20bn-something-something-v2/
        1.webm                         <id>.webm (any video extension: found by id)
        ...
      labels/
        labels.json                    {"Approaching something with your camera": "0", ...}
        train.json                     [{"id": "78687", "template": "Holding [something] next to [something]", ...}]
        validation.json                the same ("val" and "validation" both read it)
        test.json                      [{"id": "1420"}]: no labels, refused

For UCF101 and HMDB51, ``split="train"`` or ``"test"`` is fold 1 unless
``fold=`` (1..3) says otherwise, as torchvision's ``UCF101`` and ``HMDB51``
take it; ``"trainlist02"`` is the train split of fold 2. Labels are 0-based
positions in the class list (``classInd.txt`` order for UCF101, sorted
folder names for HMDB51, ``labels.json``'s numbers for SSv2).
"""

from __future__ import annotations

import json
from pathlib import Path

from daliload.dataset._layouts import DatasetIndex, VideoRecord, _stems
from daliload.dataset._registry import DatasetLayout, list_files

UCF_VIDEOS, UCF_LISTS = "UCF-101", "ucfTrainTestlist"
HMDB_VIDEOS, HMDB_SPLITS = "hmdb51", "testTrainMulti_7030_splits"
SSV2_VIDEOS, SSV2_LABELS = "20bn-something-something-v2", "labels"
#: SSv2's JSON file of each split name.
SSV2_FILES = {"train": "train.json", "val": "validation.json", "test": "test.json"}


def _lines(path: Path) -> list[tuple[int, str]]:
    """``(line number, text)`` of the non-empty lines of a split file (surrogateescape, as file names are)."""
    if not path.is_file():
        raise FileNotFoundError(f"split file {path} does not exist")
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        return [(n, line.strip()) for n, line in enumerate(f, start=1) if line.strip()]


def finish_split(root: Path, split: str, layout: str, source: Path, classes: tuple[str, ...],
                 records: list[VideoRecord], missing: list[str]) -> DatasetIndex:
    """A split file's index: its records sorted by path, what it names that is missing; refused when empty."""
    if not records:
        raise empty_split(split, layout, source, root, len(missing))
    records.sort(key=lambda r: r.path)
    return DatasetIndex(str(root), split, layout, classes, tuple(records), tuple(sorted(missing)))


def empty_split(split: str, layout: str, source: Path, root: Path, missing: int) -> ValueError:
    """A split whose file names no video that exists (the Kinetics layouts say it their own way)."""
    extra = f": all {missing} file(s) it lists are missing" if missing else ""
    return ValueError(f"split {split!r} is empty: {source} names no video under {root} via the {layout} "
                      f"layout{extra}")


def _checked_classes(found: tuple[str, ...], given: tuple[str, ...] | None, source: Path) -> tuple[str, ...]:
    if given is not None and tuple(given[:len(found)]) != found:
        raise ValueError(f"classes= does not begin with the {len(found)} classes of {source} in their order; "
                         "the stored map is stale or from another dataset")
    return tuple(given) if given is not None else found


# ------------------------------------------------------------------------------------------------ UCF101

def _ucf_list(root: Path, split: str, fold: int | None) -> Path:
    return root / UCF_LISTS / f"{split}list{fold or 1:02d}.txt"


def ucf_classes(root: Path) -> tuple[str, ...]:
    """The classes of ``classInd.txt``, in label order.

    Raises:
        FileNotFoundError: no ``classInd.txt``.
        ValueError: a line is not ``<index> <name>``, or the indices are not 1..N.
    """
    path = root / UCF_LISTS / "classInd.txt"
    names: dict[int, str] = {}
    for number, line in _lines(path):
        index, _, name = line.partition(" ")
        if not index.isdigit() or not name.strip():
            raise ValueError(f"{path} line {number}: expected '<index> <class name>', got {line!r}")
        names[int(index)] = name.strip()
    if sorted(names) != list(range(1, len(names) + 1)):
        raise ValueError(f"{path}: class indices must be 1..{len(names)}, got {sorted(names)[:5]}...")
    return tuple(names[i] for i in range(1, len(names) + 1))


def read_ucf101(root: Path, split: str, fold: int | None, classes: tuple[str, ...] | None) -> DatasetIndex:
    path = _ucf_list(root, split, fold)
    lines = _lines(path)
    found = ucf_classes(root)
    lookup = {name: i for i, name in enumerate(found)}
    classes = _checked_classes(found, classes, root / UCF_LISTS / "classInd.txt")
    records, missing = [], []
    for number, line in lines:
        rel, _, label_text = line.partition(" ")
        folder = Path(rel).parent.name
        if label_text.strip():
            if not label_text.strip().isdigit() or not 1 <= int(label_text) <= len(found):
                raise ValueError(f"{path} line {number}: label {label_text.strip()!r} is outside 1..{len(found)}, "
                                 f"the 1-based labels of classInd.txt")
            label = int(label_text) - 1
            if folder != found[label]:
                raise ValueError(f"{path} line {number}: label {label + 1} is {found[label]!r} in classInd.txt, "
                                 f"but the file is in folder {folder!r}")
        elif folder in lookup:  # the test lists carry no label: the folder names the class
            label = lookup[folder]
        else:
            raise ValueError(f"{path} line {number}: folder {folder!r} is not a class of classInd.txt")
        video = root / UCF_VIDEOS / rel
        if not video.is_file():
            missing.append(str(video))
            continue
        records.append(VideoRecord(str(video), label, found[label], split))
    return finish_split(root, split, "ucf101", path, classes, records, missing)


UCF101 = DatasetLayout(
    "ucf101", _ucf_list, read_ucf101,
    lambda root: list_files(root / UCF_LISTS, "*.txt", f"{UCF_LISTS}/"), rewrite=True, folds=3,
    describe=f"{UCF_VIDEOS}/<Class>/v_*.avi beside {UCF_LISTS}/ (classInd.txt, trainlist0N.txt, testlist0N.txt)")


# ------------------------------------------------------------------------------------------------ HMDB51

def _hmdb_mark(root: Path, split: str, fold: int | None) -> Path:
    # A split is there when the split files of its fold are; "val" and others are not HMDB51's.
    folder = root / HMDB_SPLITS
    return folder / f"<class>_test_split{fold or 1}.txt" if split not in _HMDB_FLAGS else folder


_HMDB_FLAGS = {"train": "1", "test": "2"}


def read_hmdb51(root: Path, split: str, fold: int | None, classes: tuple[str, ...] | None) -> DatasetIndex:
    folder = root / HMDB_SPLITS
    if split not in _HMDB_FLAGS:
        raise FileNotFoundError(f"HMDB51 has no split {split!r}: its split files ({folder}) say train (1) or "
                                "test (2) per video; pass split='train' or 'test'")
    fold = fold or 1
    suffix = f"_test_split{fold}.txt"
    files = sorted(p for p in folder.glob(f"*{suffix}") if p.is_file()) if folder.is_dir() else []
    if not files:
        raise FileNotFoundError(f"no split files of fold {fold} in {folder} (<class>{suffix})")
    found = tuple(p.name[:-len(suffix)] for p in files)
    classes = _checked_classes(found, classes, folder)
    records, missing = [], []
    for label, path in enumerate(files):
        for number, line in _lines(path):
            name, _, flag = line.rpartition(" ")
            if flag not in ("0", "1", "2") or not name.strip():
                raise ValueError(f"{path} line {number}: expected '<video name> 0|1|2' (1 train, 2 test, 0 neither), "
                                 f"got {line!r}")
            if flag != _HMDB_FLAGS[split]:
                continue
            video = root / HMDB_VIDEOS / found[label] / name.strip()
            if not video.is_file():
                missing.append(str(video))
                continue
            records.append(VideoRecord(str(video), label, found[label], split))
    return finish_split(root, split, "hmdb51", folder, classes, records, missing)


HMDB51 = DatasetLayout(
    "hmdb51", _hmdb_mark, read_hmdb51, lambda root: list_files(root / HMDB_SPLITS, "*.txt", f"{HMDB_SPLITS}/"),
    rewrite=True, folds=3,
    describe=f"{HMDB_VIDEOS}/<class>/*.avi beside {HMDB_SPLITS}/<class>_test_split<fold>.txt")


# ------------------------------------------------------------------------------------------------ SSv2

def _ssv2_file(root: Path, split: str, fold: int | None = None) -> Path:
    return root / SSV2_LABELS / SSV2_FILES.get(split, f"{split}.json")


def _load_json(path: Path) -> object:
    if not path.is_file():
        raise FileNotFoundError(f"label file {path} does not exist")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from err


def ssv2_classes(root: Path) -> tuple[str, ...]:
    """The templates of ``labels.json`` (``{"Approaching something with your camera": "0"}``) in label order."""
    path = root / SSV2_LABELS / "labels.json"
    table = _load_json(path)
    if not isinstance(table, dict):
        raise ValueError(f"{path}: expected an object of template -> label number")
    by_label: dict[int, str] = {}
    for name, value in table.items():
        if not str(value).isdigit():
            raise ValueError(f"{path}: label of {name!r} is {value!r}, not a number")
        by_label[int(value)] = name
    if sorted(by_label) != list(range(len(by_label))):
        raise ValueError(f"{path}: labels must be 0..{len(by_label) - 1}, each once")
    return tuple(by_label[i] for i in range(len(by_label)))


def read_ssv2(root: Path, split: str, fold: int | None, classes: tuple[str, ...] | None) -> DatasetIndex:
    path = _ssv2_file(root, split)
    entries = _load_json(path)
    found = ssv2_classes(root)
    lookup = {name: i for i, name in enumerate(found)}
    classes = _checked_classes(found, classes, root / SSV2_LABELS / "labels.json")
    if not isinstance(entries, list):
        raise ValueError(f"{path}: expected a list of {{\"id\": ..., \"template\": ...}} objects")
    videos = _stems(root / SSV2_VIDEOS)
    records, missing = [], []
    for number, entry in enumerate(entries, start=1):
        if not isinstance(entry, dict) or "id" not in entry:
            raise ValueError(f"{path} entry {number}: expected an object with an \"id\", got {entry!r:.80}")
        if "template" not in entry:
            raise ValueError(f"{path} entry {number} (id {entry['id']}) has no \"template\": this split has no "
                             "labels (Something-Something's test set); train on 'train', evaluate on 'validation'")
        template = str(entry["template"]).replace("[", "").replace("]", "")
        if template not in lookup:
            raise ValueError(f"{path} entry {number} (id {entry['id']}): template {template!r} is not in labels.json")
        video = videos.get(str(entry["id"]))
        if video is None:
            missing.append(str(root / SSV2_VIDEOS / f"{entry['id']}.webm"))
            continue
        records.append(VideoRecord(video, lookup[template], template, split))
    return finish_split(root, split, "ssv2", path, classes, records, missing)


SSV2 = DatasetLayout(
    "ssv2", _ssv2_file, read_ssv2, lambda root: list_files(root / SSV2_LABELS, "*.json", f"{SSV2_LABELS}/"),
    describe=f"{SSV2_VIDEOS}/<id>.webm beside {SSV2_LABELS}/ (labels.json, train.json, validation.json)")

__all__ = ["HMDB51", "SSV2", "UCF101", "ssv2_classes", "ucf_classes"]
