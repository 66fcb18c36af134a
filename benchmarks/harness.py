"""The benchmark run: datasets, one plan, the fallback's stage profile, every loader, ceilings, sweeps, report.

``python -m benchmarks`` (from the repository root; ``make bench`` sets up and runs it) runs::

    1. generate (or reuse) the datasets               benchmarks.datasets
    2. draw ONE plan per dataset from --seed          benchmarks.task
       (the plan daliload's loader draws itself for epoch 0)
    3. the fallback's per-stage profile per dataset   benchmarks.stages
    4. ceilings: plain decoding of the same files,    benchmarks.ceiling
       with as many processes as the loaders' workers
    5. every loader on every dataset, --workers,      benchmarks.loaders / peers,
       interleaved epoch by epoch                     benchmarks.interleave
    6. the workers sweep on --sweep-dataset
    7. JSON, markdown, PNG plots                      benchmarks.report, benchmarks.summary
       (the run's section in RESULTS.md replaces the last run of the same name;
       the README's speed section, between its markers, is rewritten from the same JSON)

Each measurement runs in its own process (``python -m benchmarks.measure --serve``),
and the measurements of one dataset (ceilings and loaders; each workers-sweep
value is a group of its own) run interleaved, epoch by epoch
(:mod:`benchmarks.interleave`): every loader's process builds its loader, then
each runs ``--warmup`` untimed epochs in turn, then ``--runs`` rounds in which
each runs one timed epoch, the order rotated by one each round. A machine
whose speed drifts 5-25 % over a run then moves every loader of a round
alike, and a ratio between two loaders is taken round by round, with its
spread. The choice, long-lived processes fed "run one epoch" over one
process per epoch: each loader keeps its workers and caches between its
epochs (as in training; a process per epoch would pay a start, torch's
import and a warm-up per epoch) and keeps the isolation of one process per
measurement (its own interpreter, its own peak RSS, a crash ending only it);
the timeout (``--timeout``) applies to each answer, the set-up or one epoch,
and kills that loader's process group. A loader that cannot run here is
listed with the reason, one that fails is listed with its error, and the run
goes on. The JSON is rewritten after every round, so a run cut short keeps
what it measured. Per measurement it holds the timed epochs (``runs``) and
their clips/s (``round_clips_per_s``), the median with min-max
(``figures.clips_per_s``), the ratio to the ceiling per round
(``figures.ratio_clips_rounds``); per dataset, daliload's rows over the best
peer per round (``round_ratios``; the report judges each dataset against
its codec's target, :data:`benchmarks.summary.PEER_TARGETS`, met or missed
only when every round is on one side of it, else not settled; ``peer_target``
keeps ``h264-gop250``'s judgment); and each group's orders (``interleaved``).

Batch sizes: ``--batch-size`` sets the run's one batch size (default 2 on the
CPU, 32 on a GPU). Runs of 8 and 32 are two runs with their own names, e.g.
``python -m benchmarks --batch-size 8 --name cpu-b8`` and ``--batch-size 32
--name cpu-b32``: each is a table of its own (its own JSON, its RESULTS.md
section), not columns of one run, because every figure of a table (the
ceiling ratios, the GOP-bound limit, the targets, the README's speed section)
is read at one batch size.

Resolution and GOP scaling come from the main table (``h264-gop250`` against
``h264-720p`` and ``h264-gop16``); the workers sweep adds measurements.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from benchmarks.datasets import STANDARD
from benchmarks.options import REPO_ROOT, add_arguments
from benchmarks.report import save_result
from daliload.runtime import usable_cores

if TYPE_CHECKING:
    from benchmarks.datasets import Dataset
    from benchmarks.loaders import LoaderAdapter
    from benchmarks.task import TaskSpec
    from daliload.plan import Sample

HELP = "benchmark daliload against the video loaders people use, on generated datasets"
__all__ = ["add_arguments", "build_parser", "main", "run"]


@dataclasses.dataclass(frozen=True)
class Job:
    """One measurement to run."""

    adapter: str
    kind: str  # "ceiling" | "loader"
    dataset: str
    workers: int
    sweep: str  # "main" | "workers"


def _load_average() -> float | None:
    """1-minute load average: on a shared machine, how many other processes wanted the cores."""
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None


def _resolve_device(requested: str) -> str:
    if requested != "auto":
        return requested
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _default_sweep(cores: int, device: str) -> list[int]:
    if device == "cuda" and cores >= 16:
        return [2, 8, 16]
    if cores <= 4:
        return sorted({1, cores})
    return sorted({2, cores // 2, cores})


def _run_child(job_file: Path, log_file: Path, timeout: float, module: str = "benchmarks.measure") -> str | None:
    """Run one measurement process (``python -m MODULE JOB``); return None, or why it produced no result."""
    env = _child_env()
    with open(log_file, "w", encoding="utf-8") as log:
        # Its own session, so a timeout can end the child AND its spawned workers.
        process = subprocess.Popen([sys.executable, "-m", module, str(job_file)], stdout=log,
                                   stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return f"timed out after {timeout:g} s (killed)"
    if code != 0:
        tail = log_file.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-1:]
        return f"measurement process exited with {code}: {' '.join(tail)[:300]} (log: {log_file})"
    return None


@dataclasses.dataclass(frozen=True)
class RunSetup:
    """What a run resolved from its options and this machine."""

    name: str
    device: str
    cores: int
    workers: int
    sweep_values: list[int]
    task: TaskSpec
    runs: int


@dataclasses.dataclass
class RunState:
    """The datasets and plans a run measures on, and what its measurements learnt so far."""

    args: argparse.Namespace
    setup: RunSetup
    work_dir: Path
    started: float
    datasets: dict[str, Dataset]
    plans: dict[str, Path]
    frame_counts: dict[str, dict[str, int]]  # per dataset: frames_used, seek_estimate
    unavailable: dict[str, str] = dataclasses.field(default_factory=dict)  # loader -> why it cannot run here
    probed: set[str] = dataclasses.field(default_factory=set)  # loaders whose probe already ran


def _unknown_name(args: argparse.Namespace) -> str | None:
    """Why --datasets or --loaders names something that does not exist, or None."""
    from benchmarks.loaders import LOADERS

    for name in args.datasets:
        if name not in STANDARD:
            return f"unknown dataset {name!r}; choose from {', '.join(STANDARD)}"
    for name in args.loaders:
        if name not in LOADERS:
            return f"unknown loader {name!r}; registered: {', '.join(LOADERS)}"
    return None


def _resolve_setup(args: argparse.Namespace) -> RunSetup:
    """The device, workers, sweep, task and runs of this run: the options, or the device's defaults."""
    from benchmarks.task import TaskSpec

    device = _resolve_device(args.device)
    gpu = device == "cuda"
    cores = usable_cores()
    workers = args.workers if args.workers is not None else min(8 if gpu else 2, cores)
    return RunSetup(
        name=args.name or ("gpu" if gpu else "cpu"), device=device, cores=cores, workers=workers,
        sweep_values=[] if args.no_sweeps else (args.sweep_workers or _default_sweep(cores, device)),
        task=TaskSpec(batch_size=args.batch_size or (32 if gpu else 2), seed=args.seed), runs=args.runs)


