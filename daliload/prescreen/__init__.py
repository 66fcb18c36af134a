"""The pre-screen: probe every file once, route it to DALI, the fallback, or out.

See :mod:`.probe` (what a file is), :mod:`.rules` (the capability table),
:mod:`.deep` (the ``--deep`` check), :mod:`.manifest` (the SQLite manifest:
its writes and its column index; :mod:`.manifest_store` its tables, meta and
reads, :mod:`.manifest_routes` its routes), :mod:`.rows` (what a scan stores
per file), :mod:`.sqlite_file` (the manifest's file: transactions, immutable
reads, errors), :mod:`.probe_pool` (probing in worker processes),
:mod:`.scan` (the resumable scan and :class:`ScanSpec`; :mod:`.scan_listing`
what it covers and what changed), :mod:`.scan_lock` (one scan at a time, and
who waits for whom), :mod:`.ensure` (a job's manifest, checked once:
:func:`ensure_manifest`, :func:`check_manifest`, :func:`split_videos`), :mod:`.source` (what a
loader's root, split, layout and fold name) and :mod:`.merge` (the manifests of a scan spread over
machines, joined).
"""

from daliload.prescreen.manifest import SCHEMA_VERSION, Manifest, ManifestEntry
from daliload.prescreen.probe import ProbeResult, probe_file
from daliload.prescreen.rules import (
    DALI_CAPABILITIES,
    DEVICES,
    ROUTES,
    RULES_VERSION,
    CodecSupport,
    Device,
    Route,
    route_for,
)
from daliload.prescreen.ensure import SplitVideos, check_manifest, ensure_manifest, split_codecs, split_videos
from daliload.prescreen.scan import ScanSpec, ScanSummary, default_manifest_path, scan
from daliload.prescreen.source import loader_source

__all__ = [
    "SCHEMA_VERSION",
    "Manifest",
    "ManifestEntry",
    "ProbeResult",
    "probe_file",
    "DALI_CAPABILITIES",
    "DEVICES",
    "ROUTES",
    "RULES_VERSION",
    "CodecSupport",
    "Device",
    "Route",
    "route_for",
    "ScanSpec",
    "ScanSummary",
    "default_manifest_path",
    "SplitVideos",
    "check_manifest",
    "ensure_manifest",
    "split_codecs",
    "split_videos",
    "loader_source",
    "scan",
]
