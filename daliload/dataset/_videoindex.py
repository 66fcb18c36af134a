"""A split's videos as columns: what a loader keeps per video, about 130 bytes each.

A manifest entry as a Python object costs about 2 KB (a dataclass, its
strings, a tuple of keyframes): 1.2 GB on every rank for Kinetics-700's 650k
videos, and over a million objects for the garbage collector to walk.
:class:`VideoIndex` holds the same facts as numpy columns, the paths in one
UTF-8 buffer (:class:`StringColumn`), and builds a :class:`VideoRow` for one
video only when asked::

    column        type                          per video
    paths         StringColumn (UTF-8, offsets) len(path) + 8 B   sorted, as the manifest lists them
    label         int32                         4 B
    num_frames    int32                         4 B
    fps           float64 (NaN: unknown)        8 B
    width, height int32 (0: unknown)            8 B
    route         int8: 0 dali, 1 fallback, 2 bad              1 B
    reason        int32: index into ``reasons``                4 B
    keyframes     StringColumn ("0,250", as stored)            ~5 + 8 B, parsed per video when asked
    vfr, unsafe_seek  bool                      2 B

Row ``i`` is video ``i``: its ``Sample.video_index`` in every plan drawn
from :attr:`VideoIndex.columns`. :meth:`VideoIndex.fingerprint` says which
list of videos a plan was drawn from, so a resumed run can tell whether it
is drawing from the same one.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Iterable, Iterator, NamedTuple, Sequence, overload

import numpy as np

from daliload.plan import VideoColumns

#: Route names in code order: ``route == 0`` is ``"dali"``.
ROUTE_NAMES: tuple[str, ...] = ("dali", "fallback", "bad")
ROUTE_CODES = {name: code for code, name in enumerate(ROUTE_NAMES)}
BAD = ROUTE_CODES["bad"]


class StringColumn(Sequence[str]):
    """Strings in one UTF-8 buffer: string ``i`` is ``data[offsets[i]:offsets[i + 1]]``.

    About ``len(s) + 8`` bytes a string instead of Python's ``len(s) + 49``
    plus a pointer; a string is decoded when it is asked for. :meth:`find`
    assumes the strings are sorted by their UTF-8 bytes (SQLite's ``ORDER BY``).
    """

    __slots__ = ("data", "offsets")

    def __init__(self, data: bytes, offsets: np.ndarray) -> None:
        offsets = np.asarray(offsets, dtype=np.int64)
        if offsets.ndim != 1 or len(offsets) < 1 or offsets[0] != 0 or offsets[-1] != len(data) \
                or (len(offsets) > 1 and np.any(np.diff(offsets) < 0)):
            raise ValueError(f"StringColumn offsets must rise from 0 to the data's {len(data)} bytes")
        self.data = bytes(data)
        self.offsets = offsets

    @classmethod
    def of(cls, strings: Iterable[str | os.PathLike]) -> StringColumn:
        """A column of ``strings`` (``surrogateescape``: any POSIX path encodes)."""
        encoded = [os.fspath(s).encode("utf-8", "surrogateescape") for s in strings]
        offsets = np.zeros(len(encoded) + 1, np.int64)
        np.cumsum(np.fromiter(map(len, encoded), np.int64, count=len(encoded)), out=offsets[1:])
        return cls(b"".join(encoded), offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        n = len(self)
        i = int(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"string {i} of a column of {n}")
        return self.data[self.offsets[i]:self.offsets[i + 1]].decode("utf-8", "surrogateescape")

    def __iter__(self) -> Iterator[str]:
        data, bounds = self.data, self.offsets.tolist()
        for start, end in zip(bounds, bounds[1:]):
            yield data[start:end].decode("utf-8", "surrogateescape")

    def find(self, s: str) -> int:
        """The index of ``s`` (strings sorted by UTF-8 bytes), or -1: a binary search, ~20 steps for 650k."""
        key = os.fspath(s).encode("utf-8", "surrogateescape")
        data, offsets = self.data, self.offsets
        lo, hi = 0, len(self)
        while lo < hi:
            mid = (lo + hi) // 2
            if data[offsets[mid]:offsets[mid + 1]] < key:
                lo = mid + 1
            else:
                hi = mid
        return lo if lo < len(self) and data[offsets[lo]:offsets[lo + 1]] == key else -1

    def compress(self, keep: np.ndarray) -> StringColumn:
        """The strings where ``keep`` (a boolean array) is true, in order."""
        lengths = np.diff(self.offsets)
        data = np.frombuffer(self.data, np.uint8)[np.repeat(keep, lengths)].tobytes()
        offsets = np.zeros(int(keep.sum()) + 1, np.int64)
        np.cumsum(lengths[keep], out=offsets[1:])
        return StringColumn(data, offsets)

    @property
    def nbytes(self) -> int:
        return len(self.data) + self.offsets.nbytes

    def __repr__(self) -> str:
        return f"StringColumn({len(self)} strings, {self.nbytes} bytes)"


class VideoRow(NamedTuple):
    """One video of a :class:`VideoIndex`, with the attribute names of a manifest entry."""

    path: str
    label: int
    num_frames: int
    fps: float | None
    width: int | None
    height: int | None
    route: str
    reason: str
    keyframes: tuple[int, ...]
    vfr: bool
    unsafe_seek: bool


#: Every column's dtype: indexes built from the manifest's rows and read from its stored columns are bit-identical.
DTYPES = {"label": np.int32, "num_frames": np.int32, "fps": np.float64, "width": np.int32, "height": np.int32,
          "route": np.int8, "reason": np.int32, "vfr": np.bool_, "unsafe_seek": np.bool_}


@dataclass(frozen=True, eq=False)
class VideoIndex:
    """A split's videos, routed for one device, as columns (see the module docstring).

    Attributes:
        paths: the files, sorted by their UTF-8 bytes.
        label, num_frames, fps, width, height, route, reason, vfr, unsafe_seek:
            one numpy array each, dtypes :data:`DTYPES`.
        keyframes: where a decode may start, per video, as stored (``"0,250"``).
        reasons: the distinct reasons ``reason`` indexes (``reasons[0] == ""``).
    """

    paths: StringColumn
    label: np.ndarray
    num_frames: np.ndarray
    fps: np.ndarray
    width: np.ndarray
    height: np.ndarray
    route: np.ndarray
    reason: np.ndarray
    keyframes: StringColumn
    vfr: np.ndarray
    unsafe_seek: np.ndarray
    reasons: tuple[str, ...] = ("",)

    def __post_init__(self) -> None:
        n = len(self.paths)
        if len(self.keyframes) != n:
            raise ValueError(f"VideoIndex: {len(self.keyframes)} keyframe lists for {n} paths")
        for name, dtype in DTYPES.items():
            column = getattr(self, name)
            if not isinstance(column, np.ndarray) or column.dtype != dtype or column.shape != (n,):
                raise ValueError(f"VideoIndex.{name} must be a {np.dtype(dtype).name} array of {n} values, got "
                                 f"{getattr(column, 'dtype', type(column).__name__)} {getattr(column, 'shape', '')}")

    @classmethod
    def from_rows(cls, rows: Iterable[Sequence]) -> VideoIndex:
        """An index of ``(path, label, num_frames, fps, width, height, route, reason, keyframes, vfr,
        unsafe_seek)`` rows, sorted by path (``route`` a name of :data:`ROUTE_NAMES`; ``None`` facts allowed)."""
        builder = IndexBuilder()
        builder.add(list(rows))
        return builder.build()

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> VideoRow:
        n = len(self)
        i = int(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"video {i} of an index of {n}")
        fps, width, height = float(self.fps[i]), int(self.width[i]), int(self.height[i])
        return VideoRow(self.paths[i], int(self.label[i]), int(self.num_frames[i]), None if fps != fps else fps,
                        width or None, height or None, ROUTE_NAMES[self.route[i]], self.reasons[self.reason[i]],
                        self.keyframes_of(i), bool(self.vfr[i]), bool(self.unsafe_seek[i]))

    def __iter__(self) -> Iterator[VideoRow]:
        return (self[i] for i in range(len(self)))

    @property
    def columns(self) -> VideoColumns:
        """What planning reads (row ``i`` is video ``i``)."""
        return VideoColumns(self.paths, self.label, self.num_frames, self.fps, self.width, self.height)

    def num_frames_of(self, i: int) -> int:
        return int(self.num_frames[i])

    def frames_of_video(self, i: int) -> int | None:
        """Frames of video ``i`` (its ``Sample.video_index``) as the manifest counted them; ``None``: unknown."""
        return int(self.num_frames[i]) or None

    def path_of(self, i: int) -> str:
        """The file of video ``i``."""
        return self.paths[int(i)]

    def keyframes_of(self, i: int) -> tuple[int, ...]:
        text = self.keyframes[i]
        return tuple(int(k) for k in text.split(",")) if text else ()

    def find(self, path: str | os.PathLike) -> int:
        """The row of ``path``, or -1."""
        return self.paths.find(os.fspath(path))

    def where(self, route: str) -> np.ndarray:
        """The rows of ``route`` (``"dali"``, ``"fallback"`` or ``"bad"``)."""
        return np.flatnonzero(self.route == ROUTE_CODES[route])

    def compress(self, keep: np.ndarray) -> VideoIndex:
        """The rows where ``keep`` is true, in order."""
        arrays = {name: getattr(self, name)[keep] for name in DTYPES}
        return VideoIndex(self.paths.compress(keep), keyframes=self.keyframes.compress(keep), reasons=self.reasons,
                          **arrays)

    def decodable(self) -> VideoIndex:
        """The videos a plan may use: every route but ``bad``."""
        return self.compress(self.route != BAD)

    def rejected(self) -> list[tuple[str, str]]:
        """``(path, reason)`` of every ``bad`` video."""
        return [(self.paths[i], self.reasons[self.reason[i]]) for i in self.where("bad").tolist()]

    @property
    def nbytes(self) -> int:
        """Bytes the columns hold."""
        return (self.paths.nbytes + self.keyframes.nbytes + sum(getattr(self, name).nbytes for name in DTYPES)
                + sum(len(r) for r in self.reasons))

    def fingerprint(self) -> dict:
        """What identifies the list of videos a plan is drawn from, as digests (hex) of its parts.

        ``videos`` (their count), ``paths`` (which files, in order), ``labels``
        and ``facts`` (frames, fps, frame size: what the windows and crops are
        drawn from); routes are left out (they decide the decoder, not the plan).
        """
        def digest(*parts) -> str:
            h = hashlib.blake2b(digest_size=16)
            for part in parts:
                h.update(part if isinstance(part, bytes) else np.ascontiguousarray(part).tobytes())
            return h.hexdigest()

        return {"videos": len(self), "paths": digest(self.paths.data, self.paths.offsets),
                "labels": digest(self.label), "facts": digest(self.num_frames, self.fps, self.width, self.height)}

    def to_blobs(self) -> dict[str, bytes]:
        """Every column as bytes, for storing (:meth:`from_blobs` reads them back)."""
        blobs = {name: getattr(self, name).tobytes() for name in DTYPES}
        for name in ("paths", "keyframes"):
            column = getattr(self, name)
            blobs[name], blobs[name + ".offsets"] = column.data, column.offsets.tobytes()
        blobs["reasons"] = "\0".join(self.reasons).encode("utf-8", "surrogateescape")
        return blobs

    @classmethod
    def from_blobs(cls, blobs: dict[str, bytes]) -> VideoIndex:
        """The index :meth:`to_blobs` stored.

        Raises:
            ValueError: a column is missing or of the wrong size.
        """
        missing = [name for name in (*DTYPES, "paths", "paths.offsets", "keyframes", "keyframes.offsets", "reasons")
                   if name not in blobs]
        if missing:
            raise ValueError(f"stored video index lacks column(s) {', '.join(missing)}")
        arrays = {name: np.frombuffer(blobs[name], dtype) for name, dtype in DTYPES.items()}
        columns = {name: StringColumn(blobs[name], np.frombuffer(blobs[name + ".offsets"], np.int64))
                   for name in ("paths", "keyframes")}
        reasons = tuple(blobs["reasons"].decode("utf-8", "surrogateescape").split("\0"))
        return cls(**columns, **arrays, reasons=reasons)

    def __repr__(self) -> str:
        counts = ", ".join(f"{name} {int((self.route == code).sum())}" for code, name in enumerate(ROUTE_NAMES))
        return f"VideoIndex({len(self)} videos: {counts}; {self.nbytes / 2**20:.1f} MiB)"


class IndexBuilder:
    """Builds a :class:`VideoIndex` from chunks of rows (see :meth:`VideoIndex.from_rows`), so that
    only one chunk of Python objects is alive at a time."""

    def __init__(self) -> None:
        self._paths: list[StringColumn] = []
        self._keyframes: list[StringColumn] = []
        self._arrays: dict[str, list[np.ndarray]] = {name: [] for name in DTYPES}
        self._reasons: dict[str, int] = {"": 0}

    def add(self, rows: list[Sequence]) -> None:
        """Rows as :meth:`VideoIndex.from_rows` takes them (columns after the eleventh are left out)."""
        if not rows:
            return
        (paths, label, num_frames, fps, width, height, route, reason, keyframes, vfr,
         unsafe) = list(zip(*rows))[:11]  # fmt: skip
        reasons = self._reasons
        values = {
            "label": label, "num_frames": num_frames, "width": [w or 0 for w in width],
            "height": [h or 0 for h in height], "fps": [f if f is not None else np.nan for f in fps],
            "route": [ROUTE_CODES[r] for r in route],
            "reason": [reasons.setdefault(r or "", len(reasons)) for r in reason], "vfr": vfr, "unsafe_seek": unsafe,
        }
        for name, dtype in DTYPES.items():
            self._arrays[name].append(np.asarray(values[name], dtype=dtype))
        self._paths.append(StringColumn.of(paths))
        self._keyframes.append(StringColumn.of(k or "" for k in keyframes))

    def build(self) -> VideoIndex:
        arrays = {name: np.concatenate(parts) if parts else np.zeros(0, DTYPES[name])
                  for name, parts in self._arrays.items()}
        return VideoIndex(_concat(self._paths), keyframes=_concat(self._keyframes), reasons=tuple(self._reasons),
                          **arrays)


def _concat(columns: list[StringColumn]) -> StringColumn:
    if not columns:
        return StringColumn(b"", np.zeros(1, np.int64))
    data = b"".join(c.data for c in columns)
    lengths = np.concatenate([np.diff(c.offsets) for c in columns])
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return StringColumn(data, offsets)
