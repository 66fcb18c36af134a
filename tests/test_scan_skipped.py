"""Every file of a class folder is scanned or reported as skipped; raw H.264/HEVC streams are scanned; a symlink
loop is skipped with its reason, and a file name that is not UTF-8 is scanned and trained on."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from contextlib import closing
from dataclasses import replace
from pathlib import Path

import pytest
from helpers.frames import check_passes

from daliload.cli import main
from daliload.dataset import load_index
from daliload.dataset import unindexed
from daliload.loader import DecodeSpec, KineticsDALILoader
from daliload.plan import AugmentSpec, OutputSpec
from daliload.prescreen import Manifest, scan
from daliload.prescreen.merge import merge_manifests
from daliload.dataset import Shard
from daliload.synth import default_spec, render_clip, write_video

NUM_FRAMES = 30


@pytest.fixture(scope="module")
def raw_dataset(tmp_path_factory) -> Path:
    """ROOT/train/juggling/ with a raw .h264 and .hevc stream, an MP4, a .txt and a .jpg."""
    root = tmp_path_factory.mktemp("raw")
    folder = root / "train" / "juggling"
    folder.mkdir(parents=True)
    frames = list(render_clip(1, NUM_FRAMES, width=160, height=144, fps=30.0))
    for name, codec in (("raw.h264", "h264"), ("raw.hevc", "hevc"), ("boxed.mp4", "h264")):
        write_video(folder / name, frames, default_spec(codec, gop=10))
    (folder / "notes.txt").write_text("downloaded 2026-11-30\n")
    (folder / "thumb.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    return root


SKIPPED = {"notes.txt": "not a video extension: .txt", "thumb.jpg": "not a video extension: .jpg"}


def test_raw_streams_are_probed_and_routed_other_files_are_skipped(raw_dataset, tmp_path):
    summary = scan(raw_dataset, manifest_path=tmp_path / "m.sqlite", device="gpu", workers=0,
                   splits=("train",), progress=False)
    assert summary.total == 3 and summary.probed == 3
    assert {Path(p).name: reason for p, reason in summary.skipped} == SKIPPED
    # On a GPU the MP4 goes to NVDEC; the raw Annex B streams to the fallback (DALI finds H.264/HEVC
    # keyframes only in length-prefixed streams), with that reason.
    assert dict(summary.files) == {"dali": 1, "fallback": 2}, summary.format()
    assert all("length-prefixed" in reason for (route, reason) in summary.reasons if route == "fallback")
    printed = summary.format()
    assert "skipped, not scanned: 2 file(s)" in printed
    assert "| not a video extension: .txt | 1 |" in printed
    assert f"{raw_dataset / 'train' / 'juggling' / 'thumb.jpg'}: not a video extension: .jpg" in printed


def test_cli_json_lists_raw_streams_with_their_facts_and_the_skipped_files(raw_dataset, tmp_path, capsys):
    out = tmp_path / "files.json"
    rc = main(["scan", str(raw_dataset), "--device", "cpu", "--workers", "1", "--quiet", "--split", "train",
               "--manifest", str(tmp_path / "m.sqlite"), "--json", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "skipped, not scanned: 2 file(s)" in printed
    rows = {Path(row["path"]).name: row for row in json.loads(out.read_text())}
    assert set(rows) == {"raw.h264", "raw.hevc", "boxed.mp4", "notes.txt", "thumb.jpg"}
    for name, reason in SKIPPED.items():
        assert rows[name]["route"] == "skipped" and rows[name]["reason"] == reason
        assert rows[name]["codec"] is None
    for name, codec in (("raw.h264", "h264"), ("raw.hevc", "hevc")):
        row = rows[name]
        assert row["route"] == "fallback", row  # DALI on a CPU has neither decoder
        assert (row["codec"], row["width"], row["height"], row["num_frames"]) == (codec, 160, 144, NUM_FRAMES)


# ---------------------------------------------------------------- odd directory entries

LOOP = "a symbolic link loop (too many levels of symbolic links)"
#: A file name that is not UTF-8 (as a Latin-1 or a damaged download names it); ``os.fsdecode`` gives the str.
RAW_NAME = b"clip_\xff\xfe"
RAW_NOTES = b"notes_\xff.txt"


def _two_classes(root: Path, make_clip) -> Path:
    """ROOT/train/{juggling,abseiling}/ with an H.264 MP4 and a VP9 WebM each (64x48, frame-coded)."""
    for class_id, name in enumerate(("juggling", "abseiling"), start=1):
        folder = root / "train" / name
        folder.mkdir(parents=True)
        for codec in ("h264", "vp9"):
            clip = make_clip(codec, num_frames=30, width=64, height=48, class_id=class_id)
            shutil.copyfile(clip, folder / f"ok{clip.suffix}")
    return root


def _loader(root: Path, **kw) -> KineticsDALILoader:
    kw.setdefault("decode", DecodeSpec(fallback_workers=1))
    return KineticsDALILoader(root, "train", batch_size=2, clip_len=4, frame_stride=2, device="cpu",
                              augment=AugmentSpec(crop_size=(48, 64), crop_mode="center", flip_prob=0.0),
                              output=OutputSpec(size=(48, 64), mean=(0, 0, 0), std=(1, 1, 1), dtype="float32"),
                              **kw)


def test_a_symlink_loop_is_skipped_with_a_reason_by_the_scan_and_the_loader(tmp_path, make_clip):
    root = _two_classes(tmp_path / "k", make_clip)
    folder = root / "train" / "juggling"
    os.symlink("b.mp4", folder / "a.mp4")
    os.symlink("a.mp4", folder / "b.mp4")
    os.symlink("loop", root / "train" / "loop")  # in the split folder, where class folders are
    summary = scan(root, manifest_path=tmp_path / "m.sqlite", device="cpu", workers=0, splits=("train",),
                   progress=False)
    assert summary.probed == 4
    assert summary.skipped == ((str(root / "train" / "juggling" / "a.mp4"), LOOP),
                               (str(root / "train" / "juggling" / "b.mp4"), LOOP),
                               (str(root / "train" / "loop"), "not in a class folder"))
    loader = _loader(root, decode=DecodeSpec(decoder="fallback", fallback_workers=0))
    try:
        assert len(loader.videos) == 4 and len(loader.rejected) == 0
    finally:
        loader.close()


def test_the_csv_and_list_layouts_skip_a_symlink_loop_with_the_same_reason(tmp_path, make_clip):
    """Those layouts find what the split folder holds beyond their rows with ``Path``, not ``os.DirEntry``."""
    root = _two_classes(tmp_path / "k", make_clip)
    folder = root / "train" / "juggling"
    os.symlink("a.mp4", folder / "a.mp4")
    by_folders = load_index(root, "train")
    assert dict(by_folders.skipped) == {str(folder / "a.mp4"): LOOP}
    for layout in ("csv", "list"):  # as if their rows named the same files
        assert dict(unindexed(root / "train", replace(by_folders, layout=layout))) == {str(folder / "a.mp4"): LOOP}


def _raw_dataset(root: Path, make_clip) -> tuple[Path, dict[str, str]]:
    """:func:`_two_classes` plus, in juggling/, an H.264 MP4 and a VP9 WebM whose names are not UTF-8 and a
    .txt whose name is not either; returns the root and the str of each odd name's path by its codec."""
    _two_classes(root, make_clip)
    folder = os.fsencode(root / "train" / "juggling")
    raw = {}
    for codec in ("h264", "vp9"):
        clip = make_clip(codec, num_frames=30, width=64, height=48, class_id=3)
        path = folder + b"/" + RAW_NAME + os.fsencode(clip.suffix)
        shutil.copyfile(clip, path)
        raw[codec] = os.fsdecode(path)
    with open(folder + b"/" + RAW_NOTES, "w") as f:
        f.write("x")
    return root, raw


