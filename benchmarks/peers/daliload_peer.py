"""daliload's own loaders, on the run's plan: the whole loader and each of its two paths alone.

- ``daliload``: :class:`daliload.KineticsDALILoader`, as users run it. It is
  given the dataset as a Kinetics folder layout
  (:func:`benchmarks.datasets.kinetics_layout`), scans it (the manifest is
  cached beside the clips; the scan is set-up, not timed), plans epoch 0 from
  the task's seed and decodes each file by its route: DALI (NVDEC on a GPU;
  on the CPU only VP8/VP9/MJPEG) or the PyAV fallback, merged in plan order.
  The loader draws its own plan, and that plan IS the run's plan: the harness
  draws the run's plan the same way (:func:`benchmarks.task.make_plan` over
  :func:`benchmarks.datasets.loader_order`), and this adapter refuses to run
  if the two differ in any window, crop or flip.
- ``daliload-dali-cpu`` / ``daliload-dali-gpu``: :class:`daliload.pipeline.DaliClipDecoder`
  alone on the plan's batches (``fn.decoders.video`` + ``fn.resize`` +
  ``fn.crop_mirror_normalize``), two batches in flight; the knob is DALI's
  thread count. The CPU one decodes VP8, VP9 and MJPEG only (DALI's CPU
  decoder has the rest compiled out).
- ``daliload-fallback``: :func:`fallback.make_fallback_loader` alone on the
  plan (window-only PyAV decode, one FFmpeg thread, non-reference frames the
  clip does not use skipped) in forkserver DataLoader workers; it counts the
  frames it decodes.

DALI does not say how many frames it decoded, so the DALI rows and the whole
loader are credited with a seek to the keyframe before each window (``~`` in
the tables). Every adapter raises if a sample fails to decode: a benchmark
that silently replaced samples would time other work than the plan's.
"""

from __future__ import annotations

import os
from typing import ClassVar, Iterator, Literal, Sequence

from benchmarks.loaders import LoadedBatch, LoaderAdapter

_DALI_CPU_CODECS = ("vp8", "vp9", "mjpeg")


def _probe_dali() -> str | None:
    try:
        from daliload.pipeline import INSTALL_HINT, is_dali_available
    except ImportError as err:  # daliload itself (torch, numpy) missing
        return f"daliload does not import ({err}); pip install -e . from the repository root"
    if not is_dali_available():
        return f"DALI is not installed; {INSTALL_HINT}"
    return None


def _probe_fallback() -> str | None:
    try:
        import fallback  # noqa: F401  (imports PyAV and torch)
    except ImportError as err:
        return f"daliload's fallback does not import ({err}); pip install av torch"
    return None


def _batches(samples: Sequence, batch_size: int) -> list[list]:
    return [list(samples[i:i + batch_size]) for i in range(0, len(samples), batch_size)]


class DaliloadFallback(LoaderAdapter):
    name = "daliload-fallback"
    summary = ("daliload's PyAV fallback alone: make_fallback_loader (window-only decode, 1 FFmpeg thread, "
               "unused non-reference frames skipped) in forkserver DataLoader workers")
    counts_frames = True

    @classmethod
    def probe(cls, config) -> str | None:
        return _probe_fallback()

    def __init__(self, dataset, samples: Sequence, config) -> None:
        from fallback import make_fallback_loader

        # Persistent workers: started in the warm-up epoch, as the other DataLoader peers'.
        self._loader = make_fallback_loader(list(samples), config.task.output, batch_size=config.task.batch_size,
                                            num_workers=config.workers, persistent_workers=True)

    def epoch(self) -> Iterator[LoadedBatch]:
        counted = 0
        for videos, labels, _positions in self._loader:
            decoded = self._loader.stats().frames_decoded  # cumulative over the pass
            yield LoadedBatch(videos, labels, int(labels.shape[0]), decoded - counted)
            counted = decoded
        failures = self._loader.failures
        if failures:
            raise ValueError(f"{self.name}: {len(failures)} sample(s) failed to decode, first "
                             f"{failures[0].path}: {failures[0].reason}")

    def close(self) -> None:
        self._loader.close()


class DaliloadDali(LoaderAdapter):
    """:class:`daliload.pipeline.DaliClipDecoder` on the plan's batches; subclasses pick the device."""

    knob = "DALI threads"
    decodes_from_start = True  # fn.decoders.video builds no frame index (daliload.pipeline docstring)
    device: ClassVar[Literal["cpu", "gpu"]]

    @classmethod
    def probe(cls, config) -> str | None:
        return _probe_dali()

    def __init__(self, dataset, samples: Sequence, config) -> None:
        from daliload.pipeline import DaliClipDecoder

        self._batches = _batches(samples, config.task.batch_size)
        self._decoder = DaliClipDecoder(config.task.output, batch_size=config.task.batch_size, device=self.device,
                                        num_threads=max(1, config.workers), prefetch_queue_depth=2)

    def epoch(self) -> Iterator[LoadedBatch]:
        decoder, batches = self._decoder, self._batches
        submitted = 0
        for i in range(len(batches)):
            # Keep prefetch_queue_depth batches in flight, as KineticsDALILoader does.
            while submitted < len(batches) and (submitted <= i or decoder.pending < decoder.prefetch_queue_depth):
                decoder.submit(batches[submitted])
                submitted += 1
            decoded = decoder.result()  # DaliBatchError (naming the files) ends the measurement
            yield LoadedBatch(decoded.videos, decoded.labels, len(decoded.samples), None)

    def close(self) -> None:
        self._decoder.close()


