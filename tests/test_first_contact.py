"""A newcomer's first loader on a dataset: what the console says, once, and no more.

The first scan says before it starts what it does and how to run it ahead
(``daliload scan``); its progress bar shows only on a terminal or when asked;
the files the pre-screen rejects are one WARNING line on rank 0; a second
loader on the same manifest says none of it again; under a process group the
ranks that wait for rank 0's scan say what they wait for. The scripts run in
fresh interpreters, as a user's do, so what reaches stderr is what a user sees
(no logging configured, stderr a pipe, not a terminal).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from daliload.prescreen import Manifest

pytestmark = pytest.mark.slow

_LOADERS = textwrap.dedent("""\
    import json, sys
    from daliload import KineticsDALILoader, ScanSpec
    from daliload.prescreen.ensure import forget_checks
    from daliload.testing import probe_faults

    options = dict(batch_size=2, clip_len=4, frame_stride=2, crop_size=32, device="cpu",
                   scan=ScanSpec(manifest_path=sys.argv[2], workers=1))
    rejected = []
    with probe_faults({"*": "slow"}):  # a scan long enough for its bar to draw, were it on
        for split in sys.argv[3].split(","):
            if split == "new-job":
                forget_checks()  # a later job: the dataset is checked again, nothing probed
                continue
            loader = KineticsDALILoader(sys.argv[1], split, **options)
            rejected.append(len(loader.stats().rejected))
            print(f"built {split}", file=sys.stderr, flush=True)
            loader.close()
    print(json.dumps(rejected))
""")


def _run(script: str, *args: str, env: dict | None = None) -> tuple[list, str]:
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, **(env or {})))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def test_a_first_scan_says_how_to_run_it_ahead_and_a_rejected_file_is_one_line(small_kinetics, tmp_path):
    manifest = tmp_path / "m.sqlite"
    rejected, err = _run(_LOADERS, str(small_kinetics), str(manifest), "train,train,val,new-job,train",
                         env={"DALILOAD_PROGRESS": ""})
    lines = err.splitlines()
    notices = [i for i, line in enumerate(lines) if line.startswith("daliload: first scan of ")]
    assert len(notices) == 1 and notices[0] < lines.index("built train"), err[-3000:]
    assert f"`daliload scan {small_kinetics} --manifest {manifest}`" in lines[notices[0]]
    assert "scan cpu" not in err  # stderr is a pipe: no progress bar
    # One line per loader, with the count and the manifest; four loaders, four lines.
    said = [re.search(r"pre-screen left out (\d+) file\(s\) of split '(\w+)' .*\(manifest (.*)\); list them with "
                      r"loader\.stats\(\)\.rejected", line) for line in lines]
    said = [(int(m[1]), m[2], m[3]) for m in said if m]
    expected = [(n, split, str(manifest)) for n, split in zip(rejected, ("train", "train", "val", "train")) if n]
    assert rejected[0] > 0 and said == expected, err[-3000:]
    with Manifest(manifest) as scanned:
        assert scanned.last_scan["probed"] == 0  # the later job checked the dataset and probed nothing


def test_progress_asked_for_shows_the_bar_on_a_pipe_and_turned_off_says_nothing(small_kinetics, tmp_path):
    _, err = _run(_LOADERS, str(small_kinetics), str(tmp_path / "on.sqlite"), "val",
                  env={"DALILOAD_PROGRESS": "1"})
    assert "scan cpu" in err and "daliload: first scan of " in err
    _, err = _run(_LOADERS, str(small_kinetics), str(tmp_path / "off.sqlite"), "train",
                  env={"DALILOAD_PROGRESS": "0"})
    assert "scan cpu" not in err and "first scan" not in err
    assert "pre-screen left out" in err  # a file left out is still said: it is not progress


def test_a_bad_progress_setting_is_named(small_kinetics, tmp_path, monkeypatch):
    from daliload import KineticsDALILoader, ScanSpec

    monkeypatch.setenv("DALILOAD_PROGRESS", "yes")
    with pytest.raises(ValueError, match=r"DALILOAD_PROGRESS='yes' must be 1 \(progress bar on, wherever stderr "
                                         r"goes\) or 0"):
        KineticsDALILoader(small_kinetics, "train", batch_size=2, clip_len=4, crop_size=32, device="cpu",
                           scan=ScanSpec(manifest_path=tmp_path / "m.sqlite"))


_RANK = textwrap.dedent("""\
    import json, sys

    import torch.distributed as dist
    import daliload.prescreen.scan_lock as scan_lock
    from daliload import KineticsDALILoader, ScanSpec
    from daliload.testing import probe_faults

    scan_lock.FIRST_REPORT_S, scan_lock.REPORT_EVERY_S = 0.3, 0.5
    dist.init_process_group("gloo", init_method="file://" + sys.argv[3], rank=int(sys.argv[4]), world_size=2)
    with probe_faults({"*": "slow"}):  # rank 0's scan lasts a few seconds
        loader = KineticsDALILoader(sys.argv[1], "train", batch_size=2, clip_len=4, frame_stride=2, crop_size=32,
                                    device="cpu", scan=ScanSpec(manifest_path=sys.argv[2], workers=1))
    print(json.dumps([len(loader.stats().rejected)]))
    loader.close()
    dist.destroy_process_group()
