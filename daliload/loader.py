"""KineticsDALILoader: the public face of the loader, for one DDP rank.

Per epoch and rank::

    manifest (pre-screen) --> usable videos (route dali | fallback; bad ones are reported, never planned)
        --> epoch plan (daliload.plan): this rank's ordered samples, equal count on every rank
        --> batches of batch_size (last-batch policy)
        --> one pass (daliload.epoch.EpochPass): each sample to its clip source (DALI or the
            PyAV fallback), merged in plan order into one (videos, labels) batch on
            cuda:LOCAL_RANK (or the CPU)

This module holds the loader's state across epochs (epoch, resume point,
routes, the two clip sources, whose processes and pipelines live as long as
the loader), checkpointing and :class:`LoaderStats`. Its options and their
checks live in :mod:`daliload.options`, the work of a pass in
:mod:`daliload.epoch`; failures are counted by one
:class:`~daliload.failures.FailureBudget` per epoch. Batch size and batch count
never change whatever fails, so DDP ranks stay in step.
"""

from __future__ import annotations

import bisect
import logging
import os
import warnings
import weakref
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Literal, Sequence

import numpy as np
import torch

from daliload import runtime
from daliload.epoch import PADDING_LABEL, BatchInfo, EpochCounters, EpochPass, EpochPlans, PassSetup, Routes
from daliload.failures import Failure, FailureBudget
from daliload.options import (DecodeSpec, augment_and_output, check_clip_fits, check_options, checked_clips_per_video,
                              checked_views, refuse_unknown_options, warn_upscaled)
from daliload.plan import (AugmentSpec, ClipSpec, LastBatch, OutputSpec, Sample, make_train_plan, make_val_plan,
                           num_batches, samples_per_rank, split_batches)
from daliload.prescreen import Manifest, ScanSpec, check_manifest, ensure_manifest
from daliload.prescreen.gpus import detect_gpu
from daliload.stats import LoaderStats
from daliload.runtime import refuse_bootstrapping_main
from daliload.dataset import ROUTE_CODES, VideoIndex, VideoRow
from fallback.cut import cut_task
from fallback.numbering import StreamHint
from fallback.options import FallbackOptions
from fallback.source import FallbackSource

if TYPE_CHECKING:
    from daliload.dali import DaliSource

logger = logging.getLogger(__name__)

DeviceChoice = Literal["auto", "gpu", "cpu"]
#: ``(videos, labels)``, or ``(videos, labels, info)`` with ``with_info=True``.
Batch = tuple[torch.Tensor, ...] | tuple[torch.Tensor, torch.Tensor, BatchInfo]

__all__ = ["PADDING_LABEL", "DecodeSpec", "EpochSampler", "KineticsDALILoader", "LoaderStats", "ScanSpec",
           "split_batches"]

_MANIFEST_SUFFIXES = (".sqlite", ".sqlite3", ".db")


