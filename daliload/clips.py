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

from typing import TYPE_CHECKING, NamedTuple, Protocol, Sequence

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
            (see the module docstring).
    """

    videos: "torch.Tensor"
    failures: dict[int, "Failure"]
    frames_decoded: int | None = None
    keepalive: object = None
    normalized: bool = True


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

    def close(self) -> None:
        """Release the source's processes, threads and pipelines."""
