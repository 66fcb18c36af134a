"""The DDP training example, ``daliload demo`` and ``daliload preview`` on generated data.

The generated dataset has four classes whose motions differ (``still``,
``bounce vertical``, ``sway horizontal``, ``zoom pulse``), half H.264 (the
PyAV fallback on a CPU) and half VP9 (DALI on a CPU), so every batch mixes
rows from both decoders, which is where clips and labels could come apart.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from daliload import AugmentSpec, KineticsDALILoader, Manifest
from daliload.cli import main as cli_main
from daliload.examples import train_ddp
from daliload.framecode import read_code
from daliload.commands.preview import CAPTION_HEIGHT, LABEL_HEIGHT, PAD, denormalize, preview, render_contact_sheet
from daliload.synth.dataset import generate_dataset
from daliload.synth.spec import SynthSpec

REPO = Path(__file__).resolve().parents[1]
# Clips sample every 4th frame: the generator's background grain repeats every
# 4 frames, so clips of the "still" class have no frame-to-frame change at all.
CLIP = ["--clip-len", "8", "--frame-stride", "4", "--crop-size", "64", "--short-side", "64", "80"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("train_demo") / "data"
    spec = SynthSpec(num_classes=4, clips_per_class=20, val_fraction=0.25, width=128, height=96,
                     duration_s=2.0, codec_mix={"h264": 0.5, "vp9": 0.5}, broken_fraction=0.04,
                     seed=7)
    generate_dataset(root, spec, workers=2, progress=False)
    return root


def _motion(videos: torch.Tensor) -> torch.Tensor:
    """Per clip: the largest mean absolute change from the first frame (normalised units).

    The top fifth of each frame is left out: it holds the frame-index code,
    which changes every frame.
    """
    x = videos.float()[:, :, :, videos.shape[3] // 5:, :]
    return (x - x[:, :, :1]).abs().mean(dim=(1, 3, 4)).amax(dim=1)


def test_batches_keep_each_clip_with_its_label(dataset):
    """Labels must travel with their clips through the DALI/fallback merge.

    The pixels themselves say whether a clip is of the "still" class: it has
    no motion, every other class moves. Every clip of a training epoch (random
    crops, flips, both decoders) must agree with its label.
    """
    loader = KineticsDALILoader(dataset, "train", batch_size=8, clip_len=8, frame_stride=4, seed=3,
                                augment=AugmentSpec(crop_size=64, short_side_range=(64, 80)))
    still = loader.classes.index("still")
    motions, is_still = [], []
    for videos, labels in loader:
        motions.append(_motion(videos))
        is_still.append(labels == still)
    stats = loader.stats()
    loader.close()
    motion, is_still = torch.cat(motions), torch.cat(is_still)
    assert stats.clips_dali > 0 and stats.clips_fallback > 0  # both decoders fed these batches
    assert is_still.sum() >= 10 and (~is_still).sum() >= 30
    assert motion[is_still].max() < 0.05, motion[is_still]
    assert motion[~is_still].min() > 0.1, motion[~is_still]


def _torchrun(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         str(REPO / "examples" / "train_ddp.py"), *args],
        capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)


def test_torchrun_two_ranks_learns_and_resumes(dataset, tmp_path):
    """Two gloo ranks: a job stopped by its time budget after one epoch, then one that resumes.

    The resumed job must learn: 0.74 val top-1 on this machine, chance is 0.25.
    """
    out = tmp_path / "run"
    # In-process fallback decoding (no worker processes) keeps this test short on 2 cores.
    common = [str(dataset), "--out", str(out), "--device", "cpu", "--epochs", "7",
              "--batch-size", "4", "--lr", "0.05", "--fallback-workers", "0", "--dali-threads", "1",
              "--log-every", "1000", *CLIP]
    # A budget no epoch fits in: the job stops after its first epoch, as a job out of time would.
    first = _torchrun([*common, "--max-minutes", "0.0001"], timeout=200)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "stopping after epoch 0 (1 of 7 epochs): another epoch would overrun --max-minutes 0.0001" \
        in first.stdout
    assert json.loads((out / "metrics.json").read_text())["stopped_early"] == {
        "after_epoch": 0, "epochs_run": 1, "epochs_planned": 7,
        "reason": "another epoch would overrun --max-minutes 0.0001"}
    checkpoint = torch.load(out / "checkpoint.pt", weights_only=False)
    assert checkpoint["epoch"] == 0 and len(checkpoint["loader"]) == 2
    # Each rank's loader finished epoch 0: its state is the epoch the next pass draws, from its first batch.
    assert [(s["epoch"], s["next_batch"]) for s in checkpoint["loader"]] == [(1, 0), (1, 0)]
    first_history = json.loads((out / "metrics.json").read_text())["history"]

    second = _torchrun([*common, "--resume"], timeout=400)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert f"resumed from {out / 'checkpoint.pt'} after epoch 0" in second.stdout
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and "stopped_early" not in metrics
    history = metrics["history"]
    assert [r["epoch"] for r in history] == list(range(7))
    assert history[:1] == first_history  # epoch 0 comes back from the checkpoint, untouched
    # The LR schedule went on where it stopped: warm-up (1 epoch) done, then the cosine over
    # epochs 1..6. A fresh schedule would restart the warm-up at 0.05 / steps_per_epoch.
    steps = checkpoint["scheduler"]["last_epoch"]  # steps per epoch
    assert history[1]["lr"] == pytest.approx(0.05)
    assert history[2]["lr"] == pytest.approx(0.05 * 0.5 * (1 + np.cos(np.pi * steps / (6 * steps))))
    # Four balanced classes: chance is 0.25, and clips parted from their labels cannot beat it.
    assert history[-1]["val_clips"] == _usable_videos(dataset, "val")  # each once, padding left out
    assert history[-1]["val_top1"] >= 0.6, history
    assert history[-1]["clips_dali"] > 0 and history[-1]["clips_fallback"] > 0
    assert torch.load(out / "checkpoint.pt", weights_only=False)["epoch"] == 6
    # The final multi-view evaluation (--views 3 3 by default): every usable video once, across both ranks.
    multiview = metrics["multiview"]
    assert multiview["views"] == [3, 3] and multiview["videos"] == _usable_videos(dataset, "val")
    assert multiview["top1"] >= 0.5, multiview
    assert "multi-view evaluation (3 x 3 views per video): " in second.stdout


def _usable_videos(root: Path, split: str) -> int:
    from daliload.prescreen import default_manifest_path

    with Manifest(default_manifest_path(root)) as manifest:
        entries = manifest.entries(split, device="gpu" if torch.cuda.is_available() else "cpu")
    return sum(1 for e in entries if e.route != "bad")


def test_checkpoint_survives_a_crash_during_save(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.pt"
    train_ddp.save_checkpoint(path, {"epoch": 1, "weights": torch.arange(5)})

    def torn_save(obj, f):
        f.write(b"PK\x03\x04 the first bytes of a checkpoint")
        raise OSError("No space left on device")

    monkeypatch.setattr(train_ddp.torch, "save", torn_save)
    with pytest.raises(OSError, match="No space left"):
        train_ddp.save_checkpoint(path, {"epoch": 2, "weights": torch.arange(7)})
    kept = torch.load(path, weights_only=False)
    assert kept["epoch"] == 1 and kept["weights"].tolist() == [0, 1, 2, 3, 4]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]  # no temporary file left


def test_checkpoint_survives_a_kill_during_save(tmp_path):
    """A process killed (SIGKILL: no clean-up at all) half way through a save keeps the old one."""
    path = tmp_path / "checkpoint.pt"
    train_ddp.save_checkpoint(path, {"epoch": 1})
    code = textwrap.dedent(f"""
        import os, signal, torch
        from daliload.examples import train_ddp
        def dying_save(obj, f):
            f.write(b"half a checkpoint")
            f.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        torch.save = dying_save
        train_ddp.save_checkpoint({str(path)!r}, {{"epoch": 2}})
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    assert result.returncode == -9
    assert torch.load(path, weights_only=False) == {"epoch": 1}
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "checkpoint.pt"]
    # The torn temporary file stays (nothing ran to remove it), under a name never loaded.
    assert len(leftovers) == 1 and leftovers[0].startswith(".checkpoint.pt.")


