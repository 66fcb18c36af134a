"""The registry's layouts read through the loader: UCF101, HMDB51, SSv2, a path-label file, a list of pairs.

Each layout is generated small (3 classes, a handful of tiny clips) and read
with ``KineticsDALILoader(root, layout=..., split=..., fold=..., device="cpu")``:
labels and class names, folds as the split files say, and the same batches as
the same videos laid out in class folders.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
import torch

from daliload.loader import DecodeSpec, KineticsDALILoader
from daliload.plan import AugmentSpec, OutputSpec

RAW = OutputSpec(size=(48, 64), mean=(0, 0, 0), std=(1, 1, 1), dtype="float32")
WHOLE = AugmentSpec(crop_size=(48, 64), crop_mode="center", flip_prob=0.5)
UCF_CLASSES = ("ApplyEyeMakeup", "Basketball", "Biking")  # classInd.txt order = sorted: folders agree
HMDB_CLASSES = ("brush_hair", "cartwheel", "catch")
TEMPLATES = {"Holding something": "0", "Pushing something from left to right": "1",
             "Putting something on a surface": "2"}


def make_loader(root, split="train", **kw) -> KineticsDALILoader:
    kw = {"batch_size": 2, "clip_len": 4, "frame_stride": 2, "augment": WHOLE, "output": RAW, "device": "cpu",
          "decode": DecodeSpec(routing="static", fallback_workers=1), **kw}
    return KineticsDALILoader(root, split, **kw)


def videos_of(loader) -> dict[str, tuple[int, str]]:
    """File name -> (label, class name) of the loader's split."""
    return {Path(p).name: (int(label), loader.classes[int(label)])
            for p, label in zip(loader.index.paths, loader.index.label)}


def batches(loader) -> list[tuple[torch.Tensor, torch.Tensor]]:
    try:
        return [(videos.clone(), labels.clone()) for videos, labels in loader]
    finally:
        loader.close()


@pytest.fixture(scope="module")
def clips(make_clip) -> list[Path]:
    """Nine tiny MPEG-4 Part 2 AVIs (UCF101's and HMDB51's codec), each of its own content."""
    return [make_clip("mpeg4", num_frames=10, width=64, height=48, class_id=i % 4, seed=i) for i in range(9)]


def ucf_name(cls: str, group: int) -> str:
    return f"v_{cls}_g{group:02d}_c01.avi"


@pytest.fixture(scope="module")
def ucf(tmp_path_factory, clips) -> Path:
    """UCF101 as downloaded: 3 classes x groups 1..3; fold k tests on group k and trains on the others."""
    root = tmp_path_factory.mktemp("ucf")
    lists = root / "ucfTrainTestlist"
    lists.mkdir()
    (lists / "classInd.txt").write_text("".join(f"{i + 1} {c}\n" for i, c in enumerate(UCF_CLASSES)))
    for c, cls in enumerate(UCF_CLASSES):
        (root / "UCF-101" / cls).mkdir(parents=True)
        for group in (1, 2, 3):
            shutil.copyfile(clips[c * 3 + group - 1], root / "UCF-101" / cls / ucf_name(cls, group))
    for fold in (1, 2, 3):
        train = [f"{cls}/{ucf_name(cls, g)} {c + 1}" for c, cls in enumerate(UCF_CLASSES) for g in (1, 2, 3)
                 if g != fold]
        test = [f"{cls}/{ucf_name(cls, fold)}" for cls in UCF_CLASSES]
        (lists / f"trainlist{fold:02d}.txt").write_text("\r\n".join(train) + "\r\n")  # as shipped: CRLF
        (lists / f"testlist{fold:02d}.txt").write_text("\r\n".join(test) + "\r\n")
    return root


def test_ucf101_folds_labels_and_class_names(ucf):
    loader = make_loader(ucf, "train", layout="ucf101")
    assert loader.classes == UCF_CLASSES
    assert videos_of(loader) == {ucf_name(cls, g): (c, cls) for c, cls in enumerate(UCF_CLASSES) for g in (2, 3)}
    test = make_loader(ucf, "test", layout="ucf101", fold=2)  # no label in the test list: the folder's class
    assert videos_of(test) == {ucf_name(cls, 2): (c, cls) for c, cls in enumerate(UCF_CLASSES)}
    fold2 = make_loader(ucf, "train", fold=2)  # detected
    by_name = make_loader(ucf, "trainlist02")
    assert videos_of(fold2) == videos_of(by_name) == {ucf_name(cls, g): (c, cls) for c, cls in enumerate(UCF_CLASSES)
                                                      for g in (1, 3)}
    assert by_name.split == "train" and by_name.scan.fold == 2
    # one manifest per fold: a fold's splits are not another's
    assert loader.manifest_path.name == "manifest.sqlite" and fold2.manifest_path.name == "manifest-fold2.sqlite"
    assert make_loader(ucf, "train", layout="ucf101").plan(0) == loader.plan(0)  # fold 1 again: unchanged
    for each in (loader, test, fold2, by_name):
        each.close()


