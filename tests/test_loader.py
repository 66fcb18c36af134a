"""KineticsDALILoader on CPU: DALI-CPU for VP9, the fallback for H.264 and odd files, merged in plan order."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import pytest
import torch

from daliload.failures import DecodeFailureWarning
from daliload.framecode import read_code
from daliload.loader import PADDING_LABEL, DecodeSpec, KineticsDALILoader, split_batches
from daliload.plan import AugmentSpec, CropBox, OutputSpec, Sample
from daliload.prescreen import Manifest
from fallback import TooManyFailuresError

RAW = OutputSpec(size=(48, 64), mean=(0, 0, 0), std=(1, 1, 1), dtype="float32")
# Centre crop with the frames' own 4:3 aspect = the whole frame, so the frame code stays readable.
WHOLE = AugmentSpec(crop_size=(48, 64), crop_mode="center", flip_prob=0.5)


@pytest.fixture(scope="module")
def dataset(small_kinetics) -> Path:
    return small_kinetics


def make_loader(root, split="train", **kw) -> KineticsDALILoader:
    kw.setdefault("batch_size", 4)
    kw.setdefault("clip_len", 6)
    kw.setdefault("frame_stride", 3)
    kw.setdefault("augment", WHOLE)
    kw.setdefault("output", RAW)
    # Each clip's decoder pinned: these tests compare loaders batch for batch and count DALI's clips; adaptive
    # routing (the training default) is tested in tests/test_routing_loader.py.
    kw.setdefault("decode", DecodeSpec(routing="static"))
    return KineticsDALILoader(root, split, **kw)


def check_batch(videos, labels, batch: list[Sample], manifest_frames: dict[str, int]):
    """Every row shows exactly the planned frames, mirrored as planned, with the planned label."""
    assert videos.shape == (len(batch), 3, 6, 48, 64)
    for k, sample in enumerate(batch):
        clip = videos[k]  # C, T, H, W
        codes = [read_code(clip[:, t], layout="CHW") for t in range(clip.shape[1])]
        assert [c.index for c in codes] == sample.frame_indices(manifest_frames[sample.path]), sample.path
        assert all(c.flipped == sample.flip for c in codes), sample.path
        assert int(labels[k]) == sample.label


def test_dali_and_fallback_samples_match_the_plan(dataset):
    loader = make_loader(dataset)
    assert loader.dali_enabled and loader.device == "cpu"
    frames = {v.path: v.num_frames for v in loader.videos}
    plan = loader.plan()
    got = list(loader)
    assert len(got) == len(plan) == len(loader)
    for (videos, labels), batch in zip(got, plan):
        check_batch(videos, labels, batch, frames)
    stats = loader.stats()
    # VP9 goes to DALI on the CPU; H.264 and the 4:4:4 / 10-bit / VFR files to the fallback.
    assert stats.clips_dali > 0 and stats.clips_fallback > 0
    assert stats.clips_dali + stats.clips_fallback == sum(len(b) for b in plan)
    assert stats.failures == ()
    routes = {v.path: v.route for v in loader.videos}
    assert {routes[s.path] for b in plan for s in b} == {"dali", "fallback"}
    assert len(stats.rejected) >= 2 and all(r.reason for r in stats.rejected)


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.cuda)])
def test_same_plan_dali_and_fallback_agree(request, device):
    """DALI on the CPU and the PyAV fallback give the same pixels for the same sample.

    Tolerance: mean absolute difference below 4 (0..255 scale). DALI interpolates
    chroma while FFmpeg's default conversion copies the nearest sample, which
    measures about 3 on colour edges (docs/architecture.md, Facts); a wrong frame, crop or flip
    differs by tens.
    """
    dataset = request.getfixturevalue("gpu_kinetics" if device == "gpu" else "dataset")
    aug = AugmentSpec(crop_size=(48, 64), crop_mode="random_resized", area_range=(0.3, 1.0), flip_prob=0.5)
    dali = make_loader(dataset, augment=aug, seed=5, device=device)
    pyav = make_loader(dataset, augment=aug, seed=5, device=device, decode=DecodeSpec(decoder="fallback"))
    assert pyav.plan() == dali.plan()
    dali_route = {v.path for v in dali.videos if v.route == "dali"}
    compared = 0
    for (a, _), (b, _), batch in zip(dali, pyav, dali.plan()):
        for k, sample in enumerate(batch):
            if sample.path in dali_route:
                diff = (a[k] - b[k]).abs().float().cpu()
                assert diff.mean() < 4.0, (sample.path, float(diff.mean()))
                compared += 1
    assert compared >= 3
    assert pyav.stats().clips_dali == 0


def test_val_plan_marks_padding_and_is_deterministic(dataset):
    loader = make_loader(dataset, "val", batch_size=3, label_padding=True)  # padding yielded, labelled
    first = [(v.clone(), lab.clone()) for v, lab in loader]
    again = list(loader)
    for (v1, l1), (v2, l2) in zip(first, again):
        assert torch.equal(v1, v2) and torch.equal(l1, l2)
    flat = [s for b in loader.plan() for s in b]
    labels = torch.cat([lab for _, lab in first]).tolist()
    for sample, label in zip(flat, labels):
        assert label == (PADDING_LABEL if sample.is_padding else sample.label)
        assert not sample.flip
    assert any(s.is_padding for s in flat)  # 4 val videos in batches of 3


def test_padding_label_minus_100_is_what_an_unchanged_loss_ignores(dataset):
    """Hugging Face's losses and torch's CrossEntropyLoss ignore -100 by default: with padding_label=-100 an
    unchanged validation step scores the real rows only; with -1 the same step raises (the reported crash)."""
    import torch.nn.functional as F

    loader = make_loader(dataset, "val", batch_size=3, padding_label=-100, with_info=True, label_padding=True)
    flat = [s for b in loader.plan() for s in b]
    labels, masks = [], []
    for _videos, batch_labels, info in loader:
        logits = torch.zeros(len(batch_labels), 10)
        F.cross_entropy(logits, batch_labels)  # no IndexError on the padding rows
        labels += batch_labels.tolist()
        masks += info.mask.tolist()
    assert labels == [-100 if s.is_padding else s.label for s in flat] and -100 in labels
    assert masks == [not s.is_padding for s in flat]
    videos, minus_one = next(iter(make_loader(dataset, "val", batch_size=3, label_padding=True)))
    if (minus_one == PADDING_LABEL).any():
        with pytest.raises(IndexError):
            F.cross_entropy(torch.zeros(len(minus_one), 10), minus_one)
    for bad in (0, 3, "x", True, -1.0):
        with pytest.raises(ValueError, match=r"padding_label must be a negative integer .* got " + repr(bad)):
            make_loader(dataset, "val", padding_label=bad)


def test_batch_keys_give_dicts_a_hugging_face_model_takes(dataset):
    """batch_keys=("pixel_values", "labels"): each batch a dict, the same tensors as the tuples, in plan order;
    with_info adds "info"; bad keys are refused naming the value."""
    tuples = [(v.clone(), lab.clone()) for v, lab in make_loader(dataset, "val", batch_size=3)]
    dicts = list(make_loader(dataset, "val", batch_size=3, batch_keys=("pixel_values", "labels"), with_info=True))
    assert len(dicts) == len(tuples) > 0
    for (videos, labels), batch in zip(tuples, dicts):
        assert set(batch) == {"pixel_values", "labels", "info"}
        assert torch.equal(batch["pixel_values"], videos) and torch.equal(batch["labels"], labels)
        assert torch.equal(batch["info"].mask, labels != PADDING_LABEL)
    for bad in (("videos",), ("a", "a"), ("videos", "info"), "videos", ("videos", 3)):
        with pytest.raises(ValueError, match=r"batch_keys must be None \(tuples\) or two different"):
            make_loader(dataset, "val", batch_keys=bad)


def test_epochs_reshuffle_and_resume_mid_epoch(dataset):
    loader = make_loader(dataset)
    loader.set_epoch(1)
    plan1 = loader.plan()
    assert [s.path for b in plan1 for s in b] != [s.path for b in loader.plan(0) for s in b]
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    assert state["epoch"] == 1 and state["next_batch"] == 1
    rest = [(v.clone(), lab.clone()) for v, lab in it]
    finished = loader.state_dict()  # the epoch is finished: the next pass draws epoch 2 from its first batch
    assert (finished["epoch"], finished["next_batch"]) == (2, 0)

    resumed = make_loader(dataset)
    resumed.load_state_dict(state)
    again = list(resumed)
    assert len(again) == len(rest) == len(plan1) - 1
    for (v1, l1), (v2, l2) in zip(rest, again):
        assert torch.equal(v1, v2) and torch.equal(l1, l2)
    with pytest.raises(ValueError, match="seed=0, this loader has seed=9"):
        make_loader(dataset, seed=9).load_state_dict(state)


def test_every_pass_starts_at_the_first_batch_and_draws_the_next_epoch_unless_told(dataset):
    loader = make_loader(dataset)

    def planned(epoch: int) -> list[list[int]]:
        return [[s.label for s in batch] for batch in loader.plan(epoch)]

    assert planned(2) != planned(3)
    loader.set_epoch(2)
    full = [lab.clone() for _, lab in loader]
    assert [lab.tolist() for lab in full] == planned(2) and loader.epoch == 2
    assert loader.state_dict()["epoch"] == 3  # nothing said otherwise: the next pass draws the next epoch
    videos, labels = next(iter(loader))  # a peek at one batch is a pass, of epoch 3, from its first batch
    assert labels.tolist() == planned(3)[0] and loader.epoch == 3
    loader.set_epoch(2)  # told: the same epoch again, whole
    again = [lab.clone() for _, lab in loader]
    assert len(again) == len(loader) == len(full)
    assert all(torch.equal(a, b) for a, b in zip(again, full))
    for i, _ in enumerate(loader):  # epoch 3, left after two batches
        if i == 1:
            break
    assert (loader.state_dict()["epoch"], loader.state_dict()["next_batch"]) == (3, 2)  # where it was left
    _, labels = next(iter(loader))  # a pass left early does not hold the next one back: epoch 4
    assert labels.tolist() == planned(4)[0] and loader.epoch == 4
    loader.set_epoch(2)  # the same epoch: starts it again
    third = [lab.clone() for _, lab in loader]
    assert len(third) == len(full) and all(torch.equal(a, b) for a, b in zip(third, full))


def test_a_loaded_state_resumes_once_and_survives_set_epoch_of_its_epoch(dataset, caplog):
    loader = make_loader(dataset)
    loader.set_epoch(1)
    full = [lab.clone() for _, lab in loader]
    state = {**loader.state_dict(), "epoch": 1, "next_batch": 2}  # as if saved at batch 2 of epoch 1
    resumed = make_loader(dataset)
    resumed.load_state_dict(state)
    assert resumed.state_dict()["next_batch"] == 2 and resumed.resumes_at == 2
    resumed.set_epoch(1)  # the usual resume loop sets the saved epoch: the resume holds
    rest = [lab.clone() for _, lab in resumed]
    assert len(rest) == len(full) - 2 and all(torch.equal(a, b) for a, b in zip(rest, full[2:]))
    assert len([lab for _, lab in resumed]) == len(full)  # once: the next pass is a whole one
    other = make_loader(dataset)
    other.load_state_dict(state)
    with caplog.at_level("WARNING", logger="daliload.loader"):
        other.set_epoch(3)
    assert "the state loaded for epoch 1 (at batch 2 of" in caplog.text
    assert other.resumes_at == 0 and len(list(other)) == len(other)


def test_a_pass_that_stops_at_the_last_batch_does_not_empty_the_next(dataset):
    loader = make_loader(dataset, "val", batch_size=2)
    first = [lab.clone() for _, (_, lab) in zip(range(len(loader)), loader)]  # never asks past the end
    second = [lab for _, lab in loader]
    assert len(first) == len(second) == len(loader)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_a_new_pass_closes_the_old_one(dataset):
    loader = make_loader(dataset)
    stale = iter(loader)
    next(stale)
    frames = {v.path: v.num_frames for v in loader.videos}
    fresh = list(loader)  # the whole epoch again, from its first batch
    assert len(fresh) == len(loader)
    for (videos, labels), batch in zip(fresh, loader.plan()):
        check_batch(videos, labels, batch, frames)
    with pytest.raises(StopIteration):
        next(stale)


def test_failure_limit_counts_the_whole_epoch(dataset, tmp_path):
    """One broken file must not stop an epoch whose fallback share is small; too many must, by name."""
    root = tmp_path / "copy"
    shutil.copytree(dataset, root, ignore=shutil.ignore_patterns(".daliload"))
    loader = make_loader(root)  # default max_failure_fraction 0.05, at least one failure allowed
    fallback_paths = sorted(v.path for v in loader.videos if v.route == "fallback")
    Path(fallback_paths[0]).unlink()
    with pytest.warns(RuntimeWarning, match="failed to decode"):
        assert len(list(loader)) == len(loader)
    assert [f.path for f in loader.stats().failures] == [fallback_paths[0]]
    for path in fallback_paths[1:3]:
        Path(path).unlink()
    with pytest.raises(TooManyFailuresError, match="failed to decode") as info:
        list(loader)
    assert set(fallback_paths[:3]) & {f.path for f in info.value.failures}


def test_epoch_survives_losing_every_fallback_file(dataset, tmp_path):
    """With no fallback-route file left, replacements come from the rest of the plan."""
    root = tmp_path / "copy"
    shutil.copytree(dataset, root, ignore=shutil.ignore_patterns(".daliload"))
    loader = make_loader(root, decode=DecodeSpec(max_failure_fraction=1.0, routing="static"))
    gone = {v.path for v in loader.videos if v.route == "fallback"}
    for path in gone:
        Path(path).unlink()
    with pytest.warns(RuntimeWarning, match="failed to decode"):
        batches = list(loader)
    assert len(batches) == len(loader) and all(v.shape[0] == 4 for v, _ in batches)
    stats = loader.stats()
    assert {f.path for f in stats.failures} == gone
    assert stats.replaced >= len(gone)


def test_file_broken_after_the_scan_is_replaced_and_reported(dataset, tmp_path):
    root = tmp_path / "copy"
    shutil.copytree(dataset, root, ignore=shutil.ignore_patterns(".daliload"))
    loader = make_loader(root, decode=DecodeSpec(max_failure_fraction=1.0, routing="static"))
    routes = {v.path: v.route for v in loader.videos}
    dali_victim = next(p for p, r in routes.items() if r == "dali")
    fallback_victim = next(p for p, r in routes.items() if r == "fallback")
    Path(dali_victim).write_bytes(b"\x00garbage" * 100)  # corrupted after the scan
    Path(fallback_victim).unlink()  # deleted after the scan
    with pytest.warns(RuntimeWarning, match="failed to decode") as record:
        batches = list(loader)
    # One failure budget for the epoch: one warning, whichever paths (DALI, fallback workers) failed.
    epoch_warnings = [w for w in record if issubclass(w.category, DecodeFailureWarning)]
    assert len(epoch_warnings) == 1, [str(w.message) for w in record]
    assert str(epoch_warnings[0].message).startswith(f"{len(loader.stats().failures)} of ")
    assert len(batches) == len(loader)
    assert all(v.shape[0] == 4 for v, _ in batches)
    stats = loader.stats()
    failed = {f.path for f in stats.failures}
    assert {dali_victim, fallback_victim} <= failed
    assert stats.replaced >= 2
    assert stats.clips_redecoded >= 1  # the DALI batch with the bad file went through the fallback
    # DALI named the culprit: it goes to the fallback from now on, its batch-mates stay on DALI.
    assert stats.rerouted == (dali_victim,)
    loader.set_epoch(1)
    with pytest.warns(RuntimeWarning, match="failed to decode"):
        assert len(list(loader)) == len(loader)
    again = loader.stats()
    assert again.clips_redecoded == 0 and again.clips_dali > 0
    assert dali_victim in {f.path for f in again.failures}


def test_without_dali_everything_goes_through_the_fallback(dataset, monkeypatch):
    import daliload.dali
    import daliload.options

    monkeypatch.setattr(daliload.dali, "is_dali_available", lambda: False)  # read when a loader is built
    monkeypatch.setattr(daliload.options, "_warned_no_dali", False)
    with pytest.warns(RuntimeWarning, match=r"DALI is not installed.*pip install 'daliload\[cuda13\]'"):
        loader = make_loader(dataset)
    assert not loader.dali_enabled
    frames = {v.path: v.num_frames for v in loader.videos}
    for (videos, labels), batch in zip(loader, loader.plan()):
        check_batch(videos, labels, batch, frames)
    assert loader.stats().clips_dali == 0


def test_reads_a_manifest_directly(dataset):
    manifest = dataset / ".daliload" / "manifest.sqlite"
    assert manifest.exists()
    loader = make_loader(manifest)
    with Manifest(manifest) as m:
        assert loader.classes == m.classes()
    assert len(loader.videos) + len(loader.rejected) == len(m_entries(manifest))


def m_entries(path):
    with Manifest(path) as m:
        return m.entries("train", device="cpu")


def test_the_dataset_root_is_root_and_source_its_old_name(dataset):
    """``root`` is the first argument; ``source=``, its name before, still works and says to use ``root``."""
    with pytest.warns(DeprecationWarning, match=r"KineticsDALILoader\(source=\.\.\.\) is deprecated: the dataset "
                                                r"root \(or manifest\) is root"):
        old = KineticsDALILoader(source=dataset, split="train", batch_size=4, clip_len=6, frame_stride=3,
                                 augment=WHOLE, output=RAW)
    new = make_loader(dataset)
    assert old.manifest_path == new.manifest_path and old.plan(0) == new.plan(0)
    assert KineticsDALILoader(root=dataset, batch_size=4, clip_len=6, frame_stride=3, augment=WHOLE,
                              output=RAW).plan(0) == new.plan(0)
    with pytest.raises(TypeError, match="got both root and source=, its old name: pass root only"):
        KineticsDALILoader(dataset, source=dataset)
    with pytest.raises(TypeError, match="missing its first argument, root: the dataset root or a manifest"):
        KineticsDALILoader(split="train")
    for loader in (old, new):
        loader.close()


def test_bad_inputs_are_named(dataset, tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        KineticsDALILoader(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="split 'test' is not in the manifest.*train, val"):
        make_loader(dataset, "test")
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1, got 0"):
        make_loader(dataset, batch_size=0)
    with pytest.raises(ValueError, match="last_batch must be"):
        make_loader(dataset, last_batch="fill")
    with pytest.raises(ValueError, match="device must be"):
        make_loader(dataset, device="tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="needs a CUDA GPU"):
            make_loader(dataset, device="gpu")
    with pytest.raises(ValueError, match="output.size"):
        make_loader(dataset, output=OutputSpec(size=(32, 32)))
    with pytest.raises(ValueError, match="decoder must be"):
        DecodeSpec(decoder="nvdec")


def test_small_batches_are_submitted_far_enough_ahead_to_keep_every_fallback_worker_busy(dataset):
    """Batches ahead: ``prefetch_batches``, or more when a batch holds fewer clips than the fallback's
    workers need queued (4 each); the loader's pass uses exactly that."""
    assert DecodeSpec().batches_ahead(32) == 2  # the default, already 16 clips a worker
    assert DecodeSpec(fallback_workers=2).batches_ahead(2) == 4
    assert DecodeSpec(fallback_workers=8).batches_ahead(3) == 11  # ceil(32 / 3)
    assert DecodeSpec(fallback_workers=0, dali_pipelines=3).batches_ahead(2) == 3
    assert DecodeSpec(prefetch_batches=6).batches_ahead(64) == 6
    # Repeated sampling: a video's clips are one task, so 8 clips of 4 per video are 2 tasks.
    assert DecodeSpec(fallback_workers=2).batches_ahead(8, clips_per_video=4) == 4
    assert DecodeSpec(fallback_workers=2).batches_ahead(8, clips_per_video=2) == 2
    assert DecodeSpec(fallback_workers=2).batches_ahead(2, clips_per_video=2) == 8  # one video a batch
    loader = make_loader(dataset, batch_size=2, decode=DecodeSpec(fallback_workers=2))
    try:
        assert loader._setup.prefetch == 4
    finally:
        loader.close()
    loader = make_loader(dataset, batch_size=4, clips_per_video=4, decode=DecodeSpec(fallback_workers=2))
    try:
        assert loader._setup.prefetch == 8  # one video a batch: 4 for each of 2 workers
    finally:
        loader.close()


