"""One pass over an epoch for one rank: routes, one scheduler over the clip sources, one replacement loop.

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
"""

from __future__ import annotations

import logging
import time
import warnings
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterator, Literal, NamedTuple, Sequence

import numpy as np
import torch

from daliload.failures import Failure, FailureBudget, NoReplacementError, replacement_order
from daliload.plan import OutputSpec, Sample
from daliload.clips import ClipSource, Decoded

logger = logging.getLogger(__name__)

#: Label given to padding samples when ``label_padding`` is on (validation default),
#: and to failed samples outside training.
PADDING_LABEL = -1
#: DALI batches in a row that fail with no single file to blame before DALI is given up for the run.
DALI_FAILURE_STREAK = 3


class Routes:
    """Where each file goes, for the whole run: DALI, the fallback, or nowhere.

    Starts from the pre-screen's routes. A file that DALI alone fails on (found
    by isolating a failed batch) moves to the fallback from the next batch on;
    after :data:`DALI_FAILURE_STREAK` failed batches in a row with no single
    file to blame (a driver or library problem), DALI is given up for the run.
    A file whose decode killed a worker twice or ran past the time limit is
    not decoded again in this run (:meth:`quarantine`): its samples fail at
    once with that reason, and are replaced.

    Args:
        on_dali: by ``Sample.video_index``, whether the video's route is
            ``dali`` (a boolean array over the split: no Python object per
            video); ``None`` (default): DALI is not used.
    """

    def __init__(self, on_dali: np.ndarray | None = None) -> None:
        self._on_dali = on_dali
        self.rerouted: set[str] = set()
        self.quarantined: dict[str, Failure] = {}  # path -> the failure that put it there
        self.dali_disabled: str | None = None  # why DALI was given up, once it was
        self._streak = 0

    def uses_dali(self, sample: Sample) -> bool:
        return (self.dali_disabled is None and self._on_dali is not None and bool(self._on_dali[sample.video_index])
                and sample.path not in self.rerouted)

    def quarantine(self, failure: Failure) -> None:
        """Decode ``failure``'s file no more in this run, if it crashed or hung a worker."""
        if failure.kind in ("crash", "timeout"):
            self.quarantined.setdefault(failure.path, failure)

    def reroute(self, paths: set[str]) -> None:
        """Send ``paths`` (files of route ``dali``) to the fallback from now on."""
        self.rerouted |= paths

    def note_batch(self, *, blamed: bool, reason: str = "") -> None:
        """Count a failed DALI batch: ``blamed`` when isolation found the files at fault."""
        self._streak = 0 if blamed else self._streak + 1
        if self._streak >= DALI_FAILURE_STREAK and self.dali_disabled is None:
            self.dali_disabled = (f"{self._streak} DALI batches in a row failed with no single file to blame "
                                  f"(last: {reason})")
            warnings.warn(f"{self.dali_disabled}; the rest of this run decodes every file with the PyAV "
                          "fallback (loader.stats().dali_disabled)", RuntimeWarning, stacklevel=2)


@dataclass
class EpochCounters:
    """What one pass did; :class:`~daliload.LoaderStats` reports them with the budget's failures."""

    batches: int = 0
    clips_dali: int = 0
    clips_fallback: int = 0
    clips_redecoded: int = 0
    clips_masked: int = 0
    clips_past_end: int = 0
    frames_decoded_fallback: int = 0
    frames_decoded_dali: int = 0
    clips_dali_cut: int = 0
    dali_wait_s: float = 0.0
    fallback_wait_s: float = 0.0
    isolation_s: float = 0.0


@dataclass(frozen=True)
class PassSetup:
    """What a pass needs from its loader, fixed for the run.

    Attributes:
        output: what every clip is turned into (for the merge's shapes).
        device: where batches are assembled (``cuda:N`` or the CPU).
        label_padding: give padding samples :data:`PADDING_LABEL`.
        mask_failed: give failed (replaced) samples :data:`PADDING_LABEL`
            (evaluation splits).
        prefetch: batches submitted ahead of the one being collected.
        num_frames: ``path -> frames`` of a video (for counting clips that run
            past its end; ``None`` when unknown).
        views: clips per video of a multi-view plan (its views follow one
            another in each batch); the merge then gives ``(B, V, ...)``
            videos and one label per video. 0: single-view batches.
    """

    output: OutputSpec
    device: torch.device
    label_padding: bool
    mask_failed: bool
    prefetch: int
    num_frames: Callable[[str], int | None]
    views: int = 0


