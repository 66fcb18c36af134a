"""Frame numbering: which packets become frames, and where a decode may start.

Frame ``N`` of a file is the ``N``-th frame (0-based, presentation order) that a
full sequential decode of its first video stream outputs (one that, like the
``ffmpeg`` command line, goes on past decoder errors on the pictures before
the first frame, e.g. a VP9 stream cut mid-GOP). This module is the
one place that rule is written down; the pre-screen's probe (the manifest's
frame counts and keyframes) and the fallback decoder (which decoded frame is
frame ``N``) both use it, so the plan never asks for a frame the decoder
cannot produce.

A packet gets a frame index when all of these hold:

1. it shows a frame (:func:`shows_frame`): it is not empty, not cut by an MP4
   edit list (``is_discard``), not an MPEG-4 Part 2 filler (packed B-frames
   in AVI), not a hidden VP8 alt-ref frame;
2. its presentation timestamp (pts) is at or after the pts of the first frame
   the decoder outputs (:func:`frames_from`): a stream cut out of a broadcast
   may begin mid-GOP, and the pictures before its first decodable keyframe,
   or the open-GOP pictures that lean on a frame before the cut, produce no
   frame. The origin is *measured* (decode from the start until a frame comes
   out) rather than predicted, because each decoder drops different leading
   pictures (MPEG-2 skips open-GOP B-frames, HEVC skips RASL pictures, H.264
   waits for a recovery point).

Frames are then ranked by pts. Worked example, an MPEG-2 transport stream cut
mid-GOP (decode order, ``pts`` in frame periods)::

    packet   0..13   P/B of the previous GOP, pts 1..14   -> no frame
    packet   14      I (keyframe), pts 17                 -> frame 0
    packet   15, 16  open-GOP B, pts 15, 16               -> no frame (below the origin, 17)
    packet   17      P, pts 20                            -> frame 3 ...

Where a decode may start (:func:`is_random_access`): a keyframe packet that is
a clean random-access point. A container's sync-sample flag is not enough: an
H.264 I-frame that is not an IDR (and carries no recovery-point SEI) may be
followed by frames that reference pictures before it, so decoding from it
gives garbage (DALI issue #3387 is the same trap), and a recovery point with a
recovery count above 0 (periodic intra refresh) is only right frames later.
For H.264 the packet must hold an IDR slice or a recovery point that recovers
at once, for HEVC an IRAP picture (IDR, CRA or BLA); other codecs trust the
flag (FFmpeg's parsers set it from the bitstream), and the fallback still
checks the decoder's output after every entry (:mod:`fallback.decode`).

How DALI numbers frames (DALI 2.4, ``frames_decoder_base.cc``): it indexes
*every* packet of the stream, sorted by pts (a packet that shows no frame
still gets an index), marks as keyframes the flagged packets (for H.264 only
those with an IDR NAL unit, for HEVC only IRAP ones), seeks to the keyframe at
or before the wanted index and then counts the frames the decoder outputs. So
DALI's frame ``N`` is the full decode's frame ``N`` only when every packet
shows a frame; the pre-screen records both counts and routes files where they
differ away from DALI.

:func:`probe_hint` builds a file's :class:`StreamHint` by demuxing it (the
pre-screen records the same facts in the manifest).
"""

from __future__ import annotations

import bisect
import math
import os
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Iterable

import av
import av.error

from daliload.stream._files import open_video
from daliload.stream.byteindex import ByteIndex
from daliload.stream.errors import DecodeError, describe

#: VOP start code of MPEG-4 Part 2; a packet without one yields no frame.
_MPEG4_VOP_START = b"\x00\x00\x01\xb6"
#: Packets at least this large surely carry a picture; only smaller ones are inspected.
_MPEG4_FILLER_MAX_BYTES = 16
#: H.264 NAL unit types: IDR slice, SEI; SEI payload type of a recovery point.
_H264_IDR, _H264_SEI, _H264_RECOVERY_POINT = 5, 6, 6
#: HEVC NAL unit types of IRAP pictures (BLA_W_LP .. CRA_NUT).
_HEVC_IRAP = range(16, 22)
#: NAL unit types of the parameter sets a decoder needs before a picture: H.264 SPS, PPS; HEVC VPS, SPS, PPS.
_PARAMETER_SETS = {"h264": frozenset((7, 8)), "hevc": frozenset((32, 33, 34))}
#: Decoders output a stream's first frame within this many packets (reorder
#: delay plus the pictures of a GOP cut in half); past that the stream has no origin.
_MAX_PACKETS_TO_FIRST_FRAME = 600


