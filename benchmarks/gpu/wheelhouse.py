"""Wheels for a GPU machine that cannot reach a package registry: split, reassemble, check, install.

Standard library only: it runs on the GPU machine before anything is installed.
``run_gpu_bench.sh`` beside it drives it; it also runs on its own::

    python3 wheelhouse.py pack --wheels DIR [--flavour cuda13]   # here: the transfer pieces + transfer-FLAVOUR.tsv
    python3 wheelhouse.py split FILE [--piece-mb 60]    # here: FILE.part-aa, -ab, ... + FILE.sha256
    python3 wheelhouse.py assemble --wheels DIR          # there: pieces -> FILE, sha256 checked
    python3 wheelhouse.py check --wheels DIR [--flavour cuda13|cuda12]   # changes nothing
    python3 wheelhouse.py install --wheels DIR --site SITE [--flavour ...]

``transfer-FLAVOUR.tsv`` beside this file (written by ``pack``, tracked in git)
lists the pieces, each at most 60 MB, that carry the wheels to a machine that
receives one piece per transfer, in the order to send them: the wheels over
60 MB cut into ``FILE.part-aa, -ab, ...``, the others in one tar bundle
(``wheels-small-FLAVOUR.tar``, cut the same way). ``check`` names every piece
still missing; ``install`` joins the pieces, unpacks the bundle, checks every
sha256 and installs.

``wheels.lock`` beside this file lists every package the GPU run needs, with
the exact file (for CPython 3.12 on x86-64) and its sha256. A package already
installed (at any version) is used as is; the others are installed with
``pip install --no-index --no-deps --target SITE`` into a separate folder that
is put first on ``PYTHONPATH``: the machine's own packages (torch, numpy) are
never replaced or upgraded. Other ``*.whl`` files in the folder that the lock
does not name (a torchcodec build matching the machine's torch, say) are
installed the same way when their package is not installed yet.

Exit codes: 0 fine, 2 pieces that do not add up, 3 required wheels missing,
4 pip or the import check failed.

Wheels that ship ``nvidia/__init__.py`` (nvimgcodec, nvjpeg2k, nvtiff do) would
make ``SITE/nvidia`` a regular package that hides the machine's own
``nvidia.*`` namespace packages (``nvidia.cudnn`` of a CUDA torch); ``install``
deletes that file so ``nvidia`` stays a namespace package.

Test hooks: ``DALILOAD_BENCH_IGNORE_INSTALLED=name,name`` treats those packages
as not installed; ``DALILOAD_BENCH_LOCK=FILE`` reads another lock file;
``DALILOAD_BENCH_TRANSFER=FILE`` another transfer plan.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from pieces import (_PIECE, PIECE_MB, TransferRow, _bad_pieces, _bundle, _file_rows, _plan_rows, _suffix,
                    bundle_name, pending_files, read_transfer, sha256_of, split, transfer_path, unpack_bundles)

HERE = Path(__file__).resolve().parent
#: manylinux tags pip download needs to pick the x86-64 wheels of wheels.lock
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux_2_12_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64")
WHY_OPTIONAL = {
    "psutil": "peak RSS and CPU of DataLoader workers (without it: the main process only)",
    "nvidia-ml-py": "NVDEC utilisation and GPU memory through NVML (without it: nvidia-smi)",
    "decord": "the decord-cpu peer",
}


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pack(folder: Path, flavour: str, piece_mb: int = PIECE_MB) -> list[TransferRow]:
    """Cut the flavour's wheels in ``folder`` into transfer pieces; write and return the transfer plan.

    Wheels over ``piece_mb`` MB are split; the others go into one tar bundle,
    split in turn when it is over ``piece_mb`` MB. Every wheel of wheels.lock
    for the flavour must be in ``folder`` (ValueError names the ones that are not).
    """
    entries = [e for e in read_lock() if e.flavour in ("any", flavour)]
    absent = [e.file for e in entries if not (folder / e.file).is_file()]
    if absent:
        raise ValueError(f"not in {folder}: {', '.join(absent)} (download them first, see README.md)")
    limit = piece_mb * 1000 * 1000
    big = [folder / e.file for e in entries if (folder / e.file).stat().st_size > limit]
    small = [folder / e.file for e in entries if (folder / e.file).stat().st_size <= limit]
    rows: list[TransferRow] = []
    for path in big:
        rows += _file_rows(path, piece_mb)
    bundle = _bundle(folder, small, bundle_name(flavour))
    rows += _file_rows(bundle, piece_mb)
    rows += [TransferRow("member", p.name, p.stat().st_size, sha256_of(p), bundle.name) for p in small]
    header = (f"# Transfer plan for the {flavour} wheels (written by wheelhouse.py pack; see README.md).\n"
              "# 'piece' rows, in order: one transfer each, into benchmarks/gpu/wheels/.\n"
              "#kind\tname\tbytes\tsha256\tpart_of\n")
    transfer_path(flavour).write_text(header + "".join(
        f"{r.kind}\t{r.name}\t{r.size}\t{r.sha256}\t{r.part_of}\n" for r in rows), encoding="utf-8")
    return rows


def _target_needed(target: TransferRow, rows: list[TransferRow], folder: Path, piece: str) -> str | None:
    """Why the pieces of ``target`` are not needed (it is there whole, or all it holds is installed), or None."""
    whole = folder / target.name
    if piece != target.name and whole.is_file() and whole.stat().st_size == target.size:
        return f"{target.name} is there whole"
    lock = {e.file: e for e in read_lock()}
    wheels = [r.name for r in rows if r.kind == "member" and r.part_of == target.name] or [target.name]
    names = [lock[w].name for w in wheels if w in lock]
    if names and len(names) == len(wheels) and all(_installed(n) is not None for n in names):
        return f"{', '.join(names)} installed"
    return None


def transfer_status(folder: Path, flavour: str) -> tuple[list[str], list[str]]:
    """Lines saying, piece by piece in transfer order, what is there; and the names of the missing pieces."""
    rows = read_transfer(flavour)
    if rows is None:
        return [f"No transfer plan {transfer_path(flavour).name}: pieces cannot be named "
                f"(make one with: wheelhouse.py pack --flavour {flavour})"], []
    targets = {r.name: r for r in rows if r.kind == "file"}
    pieces = [r for r in rows if r.kind == "piece"]
    lines = [f"Transfer pieces ({transfer_path(flavour).name}: {len(pieces)}, in this order, one per transfer, "
             f"into {folder}):"]
    missing = []
    for number, piece in enumerate(pieces, 1):
        path = folder / piece.name
        skip = _target_needed(targets[piece.part_of], rows, folder, piece.name) if piece.part_of in targets else None
        note = ""
        if skip is not None:
            state, note = "-", f": not needed, {skip}"
        elif path.is_file() and path.stat().st_size == piece.size:
            state = "have"
        else:
            state = "MISSING"
            note = f": {path.stat().st_size} bytes, not {piece.size}" if path.is_file() else ""
            missing.append(piece.name)
        lines.append(f"  {number:2d} {state:<7} {piece.name} ({piece.size / 1e6:.1f} MB){note}")
    lines.append(f"{len(missing)} of {len(pieces)} pieces missing" + (f": {', '.join(missing)}" if missing else ""))
    return lines, missing


def keep_nvidia_namespace(site: Path) -> list[str]:
    """Delete ``SITE/nvidia/__init__.py`` that some wheels ship, so ``nvidia`` stays a namespace package.

    A regular ``nvidia`` package first on ``PYTHONPATH`` would hide every
    ``nvidia.*`` package of the machine (``nvidia.cudnn``, ``nvidia.cublas`` of
    a CUDA torch). Returns what was done, for the log.
    """
    package = site / "nvidia"
    init = package / "__init__.py"
    if not init.is_file():
        return []
    code = [line for line in init.read_text(encoding="utf-8", errors="replace").splitlines()
            if line.strip() and not line.lstrip().startswith("#")]
    init.unlink()
    for cached in (package / "__pycache__").glob("__init__.*.pyc"):
        cached.unlink()
    note = f"removed {init} (a wheel ships it) so nvidia stays a namespace package beside the machine's nvidia.*"
    return [note + (f"; it held {len(code)} line(s) of code" if code else "")]


def _lock_hashes() -> dict[str, str]:
    known = {row.name: row.sha256 for row in _plan_rows() if row.kind in ("file", "piece")}
    return known | {entry.file: entry.sha256 for entry in read_lock()}


def expected_sha256(target: Path) -> tuple[str | None, str]:
    """The sha256 ``target`` must have and where that comes from (its .sha256 file, or wheels.lock)."""
    sidecar = target.with_name(target.name + ".sha256")
    if sidecar.exists():
        text = sidecar.read_text(encoding="utf-8").split()
        if not text or not re.fullmatch(r"[0-9a-fA-F]{64}", text[0]):
            raise ValueError(f"{sidecar}: expected '<64 hex digits>  {target.name}', got {' '.join(text)[:80]!r}")
        return text[0].lower(), sidecar.name
    known = _lock_hashes().get(target.name)
    return (known, "wheels.lock") if known else (None, "")


def assemble(folder: Path) -> tuple[list[Path], list[str]]:
    """Join every ``NAME.part-aa, -ab, ...`` in ``folder`` into ``NAME``.

    Returns:
        ``(files assembled or already complete, error messages)``. A file is
        only written when its pieces run ``aa, ab, ...`` without a gap and its
        sha256 matches (``NAME.sha256``, else wheels.lock); without a known
        hash, a ``.whl`` must at least pass a zip integrity test.
    """
    groups: dict[Path, list[tuple[str, Path]]] = {}
    for entry in sorted(folder.iterdir()):
        match = _PIECE.match(entry.name)
        if match and entry.is_file():
            groups.setdefault(folder / match["base"], []).append((match["suffix"], entry))
    done, errors = [], []
    for target, pieces in sorted(groups.items()):
        suffixes = [s for s, _ in pieces]
        wanted = [_suffix(i) for i in range(len(pieces))]
        if suffixes != wanted:
            gap = next(w for w, s in zip(wanted + ["??"], suffixes + ["zz"]) if w != s)
            errors.append(f"{target.name}: piece {target.name}.part-{gap} is missing "
                          f"(have {', '.join('.part-' + s for s in suffixes)})")
            continue
        try:
            want, source = expected_sha256(target)
        except ValueError as err:
            errors.append(str(err))
            continue
        if target.exists() and want and sha256_of(target) == want:
            done.append(target)
            continue
        partial = target.with_name(target.name + ".assembling")
        with open(partial, "wb") as out:
            for _, piece in pieces:
                with open(piece, "rb") as f:
                    while block := f.read(1 << 20):
                        out.write(block)
        if want:
            got = sha256_of(partial)
            if got != want:
                partial.unlink()
                errors.append(f"{target.name}: the {len(pieces)} pieces add up to sha256 {got}, {source} says {want}: "
                              f"a piece is missing, truncated or from another file; copy the pieces again"
                              + _bad_pieces([piece for _, piece in pieces]))
                continue
        elif target.suffix == ".whl":
            try:
                with zipfile.ZipFile(partial) as archive:
                    bad = archive.testzip()
            except zipfile.BadZipFile as err:
                bad = str(err)
            if bad is not None:
                partial.unlink()
                errors.append(f"{target.name}: the {len(pieces)} pieces do not make a valid wheel ({bad}); "
                              f"a piece is missing or truncated (no {target.name}.sha256 to say which)")
                continue
        os.replace(partial, target)
        done.append(target)
    return done, errors


@dataclass(frozen=True)
class LockEntry:
    flavour: str
    name: str
    version: str
    need: str
    file: str
    sha256: str


def read_lock(path: Path | None = None) -> list[LockEntry]:
    """The entries of wheels.lock (or of the file ``DALILOAD_BENCH_LOCK`` names)."""
    path = path or Path(os.environ.get("DALILOAD_BENCH_LOCK") or HERE / "wheels.lock")
    entries = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            entries.append(LockEntry(*line.split("\t")))
    return entries


def _supported_tags() -> set[str] | None:
    try:
        from packaging.tags import sys_tags
    except ImportError:
        try:
            from pip._vendor.packaging.tags import sys_tags
        except ImportError:
            return None
    return {str(tag) for tag in sys_tags()}


def wheel_fits(filename: str, supported: set[str] | None) -> bool:
    """Whether a wheel file name's tags fit this interpreter (True when tags cannot be checked)."""
    if supported is None:
        return True
    parts = filename[:-4].split("-")
    if len(parts) < 5:
        return False
    python, abi, platform = parts[-3], parts[-2], parts[-1]
    return any(f"{p}-{a}-{q}" in supported
               for p in python.split(".") for a in abi.split(".") for q in platform.split("."))