def _plan_frame_counts(dataset: Dataset, samples: Sequence[Sample]) -> dict[str, int]:
    """Distinct frames the plan's clips use, and the frames decoded by a decoder that seeks to the keyframe
    before each window (``seek_estimate``)."""
    from benchmarks.task import seek_decode_estimate

    used = estimate = 0
    for sample in samples:
        video = dataset.videos[sample.video_index]
        indices = sample.frame_indices(video.num_frames)
        used += len(set(indices))
        estimate += seek_decode_estimate(indices, video.keyframes)
    return {"frames_used": used, "seek_estimate": estimate}


def decode_estimate(cls: type[LoaderAdapter], counts: dict[str, int]) -> int | None:
    """Frames per epoch to credit ``cls`` with when it did not count them (``counts``: :func:`_plan_frame_counts`):
    a decode from the keyframe before each window; ``None`` (no decoded frames/s in the tables) for a loader
    that picks its own windows."""
    return counts.get("seek_estimate") if cls.plan_windows else None


def _prepare_datasets(args: argparse.Namespace, setup: RunSetup, work_dir: Path, started: float) -> RunState:
    """Generate (or reuse) the datasets and write ONE plan per dataset: daliload's own plan for epoch 0."""
    from benchmarks.datasets import loader_order, prepare_dataset, standard_specs
    from benchmarks.task import make_plan, write_plan

    specs = standard_specs(args.datasets, num_clips=args.clips, num_clips_hd=args.clips_hd,
                           duration_s=args.duration, duration_hd_s=args.duration_hd, seed=args.seed, size=args.size)
    state = RunState(args, setup, work_dir, started, datasets={}, plans={}, frame_counts={})
    for spec in specs:
        t0 = time.monotonic()
        dataset = prepare_dataset(spec, args.data_dir, workers=args.gen_workers or setup.cores)
        samples = make_plan(dataset.videos, setup.task, loader_order(dataset))  # = daliload's own plan
        plan_file = work_dir / f"plan-{spec.name}.json"
        write_plan(plan_file, samples, setup.task)
        state.datasets[spec.name], state.plans[spec.name] = dataset, plan_file
        state.frame_counts[spec.name] = _plan_frame_counts(dataset, samples)
        print(f"  dataset {spec.name}: {len(dataset.videos)} clips, {dataset.total_frames} frames, "
              f"ready in {time.monotonic() - t0:.1f} s ({dataset.root})", flush=True)
    return state


