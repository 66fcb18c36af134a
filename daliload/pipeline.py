"""The DALI path: decode planned clips with ``fn.decoders.video``, crop, resize, flip, normalise.

(About 600 lines for one concept, the DALI decoder: the pipeline, the way
batches are fed, waited for with a time limit and handed over, and the errors
a batch can end in. Half of it is this docstring and the argument docs, which
record what DALI does; split apart, the waiting and the error rules would be
read without the pipeline they guard.)

One DALI pipeline per process (per rank), fed batch by batch with the plan::

    external_source: encoded file bytes (uint8, 1-D per sample), label,
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

Usage::

    decoder = DaliClipDecoder(OutputSpec(size=(224, 224)), batch_size=32, device="gpu")
    batch = decoder.decode_batch(samples)            # DecodedBatch(samples, videos, labels)

    # Keep several batches in flight: submit ahead, collect in order.
    for samples in batches:
        if decoder.pending == decoder.prefetch_queue_depth:
            consume(decoder.result())
        decoder.submit(samples)
    while decoder.pending:
        consume(decoder.result())

Windows past a file's end: a clip frame past the last frame repeats the last
frame (:func:`daliload.plan.clamp_frame_indices`, what the fallback does). Left
to DALI (``pad_mode="edge"``), each such frame costs a decode of the file from
frame 0: DALI maps it to the last frame and, having no frame index, goes back
to the start to decode it again for every repeat, so P padded frames cost about
P x N decoded frames (``python -m benchmarks.bench_padding`` measures it on
the CPU decoder). Given the plan's frame counts
(``DaliClipDecoder(num_frames=...)``), the decoder asks DALI only for the
frames that exist, each once (``frames=``), and repeats the last in torch,
after the crop and normalise::

    num_frames 90, start 70, stride 4, clip_len 8
    planned frames       70 74 78 82 86 89 89 89      (94, 98, 102 clamped to 89)
    DALI decodes         70 74 78 82 86 89            (one pass; without counts, about a pass per repeat)
    DecodedBatch.videos  70 74 78 82 86 89 89 89

The frames are the same either way. With counts, DALI pads nothing
(``pad_mode="none"``): a file holding fewer frames than the plan says fails
its batch (``Unexpected out-of-bounds frame index``, naming no sample), as a
start past the end does without counts, instead of being padded silently.
A batch with short clips leaves DALI as separate samples (a non-dense list),
so it is copied once into the ``(B, ...)`` tensor, repeats included; other
batches stay zero-copy views.

Why the plan is pushed rather than pulled: ``fn.external_source(parallel=True)``
runs a *source callback* in worker processes, pickled once when the pipeline
starts, that pulls batch ``i`` of a fixed schedule. The loader instead decides
batch by batch what DALI gets (it merges DALI and fallback routes, sends a
failed batch to the fallback, resumes mid-epoch), so the samples are pushed
with ``feed_input``. The only Python work per sample is reading the file,
which a thread pool does with the GIL released; worker processes would add
pickling and spawn cost for nothing.

How in-flight batches are kept: with DALI's default (dynamic) executor every
``schedule_run`` is queued and executed asynchronously, and any number can be
queued ahead of ``outputs`` (checked with DALI 2.4). The DALI ``Pipeline``
itself gets ``prefetch_queue_depth=1``: with a deeper queue its first run
insists on that many batches already fed, and feeding fewer kills the
pipeline. :class:`DaliClipDecoder` bounds the batches in flight with its own
``prefetch_queue_depth`` instead.

What ``fn.decoders.video`` does per sample (read in DALI's source near 2.4,
``dali/operators/video/decoder/`` and ``frames_decoder_gpu.cc``; not yet
observed on a GPU):

* Every run builds a new demuxer, bitstream filter and NVDEC parser for every
  sample, from the bytes fed in; the hardware decoder objects are taken from
  a per-process, per-GPU cache (keyed by codec, coded size, surfaces, chroma
  and bit depth) and given back afterwards.
* One task per sample on the operator's own pool of ``num_threads`` threads,
  so at most ``num_threads`` NVDEC sessions decode at once per pipeline; the
  driver spreads them over the GPU's engines (A100: 5, H100/H200: 7). All
  threads share the operator's one CUDA stream, and every decoded frame is
  mapped, converted to RGB and followed by a stream synchronisation before it
  is unmapped.
* No frame index is built: a window at ``start_frame`` is reached by decoding
  from frame 0 and dropping the frames before it. So DALI decodes
  ``start_frame + span`` frames per clip where the fallback decodes from the
  keyframe before the window; the benchmarks estimate DALI rows that way.
  The frame count DALI checks ``start_frame`` against is the container's
  ``nb_frames``, or the packet count.
* A file it cannot open fails as ``Failed to create video decoder for
  "memory file"``, which names no sample; a ``start_frame`` past the end says
  ``sample #i``. The loader isolates the former by bisecting the batch.

Keeping NVDEC busy: use ``num_threads`` of at least twice the engine count
(one session per engine decoding while another demuxes or converts), a batch
of at least ``num_threads`` clips, and ``prefetch_queue_depth`` 2 so the next
batch decodes while the training step runs; ``pipelines`` > 1 runs several
pipelines (each with its own threads and stream) in turn, for more sessions
at once. With ``device="cpu"``, ``num_threads`` is the number of clips decoded
in parallel on CPU cores.

Output buffers: with DALI's default (dynamic) executor, an output stays valid
as long as it is referenced; on a GPU :meth:`DaliClipDecoder.result` binds it
to the caller's current torch stream (no host synchronisation). A consumer
that keeps zero-copy views must hold the :class:`DecodedBatch` until its own
stream's work on them has run (the loader holds it until a CUDA event after
its copies completes: :class:`daliload.epoch.HeldOutputs`).

Errors: a batch DALI cannot decode (corrupt or truncated file, start frame past
what DALI counts, unsupported stream) raises :class:`DaliBatchError` from
:meth:`DaliClipDecoder.result`, naming every file of the batch; the pipeline
stays usable and the next batch decodes normally, so the loader can decode the
failed samples again through the PyAV fallback.

Time limit: :meth:`DaliClipDecoder.result` waits for DALI on one dedicated
thread, so a wait can be given up after ``timeout_s``: it raises
:class:`DaliTimeoutError`, naming the batch's files. A thread stuck inside
DALI cannot be stopped, so the decoder is unusable afterwards (every later
call raises); the loader lets the error end the run, loudly, rather than
hang it (under torchrun the other ranks are then stopped too), and the
process exits without waiting for the stuck batch (DALI's own exit hook
would wait for it: :func:`_exit_without_waiting_for`).

Abandoned batches: batches submitted ahead for a pass that ends early (an
exception in the training step, Ctrl-C, ``break``) are dropped with
:meth:`DaliClipDecoder.discard_pending`, which never waits: their outputs are
taken off DALI's queue by the waiting thread, in order, before the next
batch's.
"""

