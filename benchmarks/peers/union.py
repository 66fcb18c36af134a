"""Repeated sampling the recipes' way: the peers decode the union of a video's k windows in one call.

VideoMAE's loader (``num_sample`` > 1) opens a video once with decord
(``VideoReader(path, num_threads=1)``) and asks ``get_batch`` for every frame
its clips need; each clip then gets its own augmentation. The same here, for
each peer that decodes frames by index (the decode functions of the table's
peers, :mod:`benchmarks.peers`), on the plan daliload's loader draws:

- ``decord``: :func:`benchmarks.peers.decord_peer.decode_frames_one_thread`,
  ``VideoReader(num_threads=1).get_batch(union)``, as VideoMAE;
- ``torchcodec``: :func:`benchmarks.peers.torchcodec_peer.decode_frames_cpu_approximate`,
  ``VideoDecoder(seek_mode="approximate").get_frames_at(union)``: its fastest
  mode, exact on these constant-frame-rate files (no scan of the file);
- ``spdl``: :func:`benchmarks.peers.spdl_peer.decode_frames`,
  ``demux_video(window) + sample_decode_video(union)``: one demux of the span
  from the first to the last frame the clips need.

Then each clip's frames are cut from the union's and given the fallback's own
transform (:func:`benchmarks.task.transform_clip`), so every peer does
daliload's work: the same frames, crops, flips and output tensors. One item of
:class:`UnionDataset` is one video's group of k clips; the DataLoader
(spawned, persistent workers, as every ``-cpu`` peer) takes its batches from
:class:`PlanBatches`, which the benchmark points at the plan of the k it
times next, so one DataLoader per peer serves every k (its workers started
once).
"""

from __future__ import annotations

from typing import Callable, Iterator, Sequence

from benchmarks.peers import decord_peer, spdl_peer, torchcodec_peer
from benchmarks.task import DecodeFn
from daliload.plan import OutputSpec, Sample


def _probe_decord() -> str | None:
    try:
        import decord  # noqa: F401
    except (ImportError, OSError) as err:
        return f"decord does not import ({err}); pip install --no-deps decord==0.6.0"
    return None


#: peer -> (decode function, probe returning why it cannot run or None, one line for the report)
UNION_PEERS: dict[str, tuple[DecodeFn, Callable[[], str | None], str]] = {
    "decord": (decord_peer.decode_frames_one_thread, _probe_decord,
               "decord VideoReader(num_threads=1).get_batch(union of the k windows), as VideoMAE"),
    "torchcodec": (torchcodec_peer.decode_frames_cpu_approximate, lambda: torchcodec_peer._probe("cpu"),
                   "torchcodec VideoDecoder(seek_mode='approximate').get_frames_at(union of the k windows)"),
    "spdl": (spdl_peer.decode_frames, spdl_peer._probe,
             "SPDL demux_video(first..last frame) + sample_decode_video(union of the k windows)"),
}


def video_groups(batches: Sequence[Sequence[Sample]]) -> list[list[list[Sample]]]:
    """Each batch of a plan split into its videos' groups of clips (a video's clips are next to each other).

    Worked example: a batch ``[a1, a2, b1, b2]`` (two clips each of videos a
    and b, k = 2) gives ``[[[a1, a2], [b1, b2]]]``.
    """
    out = []
    for batch in batches:
        groups: list[list[Sample]] = []
        for sample in batch:
            if groups and groups[-1][0].path == sample.path:
                groups[-1].append(sample)
            else:
                groups.append([sample])
        out.append(groups)
    return out


def decode_union(decode: DecodeFn, group: Sequence[Sample], num_frames: int) -> list:
    """The frames of each clip of ``group`` (one video), from ONE decode of the union of their windows.

    Returns:
        One ``(T, H, W, 3)`` uint8 array or tensor per sample, in order.
    """
    windows = [sample.frame_indices(num_frames) for sample in group]
    union = sorted({index for window in windows for index in window})
    frames, _ = decode(group[0].path, union)
    row = {index: k for k, index in enumerate(union)}
    return [frames[[row[index] for index in window]] for window in windows]


class UnionDataset:
    """Map-style dataset: item ``i`` is group ``i`` (one video's clips) decoded at once and transformed.

    ``__getitem__`` returns ``(videos (k, C, T, H, W), labels (k,))``; :func:`collate` joins the groups of a
    batch. The decode function must be module-level (spawned workers pickle it).
    """

    def __init__(self, groups: Sequence[Sequence[Sample]], num_frames: dict[str, int], decode: DecodeFn,
                 output: OutputSpec) -> None:
        self.groups = [list(g) for g in groups]
        self.num_frames = dict(num_frames)
        self.decode = decode
        self.output = output

    def __len__(self) -> int:
        return len(self.groups)

    def __getitem__(self, i: int):
        import torch

        from benchmarks.task import transform_clip

        group = self.groups[i]
        clips = decode_union(self.decode, group, self.num_frames[group[0].path])
        videos = [transform_clip(frames, sample, self.output) for frames, sample in zip(clips, group)]
        return torch.stack(videos), torch.tensor([sample.label for sample in group])


def collate(items):
    import torch

    return torch.cat([videos for videos, _ in items]), torch.cat([labels for _, labels in items])


class PlanBatches:
    """A batch sampler the benchmark points at one plan at a time: its batches of group indices.

    The DataLoader draws from it in the main process at the start of each
    epoch, so :meth:`use` between epochs changes what the persistent workers
    decode next.
    """

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def use(self, batches: Sequence[Sequence[int]]) -> None:
        self.batches = [list(b) for b in batches]

    def __iter__(self) -> Iterator[list[int]]:
        return iter([list(b) for b in self.batches])

    def __len__(self) -> int:
        return len(self.batches)


class UnionLoader:
    """One peer over several plans (one per k): a spawn DataLoader of :class:`UnionDataset`.

    Args:
        peer: a :data:`UNION_PEERS` key.
        plans: name (e.g. ``"k=2"``) -> the plan's batches of samples.
        num_frames: frames of each video, by path (to clamp windows as the loader does).
        output: the loader's output spec (the same transform).
        workers: DataLoader worker processes (0: in this process).
    """

    def __init__(self, peer: str, plans: dict[str, Sequence[Sequence[Sample]]], num_frames: dict[str, int],
                 output: OutputSpec, *, workers: int) -> None:
        from torch.utils.data import DataLoader

        decode = UNION_PEERS[peer][0]
        groups: list[list[Sample]] = []
        self._batches: dict[str, list[list[int]]] = {}
        for name, batches in plans.items():
            self._batches[name] = []
            for batch_groups in video_groups(batches):
                self._batches[name].append(list(range(len(groups), len(groups) + len(batch_groups))))
                groups += batch_groups
        self._sampler = PlanBatches()
        extra = {"multiprocessing_context": "spawn", "persistent_workers": True, "prefetch_factor": 2} \
            if workers else {}
        self._loader = DataLoader(UnionDataset(groups, num_frames, decode, output), batch_sampler=self._sampler,
                                  num_workers=workers, collate_fn=collate, **extra)

    def epoch(self, plan: str) -> Iterator[tuple]:
        """``(videos, labels)`` batches of ``plan``, in the plan's order."""
        self._sampler.use(self._batches[plan])
        yield from self._loader

    def close(self) -> None:
        iterator = getattr(self._loader, "_iterator", None)
        if iterator is not None:
            iterator._shutdown_workers()
            self._loader._iterator = None