class DaliloadDaliCPU(DaliloadDali):
    name = "daliload-dali-cpu"
    summary = ("daliload's DALI path alone on the CPU: DaliClipDecoder(device='cpu'), fn.decoders.video + "
               "resize + crop_mirror_normalize, 2 batches in flight (VP8/VP9/MJPEG only)")
    codecs = _DALI_CPU_CODECS
    device = "cpu"


class DaliloadDaliGPU(DaliloadDali):
    name = "daliload-dali-gpu"
    summary = ("daliload's DALI path alone on the GPU: DaliClipDecoder(device='gpu'), NVDEC "
               "fn.decoders.video(device='mixed') + resize + crop_mirror_normalize, 2 batches in flight")
    needs_cuda = True
    uses_nvdec = True
    device = "gpu"


class Daliload(LoaderAdapter):
    name = "daliload"
    summary = ("KineticsDALILoader as users run it: scans the Kinetics layout, plans epoch 0 from the seed "
               "(= the run's plan), decodes route dali with DALI (GPU: NVDEC; CPU: VP8/VP9/MJPEG) and the rest "
               "with the fallback, merged in plan order; DALI threads = fallback workers = the knob")
    knob = "DALI threads and fallback workers"
    uses_nvdec = True  # on a GPU, route dali goes to NVDEC

    @classmethod
    def probe(cls, config) -> str | None:
        reason = _probe_fallback()
        if reason is not None:
            return reason
        try:
            import tqdm  # noqa: F401  (the scan's progress bar)
        except ImportError as err:
            return f"tqdm is not installed ({err}): daliload's scan needs it; pip install tqdm"
        # Without DALI the loader runs fallback-only (and warns); measuring that under
        # this name would mislabel it, so it is listed as unavailable instead.
        return _probe_dali()

    def __init__(self, dataset, samples: Sequence, config) -> None:
        from benchmarks.datasets import kinetics_layout
        from daliload.loader import DecodeSpec, KineticsDALILoader

        task = config.task
        workers = config.workers
        self._loader = KineticsDALILoader(
            kinetics_layout(dataset), "train", batch_size=task.batch_size, clip_len=task.clip_len,
            frame_stride=task.frame_stride, seed=task.seed,
            last_batch="partial",  # the harness checks every plan sample arrives once, no padding
            augment=task.augment, output=task.output, device="gpu" if config.device == "cuda" else "cpu",
            decode=DecodeSpec(dali_threads=max(1, workers), fallback_workers=workers),
        )
        check_same_plan([s for batch in self._loader.plan(0) for s in batch], samples)

    def epoch(self) -> Iterator[LoadedBatch]:
        self._loader.set_epoch(0)  # every epoch replays the run's plan, as for the other loaders
        for videos, labels in self._loader:
            yield LoadedBatch(videos, labels, int(labels.shape[0]), None)
        failures = self._loader.stats().failures
        if failures:
            raise ValueError(f"{self.name}: {len(failures)} sample(s) failed to decode, first "
                             f"{failures[0].path}: {failures[0].reason}")

    def stats(self):
        """The loader's :class:`daliload.loader.LoaderStats` of the last epoch (clips per path)."""
        return self._loader.stats()

    def close(self) -> None:
        self._loader.close()


def check_same_plan(loader_plan: Sequence, run_plan: Sequence) -> None:
    """Raise unless the loader's own plan decodes the run plan's windows, crops and flips, in order.

    Paths are compared after resolving links (the loader reads the layout's
    links to the run's files). Labels are not compared: the loader numbers
    the class folders it finds, which decides nothing about the work done.

    Raises:
        ValueError: the plans differ; the message names the first sample that does.
    """
    if len(loader_plan) != len(run_plan):
        raise ValueError(f"daliload planned {len(loader_plan)} samples, the run's plan has {len(run_plan)}")
    for ours, theirs in zip(loader_plan, run_plan):
        same = (os.path.realpath(ours.path) == os.path.realpath(theirs.path)
                and (ours.position, ours.start_frame, ours.frame_stride, ours.clip_len, ours.crop, ours.flip)
                == (theirs.position, theirs.start_frame, theirs.frame_stride, theirs.clip_len, theirs.crop,
                    theirs.flip))
        if not same:
            raise ValueError(f"daliload's own plan differs from the run's plan at position {theirs.position}: "
                             f"loader {ours} against run {theirs}")
