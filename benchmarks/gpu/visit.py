"""The first GPU visit, planned to fit the host's limits: its calls, what each carries and runs, and how long.

Standard library only (it runs before anything is installed). ``run_gpu_bench.sh --plan``
prints the plan; ``tests/test_gpu_visit.py`` checks its arithmetic against :class:`HostLimits`.

The host (one H200 lent through the device tool of this project) has no package
index; files reach it only with a call, at most 64 MiB per call with the
checkout; it stays warm 30 s after a call and then loses everything on it; a
visit has 15 minutes of device time in all, its start and every idle wait
counted. So the visit is a chain of calls, each started within the warm window
of the one before, that each carry one piece of the wheels and do useful work
with what has arrived (the wheels travel derived and xz-compressed, see
slim.py: three pieces)::

    call 1   piece 1 + preflight: what would fail everything later (driver, the nvidia
             namespace, the host's own packages), NVDEC's capabilities (a missing NVDEC is
             reported, not fatal); installs the wheels complete in piece 1 (DALI's small
             dependencies, PyAV)
    call 2   piece 2: checked on arrival; generates both sweeps' datasets with PyAV
    call 3   piece 3: DALI complete: decompressed, installed, import check; smoke decodes, the
             merge's timing, the GPU tests
    call 4   the NVDEC sweep on 340x256 H.264 (no transfer), then peers in what is left;
             leaves its exit code in a state file on the host
    call 5   the last slot (``--last-slot``): the host reads that state file and runs call 4's
             sweep again if it failed, the same sweep on 720p if it succeeded, nothing after
             "no NVDEC"; then the machine is given back at once

The calls are fixed lines, issued back to back: nothing is decided between
them by whoever issues them (the last slot decides on the host). Every step a
call runs is a budget line, and the plan with its last slot stays within
``device_s - margin_s`` (780 of 900 s). The machine is given back right after
the last call, so its 30 s of idle time after it is not budgeted.

Figures no visit has measured yet are :class:`Assumptions`; each call's reply
(``wall_s``, ``lease.held_s``) measures them on the first visit.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
MIB = 1 << 20


@dataclass(frozen=True)
class HostLimits:
    """What the GPU host allows one visit (the device tool's documentation, read 2026-12-01).

    Attributes:
        device_s: device time of a visit, counting the machine's start, every
            call, every idle wait and the idle time before it is given back.
        start_s: a call that finds no warm machine starts one: "a minute or
            more"; budgeted at two.
        warm_s: idle time after a call before the machine is given back (and
            everything on it lost).
        min_start_left_s: no machine starts with less device time left.
        command_s: the longest one command may run.
        call_bytes: the working tree (tracked checkout) and carried files of one call.
        out_files, out_file_bytes: what comes back from ``$OUT`` per call.
    """

    device_s: float = 900.0
    start_s: float = 120.0
    warm_s: float = 30.0
    min_start_left_s: float = 240.0
    command_s: float = 600.0
    call_bytes: int = 64 * MIB
    out_files: int = 8
    out_file_bytes: int = 16 * MIB


@dataclass(frozen=True)
class Assumptions:
    """Figures the plan uses that no visit has measured yet.

    Attributes:
        transfer_s_per_mib: upload time per MiB carried (0.25: a full call's 64 MiB in 16 s).
        gap_s: the pause between a call's reply and the next call. Budgeted at
            the whole warm window: a longer pause loses the machine anyway.
        checkout_bytes: what the tracked checkout may weigh (it travels with
            every call); a test holds the checkout under it. 8 MiB: the device
            tool refused a call of a 60 MiB piece and a checkout of 3.90 MiB
            (4.6 MiB on disk), 63.9 MiB by the files' own sizes (2026-12-04), so
            the tool counts more than that; the allowance leaves room for it.
        margin_s: device time the plan leaves unallocated (120: the plan stays within 780 s of 900).
        preflight_s, receive_s, smoke_s: expected seconds of those commands.
        decompress_bytes_s: output bytes per second of decompressing an ``.xz``
            member on the host (Python's lzma, one thread: 30 MB/s assumed,
            conservatively; here it decompresses at several times that).
        pip_s, pip_s_per_mib: a pip install of the wheels a piece completes:
            its start, and per MiB of wheel (the derived wheels are stored, so
            pip's unzip is a copy).
        import_check_s: the import check after DALI is installed (torch with
            CUDA, PyAV, DALI, NVML).
        generate_s: seconds to generate each sweep's dataset on the host's 16
            cores (measured here: 0.85 s per 10 s 340x256 clip and 2.85 s per
            4 s 720p clip on one core of the 2-core VM).
        merge_s: the merge's timing (``merge_time.py``: torch's CUDA start and 2 x 4 x 3 merges of 74 MiB
            or less, the CPU reference normalisation once).
        tests_s: the most the GPU tests may take.
        min_sweep_s: the least a sweep call needs to be worth its place (the
            ceiling and a few settings).
    """

    transfer_s_per_mib: float = 0.25
    gap_s: float = 30.0
    checkout_bytes: int = 8 * MIB
    margin_s: float = 120.0
    preflight_s: float = 30.0
    receive_s: float = 5.0
    smoke_s: float = 60.0
    generate_s: tuple[tuple[str, float], ...] = (("h264-gop250", 20.0), ("h264-720p", 30.0))
    decompress_bytes_s: float = 30e6
    pip_s: float = 5.0
    pip_s_per_mib: float = 0.05
    import_check_s: float = 15.0
    merge_s: float = 15.0
    tests_s: float = 75.0
    min_sweep_s: float = 85.0


LIMITS = HostLimits()
ASSUMED = Assumptions()
#: Bytes of one piece: a call's limit less the checkout that travels with it.
PIECE_BYTES = LIMITS.call_bytes - ASSUMED.checkout_bytes

#: Packages of wheels.lock the host's image already has (the device tool's package list for
#: nvidia-h200, read 2026-11-17): ``pack`` leaves them out; the preflight checks each there.
HOST_PACKAGES = frozenset({
    "numpy", "packaging", "six", "typing-extensions", "wheel", "pytest", "pluggy", "iniconfig", "pygments",
    "pytest-timeout", "psutil", "nvidia-ml-py", "tqdm", "pyyaml",
})

#: Every visit call keeps FFmpeg's and DALI's own log lines (daliload.runtime's native logs), so a failure's
#: reason in DALI's words comes back in visit.log.
NATIVE_LOGS = "DALILOAD_NATIVE_LOGS=1"
#: Command line of each kind of call (run from the checkout's root on the host); a call adds its ``args``.
COMMANDS = {
    "preflight": f'{NATIVE_LOGS} benchmarks/gpu/run_gpu_bench.sh --out "$OUT" --preflight',
    "receive": f'{NATIVE_LOGS} benchmarks/gpu/run_gpu_bench.sh --out "$OUT" --receive',
    "tests": f'{NATIVE_LOGS} benchmarks/gpu/run_gpu_bench.sh --out "$OUT" --tests',
    "sweep": f'{NATIVE_LOGS} benchmarks/gpu/run_gpu_bench.sh --out "$OUT" --sweep',
    "last-slot": f'{NATIVE_LOGS} benchmarks/gpu/run_gpu_bench.sh --out "$OUT" --last-slot',
}
#: The sweeps, in order: the first call's dataset, then the one the last slot runs when the first succeeded.
SWEEPS = ("h264-gop250", "h264-720p")
#: Files each kind of call leaves in $OUT (at most HostLimits.out_files).
OUT_FILES = {
    "preflight": ("visit.log", "preflight.json"),
    "receive": ("visit.log",),
    "tests": ("visit.log", "smoke.json", "merge.json", "doctor.json", "tests.log"),
    "sweep": ("visit.log", "nvdec-DATASET.json", "nvdec-DATASET.md", "gpu.json", "RESULTS.md", "bench-logs.tar.gz"),
}
#: What each kind of call measures or checks, for the plan's lines (README.md says more).
MEASURES = {
    "preflight": "driver, libnvcuvid (not fatal), torch, the nvidia namespace, host packages, NVDEC caps",
    "receive": "piece checked; wheels it completes installed",
    "tests": "piece checked; DALI decompressed, installed, import check; smoke decodes on NVDEC; the merge's host "
             "time per transfer mode; the GPU tests (batch hand-off first)",
    "sweep": "NVDEC ceiling (one pipeline per engine) and DALI threads {8,16,32} x pipelines {1,2,4,7}, >= 256 "
             "clips a timed epoch: clips/s, frames/s, engines busy, SM %, peak memory; then peers",
}


@dataclass(frozen=True)
class Call:
    """One call of the visit.

    Attributes:
        number: 1-based.
        kind: ``preflight``, ``receive``, ``tests`` or ``sweep`` (:data:`COMMANDS`).
        piece: the transfer piece it carries (``carry``), or ``""``.
        piece_bytes: that piece's bytes (0 without one).
        checkout_bytes: the checkout's bytes, which travel with every call.
        expected_s: the command's expected seconds (the sum of ``steps``).
        timeout_s: the call's ``timeout_s``.
        installs: wheels that become complete with this call's piece.
        retry: True for the last slot: call ``number - 1`` again if it failed.
        args: what the call adds to its kind's command (the dataset it generates or sweeps).
        otherwise: for the last slot, the arguments it runs when the call before it succeeded
            (the second sweep).
        steps: ``(what, seconds)`` of everything the command does, in order.
    """

    number: int
    kind: str
    piece: str
    piece_bytes: int
    checkout_bytes: int
    expected_s: float
    timeout_s: float
    installs: tuple[str, ...] = ()
    retry: bool = False
    args: str = ""
    otherwise: str = ""
    steps: tuple[tuple[str, float], ...] = ()

    @property
    def command(self) -> str:
        """The call's command line; the last slot's is ``--last-slot``, which decides on the host."""
        if self.retry:
            return COMMANDS["last-slot"]
        return f"{COMMANDS[self.kind]} {self.args}".rstrip()

    @property
    def alternative(self) -> str:
        """What the last slot runs when the call before it succeeded ('' for other calls)."""
        return f"{COMMANDS[self.kind]} {self.otherwise}" if self.otherwise else ""

    @property
    def again(self) -> str:
        """What the last slot runs when the call before it failed ('' for other calls)."""
        return f"{COMMANDS[self.kind]} {self.args}" if self.retry else ""

    @property
    def out_files(self) -> tuple[str, ...]:
        dataset = (self.otherwise or self.args).split()[-1] if self.kind == "sweep" else ""
        return tuple(name.replace("DATASET", dataset) for name in OUT_FILES[self.kind])

    @property
    def carried_bytes(self) -> int:
        return self.piece_bytes + self.checkout_bytes

    def transfer_s(self, assumed: Assumptions) -> float:
        return self.carried_bytes / MIB * assumed.transfer_s_per_mib


@dataclass(frozen=True)
class Plan:
    """A visit: its calls and the budget they add up to (:func:`make_plan`).

    Attributes:
        calls: in order, the retry slot last.
        sweep_s: seconds of a sweep call (its command's budget and timeout).
        tests_call_s: seconds of the tests call's command (smoke, merge timing, GPU tests).
        steps: ``(what, seconds)`` of every part of the visit, in order; they
            sum to ``total_s``.
    """

    calls: tuple[Call, ...]
    sweep_s: float
    tests_call_s: float
    steps: tuple[tuple[str, float], ...]
    limits: HostLimits = field(default=LIMITS)
    assumed: Assumptions = field(default=ASSUMED)

    @property
    def total_s(self) -> float:
        return sum(seconds for _, seconds in self.steps)

    @property
    def without_retry_s(self) -> float:
        return sum(seconds for what, seconds in self.steps if not what.startswith("last slot"))


def pieces_and_members(rows) -> tuple[list, dict[str, list[str]]]:
    """The transfer plan's pieces in order, and the wheels each one completes (by piece name)."""
    pieces = [r for r in rows if r.kind == "piece"]
    ends, total = [], 0
    for piece in pieces:
        total += piece.size
        ends.append(total)
    completes: dict[str, list[str]] = {p.name: [] for p in pieces}
    for member in (r for r in rows if r.kind == "member"):
        last_byte = member.offset + member.size
        index = next((i for i, end in enumerate(ends) if end >= last_byte), len(pieces) - 1)
        completes[pieces[index].name].append(member.name)
    return pieces, completes


def short_name(wheel: str) -> str:
    """``nvidia_dali_cuda130-2.4.0-py3-none-manylinux_2_28_x86_64.whl`` -> ``nvidia_dali_cuda130 2.4.0``."""
    parts = wheel.removesuffix(".whl").split("-")
    return f"{parts[0]} {parts[1]}" if len(parts) > 1 else wheel


#: Time limits of the calls before the sweeps: their expected seconds and this slack (the worst case must fit).
TIMEOUT_SLACK_S = {"preflight": 60.0, "receive": 30.0, "tests": 45.0}


def _install_steps(call: int, piece: str, rows, assumed: Assumptions) -> list[tuple[str, float]]:
    """The budget lines of taking out and installing the wheels ``piece`` completes: decompressing, pip."""
    _, completes = pieces_and_members(rows)
    sizes = {r.name: r.size for r in rows if r.kind in ("member", "unpacked")}
    unpacked = {r.part_of: r for r in rows if r.kind == "unpacked"}
    steps = []
    wheel_bytes = 0
    for member in completes[piece]:
        if member in unpacked:
            out = unpacked[member].size
            steps.append((f"call {call}: decompress {short_name(unpacked[member].name)} ({out / MIB:.0f} MiB, "
                          f"{assumed.decompress_bytes_s / 1e6:.0f} MB/s)", out / assumed.decompress_bytes_s))
            wheel_bytes += out
        else:
            wheel_bytes += sizes.get(member, 0)
    if completes[piece]:
        steps.append((f"call {call}: pip install {len(completes[piece])} wheel(s), {wheel_bytes / MIB:.0f} MiB",
                      assumed.pip_s + wheel_bytes / MIB * assumed.pip_s_per_mib))
    return steps


def make_plan(rows, limits: HostLimits = LIMITS, assumed: Assumptions = ASSUMED,
              checkout_bytes: int | None = None) -> Plan:
    """The visit for a transfer plan's ``rows`` (pieces in sending order): calls, seconds, the sweeps' budget.

    The first piece's call is the preflight, the last piece's the tests call,
    those between receive and generate the sweeps' datasets (in turn, the last
    receive call all that are left; a dataset no receive call makes is
    generated by its sweep). Every call's seconds are the sum of its steps:
    its receive, the decompressing and pip install of the wheels its piece
    completes, and its command's own work. Two sweep calls of equal length get
    what is left once everything else and the margin are counted:
    ``(device_s - margin - the rest) / 2``; the second is the last slot (the
    first sweep again if it failed, else the second sweep, decided on the
    host). The machine is given back at once after the last call: no idle
    time is budgeted after it.
    """
    checkout = assumed.checkout_bytes if checkout_bytes is None else checkout_bytes
    pieces, _ = pieces_and_members(rows)
    if not pieces:
        raise ValueError("the transfer plan has no pieces: make one with wheelhouse.py pack")
    if len(pieces) < 2:
        raise ValueError("the visit needs two pieces at least: one for the preflight, one for the tests call")
    generate = dict(assumed.generate_s)
    to_generate = [name for name in SWEEPS if name in generate]
    receivers = len(pieces) - 2
    calls: list[Call] = []
    for number, piece in enumerate(pieces, 1):
        kind = "preflight" if number == 1 else "tests" if number == len(pieces) else "receive"
        steps = [(f"call {number}: receive (piece checked)", assumed.receive_s)]
        steps += _install_steps(number, piece.name, rows, assumed)
        args = ""
        if kind == "preflight":
            steps.append((f"call {number}: preflight", assumed.preflight_s))
        elif kind == "receive" and to_generate:
            # One dataset a receive call, the last one all that are left.
            mine = to_generate if number == receivers + 1 else to_generate[:1]
            to_generate = to_generate[len(mine):]
            args = " ".join(f"--generate {dataset}" for dataset in mine)
            steps += [(f"call {number}: generate {dataset}", generate[dataset]) for dataset in mine]
        elif kind == "tests":
            steps += [(f"call {number}: import check", assumed.import_check_s),
                      (f"call {number}: smoke", assumed.smoke_s),
                      (f"call {number}: merge timing", assumed.merge_s),
                      (f"call {number}: GPU tests (at most)", assumed.tests_s)]
        expected = sum(seconds for _, seconds in steps)
        calls.append(Call(number, kind, piece.name, piece.size, checkout, expected,
                          math.ceil(expected + TIMEOUT_SLACK_S[kind]), args=args, steps=tuple(steps),
                          installs=tuple(_completes(rows, piece.name))))
    steps: list[tuple[str, float]] = [("start the machine", limits.start_s)]
    for call in calls:
        if call.number > 1:
            steps.append((f"gap before call {call.number}", assumed.gap_s))
        steps.append((f"call {call.number}: transfer", call.transfer_s(assumed)))
        steps += call.steps
    last_transfer = checkout / MIB * assumed.transfer_s_per_mib
    fixed = sum(s for _, s in steps) + 2 * (assumed.gap_s + last_transfer)
    sweep = math.floor((limits.device_s - assumed.margin_s - fixed) / 2)
    number = len(calls) + 1
    first, second = SWEEPS
    calls.append(Call(number, "sweep", "", 0, checkout, sweep, sweep, args=first,
                      steps=((f"call {number}: sweep {first}", float(sweep)),)))
    calls.append(Call(number + 1, "sweep", "", 0, checkout, sweep, sweep, retry=True, args=first, otherwise=second,
                      steps=((f"last slot: call {number + 1}: sweep", float(sweep)),)))
    for call in calls[-2:]:
        label = "last slot: " if call.retry else ""
        steps += [(f"{label}gap before call {call.number}", assumed.gap_s),
                  (f"{label}call {call.number}: transfer (checkout only)", last_transfer),
                  (f"{label}call {call.number}: sweep" + ("" if call.retry else f" {first}"), float(sweep))]
    tests_call = next(c.expected_s for c in calls if c.kind == "tests")
    return Plan(tuple(calls), float(sweep), tests_call, tuple(steps), limits, assumed)


def _completes(rows, piece: str) -> list[str]:
    """The wheels (as installed: an .xz member's unpacked wheel) a piece completes."""
    _, completes = pieces_and_members(rows)
    unpacked = {r.part_of: r.name for r in rows if r.kind == "unpacked"}
    return [unpacked.get(member, member) for member in completes[piece]]


def check_plan(plan: Plan) -> list[str]:
    """Every way ``plan`` breaks the host's limits, as sentences (empty when it fits)."""
    limits, assumed = plan.limits, plan.assumed
    problems = []
    if plan.total_s + assumed.margin_s > limits.device_s:
        problems.append(f"the visit with its last slot takes {plan.total_s:.0f} s + {assumed.margin_s:.0f} s margin, "
                        f"more than the {limits.device_s:.0f} s of device time")
    if assumed.gap_s > limits.warm_s:
        problems.append(f"a gap of {assumed.gap_s:.0f} s between calls loses the machine (warm {limits.warm_s:.0f} s)")
    if plan.sweep_s < assumed.min_sweep_s:
        problems.append(f"a sweep call's {plan.sweep_s:.0f} s are under the {assumed.min_sweep_s:.0f} s a sweep needs")
    # Worst case without the last slot: every earlier call runs to its timeout; the first sweep must still fit.
    worst = (limits.start_s + sum(c.transfer_s(assumed) + c.timeout_s for c in plan.calls if not c.retry)
             + assumed.gap_s * (len(plan.calls) - 2))
    if worst > limits.device_s:
        problems.append(f"with every call at its timeout the visit takes {worst:.0f} s, "
                        f"more than {limits.device_s:.0f} s")
    for call in plan.calls:
        if call.carried_bytes > limits.call_bytes:
            problems.append(f"call {call.number} carries {call.carried_bytes / MIB:.1f} MiB, more than "
                            f"{limits.call_bytes / MIB:.0f} MiB")
        if not 0 < call.timeout_s <= limits.command_s:
            problems.append(f"call {call.number}'s timeout {call.timeout_s:.0f} s is not within "
                            f"1-{limits.command_s:.0f} s")
        if call.expected_s > call.timeout_s:
            problems.append(f"call {call.number} expects {call.expected_s:.0f} s, over its timeout "
                            f"{call.timeout_s:.0f} s")
        if len(call.out_files) > limits.out_files:
            problems.append(f"call {call.number} leaves {len(call.out_files)} files in $OUT, more than "
                            f"{limits.out_files}")
    return problems


def checkout_size(repo: Path = REPO) -> int | None:
    """Bytes of what travels with every call: tracked and untracked-not-ignored files (None without git)."""
    try:
        listed = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others",
                                 "--exclude-standard"], capture_output=True, check=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    names = {name for name in listed.decode("utf-8", "surrogateescape").split("\0") if name}
    return sum((repo / name).stat().st_size for name in names if (repo / name).is_file())


def format_plan(plan: Plan, flavour: str, checkout: int | None = None) -> str:
    """The plan as the README shows it: one line per call, then the budget."""
    limits, assumed = plan.limits, plan.assumed
    last = plan.calls[-1]
    lines = [f"GPU visit for the {flavour} wheels: {len(plan.calls)} calls, the last a retry slot (call "
             f"{last.number - 1} again if it failed, else the second sweep); device time {limits.device_s:.0f} s, "
             f"a call's files <= {limits.call_bytes / MIB:.0f} MiB, warm {limits.warm_s:.0f} s between calls.",
             "Before the visit, here: benchmarks/gpu/run_gpu_bench.sh --prepare (downloads the locked wheels, "
             "derives and xz-compresses the big ones, packs them when the pieces are missing; sha256 checked "
             "against wheels.lock and this transfer plan).",
             "Each call: run(command=..., carry=[piece], timeout_s=...) from the checkout's root, issued as soon as "
             f"the previous one replied (within {limits.warm_s:.0f} s), whatever it returned: the lines below are "
             "fixed, nothing is decided between calls (the last slot decides on the host). Save what comes back "
             "from $OUT. After the last call, give_back at once: the idle time after it is not budgeted.",
             ""]
    ends = _call_ends(plan)
    for call in plan.calls:
        begins = 0.0 if call.number == 1 else ends[call.number - 1] + assumed.gap_s
        carry = (f"carry benchmarks/gpu/wheels/{call.piece} ({call.piece_bytes / MIB:.1f} MiB)"
                 if call.piece else "carry nothing (the pieces are on the machine)")
        if call.retry:
            what = f"last slot: call {call.number - 1} again if it failed, else the second sweep"
        else:
            named = [word for word in call.args.split() if not word.startswith("--")]
            what = call.kind + (f" {', '.join(named)}" if named else "")
        started = f" (the machine's start, {limits.start_s:.0f} s, included)" if call.number == 1 else ""
        lines.append(f"{_clock(begins)}-{_clock(ends[call.number])} call {call.number} [{what}]{started}: {carry}; "
                     f"timeout_s={call.timeout_s:.0f}, expected {call.expected_s:.0f} s")
        lines.append(f"    {call.command}")
        if call.retry:
            lines.append(f"    on the host, from the exit code call {call.number - 1} left in its state file: 0 -> "
                         f"{call.alternative.split('run_gpu_bench.sh ')[-1]}; 6 (no NVDEC) -> nothing (exit 6); any "
                         f"other, or none -> {call.again.split('run_gpu_bench.sh ')[-1]}")
        generated = [word for word in call.args.split() if not word.startswith("--")] \
            if call.kind == "receive" else []
        lines.append(f"    does: {MEASURES[call.kind]}" + (f"; generates {', '.join(generated)}" if generated else ""))
        if call.installs:
            lines.append(f"    completes and installs: {', '.join(short_name(w) for w in call.installs)}")
        lines.append(f"    $OUT: {', '.join(call.out_files)}")
    lines += ["", "Budget (seconds):"]
    lines += [f"  {seconds:6.1f}  {what}" for what, seconds in plan.steps]
    lines += [f"  {plan.total_s:6.1f}  total with the last slot; {plan.without_retry_s:.1f} without it",
              f"  {limits.device_s - plan.total_s:6.1f}  left of {limits.device_s:.0f} (margin "
              f"{assumed.margin_s:.0f}; the machine is given back at once after the last call, so the "
              f"{limits.warm_s:.0f} s it would idle are not counted)",
              "",
              f"Assumed until a visit measures them: transfer {assumed.transfer_s_per_mib} s/MiB, start "
              f"{limits.start_s:.0f} s, {assumed.gap_s:.0f} s between calls, receive {assumed.receive_s:.0f} s, "
              f"decompressing {assumed.decompress_bytes_s / 1e6:.0f} MB/s, pip {assumed.pip_s:.0f} s + "
              f"{assumed.pip_s_per_mib} s/MiB, preflight {assumed.preflight_s:.0f} s, "
              f"generating {', '.join(f'{name} {seconds:.0f} s' for name, seconds in assumed.generate_s)}, import "
              f"check {assumed.import_check_s:.0f} s, smoke {assumed.smoke_s:.0f} s, merge timing "
              f"{assumed.merge_s:.0f} s, GPU tests <= {assumed.tests_s:.0f} s; each sweep call gets "
              f"{plan.sweep_s:.0f} s."]
    if checkout is not None:
        state = "ok" if checkout <= assumed.checkout_bytes else "TOO BIG: a piece and the checkout exceed a call"
        lines.append(f"Checkout that travels with every call: {checkout / MIB:.2f} MiB (allowed "
                     f"{assumed.checkout_bytes / MIB:.0f} MiB): {state}.")
    problems = check_plan(plan)
    lines.append("Fits the host's limits." if not problems else "DOES NOT FIT: " + "; ".join(problems))
    latest = limits.device_s - plan.without_retry_s
    recoverable = [c.number for c in plan.calls if not c.retry and ends[c.number] + assumed.gap_s <= latest]
    lines.append(f"A pause over {limits.warm_s:.0f} s between calls loses the machine and every piece on it (the next "
                 f"call starts a bare one: its receive lists piece 1 MISSING). Starting over without the last slot "
                 f"takes {plan.without_retry_s:.0f} s, so it fits only if the loss comes by {latest:.0f} s: "
                 + (f"after call {recoverable[-1]} at the latest." if recoverable else
                    "never; give the rest of the time back."))
    return "\n".join(lines)


def _clock(seconds: float) -> str:
    """Device time as ``m:ss``."""
    whole = round(seconds)
    return f"{whole // 60}:{whole % 60:02d}"


def _call_ends(plan: Plan) -> dict[int, float]:
    """Expected device time at the end of each call (the last slot's after the first sweep's)."""
    ends, elapsed = {}, plan.limits.start_s
    for call in plan.calls:
        elapsed += (0.0 if call.number == 1 else plan.assumed.gap_s) + call.transfer_s(plan.assumed) + call.expected_s
        ends[call.number] = elapsed
    return ends


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flavour", choices=("cuda13", "cuda12"), default="cuda13")
    parser.add_argument("--budget", action="store_true",
                        help="print only a sweep call's seconds, the GPU tests' share of the tests call, and the "
                             "tests call's seconds")
    parser.add_argument("--sweeps", action="store_true",
                        help="print only the sweeps' datasets: the first sweep's, then the one the last slot runs "
                             "after it succeeded (read by run_gpu_bench.sh --last-slot)")
    parser.add_argument("--calls", action="store_true",
                        help="print only the calls, one JSON object a line (command, carry, timeout_s): what to "
                             "issue, back to back, without a decision between them")
    parser.add_argument("--readme", type=Path, default=None, metavar="README",
                        help="also write the plan into README between its <!-- visit-plan --> markers")
    args = parser.parse_args(argv)
    if args.sweeps:
        print(" ".join(SWEEPS))
        return 0
    sys.path.insert(0, str(HERE))
    from pieces import read_transfer, transfer_path

    rows = read_transfer(args.flavour)
    if rows is None:
        print(f"no transfer plan {transfer_path(args.flavour).name}: make one with wheelhouse.py pack "
              f"--flavour {args.flavour}", file=sys.stderr)
        return 1
    checkout = checkout_size()
    plan = make_plan(rows)  # counted with the checkout's allowance, which the real one must stay under
    if args.budget:
        print(f"{plan.sweep_s:.0f} {plan.assumed.tests_s:.0f} {plan.tests_call_s:.0f}")
        return 0
    if args.calls:
        for call in plan.calls:
            print(json.dumps({"call": call.number, "command": call.command,
                              "carry": [f"benchmarks/gpu/wheels/{call.piece}"] if call.piece else [],
                              "timeout_s": int(call.timeout_s)}))
        return 0
    print(format_plan(plan, args.flavour, checkout))
    if args.readme is not None:
        sys.path.insert(0, str(REPO))
        from benchmarks.report import write_marked

        if not write_marked(args.readme, "visit-plan", readme_section(plan, args.flavour)):
            print(f"{args.readme} has no <!-- visit-plan:begin --> ... <!-- visit-plan:end --> markers",
                  file=sys.stderr)
            return 1
        print(f"plan written into {args.readme}")
    over = checkout is not None and checkout > plan.assumed.checkout_bytes
    return 0 if not check_plan(plan) and not over else 1


def readme_section(plan: Plan, flavour: str) -> str:
    """What README.md shows between its visit-plan markers: the plan, as ``--plan`` prints it."""
    return "```text\n" + format_plan(plan, flavour) + "\n```"


if __name__ == "__main__":
    sys.exit(main())