def _jobs(args: argparse.Namespace, setup: RunSetup, datasets: Sequence[str]) -> list[Job]:
    """Ceilings, then every loader dataset by dataset, then the workers sweep."""
    from benchmarks.loaders import CEILINGS

    # The CPU ceiling decodes with as many processes as the loaders have workers: its frames/s
    # is also the full-decode speed behind the GOP-bound limit (benchmarks.summary).
    jobs = [Job(CEILINGS["cpu"], "ceiling", d, max(1, setup.workers), "main") for d in datasets]
    if setup.device == "cuda":
        jobs += [Job(CEILINGS["cuda"], "ceiling", d, setup.workers, "main") for d in datasets]
    # Dataset by dataset, Kinetics-like first: a run cut short by --time-budget still
    # compares every loader on the datasets it reached.
    jobs += [Job(loader, "loader", d, setup.workers, "main") for d in datasets for loader in args.loaders]
    if args.sweep_dataset in datasets:
        jobs += [Job(loader, "loader", args.sweep_dataset, w, "workers") for loader in args.loaders
                 for w in setup.sweep_values if w != setup.workers]
    return jobs


def _new_result(state: RunState, machine: dict) -> dict:
    """The run's JSON before its first measurement: machine, settings, datasets."""
    from benchmarks.loaders import CEILINGS, load_adapter

    setup, args = state.setup, state.args
    return {
        "name": setup.name, "machine": machine,
        "settings": {"device": setup.device, "workers": setup.workers, "sweep_workers": setup.sweep_values,
                     "sweep_dataset": args.sweep_dataset, "runs": setup.runs, "warmup": args.warmup,
                     **dataclasses.asdict(setup.task)},
        "datasets": [dataclasses.asdict(d.spec) | {"root": d.root, "total_frames": d.total_frames,
                                                   **state.frame_counts[n]} for n, d in state.datasets.items()],
        "ceiling_used": load_adapter(CEILINGS[setup.device]).name,
        "measurements": [],
        "plots": [],
    }


def _new_record(cls: type[LoaderAdapter], job: Job) -> dict:
    """A measurement's record before it runs: what was asked, and what the adapter is."""
    return {"loader": cls.name, "kind": job.kind, "dataset": job.dataset, "workers": job.workers,
            "sweep": job.sweep, "summary": cls.summary, "plan_windows": cls.plan_windows,
            "knob": cls.knob, "counts_frames": cls.counts_frames, "dataset_specific": False,
            "status": "ok", "reason": None, "figures": None}


def _why_not_measured(cls: type[LoaderAdapter], job: Job, state: RunState) -> dict | None:
    """The status and reason of a job that will not run (cannot here, or out of time), or None."""
    from benchmarks.loaders import LoaderConfig

    config = LoaderConfig(task=state.setup.task, workers=job.workers, device=state.setup.device)  # type: ignore[arg-type]
    spec = state.datasets[job.dataset].spec
    reason = cls.skip_reason(spec, config)
    if reason is not None:
        on_gpu = cls.skip_reason(spec, dataclasses.replace(config, device="cuda"))
        return {"status": "unavailable", "reason": reason, "dataset_specific": on_gpu is not None}
    if cls.name in state.unavailable:
        return {"status": "unavailable", "reason": state.unavailable[cls.name]}
    budget = state.args.time_budget
    if budget is not None and time.monotonic() - state.started > budget:
        return {"status": "skipped", "reason": f"time budget of {budget:g} s used up"}
    return None