def timestamps_rank_frames(container_format: str) -> bool:
    """Whether packet timestamps give presentation order in this container.

    AVI stores decode-order counters, not presentation times (packed B-frames
    come out with shuffled pts): there frames are counted as the decoder
    outputs them, and no origin is measured.
    """
    return "avi" not in container_format.split(",")


def shows_frame(codec: str, packet: av.Packet) -> bool:
    """Whether decoding this packet of a ``codec`` stream shows a frame (rule 1 above)."""
    if packet.size == 0 or packet.is_discard:
        return False
    if codec == "mpeg4" and packet.size < _MPEG4_FILLER_MAX_BYTES:
        return _MPEG4_VOP_START in bytes(packet)
    if codec == "vp8":
        # VP8 frame tag, byte 0: bit 4 is show_frame (RFC 6386, section 9.1).
        return bool(memoryview(packet)[0] & 0x10)
    return True


def frames_from(sorted_pts: list[int], origin_pts: int | None) -> list[int]:
    """The pts of the frames a full decode outputs: those at or after the first output (rule 2).

    An origin that no packet has (a decoder that makes timestamps up) says
    nothing about which packets were dropped: then every frame counts.

    >>> frames_from([15, 16, 17, 18, 20], 17)
    [17, 18, 20]
    """
    start = bisect.bisect_left(sorted_pts, origin_pts) if origin_pts is not None else 0
    if start == len(sorted_pts) or sorted_pts[start] != origin_pts:
        return sorted_pts
    return sorted_pts[start:]


def nal_length_size(codec: str, extradata: bytes | None) -> int | None:
    """Bytes of the length prefix of H.264/HEVC NAL units in packets, ``None`` for Annex B
    start codes (MPEG-TS, raw streams) or other codecs."""
    if not extradata or extradata[:3] in (b"\x00\x00\x01", b"\x00\x00\x00"):
        return None
    if codec == "h264" and len(extradata) > 4 and extradata[0] == 1:  # avcC
        return (extradata[4] & 3) + 1
    if codec == "hevc" and len(extradata) > 21 and extradata[0] == 1:  # hvcC
        return (extradata[21] & 3) + 1
    return None


def is_random_access(codec: str, packet: av.Packet, length_size: int | None) -> bool:
    """Whether a decode may start at this packet and output correct frames from it on."""
    if not packet.is_keyframe:
        return False
    if codec not in ("h264", "hevc"):
        return True
    data = bytes(packet)
    units = _nal_units(data, length_size)
    if codec == "hevc":
        return any(_nal_type(codec, unit) in _HEVC_IRAP for unit in units if unit)
    for unit in units:
        if not unit:
            continue
        kind = _nal_type(codec, unit)
        if kind == _H264_IDR or (kind == _H264_SEI and _recovers_at_once(unit[1:])):
            return True
    return False


def _nal_type(codec: str, unit: bytes) -> int:
    return (unit[0] >> 1) & 0x3F if codec == "hevc" else unit[0] & 0x1F


