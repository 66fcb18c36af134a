"""decord: ``VideoReader(path).get_batch(indices)`` per clip, in spawned DataLoader workers.

decord 0.6.0 is the last release on PyPI (``pip install --no-deps decord==0.6.0``;
eva-decord installs the same module). Its wheels bundle their own FFmpeg and
decode on the CPU only (GPU decoding needs a source build). It seeks to the
keyframe before the clip and does not say how many frames it decoded. Two rows:

- ``decord-cpu``: decord's default thread count (``num_threads=0``: FFmpeg
  picks one from the core count), as users keep it; with 2 DataLoader workers
  on 2 cores that is more decoder threads than cores;
- ``decord-1thread``: ``num_threads=1``, one decoder thread per worker, as every
  other peer and daliload's fallback decode: the row that compares decoders
  rather than thread counts.
"""

from __future__ import annotations

from typing import Sequence

from benchmarks.loaders import DataLoaderAdapter


def decode_frames(path: str, frame_indices: Sequence[int], num_threads: int = 0):
    """The clip's frames as a ``(T, H, W, 3)`` uint8 array; frames decoded unknown (None).

    ``num_threads``: decord's decoder threads (0, its default: FFmpeg decides).
    """
    import decord

    reader = decord.VideoReader(path, ctx=decord.cpu(0), num_threads=num_threads)
    return reader.get_batch(list(frame_indices)).asnumpy(), None


def decode_frames_one_thread(path: str, frame_indices: Sequence[int]):
    """As :func:`decode_frames` with one decoder thread (``num_threads=1``)."""
    return decode_frames(path, frame_indices, num_threads=1)


class DecordCPU(DataLoaderAdapter):
    name = "decord-cpu"
    summary = "decord VideoReader.get_batch (default threads) in spawn DataLoader workers"
    decode = staticmethod(decode_frames)

    @classmethod
    def probe(cls, config) -> str | None:
        try:
            import decord  # noqa: F401
        except (ImportError, OSError) as err:
            return f"decord does not import ({err}); pip install --no-deps decord==0.6.0"
        return None


class DecordCPUOneThread(DecordCPU):
    name = "decord-1thread"
    summary = "decord VideoReader(num_threads=1).get_batch in spawn DataLoader workers"
    decode = staticmethod(decode_frames_one_thread)