def test_resume_errors_name_the_problem(dataset, tmp_path, capsys):
    args = [str(dataset), "--out", str(tmp_path), "--device", "cpu", "--fallback-workers", "0",
            "--epochs", "2", *CLIP]
    missing = tmp_path / "nope.pt"
    with pytest.raises(FileNotFoundError, match=f"no checkpoint at {missing}"):
        train_ddp.main([*args, "--resume", str(missing)])
    two_ranks = tmp_path / "two_ranks.pt"
    train_ddp.save_checkpoint(two_ranks, {"loader": [{}, {}]})
    with pytest.raises(ValueError, match="written by a job of 2 ranks, this one has 1: resume"):
        train_ddp.main([*args, "--resume", str(two_ranks)])
    # --resume without a value and no checkpoint yet starts from scratch; with one at the
    # last epoch there is nothing left to train.
    finished = tmp_path / "finished"
    train_ddp.main([*args, "--out", str(finished), "--resume", "--epochs", "1", "--no-val"])
    metrics = train_ddp.main([*args, "--out", str(finished), "--resume", "--epochs", "1"])
    assert [r["epoch"] for r in metrics["history"]] == [0] and metrics["loader_stats"] == []
    assert "nothing to do: the checkpoint is at epoch 0 of --epochs 1" in capsys.readouterr().out