def with_parameter_sets(codec: str, data: bytes, extradata: bytes | None, length_size: int | None) -> bytes | None:
    """``data`` (an H.264/HEVC packet) with the stream's parameter sets in band in front, as its own units are.

    A decode that starts at this packet then needs nothing from the
    container. That is what NVDEC's parser is given by DALI: packets only,
    through FFmpeg's ``h264_mp4toannexb``, which inserts the avcC's SPS/PPS
    before IDR slices only. An open-GOP H.264 entry (an I slice with a
    recovery point) would reach the parser with no SPS/PPS, decode nothing,
    and DALI would hand back whatever its buffer held. ``hevc_mp4toannexb``
    adds them before every IRAP, so HEVC is safe there; it gets them in band
    too, so that no cut depends on which filter reads it.

    Returns ``data`` unchanged when it holds every kind of parameter set
    already or the codec needs none; ``None`` when it needs some and the
    extradata holds none this module can read (the caller must not start a
    decode here).
    """
    needed = _PARAMETER_SETS.get(codec)
    if needed is None:
        return data
    if needed <= {_nal_type(codec, unit) for unit in _nal_units(data, length_size) if unit}:
        return data
    units = _extradata_units(codec, extradata or b"", length_size)
    if not needed <= {_nal_type(codec, unit) for unit in units}:
        return None
    if length_size is None:
        prefix = b"".join(b"\x00\x00\x00\x01" + unit for unit in units)
    else:
        prefix = b"".join(len(unit).to_bytes(length_size, "big") + unit for unit in units)
    return prefix + data


def _extradata_units(codec: str, extradata: bytes, length_size: int | None) -> list[bytes]:
    """The parameter-set NAL units of an avcC / hvcC record, or of Annex B extradata."""
    wanted = _PARAMETER_SETS[codec]
    if length_size is None:  # Annex B extradata (MPEG-TS, raw streams): units between start codes
        units = _nal_units(extradata, None) if extradata[:3] in (b"\x00\x00\x01", b"\x00\x00\x00") else []
        return [unit for unit in units if unit and _nal_type(codec, unit) in wanted]
    units: list[bytes] = []
    try:
        if codec == "h264":  # avcC: 5 header bytes; SPS count (low 5 bits), SPSs; PPS count, PPSs (16-bit sizes)
            pos = 5
            for mask in (0x1F, 0xFF):
                count, pos = extradata[pos] & mask, pos + 1
                for _ in range(count):
                    size = int.from_bytes(extradata[pos:pos + 2], "big")
                    units.append(extradata[pos + 2:pos + 2 + size])
                    pos += 2 + size
        else:  # hvcC: 22 header bytes; array count; per array: type, unit count, units (16-bit sizes)
            pos = 23
            for _ in range(extradata[22]):
                count, pos = int.from_bytes(extradata[pos + 1:pos + 3], "big"), pos + 3
                for _ in range(count):
                    size = int.from_bytes(extradata[pos:pos + 2], "big")
                    units.append(extradata[pos + 2:pos + 2 + size])
                    pos += 2 + size
    except IndexError:
        return []
    if any(not unit for unit in units) or pos > len(extradata):
        return []  # a record cut short: its units cannot be trusted
    return [unit for unit in units if _nal_type(codec, unit) in wanted]


def _nal_units(data: bytes, length_size: int | None) -> list[bytes]:
    if length_size is None:  # Annex B: units between 00 00 01 start codes
        return [part.lstrip(b"\x00") for part in data.split(b"\x00\x00\x01")[1:]]
    units, pos = [], 0
    while pos + length_size <= len(data):
        size = int.from_bytes(data[pos:pos + length_size], "big")
        pos += length_size
        if size <= 0 or pos + size > len(data):
            break
        units.append(data[pos:pos + size])
        pos += size
    return units


def _recovers_at_once(sei: bytes) -> bool:
    """Whether an H.264 SEI NAL unit holds a recovery point with ``recovery_frame_cnt == 0``.

    A larger count (x264's periodic intra refresh) means the pictures are
    only right that many frames later: not an entry for a window.
    ``recovery_frame_cnt`` is the first ue(v) field: 0 is a single 1 bit.
    """
    first = _sei_payloads(sei).get(_H264_RECOVERY_POINT)
    return bool(first and first[0] & 0x80)


def _sei_payloads(payload: bytes) -> dict[int, bytes]:
    """The SEI messages in an H.264 SEI NAL unit (without its header): type -> payload."""
    types, pos = {}, 0
    while pos < len(payload) and payload[pos] != 0x80:  # 0x80: rbsp trailing bits
        kind = size = 0
        while pos < len(payload) and payload[pos] == 0xFF:
            kind, pos = kind + 255, pos + 1
        if pos >= len(payload):
            break
        kind, pos = kind + payload[pos], pos + 1
        while pos < len(payload) and payload[pos] == 0xFF:
            size, pos = size + 255, pos + 1
        if pos >= len(payload):
            break
        size, pos = size + payload[pos], pos + 1
        types[kind] = payload[pos:pos + size]
        pos += size
    return types


