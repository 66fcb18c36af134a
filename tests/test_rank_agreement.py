"""Ranks given different options agree or stop: a real torchrun job of 2 gloo ranks (CPU).

Rank 1 builds each loader with one option changed (batch size, seed, root,
split, clip length and crop size): every rank must refuse it at construction,
with a message naming the option and each rank's value, instead of yielding
a different len() (DDP then pairs unequal batches and hangs) or an
overlapping shard. The constructions run in turn inside the same two
processes, and the job ends with an agreeing loader and a collective: a
refused construction leaves the process group in step.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).parent / "ddp" / "agreement_worker.py"
#: A hang bound, not a speed target: two ranks importing torch and building six loaders on 2 busy cores.
JOB_WITHIN_S = 300


def test_ranks_given_different_options_refuse_together_and_stay_in_step(small_kinetics, tmp_path):
    other = tmp_path / "other_root"  # never scanned: rank 1 must not get as far as reading it (or rank 0's)
    other.mkdir()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(WORKER), str(small_kinetics), str(other), str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=JOB_WITHIN_S)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    records = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]

    expected = {
        "batch_size": r"batch_size: batch_size=2 on rank 0, batch_size=3 on rank 1",
        "seed": r"seed: seed=7 on rank 0, seed=8 on rank 1",
        "root": rf"root: root='{re.escape(os.path.realpath(small_kinetics))}' on rank 0, "
                rf"root='{re.escape(os.path.realpath(other))}' on rank 1",
        "split": r"split: split='train' on rank 0, split='val' on rank 1",
        "clip_len and crop_size": r"clip_len: clip_len=4 on rank 0, clip_len=6 on rank 1; crop_size: "
                                  r"crop_size=\[48, 48\] on rank 0, crop_size=\[32, 32\] on rank 1",
    }
    for name, pattern in expected.items():
        # Both ranks refuse, with the same message: neither goes on to wait for the other.
        for record in records:
            kind, message = record["cases"][name]
            assert kind == "ValueError", (name, record["rank"], message)
            assert message.startswith("the ranks were given different options: "), message
            assert re.search(pattern, message), (name, message)
            assert "Every rank must construct its loader with the same values" in message
        assert records[0]["cases"][name] == records[1]["cases"][name]
    # ensure_manifest on its own: rank 1, given another root, refuses rather than read rank 0's manifest.
    assert records[0]["ensure_manifest"][0] == "returned"
    kind, message = records[1]["ensure_manifest"]
    assert kind == "ValueError" and re.search(
        rf"rank 1 was given root {re.escape(str(other))}, global rank 0 {re.escape(os.path.realpath(small_kinetics))}: "
        rf"every rank must read the same dataset \(its manifest is rank 0's, .+manifest.sqlite\); pass one root",
        message), message
    # Each refusal left the process group usable: the agreeing loader's len() summed over both ranks.
    assert [r["agreed"]["len"] for r in records] == [records[0]["agreed"]["len"]] * 2
    assert all(r["agreed"]["sum"] == 2 * r["agreed"]["len"] for r in records)


def _ranks_of(monkeypatch, entries: list) -> None:
    """Make this process rank 0 of ``len(entries)``, whose all_gather_object returns its own entry then ``entries``."""
    from daliload import runtime

    monkeypatch.setattr(runtime, "is_distributed", lambda: True)
    monkeypatch.setattr(runtime, "all_gather_object", lambda mine: [mine, *entries])


SETTINGS = {"root": "/data/k400", "split": "train", "batch_size": 8}
FINGERPRINT = {"videos": 12, "paths": "p", "labels": "l", "facts": "f"}


def test_a_rank_whose_construction_failed_stops_the_others_naming_it(monkeypatch):
    from daliload.epoch import refuse_disagreeing_ranks

    _ranks_of(monkeypatch, [(SETTINGS, None, "ValueError: split 'val' of m.sqlite has no decodable video")])
    with pytest.raises(RuntimeError, match=r"the loader failed on rank 1: ValueError: split 'val' of m.sqlite has "
                                           r"no decodable video \(this rank stops too, instead of waiting"):
        refuse_disagreeing_ranks(SETTINGS, ("m.sqlite", FINGERPRINT), None)
    # The failed rank itself: nothing raised here, the caller raises its own error.
    refuse_disagreeing_ranks(SETTINGS, None, ValueError("its own"))


def test_ranks_that_read_different_lists_of_videos_refuse_naming_what_differs(monkeypatch):
    from daliload.epoch import refuse_disagreeing_ranks

    other = {**FINGERPRINT, "videos": 11, "paths": "q"}
    _ranks_of(monkeypatch, [(SETTINGS, ("/node1/m.sqlite", FINGERPRINT), None),
                            (SETTINGS, ("/node2/m.sqlite", other), None)])
    with pytest.raises(ValueError, match=r"the ranks read different lists of videos for split 'train': rank 0: 12 "
                                         r"videos from /node0/m.sqlite; rank 1: 12 videos from /node1/m.sqlite; "
                                         r"rank 2: 11 videos from /node2/m.sqlite \(other files than rank 0\)\. "
                                         r"Every rank must read the same manifest"):
        refuse_disagreeing_ranks(SETTINGS, ("/node0/m.sqlite", FINGERPRINT), None)


def test_many_ranks_are_named_by_runs(monkeypatch):
    from daliload.epoch import refuse_disagreeing_ranks

    _ranks_of(monkeypatch, [(SETTINGS, None, None)] * 5 + [({**SETTINGS, "batch_size": 4}, None, None)]
              + [(SETTINGS, None, None)])
    with pytest.raises(ValueError, match=r"batch_size: batch_size=8 on ranks 0-5, 7, batch_size=4 on rank 6\."):
        refuse_disagreeing_ranks(SETTINGS, None, None)
