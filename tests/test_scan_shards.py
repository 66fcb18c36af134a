"""A scan spread over machines: each shard probes its share into a manifest of its own, --merge joins them."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from daliload.cli import main
from daliload.loader import KineticsDALILoader
from daliload.prescreen import Manifest, scan
from daliload.prescreen.merge import merge_manifests
from daliload.dataset import Shard


def _tables(path: Path) -> dict[str, list]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return {table: conn.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall()
                for table in ("files", "routes", "classes")}
    finally:
        conn.close()


@pytest.fixture
def parts(small_kinetics, tmp_path) -> list[Path]:
    """Three shards of the small dataset, scanned as three machines would."""
    out = []
    for index in range(3):
        path = tmp_path / f"part{index}.sqlite"
        rc = main(["scan", str(small_kinetics), "--shard", f"{index}/3", "--manifest", str(path), "--device", "cpu",
                   "--workers", "1", "--quiet"])
        assert rc == 0
        out.append(path)
    return out


def test_shards_partition_the_files_and_merge_into_the_whole_scan(small_kinetics, parts, tmp_path, capsys):
    whole = tmp_path / "whole.sqlite"
    everything = scan(small_kinetics, manifest_path=whole, device="cpu", workers=2, progress=False)
    sizes = []
    for path in parts:
        with Manifest(path) as manifest:
            sizes.append(len(manifest))
            assert manifest.part["shard"].endswith("/3")
    assert sum(sizes) == everything.total and all(sizes)  # every file in exactly one shard
    capsys.readouterr()
    merged = tmp_path / "merged.sqlite"
    assert main(["scan", "--merge", *map(str, reversed(parts)), "--manifest", str(merged)]) == 0
    assert f"merged 3 shard(s) of the scan of {small_kinetics}: {everything.total} files" in capsys.readouterr().out
    assert _tables(merged) == _tables(whole)
    with Manifest(merged) as manifest, Manifest(whole) as reference:
        assert manifest.part == {"shard": "0/1", "root": str(small_kinetics)}
        assert list(manifest.video_index("train", device="gpu")) == list(reference.video_index("train", device="gpu"))
    loader = KineticsDALILoader(merged, "train", batch_size=2, clip_len=4, frame_stride=2, crop_size=32, device="cpu")
    assert len(loader.videos) > 0
    loader.close()
    again = scan(small_kinetics, manifest_path=merged, device="cpu", workers=0, progress=False)
    assert (again.probed, again.removed) == (0, 0)  # the merged manifest is a whole scan of the root


def test_a_shard_scans_only_its_share_and_a_rescan_of_it_probes_nothing(small_kinetics, parts):
    again = scan(small_kinetics, manifest_path=parts[1], device="cpu", workers=0, progress=False, shard=Shard(1, 3))
    assert again.probed == 0 and again.shard == "1/3" and "shard: 1/3 of the files" in again.format()
    with pytest.raises(ValueError, match=r"holds shard 1/3 of .*; this scan is of shard 2/3 .* give each shard its "
                                         r"own --manifest"):
        scan(small_kinetics, manifest_path=parts[1], device="cpu", workers=0, progress=False, shard=Shard(2, 3))
    with pytest.raises(ValueError, match=r"is shard 0/3 of a scan of .*: merge every shard's manifest with "
                                         r"`daliload scan --merge PART... --manifest OUT` and pass OUT"):
        KineticsDALILoader(parts[0], "train", device="cpu")


def test_merging_refuses_parts_that_are_not_every_shard_of_one_scan(small_kinetics, parts, tmp_path, capsys):
    out = tmp_path / "out.sqlite"
    with pytest.raises(ValueError, match=r"shard\(s\) 2/3 of the scan of .* are missing: give every shard's manifest"):
        merge_manifests(parts[:2], out)
    with pytest.raises(ValueError, match=r"shard 1/3 is given twice"):
        merge_manifests([*parts, parts[1]], out)
    with pytest.raises(ValueError, match=r"is one of the parts"):
        merge_manifests(parts, parts[0])
    whole = tmp_path / "whole.sqlite"
    scan(small_kinetics, manifest_path=whole, device="cpu", workers=0, splits=("val",), progress=False)
    with pytest.raises(ValueError, match=r"whole.sqlite is shard 0/1, the first part is of 3 shards"):
        merge_manifests([*parts, whole], out)
    assert not out.exists()
    assert main(["scan", "--merge", str(parts[0]), "--manifest", str(out)]) == 2
    assert "are missing" in capsys.readouterr().err
    assert main(["scan", str(small_kinetics), "--shard", "1/3", "--device", "cpu"]) == 2
    assert "needs --manifest PART" in capsys.readouterr().err
    assert main(["scan", str(small_kinetics), "--shard", "3/3", "--manifest", str(out), "--device", "cpu"]) == 2
    assert "shard must be I/N with 0 <= I < N, got 3/3" in capsys.readouterr().err
