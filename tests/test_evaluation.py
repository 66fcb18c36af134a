"""daliload.evaluate: every validation video scored exactly once, on 1, 2 or 3 ranks, with the same figures."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from daliload.evaluation import EvaluationCountError, evaluate
from daliload.failures import DecodeFailureWarning
from daliload.loader import DecodeSpec, KineticsDALILoader
from daliload.plan import AugmentSpec, CropBox, OutputSpec, Sample
from daliload.prescreen import scan
from daliload.synth import SynthSpec, generate_dataset
from eval_model import ChannelMeans

WORKER = Path(__file__).parent / "ddp" / "eval_worker.py"
SPEC = SynthSpec(num_classes=7, clips_per_class=2, val_fraction=0.5, width=128, height=96, duration_s=2.1,
                 codec_mix={"h264": 0.5, "vp9": 0.5}, seed=3)


@pytest.fixture(scope="module")
def seven_root(tmp_path_factory) -> Path:
    """A dataset whose val split has 7 videos (one per class; no world size of 2 or 3 divides it)."""
    root = tmp_path_factory.mktemp("seven") / "kinetics"
    generate_dataset(root, SPEC, workers=2, progress=False)
    return root


@pytest.fixture(scope="module")
def seven(seven_root, tmp_path_factory) -> Path:
    """Its manifest."""
    manifest = tmp_path_factory.mktemp("seven_manifest") / "manifest.sqlite"
    return Path(scan(seven_root, manifest_path=manifest, device="cpu", workers=2, progress=False).manifest_path)


def make_loader(source, split="val", **kwargs) -> KineticsDALILoader:
    decode = DecodeSpec(fallback_workers=1, timeout_s=30.0, max_failure_fraction=kwargs.pop("max_failure_fraction",
                                                                                           0.05))
    return KineticsDALILoader(source, split, batch_size=kwargs.pop("batch_size", 2), clip_len=4, frame_stride=2,
                              augment=AugmentSpec(crop_size=(48, 64), crop_mode="center"),
                              output=OutputSpec(size=(48, 64), dtype="float32"), decode=decode, **kwargs)


def hand_count(model, loader) -> dict[str, torch.Tensor]:
    """Scores per video path, by iterating the loader as a user would."""
    scores = {}
    for (videos, _labels), batch in zip(loader, loader.plan()):
        probs = torch.softmax(model(videos).float(), dim=1)
        for row, sample in enumerate(batch):
            if not sample.is_padding:
                scores[sample.path] = probs[row]
    return scores


def test_every_video_once_and_the_figures_match_a_hand_count(seven):
    loader = make_loader(seven)
    model = ChannelMeans()
    result = evaluate(model, loader, topk=(1, 3))
    assert len(loader.videos) == 7 and result.num_videos == 7 and result.failed == ()
    expected = hand_count(model, loader)
    assert set(result.video_scores) == set(expected) == {str(v.path) for v in loader.videos}
    labels = {str(v.path): v.label for v in loader.videos}
    top = {p: torch.topk(s, 3).indices.tolist() for p, s in expected.items()}
    assert result.top1 == sum(top[p][0] == labels[p] for p in top) / 7
    assert result.topk[3] == sum(labels[p] in top[p] for p in top) / 7
    assert result.loss == pytest.approx(sum(-math.log(expected[p][labels[p]]) for p in top) / 7, rel=1e-5)
    for path, scores in expected.items():
        torch.testing.assert_close(result.video_scores[path], scores)
    per_class = [float(top[p][0] == labels[p]) for p in sorted(top, key=labels.get)]  # one video per class
    assert list(result.per_class_top1) == per_class
    assert result.mean_class_top1 == pytest.approx(sum(per_class) / 7)
    assert "7 videos x 1 view: top-1" in result.format()
    loader.close()


def test_a_loader_of_dict_batches_and_minus_100_padding_evaluates_the_same(seven):
    """batch_keys and padding_label=-100 (a Hugging Face setup) change nothing evaluate() counts."""
    model = ChannelMeans()
    expected = evaluate(model, make_loader(seven))
    hf = make_loader(seven, batch_keys=("pixel_values", "labels"), padding_label=-100)
    result = evaluate(model, hf)
    assert result.num_videos == expected.num_videos == 7 and result.topk == expected.topk
    hf.close()


def test_a_video_that_fails_at_run_time_is_listed_and_not_counted(seven_root, tmp_path):
    root = tmp_path / "copy"
    shutil.copytree(seven_root, root)
    loader = make_loader(root, max_failure_fraction=0.5)
    gone = sorted(str(v.path) for v in loader.videos)[3]
    os.remove(gone)  # after the scan: only decoding finds out
    with pytest.warns(DecodeFailureWarning, match=r"1 of 7 videos failed to decode and were masked \(label -1\)"):
        result = evaluate(ChannelMeans(), loader)
    assert result.failed == (gone,) and result.num_videos == 6 and gone not in result.video_scores
    loader.close()


def test_a_pass_that_misses_videos_is_refused_naming_them(seven):
    loader = make_loader(seven, last_batch="drop")  # 7 videos in batches of 2: the last one is dropped
    last = str(loader.plan()[-1][-1].path)
    dropped = [str(v.path) for v in loader.videos if str(v.path) != last and str(v.path) not in
               {str(s.path) for b in loader.plan() for s in b}]
    with pytest.raises(EvaluationCountError, match=r"1 never seen \(" + dropped[0]):
        evaluate(ChannelMeans(), loader)
    loader.close()


def test_bad_arguments_are_refused(seven):
    train = make_loader(seven, split="train")
    with pytest.raises(ValueError, match="needs an evaluation split"):
        evaluate(ChannelMeans(), train)
    train.close()
    loader = make_loader(seven)
    for kwargs, message in [({"reduce": "median"}, "reduce must be"), ({"views_per_forward": 0}, "views_per_forward"),
                            ({"topk": (0,)}, "topk must be")]:
        with pytest.raises(ValueError, match=message):
            evaluate(ChannelMeans(), loader, **kwargs)
    resumed = make_loader(seven)
    resumed.load_state_dict({**loader.state_dict(), "next_batch": 1})  # a pass resumed midway misses videos
    with pytest.raises(ValueError, match="resume at batch 1 of 4: evaluate with a loader that was not given"):
        evaluate(ChannelMeans(), resumed)
    resumed.close()
    loader.close()


def test_evaluate_after_a_pass_left_early_counts_every_video(seven):
    """As with a DataLoader, a new pass starts at the first batch: a peek or a break costs nothing."""
    loader = make_loader(seven)
    next(iter(loader))
    for _ in loader:
        break
    loader.set_epoch(0)
    assert evaluate(ChannelMeans(), loader).num_videos == 7
    assert evaluate(ChannelMeans(), loader).num_videos == 7
    loader.close()


class MultiViewLoader:
    """Stands in for a multi-view loader: 2 videos x 3 views, each view's clip a known constant."""

    split = "val"

    def __init__(self) -> None:
        box = CropBox.full()
        self.videos = [Sample(i, i, f"/v{i}.mp4", i, 0, 1, 4, box) for i in range(2)]
        self.classes = ("a", "b", "c", "d", "e", "f", "g")
        self.views = torch.arange(6, dtype=torch.float32).reshape(2, 3)  # the value of each view's pixels

    def plan(self):
        return [[self.videos[v // 3] for v in range(6)]]  # one batch: each video's 3 views in a row

    def state_dict(self):
        return {"next_batch": 0}

    def __len__(self):
        return 1

    def __iter__(self):
        videos = self.views[:, :, None, None, None, None].expand(2, 3, 3, 4, 2, 2).clone()
        yield videos, torch.tensor([0, 1])


def test_views_are_scored_per_video_with_the_mean_or_max_of_their_softmax(seven):
    model = ChannelMeans()
    mean = evaluate(model, MultiViewLoader(), views_per_forward=4)
    assert model.calls == [4, 2]  # 6 views, at most 4 per forward
    assert mean.num_videos == 2 and mean.views == 3
    clips = MultiViewLoader().views[:, :, None, None, None, None].expand(2, 3, 3, 4, 2, 2).reshape(6, 3, 4, 2, 2)
    probs = torch.softmax(ChannelMeans()(clips), dim=1).reshape(2, 3, -1)
    torch.testing.assert_close(mean.video_scores["/v1.mp4"], probs[1].mean(dim=0))
    largest = evaluate(ChannelMeans(), MultiViewLoader(), reduce="max")
    torch.testing.assert_close(largest.video_scores["/v0.mp4"], probs[0].amax(dim=0))


class LinearOnMeans(torch.nn.Module):
    """A real layer on each clip's per-channel, per-frame means; floating-point clips are used as they come.

    ``Linear`` refuses a float16 input with a float32 weight (``mat1 and mat2
    must have the same dtype``): the model sees the dtype ``evaluate`` hands it.
    It scales uint8 clips itself, as a model fed uint8 would.
    """

    def __init__(self, frames: int = 4, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3 * frames, 7, dtype=dtype)
        with torch.no_grad():
            self.linear.weight.copy_(torch.randn(7, 3 * frames, generator=torch.Generator().manual_seed(5)))
        self.dtypes: list[torch.dtype] = []

    def forward(self, clips: torch.Tensor) -> torch.Tensor:
        self.dtypes.append(clips.dtype)
        if not clips.is_floating_point():
            clips = clips.to(self.linear.weight.dtype) / 255
        return self.linear(clips.mean(dim=(3, 4)).flatten(1))


def test_float16_batches_feed_a_float32_model(seven):
    """float16 output (an option; float32 is the default): a float32 model gets float32 clips, same scores."""
    loader = KineticsDALILoader(seven, "val", batch_size=2, clip_len=4, frame_stride=2,
                                augment=AugmentSpec(crop_size=(48, 64), crop_mode="center"),
                                output=OutputSpec(dtype="float16"),  # its size follows the crop
                                decode=DecodeSpec(fallback_workers=1, timeout_s=30.0))
    videos, _ = next(iter(loader))
    assert videos.dtype == torch.float16
    model = LinearOnMeans()
    with pytest.raises(RuntimeError, match="must have the same dtype"):
        model(videos)  # what evaluate() met before it cast
    model.dtypes.clear()
    result = evaluate(model, loader)
    assert result.num_videos == 7 and set(model.dtypes) == {torch.float32}
    reference = make_loader(seven)  # float32 clips of the same plan: the cast changes nothing that counts
    expected = evaluate(model, reference)
    assert result.topk == expected.topk
    for path, scores in expected.video_scores.items():
        torch.testing.assert_close(result.video_scores[path], scores, atol=2e-3, rtol=0)
    # The other way round: float32 clips into a bfloat16 model become bfloat16.
    bf16 = LinearOnMeans(dtype=torch.bfloat16)
    assert evaluate(bf16, reference).num_videos == 7 and set(bf16.dtypes) == {torch.bfloat16}
    loader.close()
    reference.close()


def test_uint8_clips_and_a_model_without_parameters_are_passed_as_they_are():
    class Uint8Views(MultiViewLoader):
        def __iter__(self):
            for videos, labels in super().__iter__():
                yield videos.to(torch.uint8), labels

    model = LinearOnMeans(frames=4)
    evaluate(model, Uint8Views())
    assert set(model.dtypes) == {torch.uint8}  # the model decides how to scale 0..255 pixels

    seen: list[torch.dtype] = []

    class NoParameters(torch.nn.Module):
        def forward(self, clips):
            seen.append(clips.dtype)
            return clips.float().mean(dim=(1, 3, 4))[:, :1].expand(-1, 7) * torch.arange(7.0)

    evaluate(NoParameters(), MultiViewLoader())
    assert set(seen) == {torch.float32}


def test_a_progress_bar_on_rank_0_only_and_only_when_asked_or_on_a_terminal(monkeypatch, capsys):
    evaluate(ChannelMeans(), MultiViewLoader(), progress=True)
    err = capsys.readouterr().err
    assert "evaluate val:" in err and "0/1" in err
    evaluate(ChannelMeans(), MultiViewLoader(), progress=False)
    assert capsys.readouterr().err == ""
    evaluate(ChannelMeans(), MultiViewLoader())  # default: stderr is captured here, not a terminal
    assert capsys.readouterr().err == ""

    class Terminal:
        def __init__(self):
            self.text = []

        def isatty(self):
            return True

        def write(self, text):
            self.text.append(text)

        def flush(self):
            pass

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    evaluate(ChannelMeans(), MultiViewLoader())
    assert "evaluate val:" in "".join(terminal.text)
    monkeypatch.setenv("RANK", "1")  # another rank (no process group: daliload.runtime reads torchrun's variables)
    terminal.text.clear()
    evaluate(ChannelMeans(), MultiViewLoader(), progress=True)
    assert terminal.text == []
    monkeypatch.undo()
    with pytest.raises(ValueError, match="progress must be True, False or None"):
        evaluate(ChannelMeans(), MultiViewLoader(), progress="yes")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_one_two_and_three_ranks_give_the_same_figures(seven, tmp_path):
    """7 videos: 2 and 3 ranks need padding; each world size counts 7 videos, with identical top-k."""
    procs = {}
    for world in (1, 2, 3):
        out = tmp_path / f"w{world}"
        out.mkdir()
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc_per_node={world}",
               f"--master_port={free_port()}", str(WORKER), str(seven), str(out)]
        procs[world] = (subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
                        out)
    results = {}
    for world, (proc, out) in procs.items():
        output, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, output[-4000:]
        ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]
        assert all(r["num_videos"] == 7 and r["failed"] == [] for r in ranks)
        assert all(r["topk"] == ranks[0]["topk"] and r["per_class_top1"] == ranks[0]["per_class_top1"]
                   for r in ranks)  # every rank returns the same result
        assert all(r["scores"] is None for r in ranks[1:]) and len(ranks[0]["scores"]) == 7
        bars = [(out / f"rank{r}.stderr").read_text() for r in range(world)]
        assert "evaluate val:" in bars[0] and not any("evaluate" in bar for bar in bars[1:]), bars
        results[world] = ranks[0]
    assert results[1]["topk"] == results[2]["topk"] == results[3]["topk"]
    for world in (2, 3):
        assert results[world]["loss"] == pytest.approx(results[1]["loss"], rel=1e-6)
        for path, scores in results[1]["scores"].items():
            assert results[world]["scores"][path] == pytest.approx(scores, rel=1e-5)


def readme_python_block(heading: str) -> str:
    """The first ```python block after ``heading`` in docs/evaluation.md."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "evaluation.md").read_text()
    section = text.split(heading, 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_readme_evaluation_loop_runs_as_written_under_torchrun(seven, tmp_path):
    """The docs' torchrun block, as a user saves it: only the dataset path and the model are theirs."""
    code = readme_python_block("# Evaluating")
    for mine, theirs in (('ROOT = "/data/kinetics700"', f"ROOT = {str(seven)!r}"),
                         ("model = load_my_model()", "model = ChannelMeans(frames=16)")):
        assert mine in code
        code = code.replace(mine, theirs)
    script = tmp_path / "eval.py"
    script.write_text(f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
                      f"from eval_model import ChannelMeans\n" + code)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
           f"--master_port={free_port()}", str(script)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("7 videos x 30 views: top-1 ") == 1, proc.stdout  # rank 0 prints, once