def test_bad_inputs_give_clear_errors(tmp_path, capsys, monkeypatch):
    with pytest.raises(FileNotFoundError, match="root or manifest not found: .*no_such_root"):
        train_ddp.main([str(tmp_path / "no_such_root"), "--out", str(tmp_path / "out"),
                        "--device", "cpu"])
    with pytest.raises(SystemExit):
        train_ddp.parse_args(["root", "--model", "resnet50"])
    assert "invalid choice: 'resnet50'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train_ddp.parse_args(["root", "--batch-size", "0"])
    assert "--batch-size must be >= 1, got 0" in capsys.readouterr().err
    with pytest.raises(ValueError,
                       match="unknown model 'resnet50'; choose from small3d, r3d_18, r2plus1d_18"):
        train_ddp.build_model("resnet50", 4)
    monkeypatch.setitem(sys.modules, "torchvision", None)  # as on a machine without torchvision
    with pytest.raises(ImportError,
                       match="--model r3d_18 needs torchvision, which is not installed"):
        train_ddp.build_model("r3d_18", 4)

    assert cli_main(["preview", str(tmp_path / "no_such_root"),
                     "--out", str(tmp_path / "s.png")]) == 2
    assert "dataset root or manifest not found" in capsys.readouterr().err
    assert cli_main(["demo", "--out", str(tmp_path / "demo"), "--model", "resnet50"]) == 2
    assert "unknown model 'resnet50'" in capsys.readouterr().err
    assert not (tmp_path / "demo").exists()  # refused before generating anything


def test_small_model_shapes():
    model = train_ddp.build_model("small3d", num_classes=5).eval()
    assert 100_000 < sum(p.numel() for p in model.parameters()) < 500_000
    for shape in [(2, 3, 8, 64, 64), (2, 3, 16, 112, 112), (1, 3, 2, 16, 16)]:
        assert model(torch.zeros(shape)).shape == (shape[0], 5)
    with pytest.raises(ValueError, match="small3d needs clips of at least 2 frames, got 1"):
        model(torch.zeros(1, 3, 1, 16, 16))
    # It sees motion only: a clip that does not change gives the same output whatever it shows.
    still_a = torch.zeros(1, 3, 4, 32, 32)
    still_b = torch.rand(1, 3, 1, 32, 32).expand(1, 3, 4, 32, 32)
    torch.testing.assert_close(model(still_a), model(still_b))


def test_cosine_schedule_with_warmup():
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.4)
    scheduler = train_ddp.cosine_with_warmup(optimizer, total_steps=10, warmup_steps=2)
    lrs = []
    for _ in range(10):
        lrs.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    assert lrs[:3] == pytest.approx([0.2, 0.4, 0.4])
    assert lrs[2:] == sorted(lrs[2:], reverse=True)
    assert lrs[-1] == pytest.approx(0.4 * 0.5 * (1 + np.cos(np.pi * 7 / 8)))


