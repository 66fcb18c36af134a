"""Which decoder handles a probed file, per route target: the one capability table.

A *route target* is where a training job decodes: ``"cpu"``, or a GPU
generation ``"gpu:<generation>"`` (:mod:`daliload.prescreen.gpus` maps GPU
models users know, ``H200``, ``L40S``, to generations); ``"gpu"`` alone is the
default generation, ``hopper``, the most common training GPUs. :data:`DALI_CAPABILITIES`
says which codecs DALI's ``fn.decoders.video`` decodes on each and within which
limits. To support a new codec (a new GPU generation, a new DALI release), add
a row here; nothing else in the package lists codecs.

================  ==========================  ==============================================
target            backend                     codecs (FFmpeg names) and limits
================  ==========================  ==============================================
``gpu:<gen>``     ``device="mixed"`` (NVDEC)  h264, hevc, vp8, vp9, mpeg4, and av1 on the
                                              generations whose NVDEC has it (GA10x, Ada,
                                              Blackwell; not Volta, Turing, GA100, Hopper);
                                              8-bit 4:2:0, progressive, within NVDEC's
                                              min/max frame size; H.264/HEVC only from
                                              length-prefixed containers (MP4/MOV, MKV, FLV)
``cpu``           ``device="cpu"`` (FFmpeg)   vp8, vp9, mjpeg (DALI's CPU build has H.264, HEVC,
                                              MPEG-4 and AV1 compiled out); 8-bit 4:2:0/4:2:2/4:4:4
================  ==========================  ==============================================

The NVDEC sizes are those of the NVDEC capability table (Video Codec SDK
"NVDEC Application Note", Turing and later): minimum 48x16 (144x144 for HEVC,
128x128 for VP9 and AV1), maximum 4096x4096 for H.264 and VP8, 2032x2032 for
MPEG-4, 8192x8192 for HEVC, VP9 and AV1. DALI finds H.264/HEVC keyframes by
reading NAL units with 4-byte length prefixes (read in its source, not yet seen
on a GPU), so Annex B streams (MPEG-TS, raw ``.h264``/``.hevc``, AVI) go to the
fallback on a GPU. The CPU rows were checked with DALI 2.4 on 8-bit 4:2:0,
4:2:2 and 4:4:4 MJPEG and VP9.

:func:`route_for` applies the table: a file the probe found unusable is
``bad``; a file DALI decodes on the target is ``dali``; anything else that
PyAV decodes goes to the ``fallback``. The reason says which rule failed, and
on a GPU which GPUs it applies to.

Before the table, frame numbering: DALI numbers frames by packet and counts
decoder output from the keyframe it seeks to (:mod:`daliload.stream.numbering`), so
a file where some packets show no frame (``num_packets != num_frames``: a
stream cut mid-GOP, edit-list discards, hidden VP8 frames) or where seeking
gives wrong frames (``unsafe_seek``, from the ``--deep`` check) goes to the
fallback on every device: DALI's frame ``N`` would not be frame ``N``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Mapping

from daliload.prescreen.gpus import AV1_GENERATIONS, GENERATION_EXAMPLES, GENERATIONS, parse_route_target
from daliload.prescreen.probe import ProbeResult

#: A route target: ``"cpu"``, ``"gpu"`` (the default generation) or ``"gpu:<generation>"``.
Device = str
Route = Literal["dali", "fallback", "bad"]

#: The targets every probed file is routed for when it is stored; other GPU
#: generations are routed from the stored facts when asked for (no re-probe).
DEVICES: tuple[Device, ...] = ("gpu", "cpu")
ROUTES: tuple[Route, ...] = ("dali", "fallback", "bad")

#: Bump when the table or :func:`route_for` changes: manifests re-route their
#: stored probe facts (no re-probing) when their rules version differs.
RULES_VERSION = 4


@dataclass(frozen=True)
class CodecSupport:
    """What DALI decodes of one codec on one device.

    Attributes:
        min_size: smallest ``(width, height)`` in pixels.
        max_size: largest ``(width, height)`` in pixels.
        bit_depths: accepted bits per luma sample.
        chroma: accepted chroma subsamplings (``"420"``, ``"422"``, ``"444"``).
        progressive_only: interlaced streams go to the fallback.
    """

    min_size: tuple[int, int] = (1, 1)
    max_size: tuple[int, int] = (65536, 65536)
    bit_depths: frozenset[int] = frozenset({8})
    chroma: frozenset[str] = frozenset({"420"})
    progressive_only: bool = True


def _nvdec(min_size: tuple[int, int], max_size: tuple[int, int]) -> CodecSupport:
    return CodecSupport(min_size=min_size, max_size=max_size)


_DALI_CPU = CodecSupport(chroma=frozenset({"420", "422", "444"}), progressive_only=False)

_NVDEC = {
    "h264": _nvdec((48, 16), (4096, 4096)),
    "hevc": _nvdec((144, 144), (8192, 8192)),
    "vp8": _nvdec((48, 16), (4096, 4096)),
    "vp9": _nvdec((128, 128), (8192, 8192)),
    "av1": _nvdec((128, 128), (8192, 8192)),
    "mpeg4": _nvdec((48, 16), (2032, 2032)),
}

#: THE capability table: route target -> FFmpeg codec name -> what DALI handles there.
DALI_CAPABILITIES: Mapping[str, Mapping[str, CodecSupport]] = {
    "cpu": {"vp8": _DALI_CPU, "vp9": _DALI_CPU, "mjpeg": _DALI_CPU},
    **{f"gpu:{generation}": {codec: support for codec, support in _NVDEC.items()
                             if codec != "av1" or generation in AV1_GENERATIONS}
       for generation in GENERATIONS},
}

#: Containers whose H.264/HEVC streams carry length-prefixed NAL units, which DALI's keyframe search reads.
_LENGTH_PREFIXED = ("mov", "mp4", "matroska", "flv")


def check_device(device: str) -> Device:
    """Validate a route target: ``"cpu"``, ``"gpu"`` or ``"gpu:<generation>"``.

    Raises:
        ValueError: anything else; the message lists the generations.
    """
    parse_route_target(device)
    return device


def _capabilities(target: str) -> tuple[str, Mapping[str, CodecSupport]]:
    """``(name for reasons, codec table)`` of a route target."""
    device, generation = parse_route_target(target)
    if device == "cpu":
        return "cpu", DALI_CAPABILITIES["cpu"]
    return f"gpu (NVDEC {generation}: {GENERATION_EXAMPLES[generation]})", DALI_CAPABILITIES[f"gpu:{generation}"]


def nvdec_class(facts) -> str:
    """The class a test decode on a GPU confirms for all its files: codec, profile, bit depth, chroma.

    ``facts`` is a :class:`ProbeResult` or anything with those attributes
    (a manifest entry). Example: ``"h264/High/8-bit/420"``.
    """
    return f"{facts.codec}/{facts.profile}/{facts.bit_depth}-bit/{facts.chroma}"


def _numbering_problem(facts: ProbeResult) -> str:
    """Why DALI's frame N would not be the full decode's frame N on this file, or ``""``.

    DALI indexes every packet and counts decoder output from the keyframe it
    seeks to (see :mod:`daliload.stream.numbering`), so it agrees with a full
    decode only when every packet shows a frame and seeking is safe.
    """
    if facts.num_packets and facts.num_packets != facts.num_frames:
        return (f"DALI numbers frames by packet: {facts.num_packets} packets, "
                f"{facts.num_frames} frames decoded")
    if facts.unsafe_seek:
        return "seeking to a keyframe gives wrong frames (deep check)"
    return ""


def route_for(facts: ProbeResult, device: Device) -> tuple[Route, str]:
    """Route one probed file on one device.

    Args:
        facts: the probe's result.
        device: the route target: ``"cpu"``, ``"gpu"`` (NVDEC of the default
            generation) or ``"gpu:<generation>"``.

    Returns:
        ``(route, reason)``: ``("bad", probe reason)``, ``("dali", "")`` or
        ``("fallback", which rule failed)``, e.g.
        ``("fallback", "DALI on cpu has no h264 decoder")``.
    """
    name, table = _capabilities(device)
    if not facts.ok:
        return "bad", facts.reason
    support = table.get(facts.codec or "")
    if support is None:
        return "fallback", f"DALI on {name} has no {facts.codec} decoder"
    if not device.startswith("cpu") and facts.codec in ("h264", "hevc") and facts.container is not None \
            and not any(c in facts.container.split(",") for c in _LENGTH_PREFIXED):
        return "fallback", (f"DALI on {name} finds {facts.codec} keyframes only in length-prefixed streams "
                            f"(MP4/MOV, MKV, FLV); this one is in {facts.container}")
    numbering = _numbering_problem(facts)
    if numbering:
        return "fallback", numbering
    if facts.rotation % 360:
        return "fallback", (f"display rotation {facts.rotation} degrees: DALI decodes the stored picture, the "
                            f"fallback turns it upright (as FFmpeg and the transcode do)")
    if facts.bit_depth not in support.bit_depths or facts.chroma not in support.chroma:
        return "fallback", (
            f"DALI on {name} decodes {facts.codec} only as "
            f"{'/'.join(sorted(str(b) for b in support.bit_depths))}-bit "
            f"{'/'.join(sorted(support.chroma))} (got {facts.pix_fmt})"
        )
    if support.progressive_only and facts.interlaced:
        return (
            "fallback",
            f"DALI on {name} decodes {facts.codec} only progressive (got interlaced)",
        )
    width, height = facts.width or 0, facts.height or 0
    (min_w, min_h), (max_w, max_h) = support.min_size, support.max_size
    if not (min_w <= width <= max_w and min_h <= height <= max_h):
        return "fallback", (
            f"{facts.codec} frame size {width}x{height} outside DALI on {name} limits "
            f"{min_w}x{min_h}..{max_w}x{max_h}"
        )
    return "dali", ""
