"""The loader's options: the decode group (:class:`DecodeSpec`) and every check of what a user passes.

Each option lives in one place: :class:`DecodeSpec` here, the clip and
augmentation specs in :mod:`daliload.plan`, the scan's in
:mod:`daliload.prescreen`; :class:`~daliload.KineticsDALILoader` takes them
and calls the checks below before it touches a file, so a bad value fails at
construction with one line that names it and the fix.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import warnings
from dataclasses import dataclass
from typing import Literal, Sequence


from daliload import runtime
from daliload.clips import TASKS_AHEAD_PER_WORKER
from daliload.failures import DEFAULT_MAX_FAILURE_FRACTION
from daliload.plan import AugmentSpec, ClipSpec, OutputSpec, check_last_batch, check_views
from daliload.runtime import usable_cores
from daliload.stream import DEFAULT_POLICY, ReadPolicy

logger = logging.getLogger("daliload.loader")  # where the loader's messages always came from
DecoderChoice = Literal["auto", "fallback"]
DaliFeed = Literal["window", "file"]
Routing = Literal["auto", "adaptive", "static"]


@dataclass(frozen=True)
class DecodeSpec:
    """How clips are decoded: threads, workers, prefetch, failure limits.

    Attributes:
        decoder: ``"auto"`` (default) decodes route ``dali`` with DALI when it
            is installed; ``"fallback"`` sends every file through PyAV.
        dali_threads: DALI worker threads: clips decoded at once. Default
            ``None``: on a GPU ``min(batch_size, 16)`` (at least twice the 7
            NVDEC engines of an H100/H200, so every engine has a session
            decoding while another demuxes: a design choice the first GPU
            visit is to measure), on the CPU one per core.
        prefetch_batches: batches in flight ahead of the one consumed. Default 2;
            at least ``dali_pipelines``, and at least enough batches for
            ``daliload.clips.TASKS_AHEAD_PER_WORKER`` (4) videos per fallback
            worker, a video's ``clips_per_video`` clips being one task
            (:meth:`batches_ahead`).
        dali_pipelines: DALI pipelines per rank, each with ``dali_threads``
            threads, taking batches in turn (batches still come in plan
            order). More keep more NVDEC sessions busy at once. ``"auto"``
            (default): on a GPU one per NVDEC engine of its model, read when
            the loader starts (``daliload.prescreen.gpus.NVDEC_ENGINES``: 7 on
            an H100/H200, 5 on an A100; 1 for a model not listed), on the CPU
            1. Provisional: one pipeline kept about one engine busy in DALI's
            issue 6387; the first GPU visit's sweep of threads and pipelines
            (``benchmarks/gpu/README.md``) sets the rule. An integer overrides it.
        dali_feed: what DALI gets per sample: ``"window"`` (default) the
            packets from the clean keyframe at or before the window to its
            last frame, cut from the file without re-encoding (``fallback.cut``;
            DALI then decodes from that keyframe, not from frame 0), or
            ``"file"``, the whole file (DALI decodes from frame 0 up to the
            window). A file the cut cannot be proven exact for (no keyframe
            index, a variable frame rate) gets its whole file either way.
        dali_max_pixels: the largest frame (width x height) DALI decodes;
            larger files go to the fallback. NVDEC opens a decoder per clip of
            a batch at once, each with its decode surfaces (about 124 MB a clip
            at 1080p, four times that at 4K: estimated, not measured on a GPU yet), so a batch of 32 4K clips would
            need about 16 GB of device memory for decoders alone. Default
            ``1920 * 1088`` (1080p, coded height; at most about 4 GB for 32
            clips); ``None``: no limit (the routes allow up to 4096x4096).
        routing: which decoder takes a file DALI can decode, batch by batch.
            ``"adaptive"``: the fallback's workers take a share of them,
            steered away from whichever decoder the pass has to wait for, so
            that neither idles while the other is the bottleneck (NVDEC
            saturated: the CPU cores help; the fallback faster, as for VP9 on a
            CPU host: it takes most; simulated with decoders at set speeds in
            ``tests/test_routing.py``; on the first GPU visit its start, from the decoders' nominal
            capacities, left the fallback all but idle). ``"static"``: DALI always, as the pre-screen routed
            it. ``"auto"`` (default), when the loader trains (shuffles or augments): each codec to the
            decoder measured faster in the run (``"measured"``; ``stats().decoders`` says which and why),
            on a GPU too (``benchmarks/RESULTS.md``, "GPU visits": NVDEC through DALI 2.4 was the slower
            of the two there), except ``"adaptive"`` where DALI on the CPU and the workers each have cores
            of their own (its threads plus the workers no more than the cores); ``"static"`` when it
            evaluates (its figures then come out the same, bit for bit, on every run and world size).
            Either way each clip is the plan's (window, crop, flip) and batches keep plan order; except with
            ``"static"``, which decoder made a clip can differ between runs,
            and the two differ by a few levels in pixels (``docs/performance.md``,
            "Both decoders at once"). Files only the fallback can decode never
            go to DALI; with ``fallback_workers=0`` routing is ``"static"``.
        fallback_workers: PyAV decoding processes. Default 2. 0 decodes in the
            training process: a debugging mode in which a crash inside FFmpeg
            ends the run and a hang inside it is not cut. DALI's cuts are made
            in as many processes of their own (0: in the training process).
        fallback_threads: FFmpeg threads per fallback decode. Default 1.
        timeout_s: decode limit per video (all its clips or views together), seconds.
            Default 60. A fallback decode past it fails (its worker is killed at ``1.25 * timeout_s +
            0.5``); a DALI batch may take ``timeout_s * (1 + ceil(clips /
            dali_threads))`` before the loader raises
            :class:`~daliload.dali.DaliTimeoutError` naming its files.
        max_failure_fraction: raise once more than this fraction of an epoch's
            videos failed to decode (their samples are replaced until then; at
            least one failed video is allowed; a video is one however many of
            its samples failed). Default 0.05.
        read_timeout_s: time limit of one request to an object store or web
            server, seconds (connect and body). Default 20. A transient error
            (5xx, throttling, a reset connection, this limit) is retried.
        read_attempts: requests per read, at most (1: no retry). Default 4.
            Retries wait 0.25 s, 0.5 s, 1 s, ...; a fallback decode's reads
            also end at its ``timeout_s``. See ``docs/remote.md``.
    """

    decoder: DecoderChoice = "auto"
    dali_threads: int | None = None
    prefetch_batches: int = 2
    dali_pipelines: int | Literal["auto"] = "auto"
    dali_feed: DaliFeed = "window"
    dali_max_pixels: int | None = 1920 * 1088
    routing: Routing = "auto"
    fallback_workers: int = 2
    fallback_threads: int = 1
    timeout_s: float = 60.0
    max_failure_fraction: float = DEFAULT_MAX_FAILURE_FRACTION
    read_timeout_s: float = DEFAULT_POLICY.timeout_s
    read_attempts: int = DEFAULT_POLICY.attempts

    def __post_init__(self) -> None:
        if self.decoder not in ("auto", "fallback"):
            raise ValueError(f"decoder must be 'auto' or 'fallback', got {self.decoder!r}")
        if self.routing not in ("auto", "adaptive", "static"):
            raise ValueError(f"routing must be 'auto', 'adaptive' or 'static', got {self.routing!r}")
        if self.dali_feed not in ("window", "file"):
            raise ValueError(f"dali_feed must be 'window' or 'file', got {self.dali_feed!r}")
        if self.dali_max_pixels is not None and (not isinstance(self.dali_max_pixels, int)
                                                 or isinstance(self.dali_max_pixels, bool)
                                                 or self.dali_max_pixels < 1):
            raise ValueError(f"dali_max_pixels must be an integer >= 1 (width x height) or None, "
                             f"got {self.dali_max_pixels!r}")
        for name in ("dali_threads", "prefetch_batches", "dali_pipelines", "fallback_threads"):
            value = getattr(self, name)
            if (name == "dali_threads" and value is None) or (name == "dali_pipelines" and value == "auto"):
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                either = "; or 'auto' (one per NVDEC engine of the GPU)" if name == "dali_pipelines" else ""
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}{either}")
        if not isinstance(self.fallback_workers, int) or self.fallback_workers < 0:
            raise ValueError(f"fallback_workers must be an integer >= 0, got {self.fallback_workers!r}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 seconds, got {self.timeout_s!r}")
        if not 0 <= self.max_failure_fraction <= 1:
            raise ValueError(f"max_failure_fraction must be in [0, 1], got {self.max_failure_fraction!r}")
        if not isinstance(self.read_attempts, int) or isinstance(self.read_attempts, bool) or self.read_attempts < 1:
            raise ValueError(f"read_attempts must be an integer >= 1, got {self.read_attempts!r}")
        if not self.read_timeout_s > 0:
            raise ValueError(f"read_timeout_s must be > 0 seconds, got {self.read_timeout_s!r}")

    @property
    def read_policy(self) -> ReadPolicy:
        """The time limit and retries of every remote read (:class:`daliload.stream.ReadPolicy`)."""
        return ReadPolicy(timeout_s=self.read_timeout_s, attempts=self.read_attempts)

    def batches_ahead(self, clips_per_batch: int, *, clips_per_video: int = 1, pipelines: int | None = None
                      ) -> int:  # fmt: skip
        """Batches submitted ahead of the one consumed: ``prefetch_batches``, raised to the DALI pipelines
        (``pipelines``, the count :meth:`dali_pipelines_for` resolved; default ``dali_pipelines``, ``"auto"``
        counting 1) and to enough batches that every fallback worker has
        :data:`daliload.clips.TASKS_AHEAD_PER_WORKER` videos to go on with.

        The fallback decodes a video's clips (``clips_per_video`` of repeated sampling) in one task, so a
        batch is ``clips_per_batch // clips_per_video`` tasks. Counted in clips, two batches of two clips
        left two workers waiting between batches (``benchmarks/RESULTS.md``, "Before and after a change"),
        and at ``clips_per_video=4`` two batches of 8 clips, two videos each, left each of two workers one
        video to go on with: 4 batches ahead instead of 2 took that epoch from 42-48 to 85-89 clips/s on
        the 2-core VM (H.264, keyframe every 250). Multi-view evaluation still counts clips (pass 1): its
        video's views are one long task, and its batches are large.
        """
        if pipelines is None:
            pipelines = 1 if self.dali_pipelines == "auto" else self.dali_pipelines
        videos_per_batch = max(1, clips_per_batch // clips_per_video)
        fill = -(-TASKS_AHEAD_PER_WORKER * self.fallback_workers // videos_per_batch)
        return max(self.prefetch_batches, pipelines, fill)

    def dali_pipelines_for(self, device: str, nvdec_engines: int | None, *, gpu_name: str | None = None) -> int:
        """DALI pipelines: as given, else (``"auto"``) ``nvdec_engines`` on a GPU (1 when unknown), 1 on the CPU.

        With ``gpu_name`` (the GPU's description), an ``"auto"`` count on a GPU is logged with why.
        """
        if self.dali_pipelines != "auto":
            return self.dali_pipelines
        pipelines = (nvdec_engines or 1) if device == "gpu" else 1
        if gpu_name is not None and device == "gpu":
            logger.info("%d DALI pipeline(s): %s", pipelines, f"one per NVDEC engine of {gpu_name}" if nvdec_engines
                        else f"the NVDEC engines of {gpu_name} are not in daliload.prescreen.gpus")
        return pipelines

    def routing_for(self, training: bool | str, device: str,
                    batch_size: int) -> Literal["adaptive", "static", "measured"]:
        """The routing policy of a loader that trains (shuffles or augments; a split name: ``"train"`` trains)
        with DALI on ``device``: as given, else (``"auto"``) for training measured, except adaptive where DALI
        on the CPU and the fallback each have cores of their own.

        Static without fallback workers (nothing to share with), and when evaluating (its figures
        then come out the same on every run). DALI on the CPU with more threads and workers than cores
        shares them with the fallback: moving clips between the two adds no decoder, and which is faster
        depends on the codec, batch, crop and machine, so each codec goes to the one measured faster
        (``"measured"``: ``daliload.epoch.Routes``). On a GPU too: on the first GPU visit (H200, DALI 2.4.0,
        ``benchmarks/RESULTS.md``, "GPU visits") NVDEC through DALI gave 10-13 clips/s of Kinetics-sized
        H.264 where the fallback's 14 workers gave 241-285, and the adaptive share, which starts from the
        decoders' nominal capacities (2 workers against 16 threads x 7 pipelines), left the fallback all
        but idle: which decoder is faster is measured, not assumed.
        """
        if self.fallback_workers == 0:
            return "static"
        if self.routing != "auto":
            return self.routing
        threads = self.dali_threads_for(device, batch_size)
        own_cores = device == "cpu" and threads + self.fallback_workers <= usable_cores()
        trains = training if isinstance(training, bool) else training == "train"
        return "static" if not trains else "adaptive" if own_cores else "measured"

    def dali_threads_for(self, device: str, batch_size: int) -> int:
        """DALI threads: as given, else ``min(batch_size, 16)`` on a GPU and one per core on the CPU."""
        if self.dali_threads is not None:
            return self.dali_threads
        return min(batch_size, 16) if device == "gpu" else usable_cores()


#: What torch's ``DataLoader`` keywords are here, for users who pass them out of habit.
_DATALOADER_EQUIVALENTS = {
    "num_workers": "decode=DecodeSpec(fallback_workers=N) (processes for the files DALI cannot decode; "
                   "DALI's own threads: DecodeSpec(dali_threads=N))",
    "pin_memory": "nothing: batches come on the GPU of this rank (device='gpu'), and the fallback's transfers are "
                  "pinned when they go there",
    "drop_last": "last_batch='drop' (or 'pad', the default, or 'partial')",
    "collate_fn": "nothing: batches are (videos, labels) tensors (or a dict: batch_format='dict'); transform them "
                  "in the training step, or set augment=AugmentSpec(...) and output=OutputSpec(...)",
    "sampler": "nothing: the loader's epoch plan shards the split over the ranks itself (seed=, set_epoch())",
    "batch_sampler": "batch_size= and last_batch=",
    "persistent_workers": "nothing: the fallback's workers always persist across epochs",
    "prefetch_factor": "decode=DecodeSpec(prefetch_batches=N)",
    "timeout": "decode=DecodeSpec(timeout_s=S) (a time limit on the decode of each video, all its clips together)",
    "worker_init_fn": "nothing: the workers are daliload's own",
    "multiprocessing_context": "nothing: the workers start with forkserver (spawn where it is missing)",
    "generator": "seed=",
    "dataset": "root, the first argument (a dataset root or a manifest)",
}


def refuse_unknown_options(unknown: dict[str, object], known: Sequence[str]) -> None:
    """A ``TypeError`` for keywords the loader does not take (``known`` are those it does), naming what to use."""
    if not unknown:
        return
    advice = []
    for name in unknown:
        if name in _DATALOADER_EQUIVALENTS:
            advice.append(f"{name!r} is a torch DataLoader option; here use {_DATALOADER_EQUIVALENTS[name]}")
        else:
            close = difflib.get_close_matches(name, known, n=1)
            advice.append(f"unexpected keyword argument {name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    raise TypeError("KineticsDALILoader() got " + "; ".join(advice))


def checked_switches(shuffle: object, augment: object, split: str) -> tuple[bool, bool, AugmentSpec | None]:
    """``(shuffle, augmentation on, the AugmentSpec given)`` from the loader's ``shuffle`` and ``augment``.

    ``shuffle=None`` follows the split (on for ``"train"``); ``augment`` is ``True`` / ``False`` (on or off,
    default settings), an :class:`AugmentSpec` (its settings, on when the loader shuffles) or ``None`` (on
    when the loader shuffles). ``bool("no")`` is ``True``: anything else is refused, not read as a truth value.
    """
    if shuffle is None:
        shuffle = split == "train"
    elif not isinstance(shuffle, bool):
        raise TypeError(f"shuffle must be True, False or None (the default: on for split='train'), got "
                        f"{type(shuffle).__name__} {shuffle!r}")
    if isinstance(augment, bool):
        return shuffle, augment, None
    spec = checked_spec("augment", augment, AugmentSpec, None, also="True, False")
    return shuffle, shuffle, spec


def checked_views(views: object, augmenting: bool) -> tuple[int, int] | None:
    """``views`` checked: two integers >= 1, and only without augmentation (each view is a fixed window and crop)."""
    if views is None:
        return None
    if augmenting:
        raise ValueError(f"views={views!r} is for evaluation splits (e.g. split='val'), or a loader given "
                         "augment=False: each view is a fixed window and crop, where augmentation draws one random "
                         "clip per video and epoch")
    return check_views(views)


def checked_clips_per_video(clips: object, augmenting: bool, batch_size: int) -> int:
    """``clips_per_video`` checked: an integer >= 1; above 1 only with augmentation, and dividing ``batch_size``."""
    if not isinstance(clips, int) or isinstance(clips, bool) or clips < 1:
        raise ValueError(f"clips_per_video must be an integer >= 1, got {clips!r}")
    if clips > 1 and not augmenting:
        raise ValueError(f"clips_per_video={clips} is for split='train' (repeated sampling), or a loader given "
                         f"shuffle=True or augment=True: its clips differ by their random windows and crops; "
                         f"without augmentation, take several clips of a video with views=(T, S)")
    if batch_size % clips:
        raise ValueError(f"batch_size={batch_size} must be a multiple of clips_per_video={clips}, so that a video's "
                         f"clips share a batch and one decode (batches count clips): use batch_size="
                         f"{max(clips, batch_size - batch_size % clips)} or {batch_size + clips - batch_size % clips}; "
                         f"for a video's clips spread over the epoch instead (torchvision's reference), use "
                         f"clips_per_video=1 and {clips} times the epochs: each pass draws a new window per video")
    return clips


def check_options(*, batch_size: object, last_batch: object, device: object, seed: object) -> None:
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    check_last_batch(last_batch)
    runtime.resolve_device(device)  # raises for a device that is not one, or a GPU torch does not see
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")


def checked_spec(name: str, value: object, spec: type, default: object, *, also: str = "") -> object:
    """``value`` when it is a ``spec`` (``default`` for ``None``), else a ``TypeError`` with the call to write.

    A dict of fields (``decode={"timeout_s": 1}``) reads naturally but would fail far from here, on the
    first field read (``'dict' object has no attribute 'decoder'``): the message spells the spec out.
    """
    if value is None:
        return default
    if isinstance(value, spec):
        return value
    kind = ("an " if spec.__name__[0] in "AEIOU" else "a ") + spec.__name__
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        fields = ", ".join(f"{key}={field!r}" for key, field in value.items())
        raise TypeError(f"{name} must be {kind}, got a dict {value!r}: use {name}={spec.__name__}({fields})")
    if also:
        raise TypeError(f"{name} must be {also}, {kind} or None, got {type(value).__name__} {value!r}")
    raise TypeError(f"{name} must be {kind} or None, got {type(value).__name__} {value!r}")


def checked_label_padding(label_padding: object, evaluating: bool) -> bool | Literal["drop"]:
    """``label_padding``: ``True``, ``False``, ``"drop"`` or ``None`` (``"drop"`` when evaluating, else ``False``).

    ``bool("x")`` is ``True``: a string would silently turn masking on, and ``"false"`` too.
    """
    if label_padding is None:
        return "drop" if evaluating else False
    if not isinstance(label_padding, bool) and label_padding != "drop":
        raise TypeError(f"label_padding must be True, False, 'drop' or None (the default: 'drop' when the loader "
                        f"neither shuffles nor augments, as on splits other than 'train'), got {label_padding!r}")
    return label_padding


def checked_batch_format(batch_format: object, batch_keys: object) -> tuple[str, str] | None:
    """The dict keys of the videos and the labels, or ``None`` for tuples: ``batch_format`` ``"tuple"`` or
    ``"dict"`` (``None``: ``"dict"`` when ``batch_keys`` are given), ``batch_keys`` the keys (default
    ``("videos", "labels")``)."""
    if batch_format not in (None, "tuple", "dict"):
        raise ValueError(f"batch_format must be 'tuple' or 'dict', got {batch_format!r}")
    if batch_format == "tuple" and batch_keys is not None:
        raise ValueError(f"batch_keys={batch_keys!r} names the keys of dict batches, but batch_format='tuple': "
                         "use batch_format='dict' (or leave batch_format out)")
    if batch_format == "dict" and batch_keys is None:
        return ("videos", "labels")
    return checked_batch_keys(batch_keys)


def checked_batch_keys(batch_keys: object) -> tuple[str, str] | None:
    """``batch_keys``: ``None`` (tuples) or two different strings, the videos' key and the labels' (not ``"info"``)."""
    if batch_keys is None:
        return None
    if (not isinstance(batch_keys, (tuple, list)) or len(batch_keys) != 2
            or not all(isinstance(key, str) and key for key in batch_keys)
            or batch_keys[0] == batch_keys[1] or "info" in batch_keys):
        raise ValueError(f"batch_keys must be None (tuples) or two different non-empty keys other than 'info', for "
                         f"the videos and the labels, e.g. ('pixel_values', 'labels'), got {batch_keys!r}")
    return (batch_keys[0], batch_keys[1])


def checked_padding_label(padding_label: object) -> int:
    """``padding_label``: a negative integer (no class has it): -1 (the default), or -100 for Hugging Face."""
    if not isinstance(padding_label, int) or isinstance(padding_label, bool) or padding_label >= 0:
        raise ValueError(f"padding_label must be a negative integer (a label no class has: -1, or -100, which "
                         f"Hugging Face's losses and torch's CrossEntropyLoss ignore), got {padding_label!r}")
    return padding_label


def plan_settings(*, split: str, seed: int, batch_size: int, last_batch: str, views: tuple[int, int] | None,
                  clips_per_video: int, clip: ClipSpec, augment: AugmentSpec, shuffle: bool, augmentation: bool,
                  label_padding: bool | str) -> dict:
    """The options a plan and its batches follow, besides the videos and the world size, as plain values (lists,
    not tuples, as a state saved as JSON reads back): what ``state_dict()`` records and ``load_state_dict()`` and
    the ranks (at construction) compare."""
    return {"split": split, "shuffle": shuffle, "augmentation": augmentation, "label_padding": label_padding,
            "seed": seed, "batch_size": batch_size, "last_batch": last_batch,
            "views": list(views) if views else None, "clips_per_video": clips_per_video,
            "clip_len": clip.clip_len, "frame_stride": clip.frame_stride, "target_fps": clip.target_fps,
            "crop_size": list(augment.output_size), "crop_mode": augment.crop_mode,
            "short_side_range": list(augment.short_side_range), "area_range": list(augment.area_range),
            "aspect_range": list(augment.aspect_range), "flip_prob": augment.flip_prob}


def augment_and_output(crop_size, augment: AugmentSpec | None,
                        output: OutputSpec | None) -> tuple[AugmentSpec, OutputSpec]:
    """The augmentation and output specs, with the crop size given in one place."""
    if augment is None:
        augment = AugmentSpec(crop_size=224 if crop_size is None else crop_size)
    elif crop_size is not None and AugmentSpec(crop_size=crop_size).output_size != augment.output_size:
        raise ValueError(f"crop_size={crop_size} disagrees with augment.crop_size={augment.crop_size}; "
                         "give the size in one place")
    if output is None:
        output = OutputSpec(size=augment.output_size)
    elif output.size is None:  # not set: it follows the crop size
        output = dataclasses.replace(output, size=augment.output_size)
    elif output.size != augment.output_size:
        raise ValueError(f"output.size {output.size} disagrees with the crop size {augment.output_size} "
                         f"(crop_size or augment.crop_size); give the size in one place: leave OutputSpec.size "
                         f"unset (it follows the crop size) or pass crop_size={output.size}")
    return augment, output


_warned_no_dali = False


def dali_usable() -> bool:
    """Whether DALI imports (``daliload.dali.is_dali_available``, read now); warns once per process with the
    install command when it does not (``DecodeSpec(decoder="fallback")`` asks for no DALI and no warning)."""
    global _warned_no_dali
    from daliload.dali import INSTALL_HINT, is_dali_available

    if is_dali_available():
        return True
    if not _warned_no_dali:
        _warned_no_dali = True
        warnings.warn(f"NVIDIA DALI is not installed: every clip goes through the PyAV fallback. "
                      f"To decode with DALI: {INSTALL_HINT}", RuntimeWarning, stacklevel=3)
    return False