def _wheel_name(filename: str) -> tuple[str, str]:
    parts = filename[:-4].split("-")
    return normalize(parts[0]), parts[1] if len(parts) > 1 else ""


def _installed(name: str) -> str | None:
    ignored = {normalize(n) for n in os.environ.get("DALILOAD_BENCH_IGNORE_INSTALLED", "").split(",") if n}
    if normalize(name) in ignored:
        return None
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class CheckResult:
    to_install: tuple[Path, ...]
    missing_required: tuple[LockEntry, ...]
    missing_optional: tuple[LockEntry, ...]
    lines: tuple[str, ...]


def check(folder: Path, flavour: str, pending: set[str] = frozenset()) -> CheckResult:  # type: ignore[assignment]
    """What is installed, what the folder provides, what is missing (see the module docstring).

    ``pending`` names wheels that are not in the folder yet but that its pieces
    make (see :func:`pending_files`): they count as provided.
    """
    supported = _supported_tags()
    wheels = {}
    present = sorted(folder.glob("*.whl")) if folder.is_dir() else []
    for entry in sorted(set(present) | {folder / name for name in pending if name.endswith(".whl")}):
        if wheel_fits(entry.name, supported):
            wheels.setdefault(_wheel_name(entry.name)[0], []).append(entry)
    lines, to_install, missing_req, missing_opt = [], [], [], []
    named = set()
    for entry in read_lock():
        if entry.flavour not in ("any", flavour):
            continue
        key = normalize(entry.name)
        named.add(key)
        version = _installed(entry.name)
        if version is not None:
            lines.append(f"  ok        {entry.name} {version} (installed)")
            continue
        found = sorted(wheels.get(key, []), key=lambda p: p.name != entry.file)  # the locked file first
        if found:
            to_install.append(found[0])
            later = " (once its pieces are joined)" if not found[0].exists() else ""
            lines.append(f"  to install {entry.name} from {found[0].name}{later}")
        elif entry.need == "required":
            missing_req.append(entry)
            lines.append(f"  MISSING   {entry.name} {entry.version} (required): {entry.file}")
        else:
            missing_opt.append(entry)
            lines.append(f"  missing   {entry.name} {entry.version} (optional: "
                         f"{WHY_OPTIONAL.get(entry.name, 'see README')}): {entry.file}")
    for key, files in sorted(wheels.items()):
        if key not in named and _installed(key) is None:
            to_install.append(files[0])
            lines.append(f"  to install {key} from {files[0].name} (not in wheels.lock; installed with --no-deps)")
    return CheckResult(tuple(to_install), tuple(missing_req), tuple(missing_opt), tuple(lines))


