"""The least a clip can cost to read from a store: its window's packets, plus the file's header once.

Computed here with PyAV from the local files, independently of daliload's
own byte index. For one file (:func:`packet_map`), the video packets in file
(decode) order with their byte offset (``packet.pos``), size, keyframe flag
and frame number (frame ``N`` is the packet with the ``N``-th smallest pts,
the numbering of the plan). For a window (:func:`window_bytes`) whose frames
run from ``first`` to ``last``::

    entry  = the latest keyframe packet whose frame is <= first
    finish = the last packet in decode order, from entry on, whose frame is <= last
    bytes  = finish.pos + finish.size - entry.pos      (one contiguous range of the file)

and the file's *header* is every byte outside the packet data: before the
first packet (MP4's ``moov`` when it comes first, WebM's EBML header and
tracks) and after the last one (``moov`` at the end, WebM's cues). A reader
needs the header once per file per process; the least an epoch costs is
the windows' bytes plus each file's header once (:func:`least_for_plan`).
"""

from __future__ import annotations

import bisect
import os
from dataclasses import dataclass
from typing import Iterable, Sequence


@dataclass(frozen=True)
class PacketMap:
    """One file's video packets in decode order.

    Attributes:
        size_bytes: the file's size.
        header_bytes: bytes outside the packet data (before the first packet and after the last).
        starts, ends: byte offset of each packet and of the byte after it.
        frames: each packet's frame number (presentation order).
        keys: each packet's keyframe flag.
    """

    size_bytes: int
    header_bytes: int
    starts: tuple[int, ...]
    ends: tuple[int, ...]
    frames: tuple[int, ...]
    keys: tuple[bool, ...]


def packet_map(path: str | os.PathLike) -> PacketMap:
    """Demux ``path`` (no decoding) into its :class:`PacketMap`.

    Raises:
        ValueError: no video stream, or a packet without pts or byte position (the file names it).
    """
    import av

    entries = []
    with av.open(os.fspath(path)) as container:
        if not container.streams.video:
            raise ValueError(f"{path}: no video stream")
        for packet in container.demux(container.streams.video[0]):
            if packet.size == 0 or packet.is_discard:
                continue
            if packet.pts is None or packet.pos is None or packet.pos < 0:
                raise ValueError(f"{path}: a video packet has no pts or byte position; cannot map its bytes")
            entries.append((packet.pos, packet.pos + packet.size, packet.pts, bool(packet.is_keyframe)))
    if not entries:
        raise ValueError(f"{path}: no video packets")
    rank = {pts: n for n, pts in enumerate(sorted(e[2] for e in entries))}
    size = os.path.getsize(path)
    first, last = min(e[0] for e in entries), max(e[1] for e in entries)
    return PacketMap(size_bytes=size, header_bytes=first + (size - last), starts=tuple(e[0] for e in entries),
                     ends=tuple(e[1] for e in entries), frames=tuple(rank[e[2]] for e in entries),
                     keys=tuple(e[3] for e in entries))


def window_bytes(packets: PacketMap, frame_indices: Sequence[int]) -> int:
    """Bytes from the window's entry keyframe packet to the end of the last packet it needs (module docstring).

    Worked example: keyframes at frames 0, 16, 32, ...; a window of frames
    20..80 enters at the keyframe of frame 16 and ends with the packet of
    frame 80 (no B-frames) or the last packet decoded before any frame > 80.
    """
    first, last = min(frame_indices), max(frame_indices)
    keys = sorted((frame, n) for n, (frame, key) in enumerate(zip(packets.frames, packets.keys)) if key)
    at = bisect.bisect_right(keys, (first, len(packets.frames))) - 1
    entry = keys[at][1] if at >= 0 else 0
    finish = max(n for n in range(entry, len(packets.frames)) if packets.frames[n] <= last)
    return packets.ends[finish] - packets.starts[entry]


@dataclass(frozen=True)
class Least:
    """The least one epoch of a plan can read.

    Attributes:
        clips: clips in the plan.
        window_bytes: the windows' bytes, summed.
        header_bytes: each file's header, once per file.
        file_bytes: the plan's files' sizes, once per clip (what reading every file whole costs).
    """

    clips: int
    window_bytes: int
    header_bytes: int
    file_bytes: int

    @property
    def per_clip(self) -> float:
        """Bytes per clip: windows plus headers."""
        return (self.window_bytes + self.header_bytes) / self.clips

    @property
    def windows_per_clip(self) -> float:
        return self.window_bytes / self.clips

    @property
    def file_per_clip(self) -> float:
        return self.file_bytes / self.clips


def least_for_plan(clips: Iterable[tuple[str, Sequence[int]]]) -> Least:
    """:class:`Least` of ``(local path, frame indices)`` per clip: windows plus each file's header once."""
    maps: dict[str, PacketMap] = {}
    count = windows = files = 0
    for path, indices in clips:
        if path not in maps:
            maps[path] = packet_map(path)
        count += 1
        windows += window_bytes(maps[path], indices)
        files += maps[path].size_bytes
    if count == 0:
        raise ValueError("the plan has no clips")
    return Least(clips=count, window_bytes=windows, header_bytes=sum(m.header_bytes for m in maps.values()),
                 file_bytes=files)
