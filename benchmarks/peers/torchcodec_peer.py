"""torchcodec: ``VideoDecoder(path).get_frames_at(indices)`` per clip.

On the CPU it runs in spawned DataLoader workers, one decoder per
``__getitem__`` with torchcodec's default of one FFmpeg thread, in two seek
modes (it seeks to the keyframe before each frame it needs, so it decodes
about :func:`benchmarks.task.seek_decode_estimate` frames; it does not say how
many):

- ``torchcodec-cpu``: ``seek_mode="exact"``, torchcodec's default: each new
  decoder first scans the whole file to build its frame index;
- ``torchcodec-cpu-approx``: ``seek_mode="approximate"``, torchcodec's fast
  mode: no scan, frame positions computed from the stream's metadata. On
  constant-frame-rate files (every benchmark dataset) that seeks exactly:
  ``tests/test_bench_outputs.py`` checks its clips against the fallback's.
  torchcodec 0.13's other scan-free mode, ``custom_frame_mappings`` (a JSON
  frame index per file, made beforehand, e.g. with ffprobe), gives the same
  seeks on these files and would add reading that index per clip, so the
  approximate mode is its best here. This row is the fair counterpart of
  daliload's: daliload's scan is set-up too, not counted in clips/s.

On a GPU (``torchcodec-cuda``), torchcodec's CUDA decoder (NVDEC) in its
best mode by its own documentation ("Performance Tips", "Parallel video
decoding", and its GPU benchmark): ``seek_mode="approximate"`` (no scan; exact
on these constant-frame-rate files), one FFmpeg thread per decoder (its
default on CUDA), and the clips decoded by a pool of threads in the main
process (``config.workers`` of them: its documentation's multi-threaded
parallelism, which its GPU benchmark uses). The transform runs on the GPU.

torchcodec needs FFmpeg's shared libraries (Debian: ``apt-get install ffmpeg``)
and a wheel built for the installed torch: on a CPU-only torch 2.13 that is
``pip install --no-deps torchcodec==0.13.0``.
"""

from __future__ import annotations

from typing import Iterator, Sequence

from benchmarks.loaders import DataLoaderAdapter, LoadedBatch, LoaderAdapter


def decode_frames_cpu(path: str, frame_indices: Sequence[int], seek_mode: str = "exact"):
    """The clip's frames as a ``(T, H, W, 3)`` uint8 tensor; frames decoded unknown (None)."""
    from torchcodec.decoders import VideoDecoder

    decoder = VideoDecoder(path, device="cpu", dimension_order="NHWC", seek_mode=seek_mode)
    return decoder.get_frames_at(list(frame_indices)).data, None


def decode_frames_cpu_approximate(path: str, frame_indices: Sequence[int]):
    """As :func:`decode_frames_cpu`, with ``seek_mode="approximate"`` (no scan of the file)."""
    return decode_frames_cpu(path, frame_indices, seek_mode="approximate")


def _probe(device: str) -> str | None:
    try:
        from torchcodec.decoders import VideoDecoder  # noqa: F401
    except (ImportError, OSError, RuntimeError) as err:
        # torchcodec raises RuntimeError when it finds no usable FFmpeg libraries.
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return (f"torchcodec does not import: {first_line} (needs `pip install --no-deps torchcodec` "
                f"matching torch, and FFmpeg's shared libraries: apt-get install ffmpeg)")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            return "no CUDA device"
    return None


class TorchCodecCPU(DataLoaderAdapter):
    name = "torchcodec-cpu"
    summary = "torchcodec VideoDecoder(exact seek, 1 FFmpeg thread).get_frames_at in spawn DataLoader workers"
    decode = staticmethod(decode_frames_cpu)

    @classmethod
    def probe(cls, config) -> str | None:
        return _probe("cpu")


class TorchCodecCPUApproximate(TorchCodecCPU):
    name = "torchcodec-cpu-approx"
    summary = ("torchcodec VideoDecoder(seek_mode='approximate': no scan of the file, its fastest mode; "
               "1 FFmpeg thread).get_frames_at in spawn DataLoader workers")
    decode = staticmethod(decode_frames_cpu_approximate)


def decode_clip_cuda(path: str, frame_indices: Sequence[int], sample, output):
    """One clip on NVDEC, transformed on the GPU: what each thread of :class:`TorchCodecCUDA` runs."""
    from torchcodec.decoders import VideoDecoder

    from benchmarks.task import transform_clip

    decoder = VideoDecoder(path, device="cuda", dimension_order="NHWC", seek_mode="approximate")
    return transform_clip(decoder.get_frames_at(list(frame_indices)).data, sample, output)


class TorchCodecCUDA(LoaderAdapter):
    name = "torchcodec-cuda"
    summary = ("torchcodec VideoDecoder(device='cuda', seek_mode='approximate') (NVDEC), clips decoded by a pool "
               "of threads in the main process (the knob), the fallback's transform steps on the GPU (resize in "
               "float32: torch has no antialiased uint8 resize on CUDA)")
    needs_cuda = True
    uses_nvdec = True
    knob = "decoding threads"

    @classmethod
    def probe(cls, config) -> str | None:
        # A torchcodec built without CUDA imports fine and fails at its first CUDA
        # decoder: that surfaces as a failed warm-up epoch, with torchcodec's message.
        return _probe("cuda")

    def __init__(self, dataset, samples: Sequence, config) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self._samples = list(samples)
        self._num_frames = [v.num_frames for v in dataset.videos]
        self._task = config.task
        self._pool = ThreadPoolExecutor(max_workers=max(1, config.workers), thread_name_prefix="torchcodec-cuda")

    def epoch(self) -> Iterator[LoadedBatch]:
        import torch

        output = self._task.output
        clips = self._pool.map(lambda s: decode_clip_cuda(s.path, s.frame_indices(self._num_frames[s.video_index]),
                                                          s, output), self._samples)  # in plan order
        batch_size = self._task.batch_size
        for first in range(0, len(self._samples), batch_size):
            chunk = self._samples[first:first + batch_size]
            videos = [next(clips) for _ in chunk]
            labels = torch.tensor([s.label for s in chunk], device="cuda")
            yield LoadedBatch(torch.stack(videos), labels, len(chunk), None)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