def first_output_pts(ctx, packets: Iterable[av.Packet], check: Callable[[], None] | None = None) -> int | None:
    """Decode ``packets`` (the stream from its start) until a frame comes out; that frame's pts.

    Errors from the pictures before the first decodable one are what a full
    decode meets too, so they are passed over. The decoder is flushed
    afterwards, ready for a fresh start. ``None``: no frame, or no pts on it.
    """
    try:
        for count, packet in enumerate(packets):
            if check is not None:
                check()
            try:
                frames = ctx.decode(packet)
            except av.error.InvalidDataError:
                frames = []
            if frames:
                return frames[0].pts
            if count >= _MAX_PACKETS_TO_FIRST_FRAME:
                return None
        try:
            frames = ctx.decode(None)
        except av.error.InvalidDataError:
            frames = []
        return frames[0].pts if frames else None
    finally:
        ctx.flush_buffers()


@dataclass
class FrameTable:
    """A video stream's packets in decode order, each frame's presentation rank and the entries.

    Attributes:
        packets: every non-empty packet, decode order.
        frame_pts: ascending pts of the packets that get a frame index.
        rank: pts -> frame index.
        entries: decode-order positions of the clean random-access packets
            (see :func:`is_random_access`).
    """

    packets: list
    frame_pts: list[int]
    rank: dict[int, int]
    entries: list[int]

    @classmethod
    def demux(cls, container, stream, check: Callable[[], None] | None = None) -> "FrameTable | None":
        """Read every packet of ``stream``; measure the origin (decode until the first frame)
        unless the stream opens on a clean entry that holds its earliest picture.

        Returns ``None`` when timestamps cannot rank frames (a packet without
        pts, two frames with one pts, a first frame without pts).
        """
        codec = stream.codec_context.codec.canonical_name
        length_size = nal_length_size(codec, stream.codec_context.extradata)
        packets, shown, entries = [], [], []
        for packet in container.demux(stream):
            if check is not None:
                check()
            if packet.size == 0:
                continue  # the demuxer's end-of-stream flush packet
            if packet.pts is None:
                return None
            if is_random_access(codec, packet, length_size):
                entries.append(len(packets))
            packets.append(packet)
            if shows_frame(codec, packet):
                shown.append(packet.pts)
        shown.sort()
        if len(set(shown)) != len(shown):
            return None  # duplicate timestamps
        origin = None
        # A stream that opens on a clean entry holding its earliest picture shows that
        # picture first: nothing to measure (the common case, and no decoding).
        opens_clean = bool(entries) and entries[0] == 0 and bool(shown) and packets[0].pts == shown[0]
        if packets and not opens_clean:
            origin = first_output_pts(stream.codec_context, packets, check)
            if origin is None:
                return None
        frame_pts = frames_from(shown, origin)
        return cls(packets, frame_pts, {pts: i for i, pts in enumerate(frame_pts)}, entries)

    def index_at_or_before(self, pts: int) -> int:
        return max(0, bisect.bisect_right(self.frame_pts, pts) - 1)

    def keyframe_indices(self) -> list[int]:
        """Frame indices of the clean entries (0 always included)."""
        keys = {self.index_at_or_before(self.packets[pos].pts) for pos in self.entries}
        return sorted(keys | {0})

    def entry_candidates(self, first_frame: int) -> list[int]:
        """Where to start decoding for frame ``first_frame``: decode-order positions, best first.

        The latest clean entry whose picture is at or before the frame, then
        the one before it, then the start of the file (always last).
        """
        target = self.frame_pts[first_frame]
        usable = [pos for pos in self.entries if pos > 0 and self.packets[pos].pts <= target]
        usable.sort(key=lambda pos: self.packets[pos].pts)
        return usable[::-1][:2] + [0]


