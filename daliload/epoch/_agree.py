"""Every rank's loader built from the same options and videos, or every rank raises: one collective.

:func:`refuse_disagreeing_ranks` compares what each rank's plan and batch
count follow, and the fingerprint of the videos each read, in one
``all_gather_object``; ranks that disagree would otherwise hang at DDP's next
collective or share the split unevenly.
"""

from __future__ import annotations

from daliload import runtime


def refuse_disagreeing_ranks(settings: dict[str, object], videos: tuple | None,
                             error: BaseException | None) -> None:
    """Every rank's loader built from the same options and videos, or every rank raises: one collective.

    Under ``torch.distributed``, each rank's ``settings`` (what its plan and
    batch count follow: root, split, batch size, seed, clip and crop ...),
    ``videos`` (``(manifest path, VideoIndex.fingerprint())`` of its split,
    ``None`` when it failed before reading them) and the error its construction
    raised, if any, go to every rank in one ``all_gather_object``. Ranks that
    disagree would not fail on their own: their ``len()`` differ and DDP's
    collectives pair unequal batches until the job hangs, or their shards
    overlap; so every rank raises the same ``ValueError``, naming each option
    that differs with each rank's value. A rank whose construction failed
    (``error``) makes the others raise a ``RuntimeError`` naming it, instead of
    waiting for it at the next collective. Every rank calls this at the same
    point, failed or not, so a refused construction leaves the process group
    in step (the next loader can be built). Without a process group: nothing.

    Raises:
        ValueError: the ranks' settings, or their lists of videos, differ.
        RuntimeError: another rank's construction failed (this rank's own
            error is for the caller to raise).
    """
    if not runtime.is_distributed():
        return
    failed = None if error is None else f"{type(error).__name__}: {error}"
    gathered = runtime.all_gather_object((settings, videos, failed))
    differ = [key for key in settings if any(entry[0].get(key) != settings.get(key) for entry in gathered)]
    if differ:
        raise ValueError(
            "the ranks were given different options: " + "; ".join(
                f"{key}: {_by_rank([entry[0].get(key) for entry in gathered], key)}" for key in differ)
            + ". Every rank must construct its loader with the same values (the plan, the shards and len() "
              "follow them: ranks that disagree overlap or hang at DDP's next collective)") from error
    failures = [(rank, entry[2]) for rank, entry in enumerate(gathered) if entry[2] is not None]
    if error is not None:
        return  # this rank's own error: the caller raises it
    if failures:
        raise RuntimeError("the loader failed on " + "; ".join(f"rank {rank}: {why}" for rank, why in failures)
                           + " (this rank stops too, instead of waiting for it at the next collective)")
    lists = [entry[1] for entry in gathered]
    if any(fingerprint != lists[0][1] for _, fingerprint in lists):
        raise ValueError(
            f"the ranks read different lists of videos for split {settings.get('split')!r}: "
            + "; ".join(f"rank {rank}: {fingerprint['videos']} videos from {manifest}"
                        + _differs_from(fingerprint, lists[0][1]) for rank, (manifest, fingerprint) in enumerate(lists))
            + ". Every rank must read the same manifest (the same dataset and pre-screen, routed for the same "
              "GPU generation): scan once, then pass that manifest, or one root, to every rank")


def _differs_from(fingerprint: dict, first: dict) -> str:
    """What differs between two ``VideoIndex.fingerprint()`` s, as `` (other files, labels than rank 0)``."""
    names = {"paths": "files", "labels": "labels", "facts": "frame counts, rates or sizes"}
    differ = [name for key, name in names.items() if fingerprint.get(key) != first.get(key)]
    return f" (other {', '.join(differ)} than rank 0)" if differ else ""


def _by_rank(values: list[object], key: str) -> str:
    """``key=A on rank 0, key=B on ranks 1-3``: each value once, with the ranks that have it (many ranks stay short)."""
    ranks: dict[str, list[int]] = {}
    for rank, value in enumerate(values):
        ranks.setdefault(repr(value), []).append(rank)
    return ", ".join(f"{key}={value} on {_ranks(numbers)}" for value, numbers in ranks.items())


def _ranks(numbers: list[int]) -> str:
    runs: list[list[int]] = []
    for number in numbers:
        if runs and number == runs[-1][1] + 1:
            runs[-1][1] = number
        else:
            runs.append([number, number])
    spans = [str(a) if a == b else f"{a}-{b}" for a, b in runs]
    return ("rank " if len(numbers) == 1 else "ranks ") + ", ".join(spans)
