"""What a GPU visit checks before it spends its time: the preflight (call 1) and the smoke (once DALI is in).

Run by ``run_gpu_bench.sh`` (``--preflight``, ``--smoke``); on its own::

    python3 checks.py preflight [--flavour cuda13] [--site SITE] [--out DIR]
    python3 checks.py smoke [--out DIR]
    python3 checks.py nvdec-caps            # one JSON line: what NVDEC decodes on GPU 0 (the preflight's child)

The preflight uses the standard library and the machine's torch; it looks, in
the first call, for what would fail everything later:

- the driver against the DALI build (``cuda13``: driver >= 580, CUDA 13.0);
- ``libcuda.so.1`` and ``libnvcuvid.so.1``: DALI opens NVDEC's library only at
  its first GPU decode, so without it every NVDEC row would fail at the end.
  Not fatal: the visit goes on with what needs no NVDEC (the fallback's and
  the merge's GPU tests, the merge's timing, the CPU peers);
- the packages the transfer plan leaves out because the host's image has them;
- ``nvidia`` as one namespace: a package put first on ``sys.path`` beside the
  machine's own ``nvidia.*`` must import with each of them;
- disk space, pip, and the wheels' tags against this Python;
- what NVDEC decodes here (``cuvidGetDecoderCaps`` for each codec: supported,
  engines, sizes), asked in a child process so a crash there costs one line.

The smoke imports DALI beside the machine's ``nvidia`` packages and decodes an
H.264 clip and an AV1 clip on NVDEC through daliload's decoder, checking the
frames; the AV1 outcome is set against daliload's NVDEC table for this GPU.

Each prints one line per check (``ok``, ``FAIL`` or ``info``) and writes
``preflight.json`` / ``smoke.json`` to ``--out``. Exit 0 when nothing fatal
failed (a missing NVDEC is reported, not fatal), 1 otherwise.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
#: Oldest driver each DALI flavour runs on, and the CUDA driver API version (cuDriverGetVersion) it needs.
DRIVER_MIN = {"cuda13": (580, 13000), "cuda12": (525, 12000)}
#: cudaVideoCodec values of NVIDIA's Video Codec SDK (cuviddec.h), and the bit depths asked for.
NVDEC_CODECS = {"mpeg4": (2, (8,)), "h264": (4, (8,)), "hevc": (8, (8, 10)), "vp8": (9, (8,)),
                "vp9": (10, (8, 10)), "av1": (11, (8, 10))}
CHROMA_420 = 1
MIN_FREE_BYTES = 3 << 30


class Report:
    """Check lines, printed as they come and kept for the JSON."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.checks: list[dict] = []

    def add(self, check: str, state: str, detail: str, *, fatal: bool = True, **facts) -> None:
        """One check's line; a ``FAIL`` that is not ``fatal`` is reported and the visit goes on."""
        self.checks.append({"check": check, "state": state, "detail": detail, "fatal": fatal, **facts})
        print(f"  {state:<4} {check}: {detail}", flush=True)

    @property
    def failed(self) -> list[str]:
        """The fatal checks that failed."""
        return [c["check"] for c in self.checks if c["state"] == "FAIL" and c["fatal"]]

    @property
    def degraded(self) -> list[str]:
        """The checks that failed without stopping the visit (no NVDEC: its rows cannot run)."""
        return [c["check"] for c in self.checks if c["state"] == "FAIL" and not c["fatal"]]

    def write(self, out: Path | None) -> int:
        verdict = f"{len(self.failed)} check(s) failed: {', '.join(self.failed)}" if self.failed else "all ok"
        if self.degraded and not self.failed:
            verdict = (f"no fatal failure; {', '.join(self.degraded)} failed: the visit goes on with what needs no "
                       f"NVDEC")
        print(f"== {self.name}: {verdict}", flush=True)
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            (out / f"{self.name}.json").write_text(json.dumps({"checks": self.checks, "failed": self.failed,
                                                               "degraded": self.degraded}, indent=1),
                                                   encoding="utf-8")
        return 1 if self.failed else 0


