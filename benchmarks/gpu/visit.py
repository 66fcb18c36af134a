"""The first GPU visit, planned to fit the host's limits: its calls, what each carries and runs, and how long.

Standard library only (it runs before anything is installed). ``run_gpu_bench.sh --plan``
prints the plan; ``tests/test_gpu_readiness.py`` checks its arithmetic against :class:`HostLimits`.

The host (one H200 lent through the device tool of this project) has no package
index; files reach it only with a call, at most 64 MiB per call with the
checkout; it stays warm 30 s after a call and then loses everything on it; a
visit has 15 minutes of device time in all, its start and every idle wait
counted. So the visit is a chain of calls, each started within the warm window
of the one before, that each carry one piece of the wheels and do useful work
with what has arrived::

    call 1   piece 1 + preflight: what would fail everything later (driver, libnvcuvid,
             the nvidia namespace, the host's own packages), NVDEC's capabilities;
             installs the wheels complete in piece 1 (DALI's small dependencies, PyAV)
    call 2,3 piece 2, 3: checked on arrival
    call 4   piece 4: DALI complete, installed; smoke: import it, decode H.264 and AV1 on NVDEC
    call 5   the last step: GPU tests, then the benchmark in what is left (no transfer)
    call 6   the same again, once, if call 5 failed (budgeted: the visit fits with it)

Figures no visit has measured yet are :class:`Assumptions`; each call's reply
(``wall_s``, ``lease.held_s``) measures them on the first visit.
"""

from __future__ import annotations

import argparse
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
            every call); a test holds the checkout under it.
        margin_s: device time the plan leaves unallocated.
        preflight_s, receive_s, smoke_s: expected seconds of those commands.
        tests_s: the most the GPU tests of the last step may take.
    """

    transfer_s_per_mib: float = 0.25
    gap_s: float = 30.0
    checkout_bytes: int = 4 * MIB
    margin_s: float = 60.0
    preflight_s: float = 30.0
    receive_s: float = 5.0
    smoke_s: float = 60.0
    tests_s: float = 75.0


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

#: Command line of each kind of call (run from the checkout's root on the host).
COMMANDS = {
    "preflight": 'benchmarks/gpu/run_gpu_bench.sh --out "$OUT" --preflight',
    "receive": 'benchmarks/gpu/run_gpu_bench.sh --out "$OUT" --receive',
    "smoke": 'benchmarks/gpu/run_gpu_bench.sh --out "$OUT" --smoke',
    "last": 'benchmarks/gpu/run_gpu_bench.sh --out "$OUT"',
}
#: Files each kind of call leaves in $OUT (at most HostLimits.out_files).
OUT_FILES = {
    "preflight": ("visit.log", "preflight.json"),
    "receive": ("visit.log",),
    "smoke": ("visit.log", "smoke.json"),
    "last": ("visit.log", "tests.log", "bench-logs.tar.gz", "gpu.json", "RESULTS.md", "gpu-loaders.png",
             "gpu-scaling.png"),
}


@dataclass(frozen=True)
class Call:
    """One call of the visit.

    Attributes:
        number: 1-based.
        kind: ``preflight``, ``receive``, ``smoke`` or ``last`` (:data:`COMMANDS`).
        piece: the transfer piece it carries (``carry``), or ``""``.
        piece_bytes: that piece's bytes (0 without one).
        checkout_bytes: the checkout's bytes, which travel with every call.
        expected_s: the command's expected seconds.
        timeout_s: the call's ``timeout_s``.
        installs: wheels that become complete with this call's piece.
        retry: True for the budgeted second try of the last step.
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

    @property
    def command(self) -> str:
        return COMMANDS[self.kind]

    @property
    def carried_bytes(self) -> int:
        return self.piece_bytes + self.checkout_bytes

    def transfer_s(self, assumed: Assumptions) -> float:
        return self.carried_bytes / MIB * assumed.transfer_s_per_mib


@dataclass(frozen=True)
class Plan:
    """A visit: its calls and the budget they add up to (:func:`make_plan`).

    Attributes:
        calls: in order, the retry last.
        last_step_s: seconds of the last step (its command's budget and timeout).
        steps: ``(what, seconds)`` of every part of the visit, in order; they
            sum to ``total_s``.
    """

    calls: tuple[Call, ...]
    last_step_s: float
    steps: tuple[tuple[str, float], ...]
    limits: HostLimits = field(default=LIMITS)
    assumed: Assumptions = field(default=ASSUMED)

    @property
    def total_s(self) -> float:
        return sum(seconds for _, seconds in self.steps)

    @property
    def without_retry_s(self) -> float:
        return sum(seconds for what, seconds in self.steps if not what.startswith("retry"))


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