def _child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


@dataclasses.dataclass
class _Member:
    """One measurement of an interleaved group: its job, its record, and its process while it runs."""

    number: int
    job: Job
    cls: type
    record: dict
    process: object | None = None
    warmups: list = dataclasses.field(default_factory=list)
    runs: list = dataclasses.field(default_factory=list)


def _start(member: _Member, state: RunState) -> None:
    """Start the member's measuring process and wait for its set-up; on anything but ready, record why."""
    from benchmarks.interleave import LoaderProcess

    cls, job = member.cls, member.job
    stem = f"{member.number:03d}-{cls.name}-{job.dataset}-w{job.workers}"
    job_file = state.work_dir / f"{stem}.job.json"
    job_file.write_text(json.dumps({
        "adapter": job.adapter, "kind": job.kind, "dataset": state.datasets[job.dataset].root,
        "plan": str(state.plans[job.dataset]), "workers": job.workers, "device": state.setup.device,
        "warmup": state.args.warmup, "runs": state.setup.runs, "probe": cls.name not in state.probed}),
        encoding="utf-8")
    process = LoaderProcess(job_file, state.work_dir / f"{stem}.log", state.args.timeout, env=_child_env())
    answer = process.started()
    if answer["status"] == "ready":
        member.process = process
        member.record |= {"setup_s": answer["setup_s"], "monitor_scope": answer["monitor_scope"],
                          "gpu_source": answer["gpu_source"]}
        state.probed.add(cls.name)
        return
    process.stop()
    if answer["status"] == "unavailable":
        state.unavailable[cls.name] = answer["reason"]
    member.record |= {"status": answer["status"], "reason": answer["reason"]}


def _epoch(member: _Member, timed: bool) -> None:
    """One epoch of a running member; a failure stops its process and marks it failed."""
    answer = member.process.epoch()
    if answer["status"] != "ok":
        member.process.stop()
        member.process = None
        member.record |= {"status": "failed", "reason": answer["reason"]}
        return
    (member.runs if timed else member.warmups).append(answer["run"])


def _update_record(member: _Member, state: RunState) -> None:
    """The member's record from its epochs so far: runs, per-round clips/s, figures (see benchmarks.report)."""
    from benchmarks.metrics import nvdec_failure
    from benchmarks.report import derive_figures

    cls, job, record = member.cls, member.job, member.record
    record["warmup_wall_s"] = [run["wall_s"] for run in member.warmups]
    record["runs"] = list(member.runs)
    record["round_clips_per_s"] = [run["clips"] / run["wall_s"] for run in member.runs]
    if record["status"] != "ok" or not member.runs:
        return
    if state.setup.device == "cuda" and cls.uses_nvdec and member.process is None:
        why = nvdec_failure(member.runs, record.get("gpu_source"))
        if why is not None:
            record |= {"status": "failed", "reason": why}
            return
    counts = state.frame_counts[job.dataset]
    ceiling = job.kind == "ceiling"
    figures = derive_figures(member.runs, estimated_decoded=None if ceiling else decode_estimate(cls, counts),
                             frames_used=None if ceiling else counts["frames_used"])
    record["figures"] = dataclasses.asdict(figures)


def _group_key(job: Job) -> tuple:
    """Jobs measured together, interleaved: a dataset's main table (ceilings too), or one sweep value."""
    return (job.dataset, job.sweep, job.workers if job.sweep == "workers" else None)


