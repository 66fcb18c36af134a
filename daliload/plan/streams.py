"""Counter-based random streams for planning: each draw depends only on its key.

A plan must be the same on every rank and must not depend on which rank
computes a sample or on the other samples; a ``numpy.random.Generator`` per
sample would do that but costs about 20 us to create (13 s per epoch over
650k videos). These streams are vectorised instead.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

# Tags that keep the random streams of one (seed, epoch) apart: the shuffle
# uses (seed, epoch, SHUFFLE_STREAM), the per-sample draws are keyed by
# (seed, epoch, SAMPLE_STREAM) and then by (video_index, repeat, purpose).
SHUFFLE_STREAM = 0
SAMPLE_STREAM = 1
PURPOSE_START, PURPOSE_CROP, PURPOSE_FLIP = 1, 2, 3  # purposes: each has its own stream of draws

_GOLDEN64 = 0x9E3779B97F4A7C15


class RandomSource(Protocol):
    """The three draws planning uses; ``numpy.random.Generator`` has them."""

    def integers(self, low: int, high: int) -> int: ...

    def uniform(self, low: float, high: float) -> float: ...

    def random(self) -> float: ...


def _mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on uint64 arrays: a bijection that scatters every input bit."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)  # uint64 arrays wrap around, as intended
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def keyed_uniforms(key: tuple[int, int], video_index: np.ndarray, repeat: np.ndarray,
                    purpose: int, count: int) -> list[list[float]]:
    """:func:`keyed_uniform_array` as lists of floats, one list per sample."""
    return keyed_uniform_array(key, video_index, repeat, purpose, count).tolist()


def keyed_uniform_array(key: tuple[int, int], video_index: np.ndarray, repeat: np.ndarray,
                        purpose: int, count: int) -> np.ndarray:
    """``count`` uniforms in [0, 1) per ``(video_index, repeat)``, for one purpose: a ``(samples, count)`` array.

    Counter-based, like Philox: draw ``j`` of a sample is
    ``mix64(stream + (j + 1) * golden)`` with ``stream`` a hash of
    ``(key, video_index, repeat, purpose)``, so it depends on nothing else (not
    on which rank computes it, nor on the other samples). A
    ``numpy.random.Generator`` per sample would do the same job but costs about
    20 us to create (13 s per epoch over 650k videos); this is vectorised.
    """
    stream = _mix64(video_index.astype(np.uint64) * np.uint64(_GOLDEN64) ^ np.uint64(key[0]))
    tag = (repeat.astype(np.uint64) << np.uint64(8)) | np.uint64(purpose)
    stream = _mix64(stream ^ tag ^ np.uint64(key[1]))
    steps = np.arange(1, count + 1, dtype=np.uint64) * np.uint64(_GOLDEN64)
    bits = _mix64(stream[:, None] + steps[None, :])
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


class Draws:
    """Serves precomputed uniforms through the :class:`RandomSource` methods."""

    __slots__ = ("_values", "_next")

    def __init__(self, values: list[float]) -> None:
        self._values = values
        self._next = 0

    def random(self) -> float:
        value = self._values[self._next]  # IndexError here means DRAWS_PER_CROP is too small
        self._next += 1
        return value

    def uniform(self, low: float, high: float) -> float:
        return low + (high - low) * self.random()

    def integers(self, low: int, high: int) -> int:
        """An integer in ``[low, high)``, like ``Generator.integers``."""
        return min(high - 1, low + int(self.random() * (high - low)))


#: Most draws :func:`sample_crop_box` takes per mode (random_resized: 10 tries of 2, then 2).
DRAWS_PER_CROP = {"center": 0, "short_side_jitter": 3, "random_resized": 22}


def sample_key(seed: int, epoch: int) -> tuple[int, int]:
    words = np.random.SeedSequence([seed, epoch, SAMPLE_STREAM]).generate_state(2, dtype=np.uint64)
    return int(words[0]), int(words[1])


