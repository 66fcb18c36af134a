"""Loaders under test: one small adapter class each, found through :data:`LOADERS`.

An adapter turns the run's plan into batches the way its library is used in
practice. The harness builds it once per measurement (in a fresh process),
then times whole epochs of :meth:`LoaderAdapter.epoch`::

    adapter = Adapter(dataset, samples, config)     # not timed
    for epoch in range(warmup + runs):
        for batch in adapter.epoch():               # timed, per epoch
            ...                                     # batch.videos moved to config.device
    adapter.close()

To add a loader, write a subclass in its own module and add one line to
:data:`LOADERS`. Most peers only decode frames: subclass
:class:`DataLoaderAdapter` and give it a module-level ``decode`` function; the
crop/resize/flip/normalise and the DataLoader come from :mod:`benchmarks.task`.

Rules that keep the comparison honest:

- decode exactly the plan's windows (``samples``: path, ``frame_indices``,
  ``crop``, ``flip``), unless the library cannot (then set
  ``plan_windows = False`` and say why in ``summary``);
- yield every sample once per epoch: the harness checks the clip count;
- report ``frames_decoded`` per batch when the library can tell (then set
  ``counts_frames = True``); otherwise the harness credits the loader with
  :func:`benchmarks.task.seek_decode_estimate` and marks the figure estimated;
- import the library inside :meth:`probe` / ``__init__``, never at module
  import, so listing loaders stays cheap and one missing library only makes
  its own loader unavailable.
"""

from __future__ import annotations

import abc
import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Iterator, Literal, Sequence

from benchmarks.task import TaskSpec
from daliload.plan import Sample

if TYPE_CHECKING:
    from benchmarks.datasets import Dataset, DatasetSpec

Device = Literal["cpu", "cuda"]

#: loader name -> "module:Class". Order = order in tables and plots.
LOADERS: dict[str, str] = {
    "blog-pyav": "benchmarks.peers.blog_pyav:BlogPyAV",
    "torchcodec-cpu": "benchmarks.peers.torchcodec_peer:TorchCodecCPU",
    "torchcodec-cpu-approx": "benchmarks.peers.torchcodec_peer:TorchCodecCPUApproximate",
    "torchcodec-cuda": "benchmarks.peers.torchcodec_peer:TorchCodecCUDA",
    "decord-cpu": "benchmarks.peers.decord_peer:DecordCPU",
    "decord-1thread": "benchmarks.peers.decord_peer:DecordCPUOneThread",
    "spdl-cpu": "benchmarks.peers.spdl_peer:SpdlCPU",
    "spdl-cpu-1process": "benchmarks.peers.spdl_peer:SpdlCPUSingleProcess",
    "spdl-cpu-pipeline": "benchmarks.peers.spdl_peer:SpdlPipeline",
    "dali-readers-video": "benchmarks.peers.dali_reader:DaliReadersVideo",
    # ---- daliload's own loaders (benchmarks.peers.daliload_peer) ---------------------
    # the whole loader (its own plan, which is the run's), then each of its paths alone
    "daliload": "benchmarks.peers.daliload_peer:Daliload",
    "daliload-static": "benchmarks.peers.daliload_peer:DaliloadStatic",
    "daliload-workers": "benchmarks.peers.daliload_peer:DaliloadWorkers",
    "daliload-dali-gpu": "benchmarks.peers.daliload_peer:DaliloadDaliGPU",
    "daliload-dali-cpu": "benchmarks.peers.daliload_peer:DaliloadDaliCPU",
    "daliload-fallback": "benchmarks.peers.daliload_peer:DaliloadFallback",
    # ----------------------------------------------------------------------------------
}

#: device of the run -> ceiling "module:Class" (see :mod:`benchmarks.ceiling`).
CEILINGS: dict[Device, str] = {
    "cpu": "benchmarks.ceiling:PyAVSequential",
    "cuda": "benchmarks.ceiling:DaliWholeFiles",
}


@dataclass(frozen=True)
class LoaderConfig:
    """How one measurement runs a loader.

    Attributes:
        task: the task (window, augmentation, output, batch size, seed).
        workers: the loader's parallelism knob: DataLoader worker processes, or
            DALI threads (``num_threads``) for DALI pipelines.
        device: where batches must end up (``"cuda"``: the harness moves CPU
            batches there, as a training loop would).
    """

    task: TaskSpec
    workers: int
    device: Device


@dataclass(frozen=True)
class LoadedBatch:
    """What an adapter yields.

    Attributes:
        videos: ``(B, C, T, H, W)`` tensor, or None for a ceiling (decode only).
        labels: ``(B,)`` tensor or None.
        num_clips: clips (or, for a ceiling, whole files) in this batch.
        frames_decoded: frames the decoder produced for them, None if unknown.
    """

    videos: object | None
    labels: object | None
    num_clips: int
    frames_decoded: int | None


