"""Confirm on the GPU itself what the capability table promises: one tiny NVDEC decode per class.

The table (:mod:`.rules`) says what each NVDEC generation decodes, from
NVIDIA's published matrix. On a host with a GPU, a scan routing for that GPU
also checks it: for each (codec, profile, bit depth, chroma) class it routes to
DALI and has not checked yet, it decodes a window of one file of that class
through ``fn.decoders.video`` on that GPU (:func:`daliload.prescreen.deep.dali_check`,
in one supervised worker process: one DALI pipeline for the GPU, and a crash or
hang inside the driver costs that class, not the scan). The verdict is cached in
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
    from daliload.dali import is_dali_available

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
    known = manifest.class_verdicts(target)
    examples = {}
    for entry in manifest.entries(None, device=target):
        key = nvdec_class(entry)
        if entry.route == "dali" and key not in known and key not in examples:
            examples[key] = entry
    if check is not None:
        problems = {key: check(entry) for key, entry in examples.items()}
    else:
        problems = _isolated_checks(examples, device_id)
    checked = {}
    for key, entry in examples.items():
        problem = problems[key]
        reason = "" if not problem else f"a test decode of a {key} file on this GPU failed: {problem}"
        manifest.record_class(target, key, not problem, reason)
        checked[key] = reason
        if problem:
            logger.warning("%s (%s): its class goes to the fallback", reason, entry.path)
    return checked


def _test_decode(task: tuple[object, int]) -> str:
    """Worker side: the DALI test decode of one file (``""`` when it decodes)."""
    from daliload.prescreen.deep import dali_check

    entry, device_id = task
    return dali_check(entry, "gpu", device_id=device_id)


def _isolated_checks(examples: dict, device_id: int) -> dict[str, str]:
    """Run the test decodes in one supervised worker process: one DALI pipeline for the GPU, and a
    crash or hang inside the driver costs that class (it goes to the fallback), not the scan."""
    from daliload.runtime import WorkerPool

    keys = {id(entry): key for key, entry in examples.items()}
    problems = {}
    with WorkerPool(_test_decode, workers=1, timeout_s=120.0, tasks_per_worker=1) as pool:
        for outcome in pool.imap_unordered([(entry, device_id) for entry in examples.values()]):
            key = keys[id(outcome.item[0])]
            problems[key] = outcome.value if outcome.ok else f"{outcome.status}: {outcome.error}"
    return problems