def test_contact_sheet_pixels_are_the_clip_pixels(tmp_path):
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, size=(3, 8, 40, 48, 3), dtype=np.uint8)
    sheet = render_contact_sheet(frames, [2, 0, 1], ["a", "b", "c"], tmp_path / "sheet.png",
                                 frames_per_clip=3)
    assert sheet.frame_indices == (0, 4, 7)  # first, middle, last (rounded)
    assert sheet.scale == 2  # 48 px frames are doubled to reach the 96 px minimum tile side
    assert sheet.width == PAD + 3 * (96 + PAD)
    assert sheet.height == PAD + 3 * (LABEL_HEIGHT + 80 + PAD)
    image = _read_png(sheet.path)
    assert image.shape == (sheet.height, sheet.width, 3)
    for row in range(3):
        for column, t in enumerate(sheet.frame_indices):
            top, left, h, w = sheet.tile_box(row, column)
            expected = frames[row, t].repeat(2, axis=0).repeat(2, axis=1)
            np.testing.assert_array_equal(image[top:top + h, left:left + w], expected)
    assert sheet.titles == ("2: c  (clip 0)", "0: a  (clip 1)", "1: b  (clip 2)")
    with pytest.raises(ValueError, match="frames must be between 1 and the clip length 8, got 9"):
        render_contact_sheet(frames, [0, 0, 0], ["a"], tmp_path / "x.png", frames_per_clip=9)
    with pytest.raises(ValueError, match="label 2 is outside the 1 classes"):
        render_contact_sheet(frames, [0, 2, 0], ["a"], tmp_path / "x.png")
    with pytest.raises(ValueError, match="got 2 detail lines for 3 clips"):
        render_contact_sheet(frames, [0, 0, 0], ["a"], tmp_path / "x.png", details=["a.mp4", "b.mp4"])
    with pytest.raises(ValueError, match="source_frames must give 8 frame numbers for each of the 3 clips"):
        render_contact_sheet(frames, [0, 0, 0], ["a"], tmp_path / "x.png", source_frames=[range(8)] * 2 + [[1]])


def test_denormalize_inverts_the_loader_normalisation():
    mean, std = (110.0, 100.0, 96.0), (58.0, 56.0, 55.0)
    pixels = np.arange(2 * 3 * 2 * 2 * 2, dtype=np.float64).reshape(2, 3, 2, 2, 2) * 5  # N C T H W
    normalised = (pixels - np.reshape(mean, (1, 3, 1, 1, 1))) / np.reshape(std, (1, 3, 1, 1, 1))
    back = denormalize(torch.from_numpy(normalised).half(), mean, std)
    assert back.shape == (2, 2, 2, 2, 3)
    np.testing.assert_allclose(back, pixels.transpose(0, 2, 3, 4, 1), atol=1)


