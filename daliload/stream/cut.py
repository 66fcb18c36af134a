"""The packets a window needs: a file cut from the clean keyframe before it, for DALI to decode.

DALI's ``fn.decoders.video`` has no frame index: asked for frames ``i ..
j`` of a file it decodes from frame 0 (``docs/architecture.md``, "DALI's
video decoder"). :func:`cut_window` hands it instead a small file of the
packets the window needs, with no re-encoding, and says which frame of the
file the cut's frame 0 is::

    decode order   ... P92 B90 B91 | I96 B94* B95* P99 B97 B98 P102 ... P164 B162 B163 | P167 ...
    window         frames 100 .. 160 (keyframes every 16: the clean entry at or before 100 is 96)
    the cut        I96 P99 B97 B98 P102 ... P164 B162 B163     (Matroska, in memory)
                   frame 0 of the cut is frame 96 of the file: DALI is asked for 4 .. 64

1. The entry is the latest clean random-access packet (IDR or a recovery
   point that recovers at once for H.264, IRAP for HEVC: the rule of
   :mod:`daliload.stream.numbering`) at or before the window's first frame. The
   manifest's keyframes say where to seek (by time, so the container's own
   index is used and the file is not demuxed from its start); the packets
   after the seek say where the entry really is, so a keyframe index that is
   wrong costs only the saving, never a frame.
2. From the entry on, in decode order, up to the last packet whose frame is
   at or before the window's last frame: a B-frame is stored after the later
   frame it refers to, so that one is in. Pictures of an open GOP that are
   shown before the entry (marked * above: they lean on the previous GOP) are
   left out; nothing after the entry refers to them.
3. Frame numbers come from timestamps (constant frame rate: frame ``n`` at
   ``first_pts + n / fps``) and are checked: the cut must hold every frame from
   its entry to the window's last, once each, each packet showing a frame (DALI
   numbers packets, not frames). Anything else, and :func:`cut_window` gives
   ``None``: DALI then decodes the whole file, as before.
4. Written as Matroska, which DALI's demuxer reads for every codec the routes
   send to DALI (H.264 and HEVC get its Annex B filter there as from MP4).
5. Decodable from its packets alone: NVDEC's parser is given the packets
   through FFmpeg's Annex B filter and never the container's extradata, and
   that filter puts H.264's SPS/PPS only before IDR slices. An open-GOP
   entry (an I slice with a recovery point, x264's ``open-gop``) would reach
   it with no parameter sets and decode nothing. So the first packet of
   every H.264 and HEVC cut carries the stream's parameter sets in band
   (:func:`daliload.stream.numbering.with_parameter_sets`); a stream whose
   parameter sets cannot be found gives ``None``.

Frames the window skips between its frames (the stride) are still decoded:
DALI cannot be told to skip non-reference pictures, and leaving them out of
the cut would need each codec's bitstream parsed to tell which are unused
(the fallback asks FFmpeg for ``skip_frame``).

:func:`cut_window` is PyAV only (never DALI): the loader runs it in worker
processes through :func:`cut_task`.
"""

from __future__ import annotations

import bisect
import io
import os
from dataclasses import dataclass
from fractions import Fraction
from typing import Sequence

import av

from daliload.stream._files import open_video
from daliload.stream._remote import DEFAULT_POLICY, ReadPolicy
from daliload.stream._window import PacketsUntil, open_window, prefetch_window, remote_window
from daliload.stream.numbering import (StreamHint, first_output_pts, is_random_access, nal_length_size, seek_target,
                                       shows_frame,
                                timestamps_rank_frames, with_parameter_sets)

#: Packets read past the window's last frame, before the cut is closed: B-frames stored after a later
#: frame come at most this many packets later (x264/x265 use up to 16 reference frames).
REORDER_SLACK = 16


@dataclass(frozen=True)
class WindowCut:
    """A window's packets as a small file, and where it starts in the original.

    Attributes:
        data: a Matroska file holding the packets (decode order, original timestamps).
        first_frame: the frame of the original that is frame 0 of the cut.
        frames: frames of the cut up to the window's last frame (``last - first_frame + 1``).
    """

    data: bytes
    first_frame: int
    frames: int