def test_split_batches_policies():
    plan = [Sample(i, i, f"v{i}", 0, 0, 1, 1, CropBox.full()) for i in range(10)]
    pad = split_batches(plan, 4, "pad")
    assert [[s.position for s in b] for b in pad] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert [s.path for s in pad[-1]] == ["v8", "v9", "v0", "v1"]
    assert [s.is_padding for s in pad[-1]] == [False, False, True, True]
    assert len(split_batches(plan, 4, "drop")) == 2
    assert [len(b) for b in split_batches(plan, 4, "partial")] == [4, 4, 2]
    with pytest.raises(ValueError, match="last_batch"):
        split_batches(plan, 4, "keep")


@pytest.mark.cuda
def test_gpu_samples_match_the_plan(gpu_kinetics):
    loader = make_loader(gpu_kinetics, device="gpu")
    frames = {v.path: v.num_frames for v in loader.videos}
    for (videos, labels), batch in zip(loader, loader.plan()):
        assert videos.is_cuda
        check_batch(videos.cpu(), labels.cpu(), batch, frames)
    # On a GPU, H.264 goes to NVDEC too: only the 4:4:4 / 10-bit / VFR oddities need the fallback.
    assert loader.stats().clips_dali > loader.stats().clips_fallback


def test_a_test_split_is_scanned_on_demand(small_kinetics, tmp_path):
    root = tmp_path / "with_test"
    shutil.copytree(small_kinetics, root, ignore=shutil.ignore_patterns(".daliload"))
    shutil.copytree(root / "val", root / "test")
    loader = make_loader(root, "test", batch_size=2)
    assert {Path(v.path).parts[-3] for v in loader.videos} == {"test"}
    assert len(list(loader)) == len(loader)


