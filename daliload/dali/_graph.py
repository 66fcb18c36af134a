"""One DALI pipeline's graph: how it is built, how a batch is fed to it, and its outputs as torch tensors.

The graph (``fn.external_source`` inputs, ``fn.decoders.video``, ``fn.resize``,
``fn.crop_mirror_normalize``) and why it is fed this way are drawn in
:mod:`daliload.dali._pipeline`, whose :class:`~daliload.dali.DaliClipDecoder`
builds one per pipeline and calls these on its waiting thread. DALI is passed
in (``pipeline_mod, fn, types`` from :func:`daliload.dali.import_dali`) or
imported when outputs are read: never at import time.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from daliload.plan import OutputSpec, Sample

if TYPE_CHECKING:
    import torch

Device = Literal["cpu", "gpu"]

#: DALI has no bfloat16: such batches are normalised in float32 and cast in torch (:meth:`DaliClipDecoder.result`).
DALI_DTYPES = {"float32": "FLOAT", "float16": "FLOAT16", "bfloat16": "FLOAT", "uint8": "UINT8"}
DALI_LAYOUTS = {"CTHW": "CFHW", "TCHW": "FCHW"}


def build(pipeline_mod: Any, fn: Any, types: Any, output: OutputSpec, *, batch_size: int, num_threads: int,
          device: Device, device_id: int | None, frames_given: bool) -> Any:
    """A built pipeline of the graph drawn in :mod:`daliload.dali._pipeline`, fed by :func:`feed`
    (``frames_given``: the frames to decode per sample; else each sample's start, stride and length, DALI
    padding past the end)."""
    pipe = pipeline_mod.Pipeline(
        batch_size=batch_size,
        num_threads=num_threads,
        device_id=device_id,
        prefetch_queue_depth=1,  # our own queue bounds the batches in flight (:mod:`daliload.dali._pipeline`)
        seed=0,
        exec_dynamic=True,  # survives a failed batch; queues any number of runs
    )
    out = output
    with pipe:
        encoded = fn.external_source(name="encoded", dtype=types.UINT8, ndim=1)
        if not frames_given:
            window = {"start_frame": fn.external_source(name="start_frame", dtype=types.INT32, ndim=0),
                      "stride": fn.external_source(name="frame_stride", dtype=types.INT32, ndim=0),
                      "sequence_length": fn.external_source(name="clip_len", dtype=types.INT32, ndim=0),
                      "pad_mode": "edge"}
        else:  # only frames that exist (:mod:`daliload.dali._pipeline`): nothing to pad
            window = {"frames": fn.external_source(name="frames", dtype=types.INT32, ndim=1),
                      "pad_mode": "none"}
        roi_start = fn.external_source(name="roi_start", dtype=types.FLOAT, ndim=1)
        roi_end = fn.external_source(name="roi_end", dtype=types.FLOAT, ndim=1)
        flip = fn.external_source(name="flip", dtype=types.INT32, ndim=0)
        decode_kw: dict[str, Any] = {}
        if device == "gpu":
            # Unpinned threads: several ranks per node would otherwise pin to the same cores.
            decode_kw["affine"] = False
        frames = fn.decoders.video(
            encoded, device="mixed" if device == "gpu" else "cpu", **window, **decode_kw,
        )
        frames = fn.resize(
            frames, roi_start=roi_start, roi_end=roi_end, roi_relative=True,
            size=[float(out.size[0]), float(out.size[1])], interp_type=types.INTERP_LINEAR,
            antialias=True,
        )
        videos = fn.crop_mirror_normalize(
            frames, mirror=flip, mean=list(out.mean), std=list(out.std),
            dtype=getattr(types, DALI_DTYPES[out.dtype]),
            output_layout=DALI_LAYOUTS[out.layout],
        )
        pipe.set_outputs(videos)
    pipe.build()
    return pipe


def feed(pipe: Any, samples: tuple[Sample, ...], encoded: list[np.ndarray],
         frame_ids: list[list[int]] | None) -> None:
    """Feed ``pipe`` one batch: the bytes, the window (start, stride, length; or ``frame_ids``), crop and flip."""
    column = np.asarray
    pipe.feed_input("encoded", encoded)
    if frame_ids is None:
        pipe.feed_input("start_frame", column([s.start_frame for s in samples], np.int32))
        pipe.feed_input("frame_stride", column([s.frame_stride for s in samples], np.int32))
        pipe.feed_input("clip_len", column([s.clip_len for s in samples], np.int32))
    else:
        pipe.feed_input("frames", [np.asarray(ids, dtype=np.int32) for ids in frame_ids])
    pipe.feed_input("roi_start", column([(s.crop.y0, s.crop.x0) for s in samples], np.float32))
    pipe.feed_input("roi_end", column([(s.crop.y1, s.crop.x1) for s in samples], np.float32))
    pipe.feed_input("flip", column([int(s.flip) for s in samples], np.int32))


def videos_to_torch(tensor_list: Any, lengths: tuple[int, ...], clip_len: int, layout: str,
                    device_id: int | None, dtype: "torch.dtype | None" = None) -> "torch.Tensor":
    """The batch as one ``(B, ...)`` tensor: a zero-copy view when every clip came back whole.

    Otherwise (a clip asked for fewer frames: its window ran past the end)
    one copy, with each short clip's last frame repeated up to ``clip_len``,
    queued on the current torch stream (the one the outputs are bound to),
    cast to ``dtype`` in that copy when one is given.
    """
    import torch
    from nvidia.dali.tensors import TensorListGPU

    if all(n == clip_len for n in lengths):
        return to_torch(tensor_list, device_id)
    time_axis = 1 if layout == "CTHW" else 0  # of one clip: CFHW or FCHW
    on_gpu = isinstance(tensor_list, TensorListGPU)
    with torch.cuda.device(device_id) if on_gpu else contextlib.nullcontext():
        clips = [torch.from_dlpack(tensor_list[i]) for i in range(len(tensor_list))]
        shape = list(clips[0].shape)
        shape[time_axis] = clip_len
        videos = clips[0].new_empty((len(clips), *shape), dtype=dtype or clips[0].dtype)
        for row, clip in zip(videos, clips):
            n = clip.shape[time_axis]
            row.narrow(time_axis, 0, n).copy_(clip)
            if n < clip_len:  # broadcast the last frame over the rest
                row.narrow(time_axis, n, clip_len - n).copy_(clip.narrow(time_axis, n - 1, 1))
    return videos


def to_torch(tensor_list: Any, device_id: int | None) -> "torch.Tensor":
    """DALI's outputs as one tensor, zero-copy through DLPack when they are dense."""
    import torch
    from nvidia.dali.tensors import TensorListGPU

    # Dense: one zero-copy view of the whole batch. Otherwise the samples
    # live in separate buffers and are stacked (one copy).
    dense = tensor_list.is_dense_tensor()
    parts = [tensor_list.as_tensor()] if dense else [tensor_list[i] for i in range(len(tensor_list))]
    on_gpu = isinstance(tensor_list, TensorListGPU)
    with torch.cuda.device(device_id) if on_gpu else contextlib.nullcontext():
        tensors = [torch.from_dlpack(p) for p in parts]
    return tensors[0] if dense else torch.stack(tensors)
