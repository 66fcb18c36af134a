"""The dataset index: three layouts, one answer; bad input gives errors that say what to fix."""

from __future__ import annotations

import csv
import re
import shutil
import warnings
from pathlib import Path

import pytest

from daliload.dataset import DatasetIndex, Skipped, VideoRecord, load_classes, load_index, save_classes
from daliload.synth.dataset import generate_dataset
from daliload.synth.spec import SynthSpec


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """3 classes x 3 tiny H.264 clips (1 val each) + one garbage file, all three layouts."""
    spec = SynthSpec(num_classes=3, clips_per_class=3, val_fraction=0.34, width=64, height=48,
                     duration_s=1, broken_fraction=0.12, broken_kinds=("garbage",), seed=5)
    return generate_dataset(tmp_path_factory.mktemp("index") / "kinetics", spec, progress=False)


@pytest.fixture
def copy(generated, tmp_path):
    """A scratch copy of the generated dataset to damage."""
    return Path(shutil.copytree(generated.root, tmp_path / "k"))


def _files(root: Path) -> dict[str, int]:
    return {p.relative_to(root).as_posix(): p.stat().st_mtime_ns for p in root.rglob("*")}


@pytest.mark.parametrize("split", ["train", "val"])
def test_three_layouts_give_identical_records(generated, split):
    root = Path(generated.root)
    before = _files(root)
    indexes = {layout: load_index(root, split, layout=layout)
               for layout in ("folders", "csv", "list")}
    assert _files(root) == before  # nothing written under ROOT
    folders = indexes["folders"]
    for layout, index in indexes.items():
        assert (index.layout, index.split, index.root) == (layout, split, str(root))
        assert index.records == folders.records and index.classes == folders.classes, layout
        assert index.missing == ()
    expected = sorted((str(root / c.path), c) for c in generated.split(split))
    assert folders.classes == generated.classes == ("bounce vertical", "still", "sway horizontal")
    assert folders.records == tuple(
        VideoRecord(path, c.label, c.class_name, split, c.youtube_id, float(c.time_start),
                    float(c.time_end)) for path, c in expected)
    assert len(folders) == len(generated.split(split)) == {"train": 6, "val": 3}[split]
    assert any(c.broken == "garbage" for c in generated.clips)  # listed, not probed: scan's job


def test_auto_prefers_csv_then_folders_then_list(copy):
    assert load_index(copy, "train").layout == "csv"
    shutil.rmtree(copy / "annotations")
    assert load_index(copy, "train").layout == "folders"
    moved = copy / "lists"
    moved.mkdir()
    (copy / "vallist.txt").rename(moved / "vallist.txt")
    assert load_index(copy, "val", list_file=moved / "vallist.txt").layout == "list"
    shutil.rmtree(copy / "val")
    looked = (f"csv ({copy / 'annotations' / 'val.csv'}), folders ({copy / 'val'}), list ({copy / 'vallist.txt'}), "
              f"path_label ({copy / 'val.csv'}), ucf101 ({copy / 'ucfTrainTestlist' / 'vallist01.txt'}), ")
    with pytest.raises(FileNotFoundError,
                       match=re.escape(f"no 'val' split under {copy} in any layout: looked for {looked}")):
        load_index(copy, "val")


def test_class_map_comes_from_all_splits(copy):
    # A class with no val files, and one that only val has, still get the same indices in both.
    shutil.rmtree(copy / "val" / "still")
    (copy / "val" / "zigzag").mkdir()
    (copy / "val" / "zigzag" / "ABCDEFGHIJK_000001_000002.mp4").write_bytes(b"")
    train = load_index(copy, "train", layout="folders")
    val = load_index(copy, "val", layout="folders")
    assert train.classes == val.classes == ("bounce vertical", "still", "sway horizontal", "zigzag")
    assert {r.class_name: r.label for r in val.records}["zigzag"] == 3
    assert train.class_to_idx == {"bounce vertical": 0, "still": 1, "sway horizontal": 2,
                                  "zigzag": 3}


