"""What a pass's batch becomes for the caller: ``(videos, labels)``, with ``info``, or a dict of named keys."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from daliload.epoch._merge import BatchInfo


@dataclass(frozen=True)
class BatchFormat:
    """How batches are yielded.

    Attributes:
        keys: ``None`` for tuples, else the dict keys of the videos and the labels.
        with_info: add the :class:`BatchInfo` (third in a tuple, ``"info"`` in a dict).
    """

    keys: tuple[str, str] | None = None
    with_info: bool = False

    def __call__(self, batch: tuple[torch.Tensor, torch.Tensor, BatchInfo]) -> tuple | dict:
        if self.keys is None:
            return batch if self.with_info else batch[:2]
        videos_key, labels_key = self.keys
        as_dict: dict[str, object] = {videos_key: batch[0], labels_key: batch[1]}
        if self.with_info:
            as_dict["info"] = batch[2]
        return as_dict
