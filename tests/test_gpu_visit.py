"""The GPU visit, on the CPU: its plan against the host's limits, the pieces received and installed as they
arrive, the nvidia namespace, the preflight, and the split helper for other files (benchmarks/gpu/)."""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from hashlib import sha256
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
GPU = REPO / "benchmarks" / "gpu"
GPU_SCRIPT = GPU / "run_gpu_bench.sh"
sys.path.insert(0, str(GPU))  # the scripts there import each other from beside themselves

import checks  # noqa: E402
import pieces  # noqa: E402
import visit  # noqa: E402
import wheelhouse  # noqa: E402

MIB = 1 << 20


# --- the plan of the visit ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plan() -> visit.Plan:
    rows = pieces.read_transfer("cuda13")
    assert rows is not None, "transfer-cuda13.tsv is committed beside run_gpu_bench.sh"
    return visit.make_plan(rows)


def test_the_visit_with_its_retry_slot_fits_the_hosts_limits(plan):
    """The arithmetic, step by step, against the limits the host's documentation states."""
    limits, assumed = visit.HostLimits(), visit.Assumptions()
    assert (limits.device_s, limits.warm_s, limits.min_start_left_s, limits.command_s, limits.call_bytes) == (
        900, 30, 240, 600, 64 * MIB)
    calls = plan.calls
    # The derived, xz-compressed wheels fit three pieces: preflight, one receive call, the tests call.
    assert [c.kind for c in calls] == ["preflight", "receive", "tests", "sweep", "sweep"]
    # The receive call generates both sweeps' datasets, in order; the tests call is the visit's first test call.
    assert [c.args for c in calls if c.kind == "receive"] == [" ".join(f"--generate {n}" for n in visit.SWEEPS)]
    sweep, slot = calls[-2], calls[-1]
    assert sweep.command.endswith(f"--sweep {visit.SWEEPS[0]}") and not sweep.retry
    # The last slot is one fixed line: the host decides what it runs, from the state file the sweep left.
    assert slot.retry and slot.command.endswith("--last-slot")
    assert slot.again == sweep.command and slot.alternative.endswith(f"--sweep {visit.SWEEPS[1]}")
    assert all(c.command.startswith("DALILOAD_NATIVE_LOGS=1 benchmarks/gpu/run_gpu_bench.sh") for c in calls)
    assert sweep.expected_s == slot.expected_s == sweep.timeout_s == plan.sweep_s >= assumed.min_sweep_s
    # Every step a call runs is counted: the tests call receives, decompresses and installs DALI, checks the
    # import, then smoke, merge timing and tests; each call's seconds are its steps', all of them in the budget.
    tests_call = next(c for c in calls if c.kind == "tests")
    named = [what.split(": ", 1)[1] for what, _ in tests_call.steps]
    assert [n.split(" ")[0] for n in named] == ["receive", "decompress", "pip", "import", "smoke", "merge", "GPU"]
    assert "nvidia_dali_cuda130 2.4.0" in named[1] and plan.tests_call_s == tests_call.expected_s
    assert plan.tests_call_s == pytest.approx(sum(seconds for _, seconds in tests_call.steps))
    for call in calls:
        assert call.expected_s == pytest.approx(sum(seconds for _, seconds in call.steps))
        assert all(step in plan.steps for step in call.steps if not call.retry)
    # What each call costs: the start once, a gap before every call after the first, its transfer, its command;
    # no idle time after the last call (the machine is given back at once).
    expected = limits.start_s
    for call in calls:
        expected += (0 if call.number == 1 else assumed.gap_s) + call.carried_bytes / MIB * assumed.transfer_s_per_mib
        expected += call.expected_s
    assert plan.total_s == pytest.approx(expected)
    assert plan.total_s + assumed.margin_s <= limits.device_s and assumed.margin_s >= 120  # <= 780 s of 900
    assert plan.without_retry_s == pytest.approx(plan.total_s - assumed.gap_s - slot.transfer_s(assumed)
                                                 - plan.sweep_s)
    # The two sweeps are all that is left, halved: one more second each would not fit.
    assert plan.total_s + assumed.margin_s + 2 > limits.device_s
    # Every call: within a command's limit, a call's bytes, a gap the machine survives, what comes back.
    assert assumed.gap_s <= limits.warm_s
    for call in calls:
        assert call.expected_s <= call.timeout_s <= limits.command_s
        assert call.carried_bytes <= limits.call_bytes
        assert len(call.out_files) <= limits.out_files
    assert sweep.out_files[1:3] == ("nvdec-h264-gop250.json", "nvdec-h264-gop250.md")
    assert slot.out_files[1] == "nvdec-h264-720p.json"  # what the slot brings back when it runs the second sweep
    # Even if every call before the first sweep runs to its timeout, that sweep still fits once.
    worst = limits.start_s + sum(
        c.transfer_s(assumed) + c.timeout_s for c in calls if not c.retry) + assumed.gap_s * (len(calls) - 2)
    assert worst <= limits.device_s
    assert visit.check_plan(plan) == []


def test_the_plan_check_names_what_breaks_the_limits(plan):
    rows = pieces.read_transfer("cuda13")
    piece = next(r for r in rows if r.kind == "piece")
    many = [dataclasses.replace(piece, name=f"p{i}") for i in range(9)]  # nine full calls
    problems = visit.check_plan(visit.make_plan(many))  # the sweeps shrink to what is left: too little
    assert any(re.match(r"a sweep call's -?\d+ s are under the 85 s a sweep needs", p) for p in problems), problems
    assert any(re.match(r"with every call at its timeout the visit takes \d+ s", p) for p in problems), problems
    longer = dataclasses.replace(plan, steps=plan.steps + (("a slower start", 61.0),))
    assert any("more than the 900 s of device time" in p for p in visit.check_plan(longer))
    big = [dataclasses.replace(piece, size=63 * MIB), dataclasses.replace(piece, name="p2")]  # 63 + the 8 MiB checkout
    assert any("carries 71.0 MiB, more than 64 MiB" in p for p in visit.check_plan(visit.make_plan(big)))
    slow = dataclasses.replace(plan, assumed=dataclasses.replace(plan.assumed, gap_s=31))
    assert any("loses the machine" in p for p in visit.check_plan(slow))
    with pytest.raises(ValueError, match="the transfer plan has no pieces"):
        visit.make_plan([])
    with pytest.raises(ValueError, match="two pieces at least"):
        visit.make_plan([piece])


def test_the_budget_the_script_reads_is_the_plans(plan):
    done = subprocess.run([sys.executable, str(GPU / "visit.py"), "--budget"], capture_output=True, text=True,
                          check=True)
    assert done.stdout.split() == [f"{plan.sweep_s:.0f}", f"{plan.assumed.tests_s:.0f}", f"{plan.tests_call_s:.0f}"]


