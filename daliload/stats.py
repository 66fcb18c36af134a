"""What the loader did in an epoch: :class:`LoaderStats`, as ``loader.stats()`` returns it."""

from __future__ import annotations

from dataclasses import dataclass

from daliload.failures import FailedVideo, Failure


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
        failures: the videos that failed at run time this epoch, each file
            once with the plan positions it failed at (:class:`~daliload.failures.FailedVideo`).
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
        quarantined: files whose decode killed a worker (twice: once more on
            a fresh one) or ran past the time limit; they are not decoded again
            in this run (their samples fail at once, and are replaced).
        replacements: ``(slot_position, used_position)`` of every replaced
            slot: which plan sample's clip fills a failed slot.
        clips_masked: failed samples of an evaluation split (not ``"train"``):
            their slot holds a replacement with label -1, like padding, so no
            video is scored twice.
        clips_past_end: clips whose window runs past the end of their video
            (the last frame is repeated, as ``pad_mode="edge"``).
        frames_decoded_fallback: frames the fallback's decoders produced
            (window frames plus GOP waste).
        frames_decoded_dali: frames DALI decoded, counted from what it was
            fed (DALI reports none): from each clip's entry (its cut's first
            frame, or frame 0 for a whole file) to its window's last frame.
        clips_dali_cut: DALI clips decoded from a cut of their file (the
            packets from the keyframe before the window; ``DecodeSpec.dali_feed``)
            instead of the whole file.
        isolation_s: seconds spent finding which files broke DALI batches.
        dali_disabled: why DALI was given up for the rest of the run (several
            failed batches in a row with no single file to blame), or ``None``.
        clips_moved: clips of route ``dali`` that the fallback decoded because
            the router found it would finish them first (``routing="adaptive"``;
            counted in ``clips_fallback``; not the re-decodes of failed DALI
            batches, which are ``clips_redecoded``).
        routing: the routing policy (``DecodeSpec.routing`` resolved:
            ``"adaptive"``, ``"static"`` or ``"measured"``).
        decoders: per codec, which decoder its clips go to and why, for the
            run so far (each a :class:`daliload.epoch.CodecRoute`: ``codec``,
            ``decoder``, ``why``: ``"measured"`` with the clips/s measured on
            each decoder in ``rates``, ``"explicit"``, ``"only decoder able"``
            or ``"default"``; ``clips`` each decoder was given under
            ``"measured"``).
        remote_bytes, remote_requests, remote_retries, remote_failed_reads:
            bytes received from remote stores (videos named by URI), requests
            made (retries included), retries of transient errors, reads that
            failed for good: in this process since it started, not per epoch
            (:func:`daliload.stream.transfer_counts`), with the reads its
            worker processes made for it (the fallback's decodes, the cuts of
            DALI's windows), each sent back with its task's result.
    """

    epoch: int
    batches: int
    clips_dali: int
    clips_fallback: int
    clips_redecoded: int
    replaced: int
    failures: tuple[FailedVideo, ...]
    rejected: tuple[Failure, ...]
    dali_wait_s: float
    fallback_wait_s: float
    device: str
    dali_enabled: bool
    rerouted: tuple[str, ...] = ()
    quarantined: tuple[str, ...] = ()
    replacements: tuple[tuple[int, int], ...] = ()
    clips_masked: int = 0
    clips_past_end: int = 0
    frames_decoded_fallback: int = 0
    isolation_s: float = 0.0
    dali_disabled: str | None = None
    frames_decoded_dali: int = 0
    clips_dali_cut: int = 0
    clips_moved: int = 0
    routing: str = "adaptive"
    remote_bytes: int = 0
    remote_requests: int = 0
    remote_retries: int = 0
    remote_failed_reads: int = 0
    decoders: tuple = ()

    @property
    def dali_share(self) -> float:
        """Fraction of clips DALI decoded."""
        total = self.clips_dali + self.clips_fallback
        return self.clips_dali / total if total else 0.0

    def format(self) -> str:
        """A few readable lines for logs."""
        lines = [
            f"epoch {self.epoch}: {self.batches} batches, {self.clips_dali} clips by DALI ({self.device}), "
            f"{self.clips_fallback} by the fallback ({self.dali_share:.0%} DALI; routing {self.routing}: "
            f"{self.clips_moved} DALI-route clips moved to the fallback)",
            f"waiting: DALI {self.dali_wait_s:.2f} s, fallback {self.fallback_wait_s:.2f} s; "
            f"re-decoded after a DALI failure: {self.clips_redecoded}; replaced: {self.replaced}",
        ]
        lines += [f"codec {route.describe()}" for route in self.decoders]
        if self.clips_dali:
            lines.append(f"DALI: {self.clips_dali_cut} of {self.clips_dali} clips from a cut of their file; "
                         f"{self.frames_decoded_dali / self.clips_dali:.0f} frames decoded per clip")
        if self.clips_masked or self.clips_past_end:
            lines.append(f"failed and masked: {self.clips_masked}; "
                         f"windows past the end of their video: {self.clips_past_end}")
        if self.remote_requests:
            lines.append(f"remote reads (this process): {self.remote_bytes} bytes in {self.remote_requests} requests, "
                         f"{self.remote_retries} retried, {self.remote_failed_reads} failed")
        if self.dali_disabled:
            lines.append(f"DALI given up for this run: {self.dali_disabled}")
        if self.rerouted:
            lines.append(f"sent to the fallback after failing in DALI ({len(self.rerouted)}): "
                         + ", ".join(self.rerouted[:5]) + (" ..." if len(self.rerouted) > 5 else ""))
        if self.quarantined:
            lines.append(f"not decoded again this run, after killing or hanging a worker ({len(self.quarantined)}): "
                         + ", ".join(self.quarantined[:5]) + (" ..." if len(self.quarantined) > 5 else ""))
        if self.failures:
            lines.append(f"failed at run time ({len(self.failures)} videos):")
            lines += [f"  {f.describe()}" for f in self.failures[:10]]
            if len(self.failures) > 10:
                lines.append(f"  ... and {len(self.failures) - 10} more")
        if self.rejected:
            lines.append(f"rejected by the pre-screen ({len(self.rejected)}):")
            lines += [f"  {f.path}: {f.reason}" for f in self.rejected[:10]]
            if len(self.rejected) > 10:
                lines.append(f"  ... and {len(self.rejected) - 10} more")
        return "\n".join(lines)
