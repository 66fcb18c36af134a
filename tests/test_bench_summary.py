"""The run's verdicts (GOP-bound limit, ratios, targets, README section) and the fallback's stage profile."""

from __future__ import annotations

import pytest

from benchmarks.datasets import DatasetSpec, loader_order, prepare_dataset
from benchmarks.summary import README_BEGIN, README_END, gop_bound, ratios, readme_section, write_readme


def _measurement(loader: str, clips_per_s: float, *, kind: str = "loader", workers: int = 2,
                 frames_per_s: float | None = None, busy: float = 2.0) -> dict:
    def summary(value):
        return {"median": value, "low": value * 0.9, "high": value * 1.1, "spread_pct": 10.0, "n": 3}

    return {"loader": loader, "kind": kind, "dataset": "h264-gop250", "workers": workers, "sweep": "main",
            "status": "ok", "figures": {"clips_per_s": summary(clips_per_s),
                                        "frames_per_s": summary(frames_per_s) if frames_per_s else None,
                                        "cores_busy": summary(busy)}}


def _result(ceiling_workers: int = 2) -> dict:
    # The docstring's worked example: 6,000 frames/s, 170 frames per clip from keyframe to window end.
    return {
        "name": "t", "settings": {"workers": 2, "runs": 3, "clip_len": 16, "frame_stride": 4, "crop_size": 224,
                                  "batch_size": 2},
        "machine": {"label": "", "cpu_model": "cpu", "cpu_cores": 2, "cpu_cores_usable": 2, "memory_gib": 1,
                    "gpu": None, "date_utc": "2026-01-01 00:00 UTC", "versions": {"torchcodec": "0.13.0"},
                    "load_avg_start": 1.0, "load_avg_end": 2.0},
        "datasets": [{"name": "h264-gop250", "num_clips": 64, "seek_estimate": 170 * 64, "width": 340,
                      "height": 256, "codec": "h264", "gop": 250, "duration_s": 10.0, "description": ""}],
        "measurements": [
            _measurement("ceiling-pyav", 20.0, kind="ceiling", workers=ceiling_workers, frames_per_s=6000.0),
            _measurement("torchcodec-cpu", 20.0),
            _measurement("daliload", 40.0),
            _measurement("daliload-fallback", 42.4, busy=1.0),
        ],
    }


def test_gop_bound_limit_and_ratios_worked_example():
    result = _result()
    limit = gop_bound(result, result["datasets"][0])
    assert limit["clips_per_s"] == pytest.approx(6000 / 170) and limit["processes"] == 2
    r = ratios(result)["h264-gop250"]
    assert r["path"] == "daliload-fallback"  # no DALI row on this dataset: the loader routes to the fallback
    assert r["fallback_over_limit"] == pytest.approx(42.4 / (6000 / 170))  # 1.20
    assert r["whole_over_limit"] == pytest.approx(40 / (6000 / 170))
    assert r["whole_over_path"] == pytest.approx(40 / 42.4)
    # Per busy core: the fallback used one core, the ceiling two: twice the wall-clock ratio.
    assert r["fallback_over_limit_per_core"] == pytest.approx(2 * 42.4 / (6000 / 170))


def test_no_limit_from_a_ceiling_with_other_processes_than_the_loaders():
    result = _result(ceiling_workers=1)
    assert gop_bound(result, result["datasets"][0]) is None
    assert ratios(result)["h264-gop250"]["fallback_over_limit"] is None


def test_readme_section_is_replaced_between_the_markers_only(tmp_path):
    readme = tmp_path / "README.md"
    assert write_readme(readme, _result()) is False  # no file: nothing written
    readme.write_text("# x\n\nno markers here\n")
    assert write_readme(readme, _result()) is False and readme.read_text() == "# x\n\nno markers here\n"
    readme.write_text(f"# x\n\n{README_BEGIN}\n| old | 9.9 |\n{README_END}\n\nHand notes (2026-01-01).\n")
    assert write_readme(readme, _result()) is True
    text = readme.read_text()
    assert "9.9" not in text and text.endswith(f"{README_END}\n\nHand notes (2026-01-01).\n")
    assert readme_section(_result()) in text
    assert "| torchcodec 0.13.0 | daliload (its defaults) | daliload fallback alone |" in text
    # torchcodec's scan-free mode gets a column of its own, named with its version and its mode.
    result = _result()
    result["measurements"].append(_measurement("torchcodec-cpu-approx", 25.0))
    assert ("| torchcodec 0.13.0 | torchcodec 0.13.0, approximate seek (no scan) | daliload (its defaults) |"
            in readme_section(result))
    assert "42.4 (38.2-46.6)" in text  # median (min-max)
    assert "fallback alone / GOP-bound limit on `h264-gop250`: 1.20x (target >= 1.2: met)" in text
    assert "whole loader / GOP-bound limit on `h264-gop250`: 1.13x (target >= 1.1: met)" in text


@pytest.fixture(scope="module")
def tiny_h264(tmp_path_factory):
    spec = DatasetSpec(name="h264-gop250", codec="h264", width=128, height=96, gop=30, num_clips=3,
                       duration_s=3.0)
    return prepare_dataset(spec, tmp_path_factory.mktemp("bench-stages"), workers=1)


