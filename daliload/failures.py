"""Run-time decode failures: the record, the errors, the epoch's budget and the replacement rule.

One owner per epoch: the :class:`~daliload.KineticsDALILoader` holds one
:class:`FailureBudget`, which its epoch pass resets and feeds. Decoders (DALI,
the PyAV fallback and its workers) only report :class:`Failure` records, one
per sample, with a typed ``kind``; the budget groups them per video (:class:`FailedVideo`: a file met in
several slots, or with 30 views, is one failed video), raises
:class:`TooManyFailuresError` once more videos failed than its limit allows,
and warns once per epoch with the totals.

The replacement rule (:func:`replacement_order`): a plan slot whose sample
fails is filled by the next sample of the plan, in plan order and wrapping
around, that decodes. It is deterministic, so a replaced slot gives the same
clip on every run, and it keeps every batch full, so DDP ranks stay in step.

Worked example, a plan of 6 samples (positions 0..5) where 2 and 3 fail::

    slot 2 tries 2 (fails), 3 (fails), 4 -> filled by sample 4
    slot 3 tries 3 (fails), 4          -> filled by sample 4
    budget.failures == (FailedVideo(path2, ..., (2,)), FailedVideo(path3, ..., (3,)))   # each video once
    with max_fraction=0.05 the limit is max(1, 0.05 * videos) = 1 video: the second file raises

This module is core: it imports nothing else of daliload, nor torch.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Iterator, Literal, Sequence

#: What went wrong: the file does not decode; its decode ran past the time limit; its decode killed
#: the worker process (twice: once on a fresh worker too); DALI could not decode it, alone ("dali": the
#: file leaves DALI for the run) or only with its batch ("dali_batch": no single file to blame).
FailureKind = Literal["decode", "timeout", "crash", "dali", "dali_batch"]

#: Failure limit when none is given: 5 % of an epoch's videos (at least one).
DEFAULT_MAX_FAILURE_FRACTION = 0.05


@dataclass(frozen=True)
class Failure:
    """A sample that could not be decoded.

    Attributes:
        path: the file.
        reason: why, in words (``"timeout: ..."``, ``"worker died (signal
            SIGSEGV) while decoding this sample"``, ``"cannot open: ..."``).
        position: the sample's plan position (``None`` if unknown, e.g. a file
            the pre-screen rejected before any plan).
        kind: what went wrong (:data:`FailureKind`), for code to act on.
    """

    path: str
    reason: str
    position: int | None = None
    kind: FailureKind = "decode"


@dataclass(frozen=True)
class FailedVideo:
    """A video that failed in an epoch: each file once, with every plan position it failed at.

    Attributes:
        path: the file.
        reason: the first failure's reason.
        positions: the plan positions of its samples that failed, in the order
            met (several for a video planned more than once: its views, or a
            padding repeat).
        kind: the first failure's kind.
    """

    path: str
    reason: str
    positions: tuple[int, ...] = ()
    kind: FailureKind = "decode"

    def describe(self) -> str:
        """``"path (positions 12-41): reason"``: runs of positions shortened."""
        where = f" ({'position' if len(self.positions) == 1 else 'positions'} {_runs(self.positions)})" \
            if self.positions else ""
        return f"{self.path}{where}: {self.reason}"


def _runs(numbers: Sequence[int]) -> str:
    """``[12, 13, 14, 20] -> "12-14, 20"`` (sorted, each run of consecutive numbers as first-last)."""
    ordered = sorted(set(numbers))
    parts, start = [], 0
    for j in range(1, len(ordered) + 1):
        if j == len(ordered) or ordered[j] != ordered[j - 1] + 1:
            first, last = ordered[start], ordered[j - 1]
            parts.append(str(first) if first == last else f"{first}-{last}")
            start = j
    return ", ".join(parts)


class DecodeFailureWarning(RuntimeWarning, UserWarning):
    """Some samples of an epoch failed to decode and were replaced.

    Both a ``RuntimeWarning`` and a ``UserWarning``, so that a filter written
    for either category (``-W error::RuntimeWarning``, pytest's
    ``filterwarnings``) catches it.
    """


class NoReplacementError(RuntimeError):
    """No sample of the plan decodes to fill a failed slot; lists the failures met."""

    def __init__(self, slot_position: int, failures: Sequence[Failure | FailedVideo] = ()) -> None:
        self.slot_position = slot_position
        self.failures = tuple(failures)
        super().__init__(f"plan position {slot_position}: no decodable replacement in the plan; "
                         f"failures: " + "; ".join(f"{f.path}: {f.reason}" for f in self.failures[:5]))

    def __reduce__(self):
        return (type(self), (self.slot_position, self.failures))


class TooManyFailuresError(RuntimeError):
    """More videos failed than the failure budget allows; lists them, each file once."""

    def __init__(self, failures: Sequence[FailedVideo], num_videos: int, limit: str) -> None:
        self.failures = tuple(failures)
        lines = [f"  {f.describe()}" for f in self.failures[:20]]
        if len(self.failures) > 20:
            lines.append(f"  ... and {len(self.failures) - 20} more (see .failures)")
        super().__init__(f"{len(self.failures)} of {num_videos} videos failed to decode, more than "
                         f"{limit}:\n" + "\n".join(lines))


def replacement_order(num_slots: int, slot: int) -> Iterator[int]:
    """The replacement rule: the plan indices to try for ``slot``, in order.

    ``slot`` itself first, then the following slots of the plan, wrapping
    around, each once. The caller takes the first that decodes and records
    the others' failures; how far it looks is its own bound.

    Example: ``list(replacement_order(5, 3)) == [3, 4, 0, 1, 2]``.

    Raises:
        ValueError: ``slot`` is not in ``0 .. num_slots - 1``.
    """
    if not 0 <= slot < num_slots:
        raise ValueError(f"slot {slot} out of range for a plan of {num_slots} samples")
    for step in range(num_slots):
        yield (slot + step) % num_slots


class FailureBudget:
    """The failures of one epoch (or pass): counted once per video, limited, reported once.

    A video is its file: the views of a multi-view sample, a padding repeat
    and a replacement candidate met again are the same failed video.

    Args:
        num_videos: distinct videos in the epoch (the limit's base).
        max_fraction: raise once more than this fraction of ``num_videos``
            have failed; the fraction allows at least one failed video.
            ``None``: no limit. Default 5 % (``DecodeSpec.max_failure_fraction``).
        masked: the owner masks failed slots (label -1: evaluation splits)
            instead of keeping a replacement's label; the warning says so.

    Raises:
        ValueError: a limit out of range.
    """

    def __init__(self, num_videos: int, *, max_fraction: float | None = DEFAULT_MAX_FAILURE_FRACTION,
                 masked: bool = False) -> None:
        if max_fraction is not None and not 0 <= max_fraction <= 1:
            raise ValueError(f"max_failure_fraction must be in [0, 1] or None, got {max_fraction!r}")
        self.max_fraction = max_fraction
        self.masked = masked
        self.reset(num_videos)

    def reset(self, num_videos: int) -> None:
        """Start a new epoch of ``num_videos`` videos: forget failures and replacements."""
        self.num_videos = num_videos
        self._failures: dict[int | str, FailedVideo] = {}  # by video_index (or path)
        self._replacements: list[tuple[int, int]] = []
        self._warned = False
        self._exceeded = False

    # -- recording ------------------------------------------------------------------

    def record(self, failure: Failure, video: int | str | None = None) -> bool:
        """Count ``failure``'s video (once per video), note its position; raise past the limit.

        Args:
            failure: what failed.
            video: the video's key: its ``video_index`` in the loader's split
                (default: ``failure.path``).

        Returns:
            True when this video had not failed before in this epoch.

        Raises:
            TooManyFailuresError: more failed videos than the limit allows.
        """
        key = failure.path if video is None else video
        known = self._failures.get(key)
        if known is None:
            positions = () if failure.position is None else (failure.position,)
            self._failures[key] = FailedVideo(failure.path, failure.reason, positions, failure.kind)
            self.check()
            return True
        if failure.position is not None and failure.position not in known.positions:
            self._failures[key] = FailedVideo(known.path, known.reason, (*known.positions, failure.position),
                                              known.kind)
        return False

    def failure_of(self, video: int | str) -> FailedVideo | None:
        """How ``video`` (the key it was recorded with: a ``video_index``, or a path) failed in this epoch."""
        return self._failures.get(video)

    def record_replacement(self, slot_position: int, used_position: int) -> None:
        """Note that the slot at ``slot_position`` was filled with the sample at ``used_position``."""
        self._replacements.append((slot_position, used_position))

    def check(self) -> None:
        """Raise :class:`TooManyFailuresError` when the failed videos exceed the limit."""
        n, total = len(self._failures), self.num_videos
        if self.max_fraction is not None and n > max(1.0, self.max_fraction * total):
            self._exceeded = True
            raise TooManyFailuresError(self.failures, total, f"max_failure_fraction={self.max_fraction:g} of {total} "
                                       f"videos ({max(1.0, self.max_fraction * total):g} allowed)")

    # -- reading --------------------------------------------------------------------

    @property
    def failures(self) -> tuple[FailedVideo, ...]:
        """The failed videos, each file once, in the order found."""
        return tuple(self._failures.values())

    @property
    def replacements(self) -> tuple[tuple[int, int], ...]:
        """``(slot_position, used_position)`` of every replaced slot, in order."""
        return tuple(self._replacements)

    def count(self, kind: FailureKind) -> int:
        """How many failed videos failed first with ``kind``."""
        return sum(f.kind == kind for f in self._failures.values())

    def warn(self, *, stacklevel: int = 2) -> None:
        """Warn once per epoch, with totals and the first failure, if anything failed.

        Args:
            stacklevel: as for :func:`warnings.warn`, counted from the caller.
        """
        if not self._failures or self._warned:
            return
        self._warned = True
        first = next(iter(self._failures.values()))
        kinds = f"{self.count('timeout')} timeouts, {self.count('crash')} worker deaths"
        if self._exceeded:
            outcome = ", more than the limit allows, and the pass stopped"
        else:
            outcome = " and were masked (label -1)" if self.masked else " and were replaced"
        warnings.warn(
            f"{len(self._failures)} of {self.num_videos} videos failed to decode{outcome} "
            f"({kinds}); first: {first.describe()}; see the loader's stats()",
            DecodeFailureWarning, stacklevel=stacklevel + 1)

    def __repr__(self) -> str:
        return (f"FailureBudget(failures={len(self._failures)}, replaced={len(self._replacements)}, "
                f"num_videos={self.num_videos}, max_fraction={self.max_fraction})")
