"""What a generated clip shows: a class-specific motion, plus the frame code.

Each class is one *motion* of a textured object over a noisy background. The
texture, colours, background and phase are drawn per clip, so only the motion
tells the classes apart. Every motion is its own mirror image (vertical moves,
symmetric oscillations, spins and orbits whose direction is drawn per clip),
so horizontal flips and crops keep the class signal.

Classes 0-8 are the nine motions of ``MOTIONS`` at speed 1; classes from 9 on
are faster versions of the eight *moving* ones (a faster "still" would look
like "still"): class 9 is "bounce_vertical" at speed 2, class 17 "bounce_vertical"
at speed 3, and so on. Motion is a function of time in seconds, not of the frame
number, so 25, 29.97 and 30 fps clips of a class move alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from daliload.framecode import paint_code, strip_height

MOTIONS: tuple[str, ...] = (
    "still",
    "bounce_vertical",
    "sway_horizontal",
    "zoom_pulse",
    "drift_down",
    "drift_up",
    "spin",
    "blink",
    "orbit",
)

#: Base frequency of the periodic motions, in Hz at speed 1. One 16-frame clip
#: at stride 4 and 30 fps spans about 2 s, so it sees one to two periods.
BASE_HZ = 0.6


def motion_of(class_id: int) -> tuple[str, int]:
    """``(motion name, speed factor)`` of a class index."""
    if class_id < 0:
        raise ValueError(f"class index must be >= 0, got {class_id}")
    if class_id < len(MOTIONS):
        return MOTIONS[class_id], 1
    moving = MOTIONS[1:]
    k = class_id - len(MOTIONS)
    return moving[k % len(moving)], 2 + k // len(moving)


@dataclass(frozen=True)
class _Pose:
    cx: float  # object centre, fraction of width
    cy: float  # object centre, fraction of the content area's height
    scale: float
    angle: float  # radians
    visible: bool


def _pose(motion: str, speed: int, t: float, p: dict) -> _Pose:
    w = 2 * math.pi * BASE_HZ * speed
    ph = p["phase"]
    cx, cy, scale, angle, visible = p["cx"], p["cy"], 1.0, 0.0, True
    if motion == "bounce_vertical":
        cy = 0.5 + 0.28 * math.sin(w * t + ph)
    elif motion == "sway_horizontal":
        cx = 0.5 + 0.28 * math.sin(w * t + ph)
    elif motion == "zoom_pulse":
        scale = 1.0 + 0.55 * math.sin(w * t + ph)
    elif motion in ("drift_down", "drift_up"):
        sign = 1.0 if motion == "drift_down" else -1.0
        cy = (p["cy"] + sign * 0.12 * speed * t) % 1.2 - 0.1
    elif motion == "spin":
        angle = p["direction"] * w * t + ph
    elif motion == "blink":
        visible = math.sin(w * t + ph) > 0
    elif motion == "orbit":
        cx = 0.5 + 0.22 * math.cos(p["direction"] * w * t + ph)
        cy = 0.5 + 0.25 * math.sin(p["direction"] * w * t + ph)
    elif motion != "still":
        raise ValueError(f"unknown motion {motion!r}; known: {MOTIONS}")
    return _Pose(cx, cy, scale, angle, visible)


def render_clip(
    class_id: int,
    num_frames: int,
    *,
    width: int = 340,
    height: int = 256,
    fps: float = 30.0,
    seed: int = 0,
    first_index: int = 0,
) -> Iterator[np.ndarray]:
    """Yield ``num_frames`` RGB frames ``(height, width, 3)`` uint8 of one clip.

    Frame ``i`` carries the code of ``first_index + i`` (see
    :mod:`daliload.framecode`) in its top strip.

    Args:
        class_id: which motion (see module docstring).
        num_frames: frames to yield.
        width, height: frame size in pixels; both even for 4:2:0 encoders.
        fps: frame rate; the motion is a function of ``i / fps`` seconds.
        seed: draws texture, colours, background and phase (same seed, same clip).
        first_index: code painted into the first frame.
    """
    if width < 32 or height < 32:
        raise ValueError(f"frames must be at least 32x32, got {width}x{height}")
    motion, speed = motion_of(class_id)
    rng = np.random.default_rng(seed)
    top = strip_height(height)
    area_h = height - top

    base = rng.integers(40, 200, size=3)
    background = np.clip(
        base + rng.normal(0, 18, size=(area_h, width, 1)) + rng.normal(0, 6, size=(area_h, width, 3)),
        0, 255,
    ).astype(np.uint8)
    grain = rng.integers(-6, 7, size=(4, area_h, width, 1), dtype=np.int16)

    side = max(8, int(min(area_h, width) * 0.34))
    cells = rng.integers(3, 7)
    checker = (np.add.outer(np.arange(side) * cells // side, np.arange(side) * cells // side) % 2)
    c0, c1 = rng.integers(0, 256, size=3), rng.integers(0, 256, size=3)
    if np.abs(c0.astype(int) - c1).sum() < 150:
        c1 = 255 - c0
    texture = np.where(checker[..., None] == 1, c0, c1).astype(np.int16)
    texture = np.clip(texture + rng.normal(0, 10, size=texture.shape), 0, 255).astype(np.uint8)
    params = {
        "phase": float(rng.uniform(0, 2 * math.pi)),
        "cx": float(rng.uniform(0.35, 0.65)),
        "cy": float(rng.uniform(0.35, 0.65)),
        "direction": float(rng.choice([-1.0, 1.0])),
    }

    half = side / 2.0
    reach = int(math.ceil(half * 1.6 * math.sqrt(2)))
    yy, xx = np.mgrid[-reach:reach + 1, -reach:reach + 1].astype(np.float32)
    for i in range(num_frames):
        frame = np.empty((height, width, 3), dtype=np.uint8)
        area = frame[top:]
        np.clip(background.astype(np.int16) + grain[i % len(grain)], 0, 255, out=area, casting="unsafe")
        pose = _pose(motion, speed, i / fps, params)
        if pose.visible:
            _stamp(area, texture, pose, yy, xx)
        paint_code(frame, first_index + i)
        yield frame


def _stamp(area: np.ndarray, texture: np.ndarray, pose: _Pose, yy, xx) -> None:
    """Draw the texture rotated and scaled at the pose (nearest-neighbour)."""
    h, w = area.shape[:2]
    side = texture.shape[0]
    cx, cy = pose.cx * w, pose.cy * h
    cos, sin = math.cos(pose.angle), math.sin(pose.angle)
    # Inverse map: output offset -> texture coordinate.
    u = (cos * xx + sin * yy) / pose.scale + side / 2.0
    v = (-sin * xx + cos * yy) / pose.scale + side / 2.0
    inside = (u >= 0) & (u < side) & (v >= 0) & (v < side)
    oy = (yy + round(cy)).astype(np.int64)
    ox = (xx + round(cx)).astype(np.int64)
    inside &= (oy >= 0) & (oy < h) & (ox >= 0) & (ox < w)
    area[oy[inside], ox[inside]] = texture[v[inside].astype(np.int64), u[inside].astype(np.int64)]