def test_a_file_name_that_is_not_utf8_is_stored_as_its_bytes_and_trained_on(tmp_path, make_clip):
    """The manifest holds the name's own bytes; the loader reads both files, through DALI (VP9 on the CPU)
    and the fallback (H.264), and every clip of them shows the planned frames."""
    root, raw = _raw_dataset(tmp_path / "k", make_clip)
    loader = _loader(root)
    try:
        assert set(raw.values()) <= {v.path for v in loader.videos} and len(loader.rejected) == 0
        seen = {sample.path for sample in check_passes(loader)}
        stats = loader.stats()
        assert set(raw.values()) <= seen and len(stats.failures) == 0 and stats.clips_dali > 0
    finally:
        loader.close()
    manifest_path = root / ".daliload" / "manifest.sqlite"
    with closing(sqlite3.connect(manifest_path)) as conn:
        conn.text_factory = bytes
        stored = dict(conn.execute("SELECT CAST(path AS BLOB), typeof(path) FROM files"))
    assert {os.fsencode(p) for p in raw.values()} <= set(stored) and set(stored.values()) == {b"text"}
    # A re-scan finds the files unchanged; one gone is removed from the manifest.
    assert scan(root, device="cpu", workers=0, progress=False).probed == 0
    os.unlink(raw["h264"])
    again = scan(root, device="cpu", workers=0, progress=False)
    assert (again.probed, again.removed) == (0, 1)
    with Manifest(manifest_path) as manifest:
        assert [e.path for e in manifest.entries("train", device="cpu") if "\udcff" in e.path] == [raw["vp9"]]