class KineticsDALILoader:
    """Iterate ``(videos, labels)`` batches of a Kinetics-style split, for one DDP rank.

    Args:
        source: dataset root (scanned on first use; see :class:`ScanSpec`) or
            the path of a manifest written by ``daliload scan``.
        split: ``"train"`` (shuffled, random window, crop and flip) or any
            other split in the manifest (deterministic centre clip and crop).
        batch_size: clips per batch (videos per batch with ``views``). Default 32.
        clip_len: frames per clip. Default 16.
        frame_stride: step between clip frames. Default 4.
        crop_size: output size in pixels, an int (square) or ``(height, width)``.
            Default 224, or ``augment.crop_size`` when ``augment`` is given.
        seed: base seed, the same on every rank. Default 0.
        last_batch: ``"pad"`` (default), ``"drop"`` or ``"partial"``; see
            :func:`split_batches`.
        label_padding: give padding samples (repeats that only keep ranks
            equal) the label :data:`PADDING_LABEL` (-1) so evaluation can mask
            them. Default: on for splits other than ``"train"``.
        target_fps: if set, each video's stride follows its own fps so clips
            span the same time (see :class:`daliload.plan.ClipSpec`).
        augment: crop mode, ranges and flip probability; default
            :class:`AugmentSpec` with ``crop_size``.
        output: mean, std, dtype and layout; default float32 ``CTHW``,
            Kinetics mean/std, ``crop_size`` (:class:`OutputSpec`; a field
            not set follows ``crop_size``).
        device: ``"auto"`` (default: ``"gpu"`` when CUDA is available),
            ``"gpu"`` (NVDEC, tensors on ``cuda:LOCAL_RANK``) or ``"cpu"``.
        decode: threads, workers, prefetch and failure limits (:class:`DecodeSpec`).
        scan: pre-screen options when ``source`` is a root (:class:`ScanSpec`).
        views: ``(num_temporal, num_spatial)`` views per video, for multi-view
            evaluation (evaluation splits only): each batch row is one video
            with all its views, ``videos`` has shape ``(B, V, C, T, H, W)``
            (``(B, V, T, C, H, W)`` for TCHW), ``V = num_temporal *
            num_spatial``, temporal-major; windows evenly spaced from the first
            frame to the last, crops along the long side (3: both ends and the
            centre); see :func:`daliload.plan.make_val_plan`. A video one of
            whose views fails gets label -1. ``None`` (default): one view, no
            view axis. :func:`daliload.evaluate` scores such batches.
        clips_per_video: repeated sampling on the training split (VideoMAE's
            ``num_sample``): each video gives this many clips per epoch, each
            with its own window, crop and flip, in a row in the plan and in
            its batch (``batch_size`` counts clips and must be a multiple).
            The fallback decodes a video's clips in one pass over the file;
            DALI reads the file once for them but decodes each clip. A broken
            video fails its clips as one failed video. Default 1. The
            reference scripts' other way (a video's clips spread over the
            epoch, as separate samples) is not offered: with ``k`` clips a
            video, ``batch_size`` must be a multiple of ``k``.
        with_info: yield ``(videos, labels, info)``, where ``info`` is a
            :class:`~daliload.epoch.BatchInfo` saying what each row is: its
            video (``info.video_index``, an index into :attr:`videos`), clip
            or view, whether it is padding or replaced, and ``info.mask`` (the
            rows to score: ``labels != -1``). For per-video evaluation of clip
            predictions and masked losses without zipping :meth:`plan`.
            Default ``False``: batches are ``(videos, labels)``.

    Rank and world size come from ``torch.distributed`` when it is initialized
    (else ``RANK``/``WORLD_SIZE``, else 0 of 1). Under DDP, global rank 0
    scans and the other ranks wait for its manifest.

    Epochs: pass ``n`` of a job draws epoch ``n``, unless told otherwise.
    The next pass draws the epoch given to :meth:`set_epoch` (or
    ``loader.sampler.set_epoch``, where DDP scripts and PyTorch Lightning
    call it) or :meth:`load_state_dict` since the previous pass began; when
    neither was called, it draws the previous pass's epoch plus one. So a
    loop that calls nothing (Hugging Face Accelerate's, a plain ``for``
    over epochs) gets a fresh, deterministic plan each pass, as a
    ``DataLoader`` over a ``RandomSampler`` does, and a loop that calls
    ``set_epoch(e)`` gets epoch ``e``. A pass begins at its first batch, not
    at ``iter()``. Every pass starts its epoch at the first batch: a pass
    left early (``break``) is not continued by the next one; the one
    exception is :meth:`load_state_dict`, as with torchdata's
    ``StatefulDataLoader``: the next pass over the saved epoch resumes at
    the saved batch.

    The fallback's worker processes start with the first pass that needs them
    and serve every later epoch (each pass sends them its samples); they stop
    at :meth:`close` or garbage collection. A pass abandoned with decodes in
    flight drops them (those running finish on their workers; nothing waits).

    Raises:
        FileNotFoundError: ``source`` does not exist.
        ValueError: a bad option, an unknown split, or a split with no usable video.
    """

    def __init__(
        self,
        source: str | os.PathLike,
        split: str = "train",
        batch_size: int = 32,
        clip_len: int = 16,
        frame_stride: int = 4,
        crop_size: int | tuple[int, int] | None = None,
        *,
        seed: int = 0,
        last_batch: LastBatch = "pad",
        label_padding: bool | None = None,
        target_fps: float | None = None,
        augment: AugmentSpec | None = None,
        output: OutputSpec | None = None,
        device: DeviceChoice = "auto",
        decode: DecodeSpec | None = None,
        scan: ScanSpec | None = None,
        views: tuple[int, int] | None = None,
        clips_per_video: int = 1,
        with_info: bool = False,
        **unknown: object,
    ) -> None:
        refuse_unknown_options(unknown, _OPTIONS)
        # A spawn/forkserver child re-running an unguarded script must not load (and train) again.
        refuse_bootstrapping_main("A KineticsDALILoader")
        source = Path(source)
        if not source.exists():
            raise FileNotFoundError(f"dataset root or manifest not found: {source}")
        check_options(batch_size=batch_size, last_batch=last_batch, device=device, seed=seed)
        self.clip = ClipSpec(clip_len=clip_len, frame_stride=frame_stride, target_fps=target_fps)
        self.augment, self.output = augment_and_output(crop_size, augment, output)
        self.decode = decode if decode is not None else DecodeSpec()
        self.scan = scan if scan is not None else ScanSpec()
        self.split = split
        self.batch_size = batch_size
        self.views = checked_views(views, split)
        self.clips_per_video = checked_clips_per_video(clips_per_video, split, batch_size)
        if not isinstance(with_info, bool):
            raise TypeError(f"with_info must be True or False, got {with_info!r}")
        self.with_info = with_info
        #: clips per batch: ``batch_size`` videos times their views
        self.clips_per_batch = batch_size * (self.views[0] * self.views[1] if self.views else 1)
        self.seed = seed
        self.last_batch: LastBatch = last_batch
        self.label_padding = (split != "train") if label_padding is None else bool(label_padding)
        self._place(device)
        self.dali_enabled = self.decode.decoder == "auto" and _dali_usable()
        self._load_videos(source)
        index = self.index
        check_clip_fits(index, self.clip, self.split)
        if len(self) == 0:  # only "drop" can leave none: an epoch that silently yields nothing
            per_rank = samples_per_rank(len(index), self.world_size) * self.clips_per_video
            raise ValueError(
                f"batch_size={batch_size} with last_batch='drop' leaves no batch: split {split!r} of "
                f"{self.manifest_path} has {len(index)} decodable video(s), {per_rank} "
                f"{'clips' if self.clips_per_video > 1 else 'samples'} per rank of {self.world_size}; use "
                f"batch_size <= {per_rank} or last_batch='pad' or 'partial'")
        warn_upscaled(index, self.augment.output_size, self.split)
        self._routes = Routes(self._dali_videos(index) if self.dali_enabled else None)
        self._frames_of = _frames_lookup(index)
        #: DALI pipelines (``DecodeSpec.dali_pipelines``; "auto": one per NVDEC engine of this GPU's model)
        self.dali_pipelines = self.decode.dali_pipelines_for(self.device, self.gpu.nvdec_engines if self.gpu else None)
        if self.decode.dali_pipelines == "auto" and self.gpu is not None and self.dali_enabled:
            engines = self.gpu.nvdec_engines
            logger.info("%d DALI pipeline(s): %s", self.dali_pipelines,
                        f"one per NVDEC engine of {self.gpu.describe()}" if engines else
                        f"the NVDEC engines of {self.gpu.describe()} are not in daliload.prescreen.gpus")
        self._setup = PassSetup(
            output=self.output, device=self.torch_device, label_padding=self.label_padding,
            mask_failed=split != "train",
            prefetch=self.decode.batches_ahead(self.clips_per_batch, pipelines=self.dali_pipelines),
            num_frames=self._frames_of, views=self.clips_per_batch // batch_size if self.views else 0)
        # The two clip sources live as long as the loader: the fallback's workers start at the first
        # group it gets, the DALI pipeline at the first batch with a DALI sample.
        self._fallback = FallbackSource(self.output, FallbackOptions(threads=self.decode.fallback_threads,
                                                                   timeout_s=self.decode.timeout_s),
                                        workers=self.decode.fallback_workers, hint_of=_hint_lookup(index),
                                        frames_of=self._frames_of)  # what a truncated file is checked against
        self._dali = None  # DaliSource, built on first use
        self._epoch = 0  # the epoch of the pass under way (or the last), or the one set for the next pass
        self._epoch_set = True  # set_epoch()/load_state_dict() since the last pass began (or no pass yet)
        self._pass_epoch: int | None = None  # the epoch of the pass under way or the last one
        self._in_pass = False  # between a pass's first batch and its end
        #: Where DDP scripts (``DistributedSampler``) and PyTorch Lightning call ``set_epoch``.
        self.sampler = EpochSampler(self)
        self._next_batch = 0  # the batch after the last one yielded (state_dict)
        self._resume: tuple[int, int] | None = None  # (epoch, batch) load_state_dict() asked the next pass for
        self._counters = EpochCounters()
        self._budget = FailureBudget(0, max_fraction=self.decode.max_failure_fraction, masked=split != "train")
        self._counters_epoch = 0
        self._active: Iterator | None = None  # the live pass over an epoch, if any
        self._plans = EpochPlans(self._draw_plan)

    def _place(self, device: DeviceChoice) -> None:
        """Rank, world size and where this rank's tensors live."""
        if device == "auto":
            device = "gpu" if torch.cuda.is_available() else "cpu"
        self.device: Literal["gpu", "cpu"] = device
        self.rank, self.world_size, self.local_rank = runtime.rank(), runtime.world_size(), runtime.local_rank()
        self.device_id = runtime.local_cuda_device() if device == "gpu" else None
        self.torch_device = torch.device(f"cuda:{self.device_id}") if device == "gpu" else torch.device("cpu")
        # Routes depend on this GPU's NVDEC (an H200 has no AV1 decode, an L40S has): the manifest
        # routes for that generation, from its stored facts when it was scanned for another one.
        self.gpu = detect_gpu(self.device_id) if device == "gpu" else None
        self.route_target = self.gpu.route_target if self.gpu is not None else "cpu"

    def _load_videos(self, source: Path) -> None:
        """Scan ``source`` if it is a root, then read this split's videos from the manifest, as columns."""
        if source.is_file() and source.suffix in _MANIFEST_SUFFIXES:
            manifest_path = check_manifest(source, scan=self.scan)
        else:
            manifest_path = ensure_manifest(source, device=self.route_target, scan=self.scan,
                                            splits=tuple(dict.fromkeys(("train", "val", self.split))))
        self.manifest_path = Path(manifest_path)
        with Manifest(self.manifest_path) as manifest:
            known_splits = manifest.splits()
            if self.split not in known_splits:
                raise ValueError(f"split {self.split!r} is not in the manifest {self.manifest_path}; "
                                 f"it has: {', '.join(known_splits) or 'no split'}")
            index = manifest.video_index(self.split, device=self.route_target)
            self.classes: tuple[str, ...] = manifest.classes()
        self.rejected = tuple(Failure(path, reason) for path, reason in index.rejected())
        #: This split's decodable videos (every route but ``bad``), as columns; row ``i`` is ``video_index`` i.
        self.index: VideoIndex = index.decodable()
        if not len(self.index):
            raise ValueError(f"split {self.split!r} of {self.manifest_path} has no decodable video "
                             f"({len(self.rejected)} rejected by the pre-screen)")
        if self.rejected and self.rank == 0:
            logger.info("%d file(s) of split %r rejected by the pre-screen", len(self.rejected), self.split)

    def _dali_videos(self, index: VideoIndex) -> np.ndarray:
        """By video, whether DALI decodes it: route ``dali`` and frames no larger than ``dali_max_pixels``."""
        on_dali = index.route == ROUTE_CODES["dali"]
        limit = self.decode.dali_max_pixels
        if limit is not None:
            large = on_dali & (index.width.astype(np.int64) * index.height.astype(np.int64) > limit)
            if large.any():
                on_dali &= ~large
                logger.info("%d video(s) of route dali are larger than dali_max_pixels=%d: the fallback decodes "
                            "them", int(large.sum()), limit)
        return on_dali

    @property
    def videos(self) -> VideoIndex:
        """This split's decodable videos: ``len(videos)``, ``videos[i]`` (a :class:`~daliload.dataset.VideoRow`
        with ``path``, ``label``, ``route``, ``num_frames``, ...), in ``video_index`` order."""
        return self.index

    # -- plan ---------------------------------------------------------------------

    def plan(self, epoch: int | None = None) -> list[list[Sample]]:
        """This rank's batches of samples for ``epoch`` (default: :attr:`epoch`, the pass's under way or the last's).

        The plan a pass over that epoch uses: drawn once and kept (a copy of its
        lists is returned), so looking at it beside the pass costs no second draw.
        """
        batches = self._plans.get(self._plan_key(self.epoch if epoch is None else epoch), forget_others=False)
        return [list(batch) for batch in batches]

    @property
    def epoch(self) -> int:
        """The epoch of the pass under way or of the last one; after :meth:`set_epoch`, the one it set."""
        return self._epoch

    def _next_epoch(self) -> int:
        """The epoch the next pass draws: the one set since the last pass began, else that pass's plus one."""
        return self._epoch if self._in_pass or self._epoch_set else self._epoch + 1

    def _plan_key(self, epoch: int) -> int:
        """Every epoch of an evaluation split has the same plan: one key for all."""
        return epoch if self.split == "train" else 0

    def _draw_plan(self, epoch: int) -> list[list[Sample]]:
        columns = self.index.columns
        if self.split == "train":
            samples = make_train_plan(columns, seed=self.seed, epoch=epoch, rank=self.rank,
                                      world_size=self.world_size, clip=self.clip, augment=self.augment,
                                      clips_per_video=self.clips_per_video)
        else:
            samples = make_val_plan(columns, rank=self.rank, world_size=self.world_size,
                                    clip=self.clip, augment=self.augment, views=self.views)
        return split_batches(samples, self.clips_per_batch, self.last_batch)  # whole videos: views/clips in a row

    def __len__(self) -> int:
        samples = samples_per_rank(len(self.index), self.world_size) * self.clips_per_video
        return num_batches(samples, self.batch_size, self.last_batch)

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
        if self._resume is not None and self._resume[0] != epoch:
            saved, batch = self._resume
            if 0 < batch < len(self):
                logger.warning("set_epoch(%d): the state loaded for epoch %d (at batch %d of %d) is not resumed; "
                               "epoch %d starts at its first batch", epoch, saved, batch, len(self), epoch)
            self._resume = None
        self._epoch, self._epoch_set = epoch, True

    @property
    def resumes_at(self) -> int:
        """The batch the next pass starts at: 0, or the one :meth:`load_state_dict` asked for."""
        return self._resume[1] if self._resume is not None and self._resume[0] == self._next_epoch() else 0

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
        if self._resume is not None:
            epoch, next_batch = self._resume
        elif self._pass_epoch is not None and not self._epoch_set:  # nothing set since the last pass began
            epoch, next_batch = self._pass_epoch, self._next_batch
            if next_batch >= len(self):  # that pass finished its epoch: the next pass draws the next one
                epoch, next_batch = epoch + 1, 0
        else:  # an epoch no pass has begun yet starts at its first batch
            epoch = self._epoch
            next_batch = self._next_batch if epoch == self._pass_epoch else 0
        return {"epoch": epoch, "next_batch": next_batch, "seed": self.seed,
                "world_size": self.world_size, "num_videos": len(self.index), "batch_size": self.batch_size,
                "views": list(self.views) if self.views else None, "clips_per_video": self.clips_per_video,
                "videos": dict(self._fingerprint),
                "manifest": str(self.manifest_path)}

    @cached_property
    def _fingerprint(self) -> dict:
        return self.index.fingerprint()

    def load_state_dict(self, state: dict) -> None:
        """Resume at the batch :meth:`state_dict` recorded: the next pass over that epoch yields it first.

        Raises:
            ValueError: the state was saved with another seed, world size,
                batch size or views, or from another list of videos (files
                added, removed or renamed, labels or frame counts changed), so
                the plan would differ; the message says what differs.
        """
        mine = self.state_dict()
        if isinstance(state.get("videos"), dict):
            self._check_videos(state["videos"], state.get("manifest"))
        for key in ("seed", "world_size", "num_videos", "batch_size", "views", "clips_per_video"):
            if key in state and state[key] != mine[key]:
                raise ValueError(f"cannot resume: the state was saved with {key}={state[key]}, this loader "
                                 f"has {key}={mine[key]} (the plan would differ)")
        epoch, next_batch = int(state["epoch"]), int(state["next_batch"])
        if not 0 <= next_batch <= len(self):
            raise ValueError(f"next_batch {next_batch} is outside 0..{len(self)}")
        self._epoch, self._epoch_set = epoch, True
        self._resume = (epoch, next_batch)

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

    # -- statistics ---------------------------------------------------------------------

    def stats(self) -> LoaderStats:
        """Counters of the current (or last) epoch, and the files the pre-screen rejected."""
        c, budget = self._counters, self._budget
        return LoaderStats(
            epoch=self._counters_epoch, batches=c.batches, clips_dali=c.clips_dali,
            clips_fallback=c.clips_fallback, clips_redecoded=c.clips_redecoded, replaced=len(budget.replacements),
            failures=budget.failures, rejected=self.rejected, dali_wait_s=c.dali_wait_s,
            fallback_wait_s=c.fallback_wait_s, device=self.device, dali_enabled=self.dali_enabled,
            rerouted=tuple(sorted(self._routes.rerouted)), quarantined=tuple(sorted(self._routes.quarantined)),
            replacements=budget.replacements,
            clips_masked=c.clips_masked,
            clips_past_end=c.clips_past_end, frames_decoded_fallback=c.frames_decoded_fallback,
            isolation_s=c.isolation_s, dali_disabled=self._routes.dali_disabled,
            frames_decoded_dali=c.frames_decoded_dali, clips_dali_cut=c.clips_dali_cut,
        )

    # -- iteration ------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Batch]:
        # One live pass at a time: passes share the DALI decoder's queue of batches in flight.
        if self._active is not None:
            self._active.close()
        self._active = self._epoch_pass()
        return self._active

    def _epoch_pass(self) -> Iterator[Batch]:
        # The pass begins here, at its first batch (a bare iter(), as Lightning's check of a loader makes, is none).
        epoch = self._next_epoch()
        self._epoch, self._epoch_set, self._pass_epoch, self._in_pass = epoch, False, epoch, True
        try:
            yield from self._pass_over(epoch)
        finally:
            self._in_pass = False

    def _pass_over(self, epoch: int) -> Iterator[Batch]:
        batches = self._plans.get(self._plan_key(epoch))
        start = self.resumes_at
        if start >= len(batches):
            start = 0  # the saved epoch was finished: this is a new pass over it
        self._resume = None
        self._next_batch = start
        plan = [s for b in batches for s in b]
        self._counters = EpochCounters()
        self._counters_epoch = epoch
        self._budget.reset(len({s.video_index for s in plan}))  # the videos of this rank's epoch
        todo = batches[start:]
        uses_dali = any(self._routes.uses_dali(s) for b in todo for s in b)
        epoch_pass = EpochPass(self._setup, todo, plan, routes=self._routes, budget=self._budget,
                               counters=self._counters, fallback=self._fallback,
                               dali=self._dali_source() if uses_dali else None)
        passing = iter(epoch_pass)
        try:
            for i, batch in enumerate(passing):
                # Set before yielding: a state_dict() taken while the caller holds this batch
                # resumes after it. After the last batch it equals len(self): epoch finished.
                self._next_batch = start + i + 1
                self._counters.batches += 1
                yield batch if self.with_info else batch[:2]
                if i == 0 and self.split == "train":
                    # After the first batch, which it would delay: the next epoch's plan, as set_epoch
                    # is usually called next (another epoch is drawn when asked for, as before).
                    self._plans.draw_ahead(epoch + 1)
        finally:
            passing.close()  # drops what was submitted ahead, without waiting; the sources stay for the next pass
            self._budget.warn(stacklevel=2)

    def _dali_source(self) -> DaliSource:
        if self._dali is None:
            from daliload.dali import DaliSource
            from daliload.dali import DaliClipDecoder

            decoder = DaliClipDecoder(
                self.output, batch_size=self.clips_per_batch, device=self.device, device_id=self.device_id,
                num_threads=self.decode.dali_threads_for(self.device, self.clips_per_batch),
                prefetch_queue_depth=self._setup.prefetch, pipelines=self.dali_pipelines,
                num_frames=self._frames_of)
            cutter = None
            if self.decode.dali_feed == "window":
                from daliload.dali import WindowCutter

                cutter = WindowCutter(cut_task, item_of=_cut_item(_hint_lookup(self.index)),
                                      workers=self.decode.fallback_workers, timeout_s=self.decode.timeout_s)
            self._dali = DaliSource(decoder, clip_timeout_s=self.decode.timeout_s, cutter=cutter)
        return self._dali

    def _dali_decoder(self):
        """The DALI decoder under the DALI source (built on first use)."""
        return self._dali_source().decoder

    def close(self) -> None:
        """End the live pass, stop the fallback's worker processes and release the DALI pipeline.

        Garbage collection does the same; the loader stays usable (its next
        pass starts new workers and a new pipeline).
        """
        if self._active is not None:
            self._active.close()
            self._active = None
        self._fallback.close()
        if self._dali is not None:
            self._dali.close()
            self._dali = None

    def __repr__(self) -> str:
        return (f"KineticsDALILoader(split={self.split!r}, videos={len(self.index)}, "
                f"rejected={len(self.rejected)}, batch_size={self.batch_size}, batches={len(self)}, "
                f"rank={self.rank}/{self.world_size}, device={self.device!r}, routes={self.route_target!r}, "
                f"dali={self.dali_enabled})")


class EpochSampler:
    """``loader.sampler``: the loader's epoch, where the training loops people have set it.

    Scripts written for ``DistributedSampler`` call ``loader.sampler.set_epoch(epoch)``,
    and PyTorch Lightning calls ``set_epoch`` on its dataloaders' ``sampler``
    before every epoch; both reach :meth:`KineticsDALILoader.set_epoch`, so
    those loops advance the plan with no daliload-specific code. It holds no
    state of its own (the loader's plan is the one source of truth) and is
    not an index sampler: a ``DataLoader`` cannot use it.
    """

    def __init__(self, loader: "KineticsDALILoader") -> None:
        self._loader = weakref.proxy(loader)  # no reference cycle: the loader still closes when dropped

    def set_epoch(self, epoch: int) -> None:
        self._loader.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        return self._loader.epoch

    def __repr__(self) -> str:
        return f"EpochSampler(epoch={self.epoch})"


#: The keywords the loader takes (a DataLoader habit or a typo is named against these).
_OPTIONS = ("source", "split", "batch_size", "clip_len", "frame_stride", "crop_size", "seed", "last_batch",
            "label_padding", "target_fps", "augment", "output", "device", "decode", "scan", "views", "clips_per_video",
            "with_info")

_warned_no_dali = False


def _dali_usable() -> bool:
    """Whether DALI imports; warns once (per process) with the install command when it does not."""
    global _warned_no_dali
    from daliload.dali import INSTALL_HINT, is_dali_available

    if is_dali_available():
        return True
    if not _warned_no_dali:
        _warned_no_dali = True
        warnings.warn(f"NVIDIA DALI is not installed: every clip goes through the PyAV fallback. "
                      f"To decode with DALI: {INSTALL_HINT}", RuntimeWarning, stacklevel=3)
    return False


def _frames_lookup(index: VideoIndex) -> Callable[[str], int | None]:
    """``path -> frames in the file`` over ``index`` (a binary search; no per-video dict on a rank)."""
    def frames_of(path: str) -> int | None:
        i = index.find(path)
        return (int(index.num_frames[i]) or None) if i >= 0 else None
    return frames_of


def _hint_lookup(index: VideoIndex) -> Callable[[str], StreamHint | None]:
    """``path -> the fallback's seek hint`` over ``index``, made when a video is sent to a worker."""
    def hint_of(path: str) -> StreamHint | None:
        i = index.find(path)
        return _hint(index[i]) if i >= 0 else None
    return hint_of


def _cut_item(hint_of: Callable[[str], StreamHint | None]) -> Callable[[str, Sequence[int]], tuple | None]:
    """``(path, frames) -> a cut task's item`` (``fallback.cut.cut_task``), or ``None`` when no cut can gain:
    the window's entry is the file's first frame, or the file has no usable seek hint."""
    def item_of(path: str, frames: Sequence[int]) -> tuple | None:
        hint = hint_of(path)
        if hint is None or hint.unsafe_seek:
            return None
        keys = hint.keyframe_indices
        if keys[bisect.bisect_right(keys, min(frames)) - 1] == 0:
            return None
        return path, tuple(frames), hint
    return item_of


def _hint(entry: VideoRow) -> StreamHint | None:
    """A seek hint for the fallback from the manifest: constant-frame-rate files with keyframes,
    and every file the deep check found unsafe to seek (decoded from its start)."""
    if entry.unsafe_seek:
        return StreamHint(keyframe_indices=(0,), fps=entry.fps or 1.0,
                          num_frames=entry.num_frames or None, unsafe_seek=True)
    if entry.vfr or not entry.keyframes or entry.keyframes[0] != 0 or not entry.fps:
        return None
    try:
        return StreamHint(keyframe_indices=entry.keyframes, fps=entry.fps, num_frames=entry.num_frames or None)
    except ValueError:
        return None
