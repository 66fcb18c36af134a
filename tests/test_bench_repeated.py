"""``python -m benchmarks.bench_repeated``: every k on the same videos, the peers on the loader's plan, equal work.

No speed is asserted: the tests check that each peer's decode of the union of a video's windows gives
exactly the plan's frames (the frame index painted into every generated frame, read back), and that a
tiny run writes every k's counts, each peer's rounds and the ratios with their spread.
"""

from __future__ import annotations

import json

import pytest

from benchmarks.datasets import DatasetSpec, kinetics_layout, prepare_dataset
from benchmarks.peers.union import UNION_PEERS, UnionDataset, decode_union, video_groups
from daliload.framecode import read_code
from daliload.loader import KineticsDALILoader

@pytest.fixture(scope="module", params=["h264", "vp9"])
def dataset(request, tmp_path_factory):
    # H.264 with B-frames (decode order differs from presentation order) and VP9; 4 s: 120 frames, so a
    # video's k windows (61 frames each) overlap in some places and not in others.
    spec = DatasetSpec(name=f"{request.param}-tiny", codec=request.param, width=128, height=96, gop=250,
                       num_clips=3, duration_s=4.0)
    return prepare_dataset(spec, tmp_path_factory.mktemp(f"repeated-{request.param}"), workers=1)


def _plan(dataset, k: int):
    loader = KineticsDALILoader(kinetics_layout(dataset), "train", batch_size=4, clip_len=16, frame_stride=4,
                                crop_size=64, device="cpu", clips_per_video=k, last_batch="partial")
    try:
        return loader.plan(1), {v.path: v.num_frames for v in loader.videos}, loader.output
    finally:
        loader.close()


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("peer", list(UNION_PEERS))
def test_every_peers_union_decode_gives_exactly_the_plans_frames(peer, k, dataset):
    decode, probe, _ = UNION_PEERS[peer]
    why_not = probe()
    if why_not is not None:
        pytest.skip(f"{peer} cannot run here: {why_not}")
    batches, num_frames, _ = _plan(dataset, k)
    groups = [g for batch in video_groups(batches) for g in batch]
    assert len(groups) == len(dataset.videos) and all(len(g) == k for g in groups)
    assert all(len({s.start_frame for s in g}) > 1 for g in groups)  # k windows, not one window k times
    for group in groups:
        clips = decode_union(decode, group, num_frames[group[0].path])
        assert len(clips) == k
        for sample, frames in zip(group, clips):
            planned = sample.frame_indices(num_frames[sample.path])
            got = [read_code(frames[t], layout="HWC").index for t in range(len(planned))]
            assert got == planned, (peer, sample)


def test_the_union_dataset_transforms_each_clip_of_a_group_as_the_plan_says(dataset):
    from benchmarks.task import transform_clip

    decode, probe, _ = UNION_PEERS["decord"]
    if probe() is not None:
        pytest.skip(probe())
    batches, num_frames, output = _plan(dataset, 2)
    groups = [g for batch in video_groups(batches) for g in batch]
    items = UnionDataset(groups, num_frames, decode, output)
    videos, labels = items[0]
    assert tuple(videos.shape) == (2, 3, 16, 64, 64) and labels.tolist() == [s.label for s in groups[0]]
    frames = decode_union(decode, groups[0], num_frames[groups[0][0].path])
    for clip, sample, raw in zip(videos, groups[0], frames):
        assert clip.equal(transform_clip(raw, sample, output))


@pytest.mark.slow
def test_the_benchmark_runs_every_k_on_the_same_videos_beside_the_peers_and_writes_the_ratios(tmp_path):
    from benchmarks import bench_repeated

    out, md, page = tmp_path / "repeated.json", tmp_path / "RESULTS.md", tmp_path / "using.md"
    page.write_text("a\n<!-- repeated:begin: generated -->\nold\n<!-- repeated:end -->\nb\n")
    assert bench_repeated.main(["--videos", "3", "--duration", "2.1", "--size", "128x96", "--batch-size", "4",
                                "--rounds", "1", "--workers", "1", "--data-dir", str(tmp_path / "data"),
                                "--json", str(out), "--results-md", str(md), "--readme", str(page)]) == 0
    result = json.loads(out.read_text())
    available = [p for p in UNION_PEERS if UNION_PEERS[p][1]() is None]
    assert result["settings"]["videos"] == 3 and result["settings"]["rounds"] == 1
    # H.264 is the fallback's only; VP9 is DALI's route, shared with the fallback by the router (one DALI
    # thread and one worker: the first batch is split)
    for name, route in (("h264-gop250", "fallback"), ("vp9", "both")):
        rows = result["datasets"][name]
        # The same 3 videos for every k: 3 k clips per epoch, for daliload and every peer.
        assert [(r["k"], r["videos"], r["clips_per_epoch"]) for r in rows] == [(1, 3, 3), (2, 3, 6), (4, 3, 12)]
        assert {r["route"] for r in rows} <= {route, "dali"} and rows[0]["route"] == route
        for row in rows:
            assert len(row["runs"]) == 1 and len(row["orders"]) == 1
            assert sorted(row["orders"][0]) == sorted(["daliload", *available])
            assert sorted(row["peers"]) == sorted(available)
            for peer in row["peers"].values():
                assert peer["clips"] == row["clips_per_epoch"] and len(peer["runs"]) == 1
            if available:
                assert row["best_peer"] in available
                ratio = row["over_best_peer"]
                assert ratio["min"] <= ratio["median"] <= ratio["max"] and len(ratio["runs"]) == 1
    fallback = result["datasets"]["h264-gop250"]
    assert fallback[2]["fallback_frames_per_clip"] < fallback[0]["fallback_frames_per_clip"]  # one pass, 4 clips
    assert set(result["targets"]) == {"2", "4"}
    assert set(result["peer_targets"]) == {"h264-gop250", "vp9"}
    for target in result["peer_targets"].values():
        assert target["k"] == 2
        assert target["verdict"] in ("met", "**missed**", "not settled (the rounds straddle it)", "not measured")
    text = md.read_text()
    assert "## Repeated sampling: `python -m benchmarks.bench_repeated`" in text and "| `vp9` (" in text
    assert "Target on `h264-gop250`: daliload at least 1.3x the best peer at k = 2" in text
    figures = page.read_text()
    assert "old" not in figures and "the same 3 videos for every k" in figures
    assert figures == "a\n<!-- repeated:begin: generated -->\n" + bench_repeated.readme_figures(result) \
        + "<!-- repeated:end -->\nb\n"


@pytest.mark.parametrize(("argv", "message"), [
    (["--batch-size", "6"], "--batch-size must be a multiple of 4"),
    (["--rounds", "0"], "--rounds: expected an integer >= 1"),
    (["--peers", "decord,pyav"], "--peers: unknown peer 'pyav'"),
])
def test_the_benchmark_refuses_bad_options(argv, message, capsys):
    from benchmarks import bench_repeated

    with pytest.raises(SystemExit) as exit_info:
        bench_repeated.parse_args(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