def test_ucf101_gives_the_batches_of_the_same_videos_in_class_folders(ucf, tmp_path):
    folders = tmp_path / "folders"
    for split, groups in (("train", (2, 3)), ("test", (1,))):
        for cls in UCF_CLASSES:
            (folders / split / cls).mkdir(parents=True)
            for g in groups:
                shutil.copyfile(ucf / "UCF-101" / cls / ucf_name(cls, g), folders / split / cls / ucf_name(cls, g))
    for split in ("train", "test"):
        a, b = make_loader(ucf, split, layout="ucf101"), make_loader(folders, split)
        assert a.classes == b.classes and len(a) == len(b)
        got, want = batches(a), batches(b)
        assert len(got) == len(want) > 0
        for (va, la), (vb, lb) in zip(got, want):
            assert torch.equal(la, lb) and torch.equal(va, vb)


def test_ucf101_bad_inputs(ucf, tmp_path):
    with pytest.raises(ValueError, match=r"fold must be 1\.\.3 for the ucf101 layout, got 4"):
        make_loader(ucf, "train", layout="ucf101", fold=4)
    with pytest.raises(ValueError, match=r"split 'trainlist02' is fold 2 but fold=3: give one of them"):
        make_loader(ucf, "trainlist02", fold=3)
    broken = Path(shutil.copytree(ucf, tmp_path / "ucf"))
    (broken / "ucfTrainTestlist" / "testlist02.txt").unlink()
    missing = re.escape(str(broken / "ucfTrainTestlist" / "testlist02.txt"))
    with pytest.raises(FileNotFoundError, match=rf"no 'test' split of the ucf101 layout under .*: {missing} does "
                                                r"not exist"):
        make_loader(broken, "test", layout="ucf101", fold=2)
    train = broken / "ucfTrainTestlist" / "trainlist01.txt"
    train.write_text("ApplyEyeMakeup/v_ApplyEyeMakeup_g02_c01.avi 1\nBiking/v_Biking_g02_c01.avi 7\n")
    with pytest.raises(ValueError, match=rf"{re.escape(str(train))} line 2: label '7' is outside 1\.\.3, the 1-based "
                                         r"labels of classInd\.txt"):
        make_loader(broken, "train", layout="ucf101")


def test_unknown_layout_names_the_layouts_there_are(ucf):
    with pytest.raises(ValueError, match=r"unknown layout 'kinetics'; choose from csv, folders, list, path_label, "
                                         r"ucf101, hmdb51, ssv2"):
        make_loader(ucf, layout="kinetics")
    from daliload.prescreen import ScanSpec

    with pytest.raises(ValueError, match=r"unknown layout 'kinetics'; choose from csv"):
        ScanSpec(layout="kinetics")
    with pytest.raises(ValueError, match=r"layout='ucf101' but scan=ScanSpec\(layout='hmdb51'\): give it once"):
        make_loader(ucf, layout="ucf101", scan=ScanSpec(layout="hmdb51"))
    with pytest.raises(TypeError, match=r"scan must be a ScanSpec, got a dict .*: use scan=ScanSpec\(deep=True\)"):
        make_loader(ucf, layout="ucf101", scan={"deep": True})
    with pytest.raises(ValueError, match=r"fold=2 is for layouts with official folds \(ucf101, hmdb51\); the "
                                         r"path_label layout has none"):
        make_loader(ucf, layout="path_label", fold=2)