def test_the_checkout_that_travels_with_every_call_stays_under_its_allowance():
    """A piece fills a call less the checkout: a heavier checkout would push every call over 64 MiB."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=True).stdout
    tracked = sum((REPO / n).stat().st_size for n in listed.decode().split("\0") if n and (REPO / n).is_file())
    assert tracked <= visit.ASSUMED.checkout_bytes, f"tracked files weigh {tracked / MIB:.2f} MiB"
    assert visit.PIECE_BYTES + visit.ASSUMED.checkout_bytes == visit.HostLimits().call_bytes


def test_the_transfer_plan_carries_only_what_the_host_lacks_smallest_first():
    rows = pieces.read_transfer("cuda13")
    members = [r for r in rows if r.kind == "member"]
    carried, left_out = wheelhouse.carried_entries("cuda13")
    # By package and version: the big wheels travel derived (slim.py), as .xz, with the wheel each unpacks to.
    assert sorted(m.name.split("-")[:2] for m in members) == sorted(e.file.split("-")[:2] for e in carried)
    derived = {r.part_of: r.name for r in rows if r.kind == "unpacked"}
    assert sorted(derived) == sorted(m.name for m in members if m.name.endswith(".whl.xz"))
    assert sorted(derived.values()) == ["av-18.1.0-0stored-cp311-abi3-manylinux_2_28_x86_64.whl",
                                        "nvidia_dali_cuda130-2.4.0-0slim-cp312-none-manylinux_2_28_x86_64.whl"]
    names = {wheelhouse.normalize(e.name) for e in carried}
    assert "nvidia-dali-cuda130" in names and "av" in names
    assert not names & visit.HOST_PACKAGES
    assert not names & {"numpy", "decord", "nvidia-nvimgcodec-cu13", "nvidia-libnvcomp-cu13", "psutil"}
    assert any(why.startswith("decord: optional") for why in left_out)
    # The stream: members back to back, smallest first; pieces of one call each, adding up to the stream.
    assert [m.size for m in members] == sorted(m.size for m in members)
    assert all(a.offset + a.size <= b.offset for a, b in zip(members, members[1:]))
    stream = next(r for r in rows if r.kind == "file")
    piece_rows = [r for r in rows if r.kind == "piece"]
    assert sum(p.size for p in piece_rows) == stream.size
    assert all(p.size <= visit.PIECE_BYTES for p in piece_rows)
    _, completes = visit.pieces_and_members(rows)
    assert len(piece_rows) == 3  # four pieces before the wheels were derived and xz-compressed
    assert "nvidia_dali_cuda130-2.4.0-0slim-cp312-none-manylinux_2_28_x86_64.whl.xz" in completes[piece_rows[-1].name]
    assert any(w.startswith("av-") for w in completes[piece_rows[0].name])  # PyAV in the first call


def test_plan_and_check_run_on_a_cpu_host(tmp_path):
    done = _script("--plan")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "Fits the host's limits." in out and "DOES NOT FIT" not in out
    assert re.search(r"0:00-\d+:\d\d call 1 \[preflight\] .*: carry benchmarks/gpu/wheels/wheels-cuda13.tar.part-aa",
                     out)
    assert "call 5 [last slot: call 4 again if it failed, else the second sweep]" in out
    assert 'DALILOAD_NATIVE_LOGS=1 benchmarks/gpu/run_gpu_bench.sh --out "$OUT" --tests' in out
    assert 'DALILOAD_NATIVE_LOGS=1 benchmarks/gpu/run_gpu_bench.sh --out "$OUT" --last-slot' in out
    assert '0 -> --out "$OUT" --sweep h264-720p; 6 (no NVDEC) -> nothing' in out
    assert '--receive --generate h264-gop250 --generate h264-720p' in out
    assert "give_back at once" in out and "if call" not in out
    assert "run_gpu_bench.sh --prepare" in out and "engines busy" in out
    assert re.search(r"total with the last slot", out) and "completes and installs: nvidia_dali_cuda130 2.4.0" in out
    done = _script("--check", "--wheels", str(tmp_path), lock=_empty_lock(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "3 of 3 pieces missing" in done.stdout and "MISSING wheels-cuda13.tar.part-aa" in done.stdout


# --- receiving pieces, installing as they arrive ----------------------------------------------------


def _wheel(folder: Path, name: str, files: dict[str, str], blob: int = 0) -> Path:
    path = folder / f"{name}-0.1-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in files.items():
            archive.writestr(member, text)
        if blob:
            archive.writestr(f"{name}/blob.bin", np.random.default_rng(len(name)).bytes(blob))
        for member, text in (("METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n"),
                             ("WHEEL", "Wheel-Version: 1.0\nGenerator: t\nRoot-Is-Purelib: true\nTag: py3-none-any\n"),
                             ("RECORD", "")):
            archive.writestr(f"{name}-0.1.dist-info/{member}", text)
    return path


def _lock_of(wheels: list[Path], path: Path) -> Path:
    path.write_text("".join(f"any\t{w.name.split('-')[0]}\t0.1\trequired\t{w.name}\t"
                            f"{sha256(w.read_bytes()).hexdigest()}\n" for w in wheels))
    return path


def _empty_lock(folder: Path) -> Path:
    """A lock naming no package, so these tests do not depend on what this environment has installed."""
    path = folder / "empty.lock"
    path.write_text("#flavour\tname\tversion\tneed\tfile\tsha256\n")
    return path


def _script(*args: str, ignore: str = "", site: Path | None = None, lock: Path | None = None,
            transfer: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHON=sys.executable, DALILOAD_BENCH_IGNORE_INSTALLED=ignore,
               DALILOAD_DALI_FLAVOUR="cuda13", DALILOAD_BENCH_LOCK=str(lock or ""),
               DALILOAD_BENCH_TRANSFER=str(transfer or ""))
    if site is not None:
        env["DALILOAD_BENCH_SITE"] = str(site)
    return subprocess.run(["bash", str(GPU_SCRIPT), *args], capture_output=True, text=True, env=env, timeout=120)


@pytest.fixture
def packed(tmp_path, monkeypatch):
    """Three wheels (two small, one of 2.5 MB) packed into 1 MiB pieces: the small ones complete in piece 1."""
    here = tmp_path / "here"
    here.mkdir()
    wheels = [_wheel(here, "smallpkg", {"smallpkg/__init__.py": "V = 3\n"}),
              _wheel(here, "tinypkg", {"tinypkg/__init__.py": "V = 4\n"}),
              _wheel(here, "bigpkg", {"bigpkg/__init__.py": "V = 2\n"}, blob=2_500_000)]
    lock = _lock_of(wheels, tmp_path / "t.lock")
    transfer = tmp_path / "transfer-cuda13.tsv"
    monkeypatch.setenv("DALILOAD_BENCH_LOCK", str(lock))
    monkeypatch.setenv("DALILOAD_BENCH_TRANSFER", str(transfer))
    rows = wheelhouse.pack(here, "cuda13", piece_bytes=MIB, host=frozenset())
    return here, rows, lock, transfer


def test_receive_installs_each_wheel_as_soon_as_its_last_piece_lands(packed, tmp_path):
    here, rows, lock, transfer = packed
    piece_rows = [r for r in rows if r.kind == "piece"]
    assert [r.name for r in rows if r.kind == "member"][-1] == "bigpkg-0.1-py3-none-any.whl"  # smallest first
    assert len(piece_rows) == 3
    host, site = tmp_path / "host", tmp_path / "site"
    host.mkdir()
    installed_after = []
    for piece in piece_rows:
        shutil.copy(here / piece.name, host / piece.name)
        done = _script("--receive", "--wheels", str(host), site=site, lock=lock, transfer=transfer)
        assert done.returncode == 0, done.stdout + done.stderr
        installed_after.append(sorted(p.name for p in site.iterdir() if p.name.endswith("pkg")) if site.exists()
                               else [])
    assert installed_after == [["smallpkg", "tinypkg"], ["smallpkg", "tinypkg"], ["bigpkg", "smallpkg", "tinypkg"]]
    assert (site / "bigpkg" / "__init__.py").read_text() == "V = 2\n"
    assert "installed now: 1; waiting for pieces: none" in done.stdout
    again = _script("--receive", "--wheels", str(host), site=site, lock=lock, transfer=transfer)
    assert again.returncode == 0 and "installed now: 0" in again.stdout  # safe to run again
    assert not list(host.glob("*.tar")), "the pieces are read where they are, never joined"


def test_receive_names_a_piece_that_is_not_as_planned(packed, tmp_path):
    here, rows, lock, transfer = packed
    host, site = tmp_path / "host", tmp_path / "site"
    host.mkdir()
    first, second = [r.name for r in rows if r.kind == "piece"][:2]
    shutil.copy(here / first, host / first)
    (host / second).write_bytes((here / second).read_bytes()[:-10])  # truncated
    out = tmp_path / "out"  # the call's $OUT: the log goes there too, the exit code is kept
    done = _script("--out", str(out), "--receive", "--wheels", str(host), site=site, lock=lock, transfer=transfer)
    assert done.returncode == 2
    assert f"piece {second}: {MIB - 10} bytes, not {MIB} (still arriving?)" in done.stdout  # stderr joins the log
    assert f"piece {second}: {MIB - 10} bytes" in (out / "visit.log").read_text()
    (host / second).write_bytes(bytes(MIB))  # the right size, other bytes: from another pack
    done = _script("--receive", "--wheels", str(host), site=site, lock=lock, transfer=transfer)
    assert done.returncode == 2 and "sha256 differs from the transfer plan" in done.stderr


def test_check_names_the_missing_pieces_and_what_each_completes(packed, tmp_path):
    here, rows, lock, transfer = packed
    host = tmp_path / "host"
    host.mkdir()
    first = next(r for r in rows if r.kind == "piece")
    shutil.copy(here / first.name, host / first.name)
    done = _script("--check", "--wheels", str(host), lock=lock, transfer=transfer)
    assert done.returncode == 3, done.stderr
    assert re.search(r"1 have +wheels-cuda13.tar.part-aa \(1.0 MiB\); completes tinypkg 0.1, smallpkg 0.1",
                     done.stdout)
    assert re.search(r"3 MISSING wheels-cuda13.tar.part-ac .*; completes bigpkg 0.1", done.stdout)
    assert "2 of 3 pieces missing" in done.stdout
    assert "to install smallpkg from smallpkg-0.1-py3-none-any.whl (in the pieces here" in done.stdout
    assert "MISSING   bigpkg 0.1 (required): bigpkg-0.1-py3-none-any.whl (its piece has not arrived)" in done.stdout
    assert sorted(p.name for p in host.iterdir()) == [first.name]  # --check wrote nothing


def test_pack_makes_the_same_pieces_every_time(packed, tmp_path):
    """Whoever packs the locked wheels gets the pieces whose sha256 the committed transfer plan names."""
    here, rows, _, _ = packed
    again = tmp_path / "again"
    again.mkdir()
    for wheel in here.glob("*.whl"):
        shutil.copy(wheel, again / wheel.name)
    assert wheelhouse.pack(again, "cuda13", piece_bytes=MIB, host=frozenset()) == rows


def test_pack_refuses_wheels_that_are_absent_or_not_the_locked_ones(tmp_path, monkeypatch):
    wheel = _wheel(tmp_path, "onepkg", {"onepkg/__init__.py": "\n"})
    monkeypatch.setenv("DALILOAD_BENCH_LOCK", str(_lock_of([wheel], tmp_path / "t.lock")))
    monkeypatch.setenv("DALILOAD_BENCH_TRANSFER", str(tmp_path / "transfer-cuda13.tsv"))
    wheel.write_bytes(wheel.read_bytes() + b"x")
    with pytest.raises(ValueError, match=r"sha256 differs from wheels.lock: onepkg-0.1-py3-none-any.whl"):
        wheelhouse.pack(tmp_path, "cuda13", host=frozenset())
    wheel.unlink()
    with pytest.raises(ValueError, match=r"not in .*: onepkg-0.1-py3-none-any.whl \(download them first"):
        wheelhouse.pack(tmp_path, "cuda13", host=frozenset())


# --- the nvidia namespace ------------------------------------------------------------------------


def test_carried_nvidia_packages_import_beside_a_machines_regular_nvidia_package(tmp_path):
    """The machine's nvidia/__init__.py is a regular package that does not extend its path (the worst case).

    Two wheels with nvidia/ subpackages installed in two calls both stay (pip --target alone would replace
    SITE/nvidia), and with the machine's nvidia.cudnn all import together; a bare namespace folder would not.
    """
    wheels, site, system = tmp_path / "wheels", tmp_path / "site", tmp_path / "system"
    wheels.mkdir()
    (system / "nvidia" / "cudnn").mkdir(parents=True)
    (system / "nvidia" / "__init__.py").write_text("")
    (system / "nvidia" / "cudnn" / "__init__.py").write_text("WHERE = 'system'\n")
    first = _wheel(wheels, "nvfake", {"nvidia/__init__.py": "\n", "nvidia/fakedali/__init__.py": "WHERE = 'site'\n"})
    assert wheelhouse.install([first], site) == 0
    second = _wheel(wheels, "nvother", {"nvidia/other/__init__.py": "WHERE = 'site too'\n"})
    assert wheelhouse.install([second], site) == 0
    assert (site / "nvidia" / "__init__.py").read_text() == wheelhouse.NAMESPACE_INIT
    code = ("import nvidia.cudnn, nvidia.fakedali, nvidia.other; "
            "print(nvidia.cudnn.WHERE, nvidia.fakedali.WHERE, nvidia.other.WHERE)")

    def run(path: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env=dict(os.environ, PYTHONPATH=path))

    assert run(f"{site}{os.pathsep}{system}").stdout.split() == ["system", "site", "site", "too"]
    (site / "nvidia" / "__init__.py").unlink()  # what deleting a shipped __init__.py used to leave
    bare = run(f"{site}{os.pathsep}{system}")
    assert bare.returncode != 0 and "No module named 'nvidia.fakedali'" in bare.stderr
    assert wheelhouse.extend_nvidia_namespace(site)  # written again
    assert wheelhouse.extend_nvidia_namespace(site) == []  # already in place: nothing to do


# --- the preflight on a CPU host ---------------------------------------------------------------------


def test_nvdec_caps_structure_has_the_sdks_layout():
    """CUVIDDECODECAPS of cuviddec.h: 88 bytes, the outputs where the driver writes them."""
    caps = checks._DecodeCaps
    assert ctypes.sizeof(caps) == 88
    offsets = {name: getattr(caps, name).offset for name, _ in caps._fields_}
    assert (offsets["supported"], offsets["nvdecs"], offsets["max_width"], offsets["min_width"],
            offsets["reserved3"]) == (24, 25, 28, 40, 48)


def test_preflight_on_a_cpu_host_names_what_would_fail_everything_later(tmp_path):
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has an NVIDIA driver")
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(GPU / "checks.py"), "preflight", "--site", str(tmp_path / "site"),
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    report = json.loads((out / "preflight.json").read_text())
    states = {c["check"]: c["state"] for c in report["checks"]}
    assert states["driver"] == states["libnvcuvid"] == states["torch"] == "FAIL"
    assert states["nvidia namespace"] == "ok" and states["pip"] == "ok"
    assert "every NVDEC row would fail" in done.stdout
    caps = subprocess.run([sys.executable, str(GPU / "checks.py"), "nvdec-caps"], capture_output=True, text=True,
                          timeout=60)
    assert json.loads(caps.stdout)["error"].startswith("cannot load the driver's libraries")


# --- other files in pieces (the split helper) ----------------------------------------------------------


def _split(wheel: Path) -> list[Path]:
    # The split helper, with 1 MB pieces so a small file makes several.
    done = subprocess.run([sys.executable, str(GPU / "wheelhouse.py"), "split", str(wheel),
                           "--piece-bytes", "1000000"], capture_output=True, text=True, check=True)
    assert "3 pieces of at most 1000000 bytes" in done.stdout
    return sorted(wheel.parent.glob(wheel.name + ".part-*"))


def test_split_helper_and_reassembly(tmp_path):
    wheel = _wheel(tmp_path, "fakepkg", {"fakepkg/__init__.py": "VALUE = 1\n"}, blob=2_500_000)
    original = wheel.read_bytes()
    parts = _split(wheel)
    assert [p.name[-2:] for p in parts] == ["aa", "ab", "ac"]
    assert all(p.stat().st_size <= 1_000_000 for p in parts)
    assert (tmp_path / (wheel.name + ".sha256")).read_text().endswith(f"  {wheel.name}\n")
    wheel.unlink()
    done = _script("--check", "--wheels", str(tmp_path), lock=_empty_lock(tmp_path.parent))
    assert done.returncode == 0, done.stderr
    assert not wheel.exists()  # --check changes nothing
    subprocess.run([sys.executable, str(GPU / "wheelhouse.py"), "assemble", "--wheels", str(tmp_path)],
                   check=True, capture_output=True)
    assert wheel.read_bytes() == original


def test_split_files_that_do_not_add_up_are_refused(tmp_path):
    wheel = _wheel(tmp_path, "fakepkg", {"fakepkg/__init__.py": "VALUE = 1\n"}, blob=2_500_000)
    parts = _split(wheel)
    wheel.unlink()
    parts[1].write_bytes(parts[1].read_bytes()[:-10])  # truncated piece
    done = _script("--install-only", "--wheels", str(tmp_path), lock=_empty_lock(tmp_path.parent))
    assert done.returncode == 2
    assert f"{wheel.name}: the 3 pieces add up to sha256" in done.stderr
    assert "a piece is missing, truncated or from another file" in done.stderr
    assert not wheel.exists()
    parts[1].unlink()  # a gap: aa, ac
    done = _script("--install-only", "--wheels", str(tmp_path), lock=_empty_lock(tmp_path.parent))
    assert done.returncode == 2
    assert f"piece {wheel.name}.part-ab is missing" in done.stderr


def test_check_says_exactly_which_wheels_are_missing(tmp_path):
    done = _script("--check", "--wheels", str(tmp_path), ignore="nvidia-dali-cuda130,av,psutil")
    assert done.returncode == 3
    err = done.stderr
    assert "MISSING   nvidia-dali-cuda130 2.4.0 (required)" in done.stdout
    assert re.search(r"MISSING wheels-cuda13.tar.part-ac \(\d+\.\d MiB\); completes nvidia_dali_cuda130 2.4.0",
                     done.stdout)
    dali = "nvidia_dali_cuda130-2.4.0-py3-none-manylinux_2_28_x86_64.whl"
    assert f"  {dali}    (nvidia-dali-cuda130==2.4.0, required" in err
    assert "  av-18.1.0-cp311-abi3-manylinux_2_28_x86_64.whl    (av==18.1.0, required" in err
    assert "psutil==7.2.2, optional" in err
    assert "pip download --no-deps --only-binary=:all:" in err and "nvidia-dali-cuda130==2.4.0 av==18.1.0" in err
    assert re.search(r"\d+ required wheel\(s\) missing: nothing installed.", err)


def test_the_script_installs_beside_the_system_packages(tmp_path):
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    wheels.mkdir()
    _wheel(wheels, "fakepkg", {"fakepkg/__init__.py": "VALUE = 1\n"})
    done = _script("--install-only", "--wheels", str(wheels), site=site, lock=_empty_lock(tmp_path))
    assert (site / "fakepkg" / "__init__.py").read_text() == "VALUE = 1\n"
    assert sorted(p.name for p in site.iterdir()) == ["fakepkg", "fakepkg-0.1.dist-info"]
    import torch

    if not torch.cuda.is_available():  # the script stops at its import check, after installing
        assert done.returncode == 4
        assert "import check failed" in done.stderr


def test_the_readme_shows_the_plan_as_the_code_makes_it(plan):
    """benchmarks/gpu/README.md's minute-by-minute block is the plan's own text (visit.py --readme writes it)."""
    text = (GPU / "README.md").read_text()
    begin = text.index("<!-- visit-plan:begin")
    block = text[text.index("-->", begin) + 3:text.index("<!-- visit-plan:end -->")].strip("\n")
    assert block == visit.readme_section(plan, "cuda13"), "run: python3 benchmarks/gpu/visit.py --readme " \
                                                          "benchmarks/gpu/README.md"


def test_the_smokes_decode_checks_every_frame_against_the_plan(make_clip):
    """The smoke's decode (NVDEC on the visit) run on DALI's CPU decoder: planned frames, or what went wrong."""
    pytest.importorskip("nvidia.dali")
    vp9 = make_clip(codec="vp9", num_frames=90, gop=30)
    windows = [(0, 1), (40, 3), (70, 4)]  # the last runs past the end
    assert checks._decode(vp9, 90, windows, size=(96, 128), device="cpu") == ""
    wrong = checks._decode(vp9, 200, windows, size=(96, 128), device="cpu")  # the file has fewer frames
    assert wrong.startswith("DALI failed: ") and "out-of-bounds frame index" in wrong


def test_the_smoke_on_a_cpu_host_says_the_decoder_cannot_start(tmp_path):
    pytest.importorskip("nvidia.dali")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    done = subprocess.run([sys.executable, str(GPU / "checks.py"), "smoke", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 1
    checks_run = {c["check"]: c for c in json.loads((tmp_path / "smoke.json").read_text())["checks"]}
    assert checks_run["import nvidia.dali"]["state"] == "ok"
    assert checks_run["decode h264"]["state"] == "FAIL" and "needs a CUDA GPU" in checks_run["decode h264"]["detail"]
    assert "daliload's table says" in checks_run["decode av1"]["detail"]


# --- preparing the pieces here (--prepare) ------------------------------------------------------------


def test_prepare_keeps_pieces_that_are_as_planned_and_repacks_the_same_ones(packed, monkeypatch, capsys):
    here, rows, _, transfer = packed
    assert wheelhouse.prepare(here, "cuda13", piece_bytes=MIB) == 0
    assert "3 pieces of transfer-cuda13.tsv are in" in capsys.readouterr().out  # nothing to do
    for piece in (r for r in rows if r.kind == "piece"):
        (here / piece.name).unlink()
    monkeypatch.setattr(wheelhouse.subprocess, "call", lambda *a, **k: pytest.fail("nothing to download"))
    assert wheelhouse.prepare(here, "cuda13", piece_bytes=MIB) == 0  # the wheels are here: packed again
    out = capsys.readouterr().out
    assert "3 wheels match wheels.lock; packing" in out and "ready: the pieces are the committed plan's" in out
    assert pieces.read_transfer("cuda13") == rows and not list(here.glob("*.packed.tsv"))


def test_prepare_downloads_what_is_missing_and_refuses_what_differs(packed, monkeypatch, capsys):
    here, rows, _, transfer = packed
    for piece in (r for r in rows if r.kind == "piece"):
        (here / piece.name).unlink()
    tiny = here / "tinypkg-0.1-py3-none-any.whl"
    kept = tiny.read_bytes()
    tiny.unlink()
    asked = []

    def pip(command, **kwargs):  # stands in for PyPI: "downloads" the wheel it was asked for
        asked.append(command)
        tiny.write_bytes(kept)
        return 0
    monkeypatch.setattr(wheelhouse.subprocess, "call", pip)
    assert wheelhouse.prepare(here, "cuda13", piece_bytes=MIB) == 0
    (command,) = asked
    assert command[3:5] == ["download", "--no-deps"] and "tinypkg==0.1" in command and "3.12" in command
    assert command[command.index("-d") + 1] == str(here)
    capsys.readouterr()
    for piece in (r for r in rows if r.kind == "piece"):
        (here / piece.name).unlink()
    tiny.write_bytes(kept + b"x")  # not the locked file; a download that fails
    monkeypatch.setattr(wheelhouse.subprocess, "call", lambda *a, **k: 1)
    assert wheelhouse.prepare(here, "cuda13", piece_bytes=MIB) == 3
    assert "pip download failed" in capsys.readouterr().err
    tiny.write_bytes(kept)
    changed = [dataclasses.replace(r, sha256="0" * 64) if r.kind == "piece" else r for r in rows]
    pieces.write_rows(transfer, changed, "# another pack\n")
    assert wheelhouse.prepare(here, "cuda13", piece_bytes=MIB) == 2
    assert "differ from transfer-cuda13.tsv" in capsys.readouterr().err


# --- what a call reports when NVDEC is missing ------------------------------------------------------------


def test_a_missing_nvdec_is_reported_without_stopping_the_visit(tmp_path, capsys):
    report = checks.Report("preflight")
    report.add("torch", "ok", "sees the GPU")
    report.add("libnvcuvid", "FAIL", "does not load", fatal=False)
    assert report.write(tmp_path) == 0 and report.failed == [] and report.degraded == ["libnvcuvid"]
    assert "no fatal failure; libnvcuvid failed: the visit goes on" in capsys.readouterr().out
    assert json.loads((tmp_path / "preflight.json").read_text())["degraded"] == ["libnvcuvid"]
    report.add("driver", "FAIL", "too old")
    assert report.write(None) == 1 and report.failed == ["driver"]


def test_a_sweep_call_without_nvdec_measures_nothing_and_says_a_rerun_cannot_help(tmp_path):
    """On this CPU host: the sweep reports itself unavailable (exit 6: give the machine back), its JSON and table
    in $OUT; no dataset is generated for it."""
    out, results = tmp_path / "out", tmp_path / "results"
    env = dict(os.environ, PYTHON=sys.executable, DALILOAD_WHEELS=str(tmp_path / "w"), DALILOAD_DALI_FLAVOUR="cuda13",
               DALILOAD_BENCH_SITE=str(tmp_path / "site"), DALILOAD_BENCH_LOCK=str(_empty_lock(tmp_path)),
               DALILOAD_BENCH_TRANSFER=str(tmp_path / "none.tsv"), DALILOAD_BENCH_RESULTS=str(results),
               DALILOAD_BENCH_BUDGET_S="50")
    (tmp_path / "w").mkdir()
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    done = subprocess.run(["bash", str(GPU_SCRIPT), "--out", str(out), "--sweep", "h264-gop250"], capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 6, done.stdout + done.stderr
    result = json.loads((out / "nvdec-h264-gop250.json").read_text())
    assert result["status"] == "unavailable" and "no CUDA device" in result["reason"]
    assert "Not measured: torch sees no CUDA device" in (out / "nvdec-h264-gop250.md").read_text()
    assert "== peers: only" in (out / "visit.log").read_text()  # too little left for them in 50 s


# --- the sweep, on DALI's CPU decoder -----------------------------------------------------------------------


def test_timed_epochs_give_every_pipeline_whole_rounds_of_at_least_two_batches():
    from benchmarks.bench_nvdec import timed_clips

    assert [timed_clips(p, 32, 256) for p in (1, 2, 4, 7)] == [256, 256, 256, 448]
    assert timed_clips(7, 32, 1000) == 1120 and timed_clips(2, 2, 8) == 8 and timed_clips(4, 2, 1) == 16


def _sweep(tmp_path, *extra: str) -> dict:
    from benchmarks import bench_nvdec

    out = tmp_path / "nvdec.json"
    args = ["--device", "cpu", "--dataset", "vp9-gop16", "--files", "3", "--duration", "3", "--size", "128x96",
            "--min-clips", "8", "--threads", "1,2", "--pipelines", "1,2", "--batch-size", "2", "--crop-size", "32",
            "--data-dir", str(tmp_path / "data"), "--json", str(out), "--results-md", str(tmp_path / "RESULTS.md"),
            *extra]
    assert bench_nvdec.main(args) == 0
    return json.loads(out.read_text())


@pytest.mark.dali
def test_the_sweep_measures_every_setting_through_the_loaders_dali_path(tmp_path):
    pytest.importorskip("nvidia.dali")
    result = _sweep(tmp_path)
    ceiling = result["ceiling"]
    assert ceiling["status"] == "ok" and ceiling["files"] == 9 and ceiling["frames"] == 9 * 90  # 3 files, 3 rounds
    assert [(r["pipelines"], r["threads"]) for r in result["rows"]] == [(2, 1), (2, 2), (1, 1), (1, 2)]
    for row in result["rows"]:
        # at least 8 clips and two batches of 2 per pipeline, in whole epochs of the 3 files: 3 epochs, 9 clips
        assert row["status"] == "ok" and row["epochs"] == 3 and row["clips"] == row["clips_dali"] == 9
        assert row["failures"] == 0 and row["feed"] == "window" and row["cut_workers"] == 2
        assert row["prefetch"] == 4  # the loader's rule: 2 workers x 4 videos ahead each, in batches of 2
        # the loader's default feed: windows cut from their file, but for those whose keyframe is frame 0
        assert 0 < row["clips_dali_cut"] <= 9
        # the loader's count: from the keyframe at or before each window (one every 16 frames) to its last frame
        assert 9 * 61 <= row["frames"] < 9 * (61 + 16)
        assert row["engines_busy"] is None  # no NVML on a CPU run: no NVDEC figure, none made up
    assert result["best"]["clips_per_s"] == max(r["clips_per_s"] for r in result["rows"])
    text = (tmp_path / "RESULTS.md").read_text()
    assert "## NVDEC sweep: `python -m benchmarks.bench_nvdec`" in text and "| 1 (ceiling: whole files) |" in text
    assert "fed each window's packets (cut by 2 fallback processes)" in text
    assert f"| {result['rows'][0]['clips_dali_cut']} of 9 |" in text
    assert (tmp_path / "nvdec.md").read_text() in text


@pytest.mark.dali
def test_the_sweep_fed_whole_files_decodes_each_window_from_frame_0(tmp_path):
    pytest.importorskip("nvidia.dali")
    one = ("--pipelines", "1", "--threads", "1")
    [cut] = _sweep(tmp_path / "window", *one)["rows"]
    [row] = _sweep(tmp_path / "file", "--feed", "file", *one)["rows"]
    assert row["status"] == "ok" and row["feed"] == "file" and row["clips_dali"] == 9 and row["clips_dali_cut"] == 0
    assert row["frames"] > cut["frames"]  # the same windows (one seed), each decoded from frame 0
    assert "fed whole files, timed" in (tmp_path / "file" / "nvdec.md").read_text()


@pytest.mark.dali
def test_the_sweep_starts_no_setting_past_its_time_budget(tmp_path):
    pytest.importorskip("nvidia.dali")
    result = _sweep(tmp_path, "--time-budget", "0")
    assert [r["status"] for r in result["rows"]] == ["skipped"] * 4 and result["best"] is None
    assert result["rows"][0]["reason"] == "would end past the time budget of 0 s"


def test_engines_busy_is_the_decoder_utilisation_times_the_engines():
    from benchmarks.bench_nvdec import _resources
    from benchmarks.metrics import RunResources

    figures = _resources(RunResources(cpu_s=1.0, peak_rss_mb=10.0, gpu_mem_peak_mb=900.0, gpu_mem_base_mb=500.0,
                                      nvdec_util_pct=14.0, gpu_util_pct=30.0), engines=7)
    assert figures["engines_busy"] == pytest.approx(0.98) and figures["gpu_mem_peak_mb"] == 400.0


# --- the peers in their best mode on a GPU ---------------------------------------------------------------


def test_dataloader_peers_pin_their_batches_on_a_gpu_run():
    from types import SimpleNamespace

    from benchmarks.loaders import LoaderConfig
    from benchmarks.peers.blog_pyav import BlogPyAV
    from benchmarks.task import TaskSpec

    dataset = SimpleNamespace(videos=[SimpleNamespace(num_frames=10)])
    for device, pinned in (("cuda", True), ("cpu", False)):
        peer = BlogPyAV(dataset, [], LoaderConfig(task=TaskSpec(), workers=0, device=device))
        assert peer._loader.pin_memory is pinned


def test_torchcodec_on_cuda_seeks_approximately_on_a_pool_of_threads(monkeypatch):
    import types

    import torch

    from benchmarks.peers import torchcodec_peer
    from daliload.plan import CropBox, OutputSpec, Sample

    made = []

    class FakeDecoder:
        def __init__(self, path, **kwargs):
            made.append(kwargs)

        def get_frames_at(self, indices):
            return types.SimpleNamespace(data=torch.zeros(len(indices), 8, 8, 3, dtype=torch.uint8))
    fake = types.ModuleType("torchcodec.decoders")
    fake.VideoDecoder = FakeDecoder
    monkeypatch.setitem(sys.modules, "torchcodec.decoders", fake)
    sample = Sample(position=0, video_index=0, path="a.mp4", label=0, start_frame=0, frame_stride=1, clip_len=2,
                    crop=CropBox.full())
    clip = torchcodec_peer.decode_clip_cuda("a.mp4", [0, 1], sample, OutputSpec(size=(8, 8)))
    assert made == [{"device": "cuda", "dimension_order": "NHWC", "seek_mode": "approximate"}]
    assert tuple(clip.shape) == (3, 2, 8, 8)
    assert torchcodec_peer.TorchCodecCUDA.knob == "decoding threads"


# --- the merge's timing ------------------------------------------------------------------------------------


def test_the_merge_timing_runs_dry_on_the_cpu_and_checks_the_batch():
    import merge_time

    result = merge_time.measure(4, 2, 16, 2, device="cpu", modes=("pageable",))
    assert result["batch_shape"] == [4, 3, 2, 16, 16] and result["modes"]["pageable"]["runs"] == 2
    pixels = merge_time.measure(4, 2, 16, 2, device="cpu", modes=("pageable",), pixels=True)  # checked bitwise
    assert pixels["dtype"] == "uint8" and pixels["batch_mb"] * 4 == result["batch_mb"]
    assert merge_time.MODES == ("pageable", "register", "staging", "pinned")


# --- derived wheels: what this Python loads, stored, xz-compressed -----------------------------------------


def _abi_wheel(folder: Path) -> Path:
    """A wheel laid out like DALI's: bindings for three ABIs, headers, a shared library, a RECORD."""
    import base64

    files = {"nvidia/fake/__init__.py": "from .backend_impl import VALUE\n",
             "nvidia/fake/backend_impl.cpython-311-x86_64-linux-gnu.so": "# stands in for 3.11's bindings\n",
             "nvidia/fake/backend_impl.cpython-312-x86_64-linux-gnu.so": "# 3.12's\n",
             "nvidia/fake/backend_impl.cpython-314t-x86_64-linux-gnu.so": "# 3.14t's\n",
             "nvidia/fake/include/fake.h": "int f();\n",
             "nvidia/fake/libfake.so": "x" * 50_000,
             "fakedali-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: fakedali\nVersion: 1.0\n",
             "fakedali-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: false\n"
                                             "Tag: py3-none-manylinux_2_28_x86_64\n"}

    def line(name: str, text: str) -> str:
        digest = base64.urlsafe_b64encode(sha256(text.encode()).digest()).rstrip(b"=").decode()
        return f"{name},sha256={digest},{len(text.encode())}"
    record = "\n".join([line(n, t) for n, t in files.items()] + ["fakedali-1.0.dist-info/RECORD,,"]) + "\n"
    path = folder / "fakedali-1.0-py3-none-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, text in {**files, "fakedali-1.0.dist-info/RECORD": record}.items():
            archive.writestr(name, text)
    return path