class BatchInfo(NamedTuple):
    """What each row of a batch is, from the plan (``KineticsDALILoader(..., with_info=True)``).

    All tensors are on the CPU, one entry per row of the batch (per video of
    a multi-view batch). A NamedTuple, so Lightning and ``torch.utils.data``'s
    collate helpers move and split it like the batch itself.

    Attributes:
        video_index: ``(B,)`` int64: the video whose clip fills the row, an
            index into ``loader.videos`` (``loader.videos[i].path``, ``.label``);
            a replaced row (see ``replaced``) holds its replacement's video.
        clip: ``(B,)`` int64: which of its video's clips the row is
            (``clips_per_video`` or a view of a single-view evaluation plan;
            0 with one clip a video); ``(B, V)`` for a multi-view batch, whose
            row holds views ``0 .. V-1``.
        is_padding: ``(B,)`` bool: a repeat that only keeps ranks (and the
            last batch) full; not a new sample of the epoch.
        replaced: ``(B,)`` bool: the planned sample failed to decode and
            another clip of the plan fills its slot (training), or its row is
            masked (evaluation splits).
        mask: ``(B,)`` bool: the rows to score or train on, ``labels !=
            -1``: false for padding with ``label_padding`` and for failed
            samples outside training. ``loss = F.cross_entropy(logits[mask],
            labels[mask])``, or ``CrossEntropyLoss(ignore_index=-1)``.
    """

    video_index: torch.Tensor
    clip: torch.Tensor
    is_padding: torch.Tensor
    replaced: torch.Tensor
    mask: torch.Tensor


class _Part(NamedTuple):
    """Rows of a batch that one :class:`Decoded` holds: batch row ``rows[j]`` is ``decoded.videos[src[j]]``."""

    rows: list[int]
    src: list[int]
    decoded: Decoded


