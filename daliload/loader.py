"""KineticsDALILoader: the public face of the loader, for one DDP rank.

(About 600 lines: the public API in one place, the loader class with its
two option groups and its stats, each documented for users; the epoch pass,
failures and plan live in their own modules.)

Per epoch and rank::

    manifest (pre-screen) --> usable videos (route dali | fallback; bad ones are reported, never planned)
        --> epoch plan (daliload.plan): this rank's ordered samples, equal count on every rank
        --> batches of batch_size (last-batch policy)
        --> one pass (daliload.epoch.EpochPass): DALI and fallback stages, merged in plan order
            into one (videos, labels) batch on cuda:LOCAL_RANK (or the CPU)

This module holds what users touch: the options (:class:`DecodeSpec`), the
loader's state across epochs (epoch, resume point, routes, the DALI decoder),
checkpointing and :class:`LoaderStats`. The work of a pass lives in
:mod:`daliload.epoch`; failures are counted by one
:class:`~daliload.failures.FailureBudget` per epoch. Batch size and batch count
never change whatever fails, so DDP ranks stay in step.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Callable, Iterator, Literal, Mapping

import torch

from daliload import dist
from daliload.epoch import (
    PADDING_LABEL,
    EpochCounters,
    EpochPass,
    FallbackShare,
    FallbackWorkers,
    PassSetup,
    Routes,
)
from daliload.failures import DEFAULT_MAX_FAILURE_FRACTION, Failure, FailureBudget
from daliload.plan import (AugmentSpec, ClipSpec, LastBatch, OutputSpec, Sample, check_last_batch, check_views,
                           make_train_plan, make_val_plan, num_batches, samples_per_rank, split_batches)
from daliload.prescreen import Manifest, ScanSpec, check_manifest, ensure_manifest
from daliload.prescreen.gpus import detect_gpu
from daliload.videoindex import VideoIndex, VideoRow
from daliload.workerpool import refuse_bootstrapping_main, usable_cores
from fallback import DecodeOptions, StreamHint, WorkerOptions
from fallback.dataset import faults_from_env

logger = logging.getLogger(__name__)

DeviceChoice = Literal["auto", "gpu", "cpu"]
DecoderChoice = Literal["auto", "fallback"]

__all__ = ["PADDING_LABEL", "DecodeSpec", "KineticsDALILoader", "LoaderStats", "ScanSpec", "split_batches"]

_MANIFEST_SUFFIXES = (".sqlite", ".sqlite3", ".db")
#: Fallback transfers each worker prepares ahead. A transfer is one batch's fallback share (the
#: first batch of a pass: one per worker), so the fallback decodes this many batches per worker ahead.
_FALLBACK_PREFETCH = 2


@dataclass(frozen=True)
class DecodeSpec:
    """How clips are decoded: threads, workers, prefetch, failure limits.

    Attributes:
        decoder: ``"auto"`` (default) decodes route ``dali`` with DALI when it
            is installed; ``"fallback"`` sends every file through PyAV.
        dali_threads: DALI worker threads: clips decoded at once. Default
            ``None``: on a GPU ``min(batch_size, 16)`` (at least twice the 7
            NVDEC engines of an H100/H200, so every engine has a session
            decoding while another demuxes), on the CPU one per core.
        prefetch_batches: DALI batches in flight ahead of the one consumed. Default 2
            (at least ``dali_pipelines``).
        dali_pipelines: DALI pipelines per rank, each with ``dali_threads``
            threads, taking batches in turn (batches still come in plan
            order). More keep more NVDEC sessions busy at once; 1 (default)
            until a GPU run picks a better default.
        fallback_workers: PyAV decoding processes. Default 2. 0 decodes in the
            training process: a debugging mode in which a crash inside FFmpeg
            ends the run and a hang inside it is not cut.
        fallback_threads: FFmpeg threads per fallback decode. Default 1.
        timeout_s: per-clip decode limit, seconds. Default 60. A fallback
            decode past it fails (its worker is killed at ``1.25 * timeout_s +
            0.5``); a DALI batch may take ``timeout_s * (1 + ceil(clips /
            dali_threads))`` before the loader raises
            :class:`~daliload.pipeline.DaliTimeoutError` naming its files.
        max_failure_fraction: raise once more than this fraction of an epoch's
            samples failed to decode (they are replaced until then; at least
            one failure is allowed). Default 0.05.
    """

    decoder: DecoderChoice = "auto"
    dali_threads: int | None = None
    prefetch_batches: int = 2
    dali_pipelines: int = 1
    fallback_workers: int = 2
    fallback_threads: int = 1
    timeout_s: float = 60.0
    max_failure_fraction: float = DEFAULT_MAX_FAILURE_FRACTION

    def __post_init__(self) -> None:
        if self.decoder not in ("auto", "fallback"):
            raise ValueError(f"decoder must be 'auto' or 'fallback', got {self.decoder!r}")
        for name in ("dali_threads", "prefetch_batches", "dali_pipelines", "fallback_threads"):
            value = getattr(self, name)
            if name == "dali_threads" and value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not isinstance(self.fallback_workers, int) or self.fallback_workers < 0:
            raise ValueError(f"fallback_workers must be an integer >= 0, got {self.fallback_workers!r}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 seconds, got {self.timeout_s!r}")
        if not 0 <= self.max_failure_fraction <= 1:
            raise ValueError(f"max_failure_fraction must be in [0, 1], got {self.max_failure_fraction!r}")

    def fallback_decode(self, hints: dict[str, StreamHint]) -> DecodeOptions:
        """The fallback's per-sample options under this spec."""
        return DecodeOptions(threads=self.fallback_threads, timeout_s=self.timeout_s, hints=hints)

    def fallback_workers_options(self, *, pin_memory: bool) -> WorkerOptions:
        """The fallback's worker options under this spec (each pass sets its transfers' sizes)."""
        return WorkerOptions(batch_size=1, num_workers=self.fallback_workers, pin_memory=pin_memory,
                             prefetch_factor=_FALLBACK_PREFETCH)

    def dali_threads_for(self, device: str, batch_size: int) -> int:
        """DALI threads: as given, else ``min(batch_size, 16)`` on a GPU and one per core on the CPU."""
        if self.dali_threads is not None:
            return self.dali_threads
        return min(batch_size, 16) if device == "gpu" else usable_cores()


