"""What a transcode did: one :class:`FileResult` per file, one :class:`TranscodeSummary` per run."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Literal

Status = Literal["written", "bad", "failed"]


@dataclass(frozen=True)
class FileResult:
    """What became of one source file.

    Attributes:
        rel: source path relative to the dataset root (``/``-separated).
        status: ``"written"``; ``"bad"`` (the pre-screen's probe rejects it:
            nothing written); ``"failed"`` (an error, a time-out or a crash of
            its worker: nothing written, redone by the next run).
        reason: why it is bad or failed; for a written file, notes (``"rotation -90 applied"``).
        out_rel: output path relative to the output root.
        src_size, src_mtime_ns: the source's size and mtime when it was read.
        bytes_in, bytes_out: bytes read and written.
        frames_in, frames_out: frames decoded from the source and encoded.
        width, height: output frame size in pixels.
        seconds: wall time spent on the file.
        options_key: :meth:`TranscodeOptions.key` of the options used.
        skipped: this run took the result from the record (the file was done
            before, with these options, from this very source) and did nothing.
    """

    rel: str
    status: Status
    reason: str = ""
    out_rel: str = ""
    src_size: int = 0
    src_mtime_ns: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    frames_in: int = 0
    frames_out: int = 0
    width: int = 0
    height: int = 0
    seconds: float = 0.0
    options_key: str = ""
    skipped: bool = False

    def replace(self, **changes) -> "FileResult":
        return dataclasses.replace(self, **changes)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)


@dataclass(frozen=True)
class TranscodeSummary:
    """Totals of one run (:func:`daliload.transcode.transcode_dataset`).

    Attributes:
        results: one per file of this run's share, sorted by path.
        seconds: wall time of the run.
        layout_files: annotation CSVs and list files copied (relative paths).
        options: :meth:`TranscodeOptions.describe` of the options.
        shard: the share of the files this run did (``"I/N"``).
    """

    results: tuple[FileResult, ...]
    seconds: float
    layout_files: tuple[str, ...] = ()
    options: str = ""
    shard: str = "0/1"

    def of(self, status: Status) -> tuple[FileResult, ...]:
        return tuple(r for r in self.results if r.status == status)

    @property
    def written(self) -> int:
        """Files written by this run."""
        return sum(1 for r in self.results if r.status == "written" and not r.skipped)

    @property
    def skipped(self) -> int:
        """Files this run left alone because the record says they are done (written or bad)."""
        return sum(1 for r in self.results if r.skipped)

    @property
    def bad(self) -> tuple[FileResult, ...]:
        """Files the pre-screen rejected, found by this run or recorded by an earlier one."""
        return self.of("bad")

    @property
    def failed(self) -> tuple[FileResult, ...]:
        return self.of("failed")

    @property
    def bytes_in(self) -> int:
        """Bytes read by this run (skipped files not counted)."""
        return sum(r.bytes_in for r in self.results if not r.skipped)

    @property
    def bytes_out(self) -> int:
        """Bytes written by this run."""
        return sum(r.bytes_out for r in self.results if r.status == "written" and not r.skipped)

    @property
    def files_per_s(self) -> float:
        """Files this run handled (written, bad or failed) per second of wall time."""
        done = sum(1 for r in self.results if not r.skipped)
        return done / self.seconds if self.seconds > 0 else 0.0

    def format(self) -> str:
        """The summary printed at the end of ``daliload transcode``."""
        mb = 1e6
        lines = [f"transcode {self.shard}: {self.written} written, {self.skipped} skipped (done before), "
                 f"{len(self.bad)} bad (not written), {len(self.failed)} failed; "
                 f"{self.bytes_in / mb:.1f} MB in, {self.bytes_out / mb:.1f} MB out, "
                 f"{self.seconds:.1f} s, {self.files_per_s:.2f} files/s",
                 f"  options: {self.options}"]
        if self.layout_files:
            lines.append(f"  layout files copied: {', '.join(self.layout_files)}")
        for title, rows in (("bad (not written)", self.bad), ("failed (redone by the next run)", self.failed)):
            if rows:
                lines.append(f"  {title}:")
                lines += [f"    {r.rel}: {r.reason}" for r in rows]
        return "\n".join(lines)