def test_stored_class_map_is_reused(generated, tmp_path):
    index = load_index(generated.root, "train")
    save_classes(index.classes, tmp_path / "classes.txt")
    assert (tmp_path / "classes.txt").read_text() == "bounce vertical\nstill\nsway horizontal\n"
    stored = load_classes(tmp_path / "classes.txt")
    assert stored == index.classes
    # A map with an extra class (e.g. from a bigger dataset version) shifts nothing it names.
    bigger = ("archery", *stored)
    val = load_index(generated.root, "val", classes=bigger)
    assert val.classes == bigger
    assert {r.class_name: r.label for r in val.records} == {"bounce vertical": 1, "still": 2,
                                                            "sway horizontal": 3}
    by_folders = load_index(generated.root, "val", layout="folders", classes=bigger)
    assert by_folders.records == val.records
    # A list file's labels are indices: classes= names them, it cannot renumber them.
    assert load_index(generated.root, "val", layout="list", classes=stored).records == \
        load_index(generated.root, "val", layout="folders").records


def test_stale_class_map_is_rejected(generated):
    for layout, where in (("folders", "folder"), ("csv", r"val.csv line \d")):
        with pytest.raises(ValueError, match=rf"class '[a-z ]+' \(.*{where}.*is not in the class "
                                             r"map of 2 classes; the stored map is stale"):
            load_index(generated.root, "val", layout=layout, classes=("archery", "still"))
    with pytest.raises(ValueError,
                       match=r"vallist.txt line \d: label 2 is outside the class map of 2"):
        load_index(generated.root, "val", layout="list", classes=("a", "b"))


def test_save_classes_refuses_names_it_cannot_store(tmp_path):
    with pytest.raises(ValueError, match=r"class name 'a\\nb' cannot be stored one per line"):
        save_classes(["a\nb"], tmp_path / "c.txt")
    with pytest.raises(ValueError, match=r"class names repeat: \['a'\]"):
        save_classes(["a", "b", "a"], tmp_path / "c.txt")
    (tmp_path / "empty.txt").write_text("\n")
    with pytest.raises(ValueError, match="lists no classes"):
        load_classes(tmp_path / "empty.txt")


def test_missing_csv_files_are_reported_not_dropped(copy, generated):
    gone = [c for c in generated.split("train")][:2]
    for c in gone:
        (copy / c.path).unlink()
    with pytest.warns(UserWarning, match=r"2 file\(s\) of split 'train' listed in the csv index "
                                         r"are missing from .*see DatasetIndex.missing"):
        index = load_index(copy, "train")
    assert index.missing == tuple(sorted(
        str(copy / "train" / c.class_name / f"{c.youtube_id}_{c.time_start:06d}_{c.time_end:06d}.*")
        for c in gone))
    assert len(index.records) == 4
    with pytest.warns(UserWarning, match=r"2 file\(s\) of split 'train' listed in the list index"):
        assert len(load_index(copy, "train", layout="list").missing) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the folders layout has nothing to miss
        assert load_index(copy, "train", layout="folders").missing == ()


def test_all_files_missing_is_an_empty_split(copy, generated):
    for c in generated.split("val"):
        (copy / c.path).unlink()
    val_dir = re.escape(str(copy / "val"))
    with pytest.raises(ValueError, match=rf"split 'val' is empty: no videos found in {val_dir} "
                                         r"via the csv layout .*"
                                         r"\(3 listed file\(s\) are missing\)"):
        load_index(copy, "val")


def test_kinetics_csv_variants(copy):
    # Kinetics-400 names its val CSV validate.csv; a combined CSV is filtered by its split column.
    (copy / "annotations" / "val.csv").rename(copy / "annotations" / "validate.csv")
    assert load_index(copy, "val").layout == "csv"
    assert load_index(copy, "validate").split == "val"
    combined = copy / "all.csv"
    with open(combined, "w", newline="") as out:
        for name in ("train.csv", "validate.csv"):
            lines = (copy / "annotations" / name).read_text().splitlines(keepends=True)
            out.writelines(lines if name == "train.csv" else lines[1:])
    both = {s: load_index(copy, s, annotations=combined) for s in ("train", "val")}
    assert both["val"].records == load_index(copy, "val", layout="folders").records
    assert both["train"].records == load_index(copy, "train", layout="folders").records


