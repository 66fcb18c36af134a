"""VP9 frames that refresh no reference, and the fallback's non-reference skipping (issue 45).

Checked here (2026-12-03, FFmpeg of PyAV's wheel, libvpx-vp9 two temporal layers: every other frame has
``refresh_frame_flags == 0``):

- FFmpeg's ``vp9`` decoder ignores ``skip_frame = NONREF``: the fallback, which sets it packet by packet for
  VP9 (``fallback.decode.SKIP_NONREF_DECODERS``), decodes every frame, so it stays exact;
- leaving such frames out by hand is exact only when the frame after them starts afresh (error-resilient
  mode): without it (the default), the next frames read the skipped frame's motion vectors and probability
  context (a one-off check, not a committed measurement: 42 of the 45 frames kept differed from a full
  decode; with ``error-resilient=1`` none did). libvpx with alt-ref frames and a lag (``deadline=good``,
  ``auto-alt-ref=1``, ``lag-in-frames=16``), as video-on-demand encodes are made, wrote no such frame (every
  frame refreshed LAST or ALTREF), so the fallback leaves VP9 as it is.

The test guards the exactness: with non-reference skipping on, a window of such a file decodes to the frames
of a full decode, and as many of them.
"""

from __future__ import annotations

import numpy as np
import pytest

av = pytest.importorskip("av")

from fallback.decode import decode_window  # noqa: E402

pytestmark = pytest.mark.slow  # encodes a VP9 file

TWO_LAYERS = {"ts-parameters": "ts_number_layers=2:ts_target_bitrate=250,500:ts_rate_decimator=2,1:"
                                "ts_periodicity=2:ts_layer_id=0,1:ts_layering_mode=2",
              "g": "32", "deadline": "realtime", "cpu-used": "8", "lag-in-frames": "0", "b": "500k"}


@pytest.fixture(scope="module")
def two_layer_vp9(tmp_path_factory):
    path = tmp_path_factory.mktemp("vp9") / "two_layers.webm"
    try:
        container = av.open(str(path), "w")
        stream = container.add_stream("libvpx-vp9", rate=30, options=TWO_LAYERS)
    except (av.error.FFmpegError, ValueError) as err:
        pytest.skip(f"no libvpx-vp9 encoder with temporal layers here: {err}")
    stream.width, stream.height, stream.pix_fmt = 160, 128, "yuv420p"
    for i in range(90):
        img = np.zeros((128, 160, 3), np.uint8)
        img[:, (i * 3) % 140:(i * 3) % 140 + 20] = 255
        img[(i * 2) % 128, :] = 128
        for packet in stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
            container.mux(packet)
    for packet in stream.encode():
        container.mux(packet)
    container.close()
    return path


@pytest.mark.parametrize("window", [list(range(0, 16)), list(range(40, 80, 4)), [33, 35, 37]])
def test_a_window_of_a_vp9_file_with_non_reference_frames_is_exact_with_skipping_on(two_layer_vp9, window):
    skipping = decode_window(two_layer_vp9, window, skip_nonref=True)
    full = decode_window(two_layer_vp9, window, skip_nonref=False)
    assert np.array_equal(skipping.frames, full.frames)
    # FFmpeg's vp9 decoder does not honour skip_frame=NONREF: the same frames decoded either way
    assert skipping.num_frames_decoded == full.num_frames_decoded
