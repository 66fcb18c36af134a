"""A Dataset over plan samples: each slot decoded, or replaced by the plan's next sample that decodes.

The blog post this project starts from decoded whole files in ``__getitem__``
and dropped broken samples as ``None`` in ``collate_fn`` (shrinking batches and
putting DDP ranks out of step). Here :class:`ClipDataset` decodes only each
sample's window (:func:`fallback.decode.decode_window`), applies the plan
(:func:`fallback.transform.apply_plan`), and fills a slot whose file fails with
the next sample of the plan that decodes (the replacement rule of
:mod:`daliload.failures`); the failures met travel with the item, for the
loader's failure budget to count. :mod:`fallback.loader` runs it in
supervised worker processes, which hold no plan: each slot travels to them as
a :class:`SlotTask` (the slot's sample and its replacement candidates) and a
:class:`SlotDecoder` fills it, so a new epoch needs no new processes.

Test-only fault hooks: with ``fault_injection=True``, a sample whose path is
``fault:kill`` (SIGKILL), ``fault:segv`` (a real segmentation fault),
``fault:exit`` (``os._exit(3)``) or ``fault:hang`` (sleeps for an hour) does
that inside the worker instead of decoding, so tests can kill or hang a worker
at a chosen sample. ``faults={path: action}`` does the same for real files
(the loader fills it from :data:`FAULTS_ENV`, so tests can hit a decode deep
inside :class:`~daliload.KineticsDALILoader`). Off by default.
"""

from __future__ import annotations

import ctypes
import dataclasses
import itertools
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from typing import NamedTuple, Sequence

import torch
import torch.utils.data
from torch.utils.data import Dataset

from daliload.failures import Failure, NoReplacementError, replacement_order
from daliload.plan import OutputSpec, Sample
from fallback import _torch_internals as internals
from fallback.decode import DecodeError, StreamHint, decode_window
from fallback.progress import ProgressBoard
from fallback.transform import apply_plan, clip_shape, output_dtype
from fallback.views import decode_views

logger = logging.getLogger(__name__)

_FAULT_PREFIX = "fault:"
_FAULT_ACTIONS = ("kill", "segv", "exit", "hang")
#: Test-only: ``"path=action;path=action"`` (actions: kill, segv, exit, hang) makes those
#: files' decodes misbehave in whatever process decodes them. Read by the loader at start.
FAULTS_ENV = "DALILOAD_TEST_FAULTS"


def faults_from_env() -> dict[str, str]:
    """The test-only ``path -> action`` faults of :data:`FAULTS_ENV` (empty when unset).

    Raises:
        ValueError: an entry is not ``path=action`` with a known action.
    """
    faults = {}
    for entry in filter(None, os.environ.get(FAULTS_ENV, "").split(";")):
        path, _, action = entry.rpartition("=")
        if not path or action not in _FAULT_ACTIONS:
            raise ValueError(f"{FAULTS_ENV}: {entry!r} is not path=action with action in {_FAULT_ACTIONS}")
        faults[path] = action
    return faults


@dataclass(frozen=True)
class DecodeOptions:
    """How the fallback decodes one sample (see :func:`fallback.decode.decode_window`).

    Attributes:
        threads: FFmpeg threads per decode; 1 is right with several workers.
        skip_nonref: skip non-reference frames the clip does not use.
        timeout_s: per-sample decode time limit in seconds (``None``: none).
        hints: optional ``path -> StreamHint`` from the pre-screen.
    """

    threads: int = 1
    skip_nonref: bool = True
    timeout_s: float | None = None
    hints: dict[str, StreamHint] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 or None, got {self.timeout_s}")

    def hint(self, path: str) -> StreamHint | None:
        """The pre-screen's seek hint for ``path``, if any."""
        return self.hints.get(path) if self.hints else None


def decode_sample(sample: Sample, output: OutputSpec, decode: DecodeOptions = DecodeOptions()) -> torch.Tensor:
    """Decode one plan sample and apply its plan: ``decode_window`` + ``apply_plan``.

    Args:
        sample: the plan item.
        output: what the clip is turned into.
        decode: threads, non-reference skipping, time limit and seek hints.

    Raises:
        DecodeError: the sample's file cannot be decoded.
    """
    return _decode_counted(sample, output, decode, decode.hint(sample.path))[0]


def _decode_counted(sample: Sample, output: OutputSpec, decode: DecodeOptions,
                    hint: StreamHint | None, out: torch.Tensor | None = None) -> tuple[torch.Tensor, int]:
    clip = decode_window(sample.path, sample.frame_indices(), threads=decode.threads,
                         skip_nonref=decode.skip_nonref, timeout_s=decode.timeout_s, hint=hint)
    return apply_plan(clip.frames, sample, output, out=out), clip.num_frames_decoded


