"""What each fallback worker is decoding, shared with the main process; and the workers' start-up.

The main process cannot ask a hung or dead worker what it was doing, so every
worker writes ``(pid, slot, started, state)`` into a shared array before and
after each decode. The :mod:`fallback.watchdog` reads it to cut a decode that
runs past its time limit and to name the sample a dead worker held.

Worker start-up (:func:`worker_init`) registers the worker on the board and
starts a thread that exits the worker once the training process is gone.
"""

from __future__ import annotations

import os
import threading
import time

IDLE, BUSY, TIMED_OUT = 0.0, 1.0, 2.0
_FIELDS = 4  # pid, slot index, start time (time.monotonic, system-wide on Linux), state


class ProgressBoard:
    """A shared array of ``(pid, slot, started, state)`` per worker.

    Workers write it before and after every decode; the main process reads it
    to cut hung decodes and to name the sample a dead worker was decoding.

    Args:
        ctx: the multiprocessing context the workers start with.
        num_workers: workers of the DataLoader.
    """

    def __init__(self, ctx, num_workers: int) -> None:
        self.num_workers = num_workers
        self.array = ctx.RawArray("d", [-1.0] * (num_workers * _FIELDS))

    # worker side
    def register(self, worker_id: int) -> None:
        self.array[worker_id * _FIELDS + 3] = IDLE
        self.array[worker_id * _FIELDS + 0] = float(os.getpid())

    def start(self, worker_id: int, slot: int) -> None:
        base = worker_id * _FIELDS
        self.array[base + 3] = IDLE
        self.array[base + 1] = float(slot)
        self.array[base + 2] = time.monotonic()
        self.array[base + 3] = BUSY

    def finish(self, worker_id: int) -> None:
        self.array[worker_id * _FIELDS + 3] = IDLE

    # main side
    def read(self, worker_id: int) -> tuple[int, int, float, float]:
        base = worker_id * _FIELDS
        pid, slot, started, state = self.array[base:base + _FIELDS]
        return int(pid), int(slot), started, state

    def mark_timed_out(self, worker_id: int) -> None:
        self.array[worker_id * _FIELDS + 3] = TIMED_OUT

    def reset(self) -> None:
        for i in range(len(self.array)):
            self.array[i] = -1.0


def worker_init(worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: join the dataset's board, watch the owner process."""
    import torch.utils.data

    info = torch.utils.data.get_worker_info()
    board = getattr(info.dataset, "board", None)
    if board is not None:
        board.register(worker_id)
    owner = getattr(info.dataset, "owner_pid", None)
    if owner is not None:
        threading.Thread(target=exit_when_gone, args=(owner,), name="daliload-owner-watch",
                         daemon=True).start()


def exit_when_gone(pid: int, poll_s: float = 1.0) -> None:
    """Worker side: exit once the process iterating the loader has died.

    torch's own watchdog compares ``os.getppid()`` with the pid it saw at
    start, but a forkserver worker's parent is the forkserver, which outlives a
    killed training process; without this, a ``kill -9`` of the trainer left
    its decoding workers running (seen on 2 cores, several minutes later).
    """
    while True:
        time.sleep(poll_s)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            os._exit(0)
        except PermissionError:  # the pid was reused by another user's process
            os._exit(0)
