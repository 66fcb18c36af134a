"""Accuracy over a validation split: every video counted exactly once, on any number of ranks.

:func:`evaluate` runs a model over one full pass of a validation
:class:`~daliload.KineticsDALILoader` and returns the same
:class:`EvalResult` on every rank. The plan (:meth:`KineticsDALILoader.plan`)
says which video each batch row is, so nothing is inferred from the tensors:

- a row whose sample is padding (repeated only to give every rank the same
  number of batches; left out of the batches by default) is dropped;
- a row that failed to decode at run time carries label -1 (the loader masks
  it on evaluation splits): it is dropped and listed in ``EvalResult.failed``;
- every other row is one video, scored once.

Then the ranks compare notes (``torch.distributed``, when a process group is
initialised): the videos scored plus the videos failed must be exactly the
split's decodable videos (``loader.videos``), each once. Anything else (a
``last_batch="drop"`` loader, a pass resumed midway, two ranks with different
plans) raises :class:`EvaluationCountError` naming the missing and repeated
files, on every rank, instead of reporting a number over the wrong videos.

A batch's ``videos`` is ``(B, C, T, H, W)`` (one view per video) or
``(B, V, C, T, H, W)`` (``V`` views per video; ``T, C`` for layout TCHW): the
model sees ``(N, C, T, H, W)`` chunks of at most ``views_per_forward`` views,
and a video's score is the mean (or max) of its views' softmax scores.
Floating-point clips are cast to the dtype of the model's parameters first:
the loader yields float16 by default and a model is usually float32, which a
``Linear`` layer refuses (``mat1 and mat2 must have the same dtype``).

Sums are taken in rank order from per-rank totals, so top-1/top-5 do not
depend on the world size; the loss may differ in its last bits.
"""

from __future__ import annotations

import itertools
import math
import sys
from dataclasses import dataclass, field
from typing import Any, Literal, Sequence

import torch
from tqdm import tqdm

from daliload import runtime

Reduce = Literal["mean", "max"]


class EvaluationCountError(RuntimeError):
    """The videos scored across ranks are not the split's decodable videos, each exactly once."""


@dataclass(frozen=True)
class EvalResult:
    """What :func:`evaluate` found, identical on every rank (except ``video_scores``).

    Attributes:
        num_videos: videos scored (the split's decodable videos minus ``failed``).
        topk: accuracy (0..1) for each ``k`` asked for.
        per_class_top1: top-1 accuracy of each class (by label); ``nan`` for a
            class with no scored video.
        mean_class_top1: mean of ``per_class_top1`` over the classes that have videos.
        loss: mean negative log of the score given to the true class (the
            cross-entropy of the aggregated scores); ``None`` when a label falls
            outside the model's classes.
        failed: paths of videos that failed to decode at run time (not scored).
        views: views per video.
        video_scores: on rank 0, ``{path: scores}`` (the aggregated softmax
            scores, float32, CPU) for every scored video; ``None`` on other ranks.
    """

    num_videos: int
    topk: dict[int, float]
    per_class_top1: tuple[float, ...]
    mean_class_top1: float
    loss: float | None
    failed: tuple[str, ...] = ()
    views: int = 1
    video_scores: dict[str, torch.Tensor] | None = field(default=None, repr=False)

    @property
    def top1(self) -> float:
        return self.topk[1]

    @property
    def top5(self) -> float | None:
        return self.topk.get(5)

    def format(self) -> str:
        """One line, e.g. ``"1000 videos x 30 views: top-1 0.742, top-5 0.915, mean class top-1 0.731"``."""
        accuracies = ", ".join(f"top-{k} {acc:.3f}" for k, acc in sorted(self.topk.items()))
        failed = f" ({len(self.failed)} failed to decode, not counted)" if self.failed else ""
        return (f"{self.num_videos} videos x {self.views} view{'s' * (self.views > 1)}: {accuracies}, "
                f"mean class top-1 {self.mean_class_top1:.3f}{failed}")