def test_stage_profile_times_every_stage(tiny_h264):
    from benchmarks.peers.daliload_peer import loader_hints
    from benchmarks.stages import STAGES, profile_clips
    from benchmarks.task import TaskSpec, make_plan

    task = TaskSpec(batch_size=2, seed=1)
    samples = make_plan(tiny_h264.videos, task, loader_order(tiny_h264))
    profile = profile_clips(samples, tiny_h264.videos, task.output, hints=loader_hints(tiny_h264),
                            batch_size=2, warmup=1)
    assert profile.clips == 3 and set(profile.ms_per_clip) == set(STAGES)
    assert all(profile.ms_per_clip[stage] > 0 for stage in STAGES), profile.ms_per_clip
    assert profile.total_ms == pytest.approx(sum(profile.ms_per_clip.values()))
    assert 16 <= profile.frames_decoded_per_clip < profile.exact_frames_per_clip
    # The wrappers are gone afterwards: the fallback's own functions are back.
    from fallback import decode

    assert decode._Window.open.__qualname__ == "_Window.open"
    assert decode.FrameTable.demux.__func__.__qualname__ == "FrameTable.demux"


def test_a_hint_that_cannot_skip_opens_the_file_once(tiny_h264, monkeypatch):
    import av

    from benchmarks.peers.daliload_peer import loader_hints
    from fallback import decode_window

    video = tiny_h264.videos[0]
    hint = loader_hints(tiny_h264)[video.path]
    opened = []
    real_open = av.open
    monkeypatch.setattr(av, "open", lambda *a, **k: opened.append(a[0]) or real_open(*a, **k))
    decode_window(video.path, [2, 6, 10], hint=hint)  # keyframe 0: nothing for a seek to skip
    assert len(opened) == 1
    opened.clear()
    clip = decode_window(video.path, [40, 44, 48], hint=hint)  # keyframe 30: the hint's seek
    assert len(opened) == 1 and clip.num_frames_decoded <= 48 - 30 + 1 + 4


def test_daliloads_own_rows_are_never_the_best_peer_and_the_headline_quotes_the_rounds():
    from benchmarks.summary import headline, peer_ratios

    result = _result()
    result["settings"]["device"] = "cpu"
    result["measurements"].append(_measurement("daliload-static", 99.0))  # daliload's, however fast
    for m, rounds in zip(result["measurements"], ([20, 20, 20], [20, 19, 21], [40, 38, 44], [42, 42, 42],
                                                  [99, 99, 99])):
        m.update(plan_windows=True, round_clips_per_s=rounds)
    table, judged = peer_ratios(result)
    assert table["h264-gop250"]["best_peer"] == "torchcodec-cpu"
    ratio = table["h264-gop250"]["daliload_over_best_peer"]
    assert (ratio["min"], ratio["median"], ratio["max"]) == pytest.approx((2.0, 2.0, 44 / 21))
    assert judged["verdict"] == "met" and judged["best_peer"] == "torchcodec-cpu"
    result["round_ratios"], result["peer_target"] = table, judged
    text = headline(result)
    assert 'on the CPU (no GPU table yet: the one GPU visit is in benchmarks/RESULTS.md, "GPU visits")' in text
    assert "run `t` of `python -m benchmarks`" in text
    assert "| `h264-gop250` | 40.0 (36.0-44.0) | `torchcodec-cpu`, 20.0 (18.0-22.0) | 2.00x (2.00-2.10) |" in text
    assert "| 2.00x (2.00-2.10) | >= 1.3: met |" in text
    del result["round_ratios"]
    assert "(this run has no per-round figures)" in headline(result)


def test_each_dataset_is_held_to_its_codecs_target_against_the_best_peer_on_every_round():
    """H.264 datasets to 1.3x the best peer, VP9 ones to 1.1x, each met or missed only when every round agrees;
    a dataset of another codec has no target."""
    from benchmarks.summary import peer_judgments, peer_target_lines

    def ratio(low, high):
        return {"min": low, "median": (low + high) / 2, "max": high, "runs": [low, high]}

    result = {"datasets": [{"name": "h", "codec": "h264"}, {"name": "v", "codec": "vp9"},
                           {"name": "v2", "codec": "vp9"}, {"name": "a", "codec": "av1"}],
              "round_ratios": {"h": {"best_peer": "p", "daliload_over_best_peer": ratio(1.2, 1.4)},
                               "v": {"best_peer": "p", "daliload_over_best_peer": ratio(1.12, 1.2)},
                               "v2": {"best_peer": "q", "daliload_over_best_peer": ratio(0.9, 1.0)},
                               "a": {"best_peer": "p", "daliload_over_best_peer": ratio(2.0, 2.0)}}}
    judged = {j["dataset"]: (j["target"], j["verdict"]) for j in peer_judgments(result)}
    assert judged == {"h": (1.3, "not settled (the rounds straddle it)"), "v": (1.1, "met"),
                      "v2": (1.1, "**missed**")}
    lines = peer_target_lines(result)
    assert "- daliload / the best peer (`q`) on `v2`, round by round: 0.95x (0.90-1.00) (target >= 1.1: **missed**)" \
        in lines and len(lines) == 3