def test_daliload_scan_prints_a_name_that_is_not_utf8_as_its_bytes_and_lists_it_in_json(tmp_path, make_clip):
    """On a terminal that takes strict UTF-8 only, the summary shows such a name with \\x escapes; the JSON
    holds the name (json.loads gives the str os.fsdecode gives)."""
    root, raw = _raw_dataset(tmp_path / "k", make_clip)
    out = tmp_path / "files.json"
    env = {**os.environ, "PYTHONIOENCODING": "utf-8:strict"}
    done = subprocess.run([sys.executable, "-m", "daliload.cli", "scan", str(root), "--device", "cpu", "--workers",
                           "1", "--quiet", "--split", "train", "--json", str(out)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    notes = root / "train" / "juggling" / "notes_\\xff.txt"
    assert f"  {notes}: not a video extension: .txt" in done.stdout.splitlines()
    rows = {row["path"]: row for row in json.loads(out.read_text())}
    assert rows[raw["h264"]]["route"] == "fallback" and rows[raw["vp9"]]["route"] == "dali"
    notes_path = os.fsdecode(os.fsencode(root / "train" / "juggling") + b"/" + RAW_NOTES)
    assert rows[notes_path]["route"] == "skipped"


def test_the_list_layout_names_a_file_whose_name_is_not_utf8_by_its_bytes(tmp_path, make_clip):
    root, raw = _raw_dataset(tmp_path / "k", make_clip)
    (root / "trainlist.txt").write_bytes(b"train/juggling/" + RAW_NAME + b".mp4 0\ntrain/abseiling/ok.mp4 1\n")
    index = load_index(root, "train", layout="list")
    assert [r.path for r in index.records] == [str(root / "train" / "abseiling" / "ok.mp4"), raw["h264"]]
    assert index.classes == ("juggling", "abseiling")


def test_shards_whose_names_are_not_utf8_merge_into_a_manifest_that_reads_them(tmp_path, make_clip):
    root, raw = _raw_dataset(tmp_path / "k", make_clip)
    parts = [tmp_path / f"part{i}.sqlite" for i in range(2)]
    for i, part in enumerate(parts):
        scan(root, manifest_path=part, device="cpu", workers=0, splits=("train",), progress=False, shard=Shard(i, 2))
    merge_manifests(parts, tmp_path / "merged.sqlite")
    with Manifest(tmp_path / "merged.sqlite") as manifest:
        paths = [e.path for e in manifest.entries("train", device="cpu")]
        assert set(raw.values()) <= set(paths) and len(paths) == 6
        assert set(raw.values()) <= {v.path for v in manifest.video_index("train", device="cpu")}
