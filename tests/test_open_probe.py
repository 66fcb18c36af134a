"""A file the scan found unrotated is opened without FFmpeg's probe decode (keyframes only), and gives the same
frames; a rotated file, or one the scan did not see, is probed as before and comes out upright.

FFmpeg's ``avformat_find_stream_info`` decodes the first frames of a stream to learn what the decode finds out
anyway; with ``skip_frame=nonkey`` for those probe decoders the open is cheap, but the frames then lose the
display matrix: so only a hint that says ``rotation == 0`` (the manifest's) asks for it.
"""

from __future__ import annotations

import dataclasses
import shutil

import av
import numpy as np
import pytest

from daliload.stream.numbering import probe_hint
from fallback import decode_window


@pytest.fixture
def opens(monkeypatch):
    """The ``stream_options`` of every ``av.open`` the fallback makes."""
    seen, real_open = [], av.open

    def recording_open(*args, **kwargs):
        seen.append(kwargs.get("stream_options"))
        return real_open(*args, **kwargs)

    monkeypatch.setattr(av, "open", recording_open)
    return seen


@pytest.mark.parametrize("codec", ["h264", "vp9", "hevc"])
def test_an_unrotated_file_opens_without_the_probe_decode_and_gives_the_same_frames(make_clip, opens, codec):
    path = make_clip(codec, num_frames=90, gop=30)
    scanned = probe_hint(path)
    wanted = list(range(40, 72, 4))
    unknown = decode_window(path, wanted, hint=dataclasses.replace(scanned, rotation=None))
    assert opens and all(options is None for options in opens)
    opens.clear()
    skimmed = decode_window(path, wanted, hint=dataclasses.replace(scanned, rotation=0))
    assert opens and all(options and options[0] == {"skip_frame": "nonkey"} for options in opens)
    assert np.array_equal(skimmed.frames, unknown.frames)
    assert skimmed.num_frames_decoded == unknown.num_frames_decoded


def test_a_rotated_file_is_probed_as_before_and_comes_out_upright(realclips, opens):
    from tests.test_rotation import ROTATED

    path = realclips / ROTATED
    hint = dataclasses.replace(probe_hint(path), rotation=-90)
    clip = decode_window(path, [0, 2, 4, 6], hint=hint)
    assert clip.frames.shape[1:] == (1280, 544, 3)  # upright: tall, as FFmpeg shows it
    assert opens and all(options is None for options in opens)


def test_the_loaders_hints_carry_the_scans_rotation(realclips, make_clip, tmp_path):
    """Through the loader: the generated files' hints say 0 (from the manifest), the manifest holds the rotated
    real file's -90, and a path it does not hold has no rotation."""
    from daliload.loader import KineticsDALILoader
    from daliload.prescreen.byte_indexes import ByteIndexes
    from tests.test_rotation import ROTATED

    root = tmp_path / "mixed"
    for folder in ("turned", "plain"):
        (root / "train" / folder).mkdir(parents=True)
    shutil.copy(realclips / ROTATED, root / "train" / "turned" / "clip.mp4")
    for codec in ("h264", "vp9"):
        source = make_clip(codec, num_frames=90, gop=30)
        shutil.copy(source, root / "train" / "plain" / source.name)
    loader = KineticsDALILoader(root, "train", batch_size=2, clip_len=4, frame_stride=2, device="cpu")
    try:
        hint_of = loader.sources._hint_of
        turned = str(root / "train" / "turned" / "clip.mp4")
        plain = [v.path for v in loader.videos if v.path != turned]
        assert len(plain) == 2 and [hint_of(path).rotation for path in plain] == [0, 0]
        manifest = ByteIndexes(loader.manifest_path)
        assert manifest.rotation(turned) == -90
        assert hint_of(turned) is None or hint_of(turned).rotation == -90  # (a varying frame rate: no hint)
        assert manifest.rotation(str(root / "not-scanned.mp4")) is None
        manifest.close()
    finally:
        loader.close()