def test_folders_layout_takes_any_video_name_and_skips_other_files(tmp_path):
    for split in ("train", "val"):
        (tmp_path / split / "a b").mkdir(parents=True)
        (tmp_path / split / "a b" / "my clip.MP4").write_bytes(b"")
    (tmp_path / "train" / "a b" / "notes.txt").write_text("x")
    (tmp_path / "train" / "a b" / ".hidden.mp4").write_bytes(b"")
    (tmp_path / "train" / "a b" / "raw.h264").write_bytes(b"")
    (tmp_path / "train" / "a b" / "extras").mkdir()
    (tmp_path / "train" / "README").write_text("x")
    index = load_index(tmp_path, "train")
    folder = tmp_path / "train" / "a b"
    assert index == DatasetIndex(str(tmp_path), "train", "folders", ("a b",), (
        VideoRecord(str(folder / "my clip.MP4"), 0, "a b", "train"),
        VideoRecord(str(folder / "raw.h264"), 0, "a b", "train"),
    ), skipped=(  # sorted by path
        Skipped(str(tmp_path / "train" / "README"), "not in a class folder"),
        Skipped(str(folder / ".hidden.mp4"), "hidden file"),
        Skipped(str(folder / "extras"), "a folder inside a class folder (not searched)"),
        Skipped(str(folder / "notes.txt"), "not a video extension: .txt"),
    ))


def test_every_layout_lists_what_it_does_not_index(copy):
    """The CSV and list layouts name the entries of the split folder that they do not hold, with why."""
    folder = next(d for d in (copy / "train").iterdir() if d.is_dir())
    (folder / "notes.txt").write_text("x")
    extra = folder / "unlisted_clip.mp4"
    shutil.copyfile(next(folder.glob("*.mp4")), extra)
    stray = copy / "train" / "stray.webm"
    stray.write_bytes(b"")
    expected = {
        "csv": {str(extra): "not in the annotation CSV", str(stray): "not in the annotation CSV"},
        "list": {str(extra): "not in the list file", str(stray): "not in the list file"},
        "folders": {str(stray): "not in a class folder"},
    }
    for layout, unlisted in expected.items():
        index = load_index(copy, "train", layout=layout)
        assert dict(index.skipped) == {**unlisted, str(folder / "notes.txt"): "not a video extension: .txt"}, layout
        assert list(index.skipped) == sorted(index.skipped)


# ---------------------------------------------------------------- bad input

def test_missing_root(tmp_path):
    nope = re.escape(str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match=rf"dataset root {nope} does not exist"):
        load_index(tmp_path / "nope")


def test_any_split_name_is_looked_for(generated):
    with pytest.raises(FileNotFoundError, match=r"no 'training' split under .* in any layout: looked for csv "
                                                r"\(.*/annotations/training.csv\), folders \(.*/training\)"):
        load_index(generated.root, "training")
    with pytest.raises(ValueError, match=r"split must be a name such as 'train'.*got 'a/b'"):
        load_index(generated.root, "a/b")


def test_unknown_layout(generated):
    with pytest.raises(ValueError,
                       match=r"unknown layout 'json'; choose from csv, folders, list, path_label, ucf101, hmdb51, "
                             r"ssv2, shards \(or None / 'auto' to detect it\)"):
        load_index(generated.root, layout="json")


def test_empty_split_names_the_folder(tmp_path):
    (tmp_path / "train" / "abseiling").mkdir(parents=True)
    (tmp_path / "train" / "abseiling" / "readme.txt").write_text("no videos here")
    train_dir = re.escape(str(tmp_path / "train"))
    with pytest.raises(ValueError, match=rf"split 'train' is empty: no videos found in "
                                         rf"{train_dir} via the folders layout .*: its class folders hold no "
                                         r"video \(1 other entries\)\. Put each video in a folder named after"):
        load_index(tmp_path, "train")


