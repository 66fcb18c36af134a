"""decord: ``VideoReader(path).get_batch(indices)`` per clip, in spawned DataLoader workers.

decord 0.6.0 is the last release on PyPI (``pip install --no-deps decord==0.6.0``;
eva-decord installs the same module). Its wheels bundle their own FFmpeg and
decode on the CPU only (GPU decoding needs a source build). decord's default
thread count (0: FFmpeg decides) is kept, as users keep it. It seeks to the
keyframe before the clip and does not say how many frames it decoded.
"""

from __future__ import annotations

from typing import Sequence

from benchmarks.loaders import DataLoaderAdapter


def decode_frames(path: str, frame_indices: Sequence[int]):
    """The clip's frames as a ``(T, H, W, 3)`` uint8 array; frames decoded unknown (None)."""
    import decord

    reader = decord.VideoReader(path, ctx=decord.cpu(0))
    return reader.get_batch(list(frame_indices)).asnumpy(), None


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
