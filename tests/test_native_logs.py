"""A file that breaks at run time is reported once, by daliload, with its path: FFmpeg's and DALI's own
log lines (which name no file) stay off the console, and ``DALILOAD_NATIVE_LOGS=1`` brings them back.

Native libraries write to file descriptor 2 themselves, past ``sys.stderr``, so each case runs a real
training script in a subprocess and reads what reached its stderr: a VP9 file cut short after the scan
on DALI's route (DALI's CPU decoder), an H.264 file cut short after the scan on the fallback's route
(PyAV, in the fallback's worker processes). Neither opens any more, in DALI or in the fallback, so the
loader replaces its samples and says so in one :class:`~daliload.failures.DecodeFailureWarning`.
The line filter itself (:class:`daliload.runtime.StderrFilter`) is tested on byte streams.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from daliload.runtime import NATIVE_LOGS_ENV, StderrFilter
from daliload.synth import SynthSpec, generate_dataset

#: FFmpeg's default log line: ``[matroska,webm @ 0x7f5528004d00] File ended prematurely``.
FFMPEG_LINE = re.compile(r"^\[[\w,.:-]+ @ 0x[0-9a-f]+\] ", re.MULTILINE)
#: DALI's own warning: ``[/opt/dali/dali/operators/video/frames_decoder_base.cc:245] Failed to open ...``.
DALI_LINE = re.compile(r"^\[/[^\]\n]*\.(?:cc|cu|h|cuh):\d+\] ", re.MULTILINE)
SCRIPT_END = "SCRIPT-END"

SCRIPT = textwrap.dedent("""\
    import sys

    from daliload import DecodeSpec, KineticsDALILoader, ScanSpec

    if __name__ == "__main__":
        loader = KineticsDALILoader(sys.argv[1], "train", batch_size=2, clip_len=4, frame_stride=2, crop_size=48,
                                    device="cpu", scan=ScanSpec(check=False),
                                    decode=DecodeSpec(fallback_workers=1, max_failure_fraction=1.0, routing="static"))
        for videos, labels in loader:
            pass
        print([f.path for f in loader.stats().failures], flush=True)
        loader.close()
        print("{end}", flush=True)
