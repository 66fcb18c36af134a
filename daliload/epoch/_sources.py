"""The loader's two clip sources, built from its split and settings, and kept as long as the loader.

:class:`ClipSources` holds the PyAV fallback (built at once; its workers start
at its first group) and DALI (built at the first pass with a DALI sample):
both serve every pass of every epoch. The lookups they need per path (the
manifest's frame count, the fallback's seek hint, a DALI cut's item) are
binary searches over the split's :class:`~daliload.dataset.VideoIndex`, made
when a video is sent, so no per-video dict lives on a rank and the index never
leaves the training process.

Where the fallback's clips are normalised is decided here, once, from the
batches' device (:func:`fallback_normalizes_on`); the merge learns it from
each group (``Decoded.normalized``).
"""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Literal, Sequence

from daliload.dataset import VideoIndex, VideoRow
from daliload.plan import OutputSpec
from daliload.stream import DEFAULT_POLICY, ReadPolicy, is_remote, object_of, remote_window
from daliload.stream.byteindex import ByteIndex
from daliload.runtime import WithPrefetch
from daliload.stream.cut import cut_task, prefetch_cut
from daliload.stream.numbering import StreamHint
from fallback.options import FallbackOptions
from fallback.source import FallbackSource, NormalizeOn
from daliload.epoch._merge import RegisteredBuffers
from fallback.buffers import ReusedBuffers

if TYPE_CHECKING:
    import torch

    from daliload.dali import DaliSource


@dataclass(frozen=True)
class DaliSetup:
    """How the DALI source is built (:class:`~daliload.dali.DaliClipDecoder`'s settings and the feed).

    Attributes:
        batch_size: clips per DALI batch (the loader's clips per batch).
        device: ``"gpu"`` (NVDEC) or ``"cpu"`` (DALI's CPU decoder).
        device_id: the CUDA device on ``"gpu"``.
        num_threads: DALI threads per pipeline.
        prefetch: batches in flight (the pass's ``prefetch``).
        pipelines: DALI pipelines taking the batches in turn.
        cut_windows: feed DALI the packets each window needs (made by a
            :class:`~daliload.dali.WindowCutter`) instead of whole files.
        read_policy: time limit and retries of each request, for videos in a store.
    """

    batch_size: int
    device: Literal["cpu", "gpu"]
    device_id: int | None
    num_threads: int
    prefetch: int
    pipelines: int
    cut_windows: bool
    read_policy: ReadPolicy = DEFAULT_POLICY


class ClipSources:
    """The fallback (:attr:`fallback`) and DALI (:meth:`dali`) of one loader.

    The loader hands them to each pass and closes them with itself; tools and
    tests reach a decoder here (``loader.sources.fallback.worker_pids``,
    :func:`daliload.testing.inject_faults`, ``loader.sources.dali().decoder``).

    Args:
        index: the split's decodable videos.
        output: what every clip is turned into.
        options: how the fallback decodes.
        workers: the fallback's worker processes (and the cutter's).
        timeout_s: the time limit, in seconds: of one video with all its clips on the fallback, of one
            clip in a DALI batch's allowance (and of one cut).
        device: where the batches go (``cuda:N`` or the CPU): it decides
            where the fallback normalises (:func:`fallback_normalizes_on`).
        dali: how DALI is built when first needed; ``None``: DALI is not used.
        keep_buffers: the fallback's shared buffers kept for reuse: on a GPU
            host page-locked (:class:`RegisteredBuffers`), the batches a pass
            has in flight at once, ahead and held for their copies; on the CPU
            (:class:`fallback.buffers.ReusedBuffers`), those ahead and the ones
            the training loop holds.
        reads_of: ``path -> its byte index`` (the manifest's), for remote videos.
    """

    def __init__(self, index: VideoIndex, output: OutputSpec, options: FallbackOptions, *, workers: int,
                 timeout_s: float, device: "torch.device", dali: DaliSetup | None = None,
                 keep_buffers: int = 4, reads_of: Callable[[str], ByteIndex | None] | None = None) -> None:
        #: ``path -> frames in the file`` (the manifest's), what the plan was drawn from
        self.frames_of = frames_lookup(index)
        self._hint_of = hint_lookup(index, reads_of)
        self._reads_of = reads_of
        self._output, self._workers, self._timeout_s, self._dali_setup = output, workers, timeout_s, dali
        #: the fallback's shared buffers, reused: on a GPU host page-locked once and given back after the batch's
        #: copies; on the CPU, where a group that is the whole batch is handed out as the batch, given back when
        #: the last tensor over it goes (None with no workers: the clips are then decoded into torch's memory)
        self.buffers = (RegisteredBuffers(device, keep=keep_buffers) if device.type == "cuda"
                        else ReusedBuffers(keep=keep_buffers)) if workers else None
        #: the PyAV fallback: what a truncated file is checked against is the manifest's frame count
        self.fallback = FallbackSource(output, options, workers=workers, hint_of=self._hint_of,
                                       frames_of=self.frames_of, normalize_on=fallback_normalizes_on(device),
                                       buffers=self.buffers)
        self._dali: DaliSource | None = None

    def dali(self) -> DaliSource:
        """The DALI source, built on first use (its pipelines then live until :meth:`close`).

        Raises:
            RuntimeError: this loader does not use DALI.
        """
        if self._dali is None:
            setup = self._dali_setup
            if setup is None:
                raise RuntimeError("this loader does not decode with DALI (not installed, decoder='fallback')")
            from daliload.dali import DaliClipDecoder, DaliSource, WindowCutter

            decoder = DaliClipDecoder(self._output, batch_size=setup.batch_size, device=setup.device,
                                      device_id=setup.device_id, num_threads=setup.num_threads,
                                      prefetch_queue_depth=setup.prefetch, pipelines=setup.pipelines,
                                      num_frames=self.frames_of, read_policy=setup.read_policy)
            cutter = None
            if setup.cut_windows:
                policy = setup.read_policy
                cutter = WindowCutter(WithPrefetch(functools.partial(cut_task, policy=policy),
                                                   functools.partial(prefetch_cut, policy=policy)),
                                      item_of=cut_item(self._hint_of),
                                      workers=self._workers,
                                      timeout_s=self._timeout_s)
            self._dali = DaliSource(decoder, clip_timeout_s=self._timeout_s, cutter=cutter)
        return self._dali

    @property
    def pinned(self) -> dict[int, int] | None:
        """The addresses and sizes of the fallback's page-locked buffers (``None`` on the CPU)."""
        return self.buffers.pinned if isinstance(self.buffers, RegisteredBuffers) else None

    def close(self) -> None:
        """Stop the fallback's workers and release DALI's pipelines (the next pass starts them again)."""
        self.fallback.close()
        getattr(self._reads_of, "close", lambda: None)()  # the manifest's connection; opened again when next read
        if self.buffers is not None:
            self.buffers.close()
        if self._dali is not None:
            self._dali.close()
            self._dali = None


