"""KineticsDALILoader: the epoch plan, decoded by DALI and the fallback, merged in plan order.

Per epoch and rank::

    manifest (pre-screen) --> usable videos (route dali | fallback; bad ones are reported, never planned)
        --> epoch plan (daliload.plan): this rank's ordered samples, equal count on every rank
        --> batches of batch_size (last-batch policy)
              route dali:     DaliClipDecoder, up to prefetch_batches batches in flight
              route fallback: fallback.FallbackLoader in spawn-safe worker processes
        --> merged in plan order into one (videos, labels) batch on cuda:LOCAL_RANK (or the CPU)

A DALI batch that fails at run time (a file corrupted or deleted after the
scan) is decoded again sample by sample through the fallback in this process;
a sample that fails there too is replaced by the next sample of the plan that
decodes, and recorded. Batch size and batch count never change, so DDP ranks
stay in step.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Literal, Sequence

import torch

from daliload import dist
from daliload.plan import (AugmentSpec, ClipSpec, OutputSpec, Sample, make_train_plan, make_val_plan,
                           samples_per_rank)
from daliload.prescreen import Manifest, ManifestEntry, ensure_manifest
from daliload.workerpool import usable_cores
from fallback import (Failure, NoReplacementError, StreamHint, TooManyFailuresError, decode_sample,
                      make_fallback_loader)
from fallback.decode import DecodeError

logger = logging.getLogger(__name__)

LastBatch = Literal["pad", "drop", "partial"]
DeviceChoice = Literal["auto", "gpu", "cpu"]
DecoderChoice = Literal["auto", "fallback"]

#: Label given to padding samples when ``label_padding`` is on (validation default).
PADDING_LABEL = -1

_MANIFEST_SUFFIXES = (".sqlite", ".sqlite3", ".db")


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
        prefetch_batches: DALI batches in flight ahead of the one consumed. Default 2.
        fallback_workers: PyAV decoding processes. Default 2.
        fallback_threads: FFmpeg threads per fallback decode. Default 1.
        timeout_s: per-clip decode limit for the fallback, seconds. Default 60.
        max_failure_fraction: raise once more than this fraction of an epoch's
            samples failed to decode (they are replaced until then). Default 0.05.
    """

    decoder: DecoderChoice = "auto"
    dali_threads: int | None = None
    prefetch_batches: int = 2
    fallback_workers: int = 2
    fallback_threads: int = 1
    timeout_s: float = 60.0
    max_failure_fraction: float = 0.05

    def __post_init__(self) -> None:
        if self.decoder not in ("auto", "fallback"):
            raise ValueError(f"decoder must be 'auto' or 'fallback', got {self.decoder!r}")
        for name in ("dali_threads", "prefetch_batches", "fallback_threads"):
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


@dataclass(frozen=True)
class ScanSpec:
    """How the pre-screen runs when the loader is given a dataset root.

    Attributes:
        manifest_path: where the manifest lives; default
            :func:`daliload.prescreen.default_manifest_path` of the root.
        deep: also decode a window at each end of every file (``daliload scan --deep``).
        workers: probing processes; default one per core.
    """

    manifest_path: str | os.PathLike | None = None
    deep: bool = False
    workers: int | None = None


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
        failures: ``(path, reason)`` of every sample that failed at run time.
        rejected: ``(path, reason)`` of the files the pre-screen marked ``bad``
            (never planned).
        dali_wait_s: seconds spent waiting for DALI batches.
        fallback_wait_s: seconds spent waiting for fallback clips.
        device: ``"gpu"`` or ``"cpu"``: where DALI decodes and tensors live.
        dali_enabled: whether DALI decoded anything this run (False without
            DALI installed, or with ``decoder="fallback"``).
        rerouted: files of route ``dali`` whose DALI batch failed and that
            DALI named or the fallback could not decode either; they go
            through the fallback for the rest of this run.
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


@dataclass
class _Counters:
    batches: int = 0
    clips_dali: int = 0
    clips_fallback: int = 0
    clips_redecoded: int = 0
    replaced: int = 0
    failures: list = dataclasses.field(default_factory=list)
    dali_wait_s: float = 0.0
    fallback_wait_s: float = 0.0


