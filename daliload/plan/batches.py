"""Cutting a rank's plan into batches: the last-batch policy.

Every rank has a plan of the same length (:func:`~daliload.plan.samples_per_rank`),
so under every policy every rank gets the same number of batches and DDP
never waits on a rank that ran out.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, Sequence

from daliload.plan.specs import Sample

LastBatch = Literal["pad", "drop", "partial"]
LAST_BATCH_POLICIES: tuple[str, ...] = ("pad", "drop", "partial")


def check_last_batch(last_batch: object) -> None:
    """Raise ``ValueError`` unless ``last_batch`` is one of :data:`LAST_BATCH_POLICIES`."""
    if last_batch not in LAST_BATCH_POLICIES:
        raise ValueError(f"last_batch must be 'pad', 'drop' or 'partial', got {last_batch!r}")


def num_batches(num_samples: int, batch_size: int, last_batch: LastBatch) -> int:
    """How many batches :func:`split_batches` makes of ``num_samples`` samples."""
    check_last_batch(last_batch)
    if last_batch == "drop":
        return num_samples // batch_size
    return -(-num_samples // batch_size)


def split_batches(plan: Sequence[Sample], batch_size: int, last_batch: LastBatch) -> list[list[Sample]]:
    """Cut a rank's plan into batches.

    ``"pad"`` fills the last batch with repeats of the plan's first samples
    (marked ``is_padding``, with new positions after the plan's), ``"drop"``
    drops a short last batch, ``"partial"`` keeps it short.

    Worked example, a plan of 10 samples (positions 0..9), ``batch_size=4``::

        pad:     [0 1 2 3] [4 5 6 7] [8 9 10* 11*]   10*, 11* repeat samples 0 and 1
        drop:    [0 1 2 3] [4 5 6 7]
        partial: [0 1 2 3] [4 5 6 7] [8 9]
    """
    check_last_batch(last_batch)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    batches = [list(plan[i:i + batch_size]) for i in range(0, len(plan), batch_size)]
    if batches and len(batches[-1]) < batch_size:
        if last_batch == "drop":
            batches.pop()
        elif last_batch == "pad":
            missing = batch_size - len(batches[-1])
            extra = [dataclasses.replace(plan[i % len(plan)], position=len(plan) + i, is_padding=True)
                     for i in range(missing)]
            batches[-1].extend(extra)
    return batches


def drop_padding(batches: list[list[Sample]], group: int = 1) -> list[list[Sample]]:
    """The same batches without their padding samples (``is_padding``), none left empty.

    A batch that would hold only padding takes the last video of the batch
    before it (``group`` samples: a video's views or clips stay together), so
    the batch count stays what :func:`num_batches` says and every rank still
    yields as many batches. Where the batch before has a single video too
    (``batch_size=1``), or there is none (a rank whose share is all padding:
    fewer videos than ranks), the batch keeps its first padding video.

    Worked example, two ranks' plans of 5 videos (rank 1: ``[1, 3, 0*]``,
    ``0*`` padding), ``batch_size=2``, ``last_batch="pad"``::

        split_batches:  [1 3] [0* 1*]
        drop_padding:   [1]   [3]         (the last batch took video 3)
    """
    if group < 1:
        raise ValueError(f"group must be >= 1, got {group}")
    kept = [[sample for sample in batch if not sample.is_padding] for batch in batches]
    for i, batch in enumerate(kept):
        if batch:
            continue
        if i > 0 and len(kept[i - 1]) > group:
            kept[i] = kept[i - 1][-group:]
            del kept[i - 1][-group:]
        else:
            kept[i] = list(batches[i][:group])
    return kept
