"""The loader's epoch and resume point as a training loop sets and saves them: ``set_epoch``, ``state_dict``.

:class:`LoaderState` is a part of :class:`daliload.KineticsDALILoader` kept
here so that the loader's module stays readable; it reads the loader's
progress (:class:`~daliload.epoch.EpochProgress`), its plan settings and the
fingerprint of its split's videos, and refuses a state from another
configuration or another list of videos, saying what differs.

It also gives the loader the attributes of a ``torch.utils.data.DataLoader``
that training loops read (``dataset``, ``batch_sampler``, ``collate_fn``,
``num_workers``, ...), so that Accelerate's ``skip_first_batches`` (what the
Hugging Face ``Trainer`` calls to resume mid-epoch) rebuilds it as a
``DataLoader`` whose first batch is the one after the checkpoint, without
decoding the batches it skips: :class:`PlanBatches` yields the plan's batches
(video indices, tagged with their epoch and number) and :class:`SplitVideos`
decodes a batch it is asked for with a pass of the loader that starts there.
"""

from __future__ import annotations

import logging
import numbers
from functools import cached_property
from typing import Iterator

from torch.utils.data import Dataset

logger = logging.getLogger("daliload.loader")  # where these warnings always came from


class LoaderState:
    """``set_epoch``, ``resumes_at``, ``state_dict`` and ``load_state_dict`` of :class:`daliload.KineticsDALILoader`,
    and the ``DataLoader`` attributes training loops read (``dataset``, ``batch_sampler``, ...)."""

    # What a torch DataLoader built with num_workers=0 has: Accelerate's skip_first_batches copies these onto the
    # DataLoader it builds around dataset and batch_sampler (its defaults, prefetch_factor=2, would be refused).
    #: no ``torch.utils.data`` worker processes (the loader's own decoders are :attr:`sources`)
    num_workers = 0
    prefetch_factor = None
    pin_memory = False
    timeout = 0

    @property
    def drop_last(self) -> bool:
        """``last_batch == "drop"``, as a ``DataLoader``'s ``drop_last`` says."""
        return self.last_batch == "drop"

    @property
    def dataset(self) -> SplitVideos:
        """The split's videos as a map-style ``torch.utils.data.Dataset``: ``len(dataset)`` videos (what the
        Hugging Face ``Trainer`` logs as "Num examples"), ``dataset[i]`` is ``videos[i]``; given a batch of
        :attr:`batch_sampler`, it decodes that batch (see :class:`SplitVideos`)."""
        return SplitVideos(self)

    @property
    def batch_sampler(self) -> PlanBatches:
        """This rank's batches of the next pass's epoch as lists of video indices, one per batch row
        (:class:`PlanBatches`): with :attr:`dataset` and :attr:`collate_fn`, what a ``DataLoader`` needs to give the
        loader's batches, and what Accelerate's ``skip_first_batches`` skips without decoding."""
        return PlanBatches(self)

    @staticmethod
    def collate_fn(batch: object) -> object:
        """The batch :attr:`dataset` decoded, unchanged: the loader's batches are whole when decoded."""
        return batch

    def set_epoch(self, epoch: int) -> None:
        """The next pass draws the plan of ``epoch``, from its first batch (then pass by pass ``epoch + 1`` ...).

        Called by the loop before each epoch as with ``DistributedSampler``;
        ``loader.sampler.set_epoch(epoch)`` is the same call, where PyTorch
        Lightning and DDP scripts make it. Without it, each pass draws the
        epoch after the previous pass's (see the class doc).

        After :meth:`load_state_dict`, ``set_epoch`` with the saved epoch keeps
        the resume (the usual resume loop: load the state, then ``for epoch in
        range(saved, epochs): loader.set_epoch(epoch)``); another epoch drops it.
        """
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise ValueError(f"epoch must be an integer >= 0, got {epoch!r}")
        dropped = self._progress.set(epoch)
        if dropped is not None and 0 < dropped[1] < len(self):
            logger.warning("set_epoch(%d): the state loaded for epoch %d (at batch %d of %d) is not resumed; "
                           "epoch %d starts at its first batch", epoch, *dropped, len(self), epoch)

    @property
    def resumes_at(self) -> int:
        """The batch the next pass starts at: 0, or the one :meth:`load_state_dict` asked for."""
        return self._progress.resumes_at()

    # -- checkpointing --------------------------------------------------------------

    def state_dict(self) -> dict:
        """Where the loader is: the epoch and the next batch to yield, plus what must match on resume.

        During a pass (or after one was left early) it is that pass's epoch and
        the batch after the last one yielded. After a pass that finished its
        epoch, it is the next epoch at batch 0 (what the next pass draws),
        unless :meth:`set_epoch` said otherwise since: then it is the epoch set,
        at batch 0 (or, for the epoch just finished, ``next_batch ==
        len(self)``: a state loaded then makes the next pass start it again).
        Between :meth:`load_state_dict` and the next pass it is the loaded state.
        ``videos`` is the fingerprint of the split's video list the plans are
        drawn from (:meth:`VideoIndex.fingerprint`).
        """
        epoch, next_batch = self._progress.state(len(self))
        return {"epoch": epoch, "next_batch": next_batch, **self._plan_settings(),
                "world_size": self.world_size, "num_videos": len(self.index),
                "videos": dict(self._fingerprint),
                "manifest": str(self.manifest_path)}

    @cached_property
    def _fingerprint(self) -> dict:
        return self.index.fingerprint()

    def load_state_dict(self, state: dict) -> None:
        """Resume at the batch :meth:`state_dict` recorded: the next pass over that epoch yields it first.

        Raises:
            TypeError: ``state`` is not a dict.
            ValueError: the state has no ``epoch`` or ``next_batch``, or one
                that is not an integer >= 0; or it was saved with another
                seed, world size, split, batch size, ``last_batch``, views,
                ``clips_per_video``, clip (``clip_len``, ``frame_stride``,
                ``target_fps``) or crop (``crop_size`` and the
                :class:`AugmentSpec` fields), or from another list of videos
                (files added, removed or renamed, labels or frame counts
                changed), so the plan would differ; the message says what
                differs. A state saved before a setting was recorded is not
                checked for it.
        """
        if not isinstance(state, dict):
            raise TypeError(f"load_state_dict() takes the dict state_dict() returned, got {type(state).__name__} "
                            f"{state!r:.80}")
        missing = [key for key in ("epoch", "next_batch") if key not in state]
        if missing:
            raise ValueError(f"cannot resume: the state has no {' or '.join(map(repr, missing))} (its keys: "
                             f"{sorted(map(str, state))}); pass the dict state_dict() returned")
        for key in ("epoch", "next_batch"):
            value = state[key]
            if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 0:
                raise ValueError(f"cannot resume: the state's {key} must be an integer >= 0, got {value!r}")
        mine = self.state_dict()
        if isinstance(state.get("videos"), dict):
            self._check_videos(state["videos"], state.get("manifest"))
        for key in ("world_size", "num_videos", *self._plan_settings()):
            if key in state and _plain(state[key]) != mine[key]:
                raise ValueError(f"cannot resume: the state was saved with {key}={state[key]!r}, this loader "
                                 f"has {key}={mine[key]!r} (the plan would differ)")
        epoch, next_batch = int(state["epoch"]), int(state["next_batch"])
        if not 0 <= next_batch <= len(self):
            raise ValueError(f"next_batch {next_batch} is outside 0..{len(self)}")
        self._progress.load(epoch, next_batch)

    def _check_videos(self, saved: dict, saved_manifest: object) -> None:
        """Raise ``ValueError`` naming what differs between the saved video list's fingerprint and this one's."""
        now = self._fingerprint
        differ = [key for key in ("videos", "paths", "labels", "facts") if saved.get(key) != now[key]]
        if not differ:
            return
        what = {"videos": f"{saved.get('videos')} videos then, {now['videos']} now",
                "paths": "not the same files (added, removed or renamed)",
                "labels": "other labels", "facts": "other frame counts, frame rates or frame sizes"}
        where = (f"the state's manifest was {saved_manifest}, this loader reads {self.manifest_path}"
                 if saved_manifest and str(saved_manifest) != str(self.manifest_path)
                 else f"manifest {self.manifest_path}")
        raise ValueError(
            f"cannot resume: split {self.split!r} has changed since the state was saved: "
            + "; ".join(what[key] for key in differ) + f" ({where}). The plan would differ. Resume from the "
            "manifest and files the run started with, or start the epoch afresh (or drop 'videos' and "
            "'num_videos' from the state to resume on the new list knowingly)")


