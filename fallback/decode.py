"""Decode one clip window with PyAV: only the frames the window needs.

Frame ``N`` is the ``N``-th frame (0-based) that a full sequential decode of the
file's first video stream outputs, in presentation order: what the frame code
of a generated clip says, and what DALI's ``fn.decoders.video`` calls frame
``N`` on the files the pre-screen routes to it (:mod:`daliload.stream.numbering` says
when the two differ). :func:`decode_window` finds those frames without
decoding the file from the start:

1. Demux the video stream's packets (cheap: no decoding) and number the
   frames by the one rule of :mod:`daliload.stream.numbering`, which the pre-screen's
   frame counts follow too: packets that show no frame (edit-list discards,
   hidden VP8 frames, MPEG-4 fillers) and pictures before the first frame the
   decoder outputs (a stream cut mid-GOP) get no index; the others are ranked
   by presentation timestamp (pts). B-frames, a non-zero start time and
   timestamp gaps need nothing special.
2. Start decoding at the clean random-access point at or before the window's
   first frame and stop as soon as the decoder has output the window's last
   frame.
3. Frames that nothing references and that the clip does not use (non-reference
   B-frames before and between the clip's frames) are not decoded at all:
   FFmpeg's ``skip_frame = NONREF`` is switched on packet by packet.
4. Only the frames the clip uses are converted to RGB.
5. A decode that started after the file's first packet is checked, not
   trusted: a decoder error, a frame the decoder flags corrupt, or a wanted
   frame that never comes out means the entry point was not a clean random
   access point (a sync sample that is not an IDR, damage after it). The
   window is then decoded again from the entry before it, and in the end from
   the start of the file, and :attr:`DecodedClip.seek_unsafe` says so. The
   process remembers the file (its later windows start at the start); the
   pre-screen's ``--deep`` check records such files in the manifest, and a
   :class:`StreamHint` with ``unsafe_seek=True`` does the same across runs.

Worked example, a 300-frame H.264 file with keyframes at frames 0 and 250 and
``frame_indices = [252, 256, ..., 312]`` (16 frames at stride 4)::

    decode from the keyframe packet of frame 250 (frames 0-249 untouched)
    frames 250..299 are output; 252, 256, ..., 296 are converted to RGB
    312, 308, 304, 300 lie past the last frame (299): they repeat frame 299
    -> DecodedClip(frames (16, H, W, 3), video_num_frames=300,
                   num_frames_decoded = 50 minus the skipped non-reference frames)

Without timestamps that rank frames (raw streams, AVI): a sequential decode from the start, counting frames.

Given the scan's frame count (``num_frames``), a window past what the file decodes *now* fails instead of
being padded: a 300-frame file truncated since to 120 frames raises ``DecodeError`` ("decoded only 120 of 300
frames"), not 16 copies of frame 119; padding past the scan's count stays the plan's (``[296, 300] -> 296, 299``).

A :class:`StreamHint` (keyframes and frame rate, from the pre-screen) enters a long constant-rate file by a
seek; with a byte index (a remote video) the header and the window's bytes come in one go
(:func:`daliload.stream.open_window`) and the packets stop at the window's last. A rotated file comes out
upright (FFmpeg's rule, quarter turns). Numbering, random access and :class:`StreamHint` live in
:mod:`daliload.stream.numbering`, :class:`DecodeError` in :mod:`daliload.stream.errors`; here are the three
strategies (hint, packet table, counting), their decode loop and assembly.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import os
import time
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Iterator, Sequence

import av
import av.error
import numpy as np
from av.video.reformatter import Colorspace, VideoReformatter

from daliload.plan import clamp_frame_indices
from daliload.stream import (DEFAULT_POLICY, PacketsUntil, ReadPolicy, WindowFile, open_video, open_window,
                             remote_window)
from daliload.stream.errors import DecodeError, describe
from daliload.stream.numbering import FrameTable, StreamHint, first_output_pts, seek_target, timestamps_rank_frames

logger = logging.getLogger(__name__)

#: Files whose keyframes once failed to start a decode here: later windows start at the start (as unsafe_seek).
_UNSAFE_SEEK: set[str] = set()
_UNSAFE_SEEK_MAX = 100_000

#: ``av.open``'s probe decoders for a file the scan found unrotated: keyframes only. The probe otherwise decodes first
#: frames (23 of a 1280x720 H.264 open's 23.3 ms on the 2-core VM); skipping them drops the display matrix.
_SKIM = [{"skip_frame": "nonkey"}] * 64  # one entry a stream; a stream past the list is probed as before

#: Decoders for which switching ``skip_frame`` packet by packet is checked to skip exactly the packet's own frame.
#: Not AV1: libdav1d applies it to whichever frame it outputs next (and AV1 packets may carry hidden frames), so a
#: wanted frame went missing; AV1 files decode every frame.
SKIP_NONREF_DECODERS = frozenset({"h264", "hevc", "mpeg4", "vp8", "vp9"})


@dataclass(frozen=True)
class DecodedClip:
    """The frames of one window.

    Attributes:
        frames: ``(T, H, W, 3)`` uint8 RGB, upright (a display rotation applied), one per requested
            index, in order; indices past the last frame repeat it.
        num_frames_decoded: frames the decoder actually produced for this window (window frames plus
            GOP waste; skipped frames not counted).
        video_num_frames: frames in the video, or ``None`` when the decode stopped before the end was
            known (hint path on a long file).
        seek_unsafe: the window was decoded from an earlier entry point than the nearest keyframe (or
            from the start), because that keyframe gave wrong or no frames, or the file is known to
            (the hint, or an earlier window in this process).
    """

    frames: np.ndarray = field(repr=False)
    num_frames_decoded: int
    video_num_frames: int | None
    seek_unsafe: bool = False


class _UnsafeEntry(Exception):
    """Decoding from a keyframe after the file's start gave wrong or no frames."""


