"""Behaviour by name, not by split: ``shuffle=``, ``augment=``, ``label_padding="drop"``, ``batch_format=``,
mean/std in 0..1 units, and the DataLoader attributes training loops read (issue 43)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from daliload import DecodeSpec, KineticsDALILoader, evaluate
from daliload.plan import (AugmentSpec, ClipSpec, CropBox, OutputSpec, Sample, VideoInfo, drop_padding,
                           make_train_plan, make_val_plan, split_batches)

SMALL = dict(clip_len=4, frame_stride=2, crop_size=(48, 64), device="cpu")
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@pytest.fixture(scope="module")
def dataset(small_kinetics) -> Path:
    return small_kinetics


def order(loader: KineticsDALILoader, epoch: int) -> list[int]:
    return [s.video_index for batch in loader.plan(epoch) for s in batch]


def centred(loader: KineticsDALILoader, epoch: int) -> bool:
    """Whether every sample of ``epoch`` is its video's centred, unflipped clip."""
    fixed = {s.video_index: s for s in make_val_plan(loader.index.columns, rank=0, world_size=1, clip=loader.clip,
                                                     augment=loader.augment)}
    return all((s.start_frame, s.crop, s.flip) == (fixed[s.video_index].start_frame, fixed[s.video_index].crop,
                                                   False) for batch in loader.plan(epoch) for s in batch)


def test_shuffle_and_augment_follow_their_switches_whatever_the_split(dataset):
    val_trains = KineticsDALILoader(dataset, "val", batch_size=2, shuffle=True, augment=True, **SMALL)
    train_evaluates = KineticsDALILoader(dataset, "train", batch_size=4, shuffle=False, augment=False, **SMALL)
    shuffled_only = KineticsDALILoader(dataset, "train", batch_size=4, shuffle=True, augment=False, **SMALL)
    augmented_only = KineticsDALILoader(dataset, "train", batch_size=4, shuffle=False, augment=True, **SMALL)
    default_train = KineticsDALILoader(dataset, "train", batch_size=4, **SMALL)
    try:
        assert (val_trains.shuffle, val_trains.augmentation, val_trains.evaluating) == (True, True, False)
        assert val_trains.label_padding is False and val_trains.plan(0) != val_trains.plan(1)
        drawn = make_train_plan(val_trains.index.columns, seed=0, epoch=1, rank=0, world_size=1,
                                clip=val_trains.clip, augment=val_trains.augment)
        assert [s for b in val_trains.plan(1) for s in b][:len(drawn)] == drawn

        assert (train_evaluates.shuffle, train_evaluates.augmentation, train_evaluates.evaluating) == (
            False, False, True)
        assert train_evaluates.label_padding == "drop" and train_evaluates.plan(0) == train_evaluates.plan(3)
        assert order(train_evaluates, 0) == list(range(len(train_evaluates.index)))
        assert centred(train_evaluates, 0)
        assert train_evaluates.stats().routing == "static"  # figures the same, bit for bit, on every run
        assert (DecodeSpec().routing_for(True, "gpu", 32), DecodeSpec().routing_for(False, "gpu", 32)) == (
            "measured", "static")  # what "auto" gives a loader that trains, and one that evaluates

        # Shuffle alone: a new order each epoch, the centred clips; the order a training epoch has.
        assert order(shuffled_only, 0) != order(shuffled_only, 1) and centred(shuffled_only, 1)
        assert order(shuffled_only, 1) == order(default_train, 1)
        # Augmentation alone: the videos' order, random clips that change with the epoch.
        videos = len(augmented_only.index)
        assert order(augmented_only, 0) == order(augmented_only, 1)
        assert order(augmented_only, 0)[:videos] == list(range(videos))  # then the last batch's padding
        assert augmented_only.plan(0) != augmented_only.plan(1) and not centred(augmented_only, 0)
        # The plan settings say which: the ranks compare them, a resumed state must match them.
        state = train_evaluates.state_dict()
        assert (state["shuffle"], state["augmentation"], state["label_padding"]) == (False, False, "drop")
        with pytest.raises(ValueError, match=r"cannot resume: the state was saved with shuffle=False, this loader "
                                             r"has shuffle=True"):
            shuffled_only.load_state_dict(state)
    finally:
        for loader in (val_trains, train_evaluates, shuffled_only, augmented_only, default_train):
            loader.close()