def test_a_derived_wheel_keeps_what_its_python_loads_and_comes_out_the_same_every_time(tmp_path):
    import base64

    import slim

    original = _abi_wheel(tmp_path)
    first, again = tmp_path / "a", tmp_path / "b"
    first.mkdir(), again.mkdir()
    made = slim.derive(original, first, python="312")
    assert made.name == "fakedali-1.0-0slim-cp312-none-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(made) as archive:
        names = archive.namelist()
        assert "nvidia/fake/backend_impl.cpython-312-x86_64-linux-gnu.so" in names
        assert not [n for n in names if "cpython-311" in n or "cpython-314t" in n or "/include/" in n]
        assert {i.compress_type for i in archive.infolist()} == {zipfile.ZIP_STORED}
        assert {i.date_time for i in archive.infolist()} == {slim.FIXED_TIME}
        assert "Tag: cp312-none-manylinux_2_28_x86_64" in archive.read("fakedali-1.0.dist-info/WHEEL").decode()
        record = archive.read("fakedali-1.0.dist-info/RECORD").decode().splitlines()
        # RECORD lists exactly the files kept, each with its hash as stored (pip and wheel tools check it).
        assert sorted(r.split(",")[0] for r in record) == sorted(names)
        for entry in record:
            name, digest, size = entry.rsplit(",", 2)
            if digest:
                data = archive.read(name)
                assert digest == "sha256=" + base64.urlsafe_b64encode(sha256(data).digest()).rstrip(b"=").decode()
                assert int(size) == len(data)
    # Deterministic: derived and compressed again elsewhere, the same bytes (the transfer plan commits both sha256).
    again_made = slim.derive(original, again, python="312")
    assert made.read_bytes() == again_made.read_bytes()
    assert slim.compress(made).read_bytes() == slim.compress(again_made).read_bytes()
    xz = made.with_name(made.name + ".xz")
    assert slim.decompress(xz.read_bytes(), tmp_path / "out.whl") == sha256(made.read_bytes()).hexdigest()
    with pytest.raises(__import__("lzma").LZMAError, match="ends early"):
        slim.decompress(xz.read_bytes()[:-20], tmp_path / "cut.whl")
    stored = slim.derive(_wheel(tmp_path, "plainpkg", {"plainpkg/__init__.py": "V = 1\n"}), first)
    assert stored.name == "plainpkg-0.1-0stored-py3-none-any.whl"  # nothing dropped: same tags, a build tag