# --- NVDEC capabilities (a child process) ------------------------------------------------------


class _DecodeCaps(ctypes.Structure):
    """``CUVIDDECODECAPS`` of cuviddec.h (88 bytes): codec, chroma and bit depth in; the rest out."""

    _fields_ = [("codec", ctypes.c_int), ("chroma", ctypes.c_int), ("bit_depth_minus8", ctypes.c_uint),
                ("reserved1", ctypes.c_uint * 3), ("supported", ctypes.c_ubyte), ("nvdecs", ctypes.c_ubyte),
                ("output_formats", ctypes.c_ushort), ("max_width", ctypes.c_uint), ("max_height", ctypes.c_uint),
                ("max_mb_count", ctypes.c_uint), ("min_width", ctypes.c_ushort), ("min_height", ctypes.c_ushort),
                ("histogram", ctypes.c_ubyte), ("counter_bits", ctypes.c_ubyte),
                ("max_histogram_bins", ctypes.c_ushort), ("reserved3", ctypes.c_uint * 10)]


def nvdec_caps() -> dict:
    """What NVDEC of GPU 0 decodes, per codec and bit depth (4:2:0), from the driver itself.

    Returns ``{"error": why}`` when a library or the context is missing.
    """
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        cuvid = ctypes.CDLL("libnvcuvid.so.1")
    except OSError as err:
        return {"error": f"cannot load the driver's libraries: {err}"}
    device, context = ctypes.c_int(), ctypes.c_void_p()
    for call, args in (("cuInit", (0,)), ("cuDeviceGet", (ctypes.byref(device), 0)),
                       ("cuDevicePrimaryCtxRetain", (ctypes.byref(context), device)),
                       ("cuCtxSetCurrent", (context,))):
        code = getattr(cuda, call)(*args)
        if code != 0:
            return {"error": f"{call} returned CUDA error {code}"}
    caps = {}
    for codec, (number, depths) in NVDEC_CODECS.items():
        for depth in depths:
            query = _DecodeCaps(codec=number, chroma=CHROMA_420, bit_depth_minus8=depth - 8)
            code = cuvid.cuvidGetDecoderCaps(ctypes.byref(query))
            caps[f"{codec}-{depth}bit"] = ({"error": f"cuvidGetDecoderCaps returned {code}"} if code != 0 else
                                           {"supported": bool(query.supported), "engines": query.nvdecs,
                                            "min": [query.min_width, query.min_height],
                                            "max": [query.max_width, query.max_height]})
    return {"caps": caps}


# --- preflight -----------------------------------------------------------------------------------


def _driver(report: Report, flavour: str) -> None:
    want, want_api = DRIVER_MIN[flavour]
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError) as err:
        report.add("driver", "FAIL", f"nvidia-smi did not answer ({err}): no usable GPU driver")
        return
    version, _, gpu = out[0].partition(", ")
    major = int(version.split(".")[0]) if version.split(".")[0].isdigit() else 0
    state = "ok" if major >= want else "FAIL"
    report.add("driver", state, f"{version} on {gpu} ({flavour} DALI needs >= {want})", driver=version, gpu=gpu)
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as err:
        report.add("libcuda", "FAIL", f"libcuda.so.1 does not load: {err}")
        return
    api = ctypes.c_int()
    cuda.cuDriverGetVersion(ctypes.byref(api))
    report.add("libcuda", "ok" if api.value >= want_api else "FAIL",
               f"CUDA driver API {api.value // 1000}.{api.value % 1000 // 10} ({flavour} needs "
               f"{want_api // 1000}.{want_api % 1000 // 10})", cuda_driver_api=api.value)


