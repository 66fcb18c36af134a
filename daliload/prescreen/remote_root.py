"""A dataset root in an object store (``s3://bucket/kinetics700``), scanned through a local mirror of its names.

Every layout (class folders, CSVs, split files, UCF101's lists, tar shards,
...) is read by code that lists folders and reads small files. For a root in a
store, :func:`mirror_root` lists the prefix once (one request per 1,000 keys
on S3) and writes a *mirror* of it in the per-user cache: the same names; each
video a sparse file of the object's size and modification time (no byte
fetched); each small side file (CSV, list, JSON, ``classes.txt``) fetched
whole; each tar shard a sparse file holding only its member headers, at their
offsets (read by range: one request per member larger than 64 KiB). The
layouts read the mirror as they read any folder, and the scan names each video
by its URI, not the mirror's path (:func:`to_uri`): the manifest, the probes
and both decoders read the store. So ``KineticsDALILoader("s3://bucket/k700")``
and ``daliload scan s3://bucket/k700`` take every layout a local root takes.

The mirror is refreshed (listed again, changed entries rewritten, gone ones
removed) when a loader or scan names the root, at most once per
:data:`FRESH_S` across the processes of a machine (they take turns on a lock
file; ranks of a node share it). Its manifest is the mirror's own
(``MIRROR/.daliload/manifest.sqlite``) unless ``ScanSpec(manifest_path=...)``
or ``--manifest`` puts it elsewhere: under DDP on several machines, put it on
storage every node reads, or scan once ahead and pass the manifest.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import io
import logging
import os
import shutil
import tarfile
import time
from pathlib import Path

from daliload.dataset import VIDEO_EXTENSIONS, is_label_member
from daliload.stream import RangeFile, fetch, is_compressed_name, list_objects, redact, refuse_secrets

logger = logging.getLogger(__name__)

#: Side files at most this large are fetched into the mirror (a Kinetics-700 CSV is about 30 MB).
SIDE_FILE_MAX_BYTES = 256 << 20
#: A mirror refreshed this recently (seconds) is used as it is (the other ranks of a node, a job's loaders).
FRESH_S = 60.0
#: The file in a mirror that names the URI it mirrors.
_SOURCE = ".daliload/source-uri"


def mirror_path(uri: str) -> Path:
    """Where the mirror of ``uri`` lives: ``$XDG_CACHE_HOME/daliload/remote/<last name>-<digest>``."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    name = uri.rstrip("/").rsplit("/", 1)[-1] or "root"
    return cache / "daliload" / "remote" / f"{name}-{hashlib.sha256(uri.encode()).hexdigest()[:16]}"