@dataclass
class _RankTally:
    """One rank's share, as plain data (it crosses ranks with ``all_gather_object``)."""

    scored: list[int] = field(default_factory=list)  # video indices
    failed: list[int] = field(default_factory=list)
    correct: dict[int, int] = field(default_factory=dict)  # k -> videos right within top-k
    class_correct: dict[int, int] = field(default_factory=dict)
    class_total: dict[int, int] = field(default_factory=dict)
    loss_sum: float = 0.0
    loss_ok: bool = True
    views: int = 1


def evaluate(
    model: torch.nn.Module,
    loader: Any,
    *,
    topk: Sequence[int] = (1, 5),
    reduce: Reduce = "mean",
    views_per_forward: int | None = None,
    progress: bool | None = None,
) -> EvalResult:
    """Score ``model`` on every video of ``loader``'s split exactly once; the same result on every rank.

    Args:
        model: maps ``(N, C, T, H, W)`` (the loader's layout) to ``(N, num_classes)`` logits.
            Put in eval mode for the pass and restored afterwards. Floating-point
            clips are cast to the dtype of its first floating-point parameter (or
            buffer) before each call, so float16 batches feed a float32 model
            (and float32 batches a bfloat16 one); uint8 clips are passed as they
            are. Under ``torch.autocast`` the autocast dtype still decides what
            each layer computes in.
        loader: a :class:`~daliload.KineticsDALILoader` that neither shuffles
            nor augments (an evaluation split such as ``"val"``, or
            ``shuffle=False, augment=False``), at the start of a pass; its
            padding left out (``label_padding="drop"``, the default) or
            labelled, tuples or dicts (``batch_format``).
        topk: the ``k`` of the top-k accuracies (1 is always included).
        reduce: how a video's views are combined: ``"mean"`` or ``"max"`` of their softmax scores.
        views_per_forward: at most this many views per model call (bounds
            memory: a batch of 8 videos x 30 views is 240 clips); ``None``
            runs a whole batch at once.
        progress: a progress bar (batches, on stderr) on rank 0: ``None``
            (default) shows it when stderr is a terminal, ``True`` always,
            ``False`` never. Other ranks never show one.

    Raises:
        ValueError: a training loader, one set to resume mid-epoch, bad ``topk``,
            ``reduce`` or ``views_per_forward``.
        EvaluationCountError: the videos scored across ranks are not the
            split's decodable videos, each once (the message names them).
    """
    ks = _check_args(loader, topk, reduce, views_per_forward)
    if progress is not None and not isinstance(progress, bool):
        raise ValueError(f"progress must be True, False or None (on a terminal), got {progress!r}")
    plan = loader.plan()
    tally = _RankTally(correct={k: 0 for k in ks})
    was_training = model.training
    model.eval()
    bar = tqdm(total=len(plan), unit="batch", desc=f"evaluate {getattr(loader, 'split', '')}".rstrip(),
               disable=not _shows_progress(progress), dynamic_ncols=True, leave=False)
    try:
        with torch.no_grad():
            scores = _score_pass(model, loader, plan, tally, ks, reduce, views_per_forward, bar.update)
    finally:
        bar.close()
        model.train(was_training)
    return _combine(loader, tally, scores, ks)


def _shows_progress(progress: bool | None) -> bool:
    """Rank 0 only; ``None``: when stderr is a terminal (not in a log file or a CI job)."""
    if runtime.rank() != 0 or progress is False:
        return False
    if progress is None:
        isatty = getattr(sys.stderr, "isatty", None)
        return bool(isatty is not None and isatty())
    return True


def _input_dtype(model: torch.nn.Module) -> torch.dtype | None:
    """The dtype the model computes in: that of its first floating-point parameter or buffer."""
    for tensor in itertools.chain(model.parameters(), model.buffers()):
        if tensor.is_floating_point():
            return tensor.dtype
    return None


