"""How the manifest sits on disk: its stored columns, no WAL, immutable readers, a damaged file, a full disk."""

from __future__ import annotations

import errno
import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from daliload.cli import main
from daliload.prescreen import Manifest, scan
from daliload.prescreen import sqlite_file
from daliload.prescreen.byte_indexes import ByteIndexes
from daliload.prescreen.manifest_store import SCHEMA_VERSION
from daliload.prescreen.sqlite_file import ManifestDamagedError
from daliload.prescreen.probe import ProbeResult
from daliload.prescreen.rows import FileRecord, Probed, ProbeRows
from helpers.readonly import read_only


@pytest.fixture
def scanned(small_kinetics, tmp_path) -> Path:
    path = tmp_path / "m.sqlite"
    scan(small_kinetics, manifest_path=path, device="cpu", workers=2, progress=False)
    return path


def _journal_mode(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("PRAGMA journal_mode").fetchone()[0]
    finally:
        conn.close()


def test_a_scan_stores_the_columns_and_a_scan_that_changes_nothing_keeps_them(small_kinetics, scanned, monkeypatch):
    with Manifest(scanned) as manifest:
        stored = manifest.current_meta("video_index")
        assert stored is not None and stored["targets"] == ["cpu", "gpu"]
        index = manifest.video_index("train", device="cpu")
    stores = []
    real = Manifest.store_video_index
    monkeypatch.setattr(Manifest, "store_video_index", lambda self: stores.append(1) or real(self))
    again = scan(small_kinetics, manifest_path=scanned, device="cpu", workers=0, progress=False)
    assert again.probed == 0 and stores == []
    with Manifest(scanned) as manifest:
        assert manifest._read_stored_index("train", "cpu") is not None  # still current
        assert list(manifest.video_index("train", device="cpu")) == list(index)
    victim = Path(index[0].path)
    victim.write_bytes(victim.read_bytes()[:2000])  # truncated: probed again, columns stored again
    assert scan(small_kinetics, manifest_path=scanned, device="cpu", workers=0, progress=False).probed == 1
    assert stores == [1]
    with Manifest(scanned) as manifest:
        row = manifest.video_index("train", device="cpu")[0]
        assert row.path == str(victim) and row.route == "bad"


def test_a_reader_reads_again_when_the_file_changed_under_it(scanned, monkeypatch):
    with Manifest(scanned) as manifest:
        calls = []
        real = sqlite_file.stamp

        def moving(path):  # the file looks rewritten once, in the middle of the read
            calls.append(1)
            return (0, 0, 0) if len(calls) == 3 else real(path)

        monkeypatch.setattr(sqlite_file, "stamp", moving)
        index = manifest.video_index("train", device="cpu")
        assert len(calls) > 3 and list(index) == list(Manifest(scanned).video_index("train", device="cpu"))
        monkeypatch.setattr(sqlite_file, "stamp", lambda path: (len(calls), calls.append(1), 0))  # never settles
        with pytest.raises(ValueError, match=r"kept changing while it was read \(is a scan writing it\?\)"):
            manifest.entries(device="cpu")


def test_the_manifest_is_never_left_in_wal_mode_even_with_a_reader_open(small_kinetics, tmp_path):
    path = tmp_path / "m.sqlite"
    scan(small_kinetics, manifest_path=path, device="cpu", workers=0, splits=("train",), progress=False)
    with Manifest(path) as reader:  # immutable: it takes no lock and does not hold the file in any mode
        scan(small_kinetics, manifest_path=path, device="cpu", workers=0, progress=False)
        assert len(reader.entries(device="cpu")) > 0
    assert _journal_mode(path) == "delete"
    assert not any(path.with_name(path.name + suffix).exists() for suffix in ("-wal", "-shm", "-journal"))


def test_a_manifest_an_older_daliload_left_in_wal_mode_is_switched_back(scanned, monkeypatch):
    conn = sqlite3.connect(scanned, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("SELECT COUNT(*) FROM files").fetchone()
    monkeypatch.setattr(sqlite_file, "BUSY_TIMEOUT_S", 0.2)
    with pytest.raises(ValueError, match=r"m.sqlite is in WAL \(database is locked\) mode and another process holds "
                                         r"it open.*stop the process that has it open"):
        Manifest(scanned, writable=True)
    conn.close()
    Manifest(scanned, writable=True).close()
    assert _journal_mode(scanned) == "delete"


def test_a_version_2_manifest_is_read_as_it_is_and_upgraded_in_place_without_probing(small_kinetics, scanned):
    conn = sqlite3.connect(scanned)
    conn.execute("DROP TABLE video_index")
    conn.execute("DROP TABLE byte_index")
    conn.execute("DELETE FROM meta WHERE key IN ('generation', 'video_index')")
    conn.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    with Manifest(scanned) as manifest:
        rows = list(manifest.video_index("train", device="cpu"))
        assert manifest.current_meta("video_index") is None and rows
    again = scan(small_kinetics, manifest_path=scanned, device="cpu", workers=0, progress=False)
    assert again.probed == 0
    with Manifest(scanned) as manifest:
        assert manifest._meta("schema_version") == str(SCHEMA_VERSION)
        assert manifest._read_stored_index("train", "cpu") is not None
        assert list(manifest.video_index("train", device="cpu")) == rows


def test_a_version_3_manifest_is_read_without_byte_indexes_and_upgraded_in_place(small_kinetics, scanned):
    """Version 4 added byte indexes: an older manifest reads as it is (remote windows read without them), and
    the next scan adds the table without probing again; a file probed again gets its index."""
    paths = [path for path, in sqlite3.connect(scanned).execute("SELECT path FROM byte_index")]
    assert paths  # the scan recorded them
    conn = sqlite3.connect(scanned)
    conn.execute("DROP TABLE byte_index")
    conn.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    assert ByteIndexes(scanned)(paths[0]) is None
    with Manifest(scanned) as manifest:
        assert list(manifest.video_index("train", device="cpu"))
    again = scan(small_kinetics, manifest_path=scanned, device="cpu", workers=0, progress=False)
    assert again.probed == 0
    assert ByteIndexes(scanned)(paths[0]) is None  # not probed again: none yet
    with Manifest(scanned) as manifest:
        assert manifest._meta("schema_version") == str(SCHEMA_VERSION)
    with sqlite3.connect(scanned) as conn:  # as if new (a changed file is probed again too): it gets one
        conn.execute("DELETE FROM files WHERE path = ?", (paths[0],))
        conn.execute("DELETE FROM meta WHERE key = 'listing'")  # else the same listing skips the scan
    conn.close()
    assert scan(small_kinetics, manifest_path=scanned, device="cpu", workers=0, progress=False).probed == 1
    assert ByteIndexes(scanned)(paths[0]) is not None


def _big_manifest(path: Path, files: int = 2000) -> None:
    facts = ProbeRows.of(ProbeResult("x", reason="", container="mov,mp4", codec="h264", width=340, height=256,
                                     fps=30.0, num_frames=300, keyframes=(0, 250), has_video=True, num_packets=300))
    with Manifest(path, writable=True) as manifest:
        manifest.write_probed([Probed(FileRecord(f"/data/train/c/{i:06d}.mp4", 1000 + i, 7, "train", 0, "c"), facts)
                               for i in range(files)])
        manifest.set_classes(["c"])
        manifest.finish_scan({})


def test_a_damaged_manifest_is_named_with_the_fix_in_one_line(tmp_path, capsys):
    path = tmp_path / "m.sqlite"
    _big_manifest(path)
    with open(path, "r+b") as f:  # pages in the middle of the files table
        f.seek(4096 * 20)
        f.write(b"\xa5" * 4096 * 4)
    message = rf"manifest {path} is damaged \(database disk image is malformed\): delete it and run `daliload scan`"
    with pytest.raises(ManifestDamagedError, match=message) as caught:
        with Manifest(path) as manifest:
            manifest.entries(device="cpu")
    assert "\n" not in str(caught.value)
    from daliload.loader import KineticsDALILoader

    with pytest.raises(ManifestDamagedError, match=message):
        KineticsDALILoader(path, "train", device="cpu")
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"\x00not a database" * 500)
    with pytest.raises(ValueError, match=rf"{junk} is not an SQLite manifest"):
        KineticsDALILoader(junk, "train", device="cpu")


def _limit_pages(monkeypatch, pages: int) -> None:
    """The manifest's connections may grow the file to ``pages`` pages: a disk that fills up there."""
    real = sqlite3.connect

    def connect(*args, **kwargs):
        conn = real(*args, **kwargs)
        conn.execute(f"PRAGMA max_page_count = {pages}")
        return conn

    monkeypatch.setattr(sqlite_file.sqlite3, "connect", connect)


def test_a_full_disk_names_the_manifest_and_keeps_what_was_stored(small_kinetics, tmp_path, monkeypatch, capsys):
    path = tmp_path / "m.sqlite"
    scan(small_kinetics, manifest_path=path, device="cpu", workers=0, splits=("train",), progress=False)
    with Manifest(path) as manifest:
        train = manifest.entries("train", device="cpu")
    conn = sqlite3.connect(path)
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.close()
    _limit_pages(monkeypatch, pages)
    with pytest.raises(OSError, match=rf"no space left to write the manifest {path} \(database or disk is full\): "
                                      r"free space .* and run again; what was stored before is kept") as caught:
        scan(small_kinetics, manifest_path=path, device="cpu", workers=0, chunk_size=1, progress=False)
    assert caught.value.errno == errno.ENOSPC and "\n" not in str(caught.value)
    rc = main(["scan", str(small_kinetics), "--manifest", str(path), "--device", "cpu", "--workers", "0", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1 and f"no space left to write the manifest {path}" in err
    monkeypatch.undo()
    with Manifest(path) as manifest:  # readable: the train split as it was, the val files committed before
        assert manifest.entries("train", device="cpu") == train
        kept = len(manifest)
    done = scan(small_kinetics, manifest_path=path, device="cpu", workers=0, progress=False)
    assert done.probed == done.total - kept  # what was stored is not probed again


def test_a_reader_writes_nothing_beside_a_manifest_on_read_only_storage(scanned, tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    shutil.copyfile(scanned, folder / "m.sqlite")
    with read_only(folder):
        with Manifest(folder / "m.sqlite") as manifest:
            assert len(manifest.video_index("train", device="cpu")) > 0
            assert json.loads(manifest._meta("last_scan"))["device"] == "cpu"
        assert sorted(p.name for p in folder.iterdir()) == ["m.sqlite"]