def mirror_root(uri: str, *, fresh_s: float | None = None) -> Path:
    """The local mirror of the dataset root ``uri``, listed and brought up to date (see the module doc).

    Raises:
        SecretInURIError: ``uri`` carries a credential (shown redacted).
        RemoteReadError: the store cannot be listed (no such bucket, credentials refused, no endpoint,
            nothing under the prefix, an HTTP root); the message names the redacted URI and the fix.
    """
    refuse_secrets(uri)
    fresh_s = FRESH_S if fresh_s is None else fresh_s
    uri = uri.rstrip("/")
    mirror = mirror_path(uri)
    (mirror / ".daliload").mkdir(parents=True, exist_ok=True)
    stamp = mirror / ".daliload" / "mirrored"
    with open(mirror / ".daliload" / "mirror.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if stamp.exists() and time.time() - stamp.stat().st_mtime < fresh_s:
                return mirror
            try:
                _refresh(uri, mirror)
            except BaseException:
                if not stamp.exists():  # never listed: leave nothing behind
                    shutil.rmtree(mirror, ignore_errors=True)
                raise
            (mirror / _SOURCE).write_text(uri, encoding="utf-8")
            stamp.touch()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return mirror


def mirrored_uri(root: str | os.PathLike) -> str | None:
    """The URI the folder ``root`` mirrors, or ``None`` when it is an ordinary folder."""
    try:
        return (Path(root) / _SOURCE).read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def to_uri(path: str, root: str, uri: str) -> str:
    """``path`` under the mirror ``root`` named under ``uri`` instead (a shard member's range stays as it is)."""
    prefix = root.rstrip("/") + "/"
    return uri + "/" + path[len(prefix):] if path.startswith(prefix) else path


def _mirrorable(key: str) -> bool:
    """Whether an object's key can be a path under the mirror: none of its parts empty, ``.`` or ``..`` (so no
    key, whatever it holds, names a file outside the mirror), and not the mirror's own ``.daliload``."""
    parts = key.split("/")
    return parts[0] != ".daliload" and all(part not in ("", ".", "..") for part in parts)


def _refresh(uri: str, mirror: Path) -> None:
    objects = list_objects(uri)
    listed = {obj.key: obj for obj in objects if _mirrorable(obj.key)}
    left_out = [obj.key for obj in objects if not _mirrorable(obj.key) and not obj.key.startswith(".daliload/")]
    if left_out:
        logger.warning("%d object(s) of %s left out of its listing: their keys cannot be paths (an empty, '.' or "
                       "'..' part), first: %r", len(left_out), redact(uri), left_out[0])
    for key, obj in listed.items():
        local = mirror.joinpath(*key.split("/"))
        try:
            st = local.stat()
            if st.st_size == obj.size and st.st_mtime_ns == obj.mtime_ns:
                continue  # as listed last time
        except FileNotFoundError:
            pass
        try:
            local.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):  # "a" and "a/b" both objects: "a" cannot be a folder too
            logger.warning("object %s/%s left out of the listing: a prefix of its key is an object too",
                           redact(uri), key)
            continue
        suffix = os.path.splitext(key)[1].lower()
        tmp = local.with_name(local.name + ".mirroring")
        with open(tmp, "wb") as out:
            if suffix == ".tar":
                _headers_into(f"{uri}/{key}", obj.size, out)
            elif is_compressed_name(key):  # a compressed shard: its first bytes say what it is, and it is refused
                out.write(fetch(f"{uri}/{key}", 0, min(obj.size, 512)))
            elif suffix not in VIDEO_EXTENSIONS and obj.size <= SIDE_FILE_MAX_BYTES:
                out.write(fetch(f"{uri}/{key}"))
            out.truncate(obj.size)  # a sparse file of the object's size: nothing fetched
        os.utime(tmp, ns=(obj.mtime_ns, obj.mtime_ns))
        os.replace(tmp, local)
    for folder, dirs, files in os.walk(mirror, topdown=True):
        rel = os.path.relpath(folder, mirror)
        if rel == ".":
            dirs[:] = [d for d in dirs if d != ".daliload"]
        for name in files:
            key = name if rel == "." else f"{rel.replace(os.sep, '/')}/{name}"
            if key not in listed:
                os.unlink(os.path.join(folder, name))  # gone from the store since the last listing


def _headers_into(uri: str, size: int, out: io.BufferedWriter) -> None:
    """Copy the member headers of the remote tar ``uri`` to ``out`` at their offsets, and the data of its label
    members (``<key>.cls``/``.json``, which the shards layout reads); videos' data is left as holes."""
    source = RangeFile(uri, size=size)
    try:
        with tarfile.open(fileobj=source, mode="r:") as tar:
            for info in tar:
                start = info.offset
                end = info.offset_data + (info.size if info.isreg() and is_label_member(info.name, info.size)
                                          else 0)
                source.seek(start)
                header = source.read(end - start)
                out.seek(start)
                out.write(header)
    except tarfile.ReadError:
        # Not an uncompressed tar: the mirror keeps its first bytes, so the shards layout says what it is.
        source.seek(0)
        out.seek(0)
        out.write(source.read(min(size, 512)))
    except OSError as err:
        raise OSError(errno.EIO, f"listing the members of {redact(uri)} failed: {err}") from err
    finally:
        source.close()


__all__ = ["FRESH_S", "mirror_path", "mirror_root", "mirrored_uri", "to_uri"]
