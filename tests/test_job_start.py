"""A job's start on a dataset: one check however many loaders, read-only roots, the manifest given as the source,
probe verdicts kept between jobs, and the errors a wrong root or an odd file used to cause."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.readonly import read_only

from daliload.cli import main
from daliload.loader import KineticsDALILoader
from daliload.prescreen import Manifest, ScanSpec, check_manifest, scan
from daliload.prescreen import ensure as ensure_module
from daliload.prescreen.ensure import forget_checks
from daliload.prescreen.scan import cache_manifest_path
from daliload.testing import probe_faults

OPTIONS = dict(batch_size=2, clip_len=4, frame_stride=2, crop_size=32, device="cpu")


@pytest.fixture
def copy(small_kinetics, tmp_path) -> Path:
    root = tmp_path / "copy"
    shutil.copytree(small_kinetics, root, ignore=shutil.ignore_patterns(".daliload"))
    return root


def _count_scans(monkeypatch) -> list:
    calls = []
    real = ensure_module.scan
    monkeypatch.setattr(ensure_module, "scan", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    return calls


def test_a_job_checks_its_dataset_once_however_many_loaders_it_builds(copy, monkeypatch):
    calls = _count_scans(monkeypatch)
    for split, extra in (("train", {}), ("val", {}), ("val", {"views": (2, 2)})):  # as examples/train_ddp.py
        KineticsDALILoader(copy, split, **OPTIONS, **extra).close()
    assert len(calls) == 1
    KineticsDALILoader(copy, "test" if (copy / "test").exists() else "train",
                       scan=ScanSpec(deep=False), **OPTIONS).close()
    assert len(calls) == 1
    forget_checks()  # a new job
    KineticsDALILoader(copy, "train", **OPTIONS).close()
    assert len(calls) == 2
    with Manifest(copy / ".daliload" / "manifest.sqlite") as manifest:
        assert manifest.last_scan["probed"] == 0


_RANK = """
import json, sys
from daliload.prescreen import ensure
real, calls = ensure.scan, []
ensure.scan = lambda *a, **k: calls.append(1) or real(*a, **k)
from daliload.loader import KineticsDALILoader
KineticsDALILoader(sys.argv[1], "train", batch_size=2, clip_len=4, frame_stride=2, crop_size=32, device="cpu").close()
print(json.dumps({"scans": len(calls)}))
"""


def _ranks(root: Path, run_ids: list[str]) -> list[int]:
    """Processes of a job with no process group (RANK, WORLD_SIZE, torchrun's run id): how many scanned."""
    procs = []
    for rank, run_id in enumerate(run_ids):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(len(run_ids)), LOCAL_RANK=str(rank),
                   TORCHELASTIC_RUN_ID=run_id)
        procs.append(subprocess.Popen([sys.executable, "-c", _RANK, str(root)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    scans = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        scans.append(json.loads(out.strip().splitlines()[-1])["scans"])
    return scans


def test_ranks_without_a_process_group_check_once_per_job(copy):
    scan(copy, device="cpu", workers=0, progress=False)  # the manifest exists: the ranks only check
    assert sorted(_ranks(copy, ["job-a", "job-a", "job-a"])) == [0, 0, 1]
    assert _ranks(copy, ["job-b", "job-c"]) == [1, 1]  # two jobs: each checks


def test_a_manifest_on_read_only_storage_is_read_in_place_and_a_changed_dataset_gets_a_cache_copy(
        copy, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    scan(copy, device="cpu", workers=0, progress=False)
    local = copy / ".daliload" / "manifest.sqlite"
    calls = _count_scans(monkeypatch)
    with read_only(copy):
        loader = KineticsDALILoader(copy, "train", **OPTIONS)
        assert loader.manifest_path == local and calls == []  # found and read in place: no probe, no copy
        assert not cache_manifest_path(copy).exists()
        before = len(loader.videos)
        loader.close()
    victim = Path(loader.videos[0].path)
    victim.write_bytes(victim.read_bytes()[:3000])  # one file changes while the storage is writable
    forget_checks()
    with read_only(copy):
        loader = KineticsDALILoader(copy, "train", **OPTIONS)
        cache = cache_manifest_path(copy)
        assert loader.manifest_path == cache and len(calls) == 1
        with Manifest(cache) as manifest:
            assert manifest.last_scan["probed"] == 1  # only the changed file, not the dataset again
        assert len(loader.videos) == before - 1 and str(victim) in {f.path for f in loader.rejected}
        loader.close()
        forget_checks()
        KineticsDALILoader(copy, "train", **OPTIONS).close()  # a later job goes straight to the copy
        assert len(calls) == 2
    with Manifest(local) as manifest:  # the read-only manifest is as it was
        assert manifest.last_scan["probed"] > 1


def test_a_manifest_given_as_the_source_is_trusted_after_a_sample_of_its_files(copy, tmp_path):
    summary = scan(copy, device="cpu", workers=0, progress=False)
    path = summary.manifest_path
    assert check_manifest(path) == path
    with Manifest(path) as manifest:
        files = [e.path for e in manifest.entries(device="cpu")]
    for name in files:
        os.utime(name, ns=(0, 10**9))  # every file touched after the scan
    forget_checks()
    with pytest.warns(RuntimeWarning, match=rf"manifest {path} may be out of date: \d+ of \d+ files sampled changed "
                                            rf"or are gone .* `daliload scan ROOT --manifest {path}`"):
        KineticsDALILoader(path, "train", **OPTIONS).close()
    forget_checks()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        KineticsDALILoader(path, "train", scan=ScanSpec(check=False), **OPTIONS).close()


def test_a_timed_out_probe_keeps_its_verdict_between_jobs_until_retry_bad(copy, make_clip, monkeypatch, capsys):
    stuck = copy / "train" / (sorted(p.name for p in (copy / "train").iterdir()))[0] / "stuck_000000_000010.mp4"
    shutil.copyfile(make_clip("h264", num_frames=30), stuck)
    (copy / "annotations").exists() and shutil.rmtree(copy / "annotations")  # the folders layout lists it
    for listing in copy.glob("*list.txt"):
        listing.unlink()
    with probe_faults({"stuck*": "hang"}):
        scan(copy, device="cpu", workers=1, progress=False, timeout_s=2.0)  # the first job's scan (short time limit)
        first = KineticsDALILoader(copy, "train", **OPTIONS)
        assert ("timeout" in {f.reason for f in first.rejected if f.path == str(stuck)})
        state = first.state_dict()
        first.close()
    # the next job runs on a quiet machine: the file would probe fine
    forget_checks()
    second = KineticsDALILoader(copy, "train", **OPTIONS)
    assert second.state_dict()["videos"] == state["videos"]  # the same videos: the state resumes
    second.load_state_dict(state)
    second.close()
    assert main(["scan", str(copy), "--device", "cpu", "--retry-bad", "--workers", "1", "--quiet",
                 "--split", "train"]) == 0
    assert "probed" in capsys.readouterr().out
    forget_checks()
    third = KineticsDALILoader(copy, "train", **OPTIONS)
    assert str(stuck) in {v.path for v in third.videos}
    with pytest.raises(ValueError, match=r"cannot resume: split 'train' has changed .*: \d+ videos then, \d+ now"):
        third.load_state_dict(state)
    third.close()


def test_a_root_that_is_a_file_is_named_with_what_to_pass(small_kinetics, capsys):
    video = next((small_kinetics / "train").rglob("*.mp4"))
    message = (rf"dataset root {video} is a file, not a folder: pass the folder that holds train/ and val/ .* "
               r"or a manifest written by `daliload scan`")
    with pytest.raises(ValueError, match=message):
        KineticsDALILoader(video, "train", **OPTIONS)
    assert main(["scan", str(video), "--device", "cpu", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a file, not a folder" in err


def test_a_fifo_named_like_a_video_is_skipped_with_a_reason_not_probed(copy):
    folder = next(p for p in (copy / "train").iterdir() if p.is_dir())
    shutil.rmtree(copy / "annotations", ignore_errors=True)
    for listing in copy.glob("*list.txt"):
        listing.unlink()
    fifo = folder / "pipe_000000_000010.mp4"
    os.mkfifo(fifo)
    summary = scan(copy, device="cpu", workers=1, progress=False)
    assert (str(fifo), "not a regular file (a FIFO, socket, device or broken link)") in summary.skipped
    forget_checks()
    loader = KineticsDALILoader(copy, "train", **OPTIONS)
    assert str(fifo) not in {v.path for v in loader.videos} | {f.path for f in loader.rejected}
    loader.close()


def test_scan_spec_check_false_trusts_an_existing_manifest_of_a_root(copy, monkeypatch):
    scan(copy, device="cpu", workers=0, progress=False)
    calls = _count_scans(monkeypatch)
    KineticsDALILoader(copy, "train", scan=ScanSpec(check=False), **OPTIONS).close()
    assert calls == []
    forget_checks()
    KineticsDALILoader(copy, "train", **OPTIONS).close()
    assert len(calls) == 1


def test_daliload_scan_of_a_read_only_root_updates_a_copy_of_its_manifest_not_a_new_one(copy, tmp_path, monkeypatch,
                                                                                     capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    scan(copy, device="cpu", workers=0, progress=False)
    with read_only(copy):
        assert main(["scan", str(copy), "--device", "cpu", "--workers", "0", "--quiet"]) == 0
    out = capsys.readouterr()
    cache = cache_manifest_path(copy)
    assert f"manifest: {cache}" in out.out and "is on read-only storage: scanning a copy of it" in out.err
    with Manifest(cache) as manifest:
        assert manifest.last_scan["probed"] == 0  # nothing probed again
