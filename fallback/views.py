"""All the views of one video from one decode: multi-view evaluation on the fallback path.

A multi-view plan (``make_val_plan(..., views=(T, S))``) gives a video
``T * S`` samples: ``T`` windows, each cropped ``S`` ways. Decoded one by one
that is ``T * S`` opens, demuxes and decodes of the same file, most of them
decoding the same frames again. :func:`decode_views` opens the file once and
asks :func:`fallback.decode.decode_window` for the union of the windows' frames
in ascending order, so every frame is decoded at most once (a frame two
windows share is decoded once and used twice, and non-reference frames no
window uses are skipped); then each view is cut from those frames with its own
crop by :func:`fallback.transform.apply_plan`, exactly as
:func:`fallback.source.decode_sample` would cut it.
"""

from __future__ import annotations

from typing import Sequence

import torch

from daliload.plan import OutputSpec, Sample
from fallback.decode import decode_window
from fallback.options import FallbackOptions
from fallback.transform import apply_plan


def decode_views(samples: Sequence[Sample], output: OutputSpec, decode: FallbackOptions | None = None, *,
                 out: Sequence[torch.Tensor] | None = None,
                 num_frames: int | None = None) -> tuple[list[torch.Tensor], int]:
    """Decode the views ``samples`` of one video in one pass over the file.

    Args:
        samples: views of the same file (any order, any windows and crops).
        output: what each clip is turned into.
        decode: threads, non-reference skipping, time limit and seek hints (default ``FallbackOptions()``).
        out: where to write each sample's clip (a worker's rows of shared memory), in the order given.
        num_frames: the file's frame count in the manifest the plan was made
            from (default: its seek hint's, if any): see
            :func:`~fallback.decode.decode_window`.

    Returns:
        ``(clips, frames_decoded)``: one tensor per sample, in the order given,
        equal to what :func:`~fallback.source.decode_sample` gives for it, and
        the frames the decoder produced.

    Raises:
        ValueError: no samples, or samples of more than one file.
        fallback.decode.DecodeError: the file cannot be decoded, or decodes
            fewer frames than ``num_frames`` and a window needs one of those.
    """
    if not samples:
        raise ValueError("decode_views needs at least one sample")
    path = samples[0].path
    others = {s.path for s in samples} - {path}
    if others:
        raise ValueError(f"decode_views decodes the views of one file; got {path} and {sorted(others)[0]}")
    if decode is None:
        decode = FallbackOptions()
    windows = [sample.frame_indices() for sample in samples]
    wanted = sorted({index for window in windows for index in window})
    hint = decode.hint(path)
    if num_frames is None and hint is not None:
        num_frames = hint.num_frames
    # Frames come back one per index asked for, in order, so the rows below hold even when indices past
    # num_frames are clamped to its last frame.
    clip = decode_window(path, wanted, threads=decode.threads, skip_nonref=decode.skip_nonref,
                         timeout_s=decode.timeout_s, hint=hint, num_frames=num_frames, policy=decode.read_policy)
    row = {index: k for k, index in enumerate(wanted)}
    frames = clip.frames
    targets = out if out is not None else [None] * len(samples)
    clips = [apply_plan(frames[[row[index] for index in window]], sample, output, out=target)
             for window, sample, target in zip(windows, samples, targets)]
    return clips, clip.num_frames_decoded
