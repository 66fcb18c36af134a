"""``scan --deep --device gpu``: the DALI half of the check runs in one worker per GPU, not in every probe worker.

No GPU here: the GPU worker's check is replaced by :func:`stand_in_check`, which
records the process it ran in; everything around it (the probe workers, the
split, the retry after a crash, the manifest) is the real code.
"""

from __future__ import annotations

import functools
import importlib
import os
import shutil
import signal
from pathlib import Path

import pytest

from daliload.cli import main
from daliload.prescreen import Manifest, probe_pool, scan
from daliload.prescreen import deep as deep_module
from daliload.prescreen.gpu_stage import DaliCheck, GpuStage, run_dali_check
from daliload.prescreen.probe_pool import ProbeTask, run_probe_task
from daliload.prescreen.rows import ProbeRows

scan_module = importlib.import_module("daliload.prescreen.scan")  # the package exports the function `scan`


def stand_in_check(check: DaliCheck) -> tuple:
    """The GPU worker's check, without a GPU: ``dali`` with the worker's pid as the reason.

    A file named ``*boom*`` kills its worker while DALI may run (as a driver crash
    would); its retry without DALI runs the real code (the fallback's decode).
    """
    if not check.task.allow_dali:
        return run_dali_check(check)
    path = Path(check.facts.path)
    with open(path.parents[2] / "checks.log", "a") as log:  # one line per check, in the order they ran
        log.write(f"{os.getpid()} {path.name}\n")
    if "boom" in path.name:
        os.kill(os.getpid(), signal.SIGKILL)
    return ProbeRows.of(check.facts, ((check.task.deep_device, "dali", f"pid {os.getpid()}", 1),)).as_tuple()


@pytest.fixture
def pretend_gpu(monkeypatch):
    """The scan believes a GPU is visible; only the GPU worker's check (replaced) would use it."""
    monkeypatch.setattr(scan_module, "_cuda_visible", lambda: True)
    monkeypatch.setattr(scan_module, "gpu_visible", lambda: False)  # no class confirmation decode


@pytest.fixture
def gpu_dataset(tmp_path, make_clip) -> Path:
    """Five H.264 files (DALI on a GPU), one 128x96 VP9 (under NVDEC's minimum: fallback), one crasher."""
    root = tmp_path / "kinetics"
    folder = root / "train" / "abseiling"
    folder.mkdir(parents=True)
    for i in range(5):
        shutil.copyfile(make_clip("h264", num_frames=24, gop=8, seed=i), folder / f"h{i}.mp4")
    shutil.copyfile(make_clip("h264", num_frames=24, gop=8, seed=9), folder / "boom.mp4")
    shutil.copyfile(make_clip("vp9", num_frames=24, gop=8), folder / "small.webm")
    return root


def _deep_routes(manifest_path) -> dict[str, tuple[str, str, bool]]:
    with Manifest(manifest_path) as manifest:
        return {Path(e.path).name: (e.route, e.reason, e.deep_checked) for e in manifest.entries(device="gpu")}


def test_probe_workers_hand_dali_files_to_the_gpu_worker_and_never_run_dali(make_clip, monkeypatch):
    """A probe worker of a GPU deep scan probes and seek-checks, then hands the DALI half on."""
    def no_dali_here(*args, **kwargs):
        raise AssertionError("a probe worker ran a DALI check")

    monkeypatch.setattr(deep_module, "dali_check", no_dali_here)
    path = str(make_clip("h264", num_frames=24, gop=8))
    handed = run_probe_task(ProbeTask(0, path, "gpu", dali_elsewhere=True))
    assert isinstance(handed, DaliCheck)
    assert handed.facts.num_frames == 24 and handed.reason == "" and handed.task.deep_device == "gpu"
    # Without a GPU deep scan's split (workers=0: one process), the check runs where it is.
    monkeypatch.setattr(deep_module, "dali_check", lambda facts, device, device_id=0: "")
    rows = ProbeRows(*run_probe_task(ProbeTask(0, path, "gpu")))
    assert ("gpu", "dali", "", 1) in rows.routes


def test_a_gpu_deep_scan_runs_every_dali_check_in_one_process(gpu_dataset, tmp_path, monkeypatch, pretend_gpu):
    monkeypatch.setattr(probe_pool, "GpuStage", functools.partial(GpuStage, check=stand_in_check))
    summary = scan(gpu_dataset, manifest_path=tmp_path / "m.sqlite", device="gpu", deep=True, workers=2,
                   progress=False)  # fmt: skip
    routes = _deep_routes(summary.manifest_path)
    assert set(routes) == {"h0.mp4", "h1.mp4", "h2.mp4", "h3.mp4", "h4.mp4", "boom.mp4", "small.webm"}
    # One worker at a time, so one DALI pipeline: the checks ran in one process until boom.mp4 killed it,
    # then in its replacement (the probe workers decide the order: boom may come first, last or between).
    ran = [line.split() for line in (gpu_dataset / "checks.log").read_text().splitlines()]
    boom = next(k for k, (_, name) in enumerate(ran) if name == "boom.mp4")
    assert len({pid for pid, _ in ran[:boom + 1]}) == 1 and len({pid for pid, _ in ran[boom + 1:]}) <= 1, ran
    assert {f"pid {pid}" for pid, _ in ran} >= {routes[f"h{i}.mp4"][1] for i in range(5)}, routes
    assert all(routes[f"h{i}.mp4"][0] == "dali" and routes[f"h{i}.mp4"][2] for i in range(5))
    # The crash cost DALI that file only: checked again without DALI, it decodes in the fallback.
    assert routes["boom.mp4"] == ("fallback", "deep: DALI (gpu) crashed or hung", True)
    # A file the rules keep off NVDEC is checked by the probe worker with the fallback.
    assert routes["small.webm"][0] == "fallback" and "128x128" in routes["small.webm"][1]
    assert routes["small.webm"][2]


def test_the_gpu_stage_reports_a_worker_that_cannot_start(gpu_dataset, tmp_path, monkeypatch, pretend_gpu):
    """An error of the stage itself (here: its worker cannot unpickle the check) stops the scan, saying so."""
    monkeypatch.setattr(probe_pool, "GpuStage", functools.partial(GpuStage, check=lambda check: ()))
    with pytest.raises(RuntimeError, match="the GPU deep check stopped"):
        scan(gpu_dataset, manifest_path=tmp_path / "m.sqlite", device="gpu", deep=True, workers=1, progress=False)


def test_a_gpu_deep_scan_without_a_gpu_is_refused_in_one_line(gpu_dataset, tmp_path, capsys):
    """Not every DALI file stored as 'bad' because the DALI half could not build a GPU pipeline."""
    manifest = tmp_path / "m.sqlite"
    assert main(["scan", str(gpu_dataset), "--device", "gpu", "--deep", "--manifest", str(manifest), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("daliload scan: a deep scan for device 'gpu' decodes on the GPU") and "Traceback" not in err
    assert not manifest.exists()