def missing_message(result: CheckResult, folder: Path) -> str:
    """Exactly which files to bring, and the command that fetches them where PyPI is reachable."""
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    entries = list(result.missing_required) + list(result.missing_optional)
    lines = [f"Needed in {folder} (each file whole, or as FILE.part-aa, FILE.part-ab, ... plus FILE.sha256):"]
    for entry in entries:
        tag = "required" if entry.need == "required" else "optional"
        lines.append(f"  {entry.file}    ({entry.name}=={entry.version}, {tag}, sha256 {entry.sha256[:16]}...)")
    if python != "3.12":
        lines.append(f"  (file names are those for CPython 3.12; this is {python}: "
                     f"any wheel of the same name that fits CPython {python} will do)")
    platforms = " ".join(f"--platform {p}" for p in PLATFORMS)
    specs = " ".join(f"{e.name}=={e.version}" for e in entries)
    lines += ["Fetch them where PyPI is reachable, and cut files over 60 MB into pieces:",
              f"  python3 -m pip download --no-deps --only-binary=:all: --python-version {python} "
              f"--implementation cp {platforms} -d wheels {specs}",
              "  for f in wheels/*.whl; do [ $(stat -c %s \"$f\") -gt 60000000 ] && "
              "benchmarks/gpu/run_gpu_bench.sh --split \"$f\" && rm \"$f\"; done"]
    return "\n".join(lines)