@dataclass(frozen=True)
class LoaderStats:
    """What the loader did in the current (or last) epoch.

    Attributes:
        epoch: the epoch these counters belong to.
        batches: batches yielded.
        clips_dali: clips decoded by DALI.
        clips_fallback: clips decoded by the PyAV fallback (its own route, plus
            DALI-route clips decoded again after a failed DALI batch).
        clips_redecoded: DALI-route clips that went through the fallback
            because their DALI batch failed.
        replaced: plan slots filled with another sample because theirs failed.
        failures: ``(path, reason)`` of every sample that failed at run time,
            each ``(path, position)`` once.
        rejected: ``(path, reason)`` of the files the pre-screen marked ``bad``
            (never planned).
        dali_wait_s: seconds spent waiting for DALI batches.
        fallback_wait_s: seconds spent waiting for fallback clips.
        device: ``"gpu"`` or ``"cpu"``: where DALI decodes and tensors live.
        dali_enabled: whether DALI may decode in this run (False without
            DALI installed, or with ``decoder="fallback"``).
        rerouted: files of route ``dali`` that DALI failed on (found by
            isolating a failed batch); they go through the fallback from the
            next batch on, for the rest of this run.
        replacements: ``(slot_position, used_position)`` of every replaced
            slot: which plan sample's clip fills a failed slot.
        clips_masked: failed samples of an evaluation split (not ``"train"``):
            their slot holds a replacement with label -1, like padding, so no
            video is scored twice.
        clips_past_end: clips whose window runs past the end of their video
            (the last frame is repeated, as ``pad_mode="edge"``).
        isolation_s: seconds spent finding which files broke DALI batches.
        dali_disabled: why DALI was given up for the rest of the run (several
            failed batches in a row with no single file to blame), or ``None``.
    """

    epoch: int
    batches: int
    clips_dali: int
    clips_fallback: int
    clips_redecoded: int
    replaced: int
    failures: tuple[Failure, ...]
    rejected: tuple[Failure, ...]
    dali_wait_s: float
    fallback_wait_s: float
    device: str
    dali_enabled: bool
    rerouted: tuple[str, ...] = ()
    replacements: tuple[tuple[int, int], ...] = ()
    clips_masked: int = 0
    clips_past_end: int = 0
    isolation_s: float = 0.0
    dali_disabled: str | None = None

    @property
    def dali_share(self) -> float:
        """Fraction of clips DALI decoded."""
        total = self.clips_dali + self.clips_fallback
        return self.clips_dali / total if total else 0.0

    def format(self) -> str:
        """A few readable lines for logs."""
        lines = [
            f"epoch {self.epoch}: {self.batches} batches, {self.clips_dali} clips by DALI ({self.device}), "
            f"{self.clips_fallback} by the fallback ({self.dali_share:.0%} DALI)",
            f"waiting: DALI {self.dali_wait_s:.2f} s, fallback {self.fallback_wait_s:.2f} s; "
            f"re-decoded after a DALI failure: {self.clips_redecoded}; replaced: {self.replaced}",
        ]
        if self.clips_masked or self.clips_past_end:
            lines.append(f"failed and masked (label -1): {self.clips_masked}; "
                         f"windows past the end of their video: {self.clips_past_end}")
        if self.dali_disabled:
            lines.append(f"DALI given up for this run: {self.dali_disabled}")
        if self.rerouted:
            lines.append(f"sent to the fallback after failing in DALI ({len(self.rerouted)}): "
                         + ", ".join(self.rerouted[:5]) + (" ..." if len(self.rerouted) > 5 else ""))
        if self.failures:
            lines.append(f"failed at run time ({len(self.failures)}):")
            lines += [f"  {f.path}: {f.reason}" for f in self.failures[:10]]
        if self.rejected:
            lines.append(f"rejected by the pre-screen ({len(self.rejected)}):")
            lines += [f"  {f.path}: {f.reason}" for f in self.rejected[:10]]
            if len(self.rejected) > 10:
                lines.append(f"  ... and {len(self.rejected) - 10} more")
        return "\n".join(lines)


