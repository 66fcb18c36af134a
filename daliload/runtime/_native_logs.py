"""What FFmpeg and DALI print themselves: kept off the console, so that a bad file is reported once, by daliload.

A file that breaks at run time is reported by daliload, with its path (one
:class:`~daliload.failures.DecodeFailureWarning` per epoch, ``loader.stats()``).
The native libraries that fail on it also write their own lines to the
process's stderr (file descriptor 2, past ``sys.stderr``), naming no file::

    [matroska,webm @ 0x7f5528004d00] File ended prematurely                            FFmpeg
    [/opt/dali/dali/operators/video/frames_decoder_base.cc:245] Failed to open video   DALI
        file from memory buffer due to: Invalid data found when processing input

(once per decode: a batch DALI fails on is decoded again in halves to find
the file). Who prints them, and what keeps each off the console:

- **FFmpeg inside PyAV**, in daliload's worker processes (fallback decoders,
  probes): nothing to undo. PyAV installs a log callback that drops every
  line when it is imported (``av.logging``); each worker keeps it so
  (:func:`configure_worker`, from :func:`daliload.runtime._processes.worker_main`).
  The user's own process, where ``DecodeSpec(fallback_workers=0)`` decodes,
  keeps the user's PyAV settings.
- **FFmpeg inside DALI**: DALI ships its own FFmpeg
  (``nvidia/dali/.libs/libavutil-*.so``, its symbols versioned apart from
  PyAV's) and sets its level to ``AV_LOG_ERROR`` in every decoder it creates
  (``frames_decoder_base.cc``), so no level set once holds. Its log callback
  is set to none (``av_log_set_callback(NULL)``, which FFmpeg's ``av_vlog``
  reads as "log nothing"), in that copy of FFmpeg only, in the process that
  builds a DALI pipeline (:func:`quiet_dali`). They are dropped, not routed
  to ``logging``: FFmpeg hands its debug lines to the callback too, so a
  Python callback would take the GIL about 35 times per decoded clip (VP9 on
  the CPU, counted).
- **DALI itself** writes its warnings (``DALI_WARN``) to ``std::cerr``
  unconditionally: DALI 2.4 has no log level or variable for them
  (``DALI_LOG_FILE`` only takes cache statistics). The only place they can
  be stopped is file descriptor 2 itself, which is why this changes more of
  the user's process than the rest: the process that builds a DALI pipeline
  has its stderr passed through a relay process (:class:`StderrFilter`) that
  drops the lines starting with a DALI source location
  (``[/.../dali/....cc:245] ``) and passes every other byte on unchanged, as
  it comes, until the process ends.

The relay is a process, not a thread, because what a crash writes last
(``faulthandler``, "terminate called ...", glibc's abort messages) would die
unread in a pipe with the crashed process: the relay reads on to the end of
the pipe and then exits. It runs with Ctrl-C and SIGTERM blocked (the
training process decides what they stop), and its only state is the start of a line that might still be
DALI's. What changes for the process: its stderr is a pipe from then on
(a pseudo-terminal when it was a terminal, so ``isatty()`` and its size hold;
a pipe otherwise); processes it starts later write their stderr through the relay too;
and a line written to stderr can reach the console (or a log shared with
stdout) a moment after a line written to stdout at the same time, or after
the process has exited.

Should the relay die (the OOM killer, a stray ``kill -9``), the process must
not lose its stderr with it: every later warning, log line and its final
traceback would go into a pipe nobody reads. A daemon thread of the process
waits for the pipe's reading end to go (:func:`_watch_relay`) and then puts
the original stderr back on file descriptor 2, with a warning: DALI's own
lines show from then on, and nothing else is lost (but what was written in
the moment between the two). Processes started before that (the workers)
still write into the broken pipe.

``DALILOAD_NATIVE_LOGS=1`` in the environment turns all of this off: DALI's
FFmpeg and DALI print as they do without daliload, stderr is left alone, and
daliload's workers print FFmpeg's lines too (``av.logging.restore_default_callback``).

This module imports no DALI (``fallback/`` never does, and the workers import
this module): :func:`quiet_dali` finds the DALI its caller imported.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import logging
import os
import re
import select
import signal
import sys
import threading

logger = logging.getLogger(__name__)

#: Set to ``1`` to see FFmpeg's and DALI's own log lines (debugging a decoder).
NATIVE_LOGS_ENV = "DALILOAD_NATIVE_LOGS"
#: A line DALI writes itself: ``DALI_WARN``'s prefix, ``[<DALI source file>:<line>] ``.
DALI_LINE = re.compile(rb"\[/[^\]\n]*/dali/[^\]\n]*\.(?:cc|cu|h|cuh|cpp|hpp):\d+\] ")
#: How long the relay holds the start of a line that may be DALI's for its end (DALI writes its
#: message and the newline separately), before it passes it on as it is.
HOLD_S = 0.5
#: The longest start of a line held back.
HOLD_BYTES = 64 * 1024

_lock = threading.Lock()
_dali_quiet = False
_relay_pid: int | None = None


def native_logs_wanted() -> bool:
    """Whether ``DALILOAD_NATIVE_LOGS`` asks for FFmpeg's and DALI's own lines (set, and not ``0``)."""
    return os.environ.get(NATIVE_LOGS_ENV, "") not in ("", "0")


def configure_worker() -> None:
    """Start-up of a daliload worker process: PyAV's FFmpeg stays silent, or prints if asked to.

    Silence is PyAV's own default (a callback that drops every line, set when
    ``av`` is imported); this states it, whatever the worker imported.
    """
    try:
        import av.logging
    except ImportError:  # a worker without PyAV decodes nothing with it
        return
    if native_logs_wanted():
        av.logging.restore_default_callback()
    else:
        av.logging.set_level(None)


def quiet_dali() -> None:
    """In a process about to build a DALI pipeline (DALI imported): keep DALI's FFmpeg and DALI's warnings
    off stderr.

    Once per process, from then until it exits; nothing when
    ``DALILOAD_NATIVE_LOGS`` is set. What it does and why: the module docstring.
    """
    global _dali_quiet
    with _lock:
        if _dali_quiet:
            return
        _dali_quiet = True
        if native_logs_wanted():
            logger.debug("%s is set: FFmpeg's and DALI's own log lines are printed", NATIVE_LOGS_ENV)
            return
        _silence_dali_ffmpeg()
        _filter_stderr()


def _silence_dali_ffmpeg() -> None:
    dali = sys.modules.get("nvidia.dali")
    if dali is None or not getattr(dali, "__file__", None):
        logger.debug("nvidia.dali is not imported: its FFmpeg's log lines are left as they are")
        return
    dali_dir = os.path.dirname(dali.__file__)
    libraries = sorted(glob.glob(os.path.join(dali_dir, ".libs", "libavutil*.so*")))
    if not libraries:  # a DALI built against a system FFmpeg: that one may be the user's too
        logger.debug("no FFmpeg of DALI's own under %s: its log lines are left as they are", dali_dir)
        return
    try:
        libavutil = ctypes.CDLL(libraries[0])  # loaded already by DALI: the same library
        libavutil.av_log_set_callback.argtypes = [ctypes.c_void_p]
        libavutil.av_log_set_callback(None)
    except (OSError, AttributeError) as err:
        logger.debug("could not silence DALI's FFmpeg (%s): %s", libraries[0], err)


def _filter_stderr() -> None:
    """Put file descriptor 2 behind the relay process (see the module docstring)."""
    global _relay_pid
    if not hasattr(os, "posix_spawn") or not sys.executable or _relay_pid is not None:
        return
    with contextlib.suppress(AttributeError, OSError, ValueError):  # None, or closed: nothing buffered
        sys.stderr.flush()  # what Python holds goes out before the relay's first bytes
    try:
        original = os.dup(2)
    except OSError as err:  # no stderr at all: nothing reaches a console
        logger.debug("stderr is not open (%s): DALI's lines are not filtered", err)
        return
    read_end, write_end = _channel(original)
    try:
        # posix_spawn rather than subprocess: a Popen warns when it goes while its child still runs,
        # as this one does by design (it ends with the pipe); and the relay starts with Ctrl-C and
        # SIGTERM blocked, so neither kills it before it has read this process's last words.
        # -I -S: it needs the standard library only.
        _relay_pid = os.posix_spawn(
            sys.executable, [sys.executable, "-I", "-S", os.path.abspath(__file__)], os.environ,
            file_actions=[(os.POSIX_SPAWN_DUP2, read_end, 0), (os.POSIX_SPAWN_DUP2, original, 1),
                          (os.POSIX_SPAWN_DUP2, original, 2)],
            setsigmask={signal.SIGINT, signal.SIGTERM})
    except OSError as err:
        logger.debug("could not start the stderr relay (%s): DALI's lines are not filtered", err)
        os.close(write_end)
        return
    finally:
        os.close(read_end)
    os.dup2(write_end, 2)
    threading.Thread(target=_watch_relay, args=(write_end, original, _relay_pid), name="daliload-stderr-relay",
                     daemon=True).start()
    logger.debug("stderr goes through pid %d, which drops DALI's own lines (%s=1 keeps them)",
                 _relay_pid, NATIVE_LOGS_ENV)


def _watch_relay(write_end: int, original: int, relay_pid: int) -> None:
    """Until the relay's end of the pipe closes; then put the original stderr back on descriptor 2.

    ``poll`` with no events asked for waits for an error or a hang-up only: a
    pipe whose reading end closed reports ``POLLERR``, a pseudo-terminal whose
    master closed ``POLLHUP``. ``write_end`` is this thread's own descriptor of
    the pipe (2 may be pointed elsewhere by the user meanwhile).
    """
    global _relay_pid
    poller = select.poll()
    poller.register(write_end, 0)
    while not poller.poll():
        pass
    if _is_our_stderr(write_end):  # the user has not pointed stderr elsewhere since
        os.dup2(original, 2)
    os.close(write_end)
    os.close(original)
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(relay_pid, os.WNOHANG)  # no zombie left for the rest of the run
    _relay_pid = None
    logger.warning("the process that filtered DALI's own lines out of stderr (pid %d) has died; stderr goes "
                   "straight to where it went before, DALI's and FFmpeg's own lines included", relay_pid)


def _is_our_stderr(write_end: int) -> bool:
    """Whether descriptor 2 is still ``write_end``'s pipe (or pseudo-terminal)."""
    try:
        ours, now = os.fstat(write_end), os.fstat(2)
    except OSError:
        return True  # 2 closed: the original goes back
    return (ours.st_dev, ours.st_ino) == (now.st_dev, now.st_ino)