@pytest.mark.parametrize("keyword, advice", [
    ("num_workers", r"'num_workers' is a torch DataLoader option; here use decode=DecodeSpec\(fallback_workers=N\)"),
    ("drop_last", r"'drop_last' is a torch DataLoader option; here use last_batch='drop'"),
    ("shuffle", r"shuffle must be True, False or None \(the default: on for split='train'\), got int 2"),
    ("pin_memory", r"'pin_memory' is a torch DataLoader option; here use nothing: batches come on the GPU"),
    ("collate_fn", r"'collate_fn' is a torch DataLoader option; here use nothing: batches are \(videos, labels\)"),
    ("batchsize", r"unexpected keyword argument 'batchsize' \(did you mean 'batch_size'\?\)"),
])
def test_dataloader_keywords_are_refused_naming_what_to_use(dataset, keyword, advice):
    with pytest.raises(TypeError, match=advice):
        KineticsDALILoader(dataset, "train", **{keyword: 2})


def test_a_clip_longer_than_every_video_is_refused_at_construction(dataset):
    with pytest.raises(ValueError, match=r"clip_len=10000 with frame_stride=4 spans 39997 frames, more than any "
                                         r"video of split 'train' has \(the longest, .+, has \d+\): lower"):
        make_loader(dataset, clip_len=10000, frame_stride=4)