def install(paths: list[Path], site: Path) -> int:
    if not paths:
        return 0
    site.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--no-compile",
               "--disable-pip-version-check", "--upgrade", "--target", str(site)] + [str(p) for p in paths]
    print("  " + " ".join(command[:10]) + f" ... ({len(paths)} wheels)", flush=True)
    code = subprocess.call(command)
    for note in keep_nvidia_namespace(site):
        print(f"  {note}", flush=True)
    return code


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("split", help="cut a file into <= 60 MB pieces plus a .sha256")
    p.add_argument("file", type=Path)
    p.add_argument("--piece-mb", type=int, default=PIECE_MB)
    for name in ("pack", "assemble", "check", "install"):
        p = sub.add_parser(name)
        p.add_argument("--wheels", type=Path, default=HERE / "wheels")
        p.add_argument("--flavour", choices=("cuda13", "cuda12"), default="cuda13")
        if name == "install":
            p.add_argument("--site", type=Path, required=True)
        if name == "pack":
            p.add_argument("--piece-mb", type=int, default=PIECE_MB)
    return parser.parse_args(argv)


def _print_pack(rows: list[TransferRow], flavour: str) -> None:
    pieces = [r for r in rows if r.kind == "piece"]
    print(f"{transfer_path(flavour)}: {len(pieces)} pieces, to send in this order, one per transfer:")
    for number, piece in enumerate(pieces, 1):
        print(f"  {number:2d} {piece.name} ({piece.size / 1e6:.1f} MB)")