@pytest.fixture(scope="module")
def hmdb(tmp_path_factory, clips) -> Path:
    """HMDB51 as downloaded: 3 classes x 3 videos. Fold k: video k-1 tests, video (k % 3) trains, the third is
    in neither (flag 0)."""
    root = tmp_path_factory.mktemp("hmdb")
    splits = root / "testTrainMulti_7030_splits"
    splits.mkdir()
    for c, cls in enumerate(HMDB_CLASSES):
        (root / "hmdb51" / cls).mkdir(parents=True)
        for i in range(3):
            shutil.copyfile(clips[c * 3 + i], root / "hmdb51" / cls / f"{cls}_video_{i}.avi")
        for fold in (1, 2, 3):
            flags = {fold - 1: 2, fold % 3: 1, (fold + 1) % 3: 0}
            (splits / f"{cls}_test_split{fold}.txt").write_text(
                "".join(f"{cls}_video_{i}.avi {flags[i]} \n" for i in range(3)))  # the trailing space is HMDB's
    return root


@pytest.mark.parametrize("fold", [1, 3])
def test_hmdb51_reads_the_flags_of_each_fold(hmdb, fold):
    train = make_loader(hmdb, "train", layout="hmdb51", fold=fold)
    test = make_loader(hmdb, "test", fold=fold, batch_size=1)
    assert train.classes == test.classes == HMDB_CLASSES
    assert videos_of(train) == {f"{cls}_video_{fold % 3}.avi": (c, cls) for c, cls in enumerate(HMDB_CLASSES)}
    assert videos_of(test) == {f"{cls}_video_{fold - 1}.avi": (c, cls) for c, cls in enumerate(HMDB_CLASSES)}
    for loader in (train, test):
        loader.close()


@pytest.fixture(scope="module")
def ssv2(tmp_path_factory, make_clip) -> Path:
    """Something-Something v2: a flat folder of <id>.webm beside labels/ (3 templates, 4 train and 3 val videos)."""
    root = tmp_path_factory.mktemp("ssv2")
    (root / "20bn-something-something-v2").mkdir()
    (root / "labels").mkdir()
    (root / "labels" / "labels.json").write_text(json.dumps(TEMPLATES))
    entries = {"train": [], "validation": []}
    for i in range(7):
        clip = make_clip("vp9", num_frames=10, width=64, height=48, class_id=i % 4, seed=20 + i)
        shutil.copyfile(clip, root / "20bn-something-something-v2" / f"{100 + i}.webm")
        template = list(TEMPLATES)[i % 3].replace("something", "[something]")
        entries["train" if i < 4 else "validation"].append(
            {"id": str(100 + i), "label": "a thing", "template": template, "placeholders": ["a thing"]})
    for name, items in entries.items():
        (root / "labels" / f"{name}.json").write_text(json.dumps(items))
    (root / "labels" / "test.json").write_text(json.dumps([{"id": "999"}]))
    return root


def test_ssv2_templates_are_the_classes(ssv2):
    train = make_loader(ssv2, "train", layout="ssv2")
    assert train.classes == tuple(TEMPLATES)
    assert videos_of(train) == {f"{100 + i}.webm": (i % 3, list(TEMPLATES)[i % 3]) for i in range(4)}
    val, validation = make_loader(ssv2, "val", batch_size=1), make_loader(ssv2, "validation", batch_size=1)
    assert val.split == validation.split == "val"
    assert videos_of(val) == videos_of(validation) == {f"{100 + i}.webm": (i % 3, list(TEMPLATES)[i % 3])
                                                       for i in range(4, 7)}
    with pytest.raises(ValueError, match=r"test.json entry 1 \(id 999\) has no \"template\": this split has no labels"):
        make_loader(ssv2, "test", layout="ssv2")
    for loader in (train, val, validation):
        loader.close()


# ------------------------------------------------------------------------------------------- path label files

@pytest.fixture
def flat(tmp_path, clips) -> Path:
    """Six videos in class folders under clips/, for path-label files to name."""
    root = tmp_path / "pl"
    for i in range(6):
        cls = HMDB_CLASSES[i % 3]
        (root / "clips" / cls).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(clips[i], root / "clips" / cls / f"v{i}.avi")
    return root


def test_path_label_csv_with_header_and_1_based_labels(flat):
    (flat / "train.csv").write_text("path,label\n" + "".join(f"clips/{HMDB_CLASSES[i % 3]}/v{i}.avi,{i % 3 + 1}\n"
                                                            for i in range(4)))
    (flat / "val.txt").write_text("".join(f"clips/{HMDB_CLASSES[i % 3]}/v{i}.avi {i % 3 + 1}\n" for i in (4, 5)))
    train = make_loader(flat, "train")  # detected: ROOT/train.csv
    val = make_loader(flat, "val", batch_size=1)
    assert train.classes == val.classes == HMDB_CLASSES  # 1-based (no 0 anywhere), names from the folders
    assert videos_of(train) == {f"v{i}.avi": (i % 3, HMDB_CLASSES[i % 3]) for i in range(4)}
    assert videos_of(val) == {f"v{i}.avi": (i % 3, HMDB_CLASSES[i % 3]) for i in (4, 5)}
    for loader in (train, val):
        loader.close()