""")


def test_ranks_waiting_for_rank_0s_scan_say_what_they_wait_for(small_kinetics, tmp_path):
    manifest = tmp_path / "m.sqlite"
    procs = [subprocess.Popen([sys.executable, "-c", _RANK, str(small_kinetics), str(manifest), str(tmp_path / "init"),
                               str(rank)],
                              env=dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                                       DALILOAD_PROGRESS=""),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    errs = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        errs.append(err)
    waits = [line for line in errs[1].splitlines() if line.startswith("daliload: waiting for ")]
    assert waits and all(line.startswith(f"daliload: waiting for global rank 0's check of {small_kinetics}, which "
                                         f"writes the manifest {manifest}") for line in waits), errs[1][-3000:]
    assert any(re.search(rf": its scan by pid {procs[0].pid} on .*: \d+ of \d+ files probed$", line)
               for line in waits), waits
    assert "first scan of" in errs[0] and "first scan of" not in errs[1]  # rank 0 scans, and says so
    assert "waiting for" not in errs[0]
    # The files left out: one line, on rank 0 only.
    assert len(re.findall("pre-screen left out", errs[0])) == 1 and "pre-screen left out" not in errs[1]


def test_a_waiting_rank_speaks_once_a_node(monkeypatch):
    from daliload.prescreen.ensure import _talks

    def talks(rank: int, local: int, world: int = 16, progress: bool | None = None) -> bool:
        for name, value in (("RANK", rank), ("LOCAL_RANK", local), ("WORLD_SIZE", world)):
            monkeypatch.setenv(name, str(value))
        return _talks(progress)

    assert [talks(r, r) for r in range(8)] == [False, True] + [False] * 6  # rank 0's node: local rank 1
    assert [talks(8 + r, r) for r in range(8)] == [True] + [False] * 7  # the others: local rank 0
    assert not talks(1, 1, progress=False) and talks(0, 0, world=1)


def test_the_notice_names_paths_that_need_quoting_quoted(tmp_path):
    from daliload.prescreen.scan_lock import first_scan_notice

    text = first_scan_notice(Path("/data/my videos"), Path("/data/my videos/.daliload/manifest.sqlite"))
    assert "`daliload scan '/data/my videos' --manifest '/data/my videos/.daliload/manifest.sqlite'`" in text


def test_where_no_bar_shows_the_scan_says_how_far_it_is_every_so_often(monkeypatch, capsys):
    from daliload.prescreen import scan_lock

    noted = []
    monkeypatch.setattr(scan_lock, "REPORT_EVERY_S", 0.0)
    update = scan_lock.reporting(lambda *counts: noted.append(counts), Path("/data/k"), None)  # stderr: no terminal
    for probed in range(4):
        update(probed, 3)
    assert noted == [(0, 3), (1, 3), (2, 3), (3, 3)]
    assert capsys.readouterr().err.splitlines() == [f"daliload: scan of /data/k: {n:,} of 3 files probed"
                                                    for n in range(3)]
    assert scan_lock.reporting(print, Path("/data/k"), True) is print  # the bar shows: no lines besides it