def seek_target(first_pts: int, key: int, ticks: Fraction) -> int:
    """The timestamp to seek to (backward) to land on keyframe ``key``: the latest one frame ``key`` may have.

    Frame ``n`` is the frame whose pts is nearest ``first_pts + n * ticks``
    (``ticks``: stream ticks per frame), so its pts is below
    ``first_pts + (n + 1/2) * ticks``. Seeking to the largest such pts lands
    on keyframe ``key`` even where the time base does not hold a frame's
    duration exactly (Matroska's milliseconds: frame 128 at 30 fps is at
    4267, past ``floor(128 * 33.3) = 4266``, where a seek lands a whole GOP earlier).
    """
    return first_pts + math.ceil((key + Fraction(1, 2)) * ticks) - 1


@dataclass(frozen=True)
class StreamHint:
    """What the pre-screen knows about a video stream, to seek without demuxing it all.

    Only for constant-frame-rate streams: frame ``N`` is expected at
    ``first_pts + N / fps``. A hint that turns out wrong (the seek lands after
    the window) is ignored and the file is decoded the exact way.

    Attributes:
        keyframe_indices: presentation-order frame indices of the keyframes,
            ascending; must include 0.
        fps: frames per second.
        num_frames: frames in the video, if known (lets short windows past the
            end be clamped up front).
        unsafe_seek: decoding from a keyframe after the start gives wrong
            frames (the pre-screen's ``--deep`` check found it): every window
            is decoded from the start of the file.
        reads: where the packets lie (:class:`~daliload.stream.byteindex.ByteIndex`,
            from the manifest), so a remote window is read in one request;
            ``None``: none was recorded, or the video is local.
        rotation: the display rotation the scan found (degrees); ``None``:
            unknown. With 0 the fallback opens the file without decoding its
            first frames to probe it (``fallback.decode``: such an open loses
            the display matrix, so only an unrotated file is opened so).
    """

    keyframe_indices: tuple[int, ...]
    fps: Fraction | float
    num_frames: int | None = None
    unsafe_seek: bool = False
    reads: ByteIndex | None = None
    rotation: int | None = None

    def __post_init__(self) -> None:
        keys = tuple(int(k) for k in self.keyframe_indices)
        if not keys or keys[0] != 0 or any(b <= a for a, b in zip(keys, keys[1:])):
            raise ValueError(
                f"keyframe_indices must be ascending, unique and start at 0, got {self.keyframe_indices[:8]}")
        if not float(self.fps) > 0:
            raise ValueError(f"fps must be > 0, got {self.fps}")
        if self.num_frames is not None and self.num_frames < 1:
            raise ValueError(f"num_frames must be >= 1 or None, got {self.num_frames}")
        object.__setattr__(self, "keyframe_indices", keys)
        if self.reads is not None and len(self.reads.key_offsets) != len(keys):
            object.__setattr__(self, "reads", None)  # not this keyframe list's: read without it


def probe_hint(path: str | os.PathLike) -> StreamHint:
    """Build the :class:`StreamHint` of a constant-frame-rate file by demuxing it.

    The pre-screen records the same facts; this is for tests and one-off use.

    Raises:
        DecodeError: the file cannot be opened or demuxed, has no video
            stream, no timestamped frames or no frame rate.
    """
    path_str = os.fspath(path)
    try:
        container = av.open(open_video(path_str), metadata_errors="ignore")
    except (av.error.FFmpegError, OSError, ValueError) as err:
        raise DecodeError(path_str, f"cannot open: {describe(err, path_str)}") from err
    with container:
        if not container.streams.video:
            raise DecodeError(path_str, "no video stream")
        try:
            stream = container.streams.video[0]
            table = FrameTable.demux(container, stream)
            rate = stream.average_rate or stream.guessed_rate
        except (av.error.FFmpegError, OSError, ValueError) as err:
            raise DecodeError(path_str, f"cannot demux: {describe(err, path_str)}") from err
    if table is None or not table.frame_pts:
        raise DecodeError(path_str, "no frames with usable timestamps")
    if not rate:
        raise DecodeError(path_str, "stream has no frame rate")
    return StreamHint(keyframe_indices=tuple(table.keyframe_indices()), fps=Fraction(rate),
                      num_frames=len(table.frame_pts))
