"""Ceilings: how fast plain decoding of the same files goes, measured in the same run.

- CPU (:class:`PyAVSequential`): as many processes as the loaders have
  workers (the run's ``--workers``), each with one decoder thread, every file
  decoded from start to end with PyAV, no RGB conversion, no transform. This
  is what those processes do when they only decode; its frames/s is also the
  full-decode speed behind the GOP-bound limit of exact-seeking decoders
  (:mod:`benchmarks.summary`).
- GPU (:class:`DaliWholeFiles`): ``fn.decoders.video`` (``device="mixed"``:
  NVDEC) over the bytes of whole files, batches of 32 files, 16 or more
  threads, one pipeline per NVDEC engine running at once (as many as the
  files fill), nothing else in the pipeline.
  This is what the GPU's decoders give when nothing else gets in the way; the
  NVML decoder utilisation of its row says how busy NVDEC was.

Both yield one :class:`~benchmarks.loaders.LoadedBatch` per file (or batch of
files) with ``videos=None``: ``num_clips`` counts whole files, so "clips/s" of
a ceiling is files/s.
"""

from __future__ import annotations

import math
import queue
import threading
from typing import Iterator, Sequence

import numpy as np

from benchmarks.loaders import LoadedBatch, LoaderAdapter


def decode_file_sequential(path: str) -> int:
    """Decode every frame of ``path``'s first video stream on one thread; return the frame count."""
    import av

    with av.open(path) as container:
        stream = container.streams.video[0]
        stream.thread_count = 1
        return sum(1 for _ in container.decode(stream))


class PyAVSequential(LoaderAdapter):
    """Whole files decoded by ``config.workers`` processes (0 or 1: in this process), files dealt in turn.

    The pool starts with the adapter (not timed); its processes import PyAV in
    the warm-up epoch, as a loader's workers do.
    """

    name = "ceiling-pyav"
    summary = ("CPU ceiling: PyAV decode of whole files, as many processes as the loaders' workers, "
               "1 decoder thread each, no RGB")
    counts_frames = True
    knob = "decoding processes"

    @classmethod
    def probe(cls, config) -> str | None:
        try:
            import av  # noqa: F401
        except ImportError as err:
            return f"PyAV is not installed ({err}); pip install av"
        return None

    def __init__(self, dataset, samples: Sequence, config) -> None:
        import multiprocessing

        self._paths = [video.path for video in dataset.videos]
        self._pool = None
        if config.workers > 1:
            methods = multiprocessing.get_all_start_methods()
            context = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
            self._pool = context.Pool(config.workers)

    def epoch(self) -> Iterator[LoadedBatch]:
        if self._pool is None:
            counts: Iterator[int] = map(decode_file_sequential, self._paths)
        else:
            counts = self._pool.imap_unordered(decode_file_sequential, self._paths, chunksize=1)
        for frames in counts:
            yield LoadedBatch(None, None, 1, frames)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool.join()


class _FileBatches:
    """External-source callback: the bytes of ``batch_size`` files per iteration, then StopIteration."""

    def __init__(self, paths: Sequence[str], batch_size: int) -> None:
        self.paths = list(paths)
        self.batch_size = batch_size

    def __call__(self, info) -> list[np.ndarray]:
        chunk = self.paths[info.iteration * self.batch_size:(info.iteration + 1) * self.batch_size]
        if not chunk:
            raise StopIteration
        return [np.fromfile(path, dtype=np.uint8) for path in chunk]


def _drain(pipeline, results: queue.Queue) -> None:
    """Run ``pipeline`` to the end of its files, putting ``(files, frames)`` per batch, then None."""
    try:
        while True:
            try:
                (decoded,) = pipeline.run()
            except StopIteration:
                pipeline.reset()
                return
            shapes = decoded.shape()
            results.put((len(shapes), int(sum(shape[0] for shape in shapes))))
    except BaseException as err:  # handed to the consumer, which raises it
        results.put(err)
    finally:
        results.put(None)


