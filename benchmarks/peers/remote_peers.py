"""The rows of ``python -m benchmarks.bench_remote``: loaders reading the run's plan from an S3 store.

Each runs in its own measuring process (:mod:`benchmarks.measure`, served by
:mod:`benchmarks.interleave`), whose environment says where the data is:

- ``AWS_ENDPOINT_URL``: the store (a :class:`benchmarks.remote_store.ThrottledProxy`);
- ``BENCH_REMOTE_SOURCE``: the root :class:`daliload.KineticsDALILoader` is given
  (the local dataset, ``s3://BUCKET`` of its files, or ``s3://BUCKET`` of its shards);
- ``BENCH_REMOTE_PREFIX``: where the peers find the files: the local path
  ``ROOT/REL`` is the object ``PREFIX/REL`` (``ROOT`` is the dataset's folder);
- ``BENCH_REMOTE_STATS``: a file the daliload row appends each epoch's
  ``stats()`` remote counters to (one JSON line per epoch).

Rows:

- ``daliload``: the loader with its defaults (``DecodeSpec()``), as users run
  it; its own plan for epoch 0 must be the run's (same files by name, windows,
  crops, flips), or it refuses to run.
- ``torchcodec``: ``VideoDecoder(f)`` on ``f = fsspec.open("s3://...", "rb")``,
  torchcodec's documented way to decode from a file-like object, with its
  defaults (exact seek mode: it scans the file first) and s3fs's defaults for
  the file (block size 50 MiB, ``readahead`` cache), in spawned DataLoader workers.
- ``whole object``: the object read whole (``fs.cat_file``: one GET, after
  the HEAD s3fs sends first for its size), then
  decoded from memory with PyAV, frames from 0 through the window's last
  (how a webdataset pipeline gets a video: the whole sample, then a decoder).

The peers use the fallback's transform (:func:`benchmarks.task.transform_clip`).
"""

from __future__ import annotations

import json
import os
from typing import Iterator, Sequence

from benchmarks.loaders import DataLoaderAdapter, LoadedBatch, LoaderAdapter


def object_uri(path: str) -> str:
    """The object of the local file ``path`` (see the module docstring)."""
    relative = os.path.relpath(path, os.environ["BENCH_REMOTE_ROOT"])
    return os.environ["BENCH_REMOTE_PREFIX"].rstrip("/") + "/" + relative.replace(os.sep, "/")


def decode_torchcodec_fsspec(path: str, frame_indices: Sequence[int]):
    """The clip's frames ``(T, H, W, 3)`` decoded by torchcodec from an fsspec file of the object."""
    import fsspec
    from torchcodec.decoders import VideoDecoder

    with fsspec.open(object_uri(path), "rb") as f:
        decoder = VideoDecoder(f, device="cpu", dimension_order="NHWC")
        return decoder.get_frames_at(list(frame_indices)).data, None


def decode_whole_object(path: str, frame_indices: Sequence[int]):
    """The clip's frames ``(T, H, W, 3)``: one GET of the whole object, PyAV decoding it from memory."""
    import io

    import av
    import fsspec
    import numpy as np

    uri = object_uri(path)
    data = fsspec.filesystem(uri.split("://", 1)[0]).cat_file(uri)
    wanted = set(frame_indices)
    last = max(frame_indices)
    frames: dict[int, np.ndarray] = {}
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        for n, frame in enumerate(container.decode(stream)):
            if n in wanted:
                frames[n] = frame.to_ndarray(format="rgb24")
            if n >= last:
                break
    missing = wanted - frames.keys()
    if missing:
        raise ValueError(f"{uri}: decoded {len(frames)} of the window's frames; frames {sorted(missing)[:5]} "
                         f"are past the end")
    return np.stack([frames[i] for i in frame_indices]), last + 1


def _probe_s3() -> str | None:
    try:
        import s3fs  # noqa: F401
    except ImportError as err:
        return f"s3fs is not installed ({err}); pip install -e .[bench]"
    return None