def test_path_label_text_with_class_names(flat):
    (flat / "train.txt").write_text("".join(f"{flat}/clips/{HMDB_CLASSES[i % 3]}/v{i}.avi  {HMDB_CLASSES[i % 3]}\n"
                                            for i in range(6)))
    loader = make_loader(flat, "train", layout="path_label")
    assert loader.classes == HMDB_CLASSES
    assert videos_of(loader) == {f"v{i}.avi": (i % 3, HMDB_CLASSES[i % 3]) for i in range(6)}
    loader.close()


def test_path_label_bad_labels_name_file_and_line(flat):
    path = flat / "train.csv"
    path.write_text("clips/brush_hair/v0.avi,0\nclips/cartwheel/v1.avi,1\nclips/catch/v2.avi,two\n")
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))} line 3: label 'two' is not a class index >= 0"):
        make_loader(flat, "train")
    path.write_text("clips/brush_hair/v0.avi,1\nclips/cartwheel/v1.avi,3\n")
    with pytest.raises(ValueError, match=r"labels of .*train.csv are integers with no 0 and gaps \(2 missing of "
                                         r"1\.\.3\): cannot tell whether they count from 0 or from 1; write "
                                         r".*classes.txt"):
        make_loader(flat, "train")
    (flat / "classes.txt").write_text("brush_hair\ncartwheel\n")
    path.write_text("clips/brush_hair/v0.avi,0\nclips/cartwheel/v1.avi,5\n")
    with pytest.raises(ValueError, match=r"train.csv line 2: label 5 is outside the class map of 2 classes "
                                         r"\(labels read as 0-based, 2 classes in classes.txt\)"):
        make_loader(flat, "train")


# ------------------------------------------------------------------------------------------- a list as root

@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_list_of_pairs_is_a_root(flat, cache, monkeypatch):
    monkeypatch.chdir(flat)  # relative paths are taken from the working folder
    pairs = [(f"clips/{HMDB_CLASSES[i % 3]}/v{i}.avi", i % 3) for i in range(6)]
    loader = make_loader(pairs, "train")
    assert loader.classes == HMDB_CLASSES  # indices as given; names from the folders
    assert videos_of(loader) == {f"v{i}.avi": (i % 3, HMDB_CLASSES[i % 3]) for i in range(6)}
    # Its manifest lives in the per-user cache, in a folder named by the list's content: the same list gives
    # the same root (what the ranks compare), another list another one.
    assert loader.manifest_path.parent.parent.parent == cache / "daliload" / "lists"
    again = make_loader(list(reversed(pairs)), "train")
    assert again.manifest_path == loader.manifest_path and again.plan(0) == loader.plan(0)
    named = make_loader([(str(flat / p), HMDB_CLASSES[label]) for p, label in pairs[:4]], "train")
    assert named.manifest_path != loader.manifest_path and named.classes == HMDB_CLASSES
    for each in (loader, again, named):
        each.close()


def test_a_list_root_with_a_missing_file_or_a_bad_pair(flat, cache):
    gone = flat / "clips" / "nope.avi"
    with pytest.raises(FileNotFoundError, match=rf"1 file\(s\) of the list given as root do not exist: "
                                                rf"{re.escape(str(gone))}"):
        make_loader([(flat / "clips" / "catch" / "v2.avi", 0), (gone, 1)])
    with pytest.raises(TypeError, match=r"root\[1\] has label 'catch' but root\[0\] 0: give every pair a class index"):
        make_loader([(flat / "clips" / "catch" / "v2.avi", 0), (flat / "clips" / "catch" / "v5.avi", "catch")])
    with pytest.raises(ValueError, match=r"a list of \(path, label\) pairs is read as layout 'path_label', not "
                                         r"'ucf101'"):
        make_loader([(flat / "clips" / "catch" / "v2.avi", 0)], layout="ucf101")


# ------------------------------------------------------------------------------------------- real clips