def split_batches(plan: Sequence[Sample], batch_size: int, last_batch: LastBatch) -> list[list[Sample]]:
    """Cut a rank's plan into batches.

    ``"pad"`` fills the last batch with repeats of the plan's first samples
    (marked ``is_padding``, with new positions after the plan's), ``"drop"``
    drops a short last batch, ``"partial"`` keeps it short. Every rank has a
    plan of the same length, so every rank gets the same number of batches
    under every policy.

    Worked example, a plan of 10 samples (positions 0..9), ``batch_size=4``::

        pad:     [0 1 2 3] [4 5 6 7] [8 9 10* 11*]   10*, 11* repeat samples 0 and 1
        drop:    [0 1 2 3] [4 5 6 7]
        partial: [0 1 2 3] [4 5 6 7] [8 9]
    """
    if last_batch not in ("pad", "drop", "partial"):
        raise ValueError(f"last_batch must be 'pad', 'drop' or 'partial', got {last_batch!r}")
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


class KineticsDALILoader:
    """Iterate ``(videos, labels)`` batches of a Kinetics-style split, for one DDP rank.

    Args:
        source: dataset root (scanned on first use; see :class:`ScanSpec`) or
            the path of a manifest written by ``daliload scan``.
        split: ``"train"`` (shuffled, random window, crop and flip) or any
            other split in the manifest (deterministic centre clip and crop).
        batch_size: clips per batch. Default 32.
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

    Rank and world size come from ``torch.distributed`` when it is initialized
    (else ``RANK``/``WORLD_SIZE``, else 0 of 1). Under DDP, global rank 0
    scans and the other ranks wait for its manifest.

    Call :meth:`set_epoch` before each epoch, as with ``DistributedSampler``:
    without it every epoch repeats the same plan. An iteration abandoned in
    the middle of an epoch (``break``) continues at the next unseen batch the
    next time the loader is iterated, exactly as after :meth:`load_state_dict`;
    :meth:`set_epoch` with another epoch starts that epoch from its beginning.

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
    ) -> None:
        source = Path(source)
        if not source.exists():
            raise FileNotFoundError(f"dataset root or manifest not found: {source}")
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        if last_batch not in ("pad", "drop", "partial"):
            raise ValueError(f"last_batch must be 'pad', 'drop' or 'partial', got {last_batch!r}")
        if device not in ("auto", "gpu", "cpu"):
            raise ValueError(f"device must be 'auto', 'gpu' or 'cpu', got {device!r}")
        if not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
        self.clip = ClipSpec(clip_len=clip_len, frame_stride=frame_stride, target_fps=target_fps)
        if augment is None:
            augment = AugmentSpec(crop_size=224 if crop_size is None else crop_size)
        elif crop_size is not None and AugmentSpec(crop_size=crop_size).output_size != augment.output_size:
            raise ValueError(f"crop_size={crop_size} disagrees with augment.crop_size={augment.crop_size}; "
                             "give the size in one place")
        self.augment = augment
        self.output = output if output is not None else OutputSpec(size=self.augment.output_size)
        if self.output.size != self.augment.output_size:
            raise ValueError(f"output.size {self.output.size} must equal the crop size "
                             f"{self.augment.output_size}")
        self.decode = decode if decode is not None else DecodeSpec()
        self.scan = scan if scan is not None else ScanSpec()
        self.split = split
        self.batch_size = batch_size
        self.seed = seed
        self.last_batch: LastBatch = last_batch
        self.label_padding = (split != "train") if label_padding is None else bool(label_padding)

        if device == "auto":
            device = "gpu" if torch.cuda.is_available() else "cpu"
        if device == "gpu" and not torch.cuda.is_available():
            raise ValueError("device='gpu' needs a CUDA GPU visible to torch; use device='cpu' or 'auto'")
        self.device: Literal["gpu", "cpu"] = device
        self.rank, self.world_size, self.local_rank = dist.rank(), dist.world_size(), dist.local_rank()
        # One GPU per process is visible under some launchers (SLURM --gpus-per-task): wrap around.
        self.device_id = self.local_rank % torch.cuda.device_count() if device == "gpu" else None
        self.torch_device = torch.device(f"cuda:{self.device_id}") if device == "gpu" else torch.device("cpu")
        self.dali_enabled = self.decode.decoder == "auto" and _dali_usable()

        if source.is_file() and source.suffix in _MANIFEST_SUFFIXES:
            manifest_path = source
        else:
            manifest_path = ensure_manifest(source, device=device, manifest_path=self.scan.manifest_path,
                                            deep=self.scan.deep, workers=self.scan.workers,
                                            splits=tuple(dict.fromkeys(("train", "val", split))))
        self.manifest_path = Path(manifest_path)
        with Manifest(self.manifest_path) as manifest:
            known_splits = manifest.splits()
            if split not in known_splits:
                raise ValueError(f"split {split!r} is not in the manifest {self.manifest_path}; "
                                 f"it has: {', '.join(known_splits) or 'no split'}")
            entries = manifest.entries(split, device=device)
            self.classes: tuple[str, ...] = manifest.classes()
        self.rejected = tuple(Failure(e.path, e.reason) for e in entries if e.route == "bad")
        self.videos: tuple[ManifestEntry, ...] = tuple(e for e in entries if e.route != "bad")
        if not self.videos:
            raise ValueError(f"split {split!r} of {self.manifest_path} has no decodable video "
                             f"({len(self.rejected)} rejected by the pre-screen)")
        self._use_dali = {e.path: (e.route == "dali" and self.dali_enabled) for e in self.videos}
        self._hints = {e.path: hint for e in self.videos if (hint := _hint(e)) is not None}
        self.epoch = 0
        self._start_batch = 0
        self._counters = _Counters()
        self._counters_epoch = 0
        self._dali = None  # DaliClipDecoder, built on first use
        self._active: Iterator | None = None  # the live pass over an epoch, if any
        self._rerouted: set[str] = set()  # dali-route files sent to the fallback after failing in DALI
        self._flat_plan: list[Sample] = []
        self._fallback_exhausted = False
        if self.rejected and self.rank == 0:
            logger.info("%d file(s) of split %r rejected by the pre-screen", len(self.rejected), split)

    # -- plan ---------------------------------------------------------------------

    def plan(self, epoch: int | None = None) -> list[list[Sample]]:
        """This rank's batches of samples for ``epoch`` (default: the current one)."""
        epoch = self.epoch if epoch is None else epoch
        if self.split == "train":
            samples = make_train_plan(self.videos, seed=self.seed, epoch=epoch, rank=self.rank,
                                      world_size=self.world_size, clip=self.clip, augment=self.augment)
        else:
            samples = make_val_plan(self.videos, rank=self.rank, world_size=self.world_size,
                                    clip=self.clip, augment=self.augment)
        return split_batches(samples, self.batch_size, self.last_batch)

    def __len__(self) -> int:
        per_rank = samples_per_rank(len(self.videos), self.world_size)
        if self.last_batch == "drop":
            return per_rank // self.batch_size
        return math.ceil(per_rank / self.batch_size)

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
        epoch starts that one.
        """
        return {"epoch": self.epoch, "next_batch": self._start_batch, "seed": self.seed,
                "world_size": self.world_size, "num_videos": len(self.videos), "batch_size": self.batch_size}

    def load_state_dict(self, state: dict) -> None:
        """Resume at the batch :meth:`state_dict` recorded; the next iteration yields it first.

        Raises:
            ValueError: the state was saved with another seed, world size,
                batch size or video count, so the plan would differ.
        """
        for key in ("seed", "world_size", "num_videos", "batch_size"):
            if key in state and state[key] != self.state_dict()[key]:
                raise ValueError(f"cannot resume: the state was saved with {key}={state[key]}, this loader "
                                 f"has {key}={self.state_dict()[key]} (the plan would differ)")
        epoch, next_batch = int(state["epoch"]), int(state["next_batch"])
        if not 0 <= next_batch <= len(self):
            raise ValueError(f"next_batch {next_batch} is outside 0..{len(self)}")
        self.epoch = epoch
        self._start_batch = next_batch

    # -- statistics ---------------------------------------------------------------------

    def stats(self) -> LoaderStats:
        """Counters of the current (or last) epoch, and the files the pre-screen rejected."""
        c = self._counters
        return LoaderStats(
            epoch=self._counters_epoch, batches=c.batches, clips_dali=c.clips_dali,
            clips_fallback=c.clips_fallback, clips_redecoded=c.clips_redecoded, replaced=c.replaced,
            failures=tuple(c.failures), rejected=self.rejected, dali_wait_s=c.dali_wait_s,
            fallback_wait_s=c.fallback_wait_s, device=self.device, dali_enabled=self.dali_enabled,
            rerouted=tuple(sorted(self._rerouted)),
        )

    # -- iteration ------------------------------------------------------------------------

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        # One live pass at a time: passes share the DALI decoder's queue of batches in flight.
        if self._active is not None:
            self._active.close()
        self._active = self._epoch_pass()
        return self._active

    def _epoch_pass(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        batches = self.plan()
        if self._start_batch >= len(batches):
            self._start_batch = 0  # the epoch was finished: this is a new pass over it
        start = self._start_batch
        self._counters = _Counters(batches=0)
        self._counters_epoch = self.epoch
        self._flat_plan = [s for b in batches for s in b]
        self._fallback_exhausted = False
        todo = batches[start:]
        dali_parts = [[s for s in b if self._use_dali[s.path]] for b in todo]
        fallback_samples = [s for b in todo for s in b if not self._use_dali[s.path]]
        fallback_iter = self._fallback_iter(fallback_samples)
        decoder = self._dali_decoder() if any(dali_parts) else None
        submitted = 0
        try:
            for i, batch in enumerate(todo):
                if decoder is not None:
                    while submitted < len(todo) and (submitted <= i or decoder.pending < decoder.prefetch_queue_depth):
                        if dali_parts[submitted]:
                            decoder.submit(dali_parts[submitted])
                        submitted += 1
                videos, labels = self._assemble(batch, dali_parts[i], decoder, fallback_iter)
                self._check_failure_limit()
                # Set before yielding: a state_dict() taken while the caller holds this batch
                # resumes after it. After the last batch it equals len(self): epoch finished.
                self._start_batch = start + i + 1
                self._counters.batches += 1
                yield videos, labels
        finally:
            if decoder is not None:
                while decoder.pending:  # drop what was submitted ahead for an abandoned epoch
                    try:
                        decoder.result()
                    except Exception as err:  # noqa: BLE001 - results of a dropped epoch are discarded
                        logger.debug("discarding a pending DALI batch: %s", err)
            close = getattr(fallback_iter, "close", None)
            if close is not None:
                close()
            self._warn_failures()

    def _assemble(self, batch, dali_part, decoder, fallback_iter) -> tuple[torch.Tensor, torch.Tensor]:
        rows: dict[int, tuple[torch.Tensor, int]] = {}
        decoded = None
        if dali_part:
            t0 = time.perf_counter()
            try:
                decoded = decoder.result()
            except _dali_batch_error() as err:
                self._counters.dali_wait_s += time.perf_counter() - t0
                logger.warning("DALI batch failed, decoding its %d clip(s) with the fallback: %s",
                               len(dali_part), err.reason)
                # A file DALI cannot decode (damaged after the scan, or mid-stream where only
                # --deep looks) would fail every batch it joins: once known, it goes to the
                # fallback for the rest of the run, so the whole-batch re-decode is paid once.
                # Known = named by DALI, or failing in the fallback too.
                culprits = {err.culprit.path} if err.culprit is not None else set()
                for sample in dali_part:
                    before = len(self._counters.failures)
                    rows[sample.position] = self._decode_here(sample)
                    self._counters.clips_redecoded += 1
                    if any(f.path == sample.path for f in self._counters.failures[before:]):
                        culprits.add(sample.path)
                for path in culprits:
                    self._use_dali[path] = False
                self._rerouted |= culprits
            else:
                self._counters.dali_wait_s += time.perf_counter() - t0
                if decoded.samples != tuple(dali_part):
                    raise RuntimeError("internal error: DALI returned another batch than the one "
                                       f"expected ({len(decoded.samples)} vs {len(dali_part)} samples)")
                for k, sample in enumerate(decoded.samples):
                    # The label comes from the plan: reading DALI's would sync the GPU per row.
                    rows[sample.position] = (decoded.videos[k], sample.label)
                self._counters.clips_dali += len(decoded.samples)
        for sample in batch:
            if sample.position in rows:
                continue
            t0 = time.perf_counter()
            if self._fallback_exhausted:
                video, label = self._decode_here(sample)
            else:
                try:
                    video, label = next(fallback_iter)
                except NoReplacementError as err:
                    # No fallback-route sample left that decodes: the fallback loader has
                    # stopped, so this and the epoch's remaining fallback-route samples are
                    # decoded here, with replacements searched over the whole plan.
                    logger.warning("%s; decoding the rest in this process", err)
                    self._counters.failures.extend(err.failures)
                    self._fallback_exhausted = True
                    video, label = self._decode_here(sample)
            self._counters.fallback_wait_s += time.perf_counter() - t0
            rows[sample.position] = (video, label)
            self._counters.clips_fallback += 1
        first = rows[batch[0].position][0]
        videos = torch.empty((len(batch), *first.shape), dtype=first.dtype, device=self.torch_device)
        labels = torch.empty(len(batch), dtype=torch.int64)
        for k, sample in enumerate(batch):
            video, label = rows[sample.position]
            videos[k].copy_(video, non_blocking=True)
            labels[k] = PADDING_LABEL if (self.label_padding and sample.is_padding) else label
        if decoded is not None and videos.is_cuda:
            # DALI rows live in DALI's output buffer, which its next run may overwrite from
            # its own stream: wait for the copies before letting go of that buffer.
            torch.cuda.current_stream(videos.device).synchronize()
        return videos, labels.to(self.torch_device, non_blocking=True)

    def _fallback_iter(self, samples: list[Sample]) -> Iterator[tuple[torch.Tensor, int]]:
        if not samples:
            return iter(())
        paths = {s.path for s in samples}
        loader = make_fallback_loader(
            samples, self.output, batch_size=1, num_workers=self.decode.fallback_workers,
            prefetch_factor=4, timeout_s=self.decode.timeout_s,
            # The limit applies to the whole epoch (_check_failure_limit), not to this subset.
            max_failure_fraction=1.0, threads=self.decode.fallback_threads,
            hints={p: h for p, h in self._hints.items() if p in paths}, pin_memory=self.device == "gpu",
        )

        def items() -> Iterator[tuple[torch.Tensor, int]]:
            seen_failures = seen_replaced = 0
            try:
                for videos, labels, _positions in loader:
                    failures, replaced = loader.failures, loader.replacements
                    self._counters.failures.extend(failures[seen_failures:])
                    self._counters.replaced += len(replaced) - seen_replaced
                    seen_failures, seen_replaced = len(failures), len(replaced)
                    for k in range(len(labels)):
                        yield videos[k], int(labels[k])
            finally:
                loader.close()

        return items()

    def _check_failure_limit(self) -> None:
        """Raise once more of this epoch's samples failed than ``max_failure_fraction`` allows (at least 1)."""
        failures = self._counters.failures
        total = len(self._flat_plan)
        limit = max(1.0, self.decode.max_failure_fraction * total)
        # A sample met again as a replacement candidate counts once.
        if len({(f.path, f.position) for f in failures}) > limit:
            raise TooManyFailuresError(failures, total, f"max_failure_fraction="
                                       f"{self.decode.max_failure_fraction} of {total} samples")

    def _decode_here(self, sample: Sample) -> tuple[torch.Tensor, int]:
        """Decode one sample in this process with the fallback; on failure, the next plan sample that decodes."""
        plan = self._flat_plan
        start = next((i for i, s in enumerate(plan) if s.position == sample.position), 0)
        for offset in range(len(plan)):
            candidate = plan[(start + offset) % len(plan)]
            try:
                video = decode_sample(candidate, self.output, threads=self.decode.fallback_threads,
                                      timeout_s=self.decode.timeout_s, hint=self._hints.get(candidate.path))
            except DecodeError as err:
                self._counters.failures.append(Failure(candidate.path, err.reason, candidate.position))
                self._check_failure_limit()
                continue
            if offset:
                self._counters.replaced += 1
            self._counters.clips_fallback += 1
            return video, candidate.label
        raise RuntimeError(f"no sample of this rank's plan decodes; last failure: {self._counters.failures[-1]}")

    def _dali_decoder(self):
        if self._dali is None:
            from daliload.pipeline import DaliClipDecoder

            self._dali = DaliClipDecoder(
                self.output, batch_size=self.batch_size, device=self.device,
                device_id=self.device_id,
                num_threads=self._dali_threads(), prefetch_queue_depth=self.decode.prefetch_batches,
            )
        return self._dali

    def _dali_threads(self) -> int:
        if self.decode.dali_threads is not None:
            return self.decode.dali_threads
        if self.device == "gpu":
            return min(self.batch_size, 16)
        return usable_cores()

    def _warn_failures(self) -> None:
        failures = self._counters.failures
        if failures:
            warnings.warn(
                f"{len(failures)} clip(s) failed to decode in epoch {self._counters_epoch} and were replaced "
                f"by other samples (first: {failures[0].path}: {failures[0].reason}); see loader.stats()",
                RuntimeWarning, stacklevel=3,
            )

    def close(self) -> None:
        """Release the DALI pipeline."""
        if self._dali is not None:
            self._dali.close()
            self._dali = None

    def __repr__(self) -> str:
        return (f"KineticsDALILoader(split={self.split!r}, videos={len(self.videos)}, "
                f"rejected={len(self.rejected)}, batch_size={self.batch_size}, batches={len(self)}, "
                f"rank={self.rank}/{self.world_size}, device={self.device!r}, dali={self.dali_enabled})")


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


def _dali_batch_error():
    from daliload.pipeline import DaliBatchError

    return DaliBatchError


def _hint(entry: ManifestEntry) -> StreamHint | None:
    """A seek hint for the fallback from the manifest (constant-frame-rate files with keyframes only)."""
    if entry.vfr or not entry.keyframes or entry.keyframes[0] != 0 or not entry.fps:
        return None
    try:
        return StreamHint(keyframe_indices=entry.keyframes, fps=entry.fps, num_frames=entry.num_frames or None)
    except ValueError:
        return None
