"""DALI's legacy ``fn.readers.video``, used the way DALI's video examples use it.

The examples build a pipeline around the reader and iterate it with
``DALIGenericIterator``::

    video, label = fn.readers.video(device="gpu", filenames=files, labels=labels,
                                    sequence_length=16, stride=4, random_shuffle=True,
                                    initial_fill=..., name="Reader")
    video = fn.resize(video, resize_shorter=fn.random.uniform(range=(256, 320)))
    video = fn.crop_mirror_normalize(video, crop=(224, 224), crop_pos_x=..., crop_pos_y=...,
                                     mirror=fn.random.coin_flip(), mean=..., std=...,
                                     output_layout="CFHW", dtype=types.FLOAT16)

The reader is GPU-only. It cannot follow the plan: it enumerates the
``(file, start)`` windows of every file, one every ``step`` frames, and
shuffles them through a buffer of ``initial_fill`` windows, so an "epoch" here
is the same NUMBER of clips as the plan, drawn by the reader (long files
contribute more windows), not the plan's windows. ``step`` is set to the
frames one window covers (``clip_len * frame_stride``: 64 for 16 frames at
stride 4, so 4 windows in a 300-frame file), as intended: without it DALI
steps by ``sequence_length`` (16) and a window starts every 16 frames, each
overlapping the next three. It does not say how many frames it decoded.
"""

from __future__ import annotations

from typing import Iterator, Sequence

from benchmarks.loaders import LoadedBatch, LoaderAdapter


class DaliReadersVideo(LoaderAdapter):
    name = "dali-readers-video"
    summary = ("DALI legacy fn.readers.video(device='gpu', random_shuffle) + resize + crop_mirror_normalize; "
               "own windows, not the plan's")
    needs_cuda = True
    uses_nvdec = True
    plan_windows = False
    knob = "DALI threads"

    @classmethod
    def probe(cls, config) -> str | None:
        try:
            import nvidia.dali  # noqa: F401
            from nvidia.dali.plugin import pytorch  # noqa: F401
        except ImportError as err:
            return f"DALI is not installed ({err}); pip install nvidia-dali-cuda130 (or -cuda120 for drivers < 580)"
        return None

    def __init__(self, dataset, samples: Sequence, config) -> None:
        import torch
        from nvidia.dali import fn, pipeline_def, types
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        task = config.task
        self._num_clips = len(samples)
        files = [video.path for video in dataset.videos]
        labels = [video.label for video in dataset.videos]
        output = task.output

        @pipeline_def(batch_size=task.batch_size, num_threads=max(1, config.workers),
                      device_id=torch.cuda.current_device(), seed=task.seed)
        def reader_pipeline():
            video, label = fn.readers.video(
                device="gpu", filenames=files, labels=labels, sequence_length=task.clip_len,
                stride=task.frame_stride, step=task.clip_len * task.frame_stride, random_shuffle=True,
                # The examples keep the shuffle buffer small; the default (1024
                # windows) would hold GBs of decoded frames on the GPU.
                initial_fill=2 * task.batch_size, name="Reader")
            short_side = fn.random.uniform(range=[float(v) for v in task.short_side_range])
            video = fn.resize(video, resize_shorter=short_side)
            video = fn.crop_mirror_normalize(
                video, crop=(task.crop_size, task.crop_size),
                crop_pos_x=fn.random.uniform(range=(0.0, 1.0)), crop_pos_y=fn.random.uniform(range=(0.0, 1.0)),
                mirror=fn.random.coin_flip(probability=task.flip_prob),
                mean=list(output.mean), std=list(output.std), output_layout="CFHW", dtype=types.FLOAT16)
            return video, label

        self._pipeline = reader_pipeline()
        self._pipeline.build()
        self._iterator = DALIGenericIterator(self._pipeline, ["videos", "labels"], reader_name="Reader",
                                             last_batch_policy=LastBatchPolicy.PARTIAL, auto_reset=True)

    def _next(self):
        try:
            return next(self._iterator)
        except StopIteration:  # the reader's own epoch ended; auto_reset has rewound it
            return next(self._iterator)

    def epoch(self) -> Iterator[LoadedBatch]:
        remaining = self._num_clips
        while remaining > 0:
            data = self._next()[0]
            videos, labels = data["videos"], data["labels"]
            take = min(remaining, int(videos.shape[0]))
            remaining -= take
            yield LoadedBatch(videos[:take], labels[:take].view(-1), take, None)

    def close(self) -> None:
        del self._iterator
        del self._pipeline