class PlanBatch(list):
    """One batch of a plan as :class:`PlanBatches` yields it: the video index of each row, and which batch it is."""

    def __init__(self, videos: list[int], *, epoch: int, number: int) -> None:
        super().__init__(videos)
        self.epoch, self.number = epoch, number

    def __repr__(self) -> str:
        return f"PlanBatch(epoch={self.epoch}, number={self.number}, videos={list(self)})"


class PlanBatches:
    """``loader.batch_sampler``: this rank's batches of the epoch the next pass draws, as video indices.

    Iterating it draws (or reuses) that epoch's plan and yields one
    :class:`PlanBatch` per batch: a list of the video index of each row
    (repeated for a video's clips with ``clips_per_video``; once per video
    with ``views``), tagged with its epoch and batch number, so that
    :class:`SplitVideos` can decode it. ``len()`` is the loader's.
    ``set_epoch`` is the loader's (the Hugging Face ``Trainer`` calls it here,
    on the sampler inside the ``DataLoader`` ``skip_first_batches`` built).
    """

    def __init__(self, loader) -> None:
        self._loader = loader  # a new object per access, kept by no loader: no reference cycle

    def __len__(self) -> int:
        return len(self._loader)

    def __iter__(self) -> Iterator[PlanBatch]:
        loader = self._loader
        epoch = loader._progress.next_epoch()
        per_row = loader.clips_per_batch // loader.batch_size  # a row's views (1 without views)
        for number, batch in enumerate(loader.plan(epoch)):
            yield PlanBatch([sample.video_index for sample in batch[::per_row]], epoch=epoch, number=number)

    def set_epoch(self, epoch: int) -> None:
        """:meth:`LoaderState.set_epoch`."""
        self._loader.set_epoch(epoch)

    def __repr__(self) -> str:
        return f"PlanBatches(batches={len(self)}, epoch={self._loader._progress.next_epoch()})"


