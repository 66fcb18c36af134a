"""`daliload pack` and the shard index: every video packed once, each member's range reads back its file's bytes."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from pathlib import Path

import pytest

from daliload.cli import main
from daliload.commands.pack import pack_dataset, parse_size
from daliload.dataset import load_classes, load_index
from daliload.stream import NotAnUncompressedTar, read_member, shard_paths, tar_members


def _members(shard: str):
    with open(shard, "rb") as f:
        return tar_members(f, shard)


def test_pack_puts_every_video_of_each_split_in_its_shards_and_each_range_reads_its_bytes(small_kinetics, tmp_path):
    out = tmp_path / "shards"
    largest = max(os.path.getsize(r.path) for r in load_index(small_kinetics, "val").records)
    limit = 2 * largest + 4096  # room for two or three videos a shard: every split spreads over shards
    summary = pack_dataset(small_kinetics, out, shard_bytes=limit, progress=False)
    for split in ("train", "val"):
        index = load_index(small_kinetics, split)
        shards = shard_paths(out, split)
        assert shards == summary.shards[split] and len(shards) > 1
        by_name = {}
        for shard in shards:
            with open(shard, "rb") as f:
                for member in tar_members(f, shard):
                    assert member.name not in by_name
                    by_name[member.name] = read_member(f, member)
            assert os.path.getsize(shard) <= limit + 10_240 or len(_members(shard)) == 1
        assert len(by_name) == len(index.records) == summary.members[split]
        for record in index.records:
            assert by_name[f"{record.class_name}/{Path(record.path).name}"] == Path(record.path).read_bytes()
    assert load_classes(out / "classes.txt") == load_index(small_kinetics, "train").classes


def test_packing_twice_writes_the_same_bytes(small_kinetics, tmp_path):
    for name in ("a", "b"):
        pack_dataset(small_kinetics, tmp_path / name, splits=("val",), progress=False)
    assert (tmp_path / "a" / "val-000000.tar").read_bytes() == (tmp_path / "b" / "val-000000.tar").read_bytes()


def test_pack_refuses_an_output_inside_the_root_and_existing_shards(small_kinetics, tmp_path):
    with pytest.raises(ValueError, match="inside the dataset root"):
        pack_dataset(small_kinetics, small_kinetics / "shards", progress=False)
    pack_dataset(small_kinetics, tmp_path / "s", splits=("val",), progress=False)
    with pytest.raises(FileExistsError, match="already holds shards of split 'val'"):
        pack_dataset(small_kinetics, tmp_path / "s", splits=("val",), progress=False)
    assert not list((tmp_path / "s").glob("*.partial"))


def test_the_command_line_packs_and_reports_bad_arguments(small_kinetics, tmp_path, capsys):
    assert main(["pack", str(small_kinetics), str(tmp_path / "out"), "--split", "val", "--no-progress"]) == 0
    assert "val:" in capsys.readouterr().out
    assert main(["pack", str(small_kinetics), str(tmp_path / "o2"), "--shard-size", "lots"]) == 2
    assert "not a positive size" in capsys.readouterr().err
    assert main(["pack", str(tmp_path / "nowhere"), str(tmp_path / "o3")]) == 2
    assert "dataset root not found" in capsys.readouterr().err


@pytest.mark.parametrize("text, size", [("500M", 500 << 20), ("2G", 2 << 30), ("1.5GiB", 3 << 29), ("4096", 4096)])
def test_shard_sizes_read_as_people_write_them(text, size):
    assert parse_size(text) == size


def test_a_compressed_shard_or_no_tar_is_refused_with_the_fix(tmp_path):
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info = tarfile.TarInfo("a/b.mp4")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"abc"))
    with pytest.raises(NotAnUncompressedTar, match="gzip-compressed tar .* re-pack it uncompressed"):
        tar_members(io.BytesIO(gzip.compress(raw.getvalue())), "s3://bucket/train-000000.tar.gz")
    with pytest.raises(NotAnUncompressedTar, match="x.tar: not a tar shard"):
        tar_members(io.BytesIO(b"\x00\x01not a tar" * 100), "x.tar")


def test_member_names_that_climb_out_or_are_absolute_are_only_keys(tmp_path):
    """A member named ``../x`` or ``/etc/x`` is listed and read by its range; nothing is written anywhere."""
    shard = tmp_path / "train-000000.tar"
    with tarfile.open(shard, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in (("../../escape/x.mp4", b"one"), ("/etc/cls/y.mp4", b"two!"), ("cls/z.mp4", b"3")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("cls/link.mp4")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    with open(shard, "rb") as f:
        members = tar_members(f, str(shard))
        assert [m.name for m in members] == ["../../escape/x.mp4", "/etc/cls/y.mp4", "cls/z.mp4"]  # no link
        assert [read_member(f, m) for m in members] == [b"one", b"two!", b"3"]
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_a_shard_cut_short_after_listing_fails_the_member_by_name(tmp_path):
    shard = tmp_path / "train-000000.tar"
    with tarfile.open(shard, "w") as tar:
        info = tarfile.TarInfo("cls/a.mp4")
        info.size = 4000
        tar.addfile(info, io.BytesIO(b"x" * 4000))
    with open(shard, "rb") as f:
        member = tar_members(f, str(shard))[0]
    with open(shard, "r+b") as f:
        f.truncate(member.offset + 100)
    with open(shard, "rb") as f, pytest.raises(OSError, match="'cls/a.mp4' needs bytes"):
        read_member(f, member)


def test_a_member_named_by_its_range_reads_and_decodes_as_its_file(small_kinetics, tmp_path):
    import av

    from daliload.stream import member_address, member_of, open_video, read_video_file, stat_video

    pack_dataset(small_kinetics, tmp_path / "s", splits=("val",), progress=False)
    shard = str(tmp_path / "s" / "val-000000.tar")
    records = {f"{r.class_name}/{Path(r.path).name}": r.path for r in load_index(small_kinetics, "val").records}
    decoded = 0
    for member in _members(shard):
        address = member_address(shard, member)
        assert member_of(address) == (shard, member.offset, member.size, member.name)
        original = records[member.name]
        assert read_video_file(address).tobytes() == Path(original).read_bytes()
        assert stat_video(address) == (member.size, os.stat(shard).st_mtime_ns)
        try:
            with av.open(original) as a:
                want = sum(1 for _ in a.decode(video=0))
        except av.FFmpegError:
            continue  # a broken file of the fixture: its member is as broken
        f = open_video(address)
        with av.open(f) as b:
            assert sum(1 for _ in b.decode(video=0)) == want
        f.close()
        decoded += 1
    assert decoded >= 2
    assert member_of(str(small_kinetics / "a.mp4")) is None and member_of("s3://b/x.tar") is None


def test_a_shards_members_that_are_not_videos_are_reported_skipped(small_kinetics, tmp_path):
    pack_dataset(small_kinetics, tmp_path, splits=("val",), progress=False)
    shard = tmp_path / "val-000000.tar"
    with tarfile.open(shard, "a") as tar:
        info = tarfile.TarInfo("abseiling/notes.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    index = load_index(tmp_path, "val")
    assert index.layout == "shards"
    assert [s.reason for s in index.skipped] == ["not a video extension: .txt"]
    assert index.skipped[0].path.endswith(":abseiling/notes.txt")