class EpochPass:
    """Iterate ``(videos, labels)`` over ``batches``, one per batch, in plan order.

    Args:
        setup: the loader's fixed settings.
        batches: the batches of this pass (an epoch's, or the rest of one).
        plan: every sample of the epoch, in order (replacements are searched there).
        routes: the run's routes (updated when a file fails in DALI).
        budget: the epoch's failure budget.
        counters: where this pass counts what it did.
        fallback: the PyAV source (it also decodes replacements and DALI's culprits).
        dali: the DALI source, when any sample may go to DALI; else ``None``.
    """

    def __init__(self, setup: PassSetup, batches: Sequence[Sequence[Sample]], plan: Sequence[Sample], *,
                 routes: Routes, budget: FailureBudget, counters: EpochCounters, fallback: ClipSource,
                 dali: ClipSource | None = None) -> None:
        self.setup = setup
        self.batches = [list(b) for b in batches]
        self.plan = list(plan)
        self.routes, self.budget, self.counters = routes, budget, counters
        self.fallback, self.dali = fallback, dali
        # Per batch submitted ahead: each share's (source, ticket, rows), and rows known to fail already.
        self._submitted: deque[tuple[list[tuple[ClipSource, int, list[int]]], dict[int, Failure]]] = deque()
        self._held = HeldOutputs()

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, BatchInfo]]:
        try:
            for i, batch in enumerate(self.batches):
                self._submit_ahead(i)
                parts, replaced = self._collect(batch, *self._submitted.popleft())
                self._count_past_end(batch)
                host = HostTransfer() if self.setup.device.type != "cpu" else None  # cuda (tests: meta)
                try:
                    videos, labels, info = _merge(batch, parts, replaced, self.setup, self.counters, host)
                finally:
                    if host is not None:  # what the batch's copies read lives until they have run
                        self._held.hold([p.decoded for p in parts], torch.cuda.current_stream(self.setup.device),
                                        on_release=host.release)
                yield videos, labels, info
        finally:
            # Nothing waits here: an abandoned pass (an exception in the caller's loop, Ctrl-C, break,
            # the end of a script) drops what it submitted ahead.
            for source in (self.dali, self.fallback):
                if source is not None:
                    source.cancel()
            self._held.release_all()

    # -- the scheduler ------------------------------------------------------------------------

    def _submit_ahead(self, i: int) -> None:
        """Submit batches up to ``prefetch`` ahead of batch ``i``, each share to its source."""
        while len(self._submitted) < min(len(self.batches) - i, self.setup.prefetch):
            batch = self.batches[i + len(self._submitted)]
            # Decided now, not when the pass began: a file moved off DALI leaves from the next batch on,
            # and a file that failed is not decoded again.
            known = {k: failure for k, s in enumerate(batch) if (failure := self._known_failure(s)) is not None}
            on_dali = [self.dali is not None and self.routes.uses_dali(s) for s in batch]
            shares = []
            for source, rows in ((self.dali, [k for k, d in enumerate(on_dali) if d and k not in known]),
                                 (self.fallback, [k for k, d in enumerate(on_dali) if not d and k not in known])):
                if rows:
                    shares.append((source, source.submit([batch[k] for k in rows]), rows))
            self._submitted.append((shares, known))

    def _known_failure(self, sample: Sample) -> Failure | None:
        """How ``sample`` fails without decoding it: its file failed this epoch, or was quarantined."""
        failure = self.routes.quarantined.get(sample.path) or self.budget.failure_of(sample.path)
        if failure is None:
            return None
        return Failure(sample.path, failure.reason, sample.position, failure.kind)

    def _collect(self, batch: list[Sample], shares, known: dict[int, Failure]) -> tuple[list[_Part], dict[int, Sample]]:
        """The batch's rows as parts; failed rows re-decoded or replaced (``row -> the sample that fills it``)."""
        parts: list[_Part] = []
        failed: list[tuple[int, Sample]] = []
        redo: list[int] = []
        c = self.counters
        for row, failure in known.items():
            self.budget.record(failure)
            failed.append((row, batch[row]))
        for source, ticket, rows in shares:
            on_dali = source is self.dali
            started, isolating = time.perf_counter(), getattr(source, "isolation_s", 0.0)
            cut = getattr(source, "clips_cut", 0)
            decoded = source.collect(ticket)
            waited = time.perf_counter() - started
            if on_dali:
                isolated = source.isolation_s - isolating  # finding the files that broke a batch
                c.isolation_s += isolated
                c.dali_wait_s += waited - isolated
                c.clips_dali_cut += source.clips_cut - cut
            else:
                c.fallback_wait_s += waited
            parts.append(self._part(decoded, rows, on_dali=on_dali))
            for j, failure in decoded.failures.items():
                if failure.kind in ("dali", "dali_batch"):
                    redo.append(rows[j])
                else:
                    self._fail(failure)
                    failed.append((rows[j], batch[rows[j]]))
            self._note_dali_failures(decoded)
        if redo:  # DALI's culprits and the batch-mates it could not tell apart: the fallback decodes them now
            c.clips_redecoded += len(redo)
            decoded = self.fallback.collect(self.fallback.submit([batch[k] for k in redo], urgent=True))
            parts.append(self._part(decoded, redo, on_dali=False))
            for j, failure in decoded.failures.items():
                self._fail(failure)
                failed.append((redo[j], batch[redo[j]]))
        replaced = {}
        for row, sample in failed:
            part, replaced[row] = self._replacement(row, sample)
            parts.append(part)
        return parts, replaced

    def _part(self, decoded: Decoded, rows: list[int], *, on_dali: bool) -> _Part:
        """The rows of ``rows`` that ``decoded`` holds a clip for, counted to the source that decoded them."""
        ok = [j for j in range(len(rows)) if j not in decoded.failures]
        if on_dali:
            self.counters.clips_dali += len(ok)
            self.counters.frames_decoded_dali += decoded.frames_decoded or 0
        else:
            self.counters.clips_fallback += len(ok)
            self.counters.frames_decoded_fallback += decoded.frames_decoded or 0
        return _Part([rows[j] for j in ok], ok, decoded)

    def _fail(self, failure: Failure) -> None:
        """A sample failed: the budget counts it (and may end the epoch); a worker-killing file is quarantined."""
        self.routes.quarantine(failure)
        self.budget.record(failure)

    def _note_dali_failures(self, decoded: Decoded) -> None:
        kinds = {f.kind for f in decoded.failures.values()}
        if "dali" in kinds:
            self.routes.reroute({f.path for f in decoded.failures.values() if f.kind == "dali"})
            self.routes.note_batch(blamed=True)
        elif "dali_batch" in kinds:
            reason = next(f.reason for f in decoded.failures.values() if f.kind == "dali_batch")
            self.routes.note_batch(blamed=False, reason=reason)

    def _replacement(self, row: int, sample: Sample) -> tuple[_Part, Sample]:
        """The replacement rule: the next sample of the plan after ``sample`` that decodes fills its slot."""
        for index in replacement_order(len(self.plan), self._plan_index(sample)):
            candidate = self.plan[index]
            if candidate.position == sample.position or self._known_failure(candidate) is not None:
                continue  # a file that failed is not decoded again
            decoded = self.fallback.collect(self.fallback.submit([candidate], urgent=True))
            part = self._part(decoded, [row], on_dali=False)
            if decoded.failures:
                self._fail(decoded.failures[0])
                continue
            self.budget.record_replacement(sample.position, candidate.position)
            return part, candidate
        raise NoReplacementError(sample.position, self.budget.failures)

    def _plan_index(self, sample: Sample) -> int:
        """Where ``sample`` is in the plan: its position (plans number their samples in order; padding after)."""
        position = sample.position
        if 0 <= position < len(self.plan) and self.plan[position].position == position:
            return position
        return next((i for i, s in enumerate(self.plan) if s.position == position), 0)

    def _count_past_end(self, batch: Sequence[Sample]) -> None:
        for s in batch:
            frames = self.setup.num_frames(s.path)
            if frames is not None and s.last_frame >= frames:
                self.counters.clips_past_end += 1