def test_a_spec_alone_keeps_the_split_default_and_bad_switches_are_refused(dataset):
    spec = AugmentSpec(crop_size=(48, 64), crop_mode="random_resized")
    old_val = KineticsDALILoader(dataset, "val", batch_size=2, augment=spec, clip_len=4, frame_stride=2, device="cpu")
    trains = KineticsDALILoader(dataset, "val", batch_size=2, shuffle=True, augment=spec, clip_len=4,
                                frame_stride=2, device="cpu")
    try:
        assert (old_val.augmentation, old_val.augment) == (False, spec) and centred(old_val, 0)
        assert (trains.augmentation, trains.augment) == (True, spec)
    finally:
        old_val.close()
        trains.close()
    with pytest.raises(TypeError, match=r"shuffle must be True, False or None \(the default: on for split='train'\), "
                                        r"got str 'yes'"):
        KineticsDALILoader(dataset, "val", shuffle="yes", **SMALL)
    with pytest.raises(TypeError, match=r"augment must be True, False, an AugmentSpec or None, got str 'on'"):
        KineticsDALILoader(dataset, "val", augment="on", **SMALL)
    with pytest.raises(TypeError, match=r"augment must be an AugmentSpec, got a dict .+: use augment=AugmentSpec\("):
        KineticsDALILoader(dataset, "val", augment={"flip_prob": 0.0}, **SMALL)
    with pytest.raises(ValueError, match=r"views=\(2, 1\) is for evaluation splits .+ or a loader given augment=False"):
        KineticsDALILoader(dataset, "val", augment=True, views=(2, 1), **SMALL)
    with pytest.raises(ValueError, match=r"clips_per_video=2 is for split='train' \(repeated sampling\), or a loader "
                                         r"given shuffle=True or augment=True"):
        KineticsDALILoader(dataset, "train", batch_size=4, augment=False, clips_per_video=2, **SMALL)
    with pytest.raises(TypeError, match=r"label_padding must be True, False, 'drop' or None"):
        KineticsDALILoader(dataset, "val", label_padding="yes", **SMALL)
    views = KineticsDALILoader(dataset, "train", batch_size=2, shuffle=False, augment=False, views=(2, 1), **SMALL)
    repeated = KineticsDALILoader(dataset, "val", batch_size=4, shuffle=True, clips_per_video=2, **SMALL)
    try:
        assert views.views == (2, 1) and repeated.clips_per_video == 2
        assert repeated.drop_last is False
    finally:
        views.close()
        repeated.close()
    shuffled_val = KineticsDALILoader(dataset, "val", batch_size=2, shuffle=True, augment=False, **SMALL)
    try:
        with pytest.raises(ValueError, match=r"evaluate\(\) needs an evaluation split, a loader that neither "
                                             r"shuffles nor augments"):
            evaluate(torch.nn.Identity(), shuffled_val)
    finally:
        shuffled_val.close()


def test_dict_batches_by_name(dataset):
    tuples = KineticsDALILoader(dataset, "val", batch_size=2, **SMALL)
    dicts = KineticsDALILoader(dataset, "val", batch_size=2, batch_format="dict", **SMALL)
    hf = KineticsDALILoader(dataset, "val", batch_size=2, batch_format="dict", batch_keys=("pixel_values", "labels"),
                            last_batch="drop", **SMALL)
    try:
        videos, labels = next(iter(tuples))
        batch = next(iter(dicts))
        assert list(batch) == ["videos", "labels"]
        assert torch.equal(batch["videos"], videos) and torch.equal(batch["labels"], labels)
        assert list(next(iter(hf))) == ["pixel_values", "labels"] and hf.batch_keys == ("pixel_values", "labels")
        model = torch.nn.Sequential(torch.nn.AdaptiveAvgPool3d(1), torch.nn.Flatten(), torch.nn.Linear(3, 4))
        assert evaluate(model, dicts).num_videos == len(dicts.videos)  # dict batches, padding left out
        assert hf.drop_last is True and tuples.drop_last is False
    finally:
        for loader in (tuples, dicts, hf):
            loader.close()
    with pytest.raises(ValueError, match=r"batch_format must be 'tuple' or 'dict', got 'list'"):
        KineticsDALILoader(dataset, "val", batch_format="list", **SMALL)
    with pytest.raises(ValueError, match=r"batch_keys=\('pixel_values', 'labels'\) names the keys of dict batches, "
                                         r"but batch_format='tuple'"):
        KineticsDALILoader(dataset, "val", batch_format="tuple", batch_keys=("pixel_values", "labels"), **SMALL)