def make_plan(rows, limits: HostLimits = LIMITS, assumed: Assumptions = ASSUMED,
              checkout_bytes: int | None = None) -> Plan:
    """The visit for a transfer plan's ``rows`` (pieces in sending order): calls, seconds, last-step budget.

    The last step gets what is left once everything else, one full retry of
    it and the margin are counted: ``(device_s - margin - the rest) / 2``.
    """
    checkout = assumed.checkout_bytes if checkout_bytes is None else checkout_bytes
    pieces, completes = pieces_and_members(rows)
    if not pieces:
        raise ValueError("the transfer plan has no pieces: make one with wheelhouse.py pack")
    calls: list[Call] = []
    for number, piece in enumerate(pieces, 1):
        kind = "preflight" if number == 1 else "smoke" if number == len(pieces) else "receive"
        expected = {"preflight": assumed.preflight_s, "smoke": assumed.smoke_s}.get(kind, assumed.receive_s)
        timeout = {"preflight": 90.0, "smoke": 120.0}.get(kind, 30.0)
        calls.append(Call(number, kind, piece.name, piece.size, checkout, expected, timeout,
                          tuple(completes[piece.name])))
    steps: list[tuple[str, float]] = [("start the machine", limits.start_s)]
    for call in calls:
        if call.number > 1:
            steps.append((f"gap before call {call.number}", assumed.gap_s))
        steps.append((f"call {call.number}: transfer", call.transfer_s(assumed)))
        steps.append((f"call {call.number}: {call.kind}", call.expected_s))
    last_transfer = checkout / MIB * assumed.transfer_s_per_mib
    fixed = sum(s for _, s in steps) + 2 * (assumed.gap_s + last_transfer) + limits.warm_s
    last_step = math.floor((limits.device_s - assumed.margin_s - fixed) / 2)
    number = len(calls) + 1
    for retry in (False, True):
        label = "retry: " if retry else ""
        calls.append(Call(number + retry, "last", "", 0, checkout, last_step, last_step, retry=retry))
        steps += [(f"{label}gap before call {number + retry}", assumed.gap_s),
                  (f"{label}call {number + retry}: transfer (checkout only)", last_transfer),
                  (f"{label}call {number + retry}: GPU tests and benchmark", float(last_step))]
    steps.append(("idle until the machine is given back", limits.warm_s))
    return Plan(tuple(calls), float(last_step), tuple(steps), limits, assumed)