def decode_window(
    path: str | os.PathLike,
    frame_indices: Sequence[int],
    *,
    threads: int = 1,
    skip_nonref: bool = True,
    timeout_s: float | None = None,
    hint: StreamHint | None = None,
    num_frames: int | None = None,
    policy: ReadPolicy = DEFAULT_POLICY,
) -> DecodedClip:
    """Decode the frames ``frame_indices`` of the first video stream of ``path``.

    Args:
        path: the video file.
        frame_indices: 0-based presentation-order frame indices, any order,
            repeats allowed. Indices past the last frame repeat the last frame
            (edge padding), so a 40-frame video asked for ``[30, 38, 46]``
            gives frames ``30, 38, 39``.
        threads: FFmpeg decoder threads (frame threading when > 1). The
            default 1 is the right choice under multi-process loading: two
            processes with one thread each beat one process with two threads.
        skip_nonref: skip decoding non-reference frames the clip does not use.
        timeout_s: give up (``DecodeError`` "timeout ...") when decoding takes
            longer than this many seconds; checked between packets, and passed
            to FFmpeg's I/O so a blocking read is cut too. ``None``: no limit.
            A decode stuck inside FFmpeg cannot be cut from the same process:
            :class:`fallback.source.FallbackSource` kills such a worker instead.
        hint: optional :class:`StreamHint` to enter a long file by seeking.
        num_frames: the frames the file had when it was scanned (the
            manifest's count the plan was made from), or ``None``. Indices
            past it repeat its last frame (the plan's own padding); an index
            below it that the file no longer has is an error, not padding with
            whatever frame is last now.
        policy: time limit and retries of each request, for a video in a store.

    Returns:
        :class:`DecodedClip` with ``len(frame_indices)`` frames.

    Raises:
        ValueError: ``frame_indices`` is empty or has a negative index,
            ``threads`` < 1, or ``num_frames`` < 1.
        DecodeError: the file cannot be opened, has no video stream, has no
            decodable frame, a needed frame is missing or flagged corrupt even
            when decoding from the start, the file decodes fewer than
            ``num_frames`` frames and the window needs one it lacks (truncated
            since the scan), or the timeout passed.
    """
    path_str = os.fspath(path)
    wanted = [int(i) for i in frame_indices]
    if not wanted:
        raise ValueError(f"{path_str}: frame_indices is empty")
    if min(wanted) < 0:
        raise ValueError(f"{path_str}: frame indices must be >= 0, got {min(wanted)}")
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    if num_frames is not None:
        if num_frames < 1:
            raise ValueError(f"{path_str}: num_frames must be >= 1 or None, got {num_frames}")
        wanted = clamp_frame_indices(wanted, num_frames)  # the plan's padding: against the scan's count
    job = _Window(path_str, wanted, threads=threads, skip_nonref=skip_nonref,
                  deadline=None if timeout_s is None else time.monotonic() + timeout_s,
                  timeout_s=timeout_s,
                  unsafe_seek=(hint is not None and hint.unsafe_seek) or path_str in _UNSAFE_SEEK,
                  scanned_frames=num_frames, reads=hint, policy=policy)
    # Each strategy gets a fresh container: a seek back to the start is not exact with edit lists. A hint that
    # cannot skip anything (the window's keyframe is the first of a local file, or the file is unsafe to seek)
    # opens none: an open costs a few milliseconds, as much as RGB-converting a whole clip.
    skips = job.hint_window(hint)[1] > 0 or remote_window(path_str, hint) if hint is not None else False
    strategies = ([job.by_hint] if skips and not job.unsafe_seek else []) + [job.by_index, job.by_counting]
    for strategy in strategies:
        try:
            with job.open() as container:
                result = strategy(container, hint) if strategy == job.by_hint else strategy(container)
        except DecodeError:
            raise
        except av.error.ExitError as err:  # FFmpeg's I/O interrupted at the time limit
            raise DecodeError(path_str, job.timeout_reason(), "timeout") from err
        except (av.error.FFmpegError, OSError, ValueError) as err:
            raise DecodeError(path_str, f"decode failed: {describe(err, path_str)}") from err
        if result is not None:
            if result.video_num_frames is not None:
                job.check_still_has(result.video_num_frames)  # the padding would be the file's, not the plan's
            return result
        logger.debug("%s: %s does not fit this file, trying the next way", path_str, strategy.__name__)
    raise AssertionError("by_counting always returns a result or raises")  # pragma: no cover


