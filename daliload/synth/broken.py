"""Files that are broken or odd in the ways a Kinetics download really is.

Each *kind* is written into the class folders like a normal clip, with a video
extension, so the pre-screen and the loaders meet it where they would meet a
real one. Some kinds are unreadable, some are readable but outside what NVDEC
decodes (see ``docs/architecture.md``, "Facts" and the NVDEC table in :mod:`daliload.prescreen.rules`):

===============  ==========================================================
kind             what the file is
===============  ==========================================================
``zero_bytes``   an empty ``.mp4`` (an interrupted download)
``truncated``    an H.264 MP4 with its index in front (``faststart``), cut in
                 the middle of its middle packet: it opens, reports all its
                 frames, and decoding stops with an error part way
``garbage``      random bytes with an ``.mp4`` extension
``header_only``  ``ftyp`` + ``moov`` + an empty ``mdat``: a valid header that
                 promises frames, and no media data
``yuv444``       H.264 High 4:4:4 Predictive, ``yuv444p`` (NVDEC: no)
``ten_bit``      H.264 High 10, ``yuv420p10le``
``vfr``          H.264 with irregular presentation timestamps (frame
                 durations 0.5x-2x the nominal one)
``no_video``     an AAC audio-only MP4
===============  ==========================================================

The readable kinds (``truncated`` up to the cut, ``yuv444``, ``ten_bit``,
``vfr``) carry the frame-index code like every generated clip.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Literal, get_args

import av
import numpy as np

from daliload.synth.content import render_clip
from daliload.synth.encode import default_spec, write_video

BrokenKind = Literal[
    "zero_bytes", "truncated", "garbage", "header_only", "yuv444", "ten_bit", "vfr", "no_video",
]
#: Every kind, in the order the generator hands them out.
BROKEN_KINDS: tuple[BrokenKind, ...] = get_args(BrokenKind)
#: All kinds are MP4 files (what most Kinetics downloads are).
BROKEN_EXTENSION = "mp4"
#: What a kind holds: (codec name, whether video frames were encoded into it).
KIND_CONTENT: dict[str, tuple[str | None, bool]] = {
    "zero_bytes": (None, False),
    "truncated": ("h264", True),
    "garbage": (None, False),
    "header_only": ("h264", True),
    "yuv444": ("h264", True),
    "ten_bit": ("h264", True),
    "vfr": ("h264", True),
    "no_video": ("aac", False),
}
#: Which packet a ``truncated`` file is cut in the middle of (fraction of its
#: packets in file order; a byte fraction would often cut the first keyframe,
#: which can hold most of a short clip's bytes).
TRUNCATE_AT = 0.5
#: Size of a ``garbage`` file, in bytes.
GARBAGE_BYTES = 64 * 1024
#: Frame durations of a ``vfr`` file, as multiples of the nominal one.
VFR_DURATION_FACTORS = (0.5, 0.75, 1.0, 1.5, 2.0)
AUDIO_RATE_HZ = 44100


@dataclass(frozen=True)
class ClipContent:
    """What to render into a (possibly broken) file.

    Attributes:
        content_class: class index given to :func:`daliload.synth.render_clip`.
        num_frames: frames to render.
        width, height: frame size in pixels.
        fps: nominal frame rate.
        seed: render seed (texture, colours, phase); also seeds garbage bytes
            and the irregular timestamps of ``vfr`` files.
    """

    content_class: int
    num_frames: int
    width: int
    height: int
    fps: Fraction
    seed: int

    def frames(self):
        return render_clip(self.content_class, self.num_frames, width=self.width,
                           height=self.height, fps=float(self.fps), seed=self.seed)


def check_kind(kind: str) -> BrokenKind:
    """Return ``kind`` if it is one of :data:`BROKEN_KINDS`, else raise ValueError."""
    if kind not in BROKEN_KINDS:
        raise ValueError(f"unknown broken kind {kind!r}; choose from {', '.join(BROKEN_KINDS)}")
    return kind  # type: ignore[return-value]


def write_broken(path: str | Path, kind: BrokenKind, content: ClipContent) -> None:
    """Write one file of the given broken ``kind`` to ``path``.

    Args:
        path: output file; its extension should be :data:`BROKEN_EXTENSION`.
        kind: one of :data:`BROKEN_KINDS`.
        content: what to render when the kind holds video (or audio of the
            same duration for ``no_video``).

    Raises:
        ValueError: ``kind`` is unknown.
    """
    check_kind(kind)
    path = Path(path)
    if kind == "zero_bytes":
        path.write_bytes(b"")
    elif kind == "garbage":
        path.write_bytes(np.random.default_rng(content.seed).bytes(GARBAGE_BYTES))
    elif kind in ("truncated", "header_only"):
        write_video(path, content.frames(), default_spec("h264", fps=content.fps),
                    container_options={"movflags": "faststart"})
        os.truncate(path, _mdat_payload(path)[0] if kind == "header_only" else _mid_packet(path))
    elif kind == "yuv444":
        write_video(path, content.frames(),
                    default_spec("h264", fps=content.fps, pix_fmt="yuv444p"))
    elif kind == "ten_bit":
        write_video(path, content.frames(),
                    default_spec("h264", fps=content.fps, pix_fmt="yuv420p10le"))
    elif kind == "vfr":
        pts, time_base = vfr_timestamps(content.num_frames, content.fps, content.seed)
        write_video(path, content.frames(), default_spec("h264", fps=content.fps),
                    pts=pts, time_base=time_base)
    elif kind == "no_video":
        _write_audio_only(path, content.num_frames / content.fps, content.seed)


def vfr_timestamps(num_frames: int, fps: Fraction, seed: int) -> tuple[list[int], Fraction]:
    """Irregular presentation timestamps around a nominal ``fps``.

    Returns:
        ``(pts, time_base)``: pts in milliseconds (``time_base`` 1/1000 s); each
        frame lasts a random :data:`VFR_DURATION_FACTORS` multiple of ``1/fps``.
    """
    rng = np.random.default_rng([seed, 0x5F5])
    nominal_ms = 1000.0 / float(fps)
    durations = np.round(rng.choice(VFR_DURATION_FACTORS, size=num_frames) * nominal_ms)
    pts = np.concatenate([[0], np.cumsum(durations)[:-1]]).astype(np.int64)
    return pts.tolist(), Fraction(1, 1000)


def _mdat_payload(path: Path) -> tuple[int, int]:
    """Byte range ``[start, end)`` of the payload of the top-level ``mdat`` box."""
    data_size = path.stat().st_size
    with open(path, "rb") as f:
        offset = 0
        while offset + 8 <= data_size:
            f.seek(offset)
            size, box = struct.unpack(">I4s", f.read(8))
            header = 8
            if size == 1:  # 64-bit size follows the type
                size = struct.unpack(">Q", f.read(8))[0]
                header = 16
            elif size == 0:  # box runs to the end of the file
                size = data_size - offset
            if box == b"mdat":
                return offset + header, offset + size
            if size < header:
                break
            offset += size
    raise ValueError(f"{path}: no top-level mdat box found; is it an MP4?")


def _mid_packet(path: Path) -> int:
    """Byte offset in the middle of packet ``TRUNCATE_AT * num_packets`` (file order)."""
    with av.open(str(path)) as container:
        packets = sorted((p.pos, p.size) for p in container.demux(video=0) if p.size and p.pos >= 0)
    if not packets:
        raise ValueError(f"{path}: no video packets to cut")
    pos, size = packets[min(len(packets) - 1, int(len(packets) * TRUNCATE_AT))]
    return pos + max(1, size // 2)


def _write_audio_only(path: Path, duration_s: float, seed: int) -> None:
    """An AAC mono tone of ``duration_s`` seconds in an MP4 with no video stream."""
    tone_hz = 220.0 + 440.0 * np.random.default_rng(seed).random()
    total = int(round(duration_s * AUDIO_RATE_HZ))
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("aac", rate=AUDIO_RATE_HZ)
        stream.layout = "mono"
        for start in range(0, total, 1024):
            t = np.arange(start, min(start + 1024, total)) / AUDIO_RATE_HZ
            samples = (0.2 * np.sin(2 * np.pi * tone_hz * t)).astype(np.float32)[None]
            frame = av.AudioFrame.from_ndarray(samples, format="fltp", layout="mono")
            frame.sample_rate = AUDIO_RATE_HZ
            frame.pts = start
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