class TorchcodecFsspec(DataLoaderAdapter):
    name = "torchcodec"
    summary = ("torchcodec VideoDecoder(fsspec.open(s3 URI)) with its defaults (exact seek mode; s3fs file: "
               "50 MiB blocks, readahead cache), get_frames_at, in spawned DataLoader workers")
    decode = staticmethod(decode_torchcodec_fsspec)

    @classmethod
    def probe(cls, config) -> str | None:
        from benchmarks.peers.torchcodec_peer import _probe

        return _probe_s3() or _probe("cpu")


class WholeObject(DataLoaderAdapter):
    name = "whole object"
    summary = ("the object read whole (s3fs cat_file: a HEAD, then one GET), PyAV decoding it from memory from frame 0 "
               "through the window's last (webdataset's way), in spawned DataLoader workers")
    counts_frames = True
    decode = staticmethod(decode_whole_object)

    @classmethod
    def probe(cls, config) -> str | None:
        return _probe_s3()


def remote_counters(stats) -> dict:
    return {"remote_bytes": stats.remote_bytes, "remote_requests": stats.remote_requests,
            "remote_retries": stats.remote_retries, "remote_failed_reads": stats.remote_failed_reads}


class DaliloadRemote(LoaderAdapter):
    """:class:`daliload.KineticsDALILoader` with its defaults on ``BENCH_REMOTE_SOURCE`` (local, files or shards)."""

    name = "daliload"
    summary = ("KineticsDALILoader(root) with its defaults (DecodeSpec()), its own plan for epoch 0 (= the run's), "
               "as users run it")
    knob = None  # its defaults: 2 fallback workers, the same for every root

    @classmethod
    def probe(cls, config) -> str | None:
        from benchmarks.peers.daliload_peer import Daliload

        return Daliload.probe(config)

    def __init__(self, dataset, samples: Sequence, config) -> None:
        from daliload.loader import DecodeSpec, KineticsDALILoader

        task = config.task
        self._loader = KineticsDALILoader(
            os.environ["BENCH_REMOTE_SOURCE"], "train", batch_size=task.batch_size, clip_len=task.clip_len,
            frame_stride=task.frame_stride, seed=task.seed, last_batch="partial", augment=task.augment,
            output=task.output, device="cpu", decode=DecodeSpec())
        check_same_windows([s for batch in self._loader.plan(0) for s in batch], samples)
        self._stats_file = os.environ.get("BENCH_REMOTE_STATS")
        self._before = remote_counters(self._loader.stats())

    def epoch(self) -> Iterator[LoadedBatch]:
        self._loader.set_epoch(0)  # every epoch replays the run's plan, as for the other rows
        for videos, labels in self._loader:
            yield LoadedBatch(videos, labels, int(labels.shape[0]), None)
        stats = self._loader.stats()
        if stats.failures:
            raise ValueError(f"{self.name}: {len(stats.failures)} sample(s) failed to decode, first "
                             f"{stats.failures[0].path}: {stats.failures[0].reason}")
        after = remote_counters(stats)
        if self._stats_file:
            with open(self._stats_file, "a", encoding="utf-8") as f:
                f.write(json.dumps({k: after[k] - self._before[k] for k in after} | {
                    "clips_dali": stats.clips_dali, "clips_fallback": stats.clips_fallback}) + "\n")
        self._before = after

    def close(self) -> None:
        self._loader.close()


def check_same_windows(loader_plan: Sequence, run_plan: Sequence) -> None:
    """Raise unless the loader's plan has the run plan's files (by name), windows, crops and flips, in order.

    Files are compared by name (the last part of a path, URI or shard member
    address), so a plan over the store's URIs or over shard members compares
    with the run's plan over the local files.

    Raises:
        ValueError: the plans differ; the message names the first sample that does.
    """
    if len(loader_plan) != len(run_plan):
        raise ValueError(f"daliload planned {len(loader_plan)} samples, the run's plan has {len(run_plan)}")
    for ours, theirs in zip(loader_plan, run_plan):
        if (os.path.basename(ours.path), ours.start_frame, ours.frame_stride, ours.clip_len, ours.crop, ours.flip) \
                != (os.path.basename(theirs.path), theirs.start_frame, theirs.frame_stride, theirs.clip_len,
                    theirs.crop, theirs.flip):
            raise ValueError(f"daliload's own plan differs from the run's plan at position {theirs.position}: "
                             f"loader {ours} against run {theirs}")