def _nvcuvid(report: Report) -> None:
    try:
        ctypes.CDLL("libnvcuvid.so.1")
    except OSError as err:
        report.add("libnvcuvid", "FAIL", f"libnvcuvid.so.1 does not load ({err}): DALI opens it at its first GPU "
                   "decode, so every NVDEC row would fail; the container needs the driver's video libraries "
                   "(NVIDIA_DRIVER_CAPABILITIES including 'video'). The visit goes on with the tests and "
                   "measurements that need no NVDEC", fatal=False)
        return
    report.add("libnvcuvid", "ok", "libnvcuvid.so.1 loads")
    try:
        child = subprocess.run([sys.executable, str(Path(__file__)), "nvdec-caps"], capture_output=True, text=True,
                               timeout=60)
        result = json.loads(child.stdout.strip().splitlines()[-1]) if child.stdout.strip() else \
            {"error": f"exit {child.returncode}: {child.stderr.strip()[-300:]}"}
    except (subprocess.SubprocessError, json.JSONDecodeError) as err:
        result = {"error": str(err)}
    if "error" in result:
        report.add("nvdec", "info", f"capabilities not read: {result['error']}")
        return
    caps = result["caps"]
    said = ", ".join(f"{name} {'yes' if c.get('supported') else 'no'}" for name, c in caps.items())
    engines = max((c.get("engines", 0) for c in caps.values()), default=0)
    report.add("nvdec", "info", f"{engines} engines; {said}", caps=caps)


def _torch(report: Report) -> None:
    try:
        import torch
    except ImportError as err:
        report.add("torch", "FAIL", f"torch does not import: {err}")
        return
    if not torch.cuda.is_available():
        report.add("torch", "FAIL", f"torch {torch.__version__} sees no CUDA device")
        return
    name = torch.cuda.get_device_name()
    report.add("torch", "ok", f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees {name}, compute "
               f"capability {'.'.join(map(str, torch.cuda.get_device_capability()))}", gpu=name)


def _host_packages(report: Report) -> None:
    from visit import HOST_PACKAGES
    from wheelhouse import normalize, read_lock

    lock = {normalize(e.name): e for e in read_lock()}
    missing = []
    for name in sorted(HOST_PACKAGES):
        try:
            importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(lock[name].file if name in lock else name)
    report.add("host packages", "FAIL" if missing else "ok",
               f"not installed here, carry them: {', '.join(missing)}" if missing else
               f"all {len(HOST_PACKAGES)} the transfer plan leaves out are installed")


def machine_nvidia_folders(skip: Path | None = None) -> list[Path]:
    """The ``nvidia`` folders on ``sys.path`` (the machine's), without ``skip/nvidia``."""
    found = []
    for entry in sys.path:
        folder = Path(entry or ".") / "nvidia"
        if folder.is_dir() and (skip is None or folder.resolve() != (skip / "nvidia").resolve()):
            found.append(folder)
    return found


def _namespace(report: Report, site: Path | None) -> None:
    from wheelhouse import NAMESPACE_INIT

    folders = machine_nvidia_folders(site)
    regular = [str(f) for f in folders if (f / "__init__.py").is_file()]
    subpackages = sorted({p.name for f in folders for p in f.iterdir()
                          if p.is_dir() and p.name.isidentifier() and not p.name.startswith("_")})
    report.add("nvidia folders", "info", f"{len(folders)} on sys.path, {len(regular)} regular "
               f"({', '.join(regular) or 'none'}); subpackages: {', '.join(subpackages) or 'none'}",
               folders=[str(f) for f in folders], regular=regular, subpackages=subpackages)
    code = ("import importlib, sys\n"
            "names = sys.argv[1:]\n"
            "bad = []\n"
            "for name in ['daliload_probe'] + names:\n"
            "    try:\n"
            "        importlib.import_module('nvidia.' + name)\n"
            "    except ImportError as err:\n"
            "        bad.append(f'nvidia.{name}: {err}')\n"
            "print('; '.join(bad))\n")
    outcomes = {}
    with tempfile.TemporaryDirectory() as tmp:
        for way, init in (("with the extending __init__.py", NAMESPACE_INIT), ("as a bare namespace folder", None)):
            root = Path(tmp) / way.replace(" ", "_")
            (root / "nvidia" / "daliload_probe").mkdir(parents=True)
            (root / "nvidia" / "daliload_probe" / "__init__.py").write_text("")
            if init is not None:
                (root / "nvidia" / "__init__.py").write_text(init)
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
            child = subprocess.run([sys.executable, "-c", code, *subpackages], capture_output=True, text=True,
                                   env=env, timeout=120)
            outcomes[way] = child.stdout.strip() if child.returncode == 0 else child.stderr.strip()[-300:]
    ours = outcomes["with the extending __init__.py"]
    report.add("nvidia namespace", "FAIL" if ours else "ok",
               f"a package carried first on sys.path and the machine's {len(subpackages)} nvidia.* import together"
               if not ours else f"imports fail: {ours}", outcomes=outcomes)