def check_plan(plan: Plan) -> list[str]:
    """Every way ``plan`` breaks the host's limits, as sentences (empty when it fits)."""
    limits, assumed = plan.limits, plan.assumed
    problems = []
    if plan.total_s + assumed.margin_s > limits.device_s:
        problems.append(f"the visit with its retry takes {plan.total_s:.0f} s + {assumed.margin_s:.0f} s margin, "
                        f"more than the {limits.device_s:.0f} s of device time")
    if assumed.gap_s > limits.warm_s:
        problems.append(f"a gap of {assumed.gap_s:.0f} s between calls loses the machine (warm {limits.warm_s:.0f} s)")
    if plan.last_step_s < assumed.tests_s + 60:
        problems.append(f"the last step's {plan.last_step_s:.0f} s leave the benchmark under a minute after "
                        f"{assumed.tests_s:.0f} s of tests")
    # Worst case without the retry: every earlier call runs to its timeout; the last step must still fit.
    worst = (limits.start_s + sum(c.transfer_s(assumed) + c.timeout_s for c in plan.calls if not c.retry)
             + assumed.gap_s * (len(plan.calls) - 2) + limits.warm_s)
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
        if len(OUT_FILES[call.kind]) > limits.out_files:
            problems.append(f"call {call.number} leaves {len(OUT_FILES[call.kind])} files in $OUT, more than "
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
    lines = [f"GPU visit for the {flavour} wheels: {len(plan.calls) - 1} calls and one retry of the last; "
             f"device time {limits.device_s:.0f} s, a call's files <= {limits.call_bytes / MIB:.0f} MiB, "
             f"warm {limits.warm_s:.0f} s between calls.",
             "Each call: run(command=..., carry=[piece], timeout_s=...) from the checkout's root, started within "
             f"{limits.warm_s:.0f} s of the previous reply; save what comes back from $OUT.",
             ""]
    ends = _call_ends(plan)
    for call in plan.calls:
        begins = 0.0 if call.number == 1 else ends[call.number - 1] + assumed.gap_s
        carry = (f"carry benchmarks/gpu/wheels/{call.piece} ({call.piece_bytes / MIB:.1f} MiB)"
                 if call.piece else "carry nothing (the pieces are on the machine)")
        what = "RETRY of the last step, only if call " + str(call.number - 1) + " failed" if call.retry else call.kind
        started = f" (the machine's start, {limits.start_s:.0f} s, included)" if call.number == 1 else ""
        lines.append(f"{_clock(begins)}-{_clock(ends[call.number])} call {call.number} [{what}]{started}: {carry}; "
                     f"timeout_s={call.timeout_s:.0f}, expected {call.expected_s:.0f} s")
        lines.append(f"    {call.command}")
        if call.installs:
            lines.append(f"    completes and installs: {', '.join(short_name(w) for w in call.installs)}")
        lines.append(f"    $OUT: {', '.join(OUT_FILES[call.kind])}")
    lines += ["", "Budget (seconds):"]
    lines += [f"  {seconds:6.1f}  {what}" for what, seconds in plan.steps]
    lines += [f"  {plan.total_s:6.1f}  total with the retry; {plan.without_retry_s:.1f} without it",
              f"  {limits.device_s - plan.total_s:6.1f}  left of {limits.device_s:.0f} (margin "
              f"{assumed.margin_s:.0f})",
              "",
              f"Assumed until a visit measures them: transfer {assumed.transfer_s_per_mib} s/MiB, start "
              f"{limits.start_s:.0f} s, {assumed.gap_s:.0f} s between calls, preflight {assumed.preflight_s:.0f} s, "
              f"smoke {assumed.smoke_s:.0f} s, GPU tests <= {assumed.tests_s:.0f} s of the last step's "
              f"{plan.last_step_s:.0f} s."]
    if checkout is not None:
        state = "ok" if checkout <= assumed.checkout_bytes else "TOO BIG: a piece and the checkout exceed a call"
        lines.append(f"Checkout that travels with every call: {checkout / MIB:.2f} MiB (allowed "
                     f"{assumed.checkout_bytes / MIB:.0f} MiB): {state}.")
    problems = check_plan(plan)
    lines.append("Fits the host's limits." if not problems else "DOES NOT FIT: " + "; ".join(problems))
    latest = limits.device_s - plan.without_retry_s
    ends = _call_ends(plan)
    recoverable = [c.number for c in plan.calls if not c.retry and ends[c.number] + assumed.gap_s <= latest]
    lines.append(f"A pause over {limits.warm_s:.0f} s between calls loses the machine and every piece on it (the next "
                 f"call starts a bare one: its receive lists piece 1 MISSING). Starting over without a retry takes "
                 f"{plan.without_retry_s:.0f} s, so it fits only if the loss comes by {latest:.0f} s: "
                 + (f"after call {recoverable[-1]} at the latest." if recoverable else
                    "never; give the rest of the time back."))
    return "\n".join(lines)


def _clock(seconds: float) -> str:
    """Device time as ``m:ss``."""
    whole = round(seconds)
    return f"{whole // 60}:{whole % 60:02d}"


def _call_ends(plan: Plan) -> dict[int, float]:
    """Expected device time at the end of each call (the retry's after the last step's)."""
    ends, elapsed = {}, plan.limits.start_s
    for call in plan.calls:
        elapsed += (0.0 if call.number == 1 else plan.assumed.gap_s) + call.transfer_s(plan.assumed) + call.expected_s
        ends[call.number] = elapsed
    return ends


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flavour", choices=("cuda13", "cuda12"), default="cuda13")
    parser.add_argument("--budget", action="store_true",
                        help="print only the last step's seconds and the GPU tests' share of them")
    parser.add_argument("--readme", type=Path, default=None, metavar="README",
                        help="also write the plan into README between its <!-- visit-plan --> markers")
    args = parser.parse_args(argv)
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
        print(f"{plan.last_step_s:.0f} {plan.assumed.tests_s:.0f}")
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