def _check_args(loader: Any, topk: Sequence[int], reduce: str, views_per_forward: int | None) -> list[int]:
    if not getattr(loader, "evaluating", getattr(loader, "split", None) != "train"):
        raise ValueError(f"evaluate() needs an evaluation split, a loader that neither shuffles nor augments; this "
                         f"one (split="
                         f"{getattr(loader, 'split', None)!r}) shuffles or draws random windows: make one with "
                         f"split='val', or shuffle=False, augment=False")
    start = getattr(loader, "resumes_at", 0)
    if 0 < start < len(loader):
        raise ValueError(f"evaluate() needs a whole pass to count every video once, but load_state_dict() set "
                         f"this loader to resume at batch {start} of {len(loader)}: evaluate with a loader that "
                         f"was not given a mid-epoch state (an evaluation loader needs none)")
    if reduce not in ("mean", "max"):
        raise ValueError(f"reduce must be 'mean' or 'max', got {reduce!r}")
    if views_per_forward is not None and (not isinstance(views_per_forward, int) or views_per_forward < 1):
        raise ValueError(f"views_per_forward must be an int >= 1 or None, got {views_per_forward!r}")
    ks = sorted({1, *topk})
    if any(not isinstance(k, int) or k < 1 for k in ks):
        raise ValueError(f"topk must be ints >= 1, got {tuple(topk)}")
    return ks


def _score_pass(model, loader, plan, tally: _RankTally, ks: list[int], reduce: str,
                views_per_forward: int | None, done) -> dict[int, torch.Tensor]:
    """Run the pass; fill ``tally``; call ``done(1)`` after each batch; return ``{video_index: scores}``."""
    kept: dict[int, torch.Tensor] = {}
    batches = iter(loader)
    for number, samples in enumerate(plan):
        try:
            batch = next(batches)
            if isinstance(batch, dict):  # a loader with batch_format="dict"
                videos, labels = (batch[key] for key in loader.batch_keys)
            else:
                videos, labels = batch[:2]  # (videos, labels[, info]): with_info loaders too
        except StopIteration:
            raise EvaluationCountError(f"the loader yielded {number} batches where its plan has {len(plan)}") from None
        if videos.dim() == 5:
            videos = videos.unsqueeze(1)
        views = videos.shape[1]
        rows = list(samples)[::views]  # the plan lists a video's views one after another
        if len(rows) != videos.shape[0]:
            raise EvaluationCountError(f"batch {number} has {videos.shape[0]} videos where the plan has {len(rows)}")
        tally.views = views
        scores = _video_scores(model, videos, views_per_forward, reduce)
        labels = labels.to("cpu")
        for row, sample in enumerate(rows):
            if sample.is_padding:
                continue
            if int(labels[row]) < 0:
                tally.failed.append(sample.video_index)
                continue
            if int(labels[row]) != sample.label:
                raise EvaluationCountError(f"batch {number} row {row} has label {int(labels[row])} where the plan "
                                           f"has {sample.label} for {sample.path}")
            _count(tally, scores[row], int(sample.label), ks)
            tally.scored.append(sample.video_index)
            kept[sample.video_index] = scores[row]
        done(1)
    if next(batches, None) is not None:
        raise EvaluationCountError(f"the loader yielded more batches than the {len(plan)} of its plan")
    return kept


def _video_scores(model, videos: torch.Tensor, views_per_forward: int | None, reduce: str) -> torch.Tensor:
    """``(B, num_classes)`` float32 CPU scores: softmax per view, then the mean or max over views."""
    num_videos, views = videos.shape[:2]
    flat = videos.reshape(num_videos * views, *videos.shape[2:])
    dtype = _input_dtype(model)
    if dtype is None or not flat.is_floating_point():
        dtype = flat.dtype
    step = views_per_forward or flat.shape[0]
    # Cast chunk by chunk: a float32 copy of a whole 30-view batch would double its memory.
    logits = torch.cat([model(flat[i:i + step].to(dtype)) for i in range(0, flat.shape[0], step)])
    if logits.dim() != 2 or logits.shape[0] != flat.shape[0]:
        raise ValueError(f"the model returned shape {tuple(logits.shape)} for {flat.shape[0]} clips; "
                         f"evaluate() needs (clips, num_classes) logits")
    probs = torch.softmax(logits.float(), dim=1).reshape(num_videos, views, -1)
    return (probs.mean(dim=1) if reduce == "mean" else probs.amax(dim=1)).cpu()