def fallback_normalizes_on(device: "torch.device") -> NormalizeOn:
    """Where the fallback's clips are normalised when the batches go to ``device``: the one place that decides.

    On a GPU, ``"device"``: the workers only crop, resize and flip (uint8) and
    the merge normalises on the GPU, so a clip costs its worker less CPU time
    (the float math is the normalise column of the stage profile) and crosses
    PCIe as uint8, a quarter of float32's bytes
    (``benchmarks/bench_lean_fallback.py`` measures both). On the CPU,
    ``"worker"``: the workers' normalising runs in parallel beside the
    training process, and a group that is the whole batch is handed out
    without a copy; the merge doing it would add both.
    """
    return "device" if device.type == "cuda" else "worker"


def frames_lookup(index: VideoIndex) -> Callable[[str], int | None]:
    """``path -> frames in the file`` over ``index`` (a binary search; no per-video dict on a rank)."""
    def frames_of(path: str) -> int | None:
        i = index.find(path)
        return (int(index.num_frames[i]) or None) if i >= 0 else None
    return frames_of


def hint_lookup(index: VideoIndex, reads_of: Callable[[str], ByteIndex | None] | None = None,
                ) -> Callable[[str], StreamHint | None]:
    """``path -> the fallback's seek hint`` over ``index``, made when a video is sent to a worker; a remote
    video's carries its byte index from ``reads_of`` (its header and window are then read in one go)."""
    def hint_of(path: str) -> StreamHint | None:
        i = index.find(path)
        if i < 0:
            return None
        reads = reads_of(path) if reads_of is not None and is_remote(object_of(path)[0]) else None
        rotation = getattr(reads_of, "rotation", None)
        return stream_hint(index[i], reads, rotation(path) if rotation is not None else None)
    return hint_of


def cut_item(hint_of: Callable[[str], StreamHint | None]) -> Callable[[str, Sequence[int]], tuple | None]:
    """``(path, frames) -> a cut task's item`` (``daliload.stream.cut.cut_task``), or ``None`` when no cut can gain:
    the window's entry is the file's first frame, or the file has no usable seek hint."""
    def item_of(path: str, frames: Sequence[int]) -> tuple | None:
        hint = hint_of(path)
        if hint is None or hint.unsafe_seek:
            return None
        keys = hint.keyframe_indices
        if keys[bisect.bisect_right(keys, min(frames)) - 1] == 0 and not remote_window(path, hint):
            return None  # a local file read from its start anyway (a remote one: the cut saves the file's rest)
        return path, tuple(frames), hint
    return item_of


def stream_hint(entry: VideoRow, reads: ByteIndex | None = None, rotation: int | None = None) -> StreamHint | None:
    """A seek hint for the fallback from the manifest: constant-frame-rate files with keyframes,
    and every file the deep check found unsafe to seek (decoded from its start); ``rotation``: the scan's."""
    if entry.unsafe_seek:
        return StreamHint(keyframe_indices=(0,), fps=entry.fps or 1.0,
                          num_frames=entry.num_frames or None, unsafe_seek=True, rotation=rotation)
    if entry.vfr or not entry.keyframes or entry.keyframes[0] != 0 or not entry.fps:
        return None
    try:
        return StreamHint(keyframe_indices=entry.keyframes, fps=entry.fps, num_frames=entry.num_frames or None,
                          reads=reads, rotation=rotation)
    except ValueError:
        return None