class _Plans:
    """This rank's plans by epoch: at most two, the one in use and the next one, drawn ahead in a daemon thread.

    A rank of 64 draws its share of a 650k-video epoch in about 0.1 s; one
    rank alone makes ~600k :class:`Sample` objects (a few seconds, some
    hundred MB), and that is worth doing while the previous epoch runs. A
    plan is a pure function of the epoch (the videos, seed, rank and specs
    are the loader's, fixed), so a plan drawn ahead is the plan. Plans are
    not kept beyond that: a pass moving on to an epoch drops the others, and
    looking at other epochs' plans (:meth:`KineticsDALILoader.plan`) keeps
    only the latest two.

    Args:
        draw: ``epoch -> batches``.
    """

    #: Plans kept at most: the pass's and the one drawn ahead (or looked at) next.
    KEEP = 2

    def __init__(self, draw: Callable[[int], list[list[Sample]]]) -> None:
        self._draw = draw
        self._done: OrderedDict[int, list[list[Sample]] | BaseException] = OrderedDict()
        self._ahead: dict[int, threading.Thread] = {}
        self._lock = threading.Lock()

    def get(self, epoch: int, *, forget_others: bool = True) -> list[list[Sample]]:
        """The plan of ``epoch`` (waits for it if it is being drawn ahead), kept for later calls.

        A pass moving on to ``epoch`` forgets the others (``forget_others``); a
        look at a plan (:meth:`KineticsDALILoader.plan`) keeps the latest two.
        """
        thread = self._ahead.pop(epoch, None)
        if thread is not None:
            thread.join()
        with self._lock:
            plan = self._done.get(epoch)
            if forget_others:
                self._done.clear()  # the caller moves on to this epoch: older plans are not needed again
        if plan is None or isinstance(plan, BaseException):
            plan = self._draw(epoch)  # a failure ahead is raised here, in the caller's thread
        self._keep(epoch, plan)
        return plan

    def kept(self) -> list[int]:
        """The epochs whose plans are kept, oldest first."""
        with self._lock:
            return list(self._done)

    def draw_ahead(self, epoch: int) -> None:
        """Start drawing ``epoch``'s plan in a daemon thread, unless it is drawn or being drawn."""
        with self._lock:
            if epoch in self._done or epoch in self._ahead:
                return
            thread = threading.Thread(target=self._store, args=(epoch,), name="daliload-plan-ahead", daemon=True)
            self._ahead[epoch] = thread
        thread.start()

    def _keep(self, epoch: int, plan: list[list[Sample]] | BaseException) -> None:
        with self._lock:
            self._done[epoch] = plan
            self._done.move_to_end(epoch)
            while len(self._done) > self.KEEP:
                self._done.popitem(last=False)

    def _store(self, epoch: int) -> None:
        try:
            plan: list[list[Sample]] | BaseException = self._draw(epoch)
        except BaseException as err:  # noqa: BLE001 - kept for get(), which draws again and raises there
            plan = err
        self._keep(epoch, plan)