""").replace("{end}", SCRIPT_END)


@pytest.fixture(scope="module")
def broken(tmp_path_factory) -> dict[str, tuple[Path, str]]:
    """Route -> (dataset root, the one file of it cut short after the scan)."""
    from daliload import KineticsDALILoader

    cases = {}
    for route, codec in (("dali", "vp9"), ("fallback", "h264")):
        root = tmp_path_factory.mktemp(codec)
        spec = SynthSpec(num_classes=2, clips_per_class=2, val_fraction=0.0, width=96, height=64, duration_s=1.0,
                         codec_mix={codec: 1.0}, broken_fraction=0.0, seed=6)
        generate_dataset(root, spec, workers=2, progress=False)
        loader = KineticsDALILoader(root, "train", batch_size=2, clip_len=4, crop_size=48, device="cpu")  # scans it
        assert {v.route for v in loader.videos} == {route}, f"{root}: expected every file on route {route}"
        victim = sorted(v.path for v in loader.videos)[0]
        loader.close()
        # 100 bytes: inside the container's header, so that neither DALI nor PyAV opens it. A WebM cut
        # there makes DALI's FFmpeg report the cut and DALI warn that it could not open the file; an
        # MP4 (its index at the end) makes FFmpeg say that the index is missing.
        Path(victim).write_bytes(Path(victim).read_bytes()[:100])
        cases[route] = (root, victim)
    return cases


def run_script(tmp_path: Path, root: Path, *, native_logs: bool) -> subprocess.CompletedProcess:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != NATIVE_LOGS_ENV}
    if native_logs:
        env[NATIVE_LOGS_ENV] = "1"
    done = subprocess.run([sys.executable, str(script), str(root)], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)
    assert done.returncode == 0 and SCRIPT_END in done.stdout, f"script failed:\n{done.stdout}\n{done.stderr}"
    return done


@pytest.mark.dali
@pytest.mark.slow
@pytest.mark.parametrize("route", ["dali", "fallback"])
def test_a_bad_file_is_reported_once_by_daliload_and_the_native_lines_stay_off_stderr(broken, route, tmp_path):
    root, victim = broken[route]
    done = run_script(tmp_path, root, native_logs=False)
    assert repr([victim]) in done.stdout  # the file failed (in DALI and in the fallback) and was replaced
    err = done.stderr
    assert not FFMPEG_LINE.search(err), f"FFmpeg's own lines reached stderr:\n{err}"
    assert not DALI_LINE.search(err), f"DALI's own lines reached stderr:\n{err}"
    lines = err.splitlines()
    warnings = [i for i, line in enumerate(lines) if "DecodeFailureWarning" in line]
    assert len(warnings) == 1 and victim in lines[warnings[0]], f"expected one warning naming {victim}:\n{err}"
    # Nothing else on stderr: the warning, and the source line it points at (indented, after it).
    at = warnings[0]
    others = [line for i, line in enumerate(lines)
              if line.strip() and i != at and not (i == at + 1 and line.startswith("  "))]
    assert not others, f"more than daliload's one warning on stderr:\n{err}"


@pytest.mark.dali
@pytest.mark.slow
@pytest.mark.parametrize("route", ["dali", "fallback"])
def test_native_logs_come_back_with_the_environment_variable(broken, route, tmp_path):
    root, victim = broken[route]
    err = run_script(tmp_path, root, native_logs=True).stderr
    assert FFMPEG_LINE.search(err), f"no FFmpeg line with {NATIVE_LOGS_ENV}=1:\n{err}"
    if route == "dali":
        assert DALI_LINE.search(err), f"no DALI line with {NATIVE_LOGS_ENV}=1:\n{err}"
    assert sum("DecodeFailureWarning" in line and victim in line for line in err.splitlines()) == 1


# --- the line filter ---------------------------------------------------------------------------------

DALI_WARNING = b"[/opt/dali/dali/operators/video/frames_decoder_base.cc:245] Failed to open video file\n"


def filtered(*chunks: bytes) -> bytes:
    lines = StderrFilter()
    return b"".join(lines.feed(chunk) for chunk in chunks) + lines.flush()


def test_the_filter_drops_dali_warnings_and_passes_everything_else_unchanged():
    other = b"Traceback (most recent call last):\n  File \"x.py\", line 1\n[not dali] text\n"
    assert filtered(other + DALI_WARNING + other) == other + other
    # DALI writes its message and its newline separately; another line may follow in the same read.
    assert filtered(DALI_WARNING[:-1], b"\nnext line\n") == b"next line\n"
    assert filtered(DALI_WARNING[:7], DALI_WARNING[7:30], DALI_WARNING[30:]) == b""


def test_the_filter_passes_partial_lines_on_at_once():
    lines = StderrFilter()
    assert lines.feed(b"\rscan:  10%|#") == b"\rscan:  10%|#"  # a progress bar: no newline, shown now
    assert lines.feed(b"#  ") == b"#  "
    assert lines.feed(b"[/opt/dali/x.cc:1] ") == b"[/opt/dali/x.cc:1] "  # the middle of a line is not a line
    assert lines.feed(b"\n[/tmp/my") == b"\n"  # could still become DALI's: held until its line ends ...
    assert lines.holding
    assert lines.flush() == b"[/tmp/my"  # ... or until the relay gives up waiting for the rest
    assert lines.feed(b"file.txt] ok\n") == b"file.txt] ok\n"


def test_a_terminal_stays_a_terminal_behind_the_relay(tmp_path):
    """stderr on a terminal goes through a pseudo-terminal: isatty() and the size hold (progress bars)."""
    import fcntl
    import pty
    import struct
    import termios

    script = tmp_path / "terminal_stderr.py"  # not tty.py: the script's own folder is first on its sys.path
    script.write_text(textwrap.dedent("""\
        import os, sys
        from daliload.runtime import quiet_dali
        from daliload.dali import import_dali
        import_dali()
        print("before", os.isatty(2), os.get_terminal_size(2).columns, flush=True)
        quiet_dali()
        print("after", os.isatty(2), os.get_terminal_size(2).columns, flush=True)
        sys.stderr.write("[/opt/dali/dali/x.cc:1] a DALI line\\nkept line\\n")
        sys.stderr.flush()
        """))
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 123, 0, 0))
    proc = subprocess.run([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=slave, timeout=120,
                          text=True, env={k: v for k, v in os.environ.items() if k != NATIVE_LOGS_ENV})
    os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: every writer of the terminal is gone
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    assert proc.returncode == 0, seen
    assert proc.stdout.splitlines() == ["before True 123", "after True 123"]
    assert b"kept line" in seen and b"a DALI line" not in seen