def test_an_xz_member_is_decompressed_checked_and_installed_when_its_last_piece_lands(packed, tmp_path,
                                                                                         monkeypatch):
    here, _, lock, transfer = packed
    monkeypatch.setattr(wheelhouse, "COMPRESS_OVER", 1_000_000)  # bigpkg (2.5 MB) travels derived, as xz
    rows = wheelhouse.pack(here, "cuda13", piece_bytes=MIB // 2, host=frozenset())
    members = [r for r in rows if r.kind == "member"]
    (unpacked,) = [r for r in rows if r.kind == "unpacked"]
    assert members[-1].name == "bigpkg-0.1-0stored-py3-none-any.whl.xz" and unpacked.part_of == members[-1].name
    assert unpacked.name == "bigpkg-0.1-0stored-py3-none-any.whl"
    assert "bigpkg-0.1-0stored-py3-none-any.whl.xz: bigpkg-0.1-0stored" in transfer.read_text()
    plan = visit.make_plan(rows)
    assert any(what.startswith("call ") and "decompress bigpkg 0.1" in what for what, _ in plan.steps)
    host, site = tmp_path / "host", tmp_path / "site"
    host.mkdir()
    for piece in (r for r in rows if r.kind == "piece"):
        shutil.copy(here / piece.name, host / piece.name)
    done = _script("--receive", "--wheels", str(host), site=site, lock=lock, transfer=transfer)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (site / "bigpkg" / "__init__.py").read_text() == "V = 2\n"
    assert sha256((host / unpacked.name).read_bytes()).hexdigest() == unpacked.sha256
    assert not list(host.glob("*.xz")), "the .xz is decompressed from the pieces, never written"
    again = _script("--receive", "--wheels", str(host), site=site, lock=lock, transfer=transfer)
    assert again.returncode == 0 and "installed now: 0" in again.stdout  # by package: not installed twice
    # The wheel decompressed is checked against its own sha256 in the plan.
    (host / unpacked.name).unlink()
    changed = [dataclasses.replace(r, sha256="0" * 64) if r.kind == "unpacked" else r for r in rows]
    pieces.write_rows(transfer, changed, "# another pack\n")
    done = _script("--receive", "--wheels", str(host), site=site, lock=lock, transfer=transfer)
    assert done.returncode == 2 and f"{unpacked.name}: decompressed from {members[-1].name}" in done.stderr
    assert not (host / unpacked.name).exists()


DALI_WHEEL = GPU / "wheels" / "nvidia_dali_cuda130-2.4.0-py3-none-manylinux_2_28_x86_64.whl"


@pytest.mark.dali
def test_the_slim_dali_wheel_installs_imports_and_decodes(tmp_path, make_clip):
    """The derivation on the real DALI wheel, for this Python (the visit's is for 3.12): pip installs it, and
    DALI from it decodes a VP9 clip on its CPU decoder. Needs the downloaded wheel (--prepare); CI skips."""
    if not DALI_WHEEL.is_file():
        pytest.skip("the locked DALI wheel is not downloaded (run_gpu_bench.sh --prepare)")
    import slim

    python = f"{sys.version_info.major}{sys.version_info.minor}"
    made = slim.derive(DALI_WHEEL, tmp_path, python=python)
    with zipfile.ZipFile(made) as archive:
        names = archive.namelist()
    assert not [n for n in names if "/include/" in n] and len([n for n in names if ".cpython-3" in n]) == 2
    target = tmp_path / "site"
    assert wheelhouse.install([made], target) == 0  # as on the host: pip --target, merged, nvidia's path extended
    vp9 = make_clip(codec="vp9", num_frames=90, gop=30)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[2])\n"
            "import nvidia.dali, checks\n"
            "assert nvidia.dali.__file__.startswith(sys.argv[1]), nvidia.dali.__file__\n"
            "print(repr(checks._decode(__import__('pathlib').Path(sys.argv[3]), 90, [(0, 1), (40, 3), (70, 4)],"
            " size=(96, 128), device='cpu')))\n")
    done = subprocess.run([sys.executable, "-c", code, str(target), str(GPU), str(vp9)], capture_output=True,
                          text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "''"  # every planned frame decoded


# --- the last slot decides on the host ---------------------------------------------------------------------


def test_the_last_slot_reads_what_the_first_sweep_left(tmp_path):
    """No decision between calls: --last-slot runs the second sweep after 0, nothing after 6, else the first."""
    state = tmp_path / "state"
    state.mkdir()
    env = dict(os.environ, PYTHON=sys.executable, DALILOAD_DALI_FLAVOUR="cuda13", DALILOAD_VISIT_STATE=str(state),
               DALILOAD_WHEELS=str(tmp_path / "w"), DALILOAD_BENCH_SITE=str(tmp_path / "site"),
               DALILOAD_BENCH_LOCK=str(_empty_lock(tmp_path)), DALILOAD_BENCH_TRANSFER=str(tmp_path / "none.tsv"),
               DALILOAD_BENCH_RESULTS=str(tmp_path / "results"), DALILOAD_BENCH_BUDGET_S="50")
    (tmp_path / "w").mkdir()

    def last_slot() -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(GPU_SCRIPT), "--out", str(tmp_path / "out"), "--last-slot"],
                              capture_output=True, text=True, env=env, timeout=300)
    (state / "sweep-h264-gop250.rc").write_text("6\n")
    done = last_slot()
    assert done.returncode == 6 and "nothing to run: give the machine back" in done.stdout
    assert "h264-720p" not in done.stdout
    import torch

    if torch.cuda.is_available():
        return
    (state / "sweep-h264-gop250.rc").write_text("0\n")
    done = last_slot()
    assert "left exit code 0; sweeping h264-720p" in done.stdout and done.returncode == 6  # no NVDEC here
    assert (state / "sweep-h264-720p.rc").read_text().strip() == "6"
    (state / "sweep-h264-gop250.rc").unlink()  # the first sweep was cut off: it runs again
    done = last_slot()
    assert "left exit code none; sweeping h264-gop250" in done.stdout
    assert (state / "sweep-h264-gop250.rc").read_text().strip() == "6"


