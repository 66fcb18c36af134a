"""The fallback's worker supervision relies on torch internals: fail loudly when a torch upgrade breaks them."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from fallback import _torch_internals as internals


class _DiesAtTwo(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> int:
        if index == 2:
            os._exit(3)
        return index


def test_the_private_names_exist_on_a_real_multi_process_iterator():
    loader = DataLoader(list(range(4)), batch_size=2, num_workers=1, multiprocessing_context="spawn")
    iterator = iter(loader)
    try:
        internals.check_iterator(iterator)  # raises naming the torch version if anything is gone
        workers = internals.workers(iterator)
        assert len(workers) == 1 and workers[0].pid > 0
        internals.register_worker_pids(iterator)
        assert iterator._worker_pids_set is True
        internals.unregister_worker_pids(iterator)
        assert iterator._worker_pids_set is False
        assert [b.tolist() for b in iterator] == [[0, 1], [2, 3]]
    finally:
        internals.shutdown(iterator)
    assert all(w.exitcode is not None for w in workers)


def _plain(batch: list) -> list:
    """Collate to a list: no tensor, so no shared-memory handle the main process could be fetching from a
    worker as it dies (that race surfaces as a ConnectionResetError, not torch's error under test)."""
    return batch


def test_a_worker_death_is_recognised_from_torchs_error():
    loader = DataLoader(_DiesAtTwo(), batch_size=1, num_workers=1, multiprocessing_context="spawn",
                        collate_fn=_plain)
    iterator = iter(loader)
    internals.register_worker_pids(iterator)
    with pytest.raises(RuntimeError) as info:
        for _ in iterator:
            pass
    internals.shutdown(iterator)
    assert internals.is_worker_loss(info.value), f"torch {torch.__version__} words a worker death differently: " \
                                                 f"{info.value}"
    assert internals.pids_in_error(info.value), f"no pid in torch {torch.__version__}'s error: {info.value}"


def test_a_missing_private_name_fails_loudly():
    class Iterator:
        _workers: list = []

    with pytest.raises(RuntimeError, match=r"torch .* changed the DataLoader internals .* \(missing: "
                                           r"_shutdown_workers, _worker_pids_set"):
        internals.check_iterator(Iterator())


def test_no_other_module_touches_torchs_private_dataloader_names():
    root = Path(__file__).resolve().parent.parent
    private = re.compile(r"torch\.utils\.data\._utils|_shutdown_workers|_worker_pids_set|iterator\._workers\b|"
                         r"[\"']_workers[\"']|[\"']_iterator[\"']")
    offenders = [str(path.relative_to(root)) for package in ("daliload", "fallback")
                 for path in sorted((root / package).rglob("*.py"))
                 if path.name != "_torch_internals.py" and private.search(path.read_text())]
    assert offenders == [], "torch's private DataLoader names belong in fallback/_torch_internals.py"