def test_videos_smaller_than_the_crop_are_counted_in_one_warning(dataset):
    with pytest.warns(UserWarning, match=r"(\d+) of \1 videos of split 'train' are smaller than the crop 200x200 "
                                         r"\(height x width; first: .+, 128x96\); their clips are upscaled") as record:
        KineticsDALILoader(dataset, "train", batch_size=2, clip_len=4, crop_size=200).close()
    assert len([w for w in record if "upscaled" in str(w.message)]) == 1


def test_a_batch_larger_than_the_split_with_drop_is_refused_naming_the_split_size(dataset):
    videos = len(make_loader(dataset, last_batch="pad").videos)
    with pytest.raises(ValueError, match=rf"batch_size=64 with last_batch='drop' leaves no batch: split 'train' of "
                                         rf".+manifest.sqlite has {videos} decodable video\(s\), {videos} samples per "
                                         rf"rank of 1; use batch_size <= {videos} or last_batch='pad' or 'partial'"):
        make_loader(dataset, batch_size=64, last_batch="drop")
    assert len(make_loader(dataset, batch_size=videos, last_batch="drop")) == 1  # exactly one batch is fine


def test_the_default_batch_is_float32_and_output_fields_not_set_follow_the_crop(dataset):
    loader = KineticsDALILoader(dataset, "train", batch_size=2, clip_len=4, crop_size=(48, 64), device="cpu")
    videos, labels = next(iter(loader))
    assert videos.dtype == torch.float32 and tuple(videos.shape) == (2, 3, 4, 48, 64)
    model = torch.nn.Conv3d(3, 2, kernel_size=1)  # a float32 model takes the batch as it comes
    assert model(videos).dtype == torch.float32
    loader.close()
    half = KineticsDALILoader(dataset, "train", batch_size=2, clip_len=4, crop_size=(48, 64), device="cpu",
                              output=OutputSpec(dtype="bfloat16"))
    assert half.output.size == (48, 64)  # not set: it follows crop_size
    videos, _ = next(iter(half))
    assert videos.dtype == torch.bfloat16 and tuple(videos.shape) == (2, 3, 4, 48, 64)
    half.close()
    with pytest.raises(ValueError, match=r"output.size \(32, 32\) disagrees with the crop size \(48, 64\) \(crop_size "
                                         r"or augment.crop_size\); give the size in one place: leave OutputSpec.size "
                                         r"unset \(it follows the crop size\) or pass crop_size=\(32, 32\)"):
        KineticsDALILoader(dataset, "train", batch_size=2, clip_len=4, crop_size=(48, 64), device="cpu",
                           output=OutputSpec(size=(32, 32)))
    with pytest.raises(ValueError, match=r"dtype must be one of 'float32', 'float16', 'bfloat16', 'uint8', got 'half'"):
        OutputSpec(dtype="half")