def _measure_all(jobs: Sequence[Job], result: dict, json_path: Path, state: RunState) -> None:
    """Every job, group by group (:func:`_group_key`), each group interleaved epoch by epoch
    (:mod:`benchmarks.interleave`), into result["measurements"]; the JSON is rewritten once the group's
    loaders are started and after every timed epoch of each, so a run cut short (a GPU visit's call
    reaching its time limit) still leaves every row it measured."""
    from benchmarks.interleave import rotated
    from benchmarks.loaders import load_adapter

    groups: dict[tuple, list[tuple[int, Job]]] = {}
    for number, job in enumerate(jobs, 1):
        groups.setdefault(_group_key(job), []).append((number, job))
    result.setdefault("interleaved", [])

    def save() -> None:
        # Written mid-round too: a row started but not measured yet is saved as skipped (what it is if the
        # run is cut off here), so the JSON stays one that the reports (and --report-from) read as it is.
        pending = [m for m in result["measurements"] if m["status"] == "ok" and m["figures"] is None]
        for m in pending:
            m.update(status="skipped", reason="not measured: the run was cut off before its timed epochs")
        _fill_ratios(result)
        save_result(result, json_path)
        for m in pending:
            m.update(status="ok", reason=None)

    for (dataset, sweep, _), members_of in groups.items():
        members = []
        for number, job in members_of:
            cls = load_adapter(job.adapter)
            if job.kind == "loader" and ((job.sweep == "workers" and cls.knob is None)
                                         or (job.sweep == "main" and cls.sweep_only)):
                continue
            member = _Member(number, job, cls, _new_record(cls, job))
            why_not = _why_not_measured(cls, job, state)
            if why_not is not None:
                member.record |= why_not
            else:
                _start(member, state)
            result["measurements"].append(member.record)
            members.append(member)
        save()  # the rows that could not start, and why, before any epoch
        started = time.monotonic()
        running = [m for m in members if m.process is not None]
        order_log = {"dataset": dataset, "sweep": sweep, "workers": sorted({m.job.workers for m in members}),
                     "orders": []}
        result["interleaved"].append(order_log)
        for _ in range(state.args.warmup):
            for member in [m for m in running if m.process is not None]:
                _epoch(member, timed=False)
        for number in range(state.setup.runs):
            order = rotated([m for m in running if m.process is not None], number)
            order_log["orders"].append([m.cls.name for m in order])
            for member in order:
                _epoch(member, timed=True)
                _update_record(member, state)
                save()  # after each loader's row, not each round: a cut-off run keeps the rows it has
            for member in members:
                _update_record(member, state)
            save()
        for member in running:
            if member.process is not None:
                member.process.stop()
                member.process = None
            member.record["elapsed_s"] = round(time.monotonic() - started, 1)
            _update_record(member, state)
        for member in members:
            _print_record(member.record, member.number, len(jobs))
        save()


def _profile_all(result: dict, json_path: Path, state: RunState) -> None:
    """The fallback's per-stage profile on every dataset, each in its own process, into result["profiles"]."""
    clips = state.args.profile_clips
    if clips <= 0:
        return
    result["profiles"] = {}
    for name, dataset in state.datasets.items():
        job_file, out_file = state.work_dir / f"stages-{name}.job.json", state.work_dir / f"stages-{name}.json"
        job_file.write_text(json.dumps({"dataset": dataset.root, "plan": str(state.plans[name]), "clips": clips,
                                        "out": str(out_file)}), encoding="utf-8")
        failure = _run_child(job_file, state.work_dir / f"stages-{name}.log", state.args.timeout,
                             module="benchmarks.stages")
        profile = {"error": failure} if failure else json.loads(out_file.read_text(encoding="utf-8"))
        result["profiles"][name] = profile
        total = "failed" if failure else f"{profile['total_ms']:.1f} ms per clip"
        print(f"  stage profile of the fallback on {name}: {total}", flush=True)
        save_result(result, json_path)


def run(args: argparse.Namespace) -> int:
    from benchmarks.machine import machine_info

    started = time.monotonic()
    if args.report_from:
        result = json.loads(Path(args.report_from).read_text(encoding="utf-8"))
        _finish(result, args, Path(args.report_from), Path(args.report_from).parent)
        return 0
    unknown = _unknown_name(args)
    if unknown is not None:
        print(unknown, file=sys.stderr)
        return 2
    setup = _resolve_setup(args)
    results_dir = Path(args.results_dir)
    results_dir.mkdir(parents=True, exist_ok=True)
    work_dir = Path(args.data_dir) / "runs" / f"{setup.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    work_dir.mkdir(parents=True, exist_ok=True)
    machine = machine_info(args.machine)
    machine["load_avg_start"] = _load_average()
    print(f"benchmark {setup.name}: device {setup.device}, {setup.cores} usable cores, workers {setup.workers}, "
          f"batch {setup.task.batch_size}, runs {setup.runs} after {args.warmup} warm-up", flush=True)

    state = _prepare_datasets(args, setup, work_dir, started)
    jobs = _jobs(args, setup, list(state.datasets))
    result = _new_result(state, machine)
    json_path = results_dir / f"{setup.name}.json"
    _profile_all(result, json_path, state)
    _measure_all(jobs, result, json_path, state)

    result["machine"]["load_avg_end"] = _load_average()
    result["elapsed_s"] = round(time.monotonic() - started)
    _finish(result, args, json_path, results_dir)
    print(f"total {time.monotonic() - started:.0f} s")
    return 0


