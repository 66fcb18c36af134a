"""Transcode one file: decode every frame, scale, encode H.264 8-bit 4:2:0 into MP4, check, rename.

:func:`transcode_file` runs in a worker process (:mod:`.run` supervises it
with a time limit). It:

1. probes the source with the pre-screen's probe (:func:`~daliload.prescreen.probe.probe_file`);
   a file the probe marks bad is not written, its reason is the result;
2. decodes every packet of the first video stream in order, going on past
   decoder errors the way the ``ffmpeg`` command line does, so every
   decodable frame is kept (frame count = a full sequential decode's);
3. filters each frame with FFmpeg's filters: the display rotation is applied
   (``transpose``/``hflip,vflip``, as ``ffmpeg`` does by default) so the
   output is upright and carries no rotation flag, the short side is scaled
   to ``short_side`` (the other side rounded to even; a non-square pixel
   aspect ratio is kept as the stream's flag), the pixels become
   8-bit 4:2:0 (``format=yuv420p``: 4:4:4 and 10-bit sources are converted),
   and with ``--fps`` the ``fps`` filter resamples to a constant rate;
4. encodes with libx264 (or NVENC): an IDR frame every ``gop`` frames, no
   scene-cut keyframes, closed GOPs, one slice per frame, one encoder thread
   (workers give the parallelism); timestamps are the source's unless
   ``--fps`` is given. libx264 is not bit-exact from run to run even so:
   under CPU load about 1 encode in 150 of the same frames differs in its
   bytes (pictures about one level of 255 apart), so a resumed or sharded run
   gives the same files and frames as one run, not always the same bytes;
5. probes the written file and checks it: H.264 ``yuv420p``, as many frames
   as were encoded, no keyframe gap over ``gop``, and DALI's route on every
   NVDEC generation; only then renames the temporary file to the final name.

The temporary file is ``.<name>.partial-<pid>`` beside the output: hidden, so
the index never takes it for a video, and removed by the next attempt at the
same file if a run is killed.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Iterator

import av

from daliload.prescreen.gpus import GENERATIONS
from daliload.prescreen.probe import ProbeResult, describe_error, probe_file
from daliload.prescreen.rules import route_for
from daliload.transcode.options import NVENC_CODEC, TranscodeOptions
from daliload.transcode.summary import FileResult
from daliload.stream.numbering import timestamps_rank_frames

logger = logging.getLogger(__name__)

#: Frame rate assumed when a source states none (raw streams): only x264's rate control reads it.
_FALLBACK_RATE = Fraction(30)


class TranscodeError(RuntimeError):
    """A file could not be transcoded; the message names the file and the problem."""


@dataclass(frozen=True)
class FileJob:
    """One file to transcode (picklable: it travels to a worker).

    Attributes:
        src: source file (absolute).
        dst: final output file (absolute).
        rel: source path relative to the dataset root, ``/``-separated (the record's key).
        options: how to encode.
        out_rel: output path relative to the output root (``rel`` with ``.mp4``).
    """

    src: str
    dst: str
    rel: str
    options: TranscodeOptions
    out_rel: str = ""


@dataclass
class _Counts:
    frames_in: int = 0  # frames the decoder output
    frames_out: int = 0  # frames sent to the encoder
    decode_errors: int = 0
    first_error: str = ""
    size: tuple[int, int] = (0, 0)
    last_pts: int | None = None
    notes: list[str] = field(default_factory=list)


def partial_name(dst: Path, pid: int | None = None) -> Path:
    """The temporary name of ``dst`` while it is written (``.<name>.partial-<pid>``)."""
    return dst.with_name(f".{dst.name}.partial-{os.getpid() if pid is None else pid}")


def remove_partials(dst: Path) -> int:
    """Delete what killed runs left of ``dst`` (its ``.partial-*`` files); return how many."""
    removed = 0
    if dst.parent.is_dir():
        for stale in dst.parent.glob(f".{dst.name}.partial-*"):
            stale.unlink(missing_ok=True)
            removed += 1
    return removed


def transcode_file(job: FileJob) -> FileResult:
    """Transcode ``job.src`` to ``job.dst`` (module docstring); never leaves a half-written ``dst``.

    Returns:
        The result: ``"written"`` or ``"bad"`` (the probe's reason; nothing written).

    Raises:
        TranscodeError: decoding, encoding or the check of the output failed;
            the message names the source file.
    """
    started = time.monotonic()
    stat = os.stat(job.src)
    base = FileResult(job.rel, "bad", src_size=stat.st_size, src_mtime_ns=stat.st_mtime_ns,
                      bytes_in=stat.st_size, options_key=job.options.key())
    facts = probe_file(job.src)
    if not facts.ok:
        return base.replace(reason=facts.reason, seconds=time.monotonic() - started)
    dst = Path(job.dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    remove_partials(dst)
    tmp = partial_name(dst)
    try:
        try:
            counts = _transcode(job.src, tmp, facts, job.options)
        except av.FFmpegError as err:
            raise TranscodeError(f"{job.src}: {describe_error(err)}") from err
        _check_output(job, tmp, counts)
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)
    if counts.frames_in != facts.num_frames:
        counts.notes.append(f"decoded {counts.frames_in} of the {facts.num_frames} frames the probe counted"
                            + (f" ({counts.decode_errors} decode errors, first: {counts.first_error})"
                               if counts.decode_errors else ""))
    return base.replace(status="written", reason="; ".join(counts.notes), out_rel=job.out_rel or dst.name,
                        bytes_out=dst.stat().st_size, frames_in=counts.frames_in, frames_out=counts.frames_out,
                        width=counts.size[0], height=counts.size[1], seconds=time.monotonic() - started)


def output_size(width: int, height: int, short_side: int) -> tuple[int, int]:
    """Output ``(width, height)`` of a displayed ``width x height`` picture: short side to
    ``short_side`` (0 keeps the size), the other side scaled and rounded to even, at least 2.

    >>> output_size(340, 256, 256)
    (340, 256)
    >>> output_size(544, 1280, 256)
    (256, 602)
    >>> output_size(341, 255, 0)
    (340, 254)
    """
    if not short_side:
        return max(2, width - width % 2), max(2, height - height % 2)
    if width <= height:
        return short_side, max(2, round(height * short_side / width / 2) * 2)
    return max(2, round(width * short_side / height / 2) * 2), short_side


def _rotation_filters(rotation: int) -> list[tuple[str, str]]:
    """FFmpeg filters that make a picture with this display rotation upright (FFmpeg's sign)."""
    turn = round(rotation / 90) % 4
    return {0: [], 1: [("transpose", "cclock")], 2: [("hflip", ""), ("vflip", "")],
            3: [("transpose", "clock")]}[turn]


def _video_stream(container: av.container.InputContainer) -> av.video.stream.VideoStream:
    for stream in container.streams.video:
        if not stream.disposition & av.stream.Disposition.attached_pic:
            return stream
    raise TranscodeError(f"{container.name}: no video stream")  # the probe said there was one


def _transcode(src: str, tmp: Path, facts: ProbeResult, options: TranscodeOptions) -> _Counts:
    """Decode ``src``, filter, encode into ``tmp``; the counts of frames in and out."""
    counts = _Counts()
    with av.open(src, metadata_errors="ignore") as inp:
        vin = _video_stream(inp)
        vin.codec_context.thread_count = 1  # one worker per core beats decoder threads (docs/architecture.md)
        ain = inp.streams.audio[0] if options.keep_audio and inp.streams.audio else None
        with av.open(str(tmp), mode="w", format="mp4") as out:
            video = _VideoOut(out, vin, facts, options, counts)
            aout = _audio_stream(out, ain) if ain is not None else None
            for packet in inp.demux([s for s in (vin, ain) if s is not None]):
                if packet.stream is vin:
                    for frame in _decode(packet, counts):
                        video.push(frame)
                elif aout is not None:
                    for frame in _decode(packet, None):
                        for out_packet in aout.encode(frame):
                            out.mux(out_packet)
            video.close()
            if aout is not None:
                for out_packet in aout.encode(None):
                    out.mux(out_packet)
    if counts.frames_out == 0:
        raise TranscodeError(f"{src}: no frame decoded ({counts.decode_errors} decode errors, "
                             f"first: {counts.first_error or 'none'})")
    return counts


def _decode(packet: av.Packet, counts: _Counts | None) -> list[av.frame.Frame]:
    """Decode one packet, going past a damaged one as ``ffmpeg`` does (counted in ``counts``)."""
    try:
        return packet.decode()
    except av.error.InvalidDataError as err:
        if counts is not None:
            counts.decode_errors += 1
            counts.first_error = counts.first_error or describe_error(err)
        return []


def _audio_stream(out: av.container.OutputContainer, ain: av.audio.stream.AudioStream):
    """An AAC stream for the source's audio (PyAV resamples and re-frames what it is given)."""
    aout = out.add_stream("aac", rate=ain.rate or 48000)
    aout.codec_context.thread_count = 1
    return aout


class _VideoOut:
    """The filter graph and the encoder, built from the first decoded frame."""

    def __init__(self, out: av.container.OutputContainer, vin: av.video.stream.VideoStream,
                 facts: ProbeResult, options: TranscodeOptions, counts: _Counts) -> None:
        self.out, self.vin, self.facts, self.options, self.counts = out, vin, facts, options, counts
        self.graph: av.filter.Graph | None = None
        self.stream = None
        self.time_base = vin.time_base or Fraction(1, 1000)
        rate = vin.average_rate or vin.guessed_rate or vin.base_rate
        self.rate = Fraction(rate) if rate else _FALLBACK_RATE
        # One frame period in stream ticks: the step given to a frame without a usable timestamp.
        self.step = max(1, round(1 / (self.rate * self.time_base)))
        # AVI timestamps count packets in decode order, not presentation times: frames are then
        # spaced evenly from the first, as a player shows them.
        self.even = not timestamps_rank_frames(vin.container.format.name)

    def push(self, frame: av.VideoFrame) -> None:
        self.counts.frames_in += 1
        if self.graph is None:
            self._open(frame)
        # The encoder and MP4 need strictly increasing timestamps; keep the source's where they are.
        last = self.counts.last_pts
        if self.even and last is not None:
            frame.pts = last + self.step
        elif frame.pts is None or (last is not None and frame.pts <= last):
            frame.pts = 0 if last is None else last + self.step
        self.counts.last_pts = frame.pts
        frame.time_base = self.time_base
        self.graph.push(frame)
        self._drain()

    def close(self) -> None:
        if self.graph is None:
            return
        self.graph.push(None)
        self._drain()
        for packet in self.stream.encode(None):
            self.out.mux(packet)

    def _drain(self) -> None:
        for frame in _pull(self.graph):
            frame.pict_type = av.video.frame.PictureType.NONE  # let the encoder choose I/P/B
            for packet in self.stream.encode(frame):
                self.out.mux(packet)
            self.counts.frames_out += 1

    def _open(self, frame: av.VideoFrame) -> None:
        options = self.options
        rotation = int(round(getattr(frame, "rotation", 0) or 0))
        upright = (frame.height, frame.width) if round(rotation / 90) % 2 else (frame.width, frame.height)
        width, height = output_size(*upright, options.short_side)
        graph = av.filter.Graph()
        nodes = [graph.add_buffer(width=frame.width, height=frame.height, format=frame.format.name,
                                  time_base=self.time_base)]
        chain = _rotation_filters(rotation)
        if (width, height) != upright:
            chain.append(("scale", f"{width}:{height}:flags=bicubic"))
        chain.append(("format", "yuv420p"))
        if options.fps is not None:
            chain.append(("fps", f"{options.fps.numerator}/{options.fps.denominator}"))
        nodes += [graph.add(name, args) if args else graph.add(name) for name, args in chain]
        nodes.append(graph.add("buffersink"))
        graph.link_nodes(*nodes).configure()
        self.graph = graph
        self.counts.size = (width, height)
        if rotation:
            self.counts.notes.append(f"rotation {rotation} applied (output upright)")
        self.stream = _encoder_stream(self.out, options, width, height,
                                      self.rate if options.fps is None else options.fps,
                                      self.time_base if options.fps is None else 1 / options.fps)
        # Non-square pixels stay non-square (both sides scale alike); a quarter turn swaps the ratio.
        sar = self.vin.codec_context.sample_aspect_ratio
        if sar and sar != 1:
            self.stream.codec_context.sample_aspect_ratio = 1 / sar if round(rotation / 90) % 2 else sar


def _pull(graph: av.filter.Graph) -> Iterator[av.VideoFrame]:
    while True:
        try:
            yield graph.pull()
        except (BlockingIOError, EOFError):  # PyAV's EAGAIN (wants more input) and EOF (flushed)
            return


def _encoder_stream(out: av.container.OutputContainer, options: TranscodeOptions, width: int, height: int,
                    rate: Fraction, time_base: Fraction):
    """The H.264 stream: IDR every ``gop`` frames, closed GOPs, 8-bit 4:2:0, High profile."""
    if options.encoder == NVENC_CODEC:
        codec_options = {"preset": options.preset, "rc": "vbr", "cq": str(options.crf), "bf": str(options.bframes),
                         "g": str(options.gop), "forced-idr": "1", "profile": "high", "no-scenecut": "1"}
    else:
        codec_options = {"preset": options.preset, "crf": str(options.crf), "profile": "high",
                         "x264-params": f"keyint={options.gop}:min-keyint={options.gop}:scenecut=0:"
                                        f"open-gop=0:bframes={options.bframes}:threads=1:sliced-threads=0"}
    stream = out.add_stream(options.encoder, rate=rate, options=codec_options)
    stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
    stream.time_base = time_base
    stream.codec_context.time_base = time_base
    stream.codec_context.gop_size = options.gop
    stream.codec_context.thread_count = 1
    return stream


def _check_output(job: FileJob, tmp: Path, counts: _Counts) -> None:
    """Probe what was written; raise unless it is what the options promise and DALI takes it everywhere."""
    facts = probe_file(tmp)
    problems = []
    if not facts.ok:
        problems.append(f"the output does not probe: {facts.reason}")
    else:
        if (facts.codec, facts.pix_fmt) != ("h264", "yuv420p"):
            problems.append(f"the output is {facts.codec} {facts.pix_fmt}, not h264 yuv420p")
        if facts.num_frames != counts.frames_out:
            problems.append(f"the output holds {facts.num_frames} frames, {counts.frames_out} were encoded")
        gaps = [b - a for a, b in zip(facts.keyframes, (*facts.keyframes[1:], facts.num_frames))]
        if facts.keyframes[:1] != (0,) or max(gaps, default=0) > job.options.gop:
            problems.append(f"keyframe gap over {job.options.gop} frames (keyframes {facts.keyframes[:8]}...)")
        for generation in GENERATIONS:
            route, reason = route_for(facts, f"gpu:{generation}")
            if route != "dali":
                problems.append(f"DALI on {generation} would not decode it: {reason}")
                break
    if problems:
        raise TranscodeError(f"{job.src}: {'; '.join(problems)}")