def test_bfloat16_batches_hold_the_float32_clips_rounded_on_both_routes(dataset):
    """DALI has no bfloat16 output: it normalises in float32 and the batch is cast, as the fallback's."""
    kw = dict(batch_size=4, clip_len=4, frame_stride=2, augment=WHOLE, device="cpu")
    wide = KineticsDALILoader(dataset, "train", **kw, output=OutputSpec(dtype="float32"))
    narrow = KineticsDALILoader(dataset, "train", **kw, output=OutputSpec(dtype="bfloat16"))
    try:
        for (a, la), (b, lb) in zip(wide, narrow):
            assert b.dtype == torch.bfloat16 and torch.equal(la, lb)
            assert torch.equal(a.to(torch.bfloat16), b)
        assert narrow.stats().clips_dali > 0 and narrow.stats().clips_fallback > 0
    finally:
        wide.close()
        narrow.close()


def test_options_of_the_wrong_type_are_refused_naming_the_fix(dataset):
    with pytest.raises(TypeError, match=r"decode must be a DecodeSpec, got a dict \{'timeout_s': 1\}: use "
                                        r"decode=DecodeSpec\(timeout_s=1\)"):
        make_loader(dataset, decode={"timeout_s": 1})
    with pytest.raises(TypeError, match=r"augment must be an AugmentSpec, got a dict .+: use augment=AugmentSpec\("
                                        r"crop_size=48\)"):
        make_loader(dataset, augment={"crop_size": 48})
    with pytest.raises(TypeError, match=r"scan must be a ScanSpec or None, got str 'deep'"):
        make_loader(dataset, scan="deep")
    with pytest.raises(TypeError, match=r"label_padding must be True, False, 'drop' or None \(the default: 'drop' "
                                        r"when the loader neither shuffles nor augments, .+\), got 'x'"):
        make_loader(dataset, label_padding="x")


