"""The loader's epoch and resume point as a training loop sets and saves them: ``set_epoch``, ``state_dict``.

:class:`LoaderState` is a part of :class:`daliload.KineticsDALILoader` kept
here so that the loader's module stays readable; it reads the loader's
progress (:class:`~daliload.epoch.EpochProgress`), its plan settings and the
fingerprint of its split's videos, and refuses a state from another
configuration or another list of videos, saying what differs.
"""

from __future__ import annotations

import logging
import numbers
from functools import cached_property

logger = logging.getLogger("daliload.loader")  # where these warnings always came from


class LoaderState:
    """``set_epoch``, ``resumes_at``, ``state_dict`` and ``load_state_dict`` of :class:`daliload.KineticsDALILoader`."""

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


def _plain(value: object) -> object:
    """A saved setting as :meth:`KineticsDALILoader._plan_settings` has it: tuples (a state kept in Python) as
    lists (a state read back from JSON)."""
    return [_plain(item) for item in value] if isinstance(value, (tuple, list)) else value
