"""The ``shards`` layout: a split packed in webdataset-style tar shards, each video a member read by range.

::

    ROOT/
      classes.txt                 optional: the class map, one name per line in label order
      train-000000.tar            (or ROOT/train/*.tar: give layout="shards")
        abseiling/abc_000001_000011.mp4        members <class>/<file>.<ext>: the folder is the class
        ...
      train-000001.tar
        k0001.mp4  k0001.cls                   or webdataset keys: <key>.<ext> beside <key>.cls
        k0002.webm k0002.json                  (an integer label) or <key>.json ({"label": 3 or "name"})
      val-000000.tar

``daliload pack`` writes the first kind. A member is named as a video by its
shard and byte range (``ROOT/train-000000.tar#1536:1048576:abseiling/x.mp4``,
see :mod:`daliload.stream`); the scan, the plan and both decoders take that
name like a path, reading only the member's bytes, so a run on shards gives
the same samples as on the unpacked files (the same global shuffle: no
shuffle buffer). Listing a shard reads its headers only.

Labels: ``<key>.cls`` first, then ``<key>.json``'s ``"label"``, then the
member's folder. Class names come from ``classes`` (a stored map),
``ROOT/classes.txt``, or the sorted folder names of every split's shards;
integer labels without a map are their own names (``"0"``, ``"1"``, ...).
A member's name is only a key: one with ``..`` or a leading ``/`` is read
like any other, and nothing is ever written under it.
"""

from __future__ import annotations

import json
import posixpath
from pathlib import Path

from daliload.dataset._layouts import (VIDEO_EXTENSIONS, DatasetIndex, Skipped, VideoRecord, _parse_stem,
                                       _class_map)
from daliload.dataset._pathlabel import load_classes
from daliload.dataset._registry import DatasetLayout
from daliload.stream import member_address, read_member, shard_paths, tar_members

#: Members that carry a webdataset key's label.
_LABEL_SUFFIXES = (".cls", ".json")
#: The largest label member read (a class index or a small JSON object).
_LABEL_MAX_BYTES = 1 << 16


def is_label_member(name: str, size: int) -> bool:
    """Whether a shard's member ``name`` of ``size`` bytes is a label the layout reads (``<key>.cls``/``.json``)."""
    return name.endswith(_LABEL_SUFFIXES) and size <= _LABEL_MAX_BYTES


def _mark(root: Path, split: str, fold: int | None) -> Path:
    """The split's first shard; where there is none, the first that ``daliload pack`` would write.

    Detection finds ``ROOT/<split>-*.tar``; ``ROOT/<split>/*.tar`` needs
    ``layout="shards"`` (the folders layout, tried first, takes a split folder).
    """
    shards = shard_paths(root, split)
    return Path(shards[0]) if shards else root / f"{split}-000000.tar"


def _members(shard: str):
    with open(shard, "rb") as f:
        members = tar_members(f, shard)
        labels = {}
        for member in members:
            if is_label_member(member.name, member.size):
                labels[member.name] = read_member(f, member)
    return members, labels


def _key(name: str) -> tuple[str, str]:
    """webdataset's split of a member name at its basename's first dot: ``dir/k0001.mp4`` -> ``dir/k0001``, ``.mp4``."""
    folder, base = posixpath.split(name)
    stem, dot, rest = base.partition(".")
    return posixpath.join(folder, stem), dot + rest


def _label_of(key: str, labels: dict[str, bytes], where: str) -> int | str | None:
    if f"{key}.cls" in labels:
        text = labels[f"{key}.cls"].decode("utf-8", "replace").strip()
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{where}: {key}.cls holds {text[:40]!r}, not an integer label") from None
    if f"{key}.json" in labels:
        try:
            found = json.loads(labels[f"{key}.json"])
        except ValueError as err:
            raise ValueError(f"{where}: {key}.json is not JSON ({err})") from None
        label = found.get("label") if isinstance(found, dict) else None
        if not isinstance(label, (int, str)) or isinstance(label, bool):
            raise ValueError(f"{where}: {key}.json has no integer or string \"label\"")
        return label
    return None