def test_real_clips_in_the_ucf101_layout(realclips, tmp_path):
    """Real UCF101, HMDB51 and Kinetics downloads laid out as UCF101 (links, not copies) and read through it."""
    real = {"Basketball": ["tiny-ucf101/v_Basketball_g01_c01.avi", "video_reader_benchmark/xvid/WUzgd7C1pWA.avi"],
            "WaveHand": ["video_reader_benchmark/RATRACE_wave_f_nm_np1_fr_goo_37.avi",
                         "video_reader_benchmark/R6llTwEh07w.mp4"]}
    root = tmp_path / "ucf"
    (root / "ucfTrainTestlist").mkdir(parents=True)
    (root / "ucfTrainTestlist" / "classInd.txt").write_text("1 Basketball\n2 WaveHand\n")
    train, test = [], []
    for c, (cls, files) in enumerate(real.items()):
        (root / "UCF-101" / cls).mkdir(parents=True)
        for g, rel in enumerate(files, start=1):
            name = f"v_{cls}_g{g:02d}_c01{Path(rel).suffix}"
            os.symlink(realclips / rel, root / "UCF-101" / cls / name)
            (train if g == 1 else test).append(f"{cls}/{name}" + (f" {c + 1}" if g == 1 else ""))
    (root / "ucfTrainTestlist" / "trainlist01.txt").write_text("\n".join(train) + "\n")
    (root / "ucfTrainTestlist" / "testlist01.txt").write_text("\n".join(test) + "\n")
    loaders = {split: make_loader(root, split, batch_size=1) for split in ("train", "test")}
    assert videos_of(loaders["train"]) == {"v_Basketball_g01_c01.avi": (0, "Basketball"),
                                           "v_WaveHand_g01_c01.avi": (1, "WaveHand")}
    assert videos_of(loaders["test"]) == {"v_Basketball_g02_c01.avi": (0, "Basketball"),
                                          "v_WaveHand_g02_c01.mp4": (1, "WaveHand")}
    for split, loader in loaders.items():
        got = batches(loader)
        assert len(got) == 2 and sorted(int(labels[0]) for _, labels in got) == [0, 1], split
        assert all(videos.shape == (1, 3, 4, 48, 64) and videos.std() > 1 for videos, _ in got), split


# ------------------------------------------------------------------------------------------- the docs' snippets

def test_every_snippet_of_the_datasets_page_runs(ucf, hmdb, ssv2, flat, clips, cache, tmp_path):
    """docs/datasets.md's loader snippets run on the generated datasets (their paths swapped in, on the CPU)."""
    kinetics = tmp_path / "kinetics"
    for i in range(4):
        (kinetics / "train" / HMDB_CLASSES[i % 2]).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(clips[i], kinetics / "train" / HMDB_CLASSES[i % 2] / f"k{i}.avi")
    (flat / "train.csv").write_text("".join(f"clips/{HMDB_CLASSES[i % 3]}/v{i}.avi,{HMDB_CLASSES[i % 3]}\n"
                                            for i in range(4)))
    (flat / "clips" / "brush_hair" / "v3.avi").write_bytes((flat / "clips" / "brush_hair" / "v0.avi").read_bytes())
    from daliload.commands.pack import pack_dataset

    pack_dataset(kinetics, tmp_path / "k400-shards", progress=False)
    roots = {"/data/kinetics400": kinetics, "/data/ucf101": ucf, "/data/hmdb51": hmdb, "/data/ssv2": ssv2,
             "/data/mine": flat, "/data/clips": flat / "clips", "/data/k400-shards": tmp_path / "k400-shards"}
    page = (Path(__file__).resolve().parents[1] / "docs" / "datasets.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", page, re.S) if "KineticsDALILoader(" in b]
    assert len(blocks) == 7
    for block in blocks:
        for placeholder, root in roots.items():
            block = block.replace(f'"{placeholder}', f'"{root}')
        block = block.replace("frame_stride=1)", 'frame_stride=1, device="cpu")')
        namespace: dict = {}
        exec(compile(block, "docs/datasets.md", "exec"), namespace)
        loaders = [v for v in namespace.values() if isinstance(v, KineticsDALILoader)]
        assert loaders, block
        for loader in loaders:
            videos, labels = next(iter(loader))
            assert videos.shape[:3] == (2, 3, 8) and 0 <= int(labels.min()) <= int(labels.max()) < 3
            loader.close()