def test_preview_shows_the_planned_frames_of_each_clip(dataset, tmp_path):
    """Each tile of a val-split sheet carries the frame code of the frame the plan chose for it."""
    crop = (96, 128)  # the whole frame, so the frame-index code stays readable
    out = tmp_path / "sheet.png"
    sheet = preview(dataset, out, split="val", clips=5, frames_per_clip=4, clip_len=8,
                    frame_stride=4, crop_size=crop, seed=0)
    assert sheet.width == PAD + 4 * (128 + PAD)
    # A note on top; per row two lines of title (label; file and decoder), the tiles, their frame numbers.
    assert sheet.title_height == 2 * LABEL_HEIGHT and sheet.caption_height == CAPTION_HEIGHT
    assert sheet.height == sheet.header_height + PAD + 5 * (2 * LABEL_HEIGHT + 96 + CAPTION_HEIGHT + PAD)
    assert "The black-and-white strip across the top of each frame is not a decoding error" in sheet.note
    assert "daliload synth paints every generated frame's number into it" in sheet.note
    image = _read_png(out)
    assert image.shape == (sheet.height, sheet.width, 3)

    loader = KineticsDALILoader(dataset, "val", batch_size=5, clip_len=8, frame_stride=4,
                                crop_size=crop)
    samples = loader.plan()[0]
    num_frames = {v.path: v.num_frames for v in loader.videos}
    routes = {v.path: v.route for v in loader.videos}
    assert sheet.labels == tuple(s.label for s in samples)
    for row, sample in enumerate(samples):
        planned = sample.frame_indices(num_frames[sample.path])
        assert sheet.titles[row] == f"clip {row}: label {sample.label} ({loader.classes[sample.label]})"
        decoder = "DALI on the CPU" if routes[sample.path] == "dali" else "the PyAV fallback"
        assert sheet.details[row] == f"{os.path.relpath(sample.path, dataset)}, decoded by {decoder}"
        assert sheet.source_frames[row] == tuple(planned)
        for column, t in enumerate(sheet.frame_indices):
            top, left, h, w = sheet.tile_box(row, column)
            assert read_code(image[top:top + h, left:left + w]).index == planned[t]
    assert {routes[s.path] for s in samples} == {"dali", "fallback"}  # both decoders are named


def test_a_sheet_of_a_dataset_not_made_by_synth_does_not_explain_a_strip_it_lacks(dataset, tmp_path):
    from daliload.prescreen import scan

    manifest = scan(dataset, manifest_path=tmp_path / "manifest.sqlite", device="cpu", workers=2,
                    progress=False).manifest_path
    sheet = preview(manifest, tmp_path / "sheet.png", split="val", clips=2, frames_per_clip=2, clip_len=4,
                    crop_size=(96, 128))
    assert sheet.note.startswith("Each row is one clip of the first val batch as the model receives it (its "
                                 "centre crop;") and "strip" not in sheet.note
    assert all(os.path.isabs(d.split(", decoded by ")[0]) for d in sheet.details)  # no root to be relative to


def test_preview_command_writes_the_png(dataset, tmp_path, capsys):
    out = tmp_path / "cli.png"
    assert cli_main(["preview", str(dataset), "--out", str(out), "--clips", "3", "--frames", "2",
                     "--clip-len", "4", "--crop-size", "48", "--short-side", "56", "64"]) == 0
    height, width, _ = _read_png(out).shape
    assert width == PAD + 2 * (96 + PAD)
    assert f"wrote {out} ({width}x{height} px)" in capsys.readouterr().out


