"""A fallback task that stops its own worker (SIGSTOP) in the middle of a decode, once in a run.

Run by tests/test_exits_faults.py's scripts in the fallback's workers, instead of
``fallback.source.decode_rows``: the first task to claim ``marker`` (a file it
creates) stops its worker after the worker said it started it, as a debugger,
a Ctrl-Z of that pid or a frozen cgroup would; every other task decodes as usual.
"""

from __future__ import annotations

import os
import signal
from typing import Any, Sequence


def stopping_rows(task: tuple, fds: Sequence[int] = (), *, marker: str, **kwargs: Any) -> list:
    from fallback.source import decode_rows

    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        pass  # another task stopped its worker already
    else:
        os.kill(os.getpid(), signal.SIGSTOP)
    return decode_rows(task, fds, **kwargs)