class SplitVideos(Dataset):
    """``loader.dataset``: the split's videos (``dataset[i]`` is ``loader.videos[i]``), and the batches of
    :class:`PlanBatches` decoded.

    ``DataLoader(loader.dataset, batch_sampler=loader.batch_sampler,
    collate_fn=loader.collate_fn)`` yields the loader's batches: torch asks
    ``__getitems__`` for each :class:`PlanBatch` in turn, and the first one
    asked for (batch ``n`` of epoch ``e``) starts a pass of the loader over
    ``e`` at batch ``n``, as :meth:`LoaderState.load_state_dict` would; the
    next batches come from that pass, prefetched as usual. So a
    ``DataLoader`` that skips the first ``n`` batches of the sampler (what
    Accelerate's ``skip_first_batches`` builds, and the Hugging Face
    ``Trainer`` iterates when it resumes mid-epoch) decodes none of them.
    """

    def __init__(self, loader) -> None:
        self._loader = loader
        self._pass: Iterator | None = None
        self._next: tuple[int, int] | None = None  # (epoch, number) of the batch the pass gives next

    def __len__(self) -> int:
        return len(self._loader.index)

    def __getitem__(self, index: int):
        return self._loader.index[index]

    def __getitems__(self, batch: PlanBatch):
        if not isinstance(batch, PlanBatch):
            raise TypeError(
                f"loader.dataset decodes whole batches of the loader's plan, the PlanBatch items of "
                f"loader.batch_sampler, not a list of indices ({batch!r:.80}): build the DataLoader with "
                "batch_sampler=loader.batch_sampler, collate_fn=loader.collate_fn, or iterate the loader itself")
        loader = self._loader
        live = loader._active() if loader._active is not None else None
        if self._next != (batch.epoch, batch.number) or live is None or live is not self._pass:
            # The first batch asked for, another than the next one, or the pass was ended (by another pass of
            # the loader): a pass over that epoch from that batch.
            loader._progress.load(batch.epoch, batch.number)
            self._pass = iter(loader)
        decoded = next(self._pass)
        self._next = (batch.epoch, batch.number + 1)
        if batch.number + 1 >= len(loader):  # the epoch's last batch: end the pass, as a for loop over it would
            next(self._pass, None)
            self._pass, self._next = None, None
        return decoded


def _plain(value: object) -> object:
    """A saved setting as :meth:`KineticsDALILoader._plan_settings` has it: tuples (a state kept in Python) as
    lists (a state read back from JSON)."""
    return [_plain(item) for item in value] if isinstance(value, (tuple, list)) else value
