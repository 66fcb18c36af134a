"""The cheap probe: what a video file is, from demuxing it and decoding one frame.

:func:`probe_file` opens a file with PyAV, reads every packet of its video
stream *without decoding them* (a 10-second 256p clip is ~300 small reads),
and decodes only until the first frame comes out (one frame for a stream that
opens on a keyframe; the rest of the cut GOP for a stream cut mid-GOP) to prove
the stream decodes at all.
From that it reports the facts the capability rules (:mod:`.rules`) and the
loaders need:

===============  ==========================================================
container        demuxer name (``mov,mp4,m4a,3gp,3g2,mj2``, ``matroska,webm``, ``avi``)
codec, profile   FFmpeg decoder name (``h264``, ``vp9``) and profile (``High``)
pix_fmt          decoder pixel format, with ``bit_depth`` (luma bits) and
                 ``chroma`` subsampling (``420``, ``422``, ``444``, ``400``, ``rgb``)
width, height    coded size in pixels, before any ``rotation``
rotation         degrees from the display matrix (FFmpeg's sign: ``-90``
                 means "rotate 90 degrees clockwise to display")
fps, base_fps    average frame rate and the container's base rate (``r_frame_rate``)
num_frames       frames a full decode outputs, counted from packets (WebM
                 headers say 0, AVI index entries may count dropped frames)
num_packets      the stream's non-empty packets: what DALI counts as frames
keyframes        frame indices, in presentation order, where a decode may
                 start (clean random-access points, not every sync sample)
vfr              variable-frame-rate hint: base and average rate disagree, or
                 the presentation timestamps do not step evenly (gaps count)
duration_s       from the packet timestamps when known
===============  ==========================================================

Frame counting follows what a decoder actually outputs, so counts match a full
decode and the fallback's frame numbers: the one rule is
:mod:`daliload.stream.numbering` (empty, edit-list-discarded, MPEG-4 filler and hidden
VP8 packets show no frame; pictures before the first frame the decoder outputs,
in a stream cut mid-GOP, get no index; keyframes are the clean random-access
points, e.g. H.264 IDR or recovery-point pictures, not every sync sample).

A file is *bad* (``ProbeResult.reason`` is set) when it cannot be opened, has
no video stream, has no frames, fails to demux, its first frame fails to
decode, or it is cut short: a packet the demuxer flags corrupt (read past the
end of the file), or an MP4 whose sample table lists more packets than the
file holds. Decoder errors before the first frame (a stream cut mid-GOP) are
what a full decode meets too and do not make a file bad. Files damaged after
the first frame pass the probe; the ``--deep`` check (:mod:`.deep`) catches
those, and finds files where seeking to a keyframe gives wrong frames
(``unsafe_seek``).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
from dataclasses import dataclass, field, replace
from fractions import Fraction
from pathlib import Path

import av
from av.stream import Discard

from daliload.stream import open_video
from daliload.stream.byteindex import build_byte_index
from daliload.stream.numbering import (
    first_output_pts,
    frames_from,
    is_random_access,
    nal_length_size,
    shows_frame,
    timestamps_rank_frames,
)

logger = logging.getLogger(__name__)

#: Packets fed to the decoder while looking for the first frame (a stream cut
#: mid-GOP needs the rest of that GOP first).
_MAX_PACKETS_TO_FIRST_FRAME = 600
#: Demuxer options. ``avformat_find_stream_info`` (which PyAV always runs) would
#: otherwise decode the first frame(s) itself to learn the pixel format, and the
#: probe decodes the first frame anyway: an empty decoder whitelist stops that
#: decode and halves the cost of probing a VP9 or H.264 file.
_OPEN_OPTIONS = {"codec_whitelist": "null"}
#: AVFieldOrder values above PROGRESSIVE (1) mean interlaced (TT, BB, TB, BT).
_FIELD_ORDER_PROGRESSIVE = 1


@dataclass(frozen=True)
class ProbeResult:
    """Facts about one file. ``reason`` is empty when the file decodes.

    Attributes:
        path: the probed file.
        reason: why the file is unusable (``""`` if it is usable), e.g.
            ``"cannot open: InvalidDataError: Invalid data found when processing input"``.
        has_video: whether the container has a video stream.
        container: demuxer name.
        codec: FFmpeg codec name of the video stream.
        profile: codec profile name, ``None`` when FFmpeg reports none.
        pix_fmt: decoder pixel format (``yuv420p``).
        bit_depth: bits per luma sample.
        chroma: chroma subsampling: ``420``, ``422``, ``444``, ``440``, ``411``,
            ``400`` (grey) or ``rgb``.
        width, height: coded frame size in pixels.
        rotation: display rotation in degrees (FFmpeg's sign convention).
        interlaced: the stream or its first frame is interlaced.
        fps: average frame rate in frames per second.
        base_fps: the container's base frame rate (``r_frame_rate``).
        num_frames: frames a full decode outputs, counted from packets.
        num_packets: non-empty packets of the stream (DALI's frame count).
        duration_s: duration in seconds.
        keyframes: presentation-order indices of the frames a decode may start
            at (ascending).
        vfr: variable-frame-rate hint.
        unsafe_seek: decoding from a keyframe after the start gave other
            frames than a decode from an earlier entry (set by the ``--deep``
            check, :func:`daliload.prescreen.deep.seek_check`).
    """

    path: str
    reason: str = ""
    has_video: bool = False
    container: str | None = None
    codec: str | None = None
    profile: str | None = None
    pix_fmt: str | None = None
    bit_depth: int | None = None
    chroma: str | None = None
    width: int | None = None
    height: int | None = None
    rotation: int = 0
    interlaced: bool = False
    fps: float | None = None
    base_fps: float | None = None
    num_frames: int = 0
    duration_s: float | None = None
    keyframes: tuple[int, ...] = ()
    byte_index: bytes | None = None
    vfr: bool = False
    num_packets: int = 0
    unsafe_seek: bool = False

    @property
    def ok(self) -> bool:
        """Whether the file passed the probe (it may still go to the fallback)."""
        return not self.reason


def describe_error(err: BaseException) -> str:
    """``"ExcType: message"`` without the file name, so equal failures group together."""
    message = getattr(err, "strerror", None) or str(err)
    return f"{type(err).__name__}: {message}"


def pixel_layout(pix_fmt: str | None) -> tuple[int | None, str | None]:
    """``(bit_depth, chroma)`` of an FFmpeg pixel format name.

    >>> pixel_layout("yuv420p10le")
    (10, '420')
    >>> pixel_layout("yuvj422p")
    (8, '422')
    """
    if not pix_fmt:
        return None, None
    try:
        fmt = av.VideoFormat(pix_fmt, 16, 16)
    except (ValueError, av.FFmpegError):
        return None, None
    components = fmt.components
    if not components:
        return None, None
    bit_depth = int(components[0].bits)
    if fmt.is_rgb:
        return bit_depth, "rgb"
    # Not ``Component.is_chroma``: PyAV derives it from the subsampling (4:4:4 reads as luma).
    chroma_planes = [c for c in components[1:] if not c.is_alpha]
    if not chroma_planes:
        return bit_depth, "400"
    sub_w = components[0].width // max(1, chroma_planes[0].width)
    sub_h = components[0].height // max(1, chroma_planes[0].height)
    chroma = {(1, 1): "444", (2, 1): "422", (2, 2): "420", (1, 2): "440", (4, 1): "411"}.get(
        (sub_w, sub_h), f"{sub_w}x{sub_h}"
    )
    return bit_depth, chroma


def _rate(value: Fraction | None) -> float | None:
    if value is None or value <= 0:
        return None
    return float(value)


def _is_vfr(sorted_pts: list[int], base_fps: float | None, fps: float | None) -> bool:
    if base_fps and fps and abs(base_fps - fps) > 0.01 * base_fps:
        return True
    if len(sorted_pts) < 3:
        return False
    steps = [b - a for a, b in zip(sorted_pts, sorted_pts[1:])]
    typical = sorted(steps)[len(steps) // 2]
    # One tick of slack: millisecond time bases round 33.37 ms to 33 or 34.
    slack = max(1, typical // 10)
    return any(abs(step - typical) > slack for step in steps)


def _decode_first(
    ctx: av.codec.context.CodecContext, packet: av.Packet, fed: list[av.Packet]
) -> av.VideoFrame | None:
    """Feed one more packet; return the first frame once the decoder shows one.

    A stream that starts with a keyframe shows it after one packet and a drain
    (``decode(None)``), without waiting out the B-frame reorder delay, so the
    probe decodes exactly one frame. Otherwise the decoder is reset and the
    packets are replayed, then fed one by one until a frame comes out (the
    demuxer's final empty packet drains it, so short streams still yield one).
    """
    if packet.size == 0:
        frames = ctx.decode(None)
    elif not fed:
        fed.append(packet)
        frames = ctx.decode(packet) + ctx.decode(None)
        if not frames:
            ctx.flush_buffers()  # leave draining mode; replay from the start below
            frames = ctx.decode(packet)
    else:
        fed.append(packet)
        frames = ctx.decode(packet)
    return frames[0] if frames else None


def probe_file(path: str | Path) -> ProbeResult:
    """Probe one file: demux every video packet, decode only the first frame.

    Args:
        path: the video file.

    Returns:
        The facts; ``reason`` says why the file is unusable, if it is.
        Never raises for a broken file: failures become the ``reason``.
    """
    path_str = str(path)
    source = None
    try:
        source = open_video(path_str)
        container = av.open(source, metadata_errors="ignore", container_options=_OPEN_OPTIONS)
    except (av.FFmpegError, OSError) as err:  # OSError: not a regular file, or a remote read that failed
        if isinstance(source, io.IOBase):
            source.close()
        return ProbeResult(path_str, reason=f"cannot open: {describe_error(err)}")
    with container:
        return _probe_open(path_str, source, container)


def _probe_open(path_str: str, source, container: av.container.InputContainer) -> ProbeResult:
    """The facts of an open container (:func:`probe_file`); its file object, if any, is closed after."""
    with source if isinstance(source, io.IOBase) else contextlib.nullcontext():
        stream = _video_stream(container)
        if stream is None:
            return ProbeResult(path_str, reason="no video stream", container=container.format.name)
        facts = _header_facts(path_str, container, stream)
        packets = _read_packets(container, stream)
        if packets.demux_error is not None:
            return replace(facts, reason=f"demux error after {len(packets.keys)} packets: "
                                         f"{describe_error(packets.demux_error)}")  # fmt: skip
        if not packets.keys:
            return replace(facts, reason="zero frames")
        damage = _damage(packets, container, stream)
        if damage:
            return replace(facts, num_frames=len(packets.keys), reason=damage)
        facts = _with_stream_facts(facts, packets, container, stream)
        return replace(facts, byte_index=_byte_index(source, packets, facts))


def _byte_index(source, found: _Packets, facts: ProbeResult) -> bytes | None:
    """Where the packets lie (:mod:`daliload.stream.byteindex`), for reading a remote window in one request;
    ``None`` when the numbering needed more than timestamps (no first pts to store) or the packets do not allow it."""
    keys = found.keys
    if (not facts.keyframes or facts.vfr or not keys or any(k is None for k in keys) or facts.num_frames != len(keys)
            or found.first_frame is None or found.first_frame.pts != min(keys)
            or not timestamps_rank_frames(facts.container or "")):
        return None  # frames not numbered by their timestamps from the first packet on: no first pts to store
    try:
        size = os.stat(source).st_size if isinstance(source, str) else source.size
    except OSError:
        return None
    order = sorted(range(len(found.keys)), key=found.keys.__getitem__)
    index = build_byte_index(size, found.positions, found.sizes, order, facts.keyframes, found.keys[order[0]])
    return None if index is None else index.encode()


def _video_stream(container: av.container.InputContainer) -> av.video.stream.VideoStream | None:
    """The first video stream that is not a cover picture; every other stream is discarded."""
    videos = [
        s
        for s in container.streams.video
        if not s.disposition & av.stream.Disposition.attached_pic
    ]
    if not videos:
        return None
    stream = videos[0]
    for other in container.streams:
        if other.index != stream.index:
            other.discard = Discard.all
    # One thread: frame threading would delay the first frame by a frame per thread.
    stream.codec_context.thread_count = 1
    return stream


def _header_facts(path: str, container: av.container.InputContainer,
                  stream: av.video.stream.VideoStream) -> ProbeResult:  # fmt: skip
    """What the container and codec headers say, before any packet is read."""
    ctx = stream.codec_context
    return ProbeResult(
        path,
        has_video=True,
        container=container.format.name,
        codec=ctx.codec.canonical_name,  # the format ("av1"), not the decoder ("libdav1d")
        profile=ctx.profile or None,
        pix_fmt=ctx.pix_fmt,
        width=ctx.width or None,
        height=ctx.height or None,
        interlaced=ctx.field_order > _FIELD_ORDER_PROGRESSIVE,
        fps=_rate(stream.average_rate) or _rate(stream.guessed_rate) or _rate(stream.base_rate),
        base_fps=_rate(stream.base_rate),
    )


@dataclass
class _Packets:
    """What reading every packet of the video stream found (frames in decode order)."""

    keys: list[int | None] = field(default_factory=list)  # pts (else dts) of each frame
    keyflags: list[bool] = field(default_factory=list)  # whether a decode may start at each frame
    durations: list[int] = field(default_factory=list)  # packet duration of each frame
    positions: list[int] = field(default_factory=list)  # byte offset of each frame's packet (-1: unknown)
    sizes: list[int] = field(default_factory=list)  # bytes of each frame's packet
    packets: int = 0  # non-empty packets, shown or not
    corrupt_at: int | None = None  # index of the first packet the demuxer flagged corrupt
    first_frame: av.VideoFrame | None = None
    decode_error: BaseException | None = None  # the first decoder error before the first frame
    feeding: bool = True  # still looking for the first frame
    demux_error: BaseException | None = None  # reading packets failed (keys holds those before)


def _read_packets(container: av.container.InputContainer,
                  stream: av.video.stream.VideoStream) -> _Packets:  # fmt: skip
    """Demux every packet of ``stream``, counting frames; decode only until the first frame."""
    ctx = stream.codec_context
    codec = ctx.codec.canonical_name
    length_size = nal_length_size(codec, ctx.extradata)
    found = _Packets()
    fed: list[av.Packet] = []  # packets sent to the decoder while it has shown no frame
    try:
        for packet in container.demux(stream):
            if found.feeding:
                _feed(found, ctx, packet, fed)
            if packet.size == 0:
                continue
            found.packets += 1
            if packet.is_corrupt and found.corrupt_at is None:
                found.corrupt_at = found.packets - 1
            if not shows_frame(codec, packet):
                continue
            found.keys.append(packet.pts if packet.pts is not None else packet.dts)
            found.keyflags.append(is_random_access(codec, packet, length_size))
            found.durations.append(packet.duration or 0)
            found.positions.append(packet.pos if packet.pos is not None else -1)
            found.sizes.append(packet.size)
    except av.FFmpegError as err:
        found.demux_error = err
    return found


def _feed(found: _Packets, ctx: av.codec.context.CodecContext, packet: av.Packet,
          fed: list[av.Packet]) -> None:  # fmt: skip
    """Feed one packet towards the first frame. Invalid-data errors before the first frame
    (a stream cut mid-GOP) are remembered and decoding goes on; any other error stops it."""
    try:
        found.first_frame = _decode_first(ctx, packet, fed)
    except av.error.InvalidDataError as err:
        found.decode_error = found.decode_error or err
        ctx.flush_buffers()  # out of draining mode, if the error came from a drain
    except av.FFmpegError as err:
        found.decode_error = found.decode_error or err
        found.feeding = False
    if found.first_frame is not None or len(fed) >= _MAX_PACKETS_TO_FIRST_FRAME:
        found.feeding = False


def _damage(found: _Packets, container: av.container.InputContainer,
            stream: av.video.stream.VideoStream) -> str:  # fmt: skip
    """Why a stream with frames is still unusable (the first frame, a cut file), or ``""``."""
    if found.first_frame is None:
        if found.decode_error is not None:
            return f"first frame fails to decode: {describe_error(found.decode_error)}"
        return "first frame fails to decode: decoder gave no frame"
    if found.corrupt_at is not None:
        # The demuxer flags a packet it could not read whole: a cut download.
        return f"corrupt packet (truncated file?): packet {found.corrupt_at} of {found.packets}"
    if container.format.name.startswith("mov,") and stream.frames > found.packets:
        # An MP4 sample table lists every packet; fewer on disk means the file was cut.
        return f"truncated: {found.packets} of the {stream.frames} packets the header lists"
    return ""


def _frame_order(found: _Packets, container: av.container.InputContainer) -> tuple[list[int], list[int]]:
    """``(order, pts)``: decode-order positions of the frames a full decode outputs, in
    presentation order, and their pts (empty without timestamps)."""
    keys = found.keys
    if any(k is None for k in keys):
        # No timestamps (raw elementary streams): trust packet order.
        return list(range(len(keys))), []
    order = sorted(range(len(keys)), key=keys.__getitem__)
    pts_sorted = [keys[i] for i in order]
    origin = None
    if timestamps_rank_frames(container.format.name) and found.first_frame.pts != pts_sorted[0]:
        origin = _first_output_pts(container.name)
    kept = frames_from(pts_sorted, origin)
    skipped = len(pts_sorted) - len(kept)
    return order[skipped:], kept


def _first_output_pts(path: str) -> int | None:
    """The pts of the first frame a plain sequential decode outputs.

    Only for the rare stream whose first decoded frame is not its earliest
    picture (cut mid-GOP): the probe's one-packet shortcut to the first frame
    drains the decoder, which may show a picture a full decode drops, so the
    origin is measured again the way the fallback measures it.
    """
    try:
        with av.open(open_video(path), metadata_errors="ignore", container_options=_OPEN_OPTIONS) as container:
            stream = _video_stream(container)
            packets = (p for p in container.demux(stream) if p.size)
            return first_output_pts(stream.codec_context, packets)
    except (av.FFmpegError, OSError):  # OSError: a remote read that failed
        return None


def _with_stream_facts(facts: ProbeResult, found: _Packets, container: av.container.InputContainer,
                       stream: av.video.stream.VideoStream) -> ProbeResult:  # fmt: skip
    """``facts`` completed from the packets (frames, keyframes, duration, VFR) and the first frame."""
    order, pts_sorted = _frame_order(found, container)
    keyframes = tuple(rank for rank, i in enumerate(order) if found.keyflags[i] or rank == 0)

    duration_s = None
    if pts_sorted and stream.time_base:
        last_step = found.durations[order[-1]] or (
            pts_sorted[-1] - pts_sorted[-2] if len(pts_sorted) > 1 else 0
        )
        duration_s = float((pts_sorted[-1] - pts_sorted[0] + last_step) * stream.time_base)
    elif container.duration:
        duration_s = container.duration / av.time_base

    # The decoder fills in what the headers did not (the profile of HEVC or MJPEG).
    first_frame = found.first_frame
    pix_fmt = first_frame.format.name or facts.pix_fmt
    bit_depth, chroma = pixel_layout(pix_fmt)
    return replace(
        facts,
        profile=facts.profile or stream.codec_context.profile or None,
        pix_fmt=pix_fmt,
        bit_depth=bit_depth,
        chroma=chroma,
        width=facts.width or first_frame.width,
        height=facts.height or first_frame.height,
        rotation=int(round(getattr(first_frame, "rotation", 0) or 0)),
        interlaced=facts.interlaced or bool(first_frame.interlaced_frame),
        num_frames=len(order),
        num_packets=found.packets,
        duration_s=duration_s,
        keyframes=keyframes,
        vfr=_is_vfr(pts_sorted, facts.base_fps, facts.fps),
    )