class HeldOutputs:
    """What a batch's GPU copies read, kept alive until they have run: no host-side wait.

    A batch on the GPU is always torch's own memory, copied on torch's
    current stream, asynchronously: from DALI's output (DLPack views; a batch
    with short clips was copied once inside the decoder already) and from the
    fallback's shared memory. Handing out DALI's output itself would let DALI
    reuse it too early: when the user's last reference goes, DALI frees it in
    order on its own stream, not after the work the training step queued on
    the consumer stream (``docs/architecture.md``, "Output buffers"); torch's
    allocator tracks the consumer stream. The sources of the copies must not
    be freed, reused or unmapped before the copies have run. Holding them
    keeps DALI's reference-counted buffers and the fallback's mappings alive,
    and an event recorded on the stream after the batch's copies says when
    they may go; ``on_release`` runs first (it undoes the host memory's
    registration, :class:`HostTransfer`, which must happen before its mapping
    goes). They are let go once their event has completed, checked with
    ``query()`` at each new batch, so the CPU never waits for the GPU here.
    Only the end of a pass waits (``release_all``) for at most the last few
    batches.

    Args:
        new_event: makes an event (default ``torch.cuda.Event``); for tests.
    """

    def __init__(self, new_event=None) -> None:
        self._new_event = new_event or torch.cuda.Event
        self._held: deque = deque()

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, outputs: object, stream, on_release: Callable[[], None] | None = None) -> None:
        event = self._new_event()
        event.record(stream)
        self._held.append((event, outputs, on_release))
        self.prune()

    def prune(self) -> None:
        """Let go of the outputs whose copies have run (never waits)."""
        while self._held and self._held[0][0].query():
            self._let_go(self._held.popleft())

    def release_all(self) -> None:
        """Wait for every held output's copies, then let go of all (end of a pass)."""
        while self._held:
            entry = self._held.popleft()
            entry[0].synchronize()
            self._let_go(entry)

    @staticmethod
    def _let_go(entry: tuple) -> None:
        _, outputs, on_release = entry
        if on_release is not None:
            on_release()  # before the outputs (and the mappings they hold) go: the caller drops them after


#: How a batch's fallback clips reach the GPU (:class:`HostTransfer`): ``"register"`` page-locks the
#: shared-memory mapping the workers wrote for the copy, ``"staging"`` copies through torch's pinned
#: staging buffers, ``"pageable"`` leaves the copy to the driver (synchronous: a staging copy inside
#: the driver). Which one costs the training loop least is measured on a GPU visit
#: (``benchmarks/gpu/merge_time.py``); not yet run.
HostTransferMode = Literal["register", "staging", "pageable"]
HOST_TRANSFER: HostTransferMode = "register"