def test_a_state_that_is_not_this_loaders_is_refused_naming_what_differs(dataset):
    loader = make_loader(dataset)
    state = loader.state_dict()
    assert (state["clip_len"], state["crop_size"], state["split"]) == (6, [48, 64], "train")
    with pytest.raises(TypeError, match=r"load_state_dict\(\) takes the dict state_dict\(\) returned, got NoneType"):
        loader.load_state_dict(None)
    with pytest.raises(ValueError, match=r"cannot resume: the state has no 'epoch' or 'next_batch' \(its keys: "
                                         r"\[\]\); pass the dict state_dict\(\) returned"):
        loader.load_state_dict({})
    with pytest.raises(ValueError, match=r"cannot resume: the state's epoch must be an integer >= 0, got 1.5"):
        loader.load_state_dict({**state, "epoch": 1.5})
    with pytest.raises(ValueError, match=r"cannot resume: the state was saved with clip_len=6, this loader has "
                                         r"clip_len=8 \(the plan would differ\)"):
        make_loader(dataset, clip_len=8).load_state_dict(state)
    smaller = AugmentSpec(crop_size=(24, 32), crop_mode="center", flip_prob=0.5)
    with pytest.raises(ValueError, match=r"cannot resume: the state was saved with crop_size=\[48, 64\], this loader "
                                         r"has crop_size=\[24, 32\]"):
        make_loader(dataset, augment=smaller, output=None).load_state_dict(state)
    as_json = {**state, "crop_size": (48, 64), "short_side_range": (256, 320)}  # a state kept in Python: tuples
    loader.load_state_dict(as_json)
    assert loader.resumes_at == state["next_batch"]


