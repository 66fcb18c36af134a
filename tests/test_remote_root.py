"""A dataset root in an S3 store (moto, on 127.0.0.1): the loader and `daliload scan` take ``s3://bucket/prefix``.

The root's names are mirrored locally (sparse files, side files fetched, shard
headers at their offsets: ``daliload.prescreen.remote_root``); the manifest
names the store's URIs and both decoders read them, so batches equal the
local root's, bit for bit, for class folders and for tar shards.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from daliload.cli import main
from daliload.commands.pack import pack_dataset
from daliload.loader import DecodeSpec, KineticsDALILoader
from daliload.plan import AugmentSpec, OutputSpec
from daliload.prescreen import remote_root
from daliload.prescreen.ensure import forget_checks
from daliload.stream import RemoteReadError, member_of
from helpers.s3_store import s3_server, upload

RAW = OutputSpec(size=(48, 64), mean=(0, 0, 0), std=(1, 1, 1), dtype="float32")
WHOLE = AugmentSpec(crop_size=(48, 64), crop_mode="center", flip_prob=0.5)

pytestmark = pytest.mark.slow


def make_loader(root, split="train", **options) -> KineticsDALILoader:
    return KineticsDALILoader(root, split, batch_size=4, clip_len=6, frame_stride=3, augment=WHOLE, output=RAW,
                              device="cpu", decode=DecodeSpec(routing="static", dali_threads=1, fallback_workers=1),
                              **options)


def epoch(loader) -> tuple[list, object]:
    try:
        return [(v.clone(), y.clone()) for v, y in loader], loader.stats()
    finally:
        loader.close()


def same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) and torch.equal(s, t) for (x, s), (y, t) in zip(a, b))


@pytest.fixture(scope="module")
def store(small_kinetics, tmp_path_factory):
    """The S3 server with the generated dataset in bucket ``k`` (class folders and CSVs) and its shards in ``s``."""
    shards = tmp_path_factory.mktemp("shards")
    pack_dataset(small_kinetics, shards, progress=False)
    cache = tmp_path_factory.mktemp("cache")
    with s3_server() as (client, endpoint), pytest.MonkeyPatch.context() as env:
        env.setenv("XDG_CACHE_HOME", str(cache))  # the mirrors and their manifests
        upload(client, small_kinetics, "kin")
        upload(client, shards, "shd")
        yield client, endpoint, shards


def test_a_root_in_s3_gives_the_local_roots_batches_on_both_routes(store, small_kinetics):
    want, _ = epoch(make_loader(small_kinetics))
    loader = make_loader("s3://kin")
    assert all(v.path.startswith("s3://kin/train/") for v in loader.videos)
    got, stats = epoch(loader)
    assert same(got, want)
    assert stats.clips_dali > 0 and stats.clips_fallback > 0 and stats.failures == ()
    assert len(stats.rejected) > 0 and all(f.path.startswith("s3://kin/") for f in stats.rejected)


def test_shards_in_s3_as_a_root_give_the_local_shards_batches(store):
    _, _, shards = store
    want, _ = epoch(make_loader(shards, "val"))
    loader = make_loader("s3://shd", "val")
    assert all(member_of(v.path).shard.startswith("s3://shd/val-") for v in loader.videos)
    got, stats = epoch(loader)
    assert same(got, want) and stats.failures == ()


def test_daliload_scan_of_a_root_in_s3_writes_a_manifest_the_loader_takes(store, tmp_path, capsys):
    manifest = tmp_path / "k.sqlite"
    assert main(["scan", "s3://kin", "--device", "cpu", "--manifest", str(manifest), "--quiet"]) == 0
    loader = make_loader(manifest, "val")
    paths = [v.path for v in loader.videos]
    loader.close()
    assert paths and all(p.startswith("s3://kin/val/") for p in paths)
    assert main(["scan", "s3://no-such-bucket", "--device", "cpu", "--manifest", str(tmp_path / "x.sqlite")]) == 2
    assert "s3://no-such-bucket" in capsys.readouterr().err and not (tmp_path / "x.sqlite").exists()


def test_an_object_gone_from_the_store_leaves_the_next_listing(store, small_kinetics, monkeypatch):
    client, _, _ = store
    client.create_bucket(Bucket="kin2")
    for path in sorted((small_kinetics / "val").rglob("*.*")):
        client.upload_file(str(path), "kin2", path.relative_to(small_kinetics).as_posix())
    first = make_loader("s3://kin2", "val")
    names = sorted(v.path for v in first.videos)
    first.close()
    client.delete_object(Bucket="kin2", Key=names[0].split("s3://kin2/", 1)[1])
    monkeypatch.setattr(remote_root, "FRESH_S", 0.0)
    forget_checks()  # a later job: a job's loaders reuse its first check of a root
    second = make_loader("s3://kin2", "val")
    assert sorted(v.path for v in second.videos) == names[1:]
    second.close()


def test_a_bucket_or_prefix_that_is_not_there_is_one_error_naming_it(store):
    with pytest.raises(RemoteReadError, match=r"s3://no-such-bucket.*bucket does not exist"):
        make_loader("s3://no-such-bucket/k700")
    with pytest.raises(RemoteReadError, match=r"s3://kin/nothing-here.*no object under this prefix"):
        make_loader("s3://kin/nothing-here")
    with pytest.raises(RemoteReadError, match=r"cannot be listed"):
        make_loader("https://example.invalid/k700")


def test_a_root_uri_with_a_secret_is_refused_and_shown_redacted(store):
    with pytest.raises(ValueError, match=r"https://\*\*\*@host/k700") as caught:
        make_loader("https://user:hunter2@host/k700")
    assert "hunter2" not in str(caught.value)
    assert not any("hunter2" in p for p in os.listdir(Path(os.environ["XDG_CACHE_HOME"])))


def test_an_endpoint_that_does_not_answer_is_one_error_naming_the_root_and_nothing_is_left(store, monkeypatch):
    import socket

    from daliload.stream import _remote

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")  # nothing listens there
    _remote._filesystems.clear()
    try:
        with pytest.raises(RemoteReadError, match=r"s3://kin-elsewhere: listing failed") as caught:
            make_loader("s3://kin-elsewhere")
    finally:
        _remote._filesystems.clear()
    assert "AWS_ENDPOINT_URL" in str(caught.value)
    assert not remote_root.mirror_path("s3://kin-elsewhere").exists()


def test_object_keys_that_would_climb_out_of_the_mirror_are_left_out_and_nothing_is_written_outside(
        store, small_kinetics, tmp_path, caplog):
    client, _, _ = store
    client.create_bucket(Bucket="odd")
    for path in sorted((small_kinetics / "val").rglob("*.*")):
        client.upload_file(str(path), "odd", path.relative_to(small_kinetics).as_posix())
    for key in ("val/../../../escaped.mp4", "val/./dot.mp4", "val//twice.mp4"):
        client.put_object(Bucket="odd", Key=key, Body=b"not a video")
    cache = Path(os.environ["XDG_CACHE_HOME"])
    before = {p for p in cache.parent.rglob("*escaped*")}
    loader = make_loader("s3://odd", "val")
    paths = [v.path for v in loader.videos]
    loader.close()
    assert paths and not any("escaped" in p or "dot.mp4" in p or "twice" in p for p in paths)
    assert {p for p in cache.parent.rglob("*escaped*")} == before
    assert "left out of its listing" in caplog.text


def test_webdataset_shards_in_s3_as_a_root_keep_their_cls_and_json_labels(store, small_kinetics, tmp_path):
    """The mirror holds a shard's label members (``.cls``, ``.json``), which the layout reads, not only headers."""
    import io
    import json
    import tarfile

    client, _, _ = store
    files = make_loader(small_kinetics, "val")
    videos = [(Path(v.path), v.label) for v in files.videos]
    files.close()
    shard = tmp_path / "train-000000.tar"
    with tarfile.open(shard, "w") as tar:
        for i, (path, label) in enumerate(videos):
            key = f"clip{i:03d}"
            label_member = (f"{key}.cls", str(label).encode()) if i % 2 else \
                (f"{key}.json", json.dumps({"label": label}).encode())
            for name, data in ((f"{key}{path.suffix}", path.read_bytes()), label_member):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    client.create_bucket(Bucket="wds")
    client.upload_file(str(shard), "wds", "train-000000.tar")
    loader = make_loader("s3://wds", "train")
    labels = sorted(v.label for v in loader.videos)
    loader.close()
    assert labels == sorted(label for _, label in videos)


def test_the_mirror_reads_only_the_first_bytes_of_a_compressed_shard(store):
    """A ``.tar.gz`` is no shard a loader reads by range: its listing fetches 512 bytes of it, not the object."""
    import gzip

    from daliload.stream import transfer_counts

    client, _, _ = store
    client.create_bucket(Bucket="gzipped")
    client.put_object(Bucket="gzipped", Key="train-000000.tar.gz", Body=gzip.compress(os.urandom(200_000)))
    before = transfer_counts()
    mirror = remote_root.mirror_root("s3://gzipped", fresh_s=0)
    assert transfer_counts().remote_bytes - before.remote_bytes == 512
    assert (mirror / "train-000000.tar.gz").read_bytes()[:2] == b"\x1f\x8b"
