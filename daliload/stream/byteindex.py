"""Where a video's bytes lie: what a ranged read of one window needs, recorded by the scan.

A window of 16 frames at stride 4 needs about a quarter of a 300-frame file
with a keyframe every 16 frames: the packets from its entry keyframe to its
last frame, in decode order. Reading the object whole (webdataset's way), or
through a file object that FFmpeg seeks in blocks (torchcodec's), costs four
times that or many requests. The pre-screen demuxes every packet anyway, so
it records where they lie (:func:`build_byte_index`), and the remote reader
(:mod:`._window`) fetches a clip as::

    [0, head_end)                   the container's header and the first packet (what FFmpeg's open reads:
                                    its stream analysis decodes the first frame)
    [tail_start, size)              after the last packet: an index at the end (MP4's moov, Matroska's Cues)
    [key_offsets[j] - SLACK, frame_ends[last])
                                    the window: from the entry keyframe's packet (less a few bytes: Matroska
                                    seeks to the cluster that holds it) to the end of the last packet, in
                                    decode order, whose frame is at or before the window's last frame

The first two are the file's header, fetched once per file and process and
kept in a bounded cache; the third is one request. ``frame_ends[f]`` is the
largest end, over the packets showing frames ``0 .. f``: the bytes up to it
hold every packet those frames need (decode order is byte order in one
stream, which :func:`build_byte_index` checks), so a reader may stop
demuxing there. ``first_pts`` is frame 0's timestamp, so neither decoder has
to decode the file's first frame to number the others.

Nothing here is trusted for correctness: a read outside these ranges is
fetched when FFmpeg asks for it, and the decoders check every frame's
number as before. An index that is wrong costs requests, never a frame.

Stored per video in the manifest as a few hundred bytes (:meth:`ByteIndex.encode`:
unsigned LEB128 varints of the deltas; about 2 bytes a frame).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Sequence

#: Bytes read before an entry keyframe's packet: Matroska seeks to the cluster holding it, whose header
#: (ID, size, timestamp; 15 bytes from FFmpeg's muxer) comes first. MP4 seeks to the packet itself.
KEY_SLACK = 64
#: Bytes read past the window's last packet: a packet's ``pos`` and ``size`` leave out its container framing
#: (a Matroska block's own header, a few bytes), which the demuxer reads too.
END_SLACK = 64
_VERSION = 1


@dataclass(frozen=True)
class ByteIndex:
    """Where a video's packets lie, for reading one window in one request (see the module doc).

    Attributes:
        size: the file's bytes when scanned.
        head_end: end of the first packet, in decode order: ``[0, head_end)`` is what opening the file reads.
        tail_start: end of the last packet: ``[tail_start, size)`` holds what follows (an index at the end).
        key_offsets: byte offset of each keyframe's packet, in the order of the manifest's keyframes.
        frame_ends: per frame (presentation order), the end of the last packet, in decode order, among those
            showing this frame or an earlier one.
        first_pts: frame 0's timestamp, in the stream's time base.
    """

    size: int
    head_end: int
    tail_start: int
    key_offsets: tuple[int, ...]
    frame_ends: tuple[int, ...]
    first_pts: int

    def __post_init__(self) -> None:
        ends, keys = self.frame_ends, self.key_offsets
        if not (ends and keys and 0 < self.head_end <= self.tail_start <= self.size
                and all(0 <= k < self.size for k in keys) and all(b >= a for a, b in zip(ends, ends[1:]))
                and ends[0] <= self.tail_start and ends[-1] <= self.tail_start):
            raise ValueError(f"not a byte index of a {self.size}-byte file: head {self.head_end}, "
                             f"tail {self.tail_start}, {len(keys)} keyframes, {len(ends)} frames")

    def window(self, keyframes: Sequence[int], first: int, last: int) -> tuple[int, int]:
        """``(start, end)``: the bytes frames ``first .. last`` need, from their entry keyframe (see the module doc),
        with :data:`KEY_SLACK` before and :data:`END_SLACK` after.

        Args:
            keyframes: the manifest's keyframes (frame indices), ``key_offsets`` in the same order.
            first, last: the window's first and last frame, ``0 <= first <= last``; ``last`` past the end counts
                as the last frame.
        """
        j = bisect.bisect_right(keyframes, first) - 1
        start = max(0, self.key_offsets[max(j, 0)] - KEY_SLACK)
        end = min(self.frame_ends[min(last, len(self.frame_ends) - 1)] + END_SLACK, self.size)
        return start, max(end, start)

    def last_packet_end(self, last: int) -> int:
        """Where the last packet frames ``.. last`` need ends (a demuxer may stop at the packet ending there)."""
        return self.frame_ends[min(last, len(self.frame_ends) - 1)]

    def header(self) -> tuple[tuple[int, int], ...]:
        """The byte ranges outside the packets that opening and seeking read: the head, and the tail if any."""
        return ((0, self.head_end),) + (((self.tail_start, self.size),) if self.tail_start < self.size else ())

    def encode(self) -> bytes:
        """The index as bytes for the manifest (:meth:`decode` reads them)."""
        out = bytearray([_VERSION])
        values = [self.size, self.head_end, self.tail_start, _zigzag(self.first_pts), len(self.key_offsets)]
        values += _deltas(self.key_offsets) + [len(self.frame_ends)] + _deltas(self.frame_ends)
        for value in values:
            _put(out, value)
        return bytes(out)

    @classmethod
    def decode(cls, data: bytes) -> ByteIndex | None:
        """The index stored as ``data``; ``None`` for another version, or bytes that are not one."""
        if not data or data[0] != _VERSION:
            return None
        try:
            values, pos = [], 1
            while pos < len(data):
                value, pos = _get(data, pos)
                values.append(value)
            size, head_end, tail_start, pts, n_keys = values[:5]
            keys = _sums(values[5:5 + n_keys])
            n_frames = values[5 + n_keys]
            ends = _sums(values[6 + n_keys:])
            if len(keys) != n_keys or len(ends) != n_frames:
                return None
            return cls(size, head_end, tail_start, tuple(keys), tuple(ends), _unzigzag(pts))
        except (IndexError, ValueError):
            return None


def build_byte_index(size: int, positions: Sequence[int], sizes: Sequence[int], order: Sequence[int],
                     keyframes: Sequence[int], first_pts: int) -> ByteIndex | None:
    """The :class:`ByteIndex` of a scanned file, or ``None`` when its packets do not allow one.

    Args:
        size: the file's bytes.
        positions, sizes: each frame-showing packet's byte offset and size, in decode order (PyAV's
            ``packet.pos``, ``packet.size``).
        order: for each frame in presentation order, the decode-order position of its packet.
        keyframes: presentation-order frames where a decode may start (the manifest's).
        first_pts: frame 0's timestamp.

    Returns:
        ``None`` when a position is unknown (-1), the packets do not lie in decode order, or they reach past
        the file: a reader then reads the way it would without an index.
    """
    if not positions or len(positions) != len(sizes) or not order or not keyframes:
        return None
    ends = [p + s for p, s in zip(positions, sizes)]
    if positions[0] < 0 or any(b < a for a, b in zip(ends, positions[1:])) or ends[-1] > size:
        return None  # unknown, or not in byte order (interleaved oddly): no range can be trusted
    frame_ends, reach = [], 0
    for i in order:
        reach = max(reach, ends[i])
        frame_ends.append(reach)
    try:
        key_offsets = tuple(positions[order[k]] for k in keyframes)
        if any(b <= a for a, b in zip(key_offsets, key_offsets[1:])):
            return None
        tail = max(ends)
        return ByteIndex(size, min(ends[0] + END_SLACK, tail), tail, key_offsets, tuple(frame_ends), int(first_pts))
    except (IndexError, ValueError):
        return None


def _put(out: bytearray, value: int) -> None:
    if value < 0:
        raise ValueError(f"a byte index holds no negative number, got {value}")
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return


def _get(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def _deltas(values: Sequence[int]) -> list[int]:
    out = [b - a for a, b in zip((0, *values), values)]
    if any(d < 0 for d in out):
        raise ValueError(f"byte offsets must not fall, got {list(values[:8])}...")
    return out


def _sums(deltas: Sequence[int]) -> list[int]:
    out, total = [], 0
    for delta in deltas:
        total += delta
        out.append(total)
    return out


def _zigzag(value: int) -> int:
    return value * 2 if value >= 0 else -value * 2 - 1


def _unzigzag(value: int) -> int:
    return value // 2 if not value & 1 else -(value + 1) // 2
