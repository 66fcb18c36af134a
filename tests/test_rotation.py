"""A file with a display rotation comes out upright, as FFmpeg and the transcode show it, on every route.

DALI decodes the stored picture and ignores the display matrix, so the
pre-screen sends rotated files to the fallback, which turns each frame upright
(the rule of FFmpeg's autorotate and of ``daliload transcode``); the index
holds the displayed size, so the plan's crops are of the upright picture.
"""

from __future__ import annotations

import shutil

import av
import numpy as np
import pytest
from av.video.reformatter import Colorspace

from daliload.loader import KineticsDALILoader
from daliload.plan import AugmentSpec, OutputSpec
from daliload.prescreen.probe import probe_file
from daliload.prescreen.rules import route_for
from fallback import decode_window

ROTATED = "PySceneDetect/issue-134-rotate.mp4"  # 1280x544 stored, display rotation -90: 544x1280 upright


def ffmpeg_upright(path, indices: list[int]) -> list[np.ndarray]:
    """Frames ``indices`` turned upright by FFmpeg's own filter (``transpose=clock`` for -90), BT.601 RGB."""
    out, count = {}, 0
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        graph = None
        for frame in container.decode(stream):
            if count in indices:
                if graph is None:
                    graph = av.filter.Graph()
                    nodes = [graph.add_buffer(width=frame.width, height=frame.height, format=frame.format.name,
                                              time_base=stream.time_base),
                             graph.add("transpose", "clock"), graph.add("buffersink")]
                    graph.link_nodes(*nodes).configure()
                graph.push(frame)
                turned = graph.pull()
                out[count] = turned.reformat(format="rgb24", src_colorspace=Colorspace.ITU601).to_ndarray()
            count += 1
            if count > max(indices):
                break
    return [out[i] for i in indices]


def test_the_fallback_turns_frames_upright_as_ffmpeg_does(realclips):
    path = realclips / ROTATED
    assert probe_file(path).rotation == -90
    indices = [0, 7, 30]
    clip = decode_window(path, indices)
    assert clip.frames.shape == (3, 1280, 544, 3)  # portrait
    for got, want in zip(clip.frames, ffmpeg_upright(path, indices)):
        assert np.array_equal(got, want)


def test_a_rotated_file_goes_to_the_fallback_everywhere_and_plans_on_its_upright_size(realclips, tmp_path):
    facts = probe_file(realclips / ROTATED)
    assert route_for(facts, "cpu")[0] == "fallback"  # (DALI's CPU decoder has no H.264 anyway)
    for device in ("gpu", "gpu:ada"):  # NVDEC decodes this H.264, but would leave it lying on its side
        route, reason = route_for(facts, device)
        assert route == "fallback" and reason.startswith("display rotation -90 degrees"), (device, reason)
    root = tmp_path / "rotated"
    (root / "train" / "turned").mkdir(parents=True)
    shutil.copy(realclips / ROTATED, root / "train" / "turned" / "clip.mp4")
    loader = KineticsDALILoader(root, "train", batch_size=1, clip_len=4, frame_stride=2, device="cpu",
                                augment=AugmentSpec(crop_size=(128, 54), crop_mode="center", flip_prob=0.0),
                                output=OutputSpec(size=(128, 54), mean=(0, 0, 0), std=(1, 1, 1), dtype="float32"))
    try:
        [video] = loader.videos
        assert (video.width, video.height) == (544, 1280)  # the displayed size
        [sample] = loader.plan()[0]
        assert sample.crop.y0 == 0 and sample.crop.y1 == 1  # the whole upright picture: tall, not wide
        videos, _ = next(iter(loader))
        want = ffmpeg_upright(root / "train" / "turned" / "clip.mp4", sample.frame_indices(video.num_frames))
        # The clip is the upright picture, shrunk: compare with FFmpeg's upright frames shrunk the same way.
        import torch.nn.functional as F
        import torch

        expected = F.interpolate(torch.from_numpy(np.stack(want)).permute(0, 3, 1, 2).float(), size=(128, 54),
                                 mode="bilinear", antialias=True, align_corners=False)
        got = videos[0].permute(1, 0, 2, 3)  # (T, C, H, W)
        assert float((got - expected).abs().mean()) < 3.0
        sideways = F.interpolate(torch.from_numpy(np.stack(want)).permute(0, 3, 2, 1).float(), size=(128, 54),
                                 mode="bilinear", antialias=True, align_corners=False)
        assert float((got - sideways).abs().mean()) > 10.0  # what a picture left lying on its side would give
    finally:
        loader.close()


@pytest.mark.parametrize("rotation, turn", [(0, 0), (-90, 3), (90, 1), (180, 2), (-180, 2), (270, 3)])
def test_every_quarter_turn_is_mapped_like_the_transcode(rotation, turn):
    from daliload.transcode.encode import _rotation_filters

    assert round(rotation / 90) % 4 == turn
    assert _rotation_filters(rotation) == {0: [], 1: [("transpose", "cclock")], 2: [("hflip", ""), ("vflip", "")],
                                           3: [("transpose", "clock")]}[turn]
