"""The DALI path: decode planned clips with ``fn.decoders.video``, crop, resize, flip, normalise.

One DALI pipeline per process (per rank), fed batch by batch with the plan::

    external_source: encoded file bytes (uint8, 1-D per sample),
                     start_frame, frame_stride, clip_len (0-d int32 each)
                       | frames (1-D int32: with frame counts, see below),
                     roi_start, roi_end ((y, x) relative, float32), flip (0-d)
      -> fn.decoders.video(device="mixed" on a GPU | "cpu",
                           start_frame, sequence_length=clip_len, stride, pad_mode="edge"
                             | frames, pad_mode="none")
      -> fn.resize(roi_start, roi_end, roi_relative=True, size=OutputSpec.size, antialias)
      -> fn.crop_mirror_normalize(mirror=flip, mean, std, dtype, "CFHW" | "FCHW")
      -> torch tensors, zero-copy through DLPack (CPU tensors for device "cpu");
         a clip DALI returned short gets its last frame repeated here, in torch

Usage (the loader goes through :class:`daliload.dali.DaliSource`)::

    decoder = DaliClipDecoder(OutputSpec(size=(224, 224)), batch_size=32, device="gpu")
    batch = decoder.decode_batch(samples)            # DecodedBatch(samples, videos)
    decoder.submit(samples); decoder.submit(more)    # batches in flight ...
    first, second = decoder.result(), decoder.result()  # ... collected in order

Windows past a file's end repeat the last frame, as on the fallback. Given
the plan's frame counts (``DaliClipDecoder(num_frames=...)``) DALI is asked
only for the frames that exist and the last is repeated in torch (left to
DALI, each repeat costs a decode from frame 0). What ``fn.decoders.video``
does per sample, why the plan is pushed, how batches in flight are kept and
NVDEC kept busy: ``docs/architecture.md``, "DALI's video decoder".

Outputs stay valid while referenced (the dynamic executor); on a GPU
:meth:`DaliClipDecoder.result` binds them to the caller's torch stream (no
host wait). A batch DALI cannot decode raises :class:`DaliBatchError` naming
its files; the pipeline stays usable. A wait past its time limit raises
:class:`~daliload.dali.DaliTimeoutError` and the decoder is unusable
from then on (:mod:`daliload.dali._wait`). Batches of an abandoned pass are
dropped with :meth:`DaliClipDecoder.discard_pending`, which never waits.
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import logging
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping, Sequence

import numpy as np

from daliload.dali._errors import DaliBatchError, DaliTimeoutError, dali_error_reason, import_dali
from daliload.dali._graph import build, feed, videos_to_torch
from daliload.dali._wait import Waiter, exit_without_waiting_for
from daliload.plan import OutputSpec, Sample, clamp_frame_indices
from daliload.runtime import quiet_dali, require_cuda
from daliload.stream import DEFAULT_POLICY, ReadPolicy, read_video_file

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

Device = Literal["cpu", "gpu"]

@dataclass(frozen=True)
class DecodedBatch:
    """A decoded batch, in the order its samples were submitted.

    Attributes:
        samples: the plan samples, one per clip.
        videos: ``(B, C, T, H, W)`` for layout CTHW or ``(B, T, C, H, W)`` for
            TCHW, dtype and normalisation from the :class:`OutputSpec`, on the
            CPU or on ``cuda:device_id``. Shares memory with DALI's output
            buffer, which stays valid while this object is referenced; on a GPU
            it is ready in the order of the torch stream that was current when
            :meth:`DaliClipDecoder.result` was called. Labels are not DALI's
            business: they come from the plan (``samples``).
        outputs: DALI's output buffers the videos come from. When ``videos`` is
            a copy (a batch with clips past their file's end), the copy is
            queued on the torch stream and reads these: holding this object
            until that stream's later work has run keeps them valid, as it does
            for zero-copy views.
        owned: ``videos`` is a copy in torch's own memory (short clips padded,
            or a cast), not a view of DALI's buffers.

    A bfloat16 output (DALI has none) is normalised in float32; on the CPU the
    clips are cast here, on a GPU they stay float32 and whoever copies them
    casts in that copy (the loader's merge), so that they are copied once: a
    batch with short clips is padded straight into bfloat16.
    """

    samples: tuple[Sample, ...]
    videos: "torch.Tensor"
    outputs: Any = field(default=None, repr=False, compare=False)
    owned: bool = False


@dataclass
class _Pending:
    samples: tuple[Sample, ...]
    error: DaliBatchError | None  # set when the batch never reached DALI (unreadable file)
    pipe: Any = None  # the DALI pipeline the batch went to
    lengths: tuple[int, ...] = ()  # frames asked of DALI per sample (< clip_len: repeat the last)
    fed: concurrent.futures.Future | None = None  # feed_input + schedule_run, run on the waiting thread


class DaliClipDecoder:
    """Decode batches of planned clips with DALI (see the module docstring).

    Args:
        output: output size, mean/std, dtype and layout.
        batch_size: most samples per batch (shorter batches are fine).
        device: ``"gpu"`` decodes with NVDEC (``fn.decoders.video`` on
            ``"mixed"``) and returns CUDA tensors; ``"cpu"`` decodes with
            FFmpeg inside DALI (VP8, VP9 and MJPEG only) and returns CPU tensors.
        device_id: CUDA device for ``"gpu"`` (default: torch's current
            device, i.e. ``LOCAL_RANK`` once the training script set it).
            Ignored for ``"cpu"``.
        num_threads: DALI worker threads: clips decoded at once. Default 4.
        prefetch_queue_depth: most batches submitted and not yet collected. Default 2.
        read_threads: threads that read file bytes for :meth:`submit`. Default 4.
        read_policy: time limit and retries of each request, for videos in a store.
        pipelines: DALI pipelines, each with ``num_threads`` threads, taking
            the batches in turn (results still come in submission order), for
            more NVDEC sessions at once; at most ``prefetch_queue_depth``. Default 1.
        num_frames: ``path -> frames in the file`` (the manifest's; a mapping,
            or a function giving ``None`` for an unknown path), or ``None``
            (default). With counts, a window past its file's end decodes each
            existing frame once and its last frame is repeated in torch (every
            submitted file must have a count); without, DALI repeats it,
            decoding the file again per repeat. The frames are the same.

    Not thread-safe: submit and collect from one thread. One decoder per
    process (rank); build it once and reuse it across epochs.

    Raises:
        ImportError: DALI is not installed (the message says how to install it).
        ValueError: an argument out of range.
    """

    def __init__(
        self,
        output: OutputSpec,
        *,
        batch_size: int,
        device: Device = "gpu",
        device_id: int | None = None,
        num_threads: int = 4,
        prefetch_queue_depth: int = 2,
        read_threads: int = 4,
        pipelines: int = 1,
        num_frames: Mapping[str, int] | Callable[[str], int | None] | None = None,
        read_policy: ReadPolicy = DEFAULT_POLICY,
    ) -> None:
        if not isinstance(output, OutputSpec):
            raise TypeError(f"output must be an OutputSpec, got {type(output).__name__}")
        if num_frames is not None and not isinstance(num_frames, Mapping) and not callable(num_frames):
            raise TypeError(f"num_frames must be a mapping of path -> frame count (or a function of the path) "
                            f"or None, got {type(num_frames).__name__}")
        if device not in ("cpu", "gpu"):
            raise ValueError(f"device must be 'cpu' or 'gpu', got {device!r}")
        counts = {"batch_size": batch_size, "num_threads": num_threads,
                  "prefetch_queue_depth": prefetch_queue_depth, "read_threads": read_threads,
                  "pipelines": pipelines}
        for name, value in counts.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        pipeline_mod, fn, types = import_dali()
        quiet_dali()  # DALI's own log lines name no file; the loader reports a bad file once, with its path
        if device == "gpu":
            import torch

            require_cuda()
            if device_id is None:
                device_id = torch.cuda.current_device()
        else:
            device_id = None
        self.output = output.sized()
        self.batch_size = batch_size
        self.device: Device = device
        self.device_id = device_id
        self.num_threads = num_threads
        self.prefetch_queue_depth = prefetch_queue_depth
        self.num_frames = num_frames
        self._frames_of = num_frames.get if isinstance(num_frames, Mapping) else num_frames
        self._read_policy = read_policy
        self._pending: collections.deque[_Pending] = collections.deque()
        self._reader = ThreadPoolExecutor(max_workers=read_threads,
                                          thread_name_prefix="daliload-read")
        # Every wait for DALI's outputs runs on this one thread, so it can be timed out.
        self._waiter = Waiter()
        self._stuck: DaliTimeoutError | None = None
        self._pipes = [build(pipeline_mod, fn, types, self.output, batch_size=batch_size, num_threads=num_threads,
                             device=device, device_id=device_id, frames_given=num_frames is not None)
                       for _ in range(pipelines)]
        self._next_pipe = 0

    def _read(self, path: str):
        return read_video_file(path, policy=self._read_policy)

    @property
    def pipelines(self) -> int:
        """DALI pipelines batches are spread over, in turn."""
        return len(self._pipes)

    @property
    def _pipe(self) -> Any:
        """The first pipeline (``None`` once closed)."""
        return self._pipes[0] if self._pipes else None

    @property
    def pending(self) -> int:
        """Batches submitted and not yet collected with :meth:`result`."""
        return len(self._pending)

    def frames_for(self, samples: Sequence[Sample]) -> list[list[int]] | None:
        """The frames DALI is asked for, per sample (``None`` without ``num_frames``: DALI pads)."""
        return None if self._frames_of is None else _frames_to_decode(tuple(samples), self._frames_of)

    def submit(self, samples: Sequence[Sample], cuts: Sequence[Any] | None = None) -> None:
        """Read the files of ``samples`` and queue them for decoding; does not wait for DALI.

        Args:
            samples: 1 to ``batch_size`` samples with the same ``clip_len``.
            cuts: per sample, a ``daliload.stream.cut.WindowCut`` to decode instead of
                the whole file (its ``data``, frames numbered from its
                ``first_frame``), or ``None`` for the whole file. Only with
                ``num_frames``; default: every whole file.

        Raises:
            ValueError: empty or oversized batch, mixed clip lengths; with
                ``num_frames``, a file it has no count for, or a count that
                is not an integer >= 1.
            RuntimeError: ``prefetch_queue_depth`` batches are already pending
                (collect one with :meth:`result` first), or the decoder is closed.

        A file that cannot be read does not raise here: the batch is queued as
        failed and :meth:`result` raises its :class:`DaliBatchError` in turn.
        """
        samples = tuple(samples)
        self._check_batch(samples)
        frame_ids = self.frames_for(samples)
        cuts = [None] * len(samples) if cuts is None else list(cuts)
        if len(cuts) != len(samples) or (frame_ids is None and any(c is not None for c in cuts)):
            raise ValueError("cuts need num_frames and one entry (a cut or None) per sample")
        if self._pipe is None:
            raise RuntimeError("this DaliClipDecoder is closed")
        if self._stuck is not None:
            raise RuntimeError(f"this DaliClipDecoder is unusable: {self._stuck}")
        if len(self._pending) >= self.prefetch_queue_depth:
            raise RuntimeError(
                f"{len(self._pending)} batches are already pending (prefetch_queue_depth="
                f"{self.prefetch_queue_depth}); call result() before submitting more"
            )
        # One read per whole file: a video's views share it.
        paths = list(dict.fromkeys(s.path for s, cut in zip(samples, cuts) if cut is None))
        try:
            by_path = dict(zip(paths, self._reader.map(self._read, paths)))
        except OSError as err:
            bad = next((s for s in samples if s.path == getattr(err, "filename", None)), None)
            error = DaliBatchError(samples, f"cannot read file: {err}", culprit=bad)
            self._pending.append(_Pending(samples, error))
            return
        encoded = [by_path[s.path] if cut is None else np.frombuffer(cut.data, dtype=np.uint8)
                   for s, cut in zip(samples, cuts)]
        if frame_ids is not None:  # a cut's frame 0 is its first_frame of the file
            frame_ids = [ids if cut is None else [i - cut.first_frame for i in ids]
                         for ids, cut in zip(frame_ids, cuts)]
        pipe = self._pipes[self._next_pipe]
        self._next_pipe = (self._next_pipe + 1) % len(self._pipes)
        # Fed and run on the waiting thread, where every call on a pipeline runs (_feed_and_run).
        fed = self._waiter.submit(functools.partial(_feed_and_run, feed, pipe, samples, encoded, frame_ids))
        lengths = tuple(s.clip_len for s in samples) if frame_ids is None else tuple(map(len, frame_ids))
        self._pending.append(_Pending(samples, None, pipe, lengths, fed))

    def result(self, timeout_s: float | None = None) -> DecodedBatch:
        """Wait for the oldest pending batch and return it.

        Args:
            timeout_s: give up waiting after this many seconds (``None``: wait
                as long as DALI takes).

        Raises:
            DaliBatchError: DALI (or the file reader) failed on that batch. The
                batch is consumed; the decoder stays usable for the next one.
            DaliTimeoutError: DALI did not finish within ``timeout_s``; the
                decoder is unusable from then on.
            RuntimeError: nothing is pending, or an earlier wait timed out.
        """
        if self._stuck is not None:
            raise RuntimeError(f"this DaliClipDecoder is unusable: {self._stuck}")
        if not self._pending:
            raise RuntimeError("no batch is pending: submit() one first")
        entry = self._pending.popleft()
        if entry.error is not None:
            raise entry.error
        waiting = self._waiter.submit(_once_fed(entry.fed, self._outputs_call(entry.pipe)))
        try:
            (videos_tl,) = waiting.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            self._stuck = DaliTimeoutError(entry.samples, timeout_s)
            exit_without_waiting_for(self._waiter)
            raise self._stuck from None
        except RuntimeError as err:
            reason = dali_error_reason(str(err))
            match = re.search(r"sample #(\d+)", str(err))
            culprit = None
            if match and int(match.group(1)) < len(entry.samples):
                culprit = entry.samples[int(match.group(1))]
            logger.debug("DALI batch failed: %s", err)
            raise DaliBatchError(entry.samples, reason, culprit=culprit) from err
        import torch

        bfloat16 = self.output.dtype == "bfloat16"
        clip_len = entry.samples[0].clip_len
        owned = any(n != clip_len for n in entry.lengths)  # padded into a copy of torch's
        videos = videos_to_torch(videos_tl, entry.lengths, clip_len, self.output.layout, self.device_id,
                                 dtype=torch.bfloat16 if bfloat16 else None)
        if bfloat16 and self.device == "cpu" and videos.dtype != torch.bfloat16:
            videos, owned = videos.to(torch.bfloat16), True  # one cast; on a GPU the merge's copy casts
        return DecodedBatch(entry.samples, videos, outputs=(videos_tl,), owned=owned)

    def _outputs_call(self, pipe: Any):
        """``pipe.outputs``, bound on a GPU to the caller's current torch stream.

        Bound outputs are ready in stream order, with no host synchronisation:
        work the caller queues on that stream after this (the loader's copies)
        runs after DALI's. The stream is read here, on the caller's thread
        (torch's current stream is per thread), not on the waiting thread.
        """
        if self.device != "gpu":
            return pipe.outputs  # CPU outputs are ready when outputs() returns
        import torch

        stream = torch.cuda.current_stream(self.device_id)
        return functools.partial(pipe.outputs, cuda_stream=stream)

    def decode_batch(self, samples: Sequence[Sample], timeout_s: float | None = None) -> DecodedBatch:
        """Decode one batch and wait for it (:meth:`submit` then :meth:`result`).

        Raises:
            ValueError: as :meth:`submit`.
            DaliBatchError, DaliTimeoutError: as :meth:`result`.
            RuntimeError: other batches are pending (their results would come first).
        """
        if self._pending:
            raise RuntimeError(
                f"{len(self._pending)} batch(es) pending: collect them with result() first"
            )
        self.submit(samples)
        return self.result(timeout_s)

    def discard_pending(self) -> int:
        """Drop every pending batch without waiting for it; returns how many were dropped.

        Their outputs are taken off DALI's queue by the waiting thread, behind
        this call and ahead of any later :meth:`result`, so the next batch
        submitted is still the next one collected. Nothing here waits: an
        abandoned pass (an exception in the training step, Ctrl-C, ``break``
        and the end of the script) must not wait for DALI's work, least of all
        at interpreter exit, where the waiting thread no longer runs.
        """
        dropped = 0
        while self._pending:
            entry = self._pending.popleft()
            dropped += 1
            if entry.error is None and self._stuck is None:
                self._waiter.submit(_once_fed(entry.fed, entry.pipe.outputs), discard=True)
        return dropped

    def close(self) -> None:
        """Release the pipeline and the reader threads; pending batches are dropped."""
        self.discard_pending()
        self._pipes = []
        self._reader.shutdown(wait=True)
        self._waiter.close()  # a thread stuck inside DALI is a daemon: it cannot hold up the exit

    def __enter__(self) -> "DaliClipDecoder":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        counts = "None" if self.num_frames is None else (
            f"<{len(self.num_frames)} files>" if isinstance(self.num_frames, Mapping) else "<by path>")
        return (f"DaliClipDecoder(device={self.device!r}, device_id={self.device_id}, "
                f"batch_size={self.batch_size}, num_threads={self.num_threads}, pipelines={self.pipelines}, "
                f"prefetch_queue_depth={self.prefetch_queue_depth}, num_frames={counts}, output={self.output})")

    def _check_batch(self, samples: tuple[Sample, ...]) -> None:
        if not samples:
            raise ValueError("a batch needs at least one sample")
        if len(samples) > self.batch_size:
            raise ValueError(f"got {len(samples)} samples, more than batch_size={self.batch_size}")
        for s in samples:
            if not isinstance(s, Sample):
                raise TypeError(f"expected Sample items, got {type(s).__name__}")
        lengths = {s.clip_len for s in samples}
        if len(lengths) > 1:
            raise ValueError(
                f"all samples of a batch need the same clip_len to stack, got {sorted(lengths)}"
            )

def _feed_and_run(feed: Callable[..., None], pipe: Any, *batch: Any) -> None:
    """Feed one batch to ``pipe`` and schedule its run; the waiting thread runs this.

    Every call on a pipeline (``feed_input``, ``schedule_run``, ``outputs``)
    runs on that one thread, in submission order: after a pass is left early
    its batches are still taken off DALI's queue there (``discard_pending``)
    while the next pass submits, and DALI's executor queue and its Python
    counters (``Pipeline._batches_to_consume``) are not locked for two threads.
    """
    feed(pipe, *batch)
    pipe.schedule_run()


def _once_fed(fed: concurrent.futures.Future | None, call: Callable[[], Any]) -> Callable[[], Any]:
    """``call`` for the waiting thread, raising the batch's feed error instead when its feed failed.

    The feed ran before it on the same thread, so ``fed`` is done by then.
    """
    def run() -> Any:
        if fed is not None:
            fed.result(timeout=0)
        return call()
    return run


def _frames_to_decode(samples: tuple[Sample, ...], frames_of: Callable[[str], int | None]) -> list[list[int]]:
    """The frames to ask DALI for, per sample: the clip's, clamped to the file, the last one once.

    Example: 90 frames, start 70, stride 4, clip_len 8 -> ``[70, 74, 78, 82, 86, 89]``
    (the clip is ``... 86, 89, 89, 89``: the decoder repeats the last frame).
    """
    out = []
    for s in samples:
        count = frames_of(s.path)
        if count is None:
            raise ValueError(f"no frame count for {s.path} in this decoder's num_frames: give every "
                             f"file's count (the manifest's num_frames), or build it with num_frames=None")
        if not isinstance(count, (int, np.integer)) or isinstance(count, bool) or count < 1:
            raise ValueError(f"num_frames[{s.path!r}] must be an integer >= 1 (frames in the file), got {count!r}")
        ids = clamp_frame_indices(s.frame_indices(), int(count))
        while len(ids) > 1 and ids[-1] == ids[-2]:  # clamped repeats come last (the indices ascend)
            ids.pop()
        out.append(ids)
    return out
