"""daliload's own loaders, on the run's plan: the whole loader and each of its two paths alone.

- ``daliload``: :class:`daliload.KineticsDALILoader` with its defaults and
  nothing else (``DecodeSpec()``: its threads, workers and routing, whatever
  the run's workers knob says), as users run it. It is
  given the dataset as a Kinetics folder layout
  (:func:`benchmarks.datasets.kinetics_layout`), scans it (the manifest is
  cached beside the clips; the scan is set-up, not timed), plans epoch 0 from
  the task's seed and decodes each file by its route: DALI (NVDEC on a GPU;
  on the CPU only VP8/VP9/MJPEG) or the PyAV fallback, merged in plan order.
  The loader draws its own plan, and that plan IS the run's plan: the harness
  draws the run's plan the same way (:func:`benchmarks.task.make_plan` over
  :func:`benchmarks.datasets.loader_order`), and this adapter refuses to run
  if the two differ in any window, crop or flip.
- ``daliload-static``: the same with ``DecodeSpec(routing="static")``: each
  file on its pre-screen route, DALI's files all to DALI (the default sends
  each codec to the decoder measured faster where DALI decodes on the CPU,
  and lets the fallback's workers take a share of DALI's files on a GPU).
- ``daliload-workers``: the defaults but for DALI's threads and the fallback's
  workers, both the run's workers knob: the row of the workers sweep (it is
  measured in the sweep only).
- ``daliload-dali-cpu`` / ``daliload-dali-gpu``: DALI's path alone, as the
  loader runs it: the loader with ``DecodeSpec(routing="static")`` (every
  file DALI can open goes to DALI, fed the cut of each window made by the
  loader's cut processes), DALI's threads and the cut processes both the
  run's workers knob. The CPU one runs on VP8, VP9 and MJPEG only (DALI's CPU
  decoder has the rest compiled out), where every file is on DALI's route;
  runs before 2026-12-04 fed :class:`daliload.dali.DaliClipDecoder` whole
  files instead, which the loader has not done since it cuts windows.
- ``daliload-fallback``: the fallback alone on the plan, as the whole loader
  runs it (:class:`fallback.FallbackSource` with the options of
  :class:`daliload.loader.DecodeSpec`: window-only PyAV decode, one FFmpeg
  thread, non-reference frames the clip does not use skipped, the scan's seek
  hints, forkserver workers writing into shared memory; the loader's epoch
  pass and prefetch); it counts the frames it decodes.

Every daliload row counts the frames it decoded from the loader's own
figures: the fallback's (``loader.stats().frames_decoded_fallback``) and
DALI's (``frames_decoded_dali``, which the loader counts from what it fed DALI,
each clip's cut or file from its first frame to the window's end: DALI reports
none). Every adapter raises if a sample
fails to decode: a benchmark that silently replaced samples would time other
work than the plan's.
"""

from __future__ import annotations

import os
from typing import ClassVar, Iterator, Sequence

from benchmarks.loaders import LoadedBatch, LoaderAdapter

_DALI_CPU_CODECS = ("vp8", "vp9", "mjpeg")


def _probe_dali() -> str | None:
    try:
        from daliload.dali import INSTALL_HINT, is_dali_available
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


def loader_hints(dataset) -> dict:
    """The fallback's seek hints for ``dataset``, as the loader builds them from its scan's manifest.

    The scan records each file's keyframes, frame rate, frame count and
    rotation (the generated clips are constant-frame-rate and unrotated), and the loader turns them into
    :class:`fallback.StreamHint` s; the benchmark's own metadata holds the same
    facts, probed the same way (:func:`benchmarks.datasets.probe_keyframes`).
    """
    from fallback import StreamHint

    return {v.path: StreamHint(keyframe_indices=tuple(v.keyframes), fps=v.fps, num_frames=v.num_frames,
                               rotation=0)  # generated clips are unrotated, as the loader's scan records them
            for v in dataset.videos}


class DaliloadFallback(LoaderAdapter):
    """The fallback exactly as :class:`daliload.KineticsDALILoader` runs it, with every file on its route.

    Its :class:`fallback.FallbackSource` gets the loader's options (from
    :class:`daliload.loader.DecodeSpec`: FFmpeg threads, time limit, workers,
    and the scan's seek hints), and the loader's own epoch pass
    (:class:`daliload.epoch.EpochPass`, with no DALI source and the loader's
    prefetch) runs it. So the row is what users get from the loader's fallback
    path, without the manifest, the plan and the routing of the whole loader.
    """

    name = "daliload-fallback"
    summary = ("daliload's PyAV fallback alone, as the loader runs it: its FallbackSource (window-only decode, "
               "1 FFmpeg thread, unused non-reference frames skipped, seek hints, forkserver workers writing "
               "clips into shared memory) under the loader's epoch pass with its prefetch, every file on this route")
    counts_frames = True

    @classmethod
    def probe(cls, config) -> str | None:
        return _probe_fallback()

    def __init__(self, dataset, samples: Sequence, config) -> None:
        import torch

        from daliload.epoch import PassSetup
        from daliload.loader import DecodeSpec
        from fallback.options import FallbackOptions
        from fallback.source import FallbackSource

        spec = DecodeSpec(fallback_workers=config.workers)
        hints = loader_hints(dataset)
        decode = FallbackOptions(threads=spec.fallback_threads, timeout_s=spec.timeout_s)
        self._source = FallbackSource(config.task.output, decode, workers=spec.fallback_workers, hint_of=hints.get)
        self._plan = list(samples)
        self._batches = _batches(samples, config.task.batch_size)
        self._max_failure_fraction = spec.max_failure_fraction
        device = torch.device("cuda" if config.device == "cuda" else "cpu")
        self._setup = PassSetup(output=config.task.output, device=device, label_padding=False, mask_failed=False,
                                prefetch=spec.batches_ahead(config.task.batch_size), num_frames=lambda video: None)
        self.options = (decode, spec.fallback_workers, self._setup.prefetch, hints)  # for tests

    def epoch(self) -> Iterator[LoadedBatch]:
        from daliload.epoch import EpochCounters, EpochPass, Routes
        from daliload.failures import FailureBudget

        budget = FailureBudget(len({s.path for s in self._plan}), max_fraction=self._max_failure_fraction)
        counters, counted = EpochCounters(), 0
        for videos, labels, _ in EpochPass(self._setup, self._batches, self._plan, routes=Routes(), budget=budget,
                                           counters=counters, fallback=self._source):
            frames = counters.frames_decoded_fallback
            yield LoadedBatch(videos, labels, int(labels.shape[0]), frames - counted)
            counted = frames
        if budget.failures:
            raise ValueError(f"{self.name}: {len(budget.failures)} video(s) failed to decode, first "
                             f"{budget.failures[0].describe()}")

    def close(self) -> None:
        self._source.close()