from __future__ import annotations

import atexit
import collections
import concurrent.futures
import contextlib
import functools
import logging
import os
import queue
import re
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Mapping, Sequence

import numpy as np

from daliload.dist import require_cuda
from daliload.plan import OutputSpec, Sample, clamp_frame_indices

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

Device = Literal["cpu", "gpu"]

INSTALL_HINT = (
    "pip install 'daliload[cuda13]' (NVIDIA driver >= 580) or 'daliload[cuda12]' (driver >= 525)"
)

_DALI_DTYPES = {"float16": "FLOAT16", "float32": "FLOAT", "uint8": "UINT8"}
_DALI_LAYOUTS = {"CTHW": "CFHW", "TCHW": "FCHW"}


def import_dali() -> tuple[Any, Any, Any]:
    """Import DALI lazily: ``(nvidia.dali.pipeline, nvidia.dali.fn, nvidia.dali.types)``.

    Raises:
        ImportError: DALI is not installed; the message says which ``pip
            install`` fixes it, raised from the original error.
    """
    try:
        import nvidia.dali.fn as fn
        import nvidia.dali.pipeline as pipeline
        import nvidia.dali.types as types
    except ImportError as err:
        raise ImportError(f"NVIDIA DALI is not installed; {INSTALL_HINT}") from err
    return pipeline, fn, types