def _disk_and_pip(report: Report, site: Path | None) -> None:
    for what, path in (("site", (site or Path(tempfile.gettempdir())).parent), ("checkout", REPO)):
        free = shutil.disk_usage(path).free
        report.add(f"disk ({what})", "ok" if free >= MIN_FREE_BYTES else "FAIL",
                   f"{free / (1 << 30):.1f} GiB free at {path} (needs {MIN_FREE_BYTES >> 30})")
    pip = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, text=True, timeout=60)
    report.add("pip", "ok" if pip.returncode == 0 else "FAIL",
               pip.stdout.strip() if pip.returncode == 0 else f"python -m pip fails: {pip.stderr.strip()[-200:]}")


def _wheel_tags(report: Report, flavour: str) -> None:
    from pieces import read_transfer, wheel_of
    from wheelhouse import _supported_tags, wheel_fits

    rows = read_transfer(flavour) or []
    supported = _supported_tags()
    wheels = [wheel_of(rows, r.name) for r in rows if r.kind == "member"]  # an .xz member: the wheel it gives
    unfit = [name for name in wheels if not wheel_fits(name, supported)]
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    report.add("python", "FAIL" if unfit else "ok",
               f"Python {python}; " + (f"these wheels do not fit it: {', '.join(unfit)}" if unfit else
                                       f"all {sum(r.kind == 'member' for r in rows)} carried wheels fit it"))


def _pyav(report: Report) -> None:
    if importlib.util.find_spec("av") is None:
        report.add("PyAV", "info", "not installed yet (it comes with piece 1)")
        return
    code = ("import av\n"
            "encoders = [n for n in ('libsvtav1', 'libaom-av1') if n in av.codecs_available]\n"
            "print(av.__version__, ','.join(encoders))\n")
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    if child.returncode != 0:
        report.add("PyAV", "FAIL", f"import av fails: {child.stderr.strip()[-300:]}")
        return
    version, _, encoders = child.stdout.strip().partition(" ")
    report.add("PyAV", "ok", f"PyAV {version}; AV1 encoders: {encoders or 'none (the smoke cannot make an AV1 clip)'}")


def preflight(flavour: str, site: Path | None, out: Path | None) -> int:
    report = Report("preflight")
    _driver(report, flavour)
    _nvcuvid(report)
    _torch(report)
    _wheel_tags(report, flavour)
    _host_packages(report)
    _namespace(report, site)
    _disk_and_pip(report, site)
    _pyav(report)
    return report.write(out)


# --- smoke ---------------------------------------------------------------------------------------


def _decode(path: Path, num_frames: int, windows: list[tuple[int, int]], *, size: tuple[int, int] = (144, 192),
            device: str = "gpu", clip_len: int = 8) -> str:
    """Decode ``windows`` of ``path`` with daliload's DALI decoder; '' when every frame is the planned one.

    Otherwise what went wrong: DALI's reason, a decoder that cannot start
    (no GPU), a time-out, or the frames that differ from the plan.
    """
    from daliload.framecode import read_clip
    from daliload.dali import DaliBatchError, DaliClipDecoder, DaliTimeoutError
    from daliload.plan import CropBox, OutputSpec, Sample

    samples = [Sample(position=i, video_index=0, path=str(path), label=0, start_frame=start, frame_stride=stride,
                      clip_len=clip_len, crop=CropBox.full()) for i, (start, stride) in enumerate(windows)]
    raw = OutputSpec(size=size, mean=(0, 0, 0), std=(1, 1, 1), dtype="float32", layout="CTHW")
    try:
        with DaliClipDecoder(raw, batch_size=len(samples), device=device, num_threads=4,
                             num_frames={str(path): num_frames}) as decoder:
            batch = decoder.decode_batch(samples, timeout_s=60)
            got = [read_clip(clip.cpu(), layout="CTHW") for clip in batch.videos]  # .cpu() waits for the stream
    except DaliBatchError as err:
        return f"DALI failed: {err.reason}"
    except (DaliTimeoutError, RuntimeError, ValueError) as err:
        return f"{type(err).__name__}: {err}"
    wrong = [(s.frame_indices(num_frames), g) for s, g in zip(samples, got) if g != s.frame_indices(num_frames)]
    return "" if not wrong else f"wrong frames (planned, got): {wrong}"


