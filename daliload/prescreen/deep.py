"""The ``--deep`` check: decode a window at each end of a file with its routed decoder.

The probe decodes only the first frame, so a file damaged mid-stream (a
truncated download, overwritten packets) passes it. The deep check decodes
:data:`WINDOW_FRAMES` frames at the start and the last :data:`WINDOW_FRAMES`
frames with the decoder the file was routed to, and reroutes on failure::

    dali  --(DALI fails)-->  fallback  --(PyAV fails)-->  bad

- DALI: a tiny pipeline (built once per process, and on a GPU in one process
  per GPU: :mod:`daliload.prescreen.gpu_stage`) runs
  ``fn.decoders.video`` on the file's bytes, ``device="mixed"`` for the GPU
  route and ``"cpu"`` for the CPU route, with ``pad_mode="none"`` so a window
  past DALI's own idea of the frame count is an error, not silent padding.
  Without ``nvidia-dali`` installed the DALI part is skipped and the file keeps
  its ``dali`` route with reason :data:`DALI_MISSING` (not counted as checked).
- fallback: :func:`fallback.decode.decode_window`, the decoder the loader's
  fallback path uses. A file whose start decodes but whose end does not (a
  truncated download, a stream cut mid-frame, fewer frames than its packets
  promise) is not bad: the check finds the last window that still decodes (a
  binary search, assuming the damage runs to the end) and stores that many
  frames as the file's length, so the loader's windows never reach the damage
  and no frame of the file that decodes is lost. Only a file whose start fails
  too is ``bad``: what the loader could not decode at all.

Random access (:func:`seek_check`): a window after the last keyframe is decoded
by seeking to that keyframe and compared with the same window decoded from
the start of the file (exact by definition). A file whose keyframes cannot
start a decode (a sync sample that is not an IDR, damage after it) is marked
``unsafe_seek``; the fallback then decodes every window of it from the start,
and DALI, which cannot back off, does not get it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from daliload.dali import dali_error_reason, import_dali
from daliload.runtime import quiet_dali
from daliload.stream import read_video_file
from daliload.prescreen.probe import ProbeResult
from daliload.prescreen.rules import Device, Route

logger = logging.getLogger(__name__)

#: Frames decoded at each end of the file.
WINDOW_FRAMES = 8
#: Mean absolute difference (0-255 RGB) tolerated between a window decoded after
#: a seek and the same window decoded from the start. Most codecs are
#: bit-exact; a few (WMV2, measured on a real file) drift by a little after a
#: seek while showing the right pictures. Wrong frames differ by tens.
SEEK_TOLERANCE = 2.0
#: Reason kept on a ``dali`` route whose DALI check could not run.
DALI_MISSING = "deep check skipped: nvidia-dali is not installed"

#: Per worker process: (backend, device_id) -> pipeline.
_pipelines: dict[tuple[str, int | None], Any] = {}


@dataclass(frozen=True)
class DeepResult:
    """Outcome of the deep check for one file on one device.

    Attributes:
        route: the route after the check.
        reason: why it was rerouted (or why a check was skipped), else ``""``.
        checked: whether the routed decoder actually decoded both windows.
        num_frames: the frames the loader may use, when the end of the file
            does not decode (fewer than the probe counted); else ``None``.
    """

    route: Route
    reason: str
    checked: bool
    num_frames: int | None = None


def windows(num_frames: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """``((start, length), (start, length))`` of the head and tail windows.

    >>> windows(300)
    ((0, 8), (292, 8))
    >>> windows(3)
    ((0, 3), (0, 3))
    """
    length = min(WINDOW_FRAMES, num_frames)
    return (0, length), (num_frames - length, length)


def _dali_pipeline(device: Device, device_id: int) -> Any:
    key = ("mixed" if device == "gpu" else "cpu", device_id if device == "gpu" else None)
    if key not in _pipelines:
        pipeline_mod, fn, types = import_dali()  # lazy: only deep checks need DALI
        quiet_dali()  # the check's verdict names the file; DALI's own lines do not

        @pipeline_mod.pipeline_def(batch_size=2, num_threads=1, device_id=key[1], prefetch_queue_depth=1)
        def window_pipeline():
            encoded = fn.external_source(name="encoded", dtype=types.UINT8, ndim=1)
            start = fn.external_source(name="start", dtype=types.INT32, ndim=0)
            length = fn.external_source(name="length", dtype=types.INT32, ndim=0)
            return fn.decoders.video(
                encoded, device=key[0], start_frame=start, sequence_length=length, pad_mode="none"
            )

        pipe = window_pipeline()
        pipe.build()
        _pipelines[key] = pipe
    return _pipelines[key]


def dali_check(facts: ProbeResult, device: Device, *, device_id: int = 0) -> str:
    """Decode both windows with DALI. Returns ``""`` on success, else what failed.

    Raises:
        ImportError: ``nvidia-dali`` is not installed (the message says which
            ``pip install`` fixes it).
    """
    pipe = _dali_pipeline(device, device_id)
    encoded = read_video_file(facts.path)  # a path or a URI
    (head, head_len), (tail, tail_len) = windows(facts.num_frames)
    pipe.feed_input("encoded", [encoded, encoded])
    pipe.feed_input("start", [np.int32(head), np.int32(tail)])
    pipe.feed_input("length", [np.int32(head_len), np.int32(tail_len)])
    try:
        (frames,) = pipe.run()
    except RuntimeError as err:
        # DALI calls a pipeline that raised "no longer valid": the next file gets a fresh one.
        _pipelines.clear()
        return f"DALI ({device}) failed: {dali_error_reason(str(err) or type(err).__name__)}"
    got = [shape[0] for shape in frames.shape()]
    if got != [head_len, tail_len]:
        return f"DALI ({device}) returned {got} frames for windows of {[head_len, tail_len]}"
    return ""


def fallback_check(facts: ProbeResult) -> tuple[str, int]:
    """Decode both windows with the PyAV fallback.

    Returns:
        ``(failure, usable)``. The start fails: ``("fallback failed: ...", 0)``.
        Both windows decode: ``("", facts.num_frames)``. The end fails:
        ``(what failed there, frames from the start that decode)``.
    """
    (_, head_len), _ = windows(facts.num_frames)
    failure, _ = _decodes(facts.path, head_len)
    if failure:
        return f"fallback failed: {failure}", 0
    end_failure, counted = _decodes(facts.path, facts.num_frames)
    if not end_failure:
        if counted >= facts.num_frames:
            return "", facts.num_frames
        return f"the fallback finds {counted} frames", counted  # fewer than the packets promise
    good, bad = head_len, facts.num_frames  # the window ending at `good` decodes, the one ending at `bad` fails
    while bad - good > 1:
        middle = (good + bad) // 2
        failure, counted = _decodes(facts.path, middle)
        good, bad = (middle, bad) if not failure and counted >= middle else (good, middle)
    return end_failure, good


def _decodes(path: str, end: int) -> tuple[str, int]:
    """Decode the window of frames that ends before frame ``end``: ``("", frames the decoder says the file
    has)``, or ``(why it failed, 0)``. The fallback repeats the last frame past the end: the count shows it."""
    from fallback.decode import DecodeError, decode_window

    start = max(0, end - WINDOW_FRAMES)
    try:
        clip = decode_window(path, range(start, end))
    except DecodeError as err:
        return err.reason, 0
    return "", end if clip.video_num_frames is None else clip.video_num_frames


def deep_check(
    facts: ProbeResult,
    route: Route,
    reason: str,
    device: Device,
    *,
    allow_dali: bool = True,
    device_id: int = 0,
) -> DeepResult:
    """Check a routed file by decoding its head and tail windows; reroute on failure.

    Args:
        facts: the probe's result.
        route, reason: what the rules (:func:`.rules.route_for`) gave on ``device``.
        device: ``"gpu"`` or ``"cpu"``.
        allow_dali: ``False`` after DALI crashed or hung on this file in an
            earlier attempt: the file goes straight to the fallback check.
        device_id: GPU index for the ``gpu`` DALI check.

    Returns:
        :class:`DeepResult`; a rerouted file's reason starts with ``"deep: "``
        and says what failed, e.g. ``"deep: DALI (cpu) failed: ...; fallback
        failed: ..."``. A file that passes keeps the rules' reason. A file
        whose end does not decode keeps the fallback route with
        ``num_frames`` set to the frames before the damage (the caller stores
        it as the file's length).
    """
    if route == "bad":
        return DeepResult("bad", reason, True)
    failures = []
    if route == "dali":
        if not allow_dali:
            failures.append(f"DALI ({device}) crashed or hung")
        else:
            try:
                failure = dali_check(facts, device, device_id=device_id)
            except ImportError as err:
                logger.debug("DALI deep check skipped for %s: %s", facts.path, err)
                return DeepResult("dali", DALI_MISSING, False)
            if not failure:
                return DeepResult("dali", reason, True)
            failures.append(failure)
    failure, usable = fallback_check(facts)
    if not usable:
        return DeepResult("bad", "deep: " + "; ".join([*failures, failure]), True)
    if usable < facts.num_frames:  # the end is damaged: the frames before it are kept
        failures.append(f"the end does not decode ({failure}); frames 0-{usable - 1} of {facts.num_frames} used")
        return DeepResult("fallback", "deep: " + "; ".join(failures), True, usable)
    return DeepResult("fallback", "deep: " + failures[0] if failures else reason, True)


def seek_check(facts: ProbeResult) -> str:
    """Decode the window after the last keyframe by seeking, and from the start; compare.

    Returns:
        ``""`` when seeking is safe (or there is no keyframe after the
        first, or the file is unusable: :func:`fallback_check` reports that),
        else why seeking is unsafe, e.g. ``"seeking to keyframe 145 gives other
        frames than decoding from the start (mean abs diff 114.8)"``.
    """
    from fallback.decode import DecodeError, StreamHint, decode_window
    from daliload.stream.numbering import timestamps_rank_frames

    later = [k for k in facts.keyframes if 0 < k < facts.num_frames]
    if not facts.ok or not later or not timestamps_rank_frames(facts.container or ""):
        return ""  # nothing to seek to, or (AVI) the fallback never seeks
    start = later[-1]
    window = range(start, min(start + WINDOW_FRAMES, facts.num_frames))
    from_start = StreamHint(keyframe_indices=(0,), fps=facts.fps or 1.0, unsafe_seek=True)
    try:
        seeked = decode_window(facts.path, window, skip_nonref=False)
        reference = decode_window(facts.path, window, skip_nonref=False, hint=from_start)
    except DecodeError as err:
        logger.debug("seek check of %s could not decode: %s", facts.path, err.reason)
        return ""
    if seeked.seek_unsafe:
        return f"decoding from keyframe {start} fails or loses frames"
    if seeked.frames.shape != reference.frames.shape:
        return f"seeking to keyframe {start} gives frames of another size"
    diff = float(np.abs(seeked.frames.astype(np.int16) - reference.frames).mean())
    if diff > SEEK_TOLERANCE:
        return f"seeking to keyframe {start} gives other frames than decoding from the start (mean abs diff {diff:.1f})"
    return ""


def with_seek_check(facts: ProbeResult) -> ProbeResult:
    """``facts`` with ``unsafe_seek`` set by :func:`seek_check` (what a ``--deep`` scan stores)."""
    reason = seek_check(facts)
    if reason:
        logger.info("%s: %s", facts.path, reason)
    return replace(facts, unsafe_seek=bool(reason))
