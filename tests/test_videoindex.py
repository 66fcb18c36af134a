"""A split's videos as columns: the same videos, facts and routes as the manifest's entries, in bytes per video."""

from __future__ import annotations

import math

import numpy as np
import pytest

from daliload.plan import make_train_plan
from daliload.prescreen import Manifest, scan
from daliload.dataset import StringColumn, VideoIndex

PATHS = ["/d/train/a b/x.mp4", "/d/train/é/y.webm", "/d/val/c/z.avi", "/d/\udcff-raw-byte.mp4"]


def test_string_column_holds_any_path_and_finds_it():
    column = StringColumn.of(sorted(PATHS, key=lambda p: p.encode("utf-8", "surrogateescape")))
    assert list(column) == sorted(PATHS, key=lambda p: p.encode("utf-8", "surrogateescape"))
    assert len(column) == 4 and column[-1] == column[3] and column[1:3] == list(column)[1:3]
    for i, path in enumerate(column):
        assert column.find(path) == i
    assert column.find("/d/train/a b") == -1 and column.find("/z") == -1 and column.find("") == -1
    kept = column.compress(np.array([True, False, True, False]))
    assert list(kept) == [column[0], column[2]]
    assert column.nbytes == len(column.data) + 8 * 5
    with pytest.raises(IndexError):
        column[4]
    with pytest.raises(ValueError, match="offsets must rise from 0"):
        StringColumn(b"abc", np.array([0, 2]))
    empty = StringColumn.of([])
    assert len(empty) == 0 and empty.find("a") == -1 and list(empty) == []


ROWS = [  # path, label, num_frames, fps, width, height, route, reason, keyframes, vfr, unsafe_seek
    ("/d/a.mp4", 0, 300, 30.0, 340, 256, "dali", "", "0,250", 0, 0),
    ("/d/b.mp4", 1, 0, None, None, None, "bad", "cannot open: garbage", "", 0, 0),
    ("/d/c.webm", 2, 90, 29.97, 320, 240, "fallback", "DALI on cpu has no h264 decoder", "0", 1, 1),
]


def test_an_index_row_reads_like_a_manifest_entry():
    index = VideoIndex.from_rows(ROWS)
    a, b, c = index
    assert (a.path, a.label, a.num_frames, a.fps, a.width, a.height, a.route, a.keyframes) == (
        "/d/a.mp4", 0, 300, 30.0, 340, 256, "dali", (0, 250))
    assert (b.fps, b.width, b.height, b.route, b.reason, b.keyframes) == (None, None, None, "bad",
                                                                          "cannot open: garbage", ())
    assert c.vfr and c.unsafe_seek and index[-1] == c
    assert index.rejected() == [("/d/b.mp4", "cannot open: garbage")]
    decodable = index.decodable()
    assert [v.path for v in decodable] == ["/d/a.mp4", "/d/c.webm"] and decodable.find("/d/c.webm") == 1
    assert list(index.where("fallback")) == [2] and index.num_frames_of(2) == 90
    assert math.isnan(decodable.columns.fps[1]) is False and decodable.columns.label.tolist() == [0, 2]
    assert "3 videos: dali 1, fallback 1, bad 1" in repr(index)
    with pytest.raises(IndexError):
        index[3]


def test_blobs_give_the_same_index_back():
    index = VideoIndex.from_rows(ROWS)
    back = VideoIndex.from_blobs(index.to_blobs())
    assert list(back) == list(index) and back.fingerprint() == index.fingerprint()
    blobs = index.to_blobs()
    del blobs["fps"]
    with pytest.raises(ValueError, match=r"stored video index lacks column\(s\) fps"):
        VideoIndex.from_blobs(blobs)
    with pytest.raises(ValueError, match=r"VideoIndex.label must be a int32 array of 3 values"):
        VideoIndex(**{**{name: getattr(index, name) for name in ("paths", "num_frames", "fps", "width", "height",
                                                                  "route", "reason", "keyframes", "vfr",
                                                                  "unsafe_seek")}, "label": np.zeros(3)})


def test_the_fingerprint_names_what_changed():
    base = VideoIndex.from_rows(ROWS).fingerprint()
    renamed = VideoIndex.from_rows([("/d/a2.mp4", *ROWS[0][1:]), *ROWS[1:]]).fingerprint()
    relabelled = VideoIndex.from_rows([(*ROWS[0][:1], 5, *ROWS[0][2:]), *ROWS[1:]]).fingerprint()
    longer = VideoIndex.from_rows([(*ROWS[0][:2], 301, *ROWS[0][3:]), *ROWS[1:]]).fingerprint()
    rerouted = VideoIndex.from_rows([(*ROWS[0][:6], "fallback", *ROWS[0][7:]), *ROWS[1:]]).fingerprint()
    assert {k for k in base if base[k] != renamed[k]} == {"paths"}
    assert {k for k in base if base[k] != relabelled[k]} == {"labels"}
    assert {k for k in base if base[k] != longer[k]} == {"facts"}
    assert rerouted == base  # the route decides the decoder, not the plan