# --- the peers' run keeps its rows when cut short ------------------------------------------------------------


def test_the_peers_json_keeps_each_loaders_row_and_says_which_a_cut_off_left_unmeasured(tmp_path, monkeypatch):
    """A visit's call cut off mid-round still brings back the rows measured before (the JSON is rewritten after
    each loader's row, not only after whole rounds), and says which rows the cut left unmeasured."""
    from types import SimpleNamespace

    from benchmarks import harness

    class CutOff(Exception):
        pass

    on_disk_at_each_epoch: list[int] = []
    cut_at: list[int | None] = [None]  # the loader whose timed epoch the call's limit cuts off

    def epoch(member, timed):
        if timed and member.number == cut_at[0]:
            raise CutOff
        if timed and json_path.exists():
            saved = json.loads(json_path.read_text())["measurements"]
            on_disk_at_each_epoch.append(sum(bool(r.get("runs")) for r in saved))
        elif timed:
            on_disk_at_each_epoch.append(0)
        (member.runs if timed else member.warmups).append({"clips": 4, "wall_s": 1.0})

    def update(member, state):
        member.record["runs"] = list(member.runs)
        member.record["figures"] = {"clips_per_s": {"median": 4.0}} if member.runs else None

    monkeypatch.setattr(harness, "_start",
                        lambda member, state: setattr(member, "process", SimpleNamespace(stop=lambda: None)))
    monkeypatch.setattr(harness, "_epoch", epoch)
    monkeypatch.setattr(harness, "_update_record", update)
    monkeypatch.setattr(harness, "_fill_ratios", lambda result: None)
    monkeypatch.setattr(harness, "_why_not_measured", lambda cls, job, state: None)
    monkeypatch.setattr(harness, "_print_record", lambda *args: None)
    monkeypatch.setattr("benchmarks.loaders.load_adapter",
                        lambda name: SimpleNamespace(name=name, knob=None, sweep_only=False))
    monkeypatch.setattr(harness, "_new_record",
                        lambda cls, job: {"loader": cls.name, "status": "ok", "reason": None, "figures": None})
    state = SimpleNamespace(args=SimpleNamespace(warmup=1), setup=SimpleNamespace(runs=1))

    json_path = tmp_path / "whole.json"
    jobs = [harness.Job(name, "loader", "h264-gop250", 2, "main") for name in ("a", "b", "c")]
    result = {"measurements": []}
    harness._measure_all(jobs, result, json_path, state)
    assert on_disk_at_each_epoch == [0, 1, 2]  # before the 2nd loader's epoch, the 1st's row is on disk
    assert [bool(r["runs"]) for r in json.loads(json_path.read_text())["measurements"]] == [True] * 3
    assert [r["status"] for r in result["measurements"]] == ["ok"] * 3

    json_path, cut_at[0] = tmp_path / "cut.json", 2  # the limit strikes in the 2nd loader's timed epoch
    with pytest.raises(CutOff):
        harness._measure_all(jobs[:2], {"measurements": []}, json_path, state)
    saved = {r["loader"]: r for r in json.loads(json_path.read_text())["measurements"]}
    assert saved["a"]["status"] == "ok" and saved["a"]["figures"]["clips_per_s"]["median"] == 4.0
    assert saved["b"]["status"] == "skipped" and "cut off before its timed epochs" in saved["b"]["reason"]