def _finish(result: dict, args: argparse.Namespace, json_path: Path, results_dir: Path) -> None:
    """Plots, the JSON with their names, the markdown (printed, written to RESULTS.md and the README)."""
    from benchmarks.plots import write_plots
    from benchmarks.report import append_markdown, markdown_report, write_readme_figures
    from benchmarks.summary import HEADLINE_MARKER, headline, write_readme

    if not args.no_plots:
        result["plots"] = write_plots(result, results_dir)
    save_result(result, json_path)
    text = markdown_report(result)
    print()
    print(text)
    if not args.no_md:
        append_markdown(args.results_md, text)
        print(f"written to {args.results_md}")
        if write_readme(args.readme, result):  # the run published as the speed section gives the headline
            print(f"speed section of {args.readme} rewritten")
            write_readme_figures(args.headline, HEADLINE_MARKER, headline(result))
        else:
            print(f"{args.readme} has no speed markers: not rewritten")
    print(f"results: {json_path}" + (f"; plots: {', '.join(result['plots'])}" if result["plots"] else ""))


def _fill_ratios(result: dict) -> None:
    """Set each ok measurement's ratios to the run's ceiling on the same dataset (median, and round by round
    where both ran in the same rounds), and the run's targets."""
    from benchmarks.interleave import round_ratio
    from benchmarks.summary import peer_ratios, ratios

    ok_ceilings = [m for m in result["measurements"] if m["kind"] == "ceiling" and m["status"] == "ok"]
    # On a GPU run the GPU ceiling, unless it could not run; then the CPU one.
    if result["settings"]["device"] == "cuda" and any(m["loader"] == "ceiling-dali" for m in ok_ceilings):
        result["ceiling_used"] = "ceiling-dali"
    else:
        result["ceiling_used"] = "ceiling-pyav"
    ceilings = {m["dataset"]: m for m in ok_ceilings if m["loader"] == result["ceiling_used"]}
    for m in result["measurements"]:
        ceiling, figures = ceilings.get(m["dataset"]), m["figures"]
        if figures is None or ceiling is None or ceiling["figures"] is None:
            continue
        figures["ratio_clips"] = figures["clips_per_s"]["median"] / ceiling["figures"]["clips_per_s"]["median"]
        if figures["frames_per_s"] and ceiling["figures"]["frames_per_s"]:
            figures["ratio_frames"] = (figures["frames_per_s"]["median"]
                                       / ceiling["figures"]["frames_per_s"]["median"])
        if m["sweep"] == "main" and m.get("round_clips_per_s") and ceiling.get("round_clips_per_s"):
            figures["ratio_clips_rounds"] = round_ratio(m["round_clips_per_s"], ceiling["round_clips_per_s"])
    result["targets"] = ratios(result)  # the GOP-bound limit and the loader's ratios, per dataset
    result["round_ratios"], result["peer_target"] = peer_ratios(result)  # daliload / the best peer, per round


def _print_record(record: dict, number: int, total: int) -> None:
    where = f"[{number}/{total}] {record['loader']} on {record['dataset']} (workers {record['workers']})"
    if record["status"] != "ok":
        print(f"{where}: {record['status']}: {record['reason']}", flush=True)
        return
    f = record["figures"]
    if f is None:
        print(f"{where}: no timed epoch (--runs 0)", flush=True)
        return
    frames = f"{f['frames_per_s']['median']:.0f}" if f["frames_per_s"] else "?"
    print(f"{where}: {f['clips_per_s']['median']:.2f} clips/s, {frames} decoded frames/s, "
          f"peak RSS {f['peak_rss_mb']:.0f} MiB, {f['cores_busy']['median']:.2f} cores busy "
          f"({record.get('elapsed_s', 0):.0f} s)", flush=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=HELP)
    add_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run(args)
