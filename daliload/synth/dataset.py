"""Generate a Kinetics-like dataset: class folders, annotation CSVs, list files.

What :func:`generate_dataset` writes under ``ROOT``::

    ROOT/
      train/
        blink/                               one folder per class name
          Xk3_a9-QzTb_000042_000052.mp4      <youtube_id>_<start:06d>_<end:06d>.<ext>
          ...
        bounce vertical/                     class names contain spaces, as Kinetics' do
        ...
      val/
        <class name>/...
      annotations/
        train.csv                            label,youtube_id,time_start,time_end,split
        val.csv                              (label is the class NAME)
      trainlist.txt                          "<path relative to ROOT> <label index>" per line
      vallist.txt
      synth.tsv                              what every file is (see SynthClip)

Label indices are positions in the class names sorted alphabetically (as
torchvision and mmaction number Kinetics classes), so they match what
:func:`daliload.dataset.load_index` computes from any of the three layouts.

Everything is a function of :class:`~daliload.synth.spec.SynthSpec` (including
its seed): :func:`~daliload.synth.spec.plan_dataset` decides every file without
encoding anything (see :mod:`daliload.synth.spec`), and the same spec gives the
same names, listings and rendered frames. Encoded bytes may still differ
between runs (libvpx's realtime mode adapts to the time it has, and libx264's
output was seen to vary when CPUs were contended), so compare decoded frame
codes, not file hashes.
"""

from __future__ import annotations

import csv
import io
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Iterable, Sequence

import av

from daliload.synth.broken import write_broken
from daliload.synth.encode import default_spec, write_video
from daliload.synth.spec import Split, SynthClip, SynthSpec, plan_dataset
from daliload.runtime import main_script_hidden, mp_context

#: Columns of the annotation CSVs, in Kinetics' order.
CSV_COLUMNS = ("label", "youtube_id", "time_start", "time_end", "split")
#: The listing of every generated file, under the dataset root.
REPORT_NAME = "synth.tsv"


@dataclass(frozen=True)
class SynthReport:
    """Everything :func:`generate_dataset` wrote.

    Attributes:
        root: dataset root (absolute).
        spec: the spec it was generated from.
        classes: class names sorted; position = label index.
        clips: every video-like file, in plan order (class by class).
        index_files: annotation CSVs, list files and :data:`REPORT_NAME`,
            relative to ``root``.
    """

    root: str
    spec: SynthSpec
    classes: tuple[str, ...]
    clips: tuple[SynthClip, ...]
    index_files: tuple[str, ...]

    @property
    def broken(self) -> tuple[SynthClip, ...]:
        return tuple(c for c in self.clips if c.broken is not None)

    def split(self, split: Split) -> tuple[SynthClip, ...]:
        return tuple(c for c in self.clips if c.split == split)

    def listing(self) -> str:
        """The clips as TSV text (what ``ROOT/synth.tsv`` holds); no absolute paths."""
        return _report_tsv(self.clips)


def _write_clip(root: str, spec: SynthSpec, clip: SynthClip) -> str:
    """Encode one file (runs in a worker process). Returns its relative path."""
    path = Path(root) / clip.path
    path.parent.mkdir(parents=True, exist_ok=True)
    content = clip.content(spec)
    try:
        if clip.broken is not None:
            write_broken(path, clip.broken, content)
            return clip.path
        gop = {} if spec.gop is None else {"gop": spec.gop}
        written = write_video(path, content.frames(), default_spec(clip.codec, fps=clip.fps, **gop))
    except (av.FFmpegError, OSError) as err:
        raise RuntimeError(f"could not write {path}: {err}") from err
    if written != clip.num_frames:
        raise RuntimeError(f"{path}: wrote {written} frames, planned {clip.num_frames}")
    return clip.path