class HostTransfer:
    """Host memory a batch's copies to the GPU read, page-locked for as long as the copies run.

    A fallback clip lives in a shared-memory mapping (:func:`fallback.source.shared_buffer`)
    that is not page-locked. From such memory a ``non_blocking`` copy is not
    asynchronous: the driver copies it through a staging buffer of its own
    and returns when that is done, so the training loop waits for the whole
    transfer. Registered with ``cudaHostRegister`` (``mode="register"``), the
    mapping is pinned memory and the copy is a DMA queued on the stream.

    The registration must be undone (``cudaHostUnregister``) after the copies
    have run and before the mapping is unmapped: the mapping goes when the
    last tensor over it does, and the epoch pass keeps the batch's
    :class:`~daliload.clips.Decoded` parts (which hold those tensors) in
    :class:`HeldOutputs` until an event after the copies has completed, then
    calls :meth:`release` before letting them go. A registration that fails
    (memory the driver will not pin) leaves that copy pageable, logged once.

    Args:
        mode: see :data:`HOST_TRANSFER` (the default).
        cudart: the CUDA runtime (default ``torch.cuda.cudart()``); a test double.
    """

    _warned = False

    def __init__(self, mode: HostTransferMode | None = None, cudart=None) -> None:
        self.mode: HostTransferMode = mode or HOST_TRANSFER
        if self.mode not in ("register", "staging", "pageable"):
            raise ValueError(f"mode must be 'register', 'staging' or 'pageable', got {self.mode!r}")
        self._cudart = cudart
        self.registered: dict[int, int] = {}  # storage address -> bytes, until release()

    def source(self, tensor: torch.Tensor) -> torch.Tensor:
        """What to copy ``tensor`` (on the CPU) to the GPU from: ``tensor`` itself, registered, or a pinned copy."""
        if self.mode == "pageable" or tensor.is_pinned():
            return tensor
        if self.mode == "staging":  # torch's pinned allocator keeps it until the copy that reads it has run
            return torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True).copy_(tensor)
        storage = tensor.untyped_storage()
        address, size = storage.data_ptr(), storage.nbytes()
        if address in self.registered or not size:
            return tensor
        cudart = self._cudart if self._cudart is not None else torch.cuda.cudart()
        code = int(getattr(error := cudart.cudaHostRegister(address, size, 0), "value", error))
        if code != 0:
            _clear_cuda_error()
            if not HostTransfer._warned:
                HostTransfer._warned = True
                logger.info("cudaHostRegister of %d bytes of fallback clips failed (CUDA error %d); their copies "
                            "to the GPU stay pageable", size, code)
            return tensor
        self.registered[address] = size
        return tensor

    def release(self) -> None:
        """Undo the registrations (the copies have run; the mappings are still there)."""
        if not self.registered:
            return
        cudart = self._cudart if self._cudart is not None else torch.cuda.cudart()
        while self.registered:
            address, _ = self.registered.popitem()
            if int(getattr(error := cudart.cudaHostUnregister(address), "value", error)) != 0:
                _clear_cuda_error()


def _clear_cuda_error() -> None:
    """Reset the CUDA runtime's last error after a call whose failure was handled here.

    Torch checks ``cudaGetLastError`` after its kernel launches: left there, the
    error of a refused registration would be raised by an unrelated kernel.
    Torch's runtime module has no ``cudaGetLastError``; the runtime library it
    loaded has (found by its name, already loaded: the same instance).
    """
    import ctypes

    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            ctypes.CDLL(name).cudaGetLastError()
            return
        except (OSError, AttributeError):
            continue
    logger.info("no CUDA runtime library found to clear a handled error with; torch may report it later")


def _merge(batch: Sequence[Sample], parts: Sequence[_Part], replaced: dict[int, Sample], setup: PassSetup,
           counters: EpochCounters, host: HostTransfer | None = None) -> tuple[torch.Tensor, torch.Tensor, BatchInfo]:
    """Put the parts of ``batch`` in plan order into ``(videos, labels, info)``, the batch on the loader's device.

    One tensor copy per run of consecutive rows of a part (none on the CPU
    when one part is the whole batch, in order; one on the GPU); copies are
    asynchronous on torch's current stream, CPU clips read from what ``host``
    makes of them (the caller keeps what they read alive until they ran:
    :class:`HeldOutputs`). Labels come from the plan (a replaced slot has its
    replacement's, or :data:`PADDING_LABEL` outside training), on the CPU,
    and go to the device with one non-blocking copy.
    """
    n = len(batch)
    if sum(len(part.rows) for part in parts) != n:
        raise RuntimeError(f"internal error: {sum(len(p.rows) for p in parts)} rows decoded for a batch of {n}")
    labels = []
    for k, sample in enumerate(batch):
        masked = (setup.label_padding and sample.is_padding) or (setup.mask_failed and k in replaced)
        counters.clips_masked += setup.mask_failed and k in replaced
        labels.append(PADDING_LABEL if masked else replaced.get(k, sample).label)
    videos = _stack(parts, n, setup.device, host)
    info = _info(batch, replaced, labels)
    if setup.views:
        videos, labels, info = _per_video(videos, labels, info, setup.views)
    on_cpu = torch.tensor(labels, dtype=torch.int64)
    if setup.device.type == "cuda":
        on_cpu = on_cpu.pin_memory()  # so the copy to the device is truly asynchronous
    return videos, on_cpu.to(setup.device, non_blocking=True), info


