"""The epoch pass: one rank's pass over an epoch, from its plan's batches to ``(videos, labels)`` batches.

:class:`~daliload.KineticsDALILoader` is the public face; an :class:`EpochPass`
does the work of one pass over the batches of its plan (``docs/architecture.md``
walks a clip through it)::

    batch i of the plan
      -> Routes: which samples DALI decodes (route ``dali``, DALI enabled and
         not given up, the file not moved off DALI); the rest go to the fallback
      -> each share submitted to its ClipSource (daliload.clips), up to
         ``prefetch`` batches ahead of the one the caller is on
      -> collected in plan order, one Decoded per share: a clip per row, or a
         typed Failure
           kind "dali" / "dali_batch": DALI could not decode it -> the fallback
             decodes it now (and "dali" moves the file off DALI for the run)
           any other kind -> the epoch's FailureBudget, then the replacement
             loop: the next sample of the plan that decodes fills the slot
      -> merge: the rows in plan order into one (videos, labels) batch on the
         loader's device: on the CPU no copy when one share is the whole batch;
         on the GPU always torch's own memory (fallback clips from page-locked memory)

Which source decodes a sample is decided by :class:`Routes` when its batch is
submitted: the one place a routing policy lives (a hybrid one, sending DALI's
samples to idle CPU workers when NVDEC is saturated, would go there).

Modules, by concept:

* :mod:`._routes`: :class:`Routes`, where each file goes for the whole run;
* :mod:`._speed`: the measured routing's schedule (:class:`CodecRoute`: what
  ``stats().decoders`` says of each codec);
* :mod:`._progress`: :class:`EpochProgress`, the epoch the next pass draws
  and the batch it starts at (``set_epoch``, checkpoints);
* :mod:`._pass`: :class:`EpochPass`, the scheduler over the clip sources and
  the replacement loop;
* :mod:`._merge`: the merge into one batch, :class:`BatchInfo` (what each row
  is), and the GPU hand-off (:class:`HeldOutputs`, :class:`HostTransfer`, :class:`RegisteredBuffers`);
* :mod:`._setup`: what a pass is given (:class:`PassSetup`) and counts
  (:class:`EpochCounters`), and :data:`PADDING_LABEL`;
* :mod:`._plans`: :class:`EpochPlans`, a rank's plans by epoch, the next one
  drawn ahead (its draw held by :func:`weakly`);
* :mod:`._agree`: :func:`refuse_disagreeing_ranks`, every rank's loader
  built from the same options and videos, or every rank raises;
* :mod:`._fits`: the checks of the options against the split once read
  (:func:`check_batches`, :func:`warn_upscaled`);
* :mod:`._format`: :class:`BatchFormat`, what a batch becomes for the caller
  (a tuple, with ``info``, or a dict of named keys);
* :mod:`._sources`: :class:`ClipSources`, the loader's two clip sources
  (built from its split and settings, kept as long as it), and the per-path
  lookups they need (:func:`stream_hint`: a manifest row's seek hint), and
  where the fallback normalises (:func:`fallback_normalizes_on`).
"""

from daliload.epoch._agree import refuse_disagreeing_ranks
from daliload.epoch._fits import check_batches, warn_upscaled
from daliload.epoch._format import BatchFormat
from daliload.epoch._merge import (HOST_TRANSFER, BatchInfo, HeldOutputs, HostTransfer, HostTransferMode,
                                   RegisteredBuffers)
from daliload.epoch._pass import EpochPass
from daliload.epoch._plans import EpochPlans, weakly
from daliload.epoch._progress import EpochProgress, EpochSampler
from daliload.epoch._routes import DALI_FAILURE_STREAK, Routes, dali_videos, explicit_choice
from daliload.epoch._speed import CodecRoute
from daliload.epoch._setup import PADDING_LABEL, EpochCounters, PassSetup
from daliload.epoch._sources import ClipSources, DaliSetup, fallback_normalizes_on, stream_hint

__all__ = ["BatchFormat", "BatchInfo", "ClipSources", "CodecRoute", "DALI_FAILURE_STREAK", "DaliSetup",
           "EpochCounters", "EpochPass", "EpochPlans", "EpochProgress", "EpochSampler", "HOST_TRANSFER",
           "HeldOutputs", "HostTransfer", "HostTransferMode", "PADDING_LABEL", "PassSetup", "RegisteredBuffers",
           "Routes", "check_batches", "dali_videos", "explicit_choice", "fallback_normalizes_on",
           "refuse_disagreeing_ranks", "stream_hint", "warn_upscaled", "weakly"]
