"""The merge: one batch's rows, from the parts its sources decoded, into ``(videos, labels, info)`` in plan order.

On the CPU no copy when one part is the whole batch (an all-DALI or
all-fallback batch), else one copy per run of consecutive rows. On the GPU
the batch is always torch's own memory, copied on the consumer's stream:
DALI's output is never handed out itself, and what the copies read is kept
alive until they have run (:class:`HeldOutputs`); the fallback's shared
memory is page-locked for its copy (:class:`HostTransfer`). A group of uint8
pixels (``Decoded.normalized`` false: the fallback on a GPU host) is copied as
uint8 and normalised on the batch's device
(:func:`fallback.transform.normalize_pixels`). Labels come from the plan,
never from a decoder, and so does each row's :class:`BatchInfo`.
"""

from __future__ import annotations

import logging
import math
import os
import weakref
from collections import deque
from typing import Callable, Iterator, Literal, NamedTuple, Sequence

import torch

from daliload.clips import Decoded
from daliload.epoch._setup import PADDING_LABEL, EpochCounters, PassSetup
from daliload.plan import OutputSpec, Sample
from fallback.transform import normalize_pixels, output_dtype

logger = logging.getLogger(__name__)


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



class Part(NamedTuple):
    """Rows of a batch that one :class:`Decoded` holds: batch row ``rows[j]`` is ``decoded.videos[src[j]]``."""

    rows: list[int]
    src: list[int]
    decoded: Decoded


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

    The loader's fallback buffers come from :class:`RegisteredBuffers`, a ring
    registered once and reused (``pinned``: their addresses): nothing to do for
    those. Any other mapping is registered for its batch here, and the
    registration undone (``cudaHostUnregister``) after the copies have run and
    before the mapping is unmapped: the mapping goes when the last tensor over
    it does, and the epoch pass keeps the batch's
    :class:`~daliload.clips.Decoded` parts (which hold those tensors) in
    :class:`HeldOutputs` until an event after the copies has completed, then
    calls :meth:`release` before letting them go. A registration that fails
    (memory the driver will not pin) leaves that copy pageable, with one
    warning per process.

    Args:
        mode: see :data:`HOST_TRANSFER` (the default).
        cudart: the CUDA runtime (default ``torch.cuda.cudart()``); a test double.
        device: the batches' device: registrations are made in its context
            (not the current device's, which under torchrun without
            ``torch.cuda.set_device`` is GPU 0 on every rank), and portable.
        pinned: addresses already registered for as long as they live (the ring's).
    """

    def __init__(self, mode: HostTransferMode | None = None, cudart=None, *, device: torch.device | None = None,
                 pinned: "dict[int, int] | None" = None) -> None:
        self.mode: HostTransferMode = mode or HOST_TRANSFER
        if self.mode not in ("register", "staging", "pageable"):
            raise ValueError(f"mode must be 'register', 'staging' or 'pageable', got {self.mode!r}")
        self._cudart = cudart
        self._device = device
        self._pinned = pinned if pinned is not None else {}
        self.registered: dict[int, int] = {}  # storage address -> bytes, until release()

    def source(self, tensor: torch.Tensor) -> torch.Tensor:
        """What to copy ``tensor`` (on the CPU) to the GPU from: ``tensor`` itself, registered, or a pinned copy."""
        if self.mode == "pageable" or tensor.is_pinned():
            return tensor
        if self.mode == "staging":  # torch's pinned allocator keeps it until the copy that reads it has run
            return torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True).copy_(tensor)
        storage = tensor.untyped_storage()
        address, size = storage.data_ptr(), storage.nbytes()
        if address in self.registered or address in self._pinned or not size:
            return tensor
        if register_host(address, size, self._device, self._cudart):
            self.registered[address] = size
        return tensor

    def release(self) -> None:
        """Undo this batch's registrations (the copies have run; the mappings are still there)."""
        while self.registered:
            address, _ = self.registered.popitem()
            unregister_host(address, self._device, self._cudart)


#: ``cudaHostRegisterPortable``: the pinned memory counts as such in every CUDA context, not only the
#: one current when it was registered.
_HOST_REGISTER_PORTABLE = 1
_refusal_warned = False


def _in_context(device: torch.device | None):
    import contextlib

    return torch.cuda.device(device) if device is not None and device.type == "cuda" else contextlib.nullcontext()


def register_host(address: int, size: int, device: torch.device | None, cudart=None) -> bool:
    """Page-lock ``size`` bytes at ``address`` for copies to ``device`` (portable); False if the driver refuses.

    A refusal leaves the copies from that memory pageable (they still work,
    holding the training loop up while they run): one warning per process.
    """
    global _refusal_warned
    with _in_context(device):
        runtime = cudart if cudart is not None else torch.cuda.cudart()
        code = int(getattr(error := runtime.cudaHostRegister(address, size, _HOST_REGISTER_PORTABLE), "value", error))
    if code == 0:
        return True
    clear_cuda_error()
    if not _refusal_warned:
        _refusal_warned = True
        logger.warning("cudaHostRegister of %d bytes of fallback clips failed (CUDA error %d); their copies to the "
                       "GPU stay pageable, which holds the training loop up while they run", size, code)
    return False


def unregister_host(address: int, device: torch.device | None, cudart=None) -> None:
    """Undo :func:`register_host` (before the memory is unmapped)."""
    with _in_context(device):
        runtime = cudart if cudart is not None else torch.cuda.cudart()
        if int(getattr(error := runtime.cudaHostUnregister(address), "value", error)) != 0:
            clear_cuda_error()


class RegisteredBuffers:
    """The fallback's shared-memory buffers on a GPU host: page-locked once, reused batch after batch.

    Registering a fresh mapping for every batch costs the driver a walk over
    its pages each time (and unregistering another); a small ring of buffers
    registered once costs that once per buffer. The fallback source takes its
    groups' buffers here (:class:`fallback.source.BufferSource`); the epoch
    pass gives a batch's buffers back (``Decoded.recycle``) once the event after
    its copies has completed, so a buffer is written again only after the GPU
    has read it. A buffer holds the largest group asked for so far, so a
    smaller group fits any; up to ``keep`` wait for reuse, the rest are freed
    when they come back. A buffer is freed by undoing its registration, then
    closing its descriptor and dropping the mapping (in that order: the driver
    must not keep pages pinned that are gone). A lease that is dropped unused
    (a pass broken off between collecting a group and merging it) frees its
    buffer the same way, when it goes.

    Args:
        device: the batches' CUDA device (registrations are made under it).
        keep: buffers kept for reuse (the pass's batches ahead plus those
            held for their copies is what is in use at once).
        cudart: a test double of the CUDA runtime.
    """

    def __init__(self, device: torch.device | None, *, keep: int, cudart=None) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep!r}")
        self._device, self._keep, self._cudart = device, keep, cudart
        self.pinned: dict[int, int] = {}  # address -> bytes of each registered buffer, for HostTransfer
        self._free: list[tuple[torch.Tensor, int]] = []  # (the whole buffer, 1-d; its descriptor)
        self._bytes = 0  # the largest group asked for so far
        self._closed = False
        self.made = 0  # buffers made (and registered) so far: what reuse saves

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, int, "_Lease"]:
        """A tensor of ``shape`` in a registered shared buffer, its descriptor and its :class:`_Lease`."""
        from fallback.source import shared_buffer

        count = math.prod(shape)
        need = count * dtype.itemsize
        fits = [i for i, (flat, _) in enumerate(self._free) if flat.dtype == dtype and flat.numel() >= count]
        if fits:
            flat, fd = self._free.pop(min(fits, key=lambda i: self._free[i][0].numel()))
        else:
            self._bytes = max(self._bytes, need)
            flat, fd = shared_buffer((self._bytes // dtype.itemsize,), dtype)
            self.made += 1
            address = flat.untyped_storage().data_ptr()
            if register_host(address, flat.untyped_storage().nbytes(), self._device, self._cudart):
                self.pinned[address] = flat.untyped_storage().nbytes()
        return flat[:count].view(shape), fd, _Lease(self, flat, fd)

    def close(self) -> None:
        """Free the buffers waiting for reuse; those still lent are freed when they come back."""
        self._closed = True
        while self._free:
            self._drop(*self._free.pop())

    def _give_back(self, flat: torch.Tensor, fd: int) -> None:
        if self._closed or len(self._free) >= self._keep:
            self._drop(flat, fd)
        else:
            self._free.append((flat, fd))

    def _drop(self, flat: torch.Tensor, fd: int) -> None:
        address = flat.untyped_storage().data_ptr()
        if self.pinned.pop(address, None) is not None:
            unregister_host(address, self._device, self._cudart)
        os.close(fd)  # the mapping goes with the last tensor over it, after its registration


class _Lease:
    """One buffer of :class:`RegisteredBuffers`, lent: called, it goes back for reuse; discarded, it is freed."""

    def __init__(self, ring: RegisteredBuffers, flat: torch.Tensor, fd: int) -> None:
        self._finalizer = weakref.finalize(self, ring._drop, flat, fd)
        self._finalizer.atexit = False  # at exit the process's memory goes anyway
        self._ring, self._flat, self._fd = ring, flat, fd

    def __call__(self) -> None:
        if self._finalizer.detach() is not None:
            self._ring._give_back(self._flat, self._fd)

    def discard(self) -> None:
        self._finalizer()


def clear_cuda_error() -> None:
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


def merge(batch: Sequence[Sample], parts: Sequence[Part], replaced: dict[int, Sample], setup: PassSetup,
           counters: EpochCounters, host: HostTransfer | None = None) -> tuple[torch.Tensor, torch.Tensor, BatchInfo]:
    """Put the parts of ``batch`` in plan order into ``(videos, labels, info)``, the batch on the loader's device.

    One tensor copy per run of consecutive rows of a part (none on the CPU
    when one part is the whole batch, in order; one on the GPU); copies are
    asynchronous on torch's current stream, CPU clips read from what ``host``
    makes of them (the caller keeps what they read alive until they ran:
    :class:`HeldOutputs`). Labels come from the plan (a replaced slot has its
    replacement's, or ``setup.padding_label`` outside training), on the CPU,
    and go to the device with one non-blocking copy.
    """
    n = len(batch)
    if sum(len(part.rows) for part in parts) != n:
        raise RuntimeError(f"internal error: {sum(len(p.rows) for p in parts)} rows decoded for a batch of {n}")
    labels = []
    for k, sample in enumerate(batch):
        masked = (setup.label_padding and sample.is_padding) or (setup.mask_failed and k in replaced)
        counters.clips_masked += setup.mask_failed and k in replaced
        labels.append(setup.padding_label if masked else replaced.get(k, sample).label)
    videos = stack(parts, n, setup.device, host, output=setup.output)
    info = batch_info(batch, replaced, labels, setup.padding_label)
    if setup.views:
        videos, labels, info = per_video(videos, labels, info, setup.views, setup.padding_label)
    on_cpu = torch.tensor(labels, dtype=torch.int64)
    if setup.device.type == "cuda":
        on_cpu = on_cpu.pin_memory()  # so the copy to the device is truly asynchronous
    return videos, on_cpu.to(setup.device, non_blocking=True), info


def batch_info(batch: Sequence[Sample], replaced: dict[int, Sample], labels: list[int],
               padding_label: int = PADDING_LABEL) -> BatchInfo:
    """Each row's video, clip, padding and replacement, from the samples that fill the rows."""
    filled = [replaced.get(k, sample) for k, sample in enumerate(batch)]
    return BatchInfo(
        video_index=torch.tensor([s.video_index for s in filled], dtype=torch.int64),
        clip=torch.tensor([s.view for s in filled], dtype=torch.int64),
        is_padding=torch.tensor([s.is_padding for s in batch], dtype=torch.bool),
        replaced=torch.tensor([k in replaced for k in range(len(batch))], dtype=torch.bool),
        mask=torch.tensor([label != padding_label for label in labels], dtype=torch.bool))


def per_video(videos: torch.Tensor, labels: list[int], info: BatchInfo, views: int,
              padding_label: int = PADDING_LABEL) -> tuple[torch.Tensor, list[int], BatchInfo]:
    """A multi-view batch as ``(B, V, ...)`` and one label per video: the padding label when any of its views
    is masked."""
    grouped = [labels[k:k + views] for k in range(0, len(labels), views)]
    per_video = [padding_label if padding_label in group else group[0] for group in grouped]
    b = len(per_video)
    # A video's views fail as one (its row is masked), so its first view's video stands for the row.
    info = BatchInfo(video_index=info.video_index.view(b, views)[:, 0].clone(), clip=info.clip.view(b, views),
                     is_padding=info.is_padding.view(b, views)[:, 0].clone(),
                     replaced=info.replaced.view(b, views).any(dim=1),
                     mask=torch.tensor([label != padding_label for label in per_video], dtype=torch.bool))
    return videos.view(b, views, *videos.shape[1:]), per_video, info


def stack(parts: Sequence[Part], n: int, device: torch.device, host: HostTransfer | None = None, *,
          output: OutputSpec) -> torch.Tensor:
    """The batch's videos: on the CPU one part's own tensor when it is the whole batch, else copies into a new one.

    On the GPU always a tensor of torch's own memory, copied on the current
    stream: DALI's output is never handed out itself (:class:`HeldOutputs`
    says why), and CPU clips are copied from what ``host`` makes of them
    (page-locked: :class:`HostTransfer`). A part of uint8 pixels
    (``decoded.normalized`` false) is copied as it is and normalised on
    ``device`` into its rows, as ``output`` says. Each clip is copied once: a
    whole batch the decoder already copied into torch's memory
    (``decoded.owned``: short clips padded) is handed out as it is, and DALI's
    float32 clips of a bfloat16 output are cast in the copy.
    """
    whole = [p for p in parts if p.rows]
    first = whole[0].decoded
    if len(whole) == 1 and whole[0].rows == whole[0].src == list(range(n)) and len(first.videos) == n:
        if first.videos.device.type != "cpu":
            dtype = output_dtype(output) if first.normalized else first.videos.dtype
            if first.owned and first.videos.device == device and first.videos.dtype == dtype:
                return first.videos  # already copied once into torch's memory: not again
            videos = first.videos.to(device, dtype=dtype, copy=True, non_blocking=True)  # a cast, if any, in it
        else:
            videos = first.videos if host is None else host.source(first.videos)
            videos = videos.to(device, non_blocking=True)
        return videos if first.normalized else normalize_pixels(videos, output)
    videos = torch.empty((n, *first.videos.shape[1:]), dtype=output_dtype(output), device=device)
    for part in whole:
        clips = part.decoded.videos
        if host is not None and clips.device.type == "cpu":
            clips = host.source(clips)
        for row, src, length in runs(part.rows, part.src):
            if part.decoded.normalized:
                videos[row:row + length].copy_(clips[src:src + length], non_blocking=True)
            else:  # the uint8 rows to the device, then normalised there into the batch's rows
                normalize_pixels(clips[src:src + length].to(device, non_blocking=True), output,
                                 out=videos[row:row + length])
    return videos


def runs(rows: Sequence[int], src: Sequence[int]) -> Iterator[tuple[int, int, int]]:
    """``(first row, first source index, length)`` of each run where both go up by one together.

    Example: ``list(runs([0, 1, 3], [0, 1, 2])) == [(0, 0, 2), (3, 2, 1)]``.
    """
    start = 0
    for j in range(1, len(rows) + 1):
        if j == len(rows) or rows[j] != rows[j - 1] + 1 or src[j] != src[j - 1] + 1:
            yield rows[start], src[start], j - start
            start = j
