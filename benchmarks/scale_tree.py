"""The tree ``python -m benchmarks.bench_scale`` measures: N hardlinked videos in a Kinetics-700 layout.

Hardlinks of a few source clips (generated, or ``--clips``) fill 700 class
folders, about 94 % in train; the manifest is the project's own scan of the
sources (:func:`seed_manifest`), its rows replicated for every video linking
to each (:func:`replicate_manifest`), so that a re-scan of the tree must
probe nothing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
from pathlib import Path

NUM_CLASSES = 700
#: Of every 100 videos, this many are in val (Kinetics-700: about 94 % train).
VAL_PER_100 = 6


def source_clips(args: argparse.Namespace, work: Path) -> list[Path]:
    """The clips every video of the tree links to, copied into ``WORK/sources`` (one file system)."""
    folder = work / "sources"
    folder.mkdir(parents=True, exist_ok=True)
    if args.clips is not None:
        from daliload.dataset import VIDEO_EXTENSIONS

        found = sorted(p for p in Path(args.clips).rglob("*") if p.suffix.lower() in VIDEO_EXTENSIONS and p.is_file())
        if not found:
            raise SystemExit(f"bench_scale: no video file under --clips {args.clips}")
    else:
        from benchmarks.datasets import prepare_dataset, standard_specs

        found = []
        for spec in standard_specs(["h264-gop250", "vp9"], num_clips=4, num_clips_hd=1, duration_s=3.0):
            found += [Path(v.path) for v in prepare_dataset(spec, args.data_dir, workers=2).videos]
    sources = []
    for i, path in enumerate(found):
        copy = folder / f"source{i:03d}{path.suffix.lower()}"
        if not copy.exists():
            shutil.copyfile(path, copy)
        sources.append(copy)
    return sources


def class_name(label: int) -> str:
    return f"action {label:03d}"


def video_relpath(i: int, sources: list[Path]) -> str:
    """Where video ``i`` lives under the root: its split, class and a Kinetics-style name."""
    split = "val" if i % 100 < VAL_PER_100 else "train"
    youtube_id = f"{i:011d}"[::-1].replace("0", "x")  # 11 characters, unique, like a YouTube id
    start = (i * 7) % 300
    suffix = sources[i % len(sources)].suffix
    return f"{split}/{class_name(i % NUM_CLASSES)}/{youtube_id}_{start:06d}_{start + 10:06d}{suffix}"


#: Links per file, below ext4's limit of 65,000: a source with more videos gets copies (same bytes and mtime).
MAX_LINKS = 60_000


def build_tree(root: Path, sources: list[Path], videos: int) -> None:
    for label in range(NUM_CLASSES):
        for split in ("train", "val"):
            (root / split / class_name(label)).mkdir(parents=True, exist_ok=True)
    copies = -(-videos // (len(sources) * MAX_LINKS))
    targets = [[source] for source in sources]
    for source, same in zip(sources, targets):
        for c in range(1, copies):
            copy = source.with_name(f"{source.stem}-copy{c}{source.suffix}")
            if not copy.exists():
                shutil.copy2(source, copy)  # copy2 keeps the mtime to the nanosecond: the same manifest row
            same.append(copy)
    for i in range(videos):
        same = targets[i % len(sources)]
        os.link(same[(i // len(sources)) % copies], root / video_relpath(i, sources))


def seed_manifest(work: Path, sources: list[Path]) -> Path:
    """The project's own scan of one link of each source, in a tree of its own."""
    from daliload.prescreen import scan

    seed = work / "seed"
    for source in sources:
        link = seed / "train" / class_name(0) / source.name
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists():
            os.link(source, link)
    path = work / "seed.sqlite"
    scan(seed, manifest_path=path, device="cpu", workers=2, splits=("train",), progress=False)
    return path


def replicate_manifest(seed: Path, seed_root: Path, root: Path, sources: list[Path], videos: int) -> Path:
    """The tree's manifest: the seed scan's rows of each source, for every video linking to it."""
    from daliload.prescreen import Manifest, default_manifest_path

    path = default_manifest_path(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    Manifest(path, writable=True).close()  # the schema, as this daliload writes it
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("ATTACH DATABASE ? AS seed", (f"file:{seed}?mode=ro",))
        columns = [row[1] for row in conn.execute("PRAGMA seed.table_info(files)")]
        meta = {"path": ":path", "split": ":split", "label": ":label", "class_name": ":class_name",
                "youtube_id": ":youtube_id", "time_start": ":time_start", "time_end": ":time_end"}
        select = ", ".join(meta.get(c, c) for c in columns)
        conn.execute("BEGIN")
        for name in ("files", "routes", "classes"):
            conn.execute(f"DELETE FROM {name}")
        files_sql = f"INSERT INTO files ({', '.join(columns)}) SELECT {select} FROM seed.files WHERE path = :source"
        routes_sql = ("INSERT INTO routes SELECT :path, device, route, reason, deep FROM seed.routes "
                      "WHERE path = :source")
        for i in range(videos):
            rel = video_relpath(i, sources)
            name = rel.rsplit("/", 1)[1]
            start = float(name.split("_")[1])
            row = {"path": str(root / rel), "split": rel.split("/", 1)[0], "label": i % NUM_CLASSES,
                   "class_name": class_name(i % NUM_CLASSES), "youtube_id": name[:11], "time_start": start,
                   "time_end": start + 10, "source": str(seed_root / "train" / class_name(0) / sources[
                       i % len(sources)].name)}
            conn.execute(files_sql, row)
            conn.execute(routes_sql, row)
        conn.executemany("INSERT INTO classes VALUES (?, ?)", [(i, class_name(i)) for i in range(NUM_CLASSES)])
        conn.execute("INSERT OR REPLACE INTO meta SELECT key, value FROM seed.meta WHERE key = 'last_scan'")
        conn.execute("COMMIT")
    finally:
        conn.close()
    return path
