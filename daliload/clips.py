"""The one interface every decoder implements: samples in, a clip or a typed failure per sample out.

An epoch pass (:mod:`daliload.epoch`) sends each sample of a batch to a
:class:`ClipSource` by its route and collects one :class:`Decoded` per group
it submitted. Two sources exist: DALI
(:class:`daliload.dali.DaliSource` over a
:class:`daliload.dali.DaliClipDecoder`; the source isolates a failed
batch by bisection) and the PyAV fallback
(:class:`fallback.source.FallbackSource`, supervised worker processes writing
into shared memory). A test double can stand in for either.

Row ``k`` of a group is ``decoded.videos[k]``, unless ``decoded.failures``
holds a :class:`~daliload.failures.Failure` for ``k`` (then that row of
``videos`` is undefined and must not be read)::

    ticket = source.submit(samples)      # queued; never waits
    decoded = source.collect(ticket)     # waits for that group (groups come in submission order)
    for k, sample in enumerate(samples):
        clip_or_failure = decoded.failures.get(k, decoded.videos[k])

``source.cancel()`` drops every group not yet collected without waiting for
it (an abandoned pass: an exception in the training step, Ctrl-C, ``break``).

``source.load()`` says how busy it is (:class:`SourceLoad`: clips in flight,
clips it decodes at once, groups the pass had to wait for): what the router
of :class:`daliload.epoch.Routes` splits a batch by. A source keeps it with a
:class:`LoadMeter` fed at each submit and collect, so nothing needs a view of
its processes or threads.

A group holds finished clips (the output spec's dtype, layout and size,
normalised), unless ``decoded.normalized`` is false: then ``videos`` holds
uint8 pixels of that layout and size (cropped, resized, flipped; what
:func:`fallback.transform.pixel_spec` describes) and the merge normalises
them on the batch's device with :func:`fallback.transform.normalize_pixels`,
which gives what the source would have given. The fallback does that when the
batches go to a GPU (its ``normalize_on``, chosen where the loader builds its
sources); DALI always normalises.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, NamedTuple, Protocol, Sequence

if TYPE_CHECKING:
    import torch

    from daliload.failures import Failure
    from daliload.plan import Sample


class Decoded(NamedTuple):
    """What a source gives for one submitted group of samples.

    Attributes:
        videos: ``(n, ...)`` clips in submission order (layout, dtype and size
            of the output spec; uint8 when ``normalized`` is false), on the
            CPU or the source's GPU. Nothing else
            writes into this memory while it is referenced, so on the CPU it can
            be handed out as a batch without a copy. On the GPU the merge copies
            it: DALI reuses its memory in the order of its own stream once the
            last reference goes, not after the consumer stream's work
            (:class:`daliload.epoch.HeldOutputs`).
        failures: row -> why that row has no clip.
        frames_decoded: frames the decoder produced for the group (window
            frames plus GOP waste), when the source can tell (``None``: DALI).
        keepalive: what must stay referenced until the GPU work queued on
            ``videos`` (or on what it was copied from) has run: DALI's output
            buffers. The epoch pass holds it until an event after its copies.
        normalized: ``videos`` are finished clips (default); false: uint8
            pixels in the output's layout and size, for the merge to normalise
            (see the module docstring). On a GPU, DALI's clips of a bfloat16
            output are float32 (DALI has no bfloat16): the merge casts them in
            the copy it makes anyway.
        owned: ``videos`` is torch's own memory, fresh and referenced by
            nothing else (DALI's clips already copied once: padded short clips,
            a cast): on the GPU the merge hands it out as the batch when it is
            the whole batch, instead of copying it a second time.
        recycle: gives ``videos``' memory back to its source for reuse, to be
            called once the copies that read it have run (the epoch pass does,
            when it lets the batch's parts go); ``None``: nothing to give back.
    """

    videos: "torch.Tensor"
    failures: dict[int, "Failure"]
    frames_decoded: int | None = None
    keepalive: object = None
    normalized: bool = True
    owned: bool = False
    recycle: Callable[[], None] | None = None


class SourceLoad(NamedTuple):
    """How busy a source is, as the router sees it (:class:`daliload.epoch.Routes`).

    Attributes:
        in_flight: clips submitted and not yet collected.
        capacity: clips it decodes at once (DALI's threads times pipelines,
            the fallback's workers): the router's first split.
        waited: groups so far whose collect had to wait for it (it was behind
            the pass): the router's signal of which decoder is the bottleneck.
    """

    in_flight: int
    capacity: int
    waited: int = 0


#: A collect that returned within this many seconds did not wait: the source was ahead of the pass.
WAITED_S = 0.001

#: Videos (tasks: a video's clips are one) each worker of a source with worker processes has queued: its
#: task in hand, one to go on with, and its next batch's. The pass submits enough batches ahead for it
#: (:meth:`daliload.DecodeSpec.batches_ahead`), and the fallback's pool sends each worker as many
#: (:class:`fallback.source.FallbackSource`): the pool sends a worker its next task only when the pass
#: calls into the source (submit, collect), so while the pass waits in DALI's collect a worker holding two
#: tasks ran dry. One DALI thread and one worker sharing VP9's batches (bench_routing's "one each" setup,
#: the worker's CPU time read from /proc in a one-off script, not a published run): busy 0.66-0.80 of the
#: time with two tasks ahead, 0.83-0.87 with six.
TASKS_AHEAD_PER_WORKER = 4


class LoadMeter:
    """A source's clips in flight and the groups the pass had to wait for, from its submits and collects.

    Why waits and not clips/s: a source says when a group is done only when
    the pass collects it, so a decoder that is ahead of the pass shows the
    pass's pace, not its own; which decoder the pass waits for is what a
    collect can tell for certain. Worked example::

        meter = LoadMeter(2)
        meter.submitted(0, clips=4)           # load(): SourceLoad(in_flight=4, capacity=2, waited=0)
        asked = time.perf_counter(); ...      # the collect blocks 30 ms for the group
        meter.collected(0, asked)             # load(): SourceLoad(in_flight=0, capacity=2, waited=1)

    Args:
        capacity: clips the source decodes at once (at least 1 is reported).
        clock: seconds, monotonic (default ``time.perf_counter``; a test's virtual clock).
    """

    def __init__(self, capacity: int, *, clock: Callable[[], float] = time.perf_counter) -> None:
        self.capacity = max(1, int(capacity))
        self._clock = clock
        self.in_flight = 0
        self.waited = 0
        self._clips: dict[int, int] = {}  # ticket -> clips, for groups not collected

    def submitted(self, ticket: int, clips: int) -> None:
        self._clips[ticket] = clips
        self.in_flight += clips

    def collected(self, ticket: int, asked_at: float) -> None:
        """``ticket``'s group came back (its collect was called at ``asked_at``, a time of the clock)."""
        clips = self._clips.pop(ticket, None)
        if clips is None:
            return
        self.in_flight -= clips
        if self._clock() - asked_at > WAITED_S:
            self.waited += 1

    def dropped(self) -> None:
        """Every group not collected was cancelled."""
        self._clips.clear()
        self.in_flight = 0

    def load(self) -> SourceLoad:
        return SourceLoad(self.in_flight, self.capacity, self.waited)


class ClipSource(Protocol):
    """A decoder as an epoch pass uses it (see the module docstring)."""

    def submit(self, samples: Sequence["Sample"], *, urgent: bool = False) -> int:
        """Queue ``samples`` (one group; one clip each); returns the ticket to collect them with.

        ``urgent`` groups go before groups submitted earlier and not started
        (a replacement the pass is waiting for), where the source can do that.
        """

    def collect(self, ticket: int) -> Decoded:
        """Wait for the group of ``ticket`` and return it."""

    def cancel(self) -> None:
        """Drop every group not yet collected, without waiting for it."""

    def load(self) -> SourceLoad:
        """How busy the source is now (for the router)."""

    def close(self) -> None:
        """Release the source's processes, threads and pipelines."""