# --- the first visit's record ----------------------------------------------------------------------------------


def test_the_first_visits_section_is_written_from_its_files_and_every_measurement_line_is_read(tmp_path):
    folder = REPO / "benchmarks" / "results" / "gpu-visit-1"
    script = REPO / "benchmarks" / "gpu" / "visit_record.py"
    printed = subprocess.run([sys.executable, str(script), str(folder), "--print"], capture_output=True, text=True,
                             check=True).stdout
    assert printed.rstrip("\n") in (REPO / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8")
    sys.path.insert(0, str(script.parent))
    try:
        import visit_record
    finally:
        sys.path.remove(str(script.parent))
    loader, operator, unread = visit_record.parse_diagnostics((folder / "diagnostics.log").read_text())
    assert len(loader) == 15 and len(operator) == 18 and all(u.startswith("readers.video") for u in unread)
    fallback = next(r for r in loader if r["setting"] == "fallback 14 workers" and r["epoch"] == 1)
    assert fallback["clips_per_s"] == 285.3 and fallback["fallback"] == 256 and fallback["dali"] == 0
    # a line no pattern reads is named under the tables, not dropped
    (tmp_path / "diagnostics.log").write_text("## call\nsomething else: 3 s\n")
    assert "`something else: 3 s`" in visit_record.markdown(tmp_path)
