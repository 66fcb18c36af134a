"""What a transcode is asked to do: the encoding options, the share of files, the encoder choice.

:class:`TranscodeOptions` holds everything that changes the bytes of an
output file; its :meth:`~TranscodeOptions.key` is stored in the record beside
each file, so a re-run with other options redoes the files, and a re-run with
the same options skips them. Run-time knobs that do not change the output
(workers, time limit, progress) are not part of it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path
from typing import Literal

import av

from daliload.dataset import ALL_FILES, Shard, parse_shard  # noqa: F401 - the transcode's --shard, re-exported

logger = logging.getLogger(__name__)
EncoderChoice = Literal["auto", "libx264", "nvenc"]
ENCODERS: tuple[str, ...] = ("auto", "libx264", "nvenc")
#: FFmpeg's name of NVIDIA's H.264 encoder.
NVENC_CODEC = "h264_nvenc"
#: Default preset per encoder: x264's speed presets, NVENC's p1 (fastest) .. p7 (best).
DEFAULT_PRESET = {"libx264": "veryfast", NVENC_CODEC: "p4"}
_X264_PRESETS = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower", "veryslow",
                 "placebo")
_NVENC_PRESETS = tuple(f"p{i}" for i in range(1, 8))


@dataclass(frozen=True)
class TranscodeOptions:
    """How every output file is encoded.

    Attributes:
        short_side: short side of the output in pixels (after rotation), the
            long side scaled to keep the aspect ratio and rounded to even;
            0 keeps the size (rounded down to even). Default 256.
        gop: keyframe interval in frames: every ``gop``-th frame at most is an
            IDR frame. Default 16.
        fps: ``None`` keeps every source frame with its timestamp; a number
            resamples to that constant rate (FFmpeg's ``fps`` filter: frames are
            repeated or dropped).
        crf: constant-quality value (x264's CRF, NVENC's ``cq``). Default 23.
        preset: encoder speed preset; ``None`` is ``veryfast`` for libx264 and ``p4`` for NVENC.
        bframes: consecutive B-frames allowed. Default 2.
        encoder: ``"libx264"`` or ``"h264_nvenc"`` (resolved from the user's
            ``auto|libx264|nvenc`` by :func:`resolve_encoder`).
        keep_audio: keep the first audio stream, re-encoded to AAC (dropped by default).
    """

    short_side: int = 256
    gop: int = 16
    fps: Fraction | None = None
    crf: int = 23
    preset: str | None = None
    bframes: int = 2
    encoder: str = "libx264"
    keep_audio: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.short_side, int) or self.short_side < 0 or self.short_side % 2:
            raise ValueError(f"short_side must be an even number of pixels >= 0 (0 keeps the size), "
                             f"got {self.short_side!r}")
        if self.short_side and self.short_side < 16:
            raise ValueError(f"short_side {self.short_side} is below 16 pixels; NVDEC decodes from 48x16")
        if not isinstance(self.gop, int) or self.gop < 1:
            raise ValueError(f"gop must be a keyframe interval >= 1 frame, got {self.gop!r}")
        if self.fps is not None:
            object.__setattr__(self, "fps", Fraction(self.fps).limit_denominator(1001))
            if self.fps <= 0:
                raise ValueError(f"fps must be > 0 or None (keep the source's timestamps), got {self.fps}")
        if not 0 <= self.crf <= 51:
            raise ValueError(f"crf must be in 0..51, got {self.crf}")
        if not 0 <= self.bframes <= 16:
            raise ValueError(f"bframes must be in 0..16, got {self.bframes}")
        if self.encoder not in DEFAULT_PRESET:
            raise ValueError(f"encoder must be one of {', '.join(DEFAULT_PRESET)} (see resolve_encoder), "
                             f"got {self.encoder!r}")
        allowed = _X264_PRESETS if self.encoder == "libx264" else _NVENC_PRESETS
        if self.preset is None:
            object.__setattr__(self, "preset", DEFAULT_PRESET[self.encoder])
        elif self.preset not in allowed:
            raise ValueError(f"preset {self.preset!r} is not a {self.encoder} preset; choose from "
                             f"{', '.join(allowed)}")

    def key(self) -> str:
        """A short digest of the options, stored with every output: other options, other files."""
        fields = asdict(self)
        fields["fps"] = None if self.fps is None else str(self.fps)
        return hashlib.sha1(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]

    def describe(self) -> str:
        size = f"short side {self.short_side}" if self.short_side else "size kept"
        fps = "source timestamps" if self.fps is None else f"{self.fps} fps"
        return (f"{self.encoder} {self.preset} crf {self.crf}, GOP {self.gop}, {self.bframes} B-frames, {size}, "
                f"{fps}, audio {'kept' if self.keep_audio else 'dropped'}")


def parse_fps(text: str) -> Fraction | None:
    """``"keep"`` -> None; ``"30"``, ``"29.97"`` or ``"30000/1001"`` -> that rate.

    Raises:
        ValueError: anything else, or a rate <= 0.
    """
    if text == "keep":
        return None
    try:
        fps = Fraction(text).limit_denominator(1001)
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"--fps must be 'keep' or a frame rate such as 30 or 30000/1001, got {text!r}") from None
    if fps <= 0:
        raise ValueError(f"--fps must be > 0, got {text!r}")
    return fps


def gpu_visible() -> bool:
    """Whether an NVIDIA GPU is visible to this process (a device node or ``nvidia-smi``)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return Path("/dev/nvidia0").exists() or shutil.which("nvidia-smi") is not None