class ClipItem(NamedTuple):
    """What :class:`ClipDataset` returns for one plan slot.

    Attributes:
        video: the clip tensor (layout and dtype from the ``OutputSpec``).
        label: class index of the sample actually decoded.
        position: plan position of the sample actually decoded.
        slot_position: plan position of the slot this item fills; differs
            from ``position`` when the slot's own sample failed.
        frames_decoded: frames the decoder produced (GOP waste included).
        frames_used: frames the clip holds (its sample's ``clip_len``).
        failures: failures met while filling this slot (the slot's own sample
            and any replacement candidates that failed too).
    """

    video: torch.Tensor
    label: int
    position: int
    slot_position: int
    frames_decoded: int
    frames_used: int
    failures: tuple[Failure, ...]

    @property
    def replaced(self) -> bool:
        return self.position != self.slot_position


class ClipBatch(NamedTuple):
    """A collated batch of :class:`ClipItem` (see :func:`collate_clips`).

    Only ``videos`` is a tensor. The per-clip numbers are tuples: a tensor
    leaving a worker is handed over as a shared-memory file descriptor, one
    socket handshake each (about 2 ms of the training process, measured on
    2 cores), while a tuple travels inside the batch's pickle.
    """

    videos: torch.Tensor
    labels: tuple[int, ...]
    positions: tuple[int, ...]
    slot_positions: tuple[int, ...]
    frames_decoded: tuple[int, ...]
    frames_used: tuple[int, ...]
    failures: tuple[Failure, ...]


def collate_clips(items: Sequence[ClipItem] | ClipBatch, videos: torch.Tensor | None = None) -> ClipBatch:
    """Batch :class:`ClipItem` s (stacking videos into shared memory inside workers).

    Args:
        items: the items; a :class:`ClipBatch` (what :meth:`SlotDecoder.__getitems__`
            returns, already batched) is returned as it is.
        videos: a ``(len(items), ...)`` tensor the items' videos were written
            into (row ``k`` holds item ``k``'s); rows an item did not write
            (another shape) make it stack them instead. Default: stack them.
    """
    if isinstance(items, ClipBatch):
        return items
    if videos is None or not all(item.video.data_ptr() == videos[k].data_ptr()
                                 for k, item in enumerate(items)):
        videos = torch.utils.data.default_collate([item.video for item in items])
    return ClipBatch(
        videos=videos,
        labels=tuple(item.label for item in items),
        positions=tuple(item.position for item in items),
        slot_positions=tuple(item.slot_position for item in items),
        frames_decoded=tuple(item.frames_decoded for item in items),
        frames_used=tuple(item.frames_used for item in items),
        failures=tuple(f for item in items for f in item.failures),
    )


class Candidate(NamedTuple):
    """A plan sample that may fill a slot, as a worker receives it.

    Attributes:
        index: its index in the plan (what the progress board reports).
        sample: the sample.
        hint: the pre-screen's seek hint for its file, if any.
        known_bad: why it is not tried (it killed or hung a worker before), or ``None``.
    """

    index: int
    sample: Sample
    hint: StreamHint | None
    known_bad: str | None


class SlotTask(NamedTuple):
    """One plan slot to fill: what travels to a worker through the batch sampler.

    ``window`` lists plan samples in replacement order from the first slot of
    a batch on, far enough for every slot of it (see :meth:`ClipDataset.tasks`);
    the slot's own sample is ``window[offset]``. The tasks of one batch share
    one window, so a batch pickles it once. Workers hold no plan: a new plan
    (a new epoch) needs no new workers.
    """

    offset: int
    window: tuple[Candidate, ...]
    num_slots: int  # the plan's length: the replacement order visits each sample once