def cut_window(path: str | os.PathLike, first: int, last: int, hint: StreamHint | None, *,
               policy: ReadPolicy = DEFAULT_POLICY) -> WindowCut | None:
    """The packets frames ``first .. last`` of ``path`` need, as a :class:`WindowCut` (see the module doc).

    Args:
        path: the video file.
        first, last: the window's first and last frame (0-based, presentation
            order, :mod:`daliload.stream.numbering`'s numbers), ``0 <= first <= last``.
        hint: the pre-screen's keyframes and frame rate; ``None`` (no hint: a
            variable frame rate, no keyframe index) gives ``None``.
        policy: time limit and retries of each request, for a video in a store.

    Returns:
        ``None`` when there is nothing to gain (the entry is frame 0 of a local
        file) or the cut cannot be proven exact: the caller decodes the whole file.

    Raises:
        av.FFmpegError, OSError: the file cannot be opened or read.
    """
    if hint is None or hint.unsafe_seek or not 0 <= first <= last:
        return None
    keys = hint.keyframe_indices
    from_start = keys[bisect.bisect_right(keys, first) - 1] == 0
    if from_start and not remote_window(path, hint):
        return None  # decoding starts at the file's start anyway (remote: the cut still saves the file's rest)
    # A remote video with a byte index: its header (cached) and the window's bytes, fetched at once. Else a
    # local path, checked (a FIFO put in its place would block the open), or a URI read in ranges.
    window = open_window(path, hint, (first, last), policy=policy)
    stop_at = window.stop_at if window is not None else None
    with av.open(window or open_video(path, policy=policy), metadata_errors="ignore") as src:
        if window is not None:
            window.opened()
        stream = src.streams.video[0]
        if not stream.time_base or not timestamps_rank_frames(src.format.name):
            return None
        codec = stream.codec_context.codec.canonical_name
        length_size = nal_length_size(codec, stream.codec_context.extradata)
        first_pts = hint.reads.first_pts if window is not None else _first_pts(src, stream, codec, length_size)
        if first_pts is None:
            return None
        ticks = 1 / (Fraction(hint.fps) * stream.time_base)  # stream ticks per frame
        num, den = ticks.numerator, ticks.denominator

        def index_of(pts: int) -> int:  # (pts - first_pts) / ticks to the nearest integer, in integers
            return (2 * (pts - first_pts) * den + num) // (2 * num)

        key = keys[bisect.bisect_right(keys, first) - 1]
        src.seek(seek_target(first_pts, key, ticks), stream=stream, backward=True)
        kept = _window_packets(src, stream, codec, length_size, index_of, first, last, stop_at)
        if not kept:
            return None
        base = kept[0][0]
        if (base == 0 and window is None) or sorted(i for i, _ in kept if i <= last) != list(range(base, last + 1)):
            return None  # a frame missing or twice: timestamps do not number this stream
        if not all(shows_frame(codec, packet) for _, packet in kept):
            return None  # DALI would number the packet that shows nothing as a frame
        entry = _self_contained(kept[0][1], codec, stream.codec_context.extradata, length_size)
        if entry is None:
            return None  # no parameter sets to put in band: only the whole file decodes on NVDEC
        kept[0] = (base, entry)
        buffer = io.BytesIO()
        with av.open(buffer, "w", format="matroska") as out:
            out_stream = out.add_stream_from_template(stream)
            for _, packet in kept:
                packet.stream = out_stream
                out.mux(packet)
    return WindowCut(buffer.getvalue(), base, last - base + 1)


def _self_contained(packet: av.Packet, codec: str, extradata: bytes | None,
                    length_size: int | None) -> av.Packet | None:
    """The cut's first packet with the stream's parameter sets in band (rule 5 of the module doc)."""
    data = bytes(packet)
    whole = with_parameter_sets(codec, data, extradata, length_size)
    if whole is None or whole is data:
        return None if whole is None else packet
    entry = av.Packet(whole)
    entry.pts, entry.dts, entry.time_base = packet.pts, packet.dts, packet.time_base
    entry.duration, entry.is_keyframe = packet.duration, True
    return entry


def _first_pts(src, stream, codec: str, length_size: int | None) -> int | None:
    """The pts of frame 0: that of the first packet when the stream opens on a clean entry holding its
    earliest picture (no decoding), else the first frame a decode from the start outputs."""
    head = []
    for packet in src.demux(stream):
        if packet.size and packet.pts is not None:
            head.append(packet)
            if len(head) > REORDER_SLACK:
                break
    if not head:
        return None
    if is_random_access(codec, head[0], length_size) and head[0].pts == min(p.pts for p in head):
        return head[0].pts
    src.seek(0, stream=stream, backward=True)
    stream.codec_context.flush_buffers()
    return first_output_pts(stream.codec_context, (p for p in src.demux(stream) if p.size))


def _window_packets(src, stream, codec: str, length_size: int | None, index_of, first: int,
                    last: int, stop_at: int | None = None) -> list[tuple[int, av.Packet]]:
    """``(frame, packet)`` in decode order from the latest clean entry at or before ``first`` to the last
    packet whose frame is at or before ``last``; empty when the demuxer starts after ``first``.

    ``stop_at``: the byte index's end of the window's last packet; demuxing stops at the packet ending there
    (the packets after it are not needed, and are not fetched). The checks of :func:`cut_window` still
    decide whether the cut holds every frame.
    """
    kept: list[tuple[int, av.Packet]] = []
    base = None
    past = 0
    for packet in PacketsUntil(src.demux(stream), stop_at):
        if packet.size == 0:
            continue
        if packet.pts is None:
            return []
        index = index_of(packet.pts)
        if base is None and index > first:
            return []  # the seek landed after the window's start
        if index <= first and is_random_access(codec, packet, length_size):
            kept, base = [], index  # a later clean entry still at or before the window: start there
        if base is None or index < base:
            continue  # before the entry, or an open GOP's leading picture
        kept.append((index, packet))
        past = past + 1 if index > last else 0
        if past > REORDER_SLACK:
            break
    while kept and kept[-1][0] > last:
        kept.pop()  # after the last packet the window needs, in decode order
    return kept


def prefetch_cut(item: tuple[str, Sequence[int], StreamHint | None], policy: ReadPolicy = DEFAULT_POLICY) -> None:
    """Start reading the window :func:`cut_task` will cut from a remote video with a byte index; returns at once."""
    path, frames, hint = item
    prefetch_window(path, hint, (min(frames), max(frames)), policy=policy)


def cut_task(item: tuple[str, Sequence[int], StreamHint | None], fds: Sequence[int] = (), *,
             policy: ReadPolicy = DEFAULT_POLICY) -> WindowCut | None:
    """:func:`cut_window` for a worker process: ``item`` is ``(path, frames, hint)``; ``policy`` as there.

    A file that cannot be cut (or read) gives ``None``: the caller hands DALI
    the whole file and DALI's own errors decide what happens to it.
    """
    path, frames, hint = item
    try:
        return cut_window(path, min(frames), max(frames), hint, policy=policy)
    except (av.FFmpegError, OSError, IndexError, ValueError):
        return None
