"""A manifest's routes read per target: its rows as :class:`ManifestEntry`, and route totals.

:class:`RoutedManifest` (a base of :class:`~daliload.prescreen.manifest.Manifest`)
reads each file's row with its route on one target: ``gpu`` and ``cpu``,
whose routes a scan stores for every file; ``gpu:<default generation>``,
which is ``gpu`` with the routes a deep check stored for it by name; another
GPU generation, routed here from the stored probe facts when no scan stored
its routes. A class of files a test decode on a GPU could not decode (the
verdicts in ``nvdec_classes``, :mod:`.confirm`) goes to the fallback there,
whatever the table says. The same SQL serves the numpy columns
(:meth:`~daliload.prescreen.manifest.Manifest.video_index`).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Iterable, NamedTuple, Sequence

from daliload.prescreen.gpus import DEFAULT_GPU_GENERATION
from daliload.prescreen.manifest_store import ManifestStore
from daliload.prescreen.rows import FACT_COLUMNS, META_COLUMNS, facts_from_row
from daliload.prescreen.rules import DEVICES, Device, Route, check_device, nvdec_class, route_for
from daliload.prescreen.sqlite_file import reads

#: Probe facts a ManifestEntry carries under the same name.
_ENTRY_FACTS = (
    "num_frames", "fps", "width", "height", "codec", "profile", "pix_fmt", "bit_depth", "chroma",
    "rotation", "interlaced", "duration_s", "keyframes", "vfr", "base_fps", "container",
    "num_packets", "unsafe_seek",
)  # fmt: skip
#: The ``files`` columns, in the table's order.
FILE_COLUMNS = ("path", "size_bytes", "mtime_ns") + META_COLUMNS + FACT_COLUMNS


@dataclass(frozen=True)
class ManifestEntry:
    """One video as the manifest records it, routed for one device.

    Attributes:
        path: absolute path of the file.
        label: class index; ``class_name`` is its name.
        split: ``"train"``, ``"val"``, ...
        route: ``"dali"``, ``"fallback"`` or ``"bad"`` on the device asked for.
        reason: why the route is not ``dali`` (``""`` if it is).
        num_frames: frames a full sequential decode outputs (counted from
            packets by the rule of :mod:`daliload.stream.numbering`).
        fps: average frame rate (frames per second); ``base_fps`` the container's base rate.
        width, height: coded frame size in pixels, before ``rotation`` (degrees).
        codec, profile, pix_fmt, bit_depth, chroma, container: stream format.
        duration_s: duration in seconds.
        keyframes: presentation-order frame indices where a decode may start.
        vfr: variable-frame-rate hint (timestamps do not step evenly).
        interlaced: the stream is interlaced.
        deep_checked: the ``--deep`` check decoded it on this device.
        size_bytes: file size when probed.
        youtube_id, time_start, time_end: from the dataset index, if known.
        num_packets: non-empty video packets (DALI numbers frames by packet).
        unsafe_seek: the ``--deep`` check found that decoding from a keyframe
            after the start gives wrong frames: the fallback should decode this
            file from its start (``StreamHint(unsafe_seek=True)``).
    """

    path: str
    label: int
    class_name: str
    split: str
    route: Route
    reason: str
    num_frames: int
    fps: float | None
    width: int | None
    height: int | None
    codec: str | None
    profile: str | None
    pix_fmt: str | None
    bit_depth: int | None
    chroma: str | None
    rotation: int
    interlaced: bool
    duration_s: float | None
    keyframes: tuple[int, ...]
    vfr: bool
    base_fps: float | None
    container: str | None
    deep_checked: bool
    size_bytes: int
    youtube_id: str | None = None
    time_start: float | None = None
    time_end: float | None = None
    num_packets: int = 0
    unsafe_seek: bool = False


class RoutedManifest(ManifestStore):
    """A manifest's reads of routes per target (see the module docstring)."""

    @reads
    def entries(self, split: str | None = None, *, device: Device) -> list[ManifestEntry]:
        """Every file of ``split`` (all splits if ``None``), routed for ``device``, sorted by path.

        Raises:
            ValueError: unknown ``device``.
        """
        return [self._entry(row) for row in self._routed_rows(device, split)]

    def _route_sql(self, device: Device) -> _RouteSql:
        """How to read ``device``'s routes beside the files (see :class:`_RouteSql`).

        ``gpu:<default generation>`` is what ``gpu`` means: its rules rows are
        ``gpu``'s, and rows stored for it by name (a deep check) win. Another
        generation is complete when a scan stored a route for it for every file.
        """
        if device in DEVICES:
            return _RouteSql("r.route", "r.reason", "r.deep", "JOIN routes r ON r.path = f.path AND r.device = ?",
                             (device,), True)
        if device == f"gpu:{DEFAULT_GPU_GENERATION}":
            joins = ("JOIN routes r ON r.path = f.path AND r.device = 'gpu' "
                     "LEFT JOIN routes o ON o.path = f.path AND o.device = ?")
            return _RouteSql("COALESCE(o.route, r.route)", "COALESCE(o.reason, r.reason)", "COALESCE(o.deep, r.deep)",
                             joins, (device,), True)
        stored = self._conn.execute("SELECT COUNT(*) FROM routes WHERE device = ?", (device,)).fetchone()[0]
        return _RouteSql("r.route", "r.reason", "r.deep", "LEFT JOIN routes r ON r.path = f.path AND r.device = ?",
                         (device,), stored == len(self))

    @staticmethod
    def _files_query(columns: str, sql: _RouteSql, split: str | None) -> tuple[str, list]:
        query = f"SELECT {columns} FROM files f {sql.joins}"
        params: list = list(sql.params)
        if split is not None:
            query += " WHERE f.split = ?"
            params.append(split)
        return query + " ORDER BY f.path", params

    def _routed_rows(self, device: Device, split: str | None) -> list[tuple]:
        """File columns plus ``(route, reason, deep)`` on ``device``, sorted by path.

        Targets stored for every file are read (:meth:`_route_sql`); another
        GPU generation is routed here from the stored probe facts (no
        re-probe), with the rows a deep check stored for it winning.
        """
        check_device(device)
        sql = self._route_sql(device)
        columns = ", ".join(f"f.{c}" for c in FILE_COLUMNS) + f", {sql.route}, {sql.reason}, {sql.deep}"
        rows = self._conn.execute(*self._files_query(columns, sql, split)).fetchall()
        facts_at = len(FILE_COLUMNS) - len(FACT_COLUMNS)
        if not sql.complete:
            rows = [row if row[-3] is not None else
                    (*row[:-3], *route_for(facts_from_row(row[0], row[facts_at:len(FILE_COLUMNS)]), device), 0)
                    for row in rows]
        failed = self.failed_classes(device)
        if not failed:
            return rows
        # A class a test decode on this GPU could not decode goes to the fallback, whatever the table says.
        return [(*row[:-3], "fallback", failed[key], row[-1])
                if row[-3] == "dali" and (key := nvdec_class(facts_from_row(row[0], row[facts_at:len(FILE_COLUMNS)])))
                in failed else row
                for row in rows]

    # -- NVDEC classes confirmed on a GPU ------------------------------------------------------

    @reads
    def class_verdicts(self, target: Device) -> dict[str, tuple[bool, str]]:
        """``class -> (decoded, reason)`` of the test decodes run for ``target`` (see :mod:`.confirm`)."""
        try:
            rows = self._conn.execute("SELECT class, ok, reason FROM nvdec_classes WHERE target = ?", (target,))
            return {key: (bool(ok), reason) for key, ok, reason in rows}
        except sqlite3.OperationalError:  # a manifest opened read-only from before the table existed
            return {}

    def failed_classes(self, target: Device) -> dict[str, str]:
        """``class -> reason`` of the classes a test decode for ``target`` failed on."""
        return {key: reason for key, (ok, reason) in self.class_verdicts(target).items() if not ok}

    def record_class(self, target: Device, key: str, ok: bool, reason: str) -> None:
        """Store the verdict of a test decode of ``key`` files for ``target``."""
        self._require_writable()
        with self._transaction() as conn:
            conn.execute("INSERT OR REPLACE INTO nvdec_classes VALUES (?, ?, ?, ?)", (target, key, int(ok), reason))

    @staticmethod
    def _entry(row: Sequence) -> ManifestEntry:
        file = dict(zip(FILE_COLUMNS, row))
        facts = facts_from_row(file["path"], row[len(FILE_COLUMNS) - len(FACT_COLUMNS) :])
        route, reason, deep = row[len(FILE_COLUMNS) :]
        return ManifestEntry(
            path=file["path"], label=file["label"], class_name=file["class_name"],
            split=file["split"], route=route, reason=reason, deep_checked=bool(deep),
            size_bytes=file["size_bytes"], youtube_id=file["youtube_id"],
            time_start=file["time_start"], time_end=file["time_end"],
            **{name: getattr(facts, name) for name in _ENTRY_FACTS},
        )  # fmt: skip

    @reads
    def route_totals(
        self, device: Device, splits: Iterable[str] | None = None
    ) -> tuple[dict[str, int], dict[str, float], dict[tuple[str, str], int]]:
        """``(files per route, hours per route, files per (route, reason))`` on ``device``."""
        grouped = self._route_groups(device, splits)
        files: dict[str, int] = {}
        hours: dict[str, float] = {}
        reasons: dict[tuple[str, str], int] = {}
        for (route, reason), (count, seconds) in grouped.items():
            files[route] = files.get(route, 0) + count
            hours[route] = hours.get(route, 0.0) + seconds / 3600.0
            if reason:
                reasons[(route, reason)] = count
        return files, hours, reasons

    def _route_groups(self, device: Device, splits: Iterable[str] | None) -> dict[tuple[str, str], list]:
        """``(route, reason) -> [files, seconds]`` on ``device``: in SQL for stored targets."""
        check_device(device)
        wanted = None if splits is None else list(splits)
        if device in DEVICES and not self.failed_classes(device):
            where, params = "", [device]
            if wanted is not None:
                where = f" WHERE f.split IN ({', '.join('?' * len(wanted))})"
                params += wanted
            rows = self._conn.execute(
                "SELECT r.route, r.reason, COUNT(*), TOTAL(f.duration_s) FROM files f "
                f"JOIN routes r ON r.path = f.path AND r.device = ?{where} GROUP BY r.route, r.reason", params)
            return {(route, reason): [count, seconds] for route, reason, count, seconds in rows}
        grouped: dict[tuple[str, str], list] = {}
        for row in self._routed_rows(device, None):
            entry = self._entry(row)
            if wanted is None or entry.split in wanted:
                counts = grouped.setdefault((entry.route, entry.reason), [0, 0.0])
                counts[0] += 1
                counts[1] += entry.duration_s or 0.0
        return grouped


class _RouteSql(NamedTuple):
    """SQL that reads one route target's rows beside ``files f``: expressions, joins and their parameters.

    ``complete``: every file has a row, so no route is left to compute from the facts.
    """

    route: str
    reason: str
    deep: str
    joins: str
    params: tuple
    complete: bool
