"""``daliload doctor``: will daliload run on this machine, and what to fix first.

A new user's first hours go to matching CUDA, the driver, torch and the GPU,
and to a loader that stops after a few hundred batches for want of shared
memory or cores. ``daliload doctor`` looks at the machine it runs on and
prints one line per check with a verdict and, where something is wrong, the
fix::

    check           status  detail                                              fix
    python          ok      3.11.7
    torch           ok      2.13.0+cpu (CPU build); no GPU: batches on the CPU
    ...
    verdict: 0 failed, 2 warnings: daliload runs here; ...

Statuses: ``ok``; ``warn`` (it runs, slower or at a risk the fix removes);
``fail`` (it will not run, or a decoder will fail every batch); ``skip``
(the check does not apply here, and the detail says why: on a machine with
no GPU the NVDEC checks skip and the detail says what decodes instead).
Exit code 0 when nothing failed, 1 otherwise; ``--json`` prints the machine's
facts, the options and the checks as one JSON object instead of the table.

The checks, in order (:data:`CHECKS`):

==============  ==================================================================
check           what it compares
==============  ==================================================================
python          the running Python against ``requires-python`` (>= 3.10)
torch           torch's CUDA build against the driver's CUDA version, and its
                compiled GPU architectures against the GPU's compute capability
driver          the driver's CUDA version against the installed DALI wheel
                (``nvidia-dali-cuda130``: driver >= 580; ``-cuda120``: >= 525)
gpu             the GPU model (:mod:`daliload.prescreen.gpus`), its compute
                capability and NVDEC engines (DALI pipelines per rank)
nvdec codecs    what DALI decodes on this GPU's NVDEC (the routes' table,
                :data:`daliload.prescreen.rules.DALI_CAPABILITIES`): an H100/H200
                has no AV1, so AV1 files go to the fallback there
libnvcuvid      ``libnvcuvid.so.1`` loads: DALI opens it only at its first GPU
                decode, so without it every DALI batch fails
dali decode     one generated clip decoded by DALI through daliload's own decoder
                (:class:`~daliload.dali.DaliClipDecoder`) in a child process with
                a time limit, its frames checked by their frame codes: H.264 on
                NVDEC (``device="mixed"``) on a GPU, VP9 on DALI's CPU decoder
                without one. A hang or a crash in DALI or the driver is reported
                here, not inherited
pyav            PyAV and its FFmpeg, and that its FFmpeg decodes the codecs the
                fallback is sent (h264, hevc, vp9, av1, mpeg4)
shared memory   the fallback's batch buffers in flight (see below) against the
                memory this machine (or container) may use
/dev/shm        its size, for NCCL between the local ranks of one machine
cores           CPU cores per local rank against ``fallback_workers`` (too many; on a GPU host, too few)
start method    how daliload starts processes (forkserver or spawn, never fork)
==============  ==================================================================

Shared memory, worked out: the fallback writes each batch's clips into one
buffer of shared memory (``fallback.source.shared_buffer``), ``clips x 3 x
clip_len x crop x crop`` of the dtype the workers write (uint8 on a GPU host,
where the merge normalises on the GPU; the output dtype on the CPU), and a
rank keeps ``DecodeSpec.batches_ahead(...) + 1`` of them (the batches
submitted ahead and the one being handed out; on a GPU host ``+ 2``: its
page-locked ring, ``daliload.epoch.RegisteredBuffers``, keeps the buffers whose
copies to the device still run). At the defaults (batch 32,
16 frames, 224 px) that is 3 x 308 MB = 925 MB a rank on the CPU (float32)
and, on an H200 (7 DALI pipelines, so 7 batches ahead), 9 x 77 MB = 693 MB a
rank, 5.5 GB for 8 ranks, at worst (every clip on the fallback). The buffers
are anonymous ``memfd`` files: on Linux they are not in ``/dev/shm`` and not
bounded by its size (docker's ``--shm-size``); their pages count against the
machine's or container's memory (docker's ``--memory``, the cgroup's
``memory.max``). So that is what they are compared against, and ``/dev/shm``
is checked for what does use it: NCCL's transport between the ranks of one
machine (NCCL's troubleshooting page, "Shared memory", asks for
``--shm-size=1g --ulimit memlock=-1`` in docker; docker's default is 64 MB).
That memfd files are unbounded by ``/dev/shm``: they live on the kernel's
internal shmem mount, which gets no size limit (``shmem_fill_super`` in
``mm/shmem.c`` sets one only for mounts that are not kernel mounts).

Nothing here prints the environment, a path outside the package or a
secret: the facts are versions, names, counts and sizes.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Literal, Sequence

from daliload.dali import INSTALL_HINT
from daliload.options import DecodeSpec
from daliload.plan import OUTPUT_DTYPES
from daliload.prescreen.rules import DALI_CAPABILITIES
from daliload.commands._doctor_facts import (DALI_WHEELS, Check, Machine, Status, Workload, check_cores,
                                             check_dev_shm, check_shared_memory, default_local_ranks, gather,
                                             shared_bytes_per_rank)  # noqa: F401 (a name of this command's)

HELP = "check this machine for daliload (Python, torch, driver and DALI wheel, GPU and NVDEC, memory, cores) " \
       "and say what to fix"

STATUSES: tuple[Status, ...] = ("ok", "warn", "fail", "skip")
#: The checks, in the order they are printed.
CHECKS = ("python", "torch", "driver", "gpu", "nvdec codecs", "libnvcuvid", "dali decode", "pyav",
          "shared memory", "/dev/shm", "cores", "start method")
#: What the fallback is sent that a minimal FFmpeg build may lack a decoder for.
FALLBACK_CODECS = ("h264", "hevc", "vp9", "av1", "mpeg4")
#: Default time limit of the one-clip DALI decode, seconds (DALI's import alone takes a few on a busy machine).
DECODE_TIMEOUT_S = 120.0
_GB = 1e9
_MARK = "DOCTOR-RESULT "


# --- what the actions do (replaced in tests that fake a GPU) ----------------------------------------


def load_nvcuvid() -> str | None:
    """None when ``libnvcuvid.so.1`` loads, else why not."""
    try:
        ctypes.CDLL("libnvcuvid.so.1")
    except OSError as err:
        return str(err)
    return None


def decode_one_clip(device: Literal["gpu", "cpu"], timeout_s: float) -> tuple[bool, str]:
    """Decode one generated clip with DALI in a child process: ``(worked, what happened)``.

    The child (:func:`_decode_child`) writes a 24-frame 128x96 clip (H.264 for
    ``"gpu"``, VP9 for ``"cpu"``), decodes 8 of its frames with
    :class:`~daliload.dali.DaliClipDecoder` and checks their frame codes. A child
    that hangs is killed at ``timeout_s``; one that crashes is reported with
    its exit status and the end of what it wrote.
    """
    command = [sys.executable, "-c", f"from daliload.commands.doctor import _decode_child; _decode_child({device!r})"]
    try:
        child = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return False, f"no answer within {timeout_s:g} s: DALI or the driver hangs on a one-clip decode"
    for line in reversed(child.stdout.splitlines()):
        if line.startswith(_MARK):
            result = json.loads(line[len(_MARK):])
            return result["ok"], result["detail"]
    tail = " ".join((child.stderr or child.stdout).strip().splitlines()[-3:])[-400:]
    how = f"signal {-child.returncode}" if child.returncode < 0 else f"exit status {child.returncode}"
    return False, f"the decoding process ended with {how}: {tail or 'no output'}"


def _decode_child(device: Literal["gpu", "cpu"]) -> None:
    """The child of :func:`decode_one_clip`: one line ``DOCTOR-RESULT {"ok": ..., "detail": ...}``."""
    import time

    from daliload.dali import DaliClipDecoder
    from daliload.framecode import read_clip
    from daliload.plan import CropBox, OutputSpec, Sample
    from daliload.synth import default_spec, render_clip, write_video

    codec = "h264" if device == "gpu" else "vp9"
    start, stride, clip_len = 4, 2, 8
    with tempfile.TemporaryDirectory(prefix="daliload-doctor-") as tmp:
        spec = default_spec(codec, gop=12)
        path = Path(tmp) / f"clip.{spec.extension}"
        write_video(path, render_clip(1, 24, width=128, height=96), spec)
        raw = OutputSpec(size=(96, 128), mean=(0, 0, 0), std=(1, 1, 1), dtype="float32", layout="CTHW")
        sample = Sample(position=0, video_index=0, path=str(path), label=0, start_frame=start,
                        frame_stride=stride, clip_len=clip_len, crop=CropBox.full(), flip=False)
        began = time.perf_counter()
        try:
            with DaliClipDecoder(raw, batch_size=1, device=device, num_threads=1, read_threads=1) as decoder:
                videos = decoder.decode_batch([sample]).videos
            frames = read_clip(videos[0].cpu(), layout="CTHW")
        except Exception as err:  # reported to the parent as the check's detail, whatever DALI raised
            result = {"ok": False, "detail": f"{type(err).__name__}: {' '.join(str(err).split())[:400]}"}
        else:
            expected = [start + stride * i for i in range(clip_len)]
            where = "NVDEC (device='mixed')" if device == "gpu" else "DALI's CPU decoder"
            result = {"ok": frames == expected,
                      "detail": f"a {codec.upper()} clip decoded by {where} in {time.perf_counter() - began:.1f} s: "
                                + ("frames " + ", ".join(map(str, frames)) + ", as planned" if frames == expected
                                   else f"frames {frames}, expected {expected}")}
    print(_MARK + json.dumps(result), flush=True)


# --- the checks ------------------------------------------------------------------------------------


def _cuda_text(version: int) -> str:
    return f"{version // 1000}.{version % 1000 // 10}"


def check_python(m: Machine) -> Check:
    ok = tuple(int(p) for p in m.python.split(".")[:2]) >= (3, 10)
    return Check("python", "ok" if ok else "fail", m.python,
                 "" if ok else "daliload needs Python >= 3.10: use a newer interpreter or venv")


def check_torch(m: Machine) -> Check:
    if m.torch is None:
        return Check("torch", "fail", "torch does not import", "pip install torch (a CUDA build on a GPU host: "
                     "https://pytorch.org/get-started/locally/)")
    if m.torch_cuda is None:
        if m.gpus:
            return Check("torch", "fail", f"{m.torch} is a CPU build, but the driver sees {m.gpus} GPU(s)",
                         "install a CUDA build of torch that the driver supports: pip install torch --index-url "
                         "https://download.pytorch.org/whl/cu126 (or the cuXYZ of your driver's CUDA)")
        return Check("torch", "ok", f"{m.torch} (CPU build); no GPU: batches stay on the CPU")
    built = tuple(int(p) for p in m.torch_cuda.split(".")[:2])
    detail = f"{m.torch}, built for CUDA {m.torch_cuda}"
    if not m.gpus:
        return Check("torch", "ok", f"{detail}; no GPU visible: batches stay on the CPU")
    if m.driver_cuda is not None:
        driver = (m.driver_cuda // 1000, m.driver_cuda % 1000 // 10)
        if driver[0] < built[0]:
            return Check("torch", "fail", f"{detail}; the driver supports CUDA {_cuda_text(m.driver_cuda)} only",
                         f"upgrade the driver, or install a torch built for CUDA {driver[0]}.x "
                         f"(pip install torch --index-url https://download.pytorch.org/whl/cu{driver[0]}{driver[1]})")
        if driver < built:  # minor-version compatibility: runs, but kernels JIT-compiled from PTX can fail
            return Check("torch", "warn", f"{detail}; the driver supports CUDA {_cuda_text(m.driver_cuda)} "
                         "(minor-version compatibility: PTX-only kernels may fail)",
                         f"upgrade the driver or install a torch built for CUDA <= {_cuda_text(m.driver_cuda)}")
    if m.compute_capability is not None and m.torch_archs:
        major, minor = m.compute_capability
        sm = f"sm_{major}{minor}"
        # A cubin runs on its major's later minors (sm_80 on an 8.6); PTX (compute_XY) JIT-compiles for later GPUs.
        sms = [found.groups() for a in m.torch_archs if (found := re.fullmatch(r"sm_(\d+)(\d)[a-z]?", a))]
        binary = [a for a in sms if int(a[0]) == major and int(a[1]) <= minor]
        ptx = [a for a in m.torch_archs if (found := re.fullmatch(r"compute_(\d+)[a-z]?", a))
               and int(found.group(1)) <= major * 10 + minor]
        if not binary and not ptx:
            return Check("torch", "fail", f"{detail}; no kernels for this GPU ({sm}): it has "
                         f"{', '.join(m.torch_archs)}", f"install a torch build whose architectures include {sm} "
                         "(a newer torch, or the cuXYZ wheel for this GPU)")
        if not binary:
            return Check("torch", "warn", f"{detail}; {sm} only through PTX (JIT-compiled at start)",
                         f"install a torch build with {sm} kernels")
    return Check("torch", "ok", f"{detail}; sees {m.gpus} GPU(s)")


def check_driver(m: Machine) -> Check:
    if m.dali is None:
        return Check("driver", "warn", f"DALI is not installed (driver {m.driver or 'none'}): every file goes "
                     "through the PyAV fallback", INSTALL_HINT)
    extra, oldest, api = DALI_WHEELS[m.dali]
    wheel = f"{m.dali} {m.dali_version} (daliload[{extra}]) needs driver >= {oldest} (CUDA {_cuda_text(api)})"
    if m.driver is None and m.driver_cuda is None:
        return Check("driver", "skip", f"no NVIDIA driver: {wheel}; here DALI runs its CPU decoder only")
    major = int(m.driver.split(".")[0]) if m.driver and m.driver.split(".")[0].isdigit() else None
    too_old = (major is not None and major < oldest) or (m.driver_cuda is not None and m.driver_cuda < api)
    found = f"driver {m.driver or '?'} (CUDA {_cuda_text(m.driver_cuda) if m.driver_cuda else '?'})"
    if not too_old:
        return Check("driver", "ok", f"{found}; {wheel}")
    other = [(n, e, o) for n, (e, o, a) in DALI_WHEELS.items()
             if n != m.dali and (major is None or major >= o) and (m.driver_cuda is None or m.driver_cuda >= a)]
    if other:
        name, other_extra, other_oldest = other[0]
        fix = (f"pip uninstall -y {m.dali} && pip install 'daliload[{other_extra}]' (driver >= {other_oldest}), "
               f"or upgrade the driver to >= {oldest}")
    else:
        fix = f"upgrade the driver to >= {oldest}; until then decoder='fallback' decodes everything with PyAV"
    return Check("driver", "fail", f"{found} is too old: {wheel}", fix)


def check_gpu(m: Machine) -> Check:
    gpu = m.gpu
    if gpu is None:
        return Check("gpu", "skip", "no GPU visible: DALI runs its CPU decoder (VP8, VP9, MJPEG), "
                     "the PyAV fallback decodes the rest")
    cc = f"compute capability {m.compute_capability[0]}.{m.compute_capability[1]}" \
        if m.compute_capability else "compute capability unknown (torch does not see the GPU)"
    count = f"{m.gpus} x " if m.gpus > 1 else ""
    if gpu.model is None:
        return Check("gpu", "warn", f"{count}{m.gpu_name}, {cc}; not a model daliload knows: routes assume NVDEC "
                     f"{gpu.generation} (no AV1), 1 DALI pipeline a rank",
                     "name its NVDEC: daliload scan --gpu-model GENERATION, DecodeSpec(dali_pipelines=N) "
                     "with its engine count")
    engines = gpu.nvdec_engines
    pipelines = f"{engines} NVDEC engines: {engines} DALI pipelines a rank" if engines else \
        "NVDEC engines not in daliload.prescreen.gpus: 1 DALI pipeline a rank (DecodeSpec(dali_pipelines=N) sets it)"
    return Check("gpu", "ok", f"{count}{gpu.model} ({m.gpu_name}), {cc}, NVDEC {gpu.generation}; {pipelines}")


def _capability_text(target: str) -> str:
    return ", ".join(DALI_CAPABILITIES[target])


def check_nvdec_codecs(m: Machine) -> Check:
    gpu = m.gpu
    if gpu is None:
        return Check("nvdec codecs", "skip", f"no GPU: DALI's CPU decoder takes {_capability_text('cpu')}; "
                     "the PyAV fallback takes h264, hevc, av1, mpeg4 and the rest")
    codecs = _capability_text(gpu.route_target)
    av1 = "" if gpu.decodes_av1 else (f"; no AV1 on NVDEC {gpu.generation} ({gpu.model or 'assumed'}): "
                                      "AV1 files go to the PyAV fallback")
    return Check("nvdec codecs", "ok", f"DALI on NVDEC: {codecs}{av1}")


def check_nvcuvid(m: Machine) -> Check:
    if not m.gpus:
        return Check("libnvcuvid", "skip", "no GPU: NVDEC's library is not needed")
    error = load_nvcuvid()
    if error is None:
        return Check("libnvcuvid", "ok", "libnvcuvid.so.1 loads")
    return Check("libnvcuvid", "fail", f"libnvcuvid.so.1 does not load ({error}): every DALI batch on the GPU "
                 "would fail", "in a container, give it the driver's video libraries: NVIDIA_DRIVER_CAPABILITIES="
                 "compute,utility,video (docker run --gpus all -e NVIDIA_DRIVER_CAPABILITIES=all); on a host, "
                 "install the driver's libnvidia-decode package")


def check_dali_decode(m: Machine, timeout_s: float | None) -> Check:
    # Not imported here: a DALI that crashes or hangs at import does so in the child, under its time limit.
    if m.dali is None:
        return Check("dali decode", "skip", "DALI is not installed: nothing to decode with", INSTALL_HINT)
    if timeout_s is None:
        return Check("dali decode", "skip", "not asked for (--no-decode)")
    device: Literal["gpu", "cpu"] = "gpu" if m.gpus and m.torch_cuda else "cpu"
    worked, detail = decode_one_clip(device, timeout_s)
    if worked:
        return Check("dali decode", "ok", detail)
    fix = ("check the driver, libnvcuvid and the DALI wheel above; decoder='fallback' trains without DALI meanwhile"
           if device == "gpu" else "reinstall DALI (" + INSTALL_HINT + "); decoder='fallback' trains without it")
    return Check("dali decode", "fail", detail, fix)


def check_pyav() -> Check:
    try:
        import av
    except ImportError as err:
        return Check("pyav", "fail", f"PyAV does not import ({err}): the fallback cannot decode",
                     "pip install 'av>=12'")
    avcodec = ".".join(map(str, av.library_versions.get("libavcodec", ())))
    ffmpeg = getattr(av, "ffmpeg_version_info", "?")
    missing = []
    for codec in FALLBACK_CODECS:
        try:
            av.codec.Codec(codec, "r")
        except ValueError:  # av.codec.codec.UnknownCodecError: this FFmpeg build has no such decoder
            missing.append(codec)
    detail = f"PyAV {av.__version__}, FFmpeg {ffmpeg} (libavcodec {avcodec})"
    if missing:
        return Check("pyav", "warn", f"{detail}; no decoder for {', '.join(missing)}: those files fail in the "
                     "fallback", "install PyAV's own wheel (pip install --force-reinstall av), whose FFmpeg has them")
    return Check("pyav", "ok", f"{detail}; decodes {', '.join(FALLBACK_CODECS)}")


def check_start_method(m: Machine) -> Check:
    if m.start_method == "forkserver":
        return Check("start method", "ok", "forkserver: workers start from a process with torch, av and numpy "
                     "loaded; never fork")
    return Check("start method", "ok", f"{m.start_method} (no forkserver here): each worker imports torch at its "
                 "start, a few seconds; never fork")


def diagnose(m: Machine, w: Workload, *, decode_timeout_s: float | None = DECODE_TIMEOUT_S) -> list[Check]:
    """Every check of :data:`CHECKS`, in order, for ``m`` running ``w``.

    Args:
        decode_timeout_s: limit of the one-clip DALI decode, seconds; None skips it.
    """
    return [check_python(m), check_torch(m), check_driver(m), check_gpu(m), check_nvdec_codecs(m),
            check_nvcuvid(m), check_dali_decode(m, decode_timeout_s), check_pyav(), check_shared_memory(m, w),
            check_dev_shm(m, w), check_cores(m, w), check_start_method(m)]


def decoders_here(m: Machine) -> str:
    """One line: which decoder takes what on this machine."""
    if m.dali is None:
        return "no DALI: the PyAV fallback decodes every file"
    gpu = m.gpu
    if gpu is None:
        return f"no GPU: DALI's CPU decoder takes {_capability_text('cpu')}, the PyAV fallback the rest"
    return f"DALI on NVDEC takes {_capability_text(gpu.route_target)}, the PyAV fallback the rest"


def verdict(checks: Sequence[Check]) -> str:
    failed = [c.name for c in checks if c.status == "fail"]
    warned = [c.name for c in checks if c.status == "warn"]
    counts = f"{len(failed)} failed, {len(warned)} warning(s)"
    if failed:
        return f"{counts}: fix {', '.join(failed)} first"
    if warned:
        return f"{counts}: daliload runs here; the warnings ({', '.join(warned)}) cost speed or risk a failure"
    return f"{counts}: daliload runs here"


def table(checks: Sequence[Check]) -> str:
    """The checks as aligned columns (the fix on its own line under its check when there is one)."""
    width = max(len(c.name) for c in checks)
    lines = [f"{'check':<{width}}  {'status':<6}  detail"]
    for c in checks:
        lines.append(f"{c.name:<{width}}  {c.status:<6}  {c.detail}")
        if c.fix:
            lines.append(f"{'':<{width}}  {'':<6}  fix: {c.fix}")
    return "\n".join(lines)


# --- the command -----------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    loader = "(as KineticsDALILoader's default)"
    parser.add_argument("--batch-size", type=int, default=32, help=f"clips per batch, default 32 {loader}")
    parser.add_argument("--clip-len", type=int, default=16, help=f"frames per clip, default 16 {loader}")
    parser.add_argument("--crop-size", type=int, default=224, help=f"output side in pixels, default 224 {loader}")
    parser.add_argument("--workers", type=int, default=DecodeSpec().fallback_workers,
                        help=f"DecodeSpec.fallback_workers, default {DecodeSpec().fallback_workers}")
    parser.add_argument("--local-ranks", type=int, default=None,
                        help="training processes on this machine; default LOCAL_WORLD_SIZE, else the GPUs, else 1")
    parser.add_argument("--dtype", choices=OUTPUT_DTYPES, default="float32", help="OutputSpec.dtype, default float32")
    parser.add_argument("--decode-timeout", type=float, default=DECODE_TIMEOUT_S,
                        help=f"seconds the one-clip DALI decode may take, default {DECODE_TIMEOUT_S:g}")
    parser.add_argument("--no-decode", action="store_true", help="skip the one-clip DALI decode")
    parser.add_argument("--json", action="store_true", help="print one JSON object (machine, options, checks)")


def run(args: argparse.Namespace) -> int:
    machine = gather()
    try:
        workload = Workload(batch_size=args.batch_size, clip_len=args.clip_len, crop_size=args.crop_size,
                            fallback_workers=args.workers, dtype=args.dtype,
                            local_ranks=args.local_ranks if args.local_ranks is not None
                            else default_local_ranks(machine))
    except ValueError as err:
        print(f"daliload doctor: {err}", file=sys.stderr)
        return 2
    checks = diagnose(machine, workload, decode_timeout_s=None if args.no_decode else args.decode_timeout)
    failed = any(c.status == "fail" for c in checks)
    if args.json:
        print(json.dumps({"machine": dataclasses.asdict(machine), "decoders": decoders_here(machine),
                          "workload": dataclasses.asdict(workload), "checks": [dataclasses.asdict(c) for c in checks],
                          "verdict": verdict(checks), "ok": not failed}, indent=1))
    else:
        print(table(checks))
        print(f"decoders: {decoders_here(machine)}")
        print(f"verdict: {verdict(checks)}")
    return 1 if failed else 0
