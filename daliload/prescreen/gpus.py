"""Which NVDEC a GPU has: GPU models users know, mapped to the decoder generation that routes depend on.

What NVDEC decodes depends on the GPU, not on "a GPU": the NVDEC of the
A100, H100, H200 and GH200 has no AV1 decode (NVDEC application note, the
Turing/GA100/Hopper column), while GA10x (A10, A40, RTX 30xx), Ada (L4, L40S,
RTX 40xx) and Blackwell (B200, RTX 50xx) have it. Kinetics files downloaded
today are often AV1 (the downloader takes the best stream), so routing AV1 to
DALI on a Hopper would fail every batch holding one.

=============  =====================================================  ====  =======
generation     GPU models (names accepted by ``--gpu-model``)         AV1   engines
=============  =====================================================  ====  =======
``volta``      V100                                                   no    1
``turing``     T4, RTX2080, RTX6000 (Turing)                          no    1-2
``ga100``      A100, A30                                              no    5
``ga10x``      A10, A10G, A16, A2, A40, A6000, RTX3090, RTX3080       yes   1-2
``hopper``     H100, H200, H800, GH200                                no    7
``ada``        L4, L40, L40S, RTX4090, RTX4080, RTX6000ADA            yes   2-4
``blackwell``  B100, B200, GB200, RTX5090, RTXPRO6000                 yes   2-4
=============  =====================================================  ====  =======

How many engines a model has (:data:`NVDEC_ENGINES`, from NVIDIA's data
sheets) decides how many DALI pipelines the loader runs by default
(``DecodeSpec(dali_pipelines="auto")``: one per engine).

A route is decided for a *route target*: ``"cpu"``, or ``"gpu:<generation>"``.
``"gpu"`` alone is :data:`DEFAULT_GPU_GENERATION` (``hopper``): without a GPU
and without ``--gpu-model``, a scan assumes the most common training GPUs,
which have no AV1 decode, and says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: NVDEC generations whose decoder decodes AV1 (8-bit 4:2:0 is what DALI uses).
AV1_GENERATIONS = frozenset({"ga10x", "ada", "blackwell"})
GENERATIONS = ("volta", "turing", "ga100", "ga10x", "hopper", "ada", "blackwell")
#: A few models of each generation, for route reasons.
GENERATION_EXAMPLES = {
    "volta": "V100", "turing": "T4, RTX 20xx", "ga100": "A100, A30", "ga10x": "A10, A40, RTX 30xx",
    "hopper": "H100, H200, GH200", "ada": "L4, L40S, RTX 40xx", "blackwell": "B200, RTX 50xx",
}
#: What ``"gpu"`` means when the GPU is not known: the most common datacenter GPUs (no AV1).
DEFAULT_GPU_GENERATION = "hopper"

#: Model name (upper case, no spaces or dashes) -> NVDEC generation.
GPU_MODELS: dict[str, str] = {
    "V100": "volta",
    "T4": "turing", "RTX2080": "turing", "RTX2080TI": "turing", "RTX6000": "turing", "RTX8000": "turing",
    "A100": "ga100", "A30": "ga100",
    "A10": "ga10x", "A10G": "ga10x", "A16": "ga10x", "A2": "ga10x", "A40": "ga10x", "A6000": "ga10x",
    "A5000": "ga10x", "RTX3090": "ga10x", "RTX3080": "ga10x", "RTX3070": "ga10x",
    "H100": "hopper", "H200": "hopper", "H800": "hopper", "GH200": "hopper", "H20": "hopper",
    "L4": "ada", "L40": "ada", "L40S": "ada", "RTX4090": "ada", "RTX4080": "ada", "RTX4070": "ada",
    "RTX6000ADA": "ada",
    "B100": "blackwell", "B200": "blackwell", "GB200": "blackwell", "B300": "blackwell", "GB300": "blackwell",
    "RTX5090": "blackwell", "RTX5080": "blackwell", "RTXPRO6000": "blackwell",
}

#: NVDEC engines per model, from NVIDIA's data sheets ("video decoders") and the NVDEC application note;
#: models not listed are unknown (``GpuTarget.nvdec_engines`` is then None). What the driver itself reports
#: (``cuvidGetDecoderCaps``' ``nNumNVDECs``) the GPU visit's preflight records; for the H200 not yet seen.
NVDEC_ENGINES: dict[str, int] = {
    "A100": 5, "A30": 4,
    "H100": 7, "H200": 7, "H800": 7, "H20": 7, "GH200": 7,
    "A10": 2, "A10G": 2, "A40": 2, "T4": 2,
    "L4": 4, "L40": 3, "L40S": 3,
}


@dataclass(frozen=True)
class GpuTarget:
    """The GPU a route is decided for.

    Attributes:
        model: the model name (``"H200"``), or ``None`` when only the
            generation is known or it was assumed.
        generation: its NVDEC generation (see the module docstring).
        assumed: True when no GPU was named or seen and the default was taken.
        detail: where the answer came from, for summaries (e.g. the name
            torch reported).
    """

    model: str | None
    generation: str
    assumed: bool = False
    detail: str = ""

    @property
    def route_target(self) -> str:
        """The manifest's key for routes on this GPU: ``"gpu:<generation>"``."""
        return f"gpu:{self.generation}"

    @property
    def decodes_av1(self) -> bool:
        return self.generation in AV1_GENERATIONS

    @property
    def nvdec_engines(self) -> int | None:
        """NVDEC engines of the model (:data:`NVDEC_ENGINES`), or None when the model is unknown or was assumed."""
        return None if self.model is None or self.assumed else NVDEC_ENGINES.get(self.model)

    def describe(self) -> str:
        """One phrase for summaries, e.g. ``"H200 (NVDEC hopper, no AV1)"``."""
        name = self.model or self.generation
        av1 = "AV1" if self.decodes_av1 else "no AV1"
        text = f"{name} (NVDEC {self.generation}, {av1})"
        if self.assumed:
            text += f"; assumed: {self.detail or 'no GPU seen and no --gpu-model given'}"
        return text