def test_a_batch_larger_than_the_split_with_pad_warns_naming_both_numbers(dataset):
    videos = len(make_loader(dataset).videos)
    with pytest.warns(UserWarning, match=rf"batch_size=1000 with last_batch='pad' is larger than the split: split "
                                         rf"'train' of .+ has {videos} decodable video\(s\), {videos} samples per rank "
                                         rf"of 1, so each epoch is one batch of {videos} and {1000 - videos} repeats, "
                                         rf"trained on as real samples; use batch_size <= {videos}, or "
                                         rf"last_batch='partial' for one batch of {videos}"):
        loader = make_loader(dataset, batch_size=1000)
    assert len(loader) == 1
    with pytest.warns(UserWarning, match=r"and 996 repeats, labelled -1 \(masked\), but decoded"):
        make_loader(dataset, "val", batch_size=1000, label_padding=True)  # 4 val videos
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_loader(dataset, "val", batch_size=1000)  # padding left out: one batch of the 4 videos
        make_loader(dataset, batch_size=1000, last_batch="partial")
        make_loader(dataset, batch_size=videos)  # exactly the split: no repeat


def test_device_takes_what_torch_takes(dataset):
    """``device`` in torch's own forms: "cuda", "cuda:N", torch.device; refused with the forms it takes."""
    for device in ("cpu", torch.device("cpu"), " CPU "):
        assert make_loader(dataset, device=device).device == "cpu"
    if not torch.cuda.is_available():
        for device in ("cuda", "cuda:0", torch.device("cuda", 0), "gpu"):
            with pytest.raises(ValueError, match="needs a CUDA GPU visible to torch"):
                make_loader(dataset, device=device)
    with pytest.raises(ValueError, match=r"device must be a CUDA GPU or the CPU .*got 'meta'"):
        make_loader(dataset, device="meta")
    with pytest.raises(ValueError, match=r"device must be 'auto', 'gpu', 'cpu', 'cuda', 'cuda:N' or a torch.device"):
        make_loader(dataset, device="gpu0")
    with pytest.raises(TypeError, match="device must be a string .* or a torch.device, got int 0"):
        make_loader(dataset, device=0)


