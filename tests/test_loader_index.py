"""The loader's videos as columns: what it keeps per video, the plans it keeps, and what a resume checks."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import pytest

from daliload.loader import KineticsDALILoader
from daliload.plan import AugmentSpec, OutputSpec, make_train_plan
from daliload.prescreen.ensure import forget_checks

OPTIONS = dict(batch_size=2, clip_len=4, frame_stride=2, device="cpu", augment=AugmentSpec(crop_size=32),
               output=OutputSpec(size=(32, 32)))


@pytest.fixture
def copy(small_kinetics, tmp_path) -> Path:
    """The small dataset in the folders layout (no CSV or list file), so a renamed file is a different video."""
    root = tmp_path / "copy"
    shutil.copytree(small_kinetics, root, ignore=shutil.ignore_patterns(".daliload", "annotations", "*list.txt"))
    return root


def test_the_loader_keeps_its_videos_as_columns_and_plans_from_them(small_kinetics):
    loader = KineticsDALILoader(small_kinetics, "train", **OPTIONS)
    index = loader.videos
    assert index is loader.index and len(index) == len(loader.index.columns) > 0
    assert all(v.route in ("dali", "fallback") for v in index) and loader.rejected
    assert {v.path for v in index}.isdisjoint(f.path for f in loader.rejected)
    assert index.nbytes < 300 * len(index) + 4096  # a few hundred bytes a video, not a Python object each
    entries = [index[i] for i in range(len(index))]  # rows read like manifest entries
    plan = make_train_plan(entries, seed=0, epoch=0, rank=0, world_size=1, clip=loader.clip, augment=loader.augment)
    assert [s for b in loader.plan(0) for s in b][:len(plan)] == plan
    hint_of = loader.sources.fallback.hint_of  # looked up in the index when a video is sent to a worker
    path = next(v.path for v in index if v.keyframes and v.keyframes[0] == 0 and not v.vfr)
    assert hint_of(path).keyframe_indices == index[index.find(path)].keyframes
    assert hint_of("/not/in/the/split.mp4") is None
    assert loader.sources.frames_of(path) == index[index.find(path)].num_frames  # what the pass and DALI read
    with pytest.raises((AttributeError, pickle.PicklingError)):  # the index stays in the training process
        pickle.dumps(hint_of)
    loader.close()


def test_plans_are_not_kept_beyond_the_latest_two(small_kinetics):
    loader = KineticsDALILoader(small_kinetics, "train", **OPTIONS)
    for epoch in range(5):
        loader.plan(epoch)
    assert loader._plans.kept() == [3, 4]
    loader.set_epoch(7)
    next(iter(loader))  # a pass moving on to epoch 7 drops the others, then draws epoch 8 ahead
    assert set(loader._plans.kept()) <= {7, 8} and 7 in loader._plans.kept()
    loader.close()


def _replace_one_file(video: Path) -> None:
    """One train file removed and another added beside it: the same count, not the same files."""
    video.rename(video.with_name("zz_" + video.name))


def test_resume_fails_naming_what_changed_in_the_split(copy):
    loader = KineticsDALILoader(copy, "train", **OPTIONS)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    it.close()
    assert state["videos"]["videos"] == len(loader.videos) and state["manifest"] == str(loader.manifest_path)
    same = KineticsDALILoader(copy, "train", **OPTIONS)
    same.load_state_dict(state)  # unchanged data: resumes
    assert same.state_dict()["next_batch"] == 1
    _replace_one_file(Path(loader.videos[0].path))
    forget_checks()  # a new job: it checks the dataset again
    changed = KineticsDALILoader(copy, "train", **OPTIONS)
    assert len(changed.videos) == len(loader.videos)  # num_videos alone would resume on another plan
    with pytest.raises(ValueError, match=r"cannot resume: split 'train' has changed since the state was saved: "
                                         r"not the same files \(added, removed or renamed\) \(manifest .*\)\. "
                                         r"The plan would differ"):
        changed.load_state_dict(state)
    old_style = {k: v for k, v in state.items() if k not in ("videos", "manifest")}
    changed.load_state_dict(old_style)  # a state saved before fingerprints: compared as before (the count)
    with pytest.raises(ValueError, match=r"num_videos=.*the plan would differ"):
        changed.load_state_dict({**old_style, "num_videos": 3})
    for done in (loader, same, changed):
        done.close()


def test_a_relabelled_or_shorter_video_is_named_too(copy):
    loader = KineticsDALILoader(copy, "train", **OPTIONS)
    state = loader.state_dict()
    fingerprint = dict(state["videos"])
    for key, phrase in (("labels", "other labels"), ("facts", "other frame counts, frame rates or frame sizes"),
                        ("videos", "99 videos then")):
        broken = {**state, "videos": {**fingerprint, key: 99 if key == "videos" else "0" * 32}}
        with pytest.raises(ValueError, match=phrase):
            loader.load_state_dict(broken)
    loader.close()