def is_dali_available() -> bool:
    """True when ``nvidia.dali`` imports (without raising; for the loader's fallback-only mode)."""
    try:
        import_dali()
    except ImportError:
        return False
    return True


class DaliBatchError(RuntimeError):
    """DALI could not produce a batch; every sample of it must be decoded another way.

    Attributes:
        samples: the samples of the failed batch, in batch order.
        reason: DALI's (or the file reader's) explanation, shortened.
        culprit: the sample DALI's message points at (``"sample #i"``), when it
            names one; other samples of the batch may be fine.
    """

    def __init__(
        self, samples: Sequence[Sample], reason: str, *, culprit: Sample | None = None
    ) -> None:
        self.samples = tuple(samples)
        self.reason = reason
        self.culprit = culprit
        paths = list(dict.fromkeys(s.path for s in self.samples))
        blame = f" (cause: {culprit.path})" if culprit is not None else ""
        super().__init__(
            f"DALI failed to decode a batch of {len(self.samples)} clip(s){blame}: {reason}; "
            f"files: {', '.join(paths)}"
        )

    @property
    def paths(self) -> list[str]:
        """Paths of the batch's samples, in batch order (repeats kept)."""
        return [s.path for s in self.samples]

    def __reduce__(self):
        # Crosses process boundaries intact (the keyword-only culprit needs a helper).
        return (_rebuild_batch_error, (self.samples, self.reason, self.culprit))


def _rebuild_batch_error(samples, reason, culprit) -> DaliBatchError:
    return DaliBatchError(samples, reason, culprit=culprit)