def _key(name: str) -> str:
    return re.sub(r"[\s_\-]", "", name.upper())


def model_from_name(name: str) -> str | None:
    """The known model a device name names, e.g. ``"NVIDIA A100-SXM4-80GB"`` -> ``"A100"``; else ``None``.

    The longest known model whose name appears as a whole token wins, so
    ``"NVIDIA L40S"`` is ``L40S``, not ``L40`` or ``L4``.
    """
    text = _key(name).replace("NVIDIA", "").replace("GEFORCE", "").replace("TESLA", "")
    if text in GPU_MODELS:
        return text
    tokens = re.split(r"[^A-Z0-9]+", name.upper().replace("NVIDIA", " ").replace("GEFORCE", " "))
    joined = ["".join(tokens[i:j]) for i in range(len(tokens)) for j in range(i + 1, min(len(tokens), i + 3) + 1)]
    found = [candidate for candidate in joined if candidate in GPU_MODELS]
    return max(found, key=len) if found else None


def resolve_gpu(name: str | None) -> GpuTarget:
    """The GPU target for ``--gpu-model NAME``.

    Args:
        name: a model (``"H200"``, ``"L40S"``, ``"RTX 4090"``), a generation
            (``"hopper"``), ``"auto"`` (the GPU torch sees; the default
            generation, marked assumed, when there is none) or ``None`` (the
            default generation, marked assumed).

    Raises:
        ValueError: an unknown name; the message lists the known ones.
    """
    if name is None:
        return GpuTarget(None, DEFAULT_GPU_GENERATION, assumed=True)
    if name == "auto":
        return detect_gpu()
    if name.lower() in GENERATIONS:
        return GpuTarget(None, name.lower())
    model = model_from_name(name)
    if model is None:
        raise ValueError(f"unknown GPU model {name!r}; known models: {', '.join(sorted(GPU_MODELS))}; "
                         f"or a generation: {', '.join(GENERATIONS)}; or 'auto'")
    return GpuTarget(model, GPU_MODELS[model])


def detect_gpu(device_index: int | None = None) -> GpuTarget:
    """The GPU torch sees (``device_index``, default the current one), or the assumed default without one."""
    try:
        import torch
    except ImportError:
        return GpuTarget(None, DEFAULT_GPU_GENERATION, assumed=True, detail="torch is not installed")
    if not torch.cuda.is_available():
        return GpuTarget(None, DEFAULT_GPU_GENERATION, assumed=True, detail="no GPU visible to torch")
    index = torch.cuda.current_device() if device_index is None else device_index
    reported = torch.cuda.get_device_name(index)
    model = model_from_name(reported)
    if model is None:
        return GpuTarget(None, DEFAULT_GPU_GENERATION, assumed=True,
                         detail=f"torch reports {reported!r}, not a model in daliload.prescreen.gpus")
    return GpuTarget(model, GPU_MODELS[model], detail=f"torch reports {reported!r}")


def parse_route_target(target: str) -> tuple[str, str | None]:
    """``"cpu"`` -> ``("cpu", None)``; ``"gpu"`` / ``"gpu:ada"`` -> ``("gpu", generation)``.

    Raises:
        ValueError: not ``"cpu"``, ``"gpu"`` or ``"gpu:<generation>"``.
    """
    if target == "cpu":
        return "cpu", None
    if target == "gpu":
        return "gpu", DEFAULT_GPU_GENERATION
    if target.startswith("gpu:") and target[4:] in GENERATIONS:
        return "gpu", target[4:]
    raise ValueError(f"device must be 'cpu', 'gpu' or 'gpu:<generation>' with a generation among "
                     f"{', '.join(GENERATIONS)}; got {target!r}")