def _assemble_step(folder: Path, flavour: str) -> int:
    """Join pieces and unpack the bundle; 2 when pieces do not add up."""
    done, errors = assemble(folder) if folder.is_dir() else ([], [])
    for path in done:
        print(f"  assembled {path.name}")
    if errors:
        print("Pieces that do not add up:", file=sys.stderr)
        for error in errors:
            print(f"  {error}", file=sys.stderr)
        return 2
    for name in unpack_bundles(folder, flavour):
        print(f"  unpacked {name}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.command == "split":
        pieces = split(args.file, args.piece_mb)
        print(f"{args.file.name}: {len(pieces)} pieces of at most {args.piece_mb} MB, sha256 in "
              f"{args.file.name}.sha256:")
        for piece in pieces:
            print(f"  {piece}")
        return 0
    if args.command == "pack":
        _print_pack(pack(args.wheels, args.flavour, args.piece_mb), args.flavour)
        return 0
    if args.command == "assemble":
        return _assemble_step(args.wheels, args.flavour)
    pending: set[str] = set()
    if args.command == "check":  # changes nothing: pieces are only looked at
        lines, _ = transfer_status(args.wheels, args.flavour)
        print("\n".join(lines))
        pending = pending_files(args.wheels, args.flavour)
    elif _assemble_step(args.wheels, args.flavour):
        return 2
    result = check(args.wheels, args.flavour, pending)
    print(f"Wheels for the GPU benchmark (DALI flavour {args.flavour}, Python "
          f"{sys.version_info.major}.{sys.version_info.minor}, folder {args.wheels}):")
    print("\n".join(result.lines))
    if result.missing_required or result.missing_optional:
        stream = sys.stderr if result.missing_required else sys.stdout
        print(missing_message(result, args.wheels), file=stream)
    if result.missing_required:
        print(f"{len(result.missing_required)} required wheel(s) missing: nothing installed.", file=sys.stderr)
        return 3
    if args.command == "check":
        return 0
    if install(list(result.to_install), args.site) != 0:
        print("pip install failed (see above)", file=sys.stderr)
        return 4
    return 0


if __name__ == "__main__":
    sys.exit(main())
