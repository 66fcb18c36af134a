"""A dataset packed in tar shards reads as the unpacked dataset: the same samples, bit for bit, on both routes.

``daliload pack`` writes the shards; the loader lists a shard's members from
its headers and reads each member by its byte range, locally or from an S3
server on 127.0.0.1 (moto), with no change to the plan or the decoders.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import pytest
import torch

from daliload.commands.pack import pack_dataset
from daliload.loader import DecodeSpec, KineticsDALILoader
from daliload.plan import AugmentSpec, OutputSpec
from daliload.prescreen import ScanSpec
from daliload.stream import member_of, transfer_counts
from helpers.s3_store import s3_server, upload, uri_manifest

RAW = OutputSpec(size=(48, 64), mean=(0, 0, 0), std=(1, 1, 1), dtype="float32")
WHOLE = AugmentSpec(crop_size=(48, 64), crop_mode="center", flip_prob=0.5)


def make_loader(root, split="train", *, failures=0.5, **options) -> KineticsDALILoader:
    return KineticsDALILoader(root, split, batch_size=4, clip_len=6, frame_stride=3, augment=WHOLE, output=RAW,
                              device="cpu", decode=DecodeSpec(routing="static", dali_threads=1, fallback_workers=1,
                                                              max_failure_fraction=failures), **options)


def epoch(loader) -> list[tuple[torch.Tensor, torch.Tensor]]:
    try:
        return [(videos.clone(), labels.clone()) for videos, labels in loader]
    finally:
        loader.close()


def same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) and torch.equal(s, t) for (x, s), (y, t) in zip(a, b))


@pytest.fixture(scope="module")
def packed(small_kinetics, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("shards")
    from daliload.dataset import load_index

    largest = max(os.path.getsize(r.path) for r in load_index(small_kinetics, "val").records)
    pack_dataset(small_kinetics, out, shard_bytes=2 * largest + 4096, progress=False)  # several shards a split
    return out


@pytest.mark.parametrize("split", ["train", "val"])
def test_shards_give_the_batches_of_the_unpacked_files_on_both_routes(small_kinetics, packed, split):
    files = make_loader(small_kinetics, split)
    shards = make_loader(packed, split)
    assert len(list(packed.glob(f"{split}-*.tar"))) > 1
    assert shards.classes == files.classes and len(shards.videos) == len(files.videos)
    assert all(member_of(v.path) is not None for v in shards.videos)
    assert len(shards.rejected) == len(files.rejected)  # the broken files are broken members too
    want, got = epoch(files), epoch(shards)
    stats = shards.stats()
    assert same(got, want)
    assert stats.clips_dali > 0 and stats.clips_fallback > 0 and stats.failures == ()


def test_webdataset_keys_with_cls_and_json_labels_and_nested_shards(small_kinetics, tmp_path):
    """``<key>.mp4`` beside ``<key>.cls`` or ``<key>.json``, in ``ROOT/train/*.tar`` (named with layout=)."""
    files = make_loader(small_kinetics, "val")
    videos = [(Path(v.path), v.label) for v in files.videos]
    files.close()
    (tmp_path / "train").mkdir()
    with tarfile.open(tmp_path / "train" / "part-a.tar", "w") as tar:
        for i, (path, label) in enumerate(videos):
            key = f"clip{i:03d}"
            label_member = (f"{key}.cls", str(label).encode()) if i % 2 else \
                (f"{key}.json", json.dumps({"label": label}).encode())
            for name, data in ((f"{key}{path.suffix}", path.read_bytes()), label_member):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    loader = make_loader(tmp_path, "train", layout="shards")
    labels = sorted(v.label for v in loader.videos)
    loader.close()
    assert labels == sorted(label for _, label in videos)


def test_a_compressed_shard_is_refused_naming_it_and_the_fix(tmp_path):
    with tarfile.open(tmp_path / "train-000000.tar", "w:gz") as tar:
        info = tarfile.TarInfo("cls/a.mp4")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"abc"))
    with pytest.raises(ValueError, match=r"train-000000.tar: a gzip-compressed tar .* re-pack it uncompressed"):
        KineticsDALILoader(tmp_path, "train", batch_size=1, device="cpu")


def test_a_shard_rewritten_after_the_scan_fails_its_samples_by_name_and_batches_keep_their_size(
        small_kinetics, packed, tmp_path):
    import shutil

    root = tmp_path / "copy"
    shutil.copytree(packed, root)
    loader = make_loader(root, "val", failures=1.0)
    shard = member_of(loader.videos[0].path).shard
    with open(shard, "r+b") as f:  # cut short: the members at its end are gone
        f.truncate(os.path.getsize(shard) // 3)
    batches = epoch(loader)
    stats = loader.stats()
    assert all(len(labels) == 4 for _, labels in batches)
    assert stats.failures and all(".tar#" in f.path for f in stats.failures)


@pytest.mark.slow
def test_shards_in_an_s3_store_give_the_local_batches_reading_only_their_members(small_kinetics, packed, tmp_path):
    local = make_loader(packed, "train")
    manifest = Path(local.manifest_path)
    want = epoch(local)
    with s3_server() as (client, _):
        upload(client, packed, "shards")
        source = uri_manifest(manifest, packed, "s3://shards/", tmp_path / "s3.sqlite")
        loader = make_loader(source, "train", scan=ScanSpec(check=False))
        assert all(v.path.startswith("s3://shards/train-") for v in loader.videos)
        before = transfer_counts()
        got = epoch(loader)
        stats = loader.stats()
    assert same(got, want) and stats.failures == ()
    # Every read is within a member: a sample's member is read by its decode and, for DALI, by its cut or
    # whole-member read (the workers' reads are counted too), never the rest of the shard.
    sizes = {v.path: member_of(v.path).size for v in loader.videos}
    samples = [s.path for batch in loader.plan() for s in batch]
    assert 0 < stats.remote_bytes - before.remote_bytes <= 2 * sum(sizes[p] for p in samples)