def test_videos_outside_class_folders_are_named_in_the_empty_split_error(tmp_path, make_clip):
    """Videos directly in ROOT/train/ (no class folders, no CSV): the error says what it found and where
    each layout wants them, not only that the split is empty."""
    (tmp_path / "train").mkdir()
    for name in ("a.mp4", "b.mp4"):
        shutil.copyfile(make_clip("h264", num_frames=10), tmp_path / "train" / name)
    with pytest.raises(ValueError) as caught:
        load_index(tmp_path, "train")
    message = str(caught.value)
    assert "it holds 2 video file(s) directly, outside class folders" in message
    assert str(tmp_path / "annotations" / "train.csv") in message and str(tmp_path / "trainlist.txt") in message


def test_explicit_layout_with_missing_source(generated, tmp_path):
    (tmp_path / "train").mkdir()
    csv_path = re.escape(str(tmp_path / "annotations" / "train.csv"))
    with pytest.raises(FileNotFoundError, match=rf"annotation CSV {csv_path} does not exist"):
        load_index(tmp_path, layout="csv")
    with pytest.raises(FileNotFoundError, match=r"list file .*trainlist.txt does not exist"):
        load_index(tmp_path, layout="list")
    with pytest.raises(FileNotFoundError, match=r"split folder .*test does not exist"):
        load_index(generated.root, "test", layout="folders")


def test_csv_without_needed_columns(copy):
    path = copy / "annotations" / "train.csv"
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([["label", "youtube_id", "start", "end"], ["still", "x", "1", "2"]])
    with pytest.raises(ValueError, match=(
            rf"annotation CSV {re.escape(str(path))} lacks column\(s\) time_start, time_end: "
            r"it has label, youtube_id, start, end; "
            r"expected label,youtube_id,time_start,time_end\[,split\]")):
        load_index(copy, "train")
    path.write_text("")
    with pytest.raises(ValueError, match=r"lacks column\(s\) label, youtube_id, time_start, "
                                         r"time_end: it has no header"):
        load_index(copy, "train")


def test_csv_with_bad_times(copy):
    path = copy / "annotations" / "val.csv"
    path.write_text("label,youtube_id,time_start,time_end,split\n"
                    "still,abcdefghijk,soon,later,val\n")
    with pytest.raises(ValueError, match=r"val.csv line 2: time_start/time_end must be numbers, "
                                         r"got 'soon', 'later'"):
        load_index(copy, "val")


def test_malformed_list_lines(copy):
    path = copy / "trainlist.txt"
    path.write_text("train/still/a.mp4 1\ntrain/still/b.mp4\n")
    with pytest.raises(ValueError, match=r"trainlist.txt line 2: expected '<path> <label index>', "
                                         r"got 'train/still/b.mp4'"):
        load_index(copy, "train", layout="list")
    path.write_text("train/still/a.mp4 1\ntrain/blink/b.mp4 1\n")
    with pytest.raises(ValueError, match=r"line 2: label 1 is folder 'blink' here but 'still' "
                                         r"at .* write them one per line in label order in .*classes.txt"):
        load_index(copy, "train", layout="list")
    path.write_text("train/still/a.mp4 4\n")
    (copy / "vallist.txt").unlink()
    with pytest.raises(ValueError, match=r"no file names the class of label\(s\) \[0, 1, 2, 3\] \(labels counted "
                                         r"from 0; from 1 when .*\); to name the labels otherwise"):
        load_index(copy, "train", layout="list")


def test_one_based_list_files_are_read_as_such(copy):
    """UCF101-style lists count labels from 1: no list of the root names a 0, and every label from 1 up is named."""
    for split in ("train", "val"):
        path = copy / f"{split}list.txt"
        path.write_text("".join(f"{rel} {int(label) + 1}\n" for rel, _, label in
                                (line.rpartition(" ") for line in path.read_text().splitlines())))
    for split in ("train", "val"):
        assert load_index(copy, split, layout="list").records == load_index(copy, split, layout="folders").records
    with pytest.raises(ValueError, match=r"trainlist.txt line \d+: label \d+ is outside the class map of 3 classes "
                                         r"\(labels counted from 0\)"):
        (copy / "trainlist.txt").write_text((copy / "trainlist.txt").read_text() + "train/still/x.mp4 9\n")
        load_index(copy, "train", layout="list", classes=("a", "b", "c"))
