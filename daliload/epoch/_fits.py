"""Checks of the options against the split once it is read: the clip fits a video, the batches an epoch.

Made at construction, before the first pass: a clip no video holds and an
epoch of no batch are refused; one batch that is mostly repeats, and videos
smaller than the crop, are warned of once.
"""

from __future__ import annotations

import warnings

import numpy as np

from daliload.dataset import VideoIndex
from daliload.plan import ClipSpec, samples_per_rank
from daliload.plan.columns import strides


def check_batches(videos: VideoIndex, clip: ClipSpec, *, split: str, batch_size: int, last_batch: str,
                  batches: int, clips_per_video: int, label_padding: bool, manifest: object, world_size: int) -> None:
    """Refuse a clip no video holds and an epoch of no batch (``batches``: the loader's ``len()``); warn of one
    batch that is mostly repeats (:func:`check_batch_fits`)."""
    check_clip_fits(videos, clip, split)
    per_rank = samples_per_rank(len(videos), world_size) * clips_per_video
    unit = "clips" if clips_per_video > 1 else "samples"
    if batches == 0:  # only "drop" can leave none: an epoch that silently yields nothing
        raise ValueError(
            f"batch_size={batch_size} with last_batch='drop' leaves no batch: split {split!r} of {manifest} has "
            f"{len(videos)} decodable video(s), {per_rank} {unit} per rank of {world_size}; use batch_size <= "
            f"{per_rank} or last_batch='pad' or 'partial'")
    check_batch_fits(batch_size, per_rank, last_batch=last_batch, label_padding=label_padding, split=split,
                     manifest=manifest, videos=len(videos), world_size=world_size, unit=unit)


def check_clip_fits(videos: VideoIndex, clip: ClipSpec, split: str) -> None:
    """Refuse a clip longer than every video of the split: each clip would be mostly repeats of a last frame.

    A few short videos are normal (their clips repeat the last frame, counted
    in ``stats().clips_past_end``); a span that fits no video is a mistake
    (``clip_len=10000``) that would otherwise show up as very slow decodes.
    Vectorised over the split's columns (650k videos: milliseconds).
    """
    with warnings.catch_warnings():  # the plan warns about unusable frame rates, once
        warnings.simplefilter("ignore")
        stride = strides(videos.columns, clip)
    span = (clip.clip_len - 1) * stride + 1
    if (videos.num_frames >= span).any():
        return
    longest = int(np.argmax(videos.num_frames))
    raise ValueError(
        f"clip_len={clip.clip_len} with frame_stride={int(stride[longest])} spans {int(span[longest])} frames, more "
        f"than any video of split {split!r} has (the longest, {videos.paths[longest]}, has "
        f"{int(videos.num_frames[longest])}): lower clip_len or frame_stride")


def warn_upscaled(videos: VideoIndex, output_size: tuple[int, int], split: str) -> None:
    """Warn once when some videos are smaller than the crop, so that their clips are upscaled."""
    out_h, out_w = output_size
    known = (videos.width > 0) & (videos.height > 0)
    small = np.flatnonzero(known & ((videos.height < out_h) | (videos.width < out_w)))
    if small.size:
        first = int(small[0])
        warnings.warn(f"{small.size} of {len(videos)} videos of split {split!r} are smaller than the crop "
                      f"{out_h}x{out_w} (height x width; first: {videos.paths[first]}, {int(videos.width[first])}x"
                      f"{int(videos.height[first])}); their clips are upscaled", UserWarning, stacklevel=3)


def check_batch_fits(batch_size: int, samples: int, *, last_batch: str, label_padding: bool, split: str,
                     manifest: object, videos: int, world_size: int, unit: str = "samples") -> None:
    """Warn when ``batch_size`` is larger than this rank's share of the split with ``last_batch="pad"``.

    The epoch is then one batch, mostly repeats (``batch_size=1000`` on 24
    videos: 976), which no one asking for 1000 clips expects, and which used
    to pass without a word. A warning, not an error: the batch is still what
    the options say (padding that keeps ranks equal, as every padded last
    batch is; labelled -1 and masked on evaluation splits, where the results
    stay right), and the usual way to get here is a smoke test of a
    training script on a tiny dataset at its real batch size (the README's
    snippet runs ``batch_size=32`` on 6 videos in its test), which should
    run. On a training split the repeats are trained on as real samples
    (the plan's first videos count many times), so the warning says so,
    with both numbers and the fix. ``"drop"`` is refused elsewhere (no batch
    at all) and ``"partial"`` makes one short batch: nothing to say.
    """
    if last_batch != "pad" or batch_size <= samples or label_padding == "drop":  # "drop": no repeat is yielded
        return
    repeats = batch_size - samples
    what = "labelled -1 (masked), but decoded" if label_padding else "trained on as real samples"
    warnings.warn(f"batch_size={batch_size} with last_batch='pad' is larger than the split: split {split!r} of "
                  f"{manifest} has {videos} decodable video(s), {samples} {unit} per rank of {world_size}, so each "
                  f"epoch is one batch of {samples} and {repeats} repeats, {what}; use batch_size <= {samples}, or "
                  f"last_batch='partial' for one batch of {samples}", UserWarning, stacklevel=4)