def test_a_layout_of_ones_own_as_the_page_registers_it(tmp_path, clips):
    from daliload.dataset import LAYOUTS, load_index

    page = (Path(__file__).resolve().parents[1] / "docs" / "datasets.md").read_text()
    block = page.split("## A layout of your own", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "media" / "val").mkdir(parents=True)
    for i, name in enumerate(("cat_1", "dog_2", "cat_3")):
        shutil.copyfile(clips[i], tmp_path / "media" / "val" / f"{name}.mp4")
    try:
        exec(compile(block, "docs/datasets.md", "exec"), {})
        assert list(LAYOUTS)[-1] == "pets"
        index = load_index(tmp_path, "val")  # detected, after the built-in layouts
        assert index.layout == "pets" and [r.label for r in index.records] == [0, 0, 1]
        loader = make_loader(tmp_path, "val", layout="pets", batch_size=1)
        assert loader.classes == ("cat", "dog") and videos_of(loader)["dog_2.mp4"] == (1, "dog")
        loader.close()
    finally:
        LAYOUTS.pop("pets", None)


# ------------------------------------------------------------------------------------------- scan and transcode

def test_daliload_scan_takes_layout_and_fold(ucf, tmp_path, capsys):
    from daliload.cli import main
    from daliload.prescreen import Manifest

    root = Path(shutil.copytree(ucf, tmp_path / "ucf"))
    assert main(["scan", str(root), "--layout", "ucf101", "--fold", "2", "--split", "train,test", "--device", "cpu",
                 "--workers", "0", "--quiet"]) == 0
    manifest = root / ".daliload" / "manifest-fold2.sqlite"
    with Manifest(manifest) as m:
        test = {Path(e.path).name for e in m.entries("test", device="cpu")}
    assert test == {ucf_name(cls, 2) for cls in UCF_CLASSES}
    # the split names say the fold too; names of two folds in one scan are refused
    assert main(["scan", str(root), "--split", "trainlist03,testlist03", "--device", "cpu", "--workers", "0",
                 "--quiet"]) == 0
    with Manifest(root / ".daliload" / "manifest-fold3.sqlite") as m:
        assert {Path(e.path).name for e in m.entries("test", device="cpu")} == {ucf_name(c, 3) for c in UCF_CLASSES}
    assert main(["scan", str(root), "--split", "trainlist01,testlist02", "--device", "cpu", "--quiet"]) == 2
    assert "are of folds [1, 2]: a scan covers one fold" in capsys.readouterr().err
    # the loader finds the fold's manifest the scan wrote
    loader = make_loader(root, "test", fold=2, batch_size=1)
    assert loader.manifest_path == manifest
    loader.close()


@pytest.mark.slow
def test_transcode_copies_the_split_files_and_keeps_every_fold(hmdb, tmp_path):
    from daliload.transcode import TranscodeOptions, transcode_dataset

    summary = transcode_dataset(hmdb, tmp_path / "out", TranscodeOptions(short_side=48, gop=4), workers=2,
                                progress=False)
    assert not summary.failed
    out = tmp_path / "out"
    # every video, though each fold leaves one of three per class out
    assert sorted(p.name for p in out.rglob("*.mp4")) == sorted(f"{c}_video_{i}.mp4" for c in HMDB_CLASSES
                                                                 for i in range(3))
    split = (out / "testTrainMulti_7030_splits" / "catch_test_split2.txt").read_text()
    assert split == (hmdb / "testTrainMulti_7030_splits" / "catch_test_split2.txt").read_text().replace(".avi", ".mp4")
    for fold in (1, 2, 3):
        before, after = (make_loader(root, "test", fold=fold, batch_size=1) for root in (hmdb, out))
        assert after.classes == before.classes
        assert {Path(p).stem for p in after.index.paths} == {Path(p).stem for p in before.index.paths}
        before.close()
        after.close()


@pytest.mark.slow
def test_a_list_root_under_ddp_is_one_root_for_every_rank(flat, cache, tmp_path):
    """2 gloo ranks given the same pairs (in another order, one with relative paths) read one manifest."""
    import subprocess
    import sys

    worker = Path(__file__).parent / "ddp" / "list_root_worker.py"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", XDG_CACHE_HOME=str(cache))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(worker), str(flat / "clips"), str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=300)  # a hang bound, not a speed target
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    records = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert records[0]["manifest"] == records[1]["manifest"]
    assert Path(records[0]["manifest"]).is_relative_to(cache / "daliload" / "lists")
    assert records[0]["classes"] == records[1]["classes"] == list(HMDB_CLASSES)
    assert records[0]["videos"] == records[1]["videos"] == 6
    assert len(records[0]["labels"]) == len(records[1]["labels"]) == 3  # each rank its half of the 6 videos
