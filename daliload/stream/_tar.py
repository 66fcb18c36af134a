"""Tar shards: where each member's bytes lie, so a member is read by range and never extracted.

Kinetics-700 is about 650,000 files: on a shared filesystem their metadata
alone is a load, and an object store charges a request per object. Packed in
webdataset-style shards (``train-000000.tar``, ...), the dataset is a few
hundred large files, and a member is one contiguous range of its shard:
``[offset, offset + size)``. :func:`tar_members` lists a shard's regular
members with those ranges (reading only the headers: a seekable file object
is read 512 bytes a member plus long-name records, the data is skipped), and
:func:`read_member` reads one member's bytes back from the same file object.

A member's name is only a key here: nothing is ever written under it, so a
name with ``..`` or a leading ``/`` is as harmless as any other (it is still
reported as it is, for the layout to decide what its label is).

Only uncompressed tars can be read by range: a compressed shard
(``.tar.gz``, ``.tgz``, ``.tar.zst``, ...) is refused with the fix (re-pack it
uncompressed; video is compressed already, so gzip gains next to nothing).

Imports neither torch nor a decoder.
"""

from __future__ import annotations

import os
import tarfile
from typing import BinaryIO, NamedTuple

#: Suffixes of compressed tars, which cannot be read by range.
_COMPRESSED = (".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar.zst", ".tar.lz4")
#: Magic numbers of the compressors above, at the start of a compressed shard.
_MAGIC = ((b"\x1f\x8b", "gzip"), (b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"), (b"\x28\xb5\x2f\xfd", "zstd"),
          (b"\x04\x22\x4d\x18", "lz4"))


class TarMember(NamedTuple):
    """One regular member of a shard: its name and where its bytes lie in the shard.

    Attributes:
        name: the member's name as the tar stores it (``"abseiling/abc_000001_000011.mp4"``).
        offset: byte offset of its data in the shard.
        size: bytes of data.
    """

    name: str
    offset: int
    size: int


class NotAnUncompressedTar(ValueError):
    """The shard is compressed, or not a tar at all: its members cannot be read by range."""


def is_compressed_name(name: str) -> bool:
    """Whether ``name`` ends like a compressed tar (``.tar.gz``, ``.tgz``, ...)."""
    return name.lower().endswith(_COMPRESSED)


def tar_members(fileobj: BinaryIO, where: str) -> list[TarMember]:
    """The regular members of the uncompressed tar read from ``fileobj``, in the order they are stored.

    Args:
        fileobj: the shard, opened for binary reading at its start; seekable
            (a local file, or a remote one opened for ranged reads), so that
            members' data is skipped, not read.
        where: the shard's path or URI (already free of secrets), for messages.

    Returns:
        One :class:`TarMember` per regular file (directories, links and
        devices are left out; a link is not followed, so no member's bytes
        are read twice or from outside the shard).

    Raises:
        NotAnUncompressedTar: the shard is compressed (names the compressor and
            the fix) or is not a tar.
    """
    head = fileobj.read(6)
    fileobj.seek(0)
    for magic, compressor in _MAGIC:
        if head.startswith(magic):
            raise NotAnUncompressedTar(
                f"{where}: a {compressor}-compressed tar cannot be read one member at a time by range; "
                "re-pack it uncompressed (`daliload pack`, or `tar -cf`): video members are compressed already")
    try:
        # "r:" (no compression) reads header blocks and seeks past each member's data.
        with tarfile.open(fileobj=fileobj, mode="r:") as tar:
            return [TarMember(info.name, info.offset_data, info.size) for info in tar if info.isreg()]
    except tarfile.ReadError as err:
        raise NotAnUncompressedTar(f"{where}: not a tar shard ({err})") from err


def read_member(fileobj: BinaryIO, member: TarMember) -> bytes:
    """The bytes of ``member`` read from its shard ``fileobj`` (one seek and one read).

    Raises:
        OSError: the shard ends before the member does (``"shard is shorter than its index says"``):
            it was truncated or replaced since it was listed.
    """
    fileobj.seek(member.offset)
    data = fileobj.read(member.size)
    if len(data) != member.size:
        raise OSError(f"shard is shorter than its index says: member {member.name!r} needs bytes "
                      f"{member.offset}-{member.offset + member.size} and {len(data)} were read")
    return data


def shard_paths(folder: str | os.PathLike, split: str) -> list[str]:
    """A split's shards under ``folder``, in name order: ``<split>-*.tar`` beside each other, or ``<split>/*.tar``.

    Returns an empty list when there are none (the caller says what was looked for).
    """
    folder = os.fspath(folder)
    flat = sorted(os.path.join(folder, name) for name in _names(folder)
                  if name.startswith(f"{split}-") and name.endswith(".tar"))
    if flat:
        return flat
    nested = os.path.join(folder, split)
    return sorted(os.path.join(nested, name) for name in _names(nested) if name.endswith(".tar"))


def _names(folder: str) -> list[str]:
    try:
        return [entry.name for entry in os.scandir(folder) if entry.is_file()]
    except (FileNotFoundError, NotADirectoryError):
        return []
