"""``daliload scan ROOT``: probe a dataset, update its manifest, print what goes where."""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import sys
from pathlib import Path
from typing import Sequence

from daliload.prescreen.gpus import resolve_gpu
from daliload.prescreen.manifest import Manifest
from daliload.prescreen.merge import merge_manifests
from daliload.prescreen.ensure import copy_to_cache, unwritable_manifest, writable
from daliload.prescreen.scan import cache_manifest_path, check_root, default_manifest_path, scan
from daliload.prescreen.scan_listing import manifest_name
from daliload.prescreen.scan_lock import scan_lock
from daliload.prescreen.remote_root import mirror_root
from daliload.prescreen.source import scan_splits
from daliload.dataset import LAYOUTS, parse_shard
from daliload.stream import RemoteReadError, is_remote

HELP = "probe every video, route it to DALI, the PyAV fallback or out (bad); cache it in a manifest"

#: Fields of each ``--json`` object.
JSON_FIELDS = (
    "path",
    "route",
    "reason",
    "num_frames",
    "fps",
    "width",
    "height",
    "codec",
    "pix_fmt",
    "num_packets",
    "unsafe_seek",
)


def _add_gpu_model(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--gpu-model",
        metavar="NAME",
        default=None,
        help="with --device gpu: the GPU training runs on, whose NVDEC decides the routes (A100, H100, "
        "H200, GH200, L4, L40S, RTX4090, B200, ...; a generation such as 'ada'; or 'auto' = the "
        "visible GPU). Default: the most common datacenter GPUs (Hopper class: no AV1), said so in "
        "the summary",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "root", type=_root_arg, nargs="?", help="dataset root, in any layout (ROOT/<split>/<class>/<file>, CSV, "
        "list, UCF101, HMDB51, SSv2, tar shards: docs/datasets.md), local or in an object store (s3://bucket/prefix: "
        "docs/remote.md)"
    )
    parser.add_argument(
        "--layout",
        choices=tuple(LAYOUTS),
        default=None,
        help="how ROOT is read (default: detected per split)",
    )
    parser.add_argument(
        "--fold",
        type=int,
        default=None,
        metavar="N",
        help="UCF101's or HMDB51's official fold, 1..3 (default 1; --split trainlist02 says it too); each fold "
        "has a manifest of its own (manifest-foldN.sqlite)",
    )
    parser.add_argument(
        "--shard",
        default="0/1",
        metavar="I/N",
        help="probe only share I of N of the files (by path hash; 0 <= I < N) into a manifest of their own "
        "(--manifest PART), e.g. one share per machine of an array job; then join them with --merge",
    )
    parser.add_argument(
        "--merge",
        nargs="+",
        type=Path,
        metavar="PART",
        help="instead of scanning, join the manifests of every shard (PART... written by --shard I/N) into "
        "--manifest OUT",
    )
    parser.add_argument(
        "--split",
        action="append",
        metavar="SPLIT",
        help="split to scan; repeat or comma-separate (default: train,val)",
    )
    parser.add_argument(
        "--device",
        choices=("auto", "gpu", "cpu"),
        default="auto",
        help="device training decodes on; 'auto' = gpu if CUDA is available (default)",
    )
    _add_gpu_model(parser)
    parser.add_argument(
        "--deep",
        action="store_true",
        help="also decode a window at each end of every file with its routed decoder, and check that "
        "seeking to its last keyframe gives the frames a decode from the start gives (files where it "
        "does not are marked unsafe_seek and decoded from the start)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="probe processes (default: one per CPU core; 0 = in this process)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="per-file limit before a file is marked bad 'timeout' (default 30, 120 with --deep)",
    )
    parser.add_argument(
        "--manifest",
        type=Path,
        default=None,
        metavar="PATH",
        help="manifest file (default: ROOT/.daliload/manifest.sqlite, or a per-user cache "
        "file when ROOT is not writable)",
    )
    parser.add_argument(
        "--json",
        type=Path,
        default=None,
        metavar="PATH",
        help=f"also write a JSON array, one object per file: {', '.join(JSON_FIELDS)}, routed_for; "
        "files of the split folders that were not scanned have route 'skipped' and the reason",
    )
    parser.add_argument(
        "--retry-bad",
        action="store_true",
        help="probe again every file marked bad (a probe that timed out or crashed keeps its verdict otherwise, "
        "so that jobs on unchanged files see the same videos)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def _splits(values: list[str] | None) -> tuple[str, ...]:
    if not values:
        return ("train", "val")
    return tuple(s.strip() for value in values for s in value.split(",") if s.strip())


def _device(choice: str) -> str:
    if choice != "auto":
        return choice
    import torch

    return "gpu" if torch.cuda.is_available() else "cpu"


def write_json(
    manifest_path: Path,
    json_path: Path,
    *,
    device: str,
    splits: tuple[str, ...],
    skipped: Sequence[tuple[str, str]] = (),
    routed_for: str = "",
) -> int:
    """Write the ``--json`` listing; returns the number of files written.

    Scanned files come from the manifest; each of ``skipped`` (path, reason)
    follows as ``{"path": ..., "route": "skipped", "reason": ...}`` with the
    other fields null. Every object carries ``routed_for``: the route target
    and, on a GPU, the GPU the routes were decided for.
    """
    routed_for = f"{device}: {routed_for}" if routed_for else device
    count = 0
    json_path.parent.mkdir(parents=True, exist_ok=True)
    with Manifest(manifest_path) as manifest, open(json_path, "w", encoding="utf-8") as out:
        out.write("[")
        for split in splits:
            for entry in manifest.entries(split, device=device):
                item = {name: getattr(entry, name) for name in JSON_FIELDS} | {"routed_for": routed_for}
                out.write(("\n" if count == 0 else ",\n") + json.dumps(item))
                count += 1
        for path, reason in skipped:
            item = dict.fromkeys(JSON_FIELDS, None) | {"path": path, "route": "skipped", "reason": reason,
                                                       "routed_for": routed_for}
            out.write(("\n" if count == 0 else ",\n") + json.dumps(item))
            count += 1
        out.write("\n]\n")
    return count


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.merge is not None:
        return _merge(args)
    if args.root is None:
        print("daliload scan: give a dataset ROOT to scan, or --merge PART... --manifest OUT", file=sys.stderr)
        return 2
    try:
        shard = parse_shard(args.shard)
    except ValueError as err:
        print(f"daliload scan: {err}", file=sys.stderr)
        return 2
    if shard.count > 1 and args.manifest is None:
        print(f"daliload scan: --shard {shard} needs --manifest PART, a file of this shard's own (the shards are "
              "joined with --merge)", file=sys.stderr)
        return 2
    device = _device(args.device)
    if args.gpu_model is not None and device != "gpu":
        print(f"daliload scan: --gpu-model {args.gpu_model} needs --device gpu (the device is {device}); "
              "routes for a GPU can be decided on a machine without one", file=sys.stderr)
        return 2
    if args.gpu_model is not None:
        try:
            resolve_gpu(args.gpu_model)
        except ValueError as err:
            print(f"daliload scan: {err}", file=sys.stderr)
            return 2
    manifest_path = args.manifest  # until the fold says which is the root's
    try:
        # A root in a store is scanned through a local mirror of its names (the manifest names the store's URIs).
        given = mirror_root(args.root) if is_remote(args.root) else args.root
        root = check_root(given)
        splits, fold = scan_splits(root, _splits(args.split), args.layout, args.fold)
        manifest_path = Path(os.path.abspath(args.manifest or _default_manifest(given, fold)))
        if not manifest_path.is_file() and not writable(manifest_path):
            raise unwritable_manifest(root, manifest_path, given=args.manifest is not None)
        manifest_path.parent.mkdir(parents=True, exist_ok=True)
        # Takes turns with every other scan of this manifest (another `daliload scan`, a loader's): the one
        # that waits says for whom, even with --quiet (it may wait for hours), then probes only what is left.
        with scan_lock(manifest_path, root, job=None, progress=True) as note:
            summary = scan(
                root,
                manifest_path=manifest_path,
                device=device,
                deep=args.deep,
                workers=args.workers,
                splits=splits,
                progress=not args.quiet,
                timeout_s=args.timeout,
                gpu_model=args.gpu_model if device == "gpu" else None,
                retry_bad=args.retry_bad,
                shard=shard,
                on_progress=note,
                layout=args.layout,
                fold=fold,
            )
    # Refused options, a damaged manifest, a root that is a file, a root in a store that cannot be listed.
    except (ValueError, FileNotFoundError, RemoteReadError) as err:
        print(f"daliload scan: {err}", file=sys.stderr)
        return 2
    except PermissionError as err:  # no manifest can be written where it goes: the message names the option
        print(f"daliload scan: {err.strerror if err.filename is None else err}", file=sys.stderr)
        return 2
    except OSError as err:
        if err.errno != errno.ENOSPC:
            raise
        print(f"daliload scan: {err.strerror}", file=sys.stderr)  # the manifest's disk is full: what to do
        return 1
    except KeyboardInterrupt:
        print(
            f"\ninterrupted: everything probed so far is saved in {manifest_path}; "
            "run the same command again to resume",
            file=sys.stderr,
        )
        return 130
    print(summary.format())
    if args.json is not None:
        count = write_json(summary.manifest_path, args.json, device=summary.device, splits=summary.splits,
                           skipped=summary.skipped, routed_for=summary.gpu)
        print(f"\nwrote {count} files to {args.json}")
    return 0


def _root_arg(text: str) -> Path | str:
    """A local root as a path; a URI (``s3://bucket/prefix``) as it is written (a ``Path`` would fold its ``//``)."""
    return text if is_remote(text) else Path(text)


def _default_manifest(root: Path, fold: int | None = None) -> Path:
    """The root's manifest (of ``fold``); when it is on read-only storage, the per-user cache copy, first made
    from it (so that only changed files are probed, not the whole dataset again)."""
    local = Path(root).absolute() / ".daliload" / manifest_name(fold)
    if not local.is_file() or writable(local):
        return default_manifest_path(root, fold)
    cache = cache_manifest_path(root, fold)
    if not cache.is_file():
        copy_to_cache(local, cache)
        print(f"{local} is on read-only storage: scanning a copy of it, {cache}", file=sys.stderr)
    return cache


def _merge(args: argparse.Namespace) -> int:
    """``daliload scan --merge PART... --manifest OUT``."""
    if args.root is not None or args.manifest is None:
        print("daliload scan: --merge takes the parts and --manifest OUT, and no ROOT "
              "(daliload scan --merge PART... --manifest OUT)", file=sys.stderr)
        return 2
    try:
        summary = merge_manifests(args.merge, args.manifest)
    except (ValueError, FileNotFoundError) as err:
        print(f"daliload scan: {err}", file=sys.stderr)
        return 2
    print(summary.format())
    return 0