def _info(batch: Sequence[Sample], replaced: dict[int, Sample], labels: list[int]) -> BatchInfo:
    """Each row's video, clip, padding and replacement, from the samples that fill the rows."""
    filled = [replaced.get(k, sample) for k, sample in enumerate(batch)]
    return BatchInfo(
        video_index=torch.tensor([s.video_index for s in filled], dtype=torch.int64),
        clip=torch.tensor([s.view for s in filled], dtype=torch.int64),
        is_padding=torch.tensor([s.is_padding for s in batch], dtype=torch.bool),
        replaced=torch.tensor([k in replaced for k in range(len(batch))], dtype=torch.bool),
        mask=torch.tensor([label != PADDING_LABEL for label in labels], dtype=torch.bool))


def _per_video(videos: torch.Tensor, labels: list[int], info: BatchInfo,
               views: int) -> tuple[torch.Tensor, list[int], BatchInfo]:
    """A multi-view batch as ``(B, V, ...)`` and one label per video: -1 when any of its views is masked."""
    grouped = [labels[k:k + views] for k in range(0, len(labels), views)]
    per_video = [PADDING_LABEL if PADDING_LABEL in group else group[0] for group in grouped]
    b = len(per_video)
    # A video's views fail as one (its row is masked), so its first view's video stands for the row.
    info = BatchInfo(video_index=info.video_index.view(b, views)[:, 0].clone(), clip=info.clip.view(b, views),
                     is_padding=info.is_padding.view(b, views)[:, 0].clone(),
                     replaced=info.replaced.view(b, views).any(dim=1),
                     mask=torch.tensor([label != PADDING_LABEL for label in per_video], dtype=torch.bool))
    return videos.view(b, views, *videos.shape[1:]), per_video, info


def _stack(parts: Sequence[_Part], n: int, device: torch.device, host: HostTransfer | None = None) -> torch.Tensor:
    """The batch's videos: on the CPU one part's own tensor when it is the whole batch, else copies into a new one.

    On the GPU always a tensor of torch's own memory, copied on the current
    stream: DALI's output is never handed out itself (:class:`HeldOutputs`
    says why), and CPU clips are copied from what ``host`` makes of them
    (page-locked: :class:`HostTransfer`).
    """
    whole = [p for p in parts if p.rows]
    first = whole[0].decoded.videos
    if len(whole) == 1 and whole[0].rows == whole[0].src == list(range(n)) and len(first) == n:
        if first.device.type != "cpu":
            return first.to(device, copy=True, non_blocking=True)
        return first.to(device, non_blocking=True) if host is None else host.source(first).to(device, non_blocking=True)
    videos = torch.empty((n, *first.shape[1:]), dtype=first.dtype, device=device)
    for part in whole:
        clips = part.decoded.videos
        if host is not None and clips.device.type == "cpu":
            clips = host.source(clips)
        for row, src, length in _runs(part.rows, part.src):
            videos[row:row + length].copy_(clips[src:src + length], non_blocking=True)
    return videos


def _runs(rows: Sequence[int], src: Sequence[int]) -> Iterator[tuple[int, int, int]]:
    """``(first row, first source index, length)`` of each run where both go up by one together.

    Example: ``list(_runs([0, 1, 3], [0, 1, 2])) == [(0, 0, 2), (3, 2, 1)]``.
    """
    start = 0
    for j in range(1, len(rows) + 1):
        if j == len(rows) or rows[j] != rows[j - 1] + 1 or src[j] != src[j - 1] + 1:
            yield rows[start], src[start], j - start
            start = j
