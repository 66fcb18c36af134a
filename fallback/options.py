"""How the fallback decodes: :class:`FallbackOptions`, the PyAV knobs of one decode.

The user's options are :class:`daliload.DecodeSpec` (threads, workers,
prefetch, time limits for the whole loader); the loader turns its fallback
part into one :class:`FallbackOptions` for :class:`fallback.source.FallbackSource`.
:func:`fallback.source.decode_sample` and :func:`fallback.views.decode_views`
take one too, so a decode outside the loader is configured the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from daliload.stream import DEFAULT_POLICY, ReadPolicy
from daliload.stream.numbering import StreamHint


@dataclass(frozen=True)
class FallbackOptions:
    """How the fallback decodes one sample (see :func:`fallback.decode.decode_window`).

    Attributes:
        threads: FFmpeg threads per decode; 1 is right with several workers.
        skip_nonref: skip non-reference frames the clip does not use.
        timeout_s: per-video decode time limit in seconds (``None``: none).
        hints: optional ``path -> StreamHint`` from the pre-screen (for
            :func:`~fallback.source.decode_sample`; a
            :class:`~fallback.source.FallbackSource` takes ``hint_of``).
        read_policy: time limit and retries of each request, for videos in a store.
    """

    threads: int = 1
    skip_nonref: bool = True
    timeout_s: float | None = None
    hints: dict[str, StreamHint] | None = field(default=None, compare=False)
    read_policy: ReadPolicy = DEFAULT_POLICY

    def __post_init__(self) -> None:
        if self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 or None, got {self.timeout_s}")

    def hint(self, path: str) -> StreamHint | None:
        """The pre-screen's seek hint for ``path``, if any."""
        return self.hints.get(path) if self.hints else None
