"""The rows a scan stores: what it knows of a file, as ``files`` and ``routes`` column values.

The scanner builds a :class:`FileRecord` per file from the dataset index and
``stat``; a worker turns its :class:`~daliload.prescreen.probe.ProbeResult`
into :class:`ProbeRows` (fact columns, one route per device); the pair is a
:class:`Probed`, which :meth:`daliload.prescreen.manifest.Manifest.write_probed`
stores. :func:`facts_from_row` reads the facts back. The table layout itself
is drawn in :mod:`daliload.prescreen.manifest`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

from daliload.prescreen.probe import ProbeResult
from daliload.prescreen.rules import DEVICES, route_for

#: ProbeResult fields stored in ``files``; the column of ``reason`` is ``probe_reason``.
FACT_FIELDS = (
    "reason", "container", "codec", "profile", "pix_fmt", "bit_depth", "chroma", "width", "height",
    "rotation", "interlaced", "fps", "base_fps", "num_frames", "duration_s", "keyframes", "vfr",
    "has_video", "num_packets", "unsafe_seek",
)  # fmt: skip
FACT_COLUMNS = ("probe_reason",) + FACT_FIELDS[1:]
_BOOL_FIELDS = frozenset({"interlaced", "vfr", "has_video", "unsafe_seek"})
#: ``files`` columns that come from the dataset index (what a relabelled file rewrites).
META_COLUMNS = ("split", "label", "class_name", "youtube_id", "time_start", "time_end")


class FileRecord(NamedTuple):
    """What the scanner knows of a file before probing it (from the dataset index and ``stat``).

    A tuple: a scan of Kinetics-700 makes 650k of them.
    """

    path: str
    size_bytes: int
    mtime_ns: int
    split: str
    label: int
    class_name: str
    youtube_id: str | None = None
    time_start: float | None = None
    time_end: float | None = None

    def meta(self) -> tuple:
        """The index columns, in ``META_COLUMNS`` order."""
        return (self.split, self.label, self.class_name, self.youtube_id, self.time_start,
                self.time_end)  # fmt: skip


#: One ``routes`` row without its path: ``(device, route, reason, deep)``; ``deep`` is 1 when
#: the ``--deep`` check decoded the file on that device, 0 for a rules-only route (or a deep
#: check that could not run, e.g. DALI missing: the next deep scan tries again).
RouteRow = tuple[str, str, str, int]


@dataclass(frozen=True)
class ProbeRows:
    """What probing one file produced, as ``files`` and ``routes`` column values.

    Plain tuples on purpose: workers send these back to the scanner, and a tuple
    pickles about 15 times faster than a dataclass.

    Attributes:
        facts: the fact columns (``FACT_COLUMNS`` order).
        routes: one :data:`RouteRow` per device.
        byte_index: where the packets lie (:meth:`daliload.stream.byteindex.ByteIndex.encode`), or ``None``.
    """

    facts: tuple
    routes: tuple[RouteRow, ...]
    byte_index: bytes | None = None

    @classmethod
    def of(cls, facts: ProbeResult, deep: Sequence[RouteRow] = ()) -> "ProbeRows":
        """Rows for ``facts``, routed by the rules on each device unless ``deep`` has a row."""
        by_device = {row[0]: row for row in deep}
        routes = tuple(by_device.get(device) or (device, *route_for(facts, device), 0)
                       for device in DEVICES)  # fmt: skip
        return cls(fact_values(facts), routes, facts.byte_index)

    def as_tuple(self) -> tuple:
        return (self.facts, self.routes, self.byte_index)


@dataclass(frozen=True)
class Probed:
    """A probed file, ready to store: its index record and its rows."""

    record: FileRecord
    rows: ProbeRows


class KnownFile(NamedTuple):
    """A manifest row as the scanner needs it to decide whether to probe again."""

    size_bytes: int
    mtime_ns: int
    meta: tuple
    deep_devices: frozenset[str]


def _keyframes_text(keyframes: Sequence[int]) -> str:
    return ",".join(str(k) for k in keyframes)


def _keyframes_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(k) for k in text.split(",")) if text else ()


def fact_values(facts: ProbeResult) -> tuple:
    """The ``files`` fact columns of ``facts``, as SQLite values."""
    values = []
    for name in FACT_FIELDS:
        value = getattr(facts, name)
        if name == "keyframes":
            value = _keyframes_text(value)
        elif name in _BOOL_FIELDS:
            value = int(value)
        values.append(value)
    return tuple(values)


def facts_from_row(path: str, row: Sequence) -> ProbeResult:
    """Inverse of :func:`fact_values`."""
    fields = dict(zip(FACT_FIELDS, row))
    fields["keyframes"] = _keyframes_tuple(fields["keyframes"])
    for name in _BOOL_FIELDS:
        fields[name] = bool(fields[name])
    return ProbeResult(path, **fields)