def _channel(original: int) -> tuple[int, int]:
    """``(read end, write end)`` for the relay: a pipe, or a pseudo-terminal when stderr is a terminal.

    With a pseudo-terminal the process's stderr is still a terminal (``isatty()``, its size), so what
    draws progress bars or colours only on a terminal (``evaluate``'s bar, tqdm's width) does as before.
    Raw mode: the bytes pass through untranslated.
    """
    if not os.isatty(original):
        return os.pipe()
    try:
        import fcntl
        import termios
        import tty

        master, slave = os.openpty()
        tty.setraw(slave)
        with contextlib.suppress(OSError):
            fcntl.ioctl(slave, termios.TIOCSWINSZ, fcntl.ioctl(original, termios.TIOCGWINSZ, b"\0" * 8))
        return master, slave
    except (ImportError, OSError) as err:
        logger.debug("no pseudo-terminal for stderr (%s): a pipe", err)
        return os.pipe()


class StderrFilter:
    """Drops DALI's own lines (:data:`DALI_LINE`) from a byte stream; passes every other byte on at once.

    Only the start of a line that may still become DALI's (``[`` or ``[/...``
    without its newline yet) is held back, until its line ends or
    :meth:`flush`. The rest of a line whose start was passed on is passed on too.
    """

    def __init__(self) -> None:
        self._held = b""
        self._mid_line = False

    @property
    def holding(self) -> bool:
        """Whether the start of a line is held back."""
        return bool(self._held)

    def feed(self, chunk: bytes) -> bytes:
        """The bytes of ``chunk`` (after any held ones) to pass on now."""
        data, self._held = self._held + chunk, b""
        out = []
        start = 0
        while start < len(data):
            end = data.find(b"\n", start)
            piece = data[start:] if end < 0 else data[start:end + 1]
            start += len(piece)
            if self._mid_line:
                out.append(piece)
            elif end < 0 and (piece == b"[" or piece.startswith(b"[/")) and len(piece) < HOLD_BYTES:
                self._held = piece
            elif end < 0 or not DALI_LINE.match(piece):
                out.append(piece)
            self._mid_line = end < 0 and not self._held
        return b"".join(out)

    def flush(self) -> bytes:
        """The held start of a line, to pass on as it is (its end did not come in time)."""
        held, self._held = self._held, b""
        self._mid_line = self._mid_line or bool(held)
        return held


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def _relay_main() -> None:
    """The relay: stdin (the pipe that is the training process's stderr) to stdout (its real stderr)."""
    # Ctrl-C and a job's SIGTERM are for the training process (they stay blocked here, as started);
    # this one ends when the pipe does. What else it inherited is not its to hold open.
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    lines = StderrFilter()
    while True:
        if lines.holding and not select.select([0], [], [], HOLD_S)[0]:
            _write_all(1, lines.flush())
            continue
        try:
            chunk = os.read(0, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            _write_all(1, lines.flush())
            return
        _write_all(1, lines.feed(chunk))


def _copy_main() -> None:
    """The relay's way on should its filter fail: every byte, as it comes (the training process's stderr
    must never stop being read)."""
    while chunk := os.read(0, 65536):
        _write_all(1, chunk)


if __name__ == "__main__":
    try:
        _relay_main()
    except OSError:  # the real stderr is gone: nothing left to write to
        pass
    except Exception:  # a bug in the filter: say so once, then copy everything
        import traceback

        traceback.print_exc()
        _copy_main()