def test_the_gpu_is_the_one_asked_for_else_the_scripts_current_one_else_local_rank(monkeypatch):
    """With GPUs faked: "cuda:N" is GPU N (and one torch does not see is named with CUDA_VISIBLE_DEVICES);
    "cuda", "gpu" and "auto" follow torch.cuda.set_device(k) (k > 0: CUDA starts on GPU 0 whoever touches it),
    else LOCAL_RANK modulo the visible GPUs (what torchrun scripts pass to set_device)."""
    from daliload.runtime import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setenv("LOCAL_RANK", "6")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    assert resolve_device("cuda:1") == resolve_device(torch.device("cuda", 1)) == ("gpu", 1)
    assert resolve_device("cuda") == resolve_device("gpu") == resolve_device("auto") == ("gpu", 2)  # 6 % 4
    assert resolve_device(torch.device("cuda")) == ("gpu", 2)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)  # CUDA touched, no set_device: says nothing
    assert resolve_device("cuda") == ("gpu", 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)  # torch.cuda.set_device(3)
    assert resolve_device("cuda") == resolve_device("gpu") == ("gpu", 3)
    assert resolve_device("cuda:0") == ("gpu", 0)  # asked for by number: that one
    with pytest.raises(ValueError, match=r"device 'cuda:4': torch sees 4 GPU\(s\) here \(CUDA_VISIBLE_DEVICES="):
        resolve_device("cuda:4")