class SlotDecoder(Dataset):
    """The worker side of :class:`ClipDataset`: fills :class:`SlotTask` s; holds no plan.

    It is what DataLoader workers unpickle once, when they start; it stays the
    same for the loader's life, whatever plans the tasks come from.

    Args:
        output: what every clip is turned into.
        decode: decode options; seek hints travel with the tasks instead.
        max_replacement_tries, fault_injection, faults: see :class:`ClipDataset`.
    """

    def __init__(self, output: OutputSpec, decode: DecodeOptions, *, max_replacement_tries: int,
                 fault_injection: bool, faults: dict[str, str]) -> None:
        self.output = output
        self.decode = dataclasses.replace(decode, hints=None)
        self.max_replacement_tries = max_replacement_tries
        self.fault_injection = fault_injection
        self.faults = dict(faults)
        #: set by the supervising loader: what each worker decodes, and who owns the workers.
        self.board: ProgressBoard | None = None
        self.owner_pid: int | None = None
        #: the views of the last multi-view video decoded and not yet served: ``(path, position) -> clip``,
        #: or the error its decode raised
        self._views: dict[tuple[str, int], torch.Tensor | DecodeError] = {}

    def __getitem__(self, task: SlotTask) -> ClipItem:
        """Fill ``task``'s slot: its own sample, else the first of the window that decodes."""
        return self._fill(task)

    def __getitems__(self, tasks: Sequence[SlotTask]) -> ClipBatch:
        """Fill one transfer's slots, each clip written straight into its row of the batch tensor.

        In a worker that tensor is in shared memory, so handing it to the
        training process copies nothing: the clips are normalised into it
        instead of being stacked into it afterwards (a copy of every clip, 1.6 ms
        of the ~57 a 16-frame 224x224 float16 clip costs, measured on 2 cores).
        """
        shape = clip_shape(tasks[0].window[tasks[0].offset].sample.clip_len, self.output)
        dtype = output_dtype(self.output)
        in_worker = torch.utils.data.get_worker_info() is not None
        videos = internals.shared_empty((len(tasks), *shape), dtype) if in_worker else torch.empty(
            (len(tasks), *shape), dtype=dtype)
        return collate_clips([self._fill(task, videos[k]) for k, task in enumerate(tasks)], videos)

    def _fill(self, task: SlotTask, out: torch.Tensor | None = None) -> ClipItem:
        """:meth:`__getitem__`, writing the clip into ``out`` when it has the clip's shape."""
        failures: list[Failure] = []
        slot_position = task.window[task.offset].sample.position
        for candidate in task.window[task.offset:task.offset + task.num_slots]:
            sample = candidate.sample
            if candidate.known_bad is not None:
                failures.append(Failure(sample.path, candidate.known_bad, sample.position))
                continue
            fits = out is not None and tuple(out.shape) == clip_shape(sample.clip_len, self.output)
            try:
                video, frames_decoded = self._decode(candidate, task.window, out if fits else None)
            except DecodeError as err:
                failures.append(Failure(sample.path, err.reason, sample.position))
                logger.info("slot %d: %s", slot_position, err)
                if len(failures) > self.max_replacement_tries:
                    break
                continue
            return ClipItem(video, sample.label, sample.position, slot_position, frames_decoded, sample.clip_len,
                            tuple(failures))
        raise NoReplacementError(slot_position, failures)

    def _decode(self, candidate: Candidate, window: Sequence[Candidate] = (),
                out: torch.Tensor | None = None) -> tuple[torch.Tensor, int]:
        board, worker_id, sample = self.board, _worker_id(), candidate.sample
        if board is not None and worker_id is not None:
            board.start(worker_id, candidate.index)
        try:
            if self.fault_injection and sample.path.startswith(_FAULT_PREFIX):
                inject_fault(sample.path[len(_FAULT_PREFIX):], sample.path)
            elif sample.path in self.faults:
                inject_fault(self.faults[sample.path], sample.path)
            views = _sibling_views(candidate, window)
            if len(views) > 1:
                video, frames_decoded = self._decode_view(candidate, views)
                return (video if out is None else out.copy_(video)), frames_decoded
            return _decode_counted(sample, self.output, self.decode, candidate.hint, out)
        finally:
            if board is not None and worker_id is not None:
                board.finish(worker_id)

    def _decode_view(self, candidate: Candidate, views: list[Sample]) -> tuple[torch.Tensor, int]:
        """One view of a multi-view video: at its first view, all its views decode in one pass.

        The others come from that pass (or raise its error); each is served once.
        """
        sample, frames_decoded = candidate.sample, 0
        key = (sample.path, sample.position)
        if key not in self._views:  # only the latest video's views are kept
            hints = {sample.path: candidate.hint} if candidate.hint else None
            try:
                clips, frames_decoded = decode_views(views, self.output, dataclasses.replace(self.decode, hints=hints))
            except DecodeError as err:
                clips = [err] * len(views)  # the other views fail the same way, without decoding again
            self._views = {(v.path, v.position): clip for v, clip in zip(views, clips)}
        outcome = self._views.pop(key)
        if isinstance(outcome, DecodeError):
            raise outcome
        return outcome, frames_decoded


def _sibling_views(candidate: Candidate, window: Sequence[Candidate]) -> list[Sample]:
    """The views of ``candidate``'s video that ``window`` holds, in plan order (a multi-view plan lists
    a video's views at consecutive positions, so ``position - view`` names the video's group).

    A single-view plan (every ``view`` is 0) gives ``[candidate.sample]``.
    """
    sample = candidate.sample
    group = sample.position - sample.view
    views = [c.sample for c in window if c.known_bad is None and c.sample.path == sample.path
             and c.sample.position - c.sample.view == group]
    return sorted(views, key=lambda s: s.position) if len(views) > 1 else [sample]


