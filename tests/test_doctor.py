"""``daliload doctor``: for real on this machine (no GPU here), and with a GPU's facts faked.

The real run checks that every check is there with a sane status, that the
JSON parses, that the exit code follows the failures and that the one-clip
DALI decode really decodes (VP9 on DALI's CPU decoder, frames read back by
their frame codes). The faked runs give :func:`doctor.diagnose` a
:class:`doctor.Machine` as an H200 host would report it, with the two checks
that act (loading ``libnvcuvid``, the one-clip decode) replaced.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from daliload.cli import main
from daliload.commands import doctor
from daliload.commands.doctor import Machine, Workload

HAS_DALI = doctor.gather().dali is not None

#: What an H200 host with the cuda13 DALI wheel and a CUDA 12.8 torch reports.
H200 = Machine(python="3.11.7", torch="2.8.0+cu128", torch_cuda="12.8", torch_archs=("sm_80", "sm_90"),
               gpus=8, gpu_name="NVIDIA H200", compute_capability=(9, 0), driver="580.65.06", driver_cuda=13000,
               dali="nvidia-dali-cuda130", dali_version="2.4.0", cores=128, memory_bytes=2000 * 10**9,
               shm_bytes=64 * 10**9, memfd=True, start_method="forkserver")


@pytest.fixture
def faked_gpu_actions(monkeypatch):
    """libnvcuvid loads and the one-clip decode works, as on a healthy GPU host (no GPU is touched)."""
    monkeypatch.setattr(doctor, "load_nvcuvid", lambda: None)
    monkeypatch.setattr(doctor, "decode_one_clip", lambda device, timeout_s: (True, f"faked decode on {device}"))


def by_name(checks):
    return {c.name: c for c in checks}


# --- for real, here -------------------------------------------------------------------------------


def test_a_real_run_here_has_every_check_and_a_json_that_parses(capsys):
    code = main(["doctor", "--json", "--local-ranks", "1"])
    report = json.loads(capsys.readouterr().out)
    checks = {c["name"]: c for c in report["checks"]}
    assert list(checks) == list(doctor.CHECKS)
    assert all(c["status"] in doctor.STATUSES and c["detail"] for c in checks.values())
    assert all(c["fix"] for c in checks.values() if c["status"] in ("warn", "fail"))
    failed = [c for c in checks.values() if c["status"] == "fail"]
    assert code == (1 if failed else 0) and report["ok"] is not failed
    assert report["verdict"].startswith(f"{len(failed)} failed")
    assert report["machine"]["cores"] >= 1 and report["workload"]["batch_size"] == 32
    assert checks["python"]["status"] == "ok" and checks["pyav"]["status"] in ("ok", "warn")
    if not torch.cuda.is_available():  # what runs here is said, and the NVDEC checks skip
        for name in ("gpu", "nvdec codecs", "libnvcuvid"):
            assert checks[name]["status"] == "skip", checks[name]
        assert "vp8, vp9, mjpeg" in checks["nvdec codecs"]["detail"]
        assert "no GPU" in report["decoders"]
    if HAS_DALI and not torch.cuda.is_available():
        decode = checks["dali decode"]
        assert decode["status"] == "ok", decode
        assert "VP9 clip decoded by DALI's CPU decoder" in decode["detail"]
        assert "frames 4, 6, 8, 10, 12, 14, 16, 18, as planned" in decode["detail"]


def test_the_table_names_every_check_and_ends_with_the_verdict(capsys):
    code = main(["doctor", "--no-decode"])
    lines = capsys.readouterr().out.splitlines()
    status_column = lines[0].index("status")
    for name in doctor.CHECKS:
        row = next(line for line in lines if line.startswith(name + " "))
        assert row[status_column:].split()[0] in doctor.STATUSES  # aligned: the status under its header
    assert lines[-1].startswith("verdict: ") and lines[-2].startswith("decoders: ")
    assert code in (0, 1)


def test_a_decode_that_does_not_answer_in_time_is_reported_not_waited_for():
    worked, detail = doctor.decode_one_clip("cpu", 0.01)
    assert not worked
    assert "no answer within 0.01 s" in detail


def test_bad_options_name_the_value(capsys):
    with pytest.raises(ValueError, match=r"batch_size must be an integer >= 1, got 0"):
        Workload(batch_size=0)
    assert main(["doctor", "--no-decode", "--local-ranks", "0"]) == 2  # said, not a traceback
    assert "local_ranks must be an integer >= 1, got 0" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"dtype must be one of .*float16.*, got 'int8'"):
        Workload(dtype="int8")


# --- with a GPU's facts faked ---------------------------------------------------------------------


def test_an_h200_has_seven_engines_and_no_av1_on_nvdec(faked_gpu_actions):
    checks = by_name(doctor.diagnose(H200, Workload(local_ranks=8)))
    gpu = checks["gpu"]
    assert gpu.status == "ok"
    assert "8 x H200" in gpu.detail and "compute capability 9.0" in gpu.detail
    assert "7 NVDEC engines: 7 DALI pipelines a rank" in gpu.detail
    codecs = checks["nvdec codecs"]
    assert codecs.status == "ok"
    assert codecs.detail.startswith("DALI on NVDEC: h264, hevc, vp8, vp9, mpeg4;")
    assert "no AV1 on NVDEC hopper (H200): AV1 files go to the PyAV fallback" in codecs.detail
    assert checks["torch"].status == "ok" and checks["driver"].status == "ok"
    assert checks["libnvcuvid"].status == "ok" and checks["dali decode"].detail == "faked decode on gpu"
    assert "no GPU" not in doctor.decoders_here(H200)


def test_the_buffers_on_an_h200_are_uint8_for_seven_pipelines_ahead():
    per_batch, held, per_rank = doctor.shared_bytes_per_rank(H200, Workload(local_ranks=8))
    assert per_batch == 32 * 3 * 16 * 224 * 224  # uint8: the merge normalises on the GPU
    assert held == 7 + 2  # one batch ahead per DALI pipeline, the one handed out, the ring's copies
    assert per_rank == per_batch * held


def test_a_driver_too_old_for_the_dali_wheel_fails_naming_the_other_extra(faked_gpu_actions, monkeypatch, capsys):
    old = dataclasses.replace(H200, driver="550.54.15", driver_cuda=12040)
    driver = by_name(doctor.diagnose(old, Workload(), decode_timeout_s=None))["driver"]
    assert driver.status == "fail"
    assert "driver 550.54.15 (CUDA 12.4) is too old" in driver.detail and ">= 580" in driver.detail
    assert "pip uninstall -y nvidia-dali-cuda130 && pip install 'daliload[cuda12]'" in driver.fix
    # Through the command: the exit code says it failed, and so does the JSON.
    monkeypatch.setattr(doctor, "gather", lambda: old)
    assert main(["doctor", "--json", "--no-decode"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and "fix driver" in report["verdict"]


def test_a_driver_too_old_for_either_wheel_says_upgrade():
    ancient = dataclasses.replace(H200, driver="470.82.01", driver_cuda=11040)
    driver = doctor.check_driver(ancient)
    assert driver.status == "fail" and driver.fix.startswith("upgrade the driver to >= 580")


def test_torch_without_kernels_for_the_gpu_fails():
    blackwell = dataclasses.replace(H200, gpu_name="NVIDIA B200", compute_capability=(10, 0))
    checked = doctor.check_torch(blackwell)
    assert checked.status == "fail" and "no kernels for this GPU (sm_100)" in checked.detail
    cpu_build = dataclasses.replace(H200, torch="2.8.0+cpu", torch_cuda=None)
    checked = doctor.check_torch(cpu_build)
    assert checked.status == "fail" and "download.pytorch.org/whl/cu" in checked.fix


def test_a_small_dev_shm_warns_for_nccl_between_local_ranks(faked_gpu_actions):
    docker_default = dataclasses.replace(H200, shm_bytes=64 * 2**20)
    shm = doctor.check_dev_shm(docker_default, Workload(local_ranks=8))
    assert shm.status == "warn" and "8 local ranks" in shm.detail
    assert "docker run --shm-size=1g" in shm.fix
    assert doctor.check_dev_shm(docker_default, Workload(local_ranks=1)).status == "ok"


def test_batches_too_big_for_the_memory_fail_and_say_shm_size_does_not_help():
    small = dataclasses.replace(H200, memory_bytes=4 * 10**9)
    shared = doctor.check_shared_memory(small, Workload(local_ranks=8))
    assert shared.status == "fail"
    assert "9 batches x 0.08 GB" in shared.detail and "5.55 GB for 8 rank(s)" in shared.detail
    assert "docker run --memory=" in shared.fix and "--shm-size does not help" in shared.fix
    assert doctor.check_shared_memory(small, Workload(local_ranks=2)).status == "warn"  # 1.23 of 4 GB
    assert doctor.check_shared_memory(small, Workload(local_ranks=1, batch_size=4)).status == "ok"


def test_too_few_cores_per_local_rank_for_the_workers_warns():
    cores = doctor.check_cores(dataclasses.replace(H200, cores=16), Workload(local_ranks=8, fallback_workers=4))
    assert cores.status == "warn" and "2.0 a rank; fallback_workers=4" in cores.detail
    assert cores.fix.startswith("DecodeSpec(fallback_workers=2)")
    assert doctor.check_cores(dataclasses.replace(H200, cores=16), Workload(local_ranks=8)).status == "ok"
    crowded = doctor.check_cores(dataclasses.replace(H200, cores=4), Workload(local_ranks=8))
    assert crowded.status == "warn" and crowded.fix.startswith("more cores a rank")


def test_a_gpu_host_whose_cores_the_default_workers_leave_idle_warns_with_the_workers_that_fill_them():
    # the first GPU visit's host: 16 cores, one rank, the default 2 workers: 13 cores idle (one kept for the loop)
    lone = doctor.check_cores(dataclasses.replace(H200, cores=16, gpus=1), Workload(local_ranks=1))
    assert lone.status == "warn" and "13 core(s) a rank left idle" in lone.detail
    assert lone.fix == "DecodeSpec(fallback_workers=15)"
    assert doctor.check_cores(dataclasses.replace(H200, cores=16, gpus=1),
                              Workload(local_ranks=1, fallback_workers=15)).status == "ok"
    # 8 ranks on 32 cores: 4 a rank, 2 workers and the loop's core leave one: ok
    assert doctor.check_cores(dataclasses.replace(H200, cores=32), Workload(local_ranks=8)).status == "ok"
    # no GPU: DALI's CPU decoder takes the cores the workers leave (its threads default to one a core)
    assert doctor.check_cores(dataclasses.replace(H200, cores=16, gpus=0), Workload(local_ranks=1)).status == "ok"


def test_local_ranks_default_to_local_world_size_else_the_gpus(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert doctor.default_local_ranks(H200) == 8
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert doctor.default_local_ranks(H200) == 4
