"""Every file of a class folder is scanned or reported as skipped; raw H.264/HEVC streams are scanned."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from daliload.cli import main
from daliload.prescreen import scan
from daliload.synth import default_spec, render_clip, write_video

NUM_FRAMES = 30


@pytest.fixture(scope="module")
def raw_dataset(tmp_path_factory) -> Path:
    """ROOT/train/juggling/ with a raw .h264 and .hevc stream, an MP4, a .txt and a .jpg."""
    root = tmp_path_factory.mktemp("raw")
    folder = root / "train" / "juggling"
    folder.mkdir(parents=True)
    frames = list(render_clip(1, NUM_FRAMES, width=160, height=144, fps=30.0))
    for name, codec in (("raw.h264", "h264"), ("raw.hevc", "hevc"), ("boxed.mp4", "h264")):
        write_video(folder / name, frames, default_spec(codec, gop=10))
    (folder / "notes.txt").write_text("downloaded 2026-11-30\n")
    (folder / "thumb.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    return root


SKIPPED = {"notes.txt": "not a video extension: .txt", "thumb.jpg": "not a video extension: .jpg"}


def test_raw_streams_are_probed_and_routed_other_files_are_skipped(raw_dataset, tmp_path):
    summary = scan(raw_dataset, manifest_path=tmp_path / "m.sqlite", device="gpu", workers=0,
                   splits=("train",), progress=False)
    assert summary.total == 3 and summary.probed == 3
    assert {Path(p).name: reason for p, reason in summary.skipped} == SKIPPED
    # On a GPU the MP4 goes to NVDEC; the raw Annex B streams to the fallback (DALI finds H.264/HEVC
    # keyframes only in length-prefixed streams), with that reason.
    assert dict(summary.files) == {"dali": 1, "fallback": 2}, summary.format()
    assert all("length-prefixed" in reason for (route, reason) in summary.reasons if route == "fallback")
    printed = summary.format()
    assert "skipped, not scanned: 2 file(s)" in printed
    assert "| not a video extension: .txt | 1 |" in printed
    assert f"{raw_dataset / 'train' / 'juggling' / 'thumb.jpg'}: not a video extension: .jpg" in printed


def test_cli_json_lists_raw_streams_with_their_facts_and_the_skipped_files(raw_dataset, tmp_path, capsys):
    out = tmp_path / "files.json"
    rc = main(["scan", str(raw_dataset), "--device", "cpu", "--workers", "1", "--quiet", "--split", "train",
               "--manifest", str(tmp_path / "m.sqlite"), "--json", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "skipped, not scanned: 2 file(s)" in printed
    rows = {Path(row["path"]).name: row for row in json.loads(out.read_text())}
    assert set(rows) == {"raw.h264", "raw.hevc", "boxed.mp4", "notes.txt", "thumb.jpg"}
    for name, reason in SKIPPED.items():
        assert rows[name]["route"] == "skipped" and rows[name]["reason"] == reason
        assert rows[name]["codec"] is None
    for name, codec in (("raw.h264", "h264"), ("raw.hevc", "hevc")):
        row = rows[name]
        assert row["route"] == "fallback", row  # DALI on a CPU has neither decoder
        assert (row["codec"], row["width"], row["height"], row["num_frames"]) == (codec, 160, 144, NUM_FRAMES)