def generate_dataset(
    root: str | os.PathLike,
    spec: SynthSpec | None = None,
    *,
    workers: int = 1,
    progress: bool = True,
) -> SynthReport:
    """Write a Kinetics-like dataset under ``root`` (see the module docstring).

    Existing files with the same names are overwritten; other files are left alone.

    Args:
        root: dataset directory; created if missing.
        spec: what to generate (default :class:`SynthSpec()`: 8 classes x 10
            clips, 340x256, 10 s, H.264, nothing broken).
        workers: encoder processes. 1 encodes in this process; more use a
            ``forkserver`` (``spawn`` where that is missing) process pool, since
            every file is independent. Each libx264/libvpx encoder is
            frame-threaded, so more workers than cores rarely helps.
        progress: show a tqdm progress bar on stderr.

    Returns:
        :class:`SynthReport` listing every file written.

    Raises:
        ValueError: ``workers`` < 1.

    Example:
        >>> report = generate_dataset("/tmp/k", SynthSpec(num_classes=4, clips_per_class=5,
        ...                           codec_mix={"h264": 0.7, "vp9": 0.3}, broken_fraction=0.1))
    """
    spec = spec if spec is not None else SynthSpec()
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    root_path = Path(root).absolute()
    root_path.mkdir(parents=True, exist_ok=True)
    clips = plan_dataset(spec)

    from tqdm import tqdm

    bar = tqdm(total=len(clips), unit="file", desc="synth", disable=not progress)
    try:
        if workers == 1:
            for clip in clips:
                _write_clip(str(root_path), spec, clip)
                bar.update()
        else:
            # Not fork: the caller may hold threads (torch, tqdm) that a fork would copy mid-lock.
            # daliload's context: the forkserver it may start here serves the loader later.
            context = mp_context()
            with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
                with main_script_hidden():  # workers start on submit; an unguarded script is not re-run
                    futures = [pool.submit(_write_clip, str(root_path), spec, c) for c in clips]
                try:
                    for future in futures:
                        future.result()  # re-raises a worker's error, which names the file
                        bar.update()
                except BaseException:
                    for future in futures:
                        future.cancel()
                    raise
    finally:
        bar.close()

    index_files = _write_index_files(root_path, spec.class_names, clips)
    return SynthReport(root=str(root_path), spec=spec, classes=spec.class_names, clips=clips,
                       index_files=index_files)


def _write_index_files(root: Path, classes: tuple[str, ...],
                       clips: Sequence[SynthClip]) -> tuple[str, ...]:
    written = []
    (root / "annotations").mkdir(exist_ok=True)
    for split in ("train", "val"):
        rows = [c for c in clips if c.split == split]
        if not rows:
            continue
        csv_rel = f"annotations/{split}.csv"
        _write_text(root / csv_rel, _csv_text(rows))
        list_rel = f"{split}list.txt"
        _write_text(root / list_rel, "".join(f"{c.path} {c.label}\n" for c in rows))
        written += [csv_rel, list_rel]
    _write_text(root / REPORT_NAME, _report_tsv(clips))
    written.append(REPORT_NAME)
    return tuple(written)


def _write_text(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)


def _csv_text(rows: Iterable[SynthClip]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for c in rows:
        writer.writerow([c.class_name, c.youtube_id, c.time_start, c.time_end, c.split])
    return buffer.getvalue()


_REPORT_COLUMNS = ("path", "split", "class_name", "label", "youtube_id", "time_start", "time_end",
                   "codec", "fps", "num_frames", "broken", "content_class", "content_seed")


def _report_tsv(clips: Iterable[SynthClip]) -> str:
    lines = ["\t".join(_REPORT_COLUMNS)]
    for c in clips:
        values = [getattr(c, name) for name in _REPORT_COLUMNS]
        lines.append("\t".join("" if v is None else str(v) for v in values))
    return "\n".join(lines) + "\n"


def read_report(root: str | os.PathLike) -> tuple[SynthClip, ...]:
    """The clips listed in ``ROOT/synth.tsv`` (ground truth for tests and benchmarks).

    Raises:
        FileNotFoundError: the dataset has no ``synth.tsv``.
        ValueError: its header is not the one this version writes.
    """
    path = Path(root) / REPORT_NAME
    with open(path, encoding="utf-8", newline="") as f:
        lines = f.read().splitlines()
    if not lines or tuple(lines[0].split("\t")) != _REPORT_COLUMNS:
        raise ValueError(f"{path}: header is not {chr(9).join(_REPORT_COLUMNS)!r}")
    clips = []
    for line in lines[1:]:
        v = dict(zip(_REPORT_COLUMNS, line.split("\t")))
        clips.append(SynthClip(
            path=v["path"], split=v["split"], class_name=v["class_name"],  # type: ignore[arg-type]
            label=int(v["label"]), youtube_id=v["youtube_id"], time_start=int(v["time_start"]),
            time_end=int(v["time_end"]), codec=v["codec"] or None, fps=Fraction(v["fps"]),
            num_frames=int(v["num_frames"]), broken=v["broken"] or None,  # type: ignore[arg-type]
            content_class=int(v["content_class"]), content_seed=int(v["content_seed"])))
    return tuple(clips)


# SynthSpec is re-exported: callers import it beside generate_dataset from here.
__all__ = ["SynthSpec", "SynthReport", "generate_dataset", "read_report", "CSV_COLUMNS", "REPORT_NAME"]