class LoaderAdapter(abc.ABC):
    """Base class of a loader under test (see the module docstring).

    Class attributes:
        name: registry name.
        summary: one line for reports: library, how it is used, its threads.
        needs_cuda: runs only with ``--device cuda``.
        codecs: codecs it can decode (None: any).
        plan_windows: decodes the plan's windows (False: picks its own).
        counts_frames: reports ``frames_decoded``.
        uses_nvdec: decodes with NVDEC on a GPU: a GPU run whose decoder
            engines stayed idle (NVML) is reported failed, never as a figure.
        knob: what ``LoaderConfig.workers`` means for it, or None when it has
            no such knob (the workers sweep then skips it).
        sweep_only: measured in the workers sweep only, not in the main table
            (a row that exists to take the knob another row leaves at its default).
    """

    name: ClassVar[str]
    summary: ClassVar[str]
    needs_cuda: ClassVar[bool] = False
    codecs: ClassVar[tuple[str, ...] | None] = None
    plan_windows: ClassVar[bool] = True
    counts_frames: ClassVar[bool] = False
    uses_nvdec: ClassVar[bool] = False
    knob: ClassVar[str | None] = "DataLoader workers"
    sweep_only: ClassVar[bool] = False

    @classmethod
    def skip_reason(cls, dataset: "DatasetSpec", config: LoaderConfig) -> str | None:
        """Why this loader does not run on ``dataset`` with ``config``, or None. Cheap, imports nothing."""
        if cls.needs_cuda and config.device != "cuda":
            return "GPU only; this run has no CUDA device (--device cpu)"
        if cls.codecs is not None and dataset.codec not in cls.codecs:
            return f"does not decode {dataset.codec} (decodes {', '.join(cls.codecs)})"
        return None

    @classmethod
    def probe(cls, config: LoaderConfig) -> str | None:
        """Import the library and check it can run here; return why not, or None."""
        return None

    @abc.abstractmethod
    def __init__(self, dataset: "Dataset", samples: Sequence[Sample], config: LoaderConfig) -> None:
        """Build the loader (not timed)."""

    @abc.abstractmethod
    def epoch(self) -> Iterator[LoadedBatch]:
        """Yield one epoch of batches: every sample of the plan once."""

    def close(self) -> None:  # noqa: B027 - an optional hook: adapters that hold nothing keep it empty
        """Release workers, pipelines and files."""


class DataLoaderAdapter(LoaderAdapter):
    """A peer that decodes in a map-style Dataset under a spawn DataLoader.

    On a GPU run the DataLoader pins its batches (``pin_memory=True``) and the
    harness copies them with ``non_blocking=True``: the way its documentation
    has CUDA training feed the GPU. Subclasses set :attr:`decode` to a
    module-level :data:`benchmarks.task.DecodeFn`.
    """

    decode: ClassVar[staticmethod]

    def __init__(self, dataset: "Dataset", samples: Sequence[Sample], config: LoaderConfig) -> None:
        from benchmarks.task import PlanDataset, plan_dataloader

        decode = type(self).decode  # the plain function: a staticmethod read through the class
        plan_dataset = PlanDataset(samples, [v.num_frames for v in dataset.videos], decode, config.task.output)
        self._loader = plan_dataloader(plan_dataset, batch_size=config.task.batch_size, workers=config.workers,
                                       pin_memory=config.device == "cuda")  # their best mode on a GPU

    def epoch(self) -> Iterator[LoadedBatch]:
        for videos, labels, decoded in self._loader:
            unknown = bool((decoded < 0).any())
            yield LoadedBatch(videos, labels, int(labels.shape[0]), None if unknown else int(decoded.sum()))

    def close(self) -> None:
        iterator = getattr(self._loader, "_iterator", None)
        if iterator is not None:  # persistent workers: shut them down now, not at exit
            iterator._shutdown_workers()
            self._loader._iterator = None


def load_adapter(spec: str) -> type[LoaderAdapter]:
    """The adapter class for a registry name or a ``"module:Class"`` path.

    Raises:
        ValueError: an unknown name or a path that does not name a class.
    """
    target = LOADERS.get(spec) or CEILINGS.get(spec) or spec  # type: ignore[call-overload]
    if ":" not in target:
        raise ValueError(f"unknown loader {spec!r}; registered: {', '.join(LOADERS)}")
    module_name, class_name = target.split(":", 1)
    module = importlib.import_module(module_name)
    try:
        return getattr(module, class_name)
    except AttributeError as err:
        raise ValueError(f"{module_name} has no class {class_name!r} (registry entry {spec!r})") from err