class _ByPath(Mapping):
    """``path -> value`` over a :class:`VideoIndex`, looked up by binary search instead of a 650k-entry dict.

    What the epoch pass reads by path (seek hints, frame counts); ``value_of(row)``
    gives a video's value, ``None`` for none (then the path is absent).
    """

    def __init__(self, index: VideoIndex, value_of: Callable[[int], object]) -> None:
        self._index = index
        self._value_of = value_of
        self._cache: dict[int, object] = {}

    def __getitem__(self, path: str) -> object:
        i = self._index.find(path)
        value = None
        if i >= 0:
            if i not in self._cache:
                if len(self._cache) > 4096:  # a pass's worth of videos; no memory per video of the split
                    self._cache.clear()
                self._cache[i] = self._value_of(i)
            value = self._cache[i]
        if value is None:
            raise KeyError(path)
        return value

    def __iter__(self) -> Iterator[str]:
        return (path for i, path in enumerate(self._index.paths) if self._value_of(i) is not None)

    def __len__(self) -> int:
        return len(self._index)  # an upper bound: truthy whenever there are videos

    def __reduce__(self):
        raise TypeError("a loader's per-path view of its video index stays in the training process; "
                        "send a worker its samples' values instead")


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
        output: mean, std, dtype and layout; default float16 ``CTHW``,
            Kinetics mean/std, ``crop_size`` square.
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

    Rank and world size come from ``torch.distributed`` when it is initialized
    (else ``RANK``/``WORLD_SIZE``, else 0 of 1). Under DDP, global rank 0
    scans and the other ranks wait for its manifest.

    Call :meth:`set_epoch` before each epoch, as with ``DistributedSampler``:
    without it every epoch repeats the same plan. An iteration abandoned in
    the middle of an epoch (``break``) continues at the next unseen batch the
    next time the loader is iterated, exactly as after :meth:`load_state_dict`;
    :meth:`set_epoch` with another epoch starts that epoch from its beginning.

    The fallback's worker processes start with the first pass that needs them
    and serve every later epoch (each pass sends them its samples); they stop
    at :meth:`close` or garbage collection. A pass abandoned with decodes in
    flight stops them too, and the next pass starts new ones (about 0.1-0.3 s).

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
    ) -> None:
        # A spawn/forkserver child re-running an unguarded script must not load (and train) again.
        refuse_bootstrapping_main("A KineticsDALILoader")
        source = Path(source)
        if not source.exists():
            raise FileNotFoundError(f"dataset root or manifest not found: {source}")
        _check_options(batch_size=batch_size, last_batch=last_batch, device=device, seed=seed)
        self.clip = ClipSpec(clip_len=clip_len, frame_stride=frame_stride, target_fps=target_fps)
        self.augment, self.output = _augment_and_output(crop_size, augment, output)
        self.decode = decode if decode is not None else DecodeSpec()
        self.scan = scan if scan is not None else ScanSpec()
        self.split = split
        self.batch_size = batch_size
        self.views = _checked_views(views, split)
        #: clips per batch: ``batch_size`` videos times their views
        self.clips_per_batch = batch_size * (self.views[0] * self.views[1] if self.views else 1)
        self.seed = seed
        self.last_batch: LastBatch = last_batch
        self.label_padding = (split != "train") if label_padding is None else bool(label_padding)
        self._place(device)
        self.dali_enabled = self.decode.decoder == "auto" and _dali_usable()
        self._load_videos(source)
        index = self.index
        self._routes = Routes([index.paths[i] for i in index.where("dali").tolist()] if self.dali_enabled else [])
        hints = _ByPath(index, lambda i: _hint(index[i]))
        self._setup = PassSetup(
            output=self.output, decode=self.decode.fallback_decode(hints),
            workers=self.decode.fallback_workers_options(pin_memory=self.device == "gpu"),
            isolated_workers=self.decode.fallback_workers, device=self.torch_device,
            label_padding=self.label_padding, mask_failed=split != "train",
            dali_timeout_s=self.decode.timeout_s,
            dali_threads=self.decode.dali_threads_for(self.device, self.clips_per_batch),
            views=self.clips_per_batch // batch_size if self.views else 0,
            num_frames=_ByPath(index, lambda i: int(index.num_frames[i]) or None), faults=faults_from_env())
        self.epoch = 0
        self._start_batch = 0
        self._counters = EpochCounters()
        self._budget = FailureBudget(0, max_fraction=self.decode.max_failure_fraction, masked=split != "train")
        self._counters_epoch = 0
        self._dali = None  # DaliClipDecoder, built on first use
        self._fallback = FallbackWorkers(self._setup, self._budget)  # processes started on first use
        self._active: Iterator | None = None  # the live pass over an epoch, if any
        self._plans = _Plans(self._draw_plan)
        self._last_pass_epoch: int | None = None  # the epoch of the previous pass, to foresee the next

    def _place(self, device: DeviceChoice) -> None:
        """Rank, world size and where this rank's tensors live."""
        if device == "auto":
            device = "gpu" if torch.cuda.is_available() else "cpu"
        self.device: Literal["gpu", "cpu"] = device
        self.rank, self.world_size, self.local_rank = dist.rank(), dist.world_size(), dist.local_rank()
        self.device_id = dist.local_cuda_device() if device == "gpu" else None
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

    @property
    def videos(self) -> VideoIndex:
        """This split's decodable videos: ``len(videos)``, ``videos[i]`` (a :class:`~daliload.videoindex.VideoRow`
        with ``path``, ``label``, ``route``, ``num_frames``, ...), in ``video_index`` order."""
        return self.index

    # -- plan ---------------------------------------------------------------------

    def plan(self, epoch: int | None = None) -> list[list[Sample]]:
        """This rank's batches of samples for ``epoch`` (default: the current one).

        The plan a pass over that epoch uses: drawn once and kept (a copy of its
        lists is returned), so looking at it beside the pass costs no second draw.
        """
        batches = self._plans.get(self._plan_key(self.epoch if epoch is None else epoch), forget_others=False)
        return [list(batch) for batch in batches]

    def _plan_key(self, epoch: int) -> int:
        """Every epoch of an evaluation split has the same plan: one key for all."""
        return epoch if self.split == "train" else 0

    def _draw_plan(self, epoch: int) -> list[list[Sample]]:
        columns = self.index.columns
        if self.split == "train":
            samples = make_train_plan(columns, seed=self.seed, epoch=epoch, rank=self.rank,
                                      world_size=self.world_size, clip=self.clip, augment=self.augment)
        else:
            samples = make_val_plan(columns, rank=self.rank, world_size=self.world_size,
                                    clip=self.clip, augment=self.augment, views=self.views)
        return split_batches(samples, self.clips_per_batch, self.last_batch)  # whole videos: views in a row

    def __len__(self) -> int:
        return num_batches(samples_per_rank(len(self.index), self.world_size), self.batch_size, self.last_batch)

    def set_epoch(self, epoch: int) -> None:
        """Use the plan of ``epoch`` from the next iteration on (and start it at its first batch)."""
        if not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be an integer >= 0, got {epoch!r}")
        if epoch != self.epoch:
            self._start_batch = 0
        self.epoch = epoch

    # -- checkpointing --------------------------------------------------------------

    def state_dict(self) -> dict:
        """Where the loader is: the epoch and the next batch to yield, plus what must match on resume.

        ``next_batch == len(self)`` means the epoch is finished; a later pass
        over the same epoch starts it again, and :meth:`set_epoch` with the next
        epoch starts that one. ``videos`` is the fingerprint of the split's
        video list the plans are drawn from (:meth:`VideoIndex.fingerprint`).
        """
        return {"epoch": self.epoch, "next_batch": self._start_batch, "seed": self.seed,
                "world_size": self.world_size, "num_videos": len(self.index), "batch_size": self.batch_size,
                "views": list(self.views) if self.views else None, "videos": dict(self._fingerprint),
                "manifest": str(self.manifest_path)}

    @cached_property
    def _fingerprint(self) -> dict:
        return self.index.fingerprint()

    def load_state_dict(self, state: dict) -> None:
        """Resume at the batch :meth:`state_dict` recorded; the next iteration yields it first.

        Raises:
            ValueError: the state was saved with another seed, world size,
                batch size or views, or from another list of videos (files
                added, removed or renamed, labels or frame counts changed), so
                the plan would differ; the message says what differs.
        """
        mine = self.state_dict()
        if isinstance(state.get("videos"), dict):
            self._check_videos(state["videos"], state.get("manifest"))
        for key in ("seed", "world_size", "num_videos", "batch_size", "views"):
            if key in state and state[key] != mine[key]:
                raise ValueError(f"cannot resume: the state was saved with {key}={state[key]}, this loader "
                                 f"has {key}={mine[key]} (the plan would differ)")
        epoch, next_batch = int(state["epoch"]), int(state["next_batch"])
        if not 0 <= next_batch <= len(self):
            raise ValueError(f"next_batch {next_batch} is outside 0..{len(self)}")
        self.epoch = epoch
        self._start_batch = next_batch

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
            rerouted=tuple(sorted(self._routes.rerouted)), replacements=budget.replacements,
            clips_masked=c.clips_masked,
            clips_past_end=c.clips_past_end, isolation_s=c.isolation_s, dali_disabled=self._routes.dali_disabled,
        )

    # -- iteration ------------------------------------------------------------------------

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        # One live pass at a time: passes share the DALI decoder's queue of batches in flight.
        if self._active is not None:
            self._active.close()
        self._active = self._epoch_pass()
        return self._active

    def _epoch_pass(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        batches = self._plans.get(self._plan_key(self.epoch))
        if self._start_batch >= len(batches):
            self._start_batch = 0  # the epoch was finished: this is a new pass over it
        start = self._start_batch
        plan = [s for b in batches for s in b]
        self._counters = EpochCounters()
        self._counters_epoch = self.epoch
        self._budget.reset(len(plan))
        todo = batches[start:]
        uses_dali = any(self._routes.uses_dali(s) for b in todo for s in b)
        # A pass that follows the previous epoch's (set_epoch(e + 1), as with a DistributedSampler)
        # starts the next one ahead: its first fallback transfers decode while the caller trains
        # on this epoch's last batch. No guess without that evidence: a caller that repeats an
        # epoch, or jumps, would make the workers restart for the guessed epoch's decodes.
        advancing = self._last_pass_epoch is not None and self.epoch == self._last_pass_epoch + 1
        self._last_pass_epoch = self.epoch
        epoch_pass = EpochPass(self._setup, todo, plan, routes=self._routes, budget=self._budget,
                               counters=self._counters, fallback=self._fallback,
                               dali=self._dali_decoder() if uses_dali else None,
                               key=self._pass_key(self.epoch, start),
                               on_last=self._start_next_epoch if advancing and self.split == "train" else None)
        passing = iter(epoch_pass)
        try:
            for i, batch in enumerate(passing):
                # Set before yielding: a state_dict() taken while the caller holds this batch
                # resumes after it. After the last batch it equals len(self): epoch finished.
                self._start_batch = start + i + 1
                self._counters.batches += 1
                yield batch
                if i == 0 and self.split == "train":
                    # After the first batch, which it would delay: the next epoch's plan, as set_epoch
                    # is usually called next (another epoch is drawn when asked for, as before).
                    self._plans.draw_ahead(self.epoch + 1)
        finally:
            passing.close()  # drains DALI's batches in flight; the fallback's workers stay for the next pass
            self._budget.warn(stacklevel=2)

    def _pass_key(self, epoch: int, start: int) -> tuple:
        """What makes two passes' fallback shares the same: the plan, the first batch and the routes."""
        return (self._plan_key(epoch), start, self._routes.version)

    def _start_next_epoch(self) -> None:
        """Send the next epoch's first fallback transfers to the workers now (:meth:`FallbackWorkers.warm`).

        Called before this epoch's last batch is yielded. If the next pass is
        another one (another epoch, a resumed state, changed routes), it drops
        this one: the workers restart (~0.1 s) and the decodes are lost.
        """
        epoch = self.epoch + 1
        try:
            batches = self._plans.get(self._plan_key(epoch), forget_others=False)
            share = FallbackShare.of(batches, self._routes, self._setup.workers.num_workers)
            self._fallback.warm(self._pass_key(epoch, 0), share.samples, share.sizes)
        except Exception as err:  # noqa: BLE001 - a guess must not fail this epoch; that pass will meet it
            self._fallback.discard_ahead()
            logger.warning("could not start epoch %d ahead (%s: %s); it starts when asked for",
                           epoch, type(err).__name__, err)

    def _dali_decoder(self):
        if self._dali is None:
            from daliload.pipeline import DaliClipDecoder

            self._dali = DaliClipDecoder(
                self.output, batch_size=self.clips_per_batch, device=self.device, device_id=self.device_id,
                num_threads=self.decode.dali_threads_for(self.device, self.clips_per_batch),
                prefetch_queue_depth=max(self.decode.prefetch_batches, self.decode.dali_pipelines),
                pipelines=self.decode.dali_pipelines,
            )
        return self._dali

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


def _checked_views(views: object, split: str) -> tuple[int, int] | None:
    """``views`` checked: two integers >= 1, and only on an evaluation split."""
    if views is None:
        return None
    if split == "train":
        raise ValueError(f"views={views!r} is for evaluation splits (e.g. split='val'); split='train' takes "
                         "one random clip per video and epoch")
    return check_views(views)


def _check_options(*, batch_size: object, last_batch: object, device: object, seed: object) -> None:
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    check_last_batch(last_batch)
    if device not in ("auto", "gpu", "cpu"):
        raise ValueError(f"device must be 'auto', 'gpu' or 'cpu', got {device!r}")
    if device == "gpu":
        dist.require_cuda()
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")


def _augment_and_output(crop_size, augment: AugmentSpec | None,
                        output: OutputSpec | None) -> tuple[AugmentSpec, OutputSpec]:
    """The augmentation and output specs, with the crop size given in one place."""
    if augment is None:
        augment = AugmentSpec(crop_size=224 if crop_size is None else crop_size)
    elif crop_size is not None and AugmentSpec(crop_size=crop_size).output_size != augment.output_size:
        raise ValueError(f"crop_size={crop_size} disagrees with augment.crop_size={augment.crop_size}; "
                         "give the size in one place")
    output = output if output is not None else OutputSpec(size=augment.output_size)
    if output.size != augment.output_size:
        raise ValueError(f"output.size {output.size} must equal the crop size {augment.output_size}")
    return augment, output


_warned_no_dali = False


def _dali_usable() -> bool:
    """Whether DALI imports; warns once (per process) with the install command when it does not."""
    global _warned_no_dali
    from daliload.pipeline import INSTALL_HINT, is_dali_available

    if is_dali_available():
        return True
    if not _warned_no_dali:
        _warned_no_dali = True
        warnings.warn(f"NVIDIA DALI is not installed: every clip goes through the PyAV fallback. "
                      f"To decode with DALI: {INSTALL_HINT}", RuntimeWarning, stacklevel=3)
    return False


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
