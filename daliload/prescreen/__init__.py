"""The pre-screen: probe every file once, route it to DALI, the fallback, or out.

See :mod:`.probe` (what a file is), :mod:`.rules` (the capability table),
:mod:`.deep` (the ``--deep`` check), :mod:`.manifest` (the SQLite manifest) and
:mod:`.scan` (the parallel, resumable scan).
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
from daliload.prescreen.scan import ScanSummary, default_manifest_path, ensure_manifest, scan

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
    "ScanSummary",
    "default_manifest_path",
    "ensure_manifest",
    "scan",
]