def smoke(out: Path | None) -> int:
    report = Report("smoke")
    try:
        import nvidia.dali
    except ImportError as err:
        where = getattr(sys.modules.get("nvidia"), "__path__", None)
        report.add("import nvidia.dali", "FAIL", f"{err}; nvidia.__path__ = {where}")
        return report.write(out)
    import nvidia

    machine = [p for p in machine_nvidia_folders() if not (p / "dali").is_dir()]
    others = sorted({p.name for f in machine for p in f.iterdir() if p.is_dir() and p.name.isidentifier()
                     and not p.name.startswith("_")})
    failed = []
    for name in others:
        try:
            importlib.import_module(f"nvidia.{name}")
        except ImportError as err:
            failed.append(f"nvidia.{name}: {err}")
    report.add("import nvidia.dali", "FAIL" if failed else "ok",
               f"DALI {nvidia.dali.__version__} beside the machine's nvidia.{{{', '.join(others)}}}"
               + (f"; but {'; '.join(failed)}" if failed else ""), nvidia_path=list(nvidia.__path__))
    from daliload.prescreen.gpus import detect_gpu
    from daliload.synth import default_spec, render_clip, write_video

    target = detect_gpu()
    with tempfile.TemporaryDirectory() as tmp:
        for codec in ("h264", "av1"):
            path = Path(tmp) / f"smoke.{default_spec(codec).extension}"
            try:
                write_video(path, render_clip(1, 90, width=192, height=144, fps=30.0, seed=0),
                            default_spec(codec, gop=30))
            except Exception as err:  # noqa: BLE001 - an encoder PyAV lacks: say so, go on with the other codec
                report.add(f"decode {codec}", "FAIL" if codec == "h264" else "info", f"cannot make the clip: {err}")
                continue
            problem = _decode(path, 90, [(0, 1), (40, 3), (70, 4)])
            if codec == "h264":
                report.add("decode h264", "FAIL" if problem else "ok",
                           problem or "3 windows (one past the end) decoded on NVDEC with the planned frames")
            else:
                table = "decodes AV1" if target.decodes_av1 else "has no AV1"
                agree = (not problem) == target.decodes_av1
                report.add("decode av1", "info" if agree else "FAIL",
                           f"{'decoded' if not problem else problem}; daliload's table says {target.describe()} "
                           f"{table}: {'agrees' if agree else 'DISAGREES: fix daliload/prescreen/gpus.py'}",
                           decoded=not problem, table_says=target.decodes_av1, generation=target.generation)
    return report.write(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("preflight")
    p.add_argument("--flavour", choices=sorted(DRIVER_MIN), default="cuda13")
    p.add_argument("--site", type=Path, default=None)
    p.add_argument("--out", type=Path, default=None)
    p = sub.add_parser("smoke")
    p.add_argument("--out", type=Path, default=None)
    sub.add_parser("nvdec-caps")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    if args.command == "nvdec-caps":
        print(json.dumps(nvdec_caps()))
        return 0
    if args.command == "preflight":
        return preflight(args.flavour, args.site, args.out)
    sys.path.insert(0, str(REPO))
    return smoke(args.out)


if __name__ == "__main__":
    sys.exit(main())