def test_demo_end_to_end_in_miniature(tmp_path):
    """The demo's four steps on a tiny dataset and one epoch: report files, numbers and reasons."""
    from daliload.commands.demo import DemoConfig, run_demo
    from daliload.options import DecodeSpec

    lines: list[str] = []
    config = DemoConfig(out=str(tmp_path / "demo"), num_classes=3, clips_per_class=8, width=128,
                        height=96, duration_s=1.5, broken_fraction=0.1, epochs=1, batch_size=8,
                        clip_len=4, frame_stride=4, crop_size=48, short_side=(56, 64), dali_threads=1)
    result = run_demo(config, echo=lines.append)
    report = tmp_path / "demo" / "report"
    assert _read_png(report / "contact_sheet.png").shape[1] == PAD + 4 * (96 + PAD)
    assert _read_png(report / "training_curve.png").shape == (400, 700, 3)
    metrics = json.loads((report / "metrics.json").read_text())
    from daliload.commands._demo_machine import package_commit

    import daliload

    assert metrics["machine"]["package"] == {"version": daliload.__version__, "commit": package_commit()}
    assert package_commit() is None or package_commit().split()[0] in subprocess.run(
        ["git", "-C", str(Path(daliload.__file__).parents[1]), "rev-parse", "HEAD"], capture_output=True,
        text=True).stdout  # the checkout's own commit (CI runs in a clone: not None there)
    training = metrics["training"]
    assert training["epochs_run"] == training["epochs_planned"] == result.epochs == 1
    assert training["stopped_early"] is None and result.stopped_early is None
    assert training["fallback_workers"] == DecodeSpec().fallback_workers > 0  # the mode users get
    assert result.chance == pytest.approx(training["chance"])
    assert 0.3 <= result.chance <= 0.5
    bad = {Path(b["path"]).name: b["reason"] for b in metrics["scan"]["bad_files"]}
    broken = {Path(c["path"]).name: c["broken"] for c in _synth_rows(tmp_path / "demo" / "data")}
    assert bad and all(name in broken for name in bad)  # only files broken on purpose are rejected
    assert all(reason for reason in bad.values())
    loader = metrics["loader"]
    assert loader["clips_dali"] > 0 and loader["clips_fallback"] > 0
    assert loader["dali_share"] == pytest.approx(result.dali_share)
    text = "\n".join(lines)
    assert "validation top-1:" in text and f"(chance {result.chance:.3f}" in text
    assert "cut short" not in text
    multiview = training["multiview"]
    assert multiview["views"] == [3, 3] and multiview["top1"] == pytest.approx(result.multiview_top1)
    assert f"multi-view top-1: {result.multiview_top1:.3f} (3 x 3 views per video, {multiview['videos']} videos" in text
    assert f"throughput: {result.clips_per_s:.1f} clips/s over all epochs" in text
    assert f"rejected by the pre-screen: {len(bad)}" in text
    for name, reason in bad.items():
        assert f"{name}: {reason}" in text

    # A second run with the same spec reuses the dataset instead of generating it again. With a time cap
    # that no epoch fits, training stops after its first epoch: the demo says so and records what ran.
    lines.clear()
    capped = run_demo(dataclasses.replace(config, epochs=3, minutes=0.0001), echo=lines.append)
    assert any(line.startswith("[1/4] reusing the dataset") for line in lines)
    assert "training was cut short: 1 of 3 epochs ran (epochs 0-0); another epoch would have passed the " \
           "0.0001-minute cap on this machine" in "\n".join(lines)
    training = json.loads((report / "metrics.json").read_text())["training"]
    assert (training["epochs_run"], training["epochs_planned"]) == (capped.epochs, capped.epochs_planned) == (1, 3)
    assert training["stopped_early"]["reason"] == capped.stopped_early == \
        "another epoch would overrun --max-minutes 0.0001"
    assert len(training["history"]) == 1


def test_the_training_curve_numbers_epochs_as_the_console_and_keeps_its_legend_off_the_lines():
    from daliload.commands.demo import training_curve_figure

    history = [{"epoch": e, "train_loss": 1.5 - 0.3 * e, "train_top1": 0.3 + 0.1 * e, "val_top1": 0.4 + 0.1 * e}
               for e in range(4)]
    figure = training_curve_figure(history, chance=0.25, multiview={"views": [3, 3], "top1": 0.9}, title="t")
    try:
        figure.canvas.draw()
        loss_axis, top1_axis = figure.axes
        low, high = loss_axis.get_xlim()
        ticks = [t for t in loss_axis.get_xticks() if low <= t <= high]
        assert ticks == [0, 1, 2, 3]  # as the console prints them: no epoch 4, no 1.5
        (legend,) = figure.legends
        renderer = figure.canvas.get_renderer()
        assert not legend.get_window_extent(renderer).overlaps(loss_axis.get_window_extent(renderer))
        (star,) = [line for line in top1_axis.get_lines() if "3 x 3 views per video" in line.get_label()]
        assert list(star.get_xdata()) == [3] and list(star.get_ydata()) == [0.9]
    finally:
        import matplotlib.pyplot as plt

        plt.close(figure)
    single = training_curve_figure(history[:1])
    try:
        single.canvas.draw()
        low, high = single.axes[0].get_xlim()
        assert [t for t in single.axes[0].get_xticks() if low <= t <= high] == [0]
    finally:
        plt.close(single)


def _synth_rows(root: Path) -> list[dict]:
    from daliload.synth.dataset import read_report

    return [{"path": c.path, "broken": c.broken} for c in read_report(root) if c.broken]


def _read_png(path) -> np.ndarray:
    import matplotlib.pyplot as plt

    return np.rint(plt.imread(path)[..., :3] * 255).astype(np.uint8)
