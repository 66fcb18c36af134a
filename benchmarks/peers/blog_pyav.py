"""The blog approach: decode the whole file with PyAV inside ``Dataset.__getitem__``.

This is the loader most Kinetics tutorials and blog posts show::

    def __getitem__(self, i):
        container = av.open(self.paths[i])
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        clip = frames[start : start + 16 * 4 : 4]
        ...

under a ``DataLoader`` with worker processes (spawned here, since forking a
process that holds decoder threads can deadlock). Every frame of every file is
decoded and converted to RGB, whichever 16 the clip uses; PyAV's default
decoder threading is left as the tutorials leave it.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from benchmarks.loaders import DataLoaderAdapter


def decode_whole_file(path: str, frame_indices: Sequence[int]) -> tuple[np.ndarray, int]:
    """All frames of ``path`` as RGB, then the clip's: ``((T, H, W, 3) uint8, frames decoded)``.

    Raises:
        ValueError: the file yields fewer frames than the clip needs.
    """
    import av

    with av.open(path) as container:
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    if not frames or max(frame_indices) >= len(frames):
        raise ValueError(f"{path}: decoded {len(frames)} frames, the clip needs frame {max(frame_indices)}")
    return np.stack([frames[i] for i in frame_indices]), len(frames)


class BlogPyAV(DataLoaderAdapter):
    name = "blog-pyav"
    summary = "PyAV whole-file decode to an RGB list in Dataset.__getitem__, spawn DataLoader workers"
    counts_frames = True
    decode = staticmethod(decode_whole_file)

    @classmethod
    def probe(cls, config) -> str | None:
        try:
            import av  # noqa: F401
        except ImportError as err:
            return f"PyAV is not installed ({err}); pip install av"
        return None
