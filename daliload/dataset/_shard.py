"""A deterministic share of a dataset's files, for spreading work over machines with no coordination.

``daliload transcode --shard I/N`` and ``daliload scan --shard I/N`` give
machine ``I`` of ``N`` the files whose path hash falls in its share; the
shares ``0/N`` .. ``N-1/N`` partition the files exactly, whatever the order
the machines list them in.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Shard:
    """A deterministic share of the files: file ``f`` belongs to share ``hash(f) % count``.

    The hash is of the file's path relative to the dataset root, so every
    machine (or array job) computes the same shares with no coordination, and
    the shares ``0/N`` .. ``N-1/N`` partition the files exactly.
    """

    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.index < self.count:
            raise ValueError(f"shard must be I/N with 0 <= I < N, got {self.index}/{self.count}")

    def holds(self, rel_path: str) -> bool:
        """Whether the file at ``rel_path`` (relative to the root, ``/``-separated) is in this share."""
        if self.count == 1:
            return True
        digest = hashlib.sha1(rel_path.encode("utf-8", "surrogateescape")).digest()
        return int.from_bytes(digest[:8], "big") % self.count == self.index

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


#: The share that holds every file.
ALL_FILES = Shard(0, 1)


def parse_shard(text: str) -> Shard:
    """``"I/N"`` (0-based ``I``) as a :class:`Shard`.

    Raises:
        ValueError: not of that form, or ``I`` outside ``0..N-1``.
    """
    index, sep, count = text.partition("/")
    if not sep or not index.strip().isdigit() or not count.strip().isdigit():
        raise ValueError(f"--shard must be I/N with 0 <= I < N (e.g. 0/4 .. 3/4), got {text!r}")
    return Shard(int(index), int(count))