def test_mean_and_std_in_0_1_units_give_the_same_bits_as_in_0_255(dataset):
    in_01 = OutputSpec(mean=IMAGENET_MEAN, std=IMAGENET_STD)
    in_255 = OutputSpec(mean=tuple(m * 255 for m in IMAGENET_MEAN), std=tuple(s * 255 for s in IMAGENET_STD))
    assert in_01 == in_255 == OutputSpec(mean=IMAGENET_MEAN, std=IMAGENET_STD, units="0..1")
    assert OutputSpec(mean=(0, 0, 0), std=(1, 1, 1)).std == (1.0, 1.0, 1.0)  # raw pixels stay raw
    batches = []
    for output in (in_01, in_255):
        loader = KineticsDALILoader(dataset, "val", batch_size=2, output=output, **SMALL)
        try:
            batches.append(next(iter(loader)))
        finally:
            loader.close()
    assert torch.equal(batches[0][0], batches[1][0]) and torch.equal(batches[0][1], batches[1][1])
    assert -3 < float(batches[0][0].min()) < 0 < float(batches[0][0].max()) < 3  # ImageNet-normalised, not /255 twice
    with pytest.raises(ValueError, match=r"mean=\(0.485, 0.456, 0.406\) looks like 0..1 units but std=\(58.4, 57.1, "
                                         r"57.4\) looks like 0..255 units; give both in one unit"):
        OutputSpec(mean=IMAGENET_MEAN, std=(58.4, 57.1, 57.4))
    with pytest.raises(ValueError, match=r"mean=\(123.7, 116.3, 103.5\) looks like 0..255 units but std=\(0.229, "
                                         r"0.224, 0.225\) looks like 0..1 units"):
        KineticsDALILoader(dataset, "val", output=OutputSpec(mean=(123.7, 116.3, 103.5), std=IMAGENET_STD), **SMALL)
    with pytest.raises(ValueError, match=r"std=\(0.5, 58.0, 0.5\) mixes units"):
        OutputSpec(mean=(0.5, 0.5, 0.5), std=(0.5, 58.0, 0.5))
    with pytest.raises(ValueError, match=r"units must be 'auto', '0..255' or '0..1', got 'percent'"):
        OutputSpec(units="percent")
    with pytest.raises(ValueError, match=r"mean and std need 3 numbers \(RGB\), got mean='abc'"):
        OutputSpec(mean="abc")


def _sample(position: int, video: int, padding: bool = False, view: int = 0) -> Sample:
    return Sample(position, video, f"v{video}.mp4", video % 3, 0, 1, 4, CropBox.full(), is_padding=padding,
                  view=view)


def test_drop_padding_keeps_the_batch_count_and_no_batch_empty():
    # Rank 1 of 5 videos on 2 ranks: [1, 3, 0*]; batch_size 2, "pad": [1 3] [0* 1*].
    plan = [_sample(0, 1), _sample(1, 3), _sample(2, 0, padding=True)]
    batches = split_batches(plan, 2, "pad")
    assert [[s.video_index for s in b] for b in drop_padding(batches)] == [[1], [3]]
    # Views stay together: two views a video, a batch of 2 videos.
    views = [_sample(2 * i + v, video, padding=video == 0 and i == 2, view=v) for i, video in enumerate((1, 3, 0))
             for v in range(2)]
    dropped = drop_padding(split_batches(views, 4, "pad"), group=2)
    assert [[(s.video_index, s.view) for s in b] for b in dropped] == [[(1, 0), (1, 1)], [(3, 0), (3, 1)]]
    # batch_size 1: nothing to move, the padding video stays (labelled by the loader).
    assert [[s.is_padding for s in b] for b in drop_padding(split_batches(plan, 1, "pad"))] == [[False], [False],
                                                                                                [True]]
    # "partial": the last batch [0*] takes video 3.
    assert [[s.video_index for s in b] for b in drop_padding(split_batches(plan, 2, "partial"))] == [[1], [3]]