def _count(tally: _RankTally, scores: torch.Tensor, label: int, ks: list[int]) -> None:
    top = torch.topk(scores, min(max(ks), scores.numel())).indices.tolist()
    for k in ks:
        tally.correct[k] += int(label in top[:k])
    tally.class_total[label] = tally.class_total.get(label, 0) + 1
    tally.class_correct[label] = tally.class_correct.get(label, 0) + int(top[0] == label)
    if 0 <= label < scores.numel():
        tally.loss_sum += -math.log(max(float(scores[label]), 1e-12))
    else:
        tally.loss_ok = False


def _combine(loader: Any, tally: _RankTally, scores: dict[int, torch.Tensor], ks: list[int]) -> EvalResult:
    """Every rank's tally, checked for exactly-once and summed in rank order."""
    tallies: list[_RankTally] = runtime.all_gather_object(tally)
    videos = loader.videos
    _check_exactly_once(videos, tallies)
    scored = sum(len(t.scored) for t in tallies)
    num_classes = max(len(getattr(loader, "classes", ())), 1 + max((c for t in tallies for c in t.class_total),
                                                                      default=-1))
    per_class = []
    for label in range(num_classes):
        total = sum(t.class_total.get(label, 0) for t in tallies)
        per_class.append(sum(t.class_correct.get(label, 0) for t in tallies) / total if total else math.nan)
    present = [acc for acc in per_class if not math.isnan(acc)]
    loss_ok = all(t.loss_ok for t in tallies) and scored > 0
    gathered = runtime.gather_object(scores)
    video_scores = None
    if gathered is not None:
        video_scores = {str(videos[i].path): s for part in gathered for i, s in part.items()}
    return EvalResult(
        num_videos=scored,
        topk={k: sum(t.correct[k] for t in tallies) / scored if scored else math.nan for k in ks},
        per_class_top1=tuple(per_class),
        mean_class_top1=sum(present) / len(present) if present else math.nan,
        loss=sum(t.loss_sum for t in tallies) / scored if loss_ok else None,
        failed=tuple(sorted(str(videos[i].path) for t in tallies for i in t.failed)),
        views=max(t.views for t in tallies),
        video_scores=video_scores,
    )


def _check_exactly_once(videos: Sequence[Any], tallies: list[_RankTally]) -> None:
    seen: dict[int, int] = {}
    for t in tallies:
        for index in (*t.scored, *t.failed):
            seen[index] = seen.get(index, 0) + 1
    missing = [i for i in range(len(videos)) if i not in seen]
    repeated = sorted(i for i, n in seen.items() if n > 1)
    unknown = sorted(i for i in seen if not 0 <= i < len(videos))
    if not (missing or repeated or unknown):
        return

    def names(indices: list[int]) -> str:
        shown = ", ".join(str(videos[i].path) if 0 <= i < len(videos) else f"#{i}" for i in indices[:5])
        return shown + (f" and {len(indices) - 5} more" if len(indices) > 5 else "")

    problems = []
    if missing:
        problems.append(f"{len(missing)} never seen ({names(missing)})")
    if repeated:
        problems.append(f"{len(repeated)} counted more than once ({names(repeated)})")
    if unknown:
        problems.append(f"{len(unknown)} not in the split ({names(unknown)})")
    raise EvaluationCountError(f"evaluate() must see each of the split's {len(videos)} decodable videos once "
                               f"across {len(tallies)} rank(s); " + "; ".join(problems))
