"""Confirm on the GPU itself what the capability table promises: one tiny NVDEC decode per class.

The table (:mod:`.rules`) says what each NVDEC generation decodes, from
NVIDIA's published matrix. On a host with a GPU, a scan routing for that GPU
also checks it: for each (codec, profile, bit depth, chroma) class it routes to
DALI and has not checked yet, it decodes a window of one file of that class
through ``fn.decoders.video`` on that GPU (:func:`daliload.prescreen.deep.dali_check`,
one DALI pipeline per GPU, in the scanning process). The verdict is cached in
the manifest per route target (GPU generation), so later scans and other
files of the class never pay for it again; a class that fails goes to the
fallback for every file of it, with the decode's error as the reason.

Without a visible GPU (or without DALI) nothing is checked and the table
stands; the scan summary says whether the routes were confirmed.
"""

from __future__ import annotations

import logging
from typing import Callable

from daliload.prescreen.manifest import Manifest
from daliload.prescreen.rules import Device, nvdec_class

logger = logging.getLogger(__name__)

#: ``check(entry) -> ""`` when the file decodes, else why not.
Check = Callable[[object], str]


def gpu_visible() -> bool:
    """Whether this process can run a DALI decode on a GPU (torch sees one and DALI imports)."""
    try:
        import torch
    except ImportError:
        return False
    if not torch.cuda.is_available():
        return False
    from daliload.pipeline import is_dali_available

    return is_dali_available()


def confirm_classes(manifest: Manifest, target: Device, *, device_id: int = 0,
                    check: Check | None = None) -> dict[str, str]:
    """Test-decode one file of each class routed to DALI for ``target`` and not checked yet.

    Args:
        manifest: the scan's manifest, open for writing.
        target: a GPU route target (``"gpu"`` or ``"gpu:<generation>"``).
        device_id: the CUDA device to decode on.
        check: the test decode (default: :func:`daliload.prescreen.deep.dali_check`
            on the GPU); for tests.

    Returns:
        ``class -> ""`` (decoded) or the reason it did not, for the classes checked now.
    """
    if check is None:
        from daliload.prescreen.deep import dali_check

        def check(entry) -> str:
            return dali_check(entry, "gpu", device_id=device_id)

    known = manifest.class_verdicts(target)
    examples = {}
    for entry in manifest.entries(None, device=target):
        key = nvdec_class(entry)
        if entry.route == "dali" and key not in known and key not in examples:
            examples[key] = entry
    checked = {}
    for key, entry in examples.items():
        problem = check(entry)
        reason = "" if not problem else f"a test decode of a {key} file on this GPU failed: {problem}"
        manifest.record_class(target, key, not problem, reason)
        checked[key] = reason
        if problem:
            logger.warning("%s (%s): its class goes to the fallback", reason, entry.path)
    return checked