class ClipDataset(Dataset):
    """Map-style dataset: item ``i`` is plan slot ``i``, decoded and transformed.

    Args:
        samples: the plan (one rank, one epoch), in order.
        output: what every clip is turned into.
        decode: decode options (threads, skip_nonref, timeout, hints).
        max_replacement_tries: failed candidates tolerated while looking for a
            replacement before :class:`NoReplacementError`.
        fault_injection: honour the test-only ``fault:*`` paths (see module
            docstring). Never set it in training.
        faults: test-only ``path -> action`` faults (see module docstring).

    ``dataset[i]`` returns a :class:`ClipItem`, decoded in this process. Worker
    processes get the plan as :class:`SlotTask` s (:meth:`tasks`) and decode
    them with :meth:`slot_decoder`, which holds no plan; batch items with
    :func:`collate_clips` (the default collate cannot batch ``failures``).
    """

    def __init__(
        self,
        samples: Sequence[Sample],
        output: OutputSpec,
        *,
        decode: DecodeOptions = DecodeOptions(),
        max_replacement_tries: int = 16,
        fault_injection: bool = False,
        faults: dict[str, str] | None = None,
    ) -> None:
        if not samples:
            raise ValueError("samples is empty: nothing to load")
        if max_replacement_tries < 1:
            raise ValueError(f"max_replacement_tries must be >= 1, got {max_replacement_tries}")
        self.samples = list(samples)
        self.output = output
        self.decode = decode
        self.max_replacement_tries = max_replacement_tries
        self.fault_injection = fault_injection
        self.faults = dict(faults or {})
        self._local: SlotDecoder | None = None

    def with_samples(self, samples: Sequence[Sample]) -> ClipDataset:
        """The same decoding over another plan."""
        return ClipDataset(samples, self.output, decode=self.decode, max_replacement_tries=self.max_replacement_tries,
                           fault_injection=self.fault_injection, faults=self.faults)

    def slot_decoder(self) -> SlotDecoder:
        """A new worker-side decoder for this dataset's tasks (and any other plan's with the same options)."""
        return SlotDecoder(self.output, self.decode, max_replacement_tries=self.max_replacement_tries,
                           fault_injection=self.fault_injection, faults=self.faults)

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def num_videos(self) -> int:
        """Distinct videos (files) of the plan: the failure limit's base."""
        return len({s.path for s in self.samples})

    def __getitem__(self, index: int) -> ClipItem:
        if not 0 <= index < len(self.samples):
            raise IndexError(f"slot {index} out of range for a plan of {len(self.samples)} samples")
        if self._local is None:
            self._local = self.slot_decoder()
        return self._local[self.tasks(index, index + 1)[0]]

    def tasks(self, start: int, stop: int, known_bad: dict[Sample, str] | None = None) -> list[SlotTask]:
        """The tasks of slots ``start .. stop - 1``, sharing one window of candidates.

        The window runs in replacement order from ``start`` until the last slot
        has ``max_replacement_tries + 1`` candidates that are not known bad
        after it (a slot gives up sooner), or the whole plan. Worked example, a
        plan of 100 samples, slots 4..5, 16 tries: the window holds samples
        4 .. 21; slot 4 is ``offset`` 0, slot 5 ``offset`` 1.

        Args:
            start, stop: the slots (plan indices), ``0 <= start < stop <= len(self)``.
            known_bad: samples never to decode again, with the reason.
        """
        n, tries, decode = len(self.samples), self.max_replacement_tries + 1, self.decode
        window: list[Candidate] = []
        decodable = 0  # candidates the last slot may decode
        # The earlier slots' own samples, then the last slot's replacement order (which holds theirs).
        for step, index in enumerate(itertools.chain(range(start, stop - 1), replacement_order(n, stop - 1))):
            sample = self.samples[index]
            bad = known_bad.get(sample) if known_bad else None
            window.append(Candidate(index, sample, decode.hint(sample.path), bad))
            if step >= stop - 1 - start and bad is None:
                decodable += 1
                if decodable == tries:
                    break
        shared = tuple(window)
        return [SlotTask(offset, shared, n) for offset in range(stop - start)]


def _worker_id() -> int | None:
    info = torch.utils.data.get_worker_info()
    return None if info is None else info.id


def inject_fault(action: str, path: str) -> None:
    """Test-only: misbehave as ``action`` says, while "decoding" ``path`` (see the module docstring)."""
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "segv":
        import resource
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core dump to wait for
        ctypes.string_at(0)  # reads address 0: a genuine SIGSEGV
    elif action == "exit":
        os._exit(3)
    elif action == "hang":
        time.sleep(3600)
    raise DecodeError(path, f"unknown test fault {action!r} (kill, segv, exit, hang)")
