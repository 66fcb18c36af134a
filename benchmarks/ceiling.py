"""Ceilings: how fast plain decoding of the same files goes, measured in the same run.

- CPU (:class:`PyAVSequential`): one process, one decoder thread, every file
  decoded from start to end with PyAV, no RGB conversion, no transform. This
  is what one core does when it only decodes; a loader's frames/s divided by
  it says how many such cores' worth of decoding it delivers.
- GPU (:class:`DaliWholeFiles`): ``fn.decoders.video`` (``device="mixed"``:
  NVDEC) over the bytes of whole files, a few files per batch, nothing else in
  the pipeline. This is what the GPU's decoders give when nothing else gets
  in the way.

Both yield one :class:`~benchmarks.loaders.LoadedBatch` per file (or batch of
files) with ``videos=None``: ``num_clips`` counts whole files, so "clips/s" of
a ceiling is files/s.
"""

from __future__ import annotations

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
    name = "ceiling-pyav"
    summary = "CPU ceiling: sequential PyAV decode of whole files, 1 process, 1 decoder thread, no RGB"
    counts_frames = True
    knob = None

    @classmethod
    def probe(cls, config) -> str | None:
        try:
            import av  # noqa: F401
        except ImportError as err:
            return f"PyAV is not installed ({err}); pip install av"
        return None

    def __init__(self, dataset, samples: Sequence, config) -> None:
        self._paths = [video.path for video in dataset.videos]

    def epoch(self) -> Iterator[LoadedBatch]:
        for path in self._paths:
            yield LoadedBatch(None, None, 1, decode_file_sequential(path))


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


class DaliWholeFiles(LoaderAdapter):
    """GPU ceiling; ``decoder_device="cpu"`` runs the same pipeline on DALI's CPU decoder (VP8/VP9/MJPEG only)."""

    name = "ceiling-dali"
    summary = "GPU ceiling: fn.decoders.video(device='mixed') over whole files, nothing else in the pipeline"
    counts_frames = True
    knob = "DALI threads"
    #: files per batch: whole decoded files are large (300 frames at 720p: 0.8 GB).
    files_per_batch = 4
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

        gpu = self.decoder_device == "mixed"
        device_id = None
        if gpu:
            import torch

            device_id = torch.cuda.current_device()
        source = _FileBatches([video.path for video in dataset.videos], self.files_per_batch)

        @pipeline_def(batch_size=self.files_per_batch, num_threads=max(1, config.workers), device_id=device_id)
        def whole_files():
            encoded = fn.external_source(source=source, batch=True, batch_info=True, dtype=types.UINT8, ndim=1)
            return fn.decoders.video(encoded, device=self.decoder_device)

        self._gpu = gpu
        self._pipeline = whole_files()
        self._pipeline.build()

    def epoch(self) -> Iterator[LoadedBatch]:
        while True:
            try:
                (decoded,) = self._pipeline.run()
            except StopIteration:
                self._pipeline.reset()
                return
            if self._gpu:
                import torch

                torch.cuda.synchronize()  # waits for DALI's stream too: the frames exist
            shapes = decoded.shape()
            yield LoadedBatch(None, None, len(shapes), int(sum(shape[0] for shape in shapes)))

    def close(self) -> None:
        del self._pipeline


class DaliWholeFilesCPU(DaliWholeFiles):
    """The GPU ceiling's pipeline on DALI's CPU decoder: for testing it without a GPU (VP9 only)."""

    name = "ceiling-dali-cpu"
    summary = "fn.decoders.video(device='cpu') over whole files (VP8/VP9/MJPEG only)"
    decoder_device = "cpu"
    codecs = ("vp8", "vp9", "mjpeg")