@pytest.fixture(scope="module")
def scanned(small_kinetics, tmp_path_factory):
    path = tmp_path_factory.mktemp("m") / "m.sqlite"
    scan(small_kinetics, manifest_path=path, device="cpu", workers=2, progress=False)
    return path


@pytest.mark.parametrize("device", ["cpu", "gpu", "gpu:hopper", "gpu:ada"])
def test_the_manifests_index_holds_what_its_entries_say(scanned, device):
    with Manifest(scanned) as manifest:
        for split in ("train", "val", None):
            entries = manifest.entries(split, device=device)
            index = manifest.video_index(split, device=device)
            assert len(index) == len(entries) > 0
            for row, entry in zip(index, entries):
                assert row == tuple(getattr(entry, name) for name in row._fields), entry.path
            # The columns the scan stored and the rows give the same index, to the bit.
            from_rows = manifest._index_from_rows(split, device)[0]
            assert list(from_rows) == list(index) and from_rows.fingerprint() == index.fingerprint()
        assert manifest._read_stored_index(None, device) is not None or device == "gpu:ada"


def test_plans_from_the_index_are_the_plans_from_the_entries(scanned):
    with Manifest(scanned) as manifest:
        entries = [e for e in manifest.entries("train", device="cpu") if e.route != "bad"]
        index = manifest.video_index("train", device="cpu").decodable()
    from daliload.plan import AugmentSpec, ClipSpec

    kwargs = dict(seed=3, epoch=1, rank=1, world_size=2, clip=ClipSpec(8, 4, target_fps=15.0),
                  augment=AugmentSpec(crop_size=64))
    assert make_train_plan(index.columns, **kwargs) == make_train_plan(entries, **kwargs)


def test_a_failed_nvdec_class_reroutes_the_index_too(scanned, tmp_path):
    copy = tmp_path / "m.sqlite"
    copy.write_bytes(scanned.read_bytes())
    with Manifest(copy, writable=True) as manifest:
        dali = [e for e in manifest.entries(device="gpu") if e.route == "dali"]
        assert dali
        from daliload.prescreen.rules import nvdec_class

        manifest.record_class("gpu", nvdec_class(dali[0]), False, "test decode failed: boom")
    with Manifest(copy) as manifest:
        index = manifest.video_index(None, device="gpu")
        row = index[index.find(dali[0].path)]
        assert (row.route, row.reason) == ("fallback", "test decode failed: boom")
        assert list(index) == [tuple(getattr(e, n) for n in row._fields) for e in manifest.entries(device="gpu")]


def test_rows_stored_for_the_default_generation_by_name_win(scanned, tmp_path):
    copy = tmp_path / "m.sqlite"
    copy.write_bytes(scanned.read_bytes())
    with Manifest(copy) as manifest:
        first = manifest.video_index(None, device="gpu")[0].path
    with Manifest(copy, writable=True) as manifest, manifest._transaction() as conn:  # as a deep scan stores it
        conn.execute("INSERT INTO routes VALUES (?, 'gpu:hopper', 'fallback', 'deep: checked by name', 1)", (first,))
    with Manifest(copy) as manifest:
        index = manifest.video_index(None, device="gpu:hopper")
        assert (index[0].route, index[0].reason) == ("fallback", "deep: checked by name")
        assert index[1].route == manifest.video_index(None, device="gpu")[1].route
        entries = manifest.entries(device="gpu:hopper")
        assert (entries[0].route, entries[0].deep_checked) == ("fallback", True)
        assert list(index) == [tuple(getattr(e, n) for n in index[0]._fields) for e in entries]


def test_a_scan_for_a_gpu_generation_stores_its_routes_for_the_loaders_there(small_kinetics, tmp_path):
    path = tmp_path / "m.sqlite"
    scan(small_kinetics, manifest_path=path, device="gpu", gpu_model="L40S", workers=0, progress=False)
    with Manifest(path) as manifest:
        assert "gpu:ada" in manifest.current_meta("video_index")["targets"]
        stored = manifest._read_stored_index("train", "gpu:ada")
        assert stored is not None
        assert list(stored) == [tuple(getattr(e, n) for n in stored[0]._fields)
                                for e in manifest.entries("train", device="gpu:ada")]
