"""Where a loader is across epochs: the epoch the next pass draws, the batch it starts at, what a checkpoint saves.

:class:`EpochProgress` is the bookkeeping behind
:meth:`~daliload.KineticsDALILoader.set_epoch`, ``state_dict`` and
``load_state_dict`` (their docstrings state the rules for users); the loader
checks the values it is given and reports what it drops.

A pass begins at its first batch, not at ``iter()``. The next pass draws the
epoch set since the last pass began (:meth:`EpochProgress.set`, or a loaded
state), else the last pass's plus one. A loaded state's batch is where the
next pass over that epoch starts; any other epoch set drops it. During a
pass, and after one left early, the state is that pass's epoch at the batch
after the last one yielded; after a pass that finished its epoch, the next
epoch at batch 0.

:class:`EpochSampler` is ``loader.sampler``: where the loops people have call ``set_epoch``.
"""

from __future__ import annotations

import weakref


class EpochProgress:
    """The epoch of the passes of one loader, and the batch a resumed pass starts at."""

    def __init__(self) -> None:
        self.epoch = 0  # the epoch of the pass under way (or the last), or the one set for the next pass
        self._set = True  # set()/load() since the last pass began (or no pass yet)
        self._pass_epoch: int | None = None  # the epoch of the pass under way or the last one
        self._in_pass = False  # between a pass's first batch and its end
        self._next_batch = 0  # the batch after the last one yielded
        self._resume: tuple[int, int] | None = None  # (epoch, batch) load() asked the next pass for

    def next_epoch(self) -> int:
        """The epoch the next pass draws: the one set since the last pass began, else that pass's plus one."""
        return self.epoch if self._in_pass or self._set else self.epoch + 1

    def set(self, epoch: int) -> tuple[int, int] | None:
        """The next pass draws ``epoch``; returns the loaded ``(epoch, batch)`` this drops, if it drops one."""
        dropped = None
        if self._resume is not None and self._resume[0] != epoch:
            dropped, self._resume = self._resume, None
        self.epoch, self._set = epoch, True
        return dropped

    def resumes_at(self) -> int:
        """The batch the next pass starts at: 0, or the one :meth:`load` asked for."""
        return self._resume[1] if self._resume is not None and self._resume[0] == self.next_epoch() else 0

    def state(self, num_batches: int) -> tuple[int, int]:
        """``(epoch, next_batch)`` of a checkpoint taken now, for an epoch of ``num_batches`` batches."""
        if self._resume is not None:
            return self._resume
        if self._pass_epoch is not None and not self._set:  # nothing set since the last pass began
            epoch, next_batch = self._pass_epoch, self._next_batch
            if next_batch >= num_batches:  # that pass finished its epoch: the next pass draws the next one
                return epoch + 1, 0
            return epoch, next_batch
        # an epoch no pass has begun yet starts at its first batch
        return self.epoch, self._next_batch if self.epoch == self._pass_epoch else 0

    def load(self, epoch: int, next_batch: int) -> None:
        """Resume at ``next_batch``: the next pass over ``epoch`` starts there."""
        self.epoch, self._set = epoch, True
        self._resume = (epoch, next_batch)

    def begin(self) -> int:
        """A pass begins (at its first batch): the epoch it draws."""
        epoch = self.next_epoch()
        self.epoch, self._set, self._pass_epoch, self._in_pass = epoch, False, epoch, True
        return epoch

    def start(self, num_batches: int) -> int:
        """The batch the pass begun starts at (a loaded state's, unless that epoch was finished), the resume spent."""
        start = self.resumes_at()
        if start >= num_batches:
            start = 0  # the saved epoch was finished: this is a new pass over it
        self._resume = None
        self._next_batch = start
        return start

    def yielded(self, next_batch: int) -> None:
        """The pass handed out the batch before ``next_batch`` (set before yielding it: a checkpoint taken while
        the caller holds it resumes after it)."""
        self._next_batch = next_batch

    def end(self) -> None:
        """The pass under way ended (finished, left early or failed)."""
        self._in_pass = False


class EpochSampler:
    """``loader.sampler``: the loader's epoch, where the training loops people have set it.

    Scripts written for ``DistributedSampler`` call ``loader.sampler.set_epoch(epoch)``,
    and PyTorch Lightning calls ``set_epoch`` on its dataloaders' ``sampler``
    before every epoch; both reach :meth:`KineticsDALILoader.set_epoch`, so
    those loops advance the plan with no daliload-specific code. It holds no
    state of its own (the loader's plan is the one source of truth) and is
    not an index sampler: a ``DataLoader`` cannot use it.
    """

    def __init__(self, loader) -> None:
        self._loader = weakref.proxy(loader)  # no reference cycle: the loader still closes when dropped

    def set_epoch(self, epoch: int) -> None:
        self._loader.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        return self._loader.epoch

    def __repr__(self) -> str:
        return f"EpochSampler(epoch={self.epoch})"