class Daliload(LoaderAdapter):
    name = "daliload"
    summary = ("KineticsDALILoader with its defaults (DecodeSpec()), as users run it: scans the Kinetics layout, "
               "plans epoch 0 from the seed (= the run's plan), decodes route dali with DALI (GPU: NVDEC; CPU: "
               "VP8/VP9/MJPEG) and the rest with the fallback, by the default routing, merged in plan order")
    knob = None  # the defaults: the run's workers knob is not passed on (daliload-workers takes it)
    uses_nvdec = True  # on a GPU, route dali goes to NVDEC
    counts_frames = True  # the fallback's frames and DALI's, as the loader counts them (the module docstring)
    #: the DecodeSpec fields this row sets; the defaults' row sets none
    settings: ClassVar[dict] = {}

    def decode_spec(self, workers: int):
        """The row's ``DecodeSpec``: the defaults with :attr:`settings`, and for a row with a :attr:`knob`, DALI's
        threads and the fallback's workers (who also cut DALI's windows) both the run's ``workers``."""
        from daliload.loader import DecodeSpec

        knob = {} if self.knob is None else {"dali_threads": max(1, workers), "fallback_workers": workers}
        return DecodeSpec(**self.settings, **knob)

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
        from daliload.loader import KineticsDALILoader

        task = config.task
        self._loader = KineticsDALILoader(
            kinetics_layout(dataset), "train", batch_size=task.batch_size, clip_len=task.clip_len,
            frame_stride=task.frame_stride, seed=task.seed,
            last_batch="partial",  # the harness checks every plan sample arrives once, no padding
            augment=task.augment, output=task.output, device="gpu" if config.device == "cuda" else "cpu",
            decode=self.decode_spec(config.workers),
        )
        check_same_plan([s for batch in self._loader.plan(0) for s in batch], samples)

    def epoch(self) -> Iterator[LoadedBatch]:
        self._loader.set_epoch(0)  # every epoch replays the run's plan, as for the other loaders
        frames = 0
        for videos, labels in self._loader:
            stats = self._loader.stats()  # this epoch's counters so far, prefetched batches included
            now = stats.frames_decoded_fallback + stats.frames_decoded_dali
            yield LoadedBatch(videos, labels, int(labels.shape[0]), now - frames)
            frames = now
        failures = self._loader.stats().failures
        if failures:
            raise ValueError(f"{self.name}: {len(failures)} sample(s) failed to decode, first "
                             f"{failures[0].path}: {failures[0].reason}")

    def stats(self):
        """The loader's :class:`daliload.loader.LoaderStats` of the last epoch (clips per path)."""
        return self._loader.stats()

    def close(self) -> None:
        self._loader.close()


class DaliloadStatic(Daliload):
    name = "daliload-static"
    summary = ("KineticsDALILoader with its defaults but routing='static': every file DALI can open goes to DALI, "
               "however fast, the rest to the fallback (the routing before the decoders shared DALI's files)")
    settings: ClassVar[dict] = {"routing": "static"}


class DaliloadDali(DaliloadStatic):
    """DALI's path alone as the loader runs it: ``routing="static"`` sends every file DALI can open to DALI,
    fed the cut of each window; DALI's threads and the cut processes are the run's workers knob."""

    knob = "DALI threads (and the processes that cut its windows)"


class DaliloadDaliCPU(DaliloadDali):
    name = "daliload-dali-cpu"
    summary = ("daliload's DALI path alone on the CPU: KineticsDALILoader with routing='static' (every VP8/VP9/MJPEG "
               "file to DALI's CPU decoder, fed the cut of each window), threads = cut processes = the knob")
    codecs = _DALI_CPU_CODECS


class DaliloadDaliGPU(DaliloadDali):
    name = "daliload-dali-gpu"
    summary = ("daliload's DALI path alone on the GPU: KineticsDALILoader with routing='static' (every file on route "
               "dali to NVDEC, fed the cut of each window), threads = cut processes = the knob")
    needs_cuda = True


class DaliloadWorkers(Daliload):
    name = "daliload-workers"
    summary = ("KineticsDALILoader with its defaults but DALI threads = fallback workers = the knob: the row of "
               "the workers sweep")
    knob = "DALI threads and fallback workers"
    sweep_only = True  # the main table's row is daliload's own defaults


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
