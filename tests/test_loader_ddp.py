"""The loader under real torchrun jobs (gloo on CPU): one node with 2 ranks, and 2 "nodes" on localhost."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path


WORKER = Path(__file__).parent / "ddp" / "loader_worker.py"
EPOCHS = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(args: list[str], root: Path, out: Path, **env_extra: str) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **env_extra)
    cmd = [sys.executable, "-m", "torch.distributed.run", *args, str(WORKER), str(root), str(out), str(EPOCHS)]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(*procs: subprocess.Popen) -> None:
    for proc in procs:
        output, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, output[-4000:]


def read_ranks(out: Path, world_size: int) -> list[dict]:
    records = [json.loads((out / f"rank{r}.json").read_text()) for r in range(world_size)]
    assert [r["world_size"] for r in records] == [world_size] * world_size
    return records


def check_epochs(records: list[dict]) -> None:
    paths = set(records[0]["paths"])
    assert all(set(r["paths"]) == paths for r in records)
    for epoch in range(EPOCHS):
        per_rank = [r["epochs"][epoch] for r in records]
        # Same batch count on every rank, and len() says it.
        assert len({e["batches"] for e in per_rank}) == 1
        assert all(e["batches"] == e["len"] for e in per_rank)
        # Every decoded clip showed the planned frames, flip and label of the sample filling its slot.
        assert all(e["mismatches"] == [] for e in per_rank)
        # Every video exactly once across ranks, apart from the marked padding.
        real = [s[0] for e in per_rank for s in e["samples"] if not s[3]]
        assert sorted(real) == sorted(paths)
    orders = [[s[:3] for s in records[0]["epochs"][e]["samples"]] for e in range(EPOCHS)]
    assert orders[0] != orders[1], "epochs must reshuffle"


def test_two_ranks_cover_every_video_and_repeat_with_the_seed(small_kinetics, tmp_path):
    runs = []
    for i in range(2):
        out = tmp_path / f"run{i}"
        out.mkdir()
        finish(torchrun(["--standalone", "--nproc_per_node=2"], small_kinetics, out))
        runs.append(read_ranks(out, 2))
    check_epochs(runs[0])
    assert runs[0][0]["num_videos"] > 4
    for rank in range(2):
        assert runs[0][rank]["epochs"] == runs[1][rank]["epochs"], "same seed, same samples"


def test_two_nodes_on_localhost_behave_the_same(small_kinetics, tmp_path):
    port = free_port()
    common = ["--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d",
              f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=daliload-test"]
    nodes = [torchrun(common + [f"--node_rank={n}"], small_kinetics, tmp_path) for n in range(2)]
    finish(*nodes)
    records = read_ranks(tmp_path, 2)
    check_epochs(records)
    single = tmp_path / "single"
    single.mkdir()
    finish(torchrun(["--standalone", "--nproc_per_node=2"], small_kinetics, single))
    # Two nodes of one rank each plan exactly what one node of two ranks plans.
    assert [r["epochs"] for r in records] == [r["epochs"] for r in read_ranks(single, 2)]


def test_faults_on_one_rank_keep_both_ranks_in_step(small_kinetics, tmp_path):
    """A crash and a hang on rank 1 only: rank 1 replaces those samples, and both ranks yield len() batches."""
    from daliload.loader import KineticsDALILoader

    videos = KineticsDALILoader(small_kinetics, "train", batch_size=2, clip_len=4).videos  # scans, as the ranks will
    fallback = sorted(v.path for v in videos if v.route == "fallback")
    crash, hang = fallback[0], fallback[1]
    finish(torchrun(["--standalone", "--nproc_per_node=2"], small_kinetics, tmp_path,
                    FAULT_RANK="1", FAULT_SPEC=f"{crash}=segv;{hang}=hang"))
    records = read_ranks(tmp_path, 2)
    check_epochs(records)
    assert all(e["failures"] == [] for e in records[0]["epochs"])
    failed = {path: reason for e in records[1]["epochs"] for path, reason in e["failures"]}
    assert failed, "the faulty files never reached rank 1: pick others"
    assert set(failed) <= {crash, hang}
    assert all(reason.startswith(("worker died (signal SIGSEGV)", "timeout")) for reason in failed.values())