def read_shards(root: Path, split: str, fold: int | None, classes: tuple[str, ...] | None) -> DatasetIndex:
    """The videos of ``split``'s shards under ``root`` (see the module doc).

    Raises:
        FileNotFoundError: no shard of the split (names what was looked for).
        ValueError: a compressed shard or one that is not a tar; a label that is
            not in the class map or cannot be read (names the shard and member).
    """
    shards = shard_paths(root, split)
    if not shards:
        raise FileNotFoundError(f"no shard of split {split!r}: looked for {root}/{split}-*.tar and "
                                f"{root}/{split}/*.tar")
    if classes is None and (root / "classes.txt").is_file():
        classes = load_classes(root / "classes.txt")
    found: list[tuple[str, str, int | str]] = []  # (address, file name, label or class name)
    skipped: list[Skipped] = []
    for shard in shards:
        members, labels = _members(shard)
        for member in members:
            address = member_address(shard, member)
            key, suffix = _key(member.name)
            if suffix.lower() in _LABEL_SUFFIXES:
                continue
            extension = posixpath.splitext(member.name)[1].lower()
            if extension not in VIDEO_EXTENSIONS:
                skipped.append(Skipped(address, f"not a video extension: {extension or '(none)'}"))
                continue
            label = _label_of(key, labels, shard)
            if label is None:
                label = posixpath.basename(posixpath.dirname(member.name))
                if not label or label in (".", ".."):
                    skipped.append(Skipped(address, "no label: not in a class folder, and no .cls or .json"))
                    continue
            found.append((address, posixpath.basename(member.name), label))
    if not found:
        raise ValueError(f"split {split!r} of {root}: its {len(shards)} shard(s) hold no labelled video"
                         + (f" ({len(skipped)} member(s) skipped, first: {skipped[0].reason})" if skipped else ""))
    if classes is None:
        names = {label for _, _, label in found if isinstance(label, str)}
        numbers = [label for _, _, label in found if isinstance(label, int)]
        if names and numbers:
            raise ValueError(f"split {split!r} of {root}: some members are labelled by class folder or name and "
                             "some by number; write ROOT/classes.txt (one class name per line, in label order)")
        classes = _class_map(_all_class_folders(root, split, names), None) if names else \
            tuple(str(i) for i in range(max(numbers) + 1))
    lookup = {name: i for i, name in enumerate(classes)}
    records = []
    for address, base, label in found:
        if isinstance(label, int):
            if not 0 <= label < len(classes):
                raise ValueError(f"{address}: label {label} is outside the {len(classes)} classes")
            index, name = label, classes[label]
        else:
            if label not in lookup:
                raise ValueError(f"{address}: class {label!r} is not in the class map of {len(classes)} classes")
            index, name = lookup[label], label
        records.append(VideoRecord(address, index, name, split, *_parse_stem(base.rpartition(".")[0])))
    records.sort(key=lambda r: r.path)
    return DatasetIndex(str(root), split, "shards", tuple(classes), tuple(records), skipped=tuple(sorted(skipped)))


def _all_class_folders(root: Path, split: str, names: set[str]) -> set[str]:
    """The class folders of this split and of the other splits' shards beside it (one class map for all)."""
    out = set(names)
    others = {p.name.rsplit("-", 1)[0] for p in root.glob("*-*.tar")} | {p.name for p in root.iterdir() if p.is_dir()}
    for other in sorted(others - {split}):
        for shard in shard_paths(root, other):
            with open(shard, "rb") as f:
                out.update(posixpath.basename(posixpath.dirname(m.name)) for m in tar_members(f, shard)
                           if posixpath.splitext(m.name)[1].lower() in VIDEO_EXTENSIONS)
    out.discard("")
    out -= {".", ".."}
    return out


SHARDS = DatasetLayout("shards", _mark, read_shards, lambda root: ["classes.txt"] if (root / "classes.txt").is_file()
                       else [], describe="ROOT/<split>-NNNNNN.tar (or ROOT/<split>/*.tar) of <class>/<video> "
                       "members or webdataset keys with .cls/.json labels")