# --------------------------------------------------------------------------------------
# internals


class _Window:
    """One window request and the three ways to serve it (see the module docstring)."""

    def __init__(self, path: str, wanted: list[int], *, threads: int = 1, skip_nonref: bool = True,
                 deadline: float | None = None, timeout_s: float | None = None,
                 unsafe_seek: bool = False, scanned_frames: int | None = None,
                 reads: StreamHint | None = None, policy: ReadPolicy = DEFAULT_POLICY) -> None:  # fmt: skip
        self.path, self.policy = path, policy
        self.skim = reads is not None and reads.rotation == 0  # the scan says unrotated: probe keyframes only
        self.reads, self.window_file = None if unsafe_seek else reads, None  # a remote window: read in one go
        self.wanted, self.threads, self.skip_nonref = wanted, threads, skip_nonref
        self.deadline, self.timeout_s, self.unsafe_seek = deadline, timeout_s, unsafe_seek
        self.scanned_frames = scanned_frames
        self.decoded = 0
        self.rotation = 0  # the display rotation of the frames converted (FFmpeg's sign)
        self.reformatter = VideoReformatter()

    def open(self):
        try:
            # A local path is checked first (a FIFO would block the open); a URI is read in ranges, timed.
            window = self._window_file()
            source = window or open_video(self.path, policy=self.policy, deadline=self.deadline)
            container = av.open(source, metadata_errors="ignore", timeout=self.timeout_s,
                                stream_options=_SKIM if self.skim else None)
            if window is not None:
                window.opened()
        except av.error.ExitError as err:
            raise DecodeError(self.path, self.timeout_reason(), "timeout") from err
        except (av.error.FFmpegError, OSError, ValueError) as err:
            raise DecodeError(self.path, f"cannot open: {describe(err, self.path)}") from err
        if not container.streams.video:
            container.close()
            raise DecodeError(self.path, "no video stream")
        self.decoded = 0
        ctx = container.streams.video[0].codec_context
        ctx.thread_count = self.threads
        if self.threads > 1:
            ctx.thread_type = "FRAME"  # slice threading never helps these streams (docs/architecture.md, Facts)
        return container

    def _window_file(self) -> WindowFile | None:
        """A remote video with a byte index: its header and window, fetched once for every strategy; else None."""
        if self.window_file is None and self.reads is not None:
            self.window_file = open_window(self.path, self.reads, self.wanted, policy=self.policy,
                                           deadline=self.deadline)
        if self.window_file is not None:
            self.window_file.seek(0)
        return self.window_file

    # -- strategy 1: timestamps ranked from the demuxed packets (exact) ------------

    def by_index(self, container) -> DecodedClip | None:
        if not timestamps_rank_frames(container.format.name):
            return None  # AVI: count instead
        stream = container.streams.video[0]
        table = FrameTable.demux(container, stream, self._check_deadline)
        if table is None:
            return None
        num_frames = len(table.frame_pts)
        if num_frames == 0:
            raise DecodeError(self.path, "no video frames")
        self.check_still_has(num_frames)  # before decoding: a truncated file's last frames may be damaged too
        wanted = clamp_frame_indices(self.wanted, num_frames)
        entries = [0] if self.unsafe_seek else table.entry_candidates(min(wanted))
        for attempt, entry in enumerate(entries):
            stream.codec_context.flush_buffers()
            try:
                decoded = self._decode(stream, table.packets[entry:], table.rank.get, wanted, checked=entry > 0)
                if decoded is None:
                    return None
                got, last_frame, reached_end = decoded
                frames, end = self._assemble(wanted, got, last_frame, reached_end, checked=entry > 0)
            except _UnsafeEntry as unsafe:
                logger.info("%s: decoding from packet %d is not exact (%s); starting earlier",
                            self.path, entry, unsafe)
                continue
            if attempt > 0 and len(_UNSAFE_SEEK) < _UNSAFE_SEEK_MAX:
                _UNSAFE_SEEK.add(self.path)
            return DecodedClip(frames, self.decoded, num_frames if end is None else end + 1,
                               seek_unsafe=attempt > 0 or self.unsafe_seek)
        raise AssertionError("the last entry (the file's start) never raises _UnsafeEntry")  # pragma: no cover

    # -- strategy 2: seek by the pre-screen's hint (constant frame rate) -----------

    def hint_window(self, hint: StreamHint) -> tuple[list[int], int]:
        """The window clamped to the hint's frame count, and the hint's keyframe at or before its first frame."""
        wanted = self.wanted if hint.num_frames is None else clamp_frame_indices(self.wanted, hint.num_frames)
        keys = hint.keyframe_indices
        return wanted, keys[bisect.bisect_right(keys, min(wanted)) - 1]

    def by_hint(self, container, hint: StreamHint) -> DecodedClip | None:
        stream = container.streams.video[0]
        wanted, key = self.hint_window(hint)
        if (key == 0 and self.window_file is None) or self.unsafe_seek or not stream.time_base \
                or not timestamps_rank_frames(container.format.name):
            return None  # nothing to skip, seeking is unsafe, or no usable timestamps
        ticks_per_frame = 1 / (Fraction(hint.fps) * stream.time_base)
        num, den = ticks_per_frame.numerator, ticks_per_frame.denominator

        def index_of(pts: int | None) -> int | None:
            # (pts - first_pts) / ticks_per_frame to the nearest integer, in integers: Fraction
            # arithmetic took ~10 us a call, and it is called once per packet and per frame.
            return None if pts is None else (2 * (pts - first_pts) * den + num) // (2 * num)

        window = self.window_file
        if window is not None:
            first_pts = hint.reads.first_pts  # the scan's: no decode of the file's first frame
        else:
            packets = (p for p in container.demux(stream) if p.size > 0)
            first_pts = first_output_pts(stream.codec_context, packets, self._check_deadline)
        if first_pts is None:
            return None
        container.seek(seek_target(first_pts, key, ticks_per_frame), stream=stream, backward=True)
        stream.codec_context.flush_buffers()
        packets = PacketsUntil((p for p in container.demux(stream) if p.size > 0),
                         window.stop_at if window is not None else None)
        try:
            decoded = self._decode(stream, packets, index_of, wanted, must_enter_by=min(wanted), checked=True)
            if decoded is None:
                return None
            got, last_frame, reached_end = decoded
            if reached_end and packets.stopped:
                return None  # the byte index ended the packets before the window's last frame: the exact way
            frames, end = self._assemble(wanted, got, last_frame, reached_end, checked=True)
        except _UnsafeEntry as unsafe:
            logger.info("%s: decoding from keyframe %d is not exact (%s)", self.path, key, unsafe)
            return None  # the exact path backs off to an earlier entry
        return DecodedClip(frames, self.decoded, hint.num_frames if end is None else end + 1)

    # -- strategy 3: count frames from the start (exact by definition) -------------

    def by_counting(self, container) -> DecodedClip:
        stream = container.streams.video[0]
        ctx = stream.codec_context
        want, last = set(self.wanted), max(self.wanted)
        got: dict = {}  # frame index -> rgb24 av.VideoFrame
        index, frame = -1, None
        for frame in self._all_frames(container, stream):
            index += 1
            if index in want:
                self._refuse_corrupt(frame, index)
                got[index] = self._rgb(frame)
            if index >= last:
                break
        if index < 0:
            raise DecodeError(self.path, "no video frames")
        reached_end = index < last
        frames, end = self._assemble(self.wanted, got, (index, frame), reached_end)
        ctx.skip_frame = "DEFAULT"
        return DecodedClip(frames, self.decoded, None if end is None else end + 1)

    def _all_frames(self, container, stream) -> Iterator:
        ctx = stream.codec_context
        for packet in container.demux(stream):
            self._check_deadline()
            try:
                frames = ctx.decode(packet if packet.size else None)
            except av.error.InvalidDataError:
                if self.decoded:
                    raise
                continue  # pictures before the first frame (a cut stream): no frame, as in a full decode
            for frame in frames:
                self.decoded += 1
                yield frame

    # -- shared ---------------------------------------------------------------------

    def _decode(self, stream, packets, index_of, wanted, *, must_enter_by=None, checked=False):
        """Decode ``packets`` until the last wanted frame is out.

        Returns ``(got, last_frame, reached_end)`` or ``None`` when the
        decoder's output contradicts ``index_of`` (timestamps that do not rank
        frames): the caller then tries the next strategy. With ``checked``
        (the decode did not start at the file's first packet), a decoder
        error or a frame flagged corrupt raises :class:`_UnsafeEntry`.
        """
        ctx = stream.codec_context
        skip_nonref = self.skip_nonref and ctx.name in SKIP_NONREF_DECODERS
        need = set(wanted)
        last = max(wanted)
        got: dict = {}  # frame index -> rgb24 av.VideoFrame
        state = {"previous": None, "last_frame": None}

        def take(frame) -> bool | None:
            self.decoded += 1
            index = index_of(frame.pts)
            previous = state["previous"]
            if index is None or (previous is not None and index <= previous):
                return None  # not in presentation order: the index is wrong for this file
            if previous is None and must_enter_by is not None and index > must_enter_by:
                return None  # the seek landed after the window
            if frame.is_corrupt and checked:
                raise _UnsafeEntry(f"the decoder flagged frame {index} corrupt")
            state["previous"] = index
            state["last_frame"] = (index, frame)
            if index in need:
                self._refuse_corrupt(frame, index)
                got[index] = self._rgb(frame)
            return index >= last

        skipping = None  # unknown: a decode retried on the same context may have left it skipping
        for packet in itertools.chain(packets, [None]):
            self._check_deadline()
            wanted_skip = "DEFAULT"
            if packet is not None and skip_nonref:
                wanted_skip = "DEFAULT" if index_of(packet.pts) in need else "NONREF"
            if wanted_skip != skipping:  # setting it parses the name: only on a change
                ctx.skip_frame = skipping = wanted_skip
            for frame in self._send(ctx, packet, checked):
                done = take(frame)
                if done is None or done:
                    return None if done is None else (got, state["last_frame"], False)
        return got, state["last_frame"], True

    def _send(self, ctx, packet, checked: bool) -> list:
        try:
            return ctx.decode(packet)
        except av.error.InvalidDataError as err:
            if checked:
                raise _UnsafeEntry(f"decoder error: {describe(err, self.path)}") from err
            raise

    def _refuse_corrupt(self, frame, index: int) -> None:
        if frame.is_corrupt:
            raise DecodeError(self.path, f"frame {index} is damaged: the decoder flagged it corrupt")

    def _assemble(self, wanted, got, last_frame, reached_end, *, checked=False) -> tuple[np.ndarray, int | None]:
        """Stack the frames in request order; pad past the end with the last frame.

        Returns ``(frames, end)`` where ``end`` is the last frame's index when
        the decode ran off the end of the video (else ``None``). A missing
        frame raises :class:`_UnsafeEntry` with ``checked``, else
        :class:`DecodeError`.
        """
        end = last_frame[0] if (reached_end and last_frame is not None) else None
        order = list(wanted) if end is None else clamp_frame_indices(wanted, end + 1)
        missing = sorted({i for i in order if i not in got and i != end})
        if missing:
            reason = (f"decoder produced no frame {missing[0]} "
                      f"({len(missing)} of {len(set(wanted))} needed frames missing)")
            raise _UnsafeEntry(reason) if checked else DecodeError(self.path, reason)
        if end is not None and end in order and end not in got:
            got[end] = self._rgb(last_frame[1])
        if not got:
            raise DecodeError(self.path, "no video frames")
        sizes = sorted({(got[i].height, got[i].width) for i in set(order)})
        if len(sizes) != 1:
            raise DecodeError(self.path, f"frame size changes inside the window: {sizes}")
        height, width = sizes[0]
        frames = np.empty((len(order), height, width, 3), np.uint8)
        for k, i in enumerate(order):
            frames[k] = _rgb_view(got[i])
        turn = round(self.rotation / 90) % 4  # upright, as FFmpeg and the transcode show it (quarter turns)
        if turn:
            frames = np.ascontiguousarray(np.rot90(frames, turn, axes=(1, 2)))
        return frames, end

    def check_still_has(self, frames_now: int) -> None:
        """Raise when the window needs a frame the file no longer has: fewer than the scan counted.

        Without this, the window would be padded with the last frame the file
        decodes now, a clip the plan never meant (repeats of a frame from the
        middle of the video) and no failure. Past the scan's count the window
        was clamped already: that padding is the plan's.
        """
        if self.scanned_frames is not None and max(self.wanted) >= frames_now:
            raise DecodeError(self.path, f"decoded only {frames_now} of {self.scanned_frames} frames: truncated "
                                         f"or replaced since the scan (the window needs frame {max(self.wanted)})")

    def _check_deadline(self) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise DecodeError(self.path, self.timeout_reason(), "timeout")

    def timeout_reason(self) -> str:
        return f"timeout: decoding took longer than {self.timeout_s:g} s"

    def _rgb(self, frame):
        # Only the clip's frames pay for the conversion; one thread, as in workers. BT.601 whatever the
        # file's tag, as DALI converts: a clip's pixels do not depend on its route (docs/architecture.md).
        self.rotation = int(round(getattr(frame, "rotation", 0) or 0))
        return self.reformatter.reformat(frame, format="rgb24", threads=self.threads, src_colorspace=Colorspace.ITU601)


def _rgb_view(frame) -> np.ndarray:
    """``(H, W, 3)`` view of an rgb24 frame's pixels (copied once, into the output)."""
    plane = frame.planes[0]
    rows = np.frombuffer(plane, np.uint8)[: plane.line_size * frame.height].reshape(frame.height, plane.line_size)
    return rows[:, : frame.width * 3].reshape(frame.height, frame.width, 3)
