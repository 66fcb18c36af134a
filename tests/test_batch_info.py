"""``with_info=True``: each row's video, clip, padding and replacement, from the plan, on both routes;
the docs' per-video top-1/top-5 recipe run as written; the documented bytes per batch of each dtype."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch

from daliload import BatchInfo, DecodeSpec, KineticsDALILoader, evaluate
from daliload.plan import OUTPUT_DTYPES, AugmentSpec, OutputSpec

DOC = Path(__file__).resolve().parents[1] / "docs" / "training-loops.md"
SMALL = dict(clip_len=4, frame_stride=2, augment=AugmentSpec(crop_size=(48, 64), crop_mode="center"), device="cpu",
             decode=DecodeSpec(fallback_workers=1, timeout_s=30.0))


@pytest.fixture(scope="module")
def dataset(small_kinetics) -> Path:
    return small_kinetics


def test_without_info_the_batch_is_videos_and_labels_and_a_bad_value_is_refused(dataset):
    loader = KineticsDALILoader(dataset, "train", batch_size=4, **SMALL)
    batch = next(iter(loader))
    assert len(batch) == 2
    loader.close()
    with pytest.raises(TypeError, match=r"with_info must be True or False, got 1"):
        KineticsDALILoader(dataset, "train", batch_size=4, with_info=1, **SMALL)


@pytest.mark.parametrize("k", [1, 2])
def test_each_training_row_names_its_video_and_clip_as_the_plan_has_them(dataset, k):
    loader = KineticsDALILoader(dataset, "train", batch_size=4, clips_per_video=k, with_info=True, **SMALL)
    try:
        plan = loader.plan()
        got = list(loader)
        assert len(got) == len(plan)
        for (_, labels, info), batch in zip(got, plan):
            assert isinstance(info, BatchInfo) and info.video_index.dtype == torch.int64
            assert info.video_index.tolist() == [s.video_index for s in batch]
            assert info.clip.tolist() == [s.view for s in batch]
            assert info.is_padding.tolist() == [s.is_padding for s in batch]
            assert not info.replaced.any() and info.mask.all()
            assert [loader.videos[i].path for i in info.video_index.tolist()] == [s.path for s in batch]
            assert labels.tolist() == [int(loader.videos.label[i]) for i in info.video_index.tolist()]
        stats = loader.stats()
        assert stats.clips_dali > 0 and stats.clips_fallback > 0  # both routes
        if k == 2:
            assert {c for _, _, info in got for c in info.clip.tolist()} == {0, 1}
    finally:
        loader.close()


def test_evaluation_rows_mark_padding_and_views_keep_one_row_per_video(dataset):
    loader = KineticsDALILoader(dataset, "val", batch_size=3, with_info=True, label_padding=True, **SMALL)
    try:
        for (_, labels, info), batch in zip(loader, loader.plan()):
            assert info.is_padding.tolist() == [s.is_padding for s in batch]
            assert info.mask.tolist() == [not s.is_padding for s in batch] == (labels != -1).tolist()
        assert any(s.is_padding for b in loader.plan() for s in b)
    finally:
        loader.close()
    views = KineticsDALILoader(dataset, "val", batch_size=2, views=(2, 3), with_info=True, **SMALL)
    try:
        videos, labels, info = next(iter(views))
        first = views.plan()[0]
        assert videos.shape[:2] == (2, 6) and info.clip.shape == (2, 6)
        assert info.clip.tolist() == [list(range(6))] * 2
        assert info.video_index.tolist() == [first[0].video_index, first[6].video_index]
    finally:
        views.close()


def test_a_replaced_row_names_the_video_whose_clip_fills_it(dataset, tmp_path):
    root = tmp_path / "copy"
    shutil.copytree(dataset, root, ignore=shutil.ignore_patterns(".daliload"))
    loader = KineticsDALILoader(root, "train", batch_size=4, with_info=True, **dict(
        SMALL, decode=DecodeSpec(fallback_workers=1, timeout_s=30.0, max_failure_fraction=0.5)))
    try:
        victim = loader.plan()[0][1]
        Path(victim.path).write_bytes(b"not a video" * 100)  # broken after the scan: fails at run time
        videos, labels, info = next(iter(loader))
        assert info.replaced.tolist() == [False, True, False, False]
        assert int(info.video_index[1]) != victim.video_index  # the replacement's video
        assert labels.tolist() == [int(loader.videos.label[i]) for i in info.video_index.tolist()]
        assert info.mask.all()  # training: the replacement is a real sample
    finally:
        loader.close()


class MeanModel(torch.nn.Module):
    """Scores from the clip's mean colour: deterministic, any clip shape."""

    def __init__(self, classes: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(3, classes)

    def forward(self, clips: torch.Tensor) -> torch.Tensor:
        return self.linear(clips.float().mean(dim=(2, 3, 4)))


def test_the_docs_per_video_recipe_runs_as_written_and_agrees_with_evaluate(dataset):
    text = DOC.read_text()
    code = text.split("## Video-level top-1 and top-5", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    # Small clips on the CPU, and top-3 for top-5: this split has 4 classes.
    code = code.replace("crop_size=224,", "crop_size=(48, 64), device='cpu',").replace("clip_len=16", "clip_len=4")
    assert code.count("topk(5,") == 1
    code = code.replace("topk(5,", "topk(3,")
    namespace = {"KineticsDALILoader": KineticsDALILoader, "ROOT": str(dataset), "model": MeanModel(4)}
    exec(compile(code, str(DOC), "exec"), namespace)  # noqa: S102 - the documented recipe, as a user pastes it
    loader = namespace["loader"]
    try:
        assert int(namespace["seen"].sum()) == len(loader.videos)  # every val video once
        result = evaluate(namespace["model"], loader, topk=(1, 3))
        assert namespace["top1_accuracy"] == pytest.approx(result.top1)
        assert namespace["top5_accuracy"] == pytest.approx(result.topk[3])
        assert 0 < namespace["top5_accuracy"] and result.topk[3] < 1  # a check with something to tell apart
    finally:
        loader.close()


def test_the_documented_bytes_per_batch_are_those_of_real_batches(dataset):
    table = text_between(DOC.read_text(), "dtypes")
    shape = (32, 3, 16, 224, 224)
    for dtype in OUTPUT_DTYPES:
        output = OutputSpec(dtype=dtype) if dtype != "uint8" else OutputSpec(dtype=dtype, mean=(0, 0, 0),
                                                                             std=(1, 1, 1))
        loader = KineticsDALILoader(dataset, "train", batch_size=2, output=output, **SMALL)
        videos, _ = next(iter(loader))
        loader.close()
        assert videos.nbytes == videos.numel() * videos.element_size()
        per_batch = torch.Size(shape).numel() * videos.element_size()  # the same element, the README's batch
        row = next(line for line in table.splitlines() if line.startswith(f'| `"{dtype}"`'))
        assert f"| {videos.element_size()} | {per_batch:,} ({per_batch / 2**20:.1f} MiB) |" in row, row


def text_between(text: str, marker: str) -> str:
    match = re.search(rf"<!-- {marker}:begin.*?-->\n(.*?)<!-- {marker}:end -->", text, re.S)
    assert match, marker
    return match.group(1)
