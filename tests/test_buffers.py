"""The fallback's shared buffers on the CPU come back for reuse when the last tensor over a batch goes, and
never while one is held: a view, a numpy array, a list of batches the training loop keeps.

Through the loader: every batch shows its planned frames whether the loop drops each batch (buffers reused)
or keeps them all (none can be), and dropping them makes the ring reuse its buffers instead of making one a
batch.
"""

from __future__ import annotations

import gc
import os

import pytest
import torch
from helpers.frames import check_rows

from daliload.loader import DecodeSpec, KineticsDALILoader
from daliload.plan import AugmentSpec, OutputSpec
from fallback.buffers import ReusedBuffers
from fallback.source import map_rows

SHAPE = (2, 3, 4, 16, 16)  # 24 KiB of float32 a row: 6 pages


def _open(fd: int, inode: int) -> bool:
    """``fd`` is still the buffer whose inode is ``inode`` (a closed number may be taken by another file)."""
    try:
        return os.fstat(fd).st_ino == inode
    except OSError:
        return False


def _inode(fd: int) -> int:
    return os.fstat(fd).st_ino


def test_a_buffer_comes_back_when_its_batch_goes_and_serves_the_next_group():
    ring = ReusedBuffers(keep=2)
    videos, fd, _ = ring.take(SHAPE, torch.float32)
    videos.fill_(3.0)
    del videos
    gc.collect()
    again, fd_again, _ = ring.take(SHAPE, torch.float32)
    assert (ring.made, ring.reused) == (1, 1) and fd_again == fd
    assert torch.equal(again, torch.full(SHAPE, 3.0)), "the same pages, not new ones"
    ring.close()


@pytest.mark.parametrize("keep_alive", ["view", "numpy", "storage", "list"])
def test_a_buffer_held_through_anything_over_it_is_not_reused(keep_alive):
    """Whatever still reaches the batch's memory keeps its buffer out of the ring: the next group gets a new one
    and the held memory keeps its values."""
    ring = ReusedBuffers(keep=2)
    videos, fd, _ = ring.take(SHAPE, torch.float32)
    videos.fill_(7.0)
    held = {"view": lambda v: v[1].permute(1, 0, 2, 3), "numpy": lambda v: v.numpy(),
            "storage": lambda v: v.untyped_storage(), "list": lambda v: [v]}[keep_alive](videos)
    del videos
    gc.collect()
    other, other_fd, _ = ring.take(SHAPE, torch.float32)
    assert ring.made == 2 and ring.reused == 0 and other_fd != fd
    other.fill_(-1.0)
    first = torch.tensor([], dtype=torch.float32).set_(held) if keep_alive == "storage" else \
        (held[0] if keep_alive == "list" else torch.as_tensor(held))
    assert bool((first == 7.0).all()), "a held batch was written over"
    del held, first, other
    gc.collect()
    ring.close()


def test_a_discarded_buffer_is_freed_not_reused():
    """A group dropped while a decode may still write into it (FallbackSource.cancel) never serves again."""
    ring = ReusedBuffers(keep=2)
    videos, fd, lease = ring.take(SHAPE, torch.float32)
    inode = _inode(fd)
    lease.discard()
    del videos
    gc.collect()
    assert not _open(fd, inode)
    ring.take(SHAPE, torch.float32)
    assert (ring.made, ring.reused) == (2, 0)
    ring.close()


def test_the_ring_keeps_at_most_keep_buffers_the_largest_and_a_smaller_group_fits_a_larger_buffer():
    ring = ReusedBuffers(keep=1)
    small = ring.take((1, *SHAPE[1:]), torch.float32)
    large = ring.take(SHAPE, torch.float32)  # larger than any so far: a new buffer
    fds = (small[1], large[1])
    inodes = [_inode(fd) for fd in fds]
    del small, large
    gc.collect()
    smaller_again, fd, _ = ring.take((1, *SHAPE[1:]), torch.float32)
    assert fd == fds[1], "the one kept is the largest, and the small group fits it"
    assert not _open(fds[0], inodes[0]), "past keep, a buffer that comes back is freed"
    assert smaller_again.shape == (1, *SHAPE[1:]) and ring.made == 2
    ring.close()


def test_close_frees_the_waiting_buffers_and_those_lent_when_they_come_back_and_the_ring_serves_again():
    ring = ReusedBuffers(keep=4)
    waiting, waiting_fd, _ = ring.take(SHAPE, torch.float32)
    lent, lent_fd, _ = ring.take(SHAPE, torch.float32)
    inodes = _inode(waiting_fd), _inode(lent_fd)
    del waiting
    gc.collect()
    ring.close()
    assert not _open(waiting_fd, inodes[0]) and _open(lent_fd, inodes[1]), "a lent buffer stays until its batch goes"
    del lent
    gc.collect()
    assert not _open(lent_fd, inodes[1])
    videos, _, _ = ring.take(SHAPE, torch.float32)  # a loader stays usable after close()
    assert videos.shape == SHAPE and ring.made == 3
    ring.close()


def test_keep_below_one_is_refused():
    with pytest.raises(ValueError, match="keep must be >= 1"):
        ReusedBuffers(keep=0)


def test_a_worker_maps_a_reused_buffers_rows_and_writes_where_the_batch_reads():
    """map_rows over a buffer of the ring: the rows a worker writes are the rows of the tensor handed out."""
    ring = ReusedBuffers(keep=1)
    videos, fd, _ = ring.take(SHAPE, torch.float32)
    del videos
    gc.collect()
    videos, fd, _ = ring.take(SHAPE, torch.float32)
    worker = map_rows(fd, SHAPE, torch.float32, [1])
    worker[1] = 5.0
    assert bool((videos[1] == 5.0).all()) and ring.reused == 1
    del worker, videos
    ring.close()


RAW = OutputSpec(size=(48, 64), mean=(0, 0, 0), std=(1, 1, 1), dtype="float32")
WHOLE = AugmentSpec(crop_size=(48, 64), crop_mode="center", flip_prob=0.5)


def test_through_the_loader_batches_are_right_whether_the_loop_keeps_them_or_drops_them(small_kinetics):
    """Keeping every batch of an epoch (no buffer can come back) and dropping each at once (buffers reused)
    give the planned frames in every row, and the same tensors; dropping them reuses buffers instead of
    making one a batch."""
    loader = KineticsDALILoader(small_kinetics, "train", batch_size=2, clip_len=6, frame_stride=3, augment=WHOLE,
                                output=RAW, decode=DecodeSpec(decoder="fallback", fallback_workers=2))
    try:
        frames = {v.path: v.num_frames for v in loader.videos}
        plan = loader.plan(0)
        loader.set_epoch(0)
        kept = [videos for videos, _ in loader]
        assert len({v.untyped_storage().data_ptr() for v in kept}) == len(kept), "two kept batches share memory"
        ring = loader.sources.buffers
        assert isinstance(ring, ReusedBuffers)
        for videos, batch in zip(kept, plan):
            check_rows(videos, batch, frames, flips=True)
        made = []
        for _ in range(3):
            loader.set_epoch(0)
            for k, (videos, _) in enumerate(loader):
                assert torch.equal(videos, kept[k]), f"batch {k} differs when buffers are reused"
                check_rows(videos, plan[k], frames, flips=True)
                del videos
            made.append(ring.made)
        assert ring.reused >= len(plan), "dropped batches' buffers were not reused"
        assert made[2] == made[1], "buffers are still made once the ring holds what a pass has in flight"
    finally:
        loader.close()