class DaliTimeoutError(RuntimeError):
    """DALI did not finish a batch within the time limit; the decoder cannot be used any more.

    Attributes:
        samples: the samples of the batch DALI was decoding.
        timeout_s: the limit that passed, in seconds.
    """

    def __init__(self, samples: Sequence[Sample], timeout_s: float) -> None:
        self.samples = tuple(samples)
        self.timeout_s = timeout_s
        paths = list(dict.fromkeys(s.path for s in self.samples))
        super().__init__(
            f"DALI did not finish a batch of {len(self.samples)} clip(s) within {timeout_s:g} s; a thread "
            f"is stuck inside DALI, so this run cannot go on (raise DecodeSpec.timeout_s if such "
            f"batches are expected to be slow); files: {', '.join(paths)}"
        )


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
            :meth:`DaliClipDecoder.result` was called.
        labels: ``(B,)`` int64 class indices, on the CPU (also for ``"gpu"``).
        outputs: DALI's output buffers the videos come from. When ``videos`` is
            a copy (a batch with clips past their file's end), the copy is
            queued on the torch stream and reads these: holding this object
            until that stream's later work has run keeps them valid, as it does
            for zero-copy views.
    """

    samples: tuple[Sample, ...]
    videos: "torch.Tensor"
    labels: "torch.Tensor"
    outputs: Any = field(default=None, repr=False, compare=False)


@dataclass
class _Pending:
    samples: tuple[Sample, ...]
    error: DaliBatchError | None  # set when the batch never reached DALI (unreadable file)
    pipe: Any = None  # the DALI pipeline the batch went to
    lengths: tuple[int, ...] = ()  # frames asked of DALI per sample (< clip_len: repeat the last)


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
        num_threads: DALI worker threads: clips decoded at once (see the module
            docstring on NVDEC engines). Default 4.
        prefetch_queue_depth: most batches submitted and not yet collected.
            Default 2.
        read_threads: threads that read file bytes for :meth:`submit`. Default 4.
        pipelines: DALI pipelines, each with ``num_threads`` threads, that take
            the batches in turn (results still come in submission order).
            Several keep more NVDEC sessions open at once, for GPUs with many
            engines (H100/H200: 7); ``prefetch_queue_depth`` should be at
            least this. Default 1.
        num_frames: frames in each file (``path -> count``: the plan's counts,
            the manifest's ``num_frames``), or ``None`` (default). With counts,
            a window past its file's end decodes each existing frame once and
            its last frame is repeated in torch, and every submitted sample's
            file must have a count; without, DALI repeats it, decoding the
            file again per repeat (module docstring). The frames are the same.

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
        num_frames: Mapping[str, int] | None = None,
    ) -> None:
        if not isinstance(output, OutputSpec):
            raise TypeError(f"output must be an OutputSpec, got {type(output).__name__}")
        if num_frames is not None and not isinstance(num_frames, Mapping):
            raise TypeError(f"num_frames must be a mapping of path -> frame count or None, "
                            f"got {type(num_frames).__name__}")
        if device not in ("cpu", "gpu"):
            raise ValueError(f"device must be 'cpu' or 'gpu', got {device!r}")
        counts = {"batch_size": batch_size, "num_threads": num_threads,
                  "prefetch_queue_depth": prefetch_queue_depth, "read_threads": read_threads,
                  "pipelines": pipelines}
        for name, value in counts.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        pipeline_mod, fn, types = import_dali()
        if device == "gpu":
            import torch

            require_cuda()
            if device_id is None:
                device_id = torch.cuda.current_device()
        else:
            device_id = None
        self.output = output
        self.batch_size = batch_size
        self.device: Device = device
        self.device_id = device_id
        self.num_threads = num_threads
        self.prefetch_queue_depth = prefetch_queue_depth
        self.num_frames = num_frames
        self._pending: collections.deque[_Pending] = collections.deque()
        self._reader = ThreadPoolExecutor(max_workers=read_threads,
                                          thread_name_prefix="daliload-read")
        # Every wait for DALI's outputs runs on this one thread, so it can be timed out.
        self._waiter = _Waiter()
        self._stuck: DaliTimeoutError | None = None
        self._pipes = [self._build(pipeline_mod, fn, types) for _ in range(pipelines)]
        self._next_pipe = 0

    @property
    def pipelines(self) -> int:
        """DALI pipelines batches are spread over, in turn."""
        return len(self._pipes)

    @property
    def _pipe(self) -> Any:
        """The first pipeline (``None`` once closed)."""
        return self._pipes[0] if self._pipes else None

    # -- pipeline -------------------------------------------------------------

    def _build(self, pipeline_mod: Any, fn: Any, types: Any) -> Any:
        pipe = pipeline_mod.Pipeline(
            batch_size=self.batch_size,
            num_threads=self.num_threads,
            device_id=self.device_id,
            prefetch_queue_depth=1,  # our own queue bounds the batches in flight (module docstring)
            seed=0,
            exec_dynamic=True,  # survives a failed batch; queues any number of runs
        )
        out = self.output
        with pipe:
            encoded = fn.external_source(name="encoded", dtype=types.UINT8, ndim=1)
            labels = fn.external_source(name="label", dtype=types.INT64, ndim=0)
            if self.num_frames is None:
                window = {"start_frame": fn.external_source(name="start_frame", dtype=types.INT32, ndim=0),
                          "stride": fn.external_source(name="frame_stride", dtype=types.INT32, ndim=0),
                          "sequence_length": fn.external_source(name="clip_len", dtype=types.INT32, ndim=0),
                          "pad_mode": "edge"}
            else:  # only frames that exist (module docstring): nothing to pad
                window = {"frames": fn.external_source(name="frames", dtype=types.INT32, ndim=1),
                          "pad_mode": "none"}
            roi_start = fn.external_source(name="roi_start", dtype=types.FLOAT, ndim=1)
            roi_end = fn.external_source(name="roi_end", dtype=types.FLOAT, ndim=1)
            flip = fn.external_source(name="flip", dtype=types.INT32, ndim=0)
            decode_kw: dict[str, Any] = {}
            if self.device == "gpu":
                # Unpinned threads: several ranks per node would otherwise pin to the same cores.
                decode_kw["affine"] = False
            frames = fn.decoders.video(
                encoded, device="mixed" if self.device == "gpu" else "cpu", **window, **decode_kw,
            )
            frames = fn.resize(
                frames, roi_start=roi_start, roi_end=roi_end, roi_relative=True,
                size=[float(out.size[0]), float(out.size[1])], interp_type=types.INTERP_LINEAR,
                antialias=True,
            )
            videos = fn.crop_mirror_normalize(
                frames, mirror=flip, mean=list(out.mean), std=list(out.std),
                dtype=getattr(types, _DALI_DTYPES[out.dtype]),
                output_layout=_DALI_LAYOUTS[out.layout],
            )
            pipe.set_outputs(videos, labels)
        pipe.build()
        return pipe

    # -- public API -----------------------------------------------------------

    @property
    def pending(self) -> int:
        """Batches submitted and not yet collected with :meth:`result`."""
        return len(self._pending)

    @property
    def stuck(self) -> bool:
        """True once a wait timed out: a thread is stuck inside DALI and nothing more will come."""
        return self._stuck is not None

    def submit(self, samples: Sequence[Sample]) -> None:
        """Read the files of ``samples`` and queue them for decoding; does not wait for DALI.

        Args:
            samples: 1 to ``batch_size`` samples with the same ``clip_len``.

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
        frame_ids = None if self.num_frames is None else _frames_to_decode(samples, self.num_frames)
        if self._pipe is None:
            raise RuntimeError("this DaliClipDecoder is closed")
        if self._stuck is not None:
            raise RuntimeError(f"this DaliClipDecoder is unusable: {self._stuck}")
        if len(self._pending) >= self.prefetch_queue_depth:
            raise RuntimeError(
                f"{len(self._pending)} batches are already pending (prefetch_queue_depth="
                f"{self.prefetch_queue_depth}); call result() before submitting more"
            )
        paths = list(dict.fromkeys(s.path for s in samples))  # one read per file: a video's views share it
        try:
            by_path = dict(zip(paths, self._reader.map(_read_file, paths)))
        except OSError as err:
            bad = next((s for s in samples if s.path == getattr(err, "filename", None)), None)
            error = DaliBatchError(samples, f"cannot read file: {err}", culprit=bad)
            self._pending.append(_Pending(samples, error))
            return
        pipe = self._pipes[self._next_pipe]
        self._next_pipe = (self._next_pipe + 1) % len(self._pipes)
        self._feed(pipe, samples, [by_path[s.path] for s in samples], frame_ids)
        pipe.schedule_run()
        lengths = tuple(s.clip_len for s in samples) if frame_ids is None else tuple(map(len, frame_ids))
        self._pending.append(_Pending(samples, None, pipe, lengths))

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
        waiting = self._waiter.submit(self._outputs_call(entry.pipe))
        try:
            videos_tl, labels_tl = waiting.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            self._stuck = DaliTimeoutError(entry.samples, timeout_s)
            _exit_without_waiting_for(self._waiter)
            raise self._stuck from None
        except RuntimeError as err:
            reason = dali_error_reason(str(err))
            match = re.search(r"sample #(\d+)", str(err))
            culprit = None
            if match and int(match.group(1)) < len(entry.samples):
                culprit = entry.samples[int(match.group(1))]
            logger.debug("DALI batch failed: %s", err)
            raise DaliBatchError(entry.samples, reason, culprit=culprit) from err
        videos = self._videos_to_torch(videos_tl, entry.lengths, entry.samples[0].clip_len)
        # Labels never touch the GPU (a CPU input): moving them there would cost a
        # synchronous copy per batch for a value the plan already has.
        labels = self._to_torch(labels_tl)
        return DecodedBatch(entry.samples, videos, labels, outputs=(videos_tl, labels_tl))

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
                self._waiter.submit(entry.pipe.outputs, discard=True)
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
        counts = "None" if self.num_frames is None else f"<{len(self.num_frames)} files>"
        return (f"DaliClipDecoder(device={self.device!r}, device_id={self.device_id}, "
                f"batch_size={self.batch_size}, num_threads={self.num_threads}, pipelines={self.pipelines}, "
                f"prefetch_queue_depth={self.prefetch_queue_depth}, num_frames={counts}, output={self.output})")

    # -- internals ------------------------------------------------------------

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

    def _feed(self, pipe: Any, samples: tuple[Sample, ...], encoded: list[np.ndarray],
              frame_ids: list[list[int]] | None) -> None:
        def column(values: list, dtype: type) -> np.ndarray:
            return np.asarray(values, dtype=dtype)

        pipe.feed_input("encoded", encoded)
        pipe.feed_input("label", column([s.label for s in samples], np.int64))
        if frame_ids is None:
            pipe.feed_input("start_frame", column([s.start_frame for s in samples], np.int32))
            pipe.feed_input("frame_stride", column([s.frame_stride for s in samples], np.int32))
            pipe.feed_input("clip_len", column([s.clip_len for s in samples], np.int32))
        else:
            pipe.feed_input("frames", [np.asarray(ids, dtype=np.int32) for ids in frame_ids])
        pipe.feed_input("roi_start", column([(s.crop.y0, s.crop.x0) for s in samples], np.float32))
        pipe.feed_input("roi_end", column([(s.crop.y1, s.crop.x1) for s in samples], np.float32))
        pipe.feed_input("flip", column([int(s.flip) for s in samples], np.int32))

    def _videos_to_torch(self, tensor_list: Any, lengths: tuple[int, ...], clip_len: int) -> "torch.Tensor":
        """The batch as one ``(B, ...)`` tensor: a zero-copy view when every clip came back whole.

        Otherwise (a clip asked for fewer frames: its window ran past the end)
        one copy, with each short clip's last frame repeated up to ``clip_len``,
        queued on the current torch stream (the one the outputs are bound to).
        """
        import torch
        from nvidia.dali.tensors import TensorListGPU

        if all(n == clip_len for n in lengths):
            return self._to_torch(tensor_list)
        time_axis = 1 if self.output.layout == "CTHW" else 0  # of one clip: CFHW or FCHW
        on_gpu = isinstance(tensor_list, TensorListGPU)
        with torch.cuda.device(self.device_id) if on_gpu else contextlib.nullcontext():
            clips = [torch.from_dlpack(tensor_list[i]) for i in range(len(tensor_list))]
            shape = list(clips[0].shape)
            shape[time_axis] = clip_len
            videos = clips[0].new_empty((len(clips), *shape))
            for row, clip in zip(videos, clips):
                n = clip.shape[time_axis]
                row.narrow(time_axis, 0, n).copy_(clip)
                if n < clip_len:  # broadcast the last frame over the rest
                    row.narrow(time_axis, n, clip_len - n).copy_(clip.narrow(time_axis, n - 1, 1))
        return videos

    def _to_torch(self, tensor_list: Any) -> "torch.Tensor":
        import torch
        from nvidia.dali.tensors import TensorListGPU

        dense = tensor_list.is_dense_tensor()
        # Dense: one zero-copy view of the whole batch. Otherwise the samples
        # live in separate buffers and are stacked (one copy).
        if dense:
            parts = [tensor_list.as_tensor()]
        else:
            parts = [tensor_list[i] for i in range(len(tensor_list))]
        if isinstance(tensor_list, TensorListGPU):
            with torch.cuda.device(self.device_id):
                tensors = [torch.from_dlpack(p) for p in parts]
        else:
            tensors = [torch.from_dlpack(p) for p in parts]
        return tensors[0] if dense else torch.stack(tensors)


class _Waiter:
    """One daemon thread that runs the waits for DALI, one at a time, in order.

    A daemon, unlike ``ThreadPoolExecutor``'s threads (joined at interpreter
    exit), so a wait stuck inside DALI cannot keep the process from exiting.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.busy = False  # inside a call to DALI
        threading.Thread(target=self._run, name="daliload-dali-wait", daemon=True).start()

    def _run(self) -> None:
        while True:
            fn, future = self._jobs.get()
            if fn is None:
                return
            self.busy = True
            try:
                if future is None:  # a discarded batch: taken off DALI's queue, nobody waits for it
                    try:
                        fn()
                    except Exception as err:  # noqa: BLE001 - the result of a dropped batch, failed or not
                        logger.debug("a discarded DALI batch failed: %s", err)
                elif future.set_running_or_notify_cancel():
                    try:
                        future.set_result(fn())
                    except BaseException as err:  # noqa: BLE001 - handed to the waiting caller
                        future.set_exception(err)
            finally:
                self.busy = False

    def submit(self, fn, *, discard: bool = False) -> concurrent.futures.Future | None:
        """Queue ``fn``; its future, or ``None`` when ``discard`` (run it, drop its result)."""
        future: concurrent.futures.Future | None = None if discard else concurrent.futures.Future()
        self._jobs.put((fn, future))
        return future

    def close(self) -> None:
        self._jobs.put((None, None))


#: Waiters whose wait for DALI timed out (see :func:`_exit_without_waiting_for`).
_STUCK_WAITERS: list[_Waiter] = []


def _exit_without_waiting_for(waiter: _Waiter) -> None:
    """Make the process exit without waiting for DALI's work once ``waiter``'s wait timed out.

    At exit DALI shuts every pipeline down (its own ``atexit`` hook), which
    waits for the batches it is running: forever for one stuck inside a
    decoder, and minutes for one that is merely slow (a 10,000-frame window
    was seen to take that long). After a :class:`DaliTimeoutError` the run
    cannot go on anyway, so this hook, registered after DALI's and so run
    before it, ends the process at once while DALI is still busy: status 1 if
    an uncaught exception is ending the script (the usual case: the
    ``DaliTimeoutError`` itself), else 0. Output streams and logging are
    flushed first; the worker processes die with their parent.
    """
    if not _STUCK_WAITERS:
        atexit.register(_exit_if_dali_is_stuck)
    _STUCK_WAITERS.append(waiter)


def _exit_if_dali_is_stuck() -> None:
    if not any(waiter.busy for waiter in _STUCK_WAITERS):
        return  # DALI finished meanwhile: its own shutdown will not wait
    status = 1 if getattr(sys, "last_value", None) is not None else 0
    logger.warning("exiting without waiting for DALI: a batch past its time limit is still running")
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass  # closed or replaced: nothing to flush
    os._exit(status)


def _read_file(path: str) -> np.ndarray:
    data = np.fromfile(path, dtype=np.uint8)
    if data.size == 0:
        raise OSError(0, "file is empty", path)
    return data


def dali_error_reason(message: str) -> str:
    """DALI's error text without the pipeline-definition traceback and C++ context lines."""
    tail = message.rsplit("encountered:", 1)[-1]
    noise = ("C++ context", "Current pipeline object", "Critical error")
    lines = [line.strip() for line in tail.splitlines()
             if line.strip() and not line.strip().startswith(noise)]
    return " ".join(lines) or message.strip().splitlines()[0]


def _frames_to_decode(samples: tuple[Sample, ...], num_frames: Mapping[str, int]) -> list[list[int]]:
    """The frames to ask DALI for, per sample: the clip's, clamped to the file, the last one once.

    Example: 90 frames, start 70, stride 4, clip_len 8 -> ``[70, 74, 78, 82, 86, 89]``
    (the clip is ``... 86, 89, 89, 89``: the decoder repeats the last frame).
    """
    out = []
    for s in samples:
        count = num_frames.get(s.path)
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