def test_unshuffled_training_plan_is_in_video_order_and_a_shuffled_centred_plan_takes_the_epoch_order():
    videos = [VideoInfo(f"v{i}.mp4", i % 3, 100, 25.0, 128, 96) for i in range(7)]
    clip, augment = ClipSpec(clip_len=4, frame_stride=2), AugmentSpec(crop_size=32)
    fixed = make_train_plan(videos, seed=3, epoch=2, rank=1, world_size=2, clip=clip, augment=augment, shuffle=False)
    assert [s.video_index for s in fixed] == [1, 3, 5, 0] and fixed[-1].is_padding
    shuffled = make_train_plan(videos, seed=3, epoch=2, rank=1, world_size=2, clip=clip, augment=augment)
    by_video = {s.video_index: s for rank in (0, 1) for s in make_train_plan(
        videos, seed=3, epoch=2, rank=rank, world_size=2, clip=clip, augment=augment) if not s.is_padding}
    assert all((s.start_frame, s.crop, s.flip) == (by_video[s.video_index].start_frame, by_video[s.video_index].crop,
                                                   by_video[s.video_index].flip) for s in fixed if not s.is_padding)
    centred_shuffled = make_val_plan(videos, rank=1, world_size=2, clip=clip, augment=augment, shuffle=True, seed=3,
                                     epoch=2)
    assert [s.video_index for s in centred_shuffled] == [s.video_index for s in shuffled]
    assert all(not s.flip for s in centred_shuffled)


def _lightning_mean(loader_per_rank: list[KineticsDALILoader]) -> tuple[float, int]:
    """What Lightning logs for ``self.log("val_acc", acc, sync_dist=True)`` over a pass of each rank's loader, with
    an unchanged step (a model that always says class 0): the mean of the batch means weighted by the batch size it
    infers (``extract_batch_size``, the first tensor's dim 0), summed over the ranks; and the padding rows seen."""
    from lightning.pytorch.utilities.data import extract_batch_size

    weighted, weights, padding = 0.0, 0, 0
    for loader in loader_per_rank:
        for batch in loader:
            videos, labels = batch
            acc = (torch.zeros_like(labels) == labels).float().mean()  # the step's own accuracy
            size = extract_batch_size(batch)
            assert size == len(labels) == videos.shape[0] > 0
            weighted, weights = weighted + float(acc) * size, weights + size
            padding += int((labels == loader.padding_label).sum())
    return weighted / weights, padding


def test_lightning_weights_evaluation_batches_right_with_padding_left_out(dataset, monkeypatch):
    """Two ranks (torchrun's variables, no process group), a batch size with padding: the default leaves it out, so the
    logged accuracy is the split's; ``label_padding=True`` (the old default) logs a biased figure."""
    pytest.importorskip("lightning")
    first = KineticsDALILoader(dataset, "train", shuffle=False, augment=False, **SMALL)  # scanned once, up front
    per_rank = -(-len(first.videos) // 2)
    first.close()
    # a batch size that leaves the last batch of each rank short: padding to leave out
    kw = dict(batch_size=next(b for b in (4, 3, 5, 6, 7) if per_rank % b), shuffle=False, augment=False, **SMALL)
    figures = {}
    for label_padding in (None, True):
        loaders = []
        for rank in (0, 1):
            monkeypatch.setenv("RANK", str(rank))
            monkeypatch.setenv("WORLD_SIZE", "2")
            loaders.append(KineticsDALILoader(dataset, "train", label_padding=label_padding, **kw))
        monkeypatch.delenv("RANK")
        monkeypatch.delenv("WORLD_SIZE")
        try:
            assert len(loaders[0]) == len(loaders[1])
            videos = loaders[0].index
            truth = sum(videos[i].label == 0 for i in range(len(videos))) / len(videos)
            counts = [sum(1 for _ in loader) for loader in loaders]
            assert counts == [len(loaders[0])] * 2  # the same batch count on each rank, none empty
            figures[label_padding] = (_lightning_mean(loaders), truth)
        finally:
            for loader in loaders:
                loader.close()
    (dropped, padding_dropped), truth = figures[None]
    (labelled, padding_labelled), _ = figures[True]
    assert padding_dropped == 0 and dropped == pytest.approx(truth, abs=1e-6)  # float32 batch means
    assert padding_labelled > 0 and labelled < truth  # padding rows, labelled -1, weigh in as wrong
