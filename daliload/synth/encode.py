"""Encode frames into the containers and codecs Kinetics users meet, with PyAV.

Presets mirror what arrives in practice: ``h264`` is YouTube-like (High
profile, B-frames, a keyframe every 250 frames, frame-threaded so each frame is
one slice, as real downloads are), ``vp9`` is a WebM, ``hevc`` an MP4 with
``hvc1``, ``mpeg4`` an Xvid-like AVI, ``mjpeg`` an AVI, ``av1`` an MP4.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from fractions import Fraction
from pathlib import Path
from typing import Iterable, Literal, Sequence

import av
import numpy as np

Codec = Literal["h264", "vp9", "vp8", "hevc", "mpeg4", "mjpeg", "av1"]


@dataclass(frozen=True)
class EncodeSpec:
    """How to encode one file.

    Attributes:
        codec: one of :data:`CODEC_PRESETS`' keys.
        fps: nominal frame rate (a ``Fraction`` keeps 30000/1001 exact).
        gop: frames between keyframes.
        bframes: consecutive B-frames allowed (x264/x265 only).
        pix_fmt: encoder pixel format (``yuv420p``, ``yuv444p``, ``yuv420p10le``, ...).
        quality: codec-specific constant-quality value (crf, or qscale for mpeg4/mjpeg).
        options: extra encoder options.
    """

    codec: Codec = "h264"
    fps: Fraction = Fraction(30)
    gop: int = 250
    bframes: int = 3
    pix_fmt: str = "yuv420p"
    quality: int = 23
    options: dict = field(default_factory=dict)

    @property
    def extension(self) -> str:
        return CODEC_PRESETS[self.codec][1]


#: codec -> (FFmpeg encoder, file extension)
CODEC_PRESETS: dict[str, tuple[str, str]] = {
    "h264": ("libx264", "mp4"),
    "hevc": ("libx265", "mp4"),
    "vp9": ("libvpx-vp9", "webm"),
    "vp8": ("libvpx", "webm"),
    "mpeg4": ("mpeg4", "avi"),
    "mjpeg": ("mjpeg", "avi"),
    "av1": ("libsvtav1", "mp4"),
}


def default_spec(codec: Codec, **changes) -> EncodeSpec:
    """The preset for ``codec`` with the given fields changed."""
    if codec not in CODEC_PRESETS:
        raise ValueError(f"unknown codec {codec!r}; choose from {sorted(CODEC_PRESETS)}")
    base = EncodeSpec(codec=codec)
    if codec in ("vp9", "vp8"):
        base = replace(base, quality=32, bframes=0)
    elif codec == "mpeg4":
        base = replace(base, quality=4, bframes=0)
    elif codec == "mjpeg":
        base = replace(base, quality=4, bframes=0, gop=1, pix_fmt="yuvj420p")
    elif codec == "hevc":
        base = replace(base, quality=28)
    elif codec == "av1":
        base = replace(base, quality=25, bframes=0)
    return replace(base, **changes)


def _encoder_options(spec: EncodeSpec) -> dict[str, str]:
    q = str(spec.quality)
    if spec.codec == "h264":
        opts = {"preset": "veryfast", "crf": q, "bf": str(spec.bframes), "profile": "high444"
                if spec.pix_fmt.startswith("yuv444") else ("high10" if "10" in spec.pix_fmt else "high"),
                "x264-params": f"keyint={spec.gop}:min-keyint={min(25, spec.gop)}:scenecut=0"}
    elif spec.codec == "hevc":
        opts = {"preset": "ultrafast", "crf": q,
                "x265-params": f"log-level=error:keyint={spec.gop}:min-keyint={min(25, spec.gop)}"
                               f":bframes={spec.bframes}:scenecut=0"}
    elif spec.codec in ("vp9", "vp8"):
        opts = {"crf": q, "b": "0" if spec.codec == "vp9" else "1M", "deadline": "realtime",
                "cpu-used": "8", "g": str(spec.gop), "auto-alt-ref": "0", "lag-in-frames": "0"}
    elif spec.codec == "av1":
        opts = {"crf": q, "preset": "12", "g": str(spec.gop)}
    else:  # mpeg4, mjpeg: fixed quantiser
        opts = {}
    opts.update({k: str(v) for k, v in spec.options.items()})
    return opts


def write_video(
    path: str | Path,
    frames: Iterable[np.ndarray],
    spec: EncodeSpec,
    *,
    pts: Sequence[int] | None = None,
    time_base: Fraction | None = None,
    container_options: dict[str, str] | None = None,
) -> int:
    """Encode RGB frames ``(H, W, 3)`` uint8 into ``path``.

    Args:
        path: output file; the container follows its extension.
        frames: RGB frames, all the same even size.
        spec: codec and rate control.
        pts: optional explicit presentation timestamps (in ``time_base``) for a
            variable-frame-rate file; default is one tick of ``1/fps`` per frame.
        time_base: the stream time base that ``pts`` is counted in (default 1/1000 s).
        container_options: muxer options, e.g. ``{"movflags": "faststart"}`` to put
            an MP4's index before its media data.

    Returns:
        Number of frames written.
    """
    encoder, _ = CODEC_PRESETS[spec.codec]
    path = Path(path)
    count = 0
    # Fixed up front: the muxer rewrites stream.time_base once it starts (an MP4
    # picks its own timescale), and the frames' pts stay counted in this one.
    pts_time_base = time_base or Fraction(1, 1000)
    with av.open(str(path), mode="w", options=dict(container_options or {})) as container:
        stream = None
        for frame_rgb in frames:
            if stream is None:
                height, width = frame_rgb.shape[:2]
                stream = container.add_stream(encoder, rate=spec.fps, options=_encoder_options(spec))
                stream.width, stream.height, stream.pix_fmt = width, height, spec.pix_fmt
                if spec.codec in ("h264", "hevc", "vp9", "vp8"):
                    # One slice per frame, as real downloads have (docs/architecture.md, Facts).
                    stream.thread_type = "FRAME"
                if spec.codec in ("mpeg4", "mjpeg"):
                    stream.codec_context.gop_size = spec.gop
                    stream.codec_context.qmin = stream.codec_context.qmax = spec.quality
                if spec.codec == "hevc":
                    stream.codec_tag = "hvc1"
                if pts is not None:
                    stream.time_base = pts_time_base
                    stream.codec_context.time_base = pts_time_base
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame_rgb), format="rgb24")
            if pts is not None:
                frame.pts = int(pts[count])
                frame.time_base = pts_time_base
            for packet in stream.encode(frame):
                container.mux(packet)
            count += 1
        if stream is None:
            raise ValueError(f"no frames given for {path}")
        for packet in stream.encode(None):
            container.mux(packet)
    return count