def resolve_encoder(choice: str) -> str:
    """The FFmpeg encoder for ``--encoder auto|libx264|nvenc``.

    ``auto`` takes NVENC when this FFmpeg build has ``h264_nvenc`` and a GPU is
    visible, else libx264.

    Raises:
        ValueError: an unknown choice; ``nvenc`` where the build lacks it or no
            GPU is visible (the message says which).
    """
    if choice not in ENCODERS:
        raise ValueError(f"--encoder must be one of {', '.join(ENCODERS)}, got {choice!r}")
    has_nvenc = NVENC_CODEC in av.codecs_available
    if choice == "libx264":
        return "libx264"
    if choice == "nvenc":
        if not has_nvenc:
            raise ValueError(f"--encoder nvenc: this FFmpeg build (PyAV {av.__version__}) has no {NVENC_CODEC} "
                             f"encoder; use --encoder libx264 or a PyAV/FFmpeg built with NVENC")
        if not gpu_visible():
            raise ValueError("--encoder nvenc: no NVIDIA GPU is visible (no /dev/nvidia0, no nvidia-smi); "
                             "use --encoder libx264")
        why = nvenc_problem()
        if why:
            raise ValueError(f"--encoder nvenc: {NVENC_CODEC} does not open on this machine ({why}); GPUs "
                             f"without NVENC (A100, H100, H200) cannot encode; use --encoder libx264")
        return NVENC_CODEC
    if has_nvenc and gpu_visible():
        why = nvenc_problem()
        if not why:
            return NVENC_CODEC
        logger.info("--encoder auto: %s does not open (%s); using libx264", NVENC_CODEC, why)
    return "libx264"


def nvenc_problem() -> str:
    """Why a small NVENC encoder does not open here, or ``""`` if it does.

    Having ``h264_nvenc`` in the build and a GPU is not enough: the A100, H100
    and H200 have NVDEC engines but no NVENC.
    """
    try:
        ctx = av.CodecContext.create(NVENC_CODEC, "w")
        ctx.width, ctx.height, ctx.pix_fmt = 256, 256, "yuv420p"
        ctx.time_base = Fraction(1, 30)
        ctx.open()
    except (av.FFmpegError, ValueError) as err:
        return f"{type(err).__name__}: {err}"
    return ""
