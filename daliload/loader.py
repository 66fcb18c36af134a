"""KineticsDALILoader: the public face of the loader, for one DDP rank.

Per epoch and rank::

    manifest (pre-screen) --> usable videos (route dali | fallback; bad ones are reported, never planned)
        --> epoch plan (daliload.plan): this rank's ordered samples, equal count on every rank
        --> batches of batch_size (last-batch policy)
        --> one pass (daliload.epoch.EpochPass): each sample to its clip source (DALI or the
            PyAV fallback), merged in plan order into one (videos, labels) batch on
            cuda:LOCAL_RANK (or the CPU)

This module holds the loader's state across epochs (epoch, resume point,
routes, the two clip sources (:attr:`KineticsDALILoader.sources`), whose
processes and pipelines live as long as the loader), checkpointing and
:class:`LoaderStats`. Its options and their checks live in
:mod:`daliload.options`, the work of a pass in :mod:`daliload.epoch`;
failures are counted by one
:class:`~daliload.failures.FailureBudget` per epoch. Batch size and batch count
never change whatever fails, so DDP ranks stay in step.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import os
import weakref
from typing import Iterator, Literal, Union

import torch

from daliload import runtime
from daliload.dataset import VideoIndex, decoded_path
from daliload.epoch._resume import LoaderState
from daliload.epoch import (PADDING_LABEL, BatchFormat, BatchInfo, ClipSources, DaliSetup, EpochCounters, EpochPass,
                            EpochPlans, EpochProgress, EpochSampler, PassSetup, Routes, dali_videos,
                            check_batches, explicit_choice, refuse_disagreeing_ranks, warn_upscaled, weakly)
from daliload.failures import FailureBudget
from daliload.options import (DecodeSpec, augment_and_output, check_options, checked_batch_format,
                              checked_clips_per_video, checked_label_padding, checked_padding_label, checked_spec,
                              checked_switches, checked_views, dali_usable, plan_settings,
                              refuse_unknown_options)
from daliload.plan import (AugmentSpec, ClipSpec, LastBatch, OutputSpec, Sample, drop_padding, make_train_plan,
                           make_val_plan, num_batches, samples_per_rank, split_batches)
from daliload.prescreen import ScanSpec, loader_source, split_codecs, split_videos
from daliload.prescreen.byte_indexes import ByteIndexes
from daliload.prescreen.gpus import detect_gpu
from daliload.runtime import keep_interrupts, refuse_bootstrapping_main
from daliload.stats import LoaderStats
from daliload.stream import transfer_counts
from fallback.options import FallbackOptions

logger = logging.getLogger(__name__)

#: ``"auto"``, ``"gpu"``, ``"cpu"``, or what torch takes: ``"cuda"``, ``"cuda:N"``, a ``torch.device``.
DeviceChoice = Union[str, torch.device]
#: ``(videos, labels)``, or ``(videos, labels, info)`` with ``with_info=True``; a dict with ``batch_format="dict"``.
Batch = tuple[torch.Tensor, ...] | tuple[torch.Tensor, torch.Tensor, BatchInfo] | dict[str, object]

__all__ = ["PADDING_LABEL", "DecodeSpec", "EpochSampler", "KineticsDALILoader", "LoaderStats", "ScanSpec",
           "split_batches"]


class KineticsDALILoader(LoaderState):
    """Iterate ``(videos, labels)`` batches of a Kinetics-style split, for one DDP rank.

    Args:
        root: the dataset root (scanned on first use; see :class:`ScanSpec`)
            or the path of a manifest written by ``daliload scan``; ``bytes``
            (``os.fsencode``, ``os.listdir(b"...")``) as ``os.fsdecode`` reads them; or (path, label) pairs;
            or a prefix of an object store (``s3://bucket/k700``: ``docs/remote.md``). Required;
            ``source=`` (its old name) still works, with a ``DeprecationWarning``.
        split: the split to read, by name. ``"train"`` shuffles and augments by
            default, any other split neither (``shuffle``, ``augment``).
        batch_size: clips per batch (videos per batch with ``views``). Default 32.
            Larger than this rank's share of the split with ``last_batch="pad"``,
            the epoch is one batch, mostly repeats: a ``UserWarning`` says so.
        clip_len: frames per clip. Default 16.
        frame_stride: step between clip frames. Default 4.
        crop_size: output size in pixels, an int (square) or ``(height, width)``.
            Default 224, or ``augment.crop_size`` when ``augment`` is given.
        seed: base seed, the same on every rank. Default 0.
        last_batch: ``"pad"`` (default), ``"drop"`` or ``"partial"``; see
            :func:`split_batches`.
        shuffle: a new order of the videos every epoch (seeded: ``seed``,
            the epoch). Default ``None``: on for ``"train"``.
        label_padding: padding samples (repeats that keep ranks equal):
            ``"drop"`` leaves them out, so a step's batch mean and Lightning's
            batch-size weights count each video once (every rank still yields
            ``len()`` batches, none empty: :func:`daliload.plan.drop_padding`);
            ``True`` labels them ``padding_label``; ``False`` keeps their labels.
            Default: ``"drop"`` if the loader neither shuffles nor augments.
        padding_label: the label of masked rows (padding with
            ``label_padding=True``, failures when evaluating): a negative
            integer. Default :data:`PADDING_LABEL` (-1); ``-100`` is what Hugging
            Face's losses and torch's ``CrossEntropyLoss`` ignore by default.
        target_fps: if set, each video's stride follows its own fps so clips
            span the same time (see :class:`daliload.plan.ClipSpec`).
        augment: random window, crop and flip per clip: ``True`` or ``False``,
            or an :class:`AugmentSpec` (crop mode, ranges, flip probability)
            used when on. Off: the centred window and crop, no flip. Default
            ``None`` (or a spec): on when the loader shuffles.
        output: mean, std, dtype and layout; default float32 ``CTHW``,
            Kinetics mean/std, ``crop_size`` (:class:`OutputSpec`; a field
            not set follows ``crop_size``).
        device: ``"auto"`` (default: ``"gpu"`` when CUDA is available),
            ``"gpu"`` or ``"cuda"`` (NVDEC, on the GPU ``torch.cuda.set_device``
            made current, else ``cuda:LOCAL_RANK``), ``"cuda:N"`` or
            ``torch.device("cuda", N)``, or ``"cpu"`` / ``torch.device("cpu")``.
        decode: threads, workers, prefetch and failure limits (:class:`DecodeSpec`).
        scan: pre-screen options when ``root`` is a dataset root (:class:`ScanSpec`).
        layout, fold: how ``root`` is read (default detected) and UCF101's or HMDB51's fold: ``docs/datasets.md``.
        views: ``(num_temporal, num_spatial)`` views per video, for multi-view
            evaluation (without augmentation): a batch row is one video with
            its ``V = num_temporal * num_spatial`` views, temporal-major,
            ``videos`` ``(B, V, C, T, H, W)`` (windows evenly spaced, crops
            along the long side: :func:`daliload.plan.make_val_plan`); a video
            one of whose views fails gets label -1. ``None`` (default): no view
            axis. :func:`daliload.evaluate` scores such batches.
        clips_per_video: repeated sampling, with augmentation (VideoMAE's
            ``num_sample``): each video gives this many clips per epoch, each
            with its own window, crop and flip, in a row in the plan and in
            its batch (``batch_size`` counts clips and must be a multiple of
            ``k``); a video's file is read once for them, and a broken video
            fails its clips as one failed video. Default 1.
        with_info: yield ``(videos, labels, info)``, ``info`` a
            :class:`~daliload.epoch.BatchInfo` saying what each row is: its
            video (``info.video_index`` into :attr:`videos`), clip or view,
            padding or replaced, and ``info.mask`` (``labels != padding_label``),
            for per-video evaluation and masked losses. Default ``False``.
        batch_format: ``"tuple"`` (default) or ``"dict"``: ``{"videos": ...,
            "labels": ...}`` (and ``"info"`` with ``with_info``).
        batch_keys: the dict's two keys, videos' then labels'
            (``batch_format="dict"`` implied): ``("pixel_values", "labels")``
            is what Hugging Face video models take as ``model(**batch)``
            (VideoMAE wants ``OutputSpec(layout="TCHW")``), ``("video", "label")`` PyTorchVideo's.

    Attributes:
        sampler: the loader's epoch where DDP scripts and PyTorch Lightning
            set it: ``loader.sampler.set_epoch(epoch)`` is :meth:`set_epoch`
            (:class:`EpochSampler`; not an index sampler, so a ``DataLoader``
            cannot use it).
        classes: the manifest's class names in label order:
            ``classes[label]`` names a label of any split.
        shuffle, augmentation: the switches as resolved; ``evaluating``:
            neither is on. ``batch_size``, ``drop_last``: as a ``DataLoader``'s.

    Rank and world size come from ``torch.distributed`` when it is initialized
    (else ``RANK``/``WORLD_SIZE``, else 0 of 1). Under DDP, global rank 0
    scans and the others wait for its manifest; then the ranks compare, in
    one collective, what their plans follow (root, split, the switches, batch
    and clip settings) and the videos each read: ranks that differ all raise
    one ``ValueError`` naming each option and value, and a rank whose
    construction failed makes the others raise too, instead of hanging at
    DDP's next collective (so every rank builds its loaders in one order).

    Epochs: a pass (from its first batch, not ``iter()``) draws the epoch
    given to :meth:`set_epoch` (or ``loader.sampler.set_epoch``, where DDP
    scripts and Lightning call it) or :meth:`load_state_dict` since the last
    pass began, else the last pass's epoch plus one: a loop that calls
    nothing (Accelerate's, a plain ``for``) gets a fresh, deterministic plan
    each pass, as over a ``RandomSampler``. A pass left early (``break``) is
    not continued by the next one, except after :meth:`load_state_dict` (as
    torchdata's ``StatefulDataLoader``): the next pass over the saved epoch
    resumes at the saved batch.

    The fallback's worker processes start with the first pass that needs them,
    serve every later epoch and stop at :meth:`close` or when the loader is
    dropped; a pass abandoned drops its decodes in flight (nothing waits).

    Raises:
        FileNotFoundError: ``root`` does not exist.
        TypeError: no ``root``, an unknown keyword (the message names the one
            meant), or an option of the wrong type (``decode={...}``: the
            message spells the spec out).
        ValueError: a bad option, an unknown split, a split with no usable
            video, or (under DDP) ranks given different options or videos.
        RuntimeError: under DDP, another rank's construction failed.
    """

    def __init__(
        self,
        root: str | os.PathLike | None = None,
        split: str = "train",
        batch_size: int = 32,
        clip_len: int = 16,
        frame_stride: int = 4,
        crop_size: int | tuple[int, int] | None = None,
        *,
        seed: int = 0,
        last_batch: LastBatch = "pad",
        shuffle: bool | None = None,
        label_padding: bool | Literal["drop"] | None = None,
        padding_label: int = PADDING_LABEL,
        target_fps: float | None = None,
        augment: bool | AugmentSpec | None = None,
        output: OutputSpec | None = None,
        device: DeviceChoice = "auto",
        decode: DecodeSpec | None = None,
        scan: ScanSpec | None = None,
        views: tuple[int, int] | None = None,
        clips_per_video: int = 1,
        with_info: bool = False,
        batch_format: Literal["tuple", "dict"] | None = None,
        batch_keys: tuple[str, str] | None = None,
        layout: str | None = None, fold: int | None = None,
        **unknown: object,
    ) -> None:
        root, split, scan = loader_source(decoded_path(root), split, unknown, scan, layout=layout, fold=fold)
        refuse_unknown_options(unknown, _OPTIONS)
        # A spawn/forkserver child re-running an unguarded script must not load (and train) again.
        refuse_bootstrapping_main("A KineticsDALILoader")
        check_options(batch_size=batch_size, last_batch=last_batch, device=device, seed=seed)
        self.clip = ClipSpec(clip_len=clip_len, frame_stride=frame_stride, target_fps=target_fps)
        #: whether the plan is shuffled each epoch, and whether its clips are augmented (random window, crop, flip)
        self.shuffle, self.augmentation, spec = checked_switches(shuffle, augment, split)
        #: neither: a fixed pass (padding left out or masked, failures masked, static routing, one plan for all epochs)
        self.evaluating = not (self.shuffle or self.augmentation)
        self.augment, self.output = augment_and_output(crop_size, spec,
                                                       checked_spec("output", output, OutputSpec, None))
        self.decode: DecodeSpec = checked_spec("decode", decode, DecodeSpec, DecodeSpec())
        self.scan: ScanSpec = checked_spec("scan", scan, ScanSpec, ScanSpec())
        self.split = split
        self.batch_size = batch_size
        self.views = checked_views(views, self.augmentation)
        self.clips_per_video = checked_clips_per_video(clips_per_video, self.augmentation, batch_size)
        if not isinstance(with_info, bool):
            raise TypeError(f"with_info must be True or False, got {with_info!r}")
        self.with_info = with_info
        self.batch_keys = checked_batch_format(batch_format, batch_keys)  # None: tuples
        self._format = BatchFormat(self.batch_keys, with_info)
        #: clips per batch: ``batch_size`` videos times their views
        self.clips_per_batch = batch_size * (self.views[0] * self.views[1] if self.views else 1)
        self.seed = seed
        self.last_batch: LastBatch = last_batch
        self.label_padding = checked_label_padding(label_padding, self.evaluating)
        #: the label of masked rows (padding, and failures outside training)
        self.padding_label = checked_padding_label(padding_label)
        self._place(device)
        self.dali_enabled = self.decode.decoder == "auto" and dali_usable()
        # Under DDP the ranks compare their options and videos in one collective once the split is read,
        # failed or not (refuse_disagreeing_ranks): what a rank finds wrong on its own from here on is
        # shared with the others, which would otherwise wait for it at their next collective.
        settings = {"root": os.path.realpath(root), **self._plan_settings()}
        try:
            self.manifest_path, self.classes, index, self.rejected = split_videos(
                root, split, device=self.route_target, scan=self.scan)
            #: This split's decodable videos (every route but ``bad``), as columns; row ``i`` is ``video_index`` i.
            self.index: VideoIndex = index
            check_batches(index, self.clip, split=split, batch_size=batch_size, last_batch=last_batch,
                          batches=len(self), clips_per_video=self.clips_per_video, label_padding=self.label_padding,
                          manifest=self.manifest_path, world_size=self.world_size)
            videos = (str(self.manifest_path), self._fingerprint) if runtime.is_distributed() else None
        except Exception as err:
            refuse_disagreeing_ranks(settings, None, err)
            raise
        refuse_disagreeing_ranks(settings, videos, None)
        warn_upscaled(index, self.augment.output_size, self.split)
        #: DALI pipelines (``DecodeSpec.dali_pipelines``; "auto": one per NVDEC engine of this GPU's model)
        self.dali_pipelines = self.decode.dali_pipelines_for(
            self.device, self.gpu.nvdec_engines if self.gpu else None,
            gpu_name=self.gpu.describe() if self.gpu and self.dali_enabled else None)
        prefetch = self.decode.batches_ahead(self.clips_per_batch, clips_per_video=self.clips_per_video,
                                             pipelines=self.dali_pipelines)
        policy = self.decode.routing_for(not self.evaluating, self.device, self.clips_per_batch)
        self._routes = Routes(dali_videos(index, self.decode.dali_max_pixels) if self.dali_enabled else None,
                              policy=policy, lag=prefetch,
                              codecs=functools.partial(split_codecs, self.manifest_path, split, index),
                              explicit=explicit_choice(self.decode.decoder, self.decode.routing))
        # Both sources live as long as the loader (workers start at the fallback's first group, DALI at its first).
        self._sources = ClipSources(
            index, self.output, FallbackOptions(threads=self.decode.fallback_threads, timeout_s=self.decode.timeout_s,
                                                read_policy=self.decode.read_policy),
            workers=self.decode.fallback_workers, timeout_s=self.decode.timeout_s, device=self.torch_device,
            dali=DaliSetup(batch_size=self.clips_per_batch, device=self.device, device_id=self.device_id,
                           num_threads=self.decode.dali_threads_for(self.device, self.clips_per_batch),
                           prefetch=prefetch, pipelines=self.dali_pipelines,
                           cut_windows=self.decode.dali_feed == "window",
                           read_policy=self.decode.read_policy) if self.dali_enabled else None,
            keep_buffers=prefetch + 2,  # the batches ahead, and about two held (copies to the GPU, the loop's batch)
            reads_of=ByteIndexes(self.manifest_path))
        # A loader dropped without close() (a rebuilt evaluation loader, a `del`) stops its workers and threads
        # and releases its pipelines as it goes: at once, as the loader is in no reference cycle. Not at
        # interpreter exit, where the exit hooks of the waits for DALI order that themselves.
        self._closer = weakref.finalize(self, self._sources.close)
        self._closer.atexit = False
        keep_interrupts()  # a Ctrl-C landing in a buffer's give-back (a finalizer) is not dropped
        self._setup = PassSetup(
            output=self.output, device=self.torch_device, label_padding=bool(self.label_padding),
            mask_failed=self.evaluating, prefetch=prefetch, num_frames=index.frames_of_video,
            views=self.clips_per_batch // batch_size if self.views else 0, padding_label=self.padding_label)
        self._progress = EpochProgress()  # the epoch the next pass draws and the batch it starts at
        #: Where DDP scripts (``DistributedSampler``) and PyTorch Lightning call ``set_epoch``.
        self.sampler = EpochSampler(self)
        self._budget = FailureBudget(0, max_fraction=self.decode.max_failure_fraction, masked=self.evaluating)
        self._last_pass: EpochPass | None = None  # the pass under way or the last one: what stats() reports
        # The live pass over an epoch, if any, held weakly, and the plans' draw a weak method: the loader is in
        # no reference cycle, so a loader dropped without close() goes at once (refcount), and with it its
        # workers, threads and pipelines (_closer), not at some later garbage collection.
        self._active: weakref.ref | None = None
        self._plans = EpochPlans(weakly(self._draw_plan))

    def _plan_settings(self) -> dict:
        """What the plan follows (:func:`daliload.options.plan_settings`): recorded, and compared across ranks."""
        return plan_settings(split=self.split, seed=self.seed, batch_size=self.batch_size, last_batch=self.last_batch,
                             views=self.views, clips_per_video=self.clips_per_video, clip=self.clip,
                             augment=self.augment, shuffle=self.shuffle, augmentation=self.augmentation,
                             label_padding=self.label_padding)

    def _place(self, device: DeviceChoice) -> None:
        """Rank, world size and where this rank's tensors live."""
        self.device: Literal["gpu", "cpu"]
        self.device, self.device_id = runtime.resolve_device(device)
        device = self.device
        self.rank, self.world_size, self.local_rank = runtime.rank(), runtime.world_size(), runtime.local_rank()
        self.torch_device = torch.device(f"cuda:{self.device_id}") if device == "gpu" else torch.device("cpu")
        # Routes depend on this GPU's NVDEC (an H200 has no AV1 decode, an L40S has): the manifest
        # routes for that generation, from its stored facts when it was scanned for another one.
        self.gpu = detect_gpu(self.device_id) if device == "gpu" else None
        self.route_target = self.gpu.route_target if self.gpu is not None else "cpu"

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
        return self._progress.epoch

    def _plan_key(self, epoch: int) -> int:
        """Every epoch of a plan neither shuffled nor augmented is the same: one key for all."""
        return 0 if self.evaluating else epoch

    def _draw_plan(self, epoch: int) -> list[list[Sample]]:
        columns = self.index.columns
        common = dict(seed=self.seed, epoch=epoch, rank=self.rank, world_size=self.world_size, clip=self.clip,
                      augment=self.augment, shuffle=self.shuffle)
        if self.augmentation:
            samples = make_train_plan(columns, clips_per_video=self.clips_per_video, **common)
        else:
            samples = make_val_plan(columns, views=self.views, **common)
        batches = split_batches(samples, self.clips_per_batch, self.last_batch)  # whole videos: views/clips in a row
        if self.label_padding != "drop":
            return batches
        return drop_padding(batches, self.clips_per_batch // self.batch_size * self.clips_per_video)

    def __len__(self) -> int:
        """Batches per epoch on this rank: the same on every rank, whatever fails (``last_batch`` decides
        the last one)."""
        samples = samples_per_rank(len(self.index), self.world_size) * self.clips_per_video
        return num_batches(samples, self.batch_size, self.last_batch)

    # -- statistics ---------------------------------------------------------------------

    def stats(self) -> LoaderStats:
        """Counters of the current (or last) epoch, and the files the pre-screen rejected."""
        budget, routes, last, q = self._budget, self._routes, self._last_pass, self._routes.quarantined
        path_of = self.index.path_of
        return LoaderStats(
            epoch=last.epoch if last else 0,
            **dataclasses.asdict(last.counters if last else EpochCounters()),  # what the pass counted, by name
            replaced=len(budget.replacements), failures=budget.failures, replacements=budget.replacements,
            rejected=self.rejected, device=self.device, dali_enabled=self.dali_enabled,
            rerouted=tuple(sorted(map(path_of, routes.rerouted))), quarantined=tuple(sorted(map(path_of, q))),
            dali_disabled=routes.dali_disabled, routing=routes.policy, decoders=routes.decoders(),
            **transfer_counts()._asdict())

    # -- iteration ------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Batch]:
        # One live pass at a time: passes share the DALI decoder's queue of batches in flight.
        self._end_active()
        passing = self._epoch_pass()
        self._active = weakref.ref(passing)  # the caller's loop holds it; dropped, it closes itself
        return passing

    def _end_active(self) -> None:
        active = self._active() if self._active is not None else None
        if active is not None:
            active.close()
        self._active = None

    def _epoch_pass(self) -> Iterator[Batch]:
        # The pass begins here, at its first batch (a bare iter(), as Lightning's check of a loader makes, is none).
        epoch = self._progress.begin()
        try:
            yield from self._pass_over(epoch)
        finally:
            self._progress.end()

    def _pass_over(self, epoch: int) -> Iterator[Batch]:
        batches = self._plans.get(self._plan_key(epoch))
        start = self._progress.start(len(batches))
        todo = batches[start:]
        uses_dali = any(self._routes.uses_dali(s) for b in todo for s in b)
        epoch_pass = EpochPass(self._setup, todo, [s for b in batches for s in b], routes=self._routes,
                               budget=self._budget, fallback=self._sources.fallback,
                               dali=self._sources.dali() if uses_dali else None, epoch=epoch, start=start,
                               pinned=self._sources.pinned)
        self._last_pass = epoch_pass
        passing = iter(epoch_pass)
        try:
            for i, batch in enumerate(passing):
                # A state_dict() taken while the caller holds this batch resumes after it; after the
                # last batch it equals len(self): epoch finished.
                self._progress.yielded(epoch_pass.next_batch)
                yield self._format(batch)
                if i == 0 and not self.evaluating:
                    # After the first batch, which it would delay: the next epoch's plan, as set_epoch
                    # is usually called next (another epoch is drawn when asked for, as before).
                    self._plans.draw_ahead(epoch + 1)
        finally:
            passing.close()  # drops what was submitted ahead, without waiting; the sources stay for the next pass

    @property
    def sources(self) -> ClipSources:
        """The loader's clip sources: ``sources.fallback`` (its workers: ``worker_pids``) and
        ``sources.dali()`` (built on first use; ``.decoder`` is its :class:`~daliload.dali.DaliClipDecoder`).

        The loader owns them (they live until :meth:`close`); this is where tools and tests reach a decoder
        (:func:`daliload.testing.inject_faults` makes the fallback's decodes misbehave through it).
        """
        return self._sources

    def close(self) -> None:
        """End the live pass, stop the fallback's worker processes and release the DALI pipeline.

        Dropping the loader does the same, at once (it is in no reference
        cycle); the loader stays usable (its next pass starts new workers and
        a new pipeline).
        """
        self._end_active()
        self._sources.close()

    def __repr__(self) -> str:
        return (f"KineticsDALILoader(split={self.split!r}, videos={len(self.index)}, "
                f"rejected={len(self.rejected)}, batch_size={self.batch_size}, batches={len(self)}, "
                f"rank={self.rank}/{self.world_size}, device={self.device!r}, routes={self.route_target!r}, "
                f"dali={self.dali_enabled})")


#: The keywords the loader takes, from its signature (a DataLoader habit or a typo is named against these).
_OPTIONS = tuple(name for name, parameter in inspect.signature(KineticsDALILoader).parameters.items()
                 if parameter.kind is not inspect.Parameter.VAR_KEYWORD)