class DaliWholeFiles(LoaderAdapter):
    """GPU ceiling: what NVDEC gives when nothing else gets in the way.

    The files are dealt round-robin to ``ceil(files / 32)`` pipelines (at most
    :attr:`max_pipelines`: by default one per NVDEC engine of the GPU,
    :data:`daliload.prescreen.gpus.NVDEC_ENGINES`, 4 for a model not listed),
    each decoding batches of :attr:`batch_size` whole files with at least
    :attr:`min_threads` threads; the pipelines run at once, each from its own
    thread, so the engines work together (one pipeline's decoder mostly keeps
    one engine busy). 256 files make 7 pipelines on an H200. The harness
    samples the decoder utilisation through NVML during every timed epoch (the
    table's NVDEC %).
    ``decoder_device="cpu"`` runs the same pipelines on DALI's CPU decoder
    (VP8/VP9/MJPEG only).
    """

    name = "ceiling-dali"
    summary = ("GPU ceiling: fn.decoders.video(device='mixed') (NVDEC) over whole files, batches of 32, "
               ">= 16 threads, several pipelines at once, nothing else in the pipeline")
    counts_frames = True
    knob = "DALI threads"
    uses_nvdec = True
    #: files per batch; a decoded 10 s 340x256 file is 78 MB, a 720p one 0.8 GB (26 GB per batch).
    batch_size = 32
    min_threads = 16
    max_pipelines: int | None = None  # one per NVDEC engine of the GPU
    decoder_device = "mixed"

    @classmethod
    def probe(cls, config) -> str | None:
        try:
            import nvidia.dali  # noqa: F401
        except ImportError as err:
            return f"DALI is not installed ({err}); pip install nvidia-dali-cuda130 (or -cuda120)"
        return None

    def __init__(self, dataset, samples: Sequence, config) -> None:
        from nvidia.dali import fn, pipeline_def, types

        device_id = None
        if self.decoder_device == "mixed":
            import torch

            device_id = torch.cuda.current_device()
        paths = [video.path for video in dataset.videos]
        most = self.max_pipelines
        if most is None:
            from daliload.prescreen.gpus import detect_gpu

            most = detect_gpu().nvdec_engines or 4
        count = max(1, min(most, math.ceil(len(paths) / self.batch_size)))
        self.num_threads = max(self.min_threads, config.workers)

        @pipeline_def(batch_size=self.batch_size, num_threads=self.num_threads, device_id=device_id,
                      prefetch_queue_depth=1)  # one batch in flight per pipeline: whole files are large
        def whole_files(source):
            encoded = fn.external_source(source=source, batch=True, batch_info=True, dtype=types.UINT8, ndim=1)
            return fn.decoders.video(encoded, device=self.decoder_device)

        self._pipelines = []
        for index in range(count):
            pipeline = whole_files(_FileBatches(paths[index::count], self.batch_size))
            pipeline.build()
            self._pipelines.append(pipeline)

    def epoch(self) -> Iterator[LoadedBatch]:
        results: queue.Queue = queue.Queue()
        threads = [threading.Thread(target=_drain, args=(p, results), daemon=True) for p in self._pipelines]
        for thread in threads:
            thread.start()
        running, failure = len(threads), None
        while running:
            item = results.get()
            if item is None:
                running -= 1
            elif isinstance(item, BaseException):
                failure = failure or item
            elif failure is None:
                yield LoadedBatch(None, None, item[0], item[1])
        for thread in threads:
            thread.join()
        if failure is not None:
            raise failure

    def close(self) -> None:
        del self._pipelines


class DaliWholeFilesCPU(DaliWholeFiles):
    """The GPU ceiling's pipelines on DALI's CPU decoder: for testing them without a GPU (VP9 only)."""

    name = "ceiling-dali-cpu"
    summary = "fn.decoders.video(device='cpu') over whole files (VP8/VP9/MJPEG only)"
    decoder_device = "cpu"
    max_pipelines = 4
    uses_nvdec = False
    codecs = ("vp8", "vp9", "mjpeg")
