"""Checks that a loader's batches show, row by row, the frames its plan says (frame codes in the pixels)."""

from __future__ import annotations

import torch

from daliload.framecode import read_code
from daliload.plan import Sample


def check_rows(videos: torch.Tensor, batch: list[Sample], frames: dict[str, int], labels: torch.Tensor | None = None,
               *, flips: bool = False) -> None:
    """Every row of ``videos`` shows exactly the frames its sample plans (and, if given, its label; with
    ``flips``, mirrored as planned).

    Args:
        videos: ``(B, C, T, H, W)``, or ``(B, V, C, T, H, W)`` with views (one row a view, in order).
        batch: the plan's samples of this batch, one per row.
        frames: frames of each video, by path (``{v.path: v.num_frames for v in loader.videos}``).
        labels: ``(B,)``, one a row; leave out with views.
    """
    videos = videos.cpu()
    rows = videos.flatten(0, 1) if videos.ndim == 6 else videos
    for k, sample in enumerate(batch):
        codes = [read_code(rows[k][:, t], layout="CHW") for t in range(rows.shape[2])]
        where = (ascii(sample.path), sample.start_frame)
        assert [c.index for c in codes] == sample.frame_indices(frames[sample.path]), where
        if flips:
            assert all(c.flipped == sample.flip for c in codes), where
        if labels is not None:
            assert int(labels[k]) == sample.label, where


def check_passes(loader, epochs=(None,)) -> list[Sample]:
    """A pass over ``loader`` per epoch (``set_epoch`` first; ``None``: the next epoch, as a training loop
    goes): every row of every batch is its planned frames and, with one view a video, its planned label.

    Returns:
        The samples of every pass, in plan order.
    """
    frames = {v.path: v.num_frames for v in loader.videos}
    samples: list[Sample] = []
    for epoch in epochs:
        if epoch is not None:
            loader.set_epoch(epoch)
        plan, count = None, 0
        for count, (videos, labels, *_) in enumerate(loader, 1):
            plan = plan or loader.plan()  # the plan of the pass under way
            check_rows(videos, plan[count - 1], frames, labels if videos.ndim == 5 else None)
            samples += plan[count - 1]
        assert count == len(loader)
    return samples
