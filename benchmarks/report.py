"""Turn measurements into figures and a markdown table, each labelled with its machine (plots: :mod:`benchmarks.plots`).

Figures per measurement (:class:`Figures`), medians over the timed runs with
their spread:

- clips/s: clips delivered per second (files/s for a ceiling);
- decoded frames/s: frames the decoder produced per second; counted by the
  loader where it can tell, otherwise credited as
  :func:`benchmarks.task.seek_decode_estimate` (marked ``~``); daliload's rows
  count their fallback's frames and DALI's, as the loader counts them from
  what it fed DALI (:mod:`benchmarks.peers.daliload_peer`);
- waste/clip: frames decoded but not in the clip (GOP waste), per clip;
- peak RSS: the process tree's summed resident memory, MiB (max over runs);
- cores busy: process-tree CPU seconds per wall second;
- x ceiling: clips/s over the ceiling's files/s, and decoded frames/s over
  the ceiling's frames/s, both from the same run and dataset;
- on a GPU: peak device memory (MiB, whole device) and mean NVDEC utilisation.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from benchmarks.machine import machine_line, versions_line
from benchmarks.metrics import Summary, summarize

def run_heading(title: str, name: str, command: str, result: dict, description: str) -> list[str]:
    """A run section's heading and first paragraph: the command, the versions, the load at the start and
    the end (``result["load_average"]``), then ``description``."""
    start, end = result["load_average"]
    return [f"### {title} run `{name}` — {machine_line(result['machine'])}", "",
            f"`{command}`; {versions_line(result['machine'])}; load average (1, 5, 15 min) {start} at the start, "
            f"{end} at the end. {description}"]


@dataclass(frozen=True)
class Figures:
    """Derived figures of one measurement (see the module docstring)."""

    clips_per_s: Summary
    frames_per_s: Summary | None
    frames_counted: bool
    waste_per_clip: float | None
    peak_rss_mb: float
    cores_busy: Summary
    ratio_clips: float | None = None
    ratio_frames: float | None = None
    gpu_mem_peak_mb: float | None = None
    nvdec_util_pct: float | None = None


def derive_figures(runs: Sequence[dict], *, estimated_decoded: int | None, frames_used: int | None) -> Figures:
    """Figures from a measurement's runs (dicts of :class:`benchmarks.measure.RunFigures`).

    Args:
        runs: the timed epochs.
        estimated_decoded: frames per epoch to credit when the loader reports
            none (None: no estimate possible, e.g. a loader with its own windows).
        frames_used: distinct frames the clips use per epoch (None for a ceiling).
    """
    counted = all(run["frames_decoded"] is not None for run in runs)
    decoded = [run["frames_decoded"] if counted else estimated_decoded for run in runs]
    frames_per_s = None
    waste = None
    if all(d is not None for d in decoded):
        frames_per_s = summarize([d / run["wall_s"] for d, run in zip(decoded, runs)])
        if frames_used is not None:
            waste = (statistics.median(decoded) - frames_used) / runs[0]["clips"]
    gpu_peaks = [run["gpu_mem_peak_mb"] for run in runs if run.get("gpu_mem_peak_mb") is not None]
    nvdec = [run["nvdec_util_pct"] for run in runs if run.get("nvdec_util_pct") is not None]
    return Figures(
        clips_per_s=summarize([run["clips"] / run["wall_s"] for run in runs]),
        frames_per_s=frames_per_s,
        frames_counted=counted,
        waste_per_clip=waste,
        peak_rss_mb=max(run["peak_rss_mb"] for run in runs),
        cores_busy=summarize([run["cpu_s"] / run["wall_s"] for run in runs]),
        gpu_mem_peak_mb=max(gpu_peaks) if gpu_peaks else None,
        nvdec_util_pct=summarize(nvdec).median if nvdec else None,
    )


def _fmt(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "–"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def _fmt_summary(summary: Summary | None) -> str:
    """``median (min-max)``, or the median alone for one run."""
    if summary is None:
        return "–"
    text = _fmt(summary.median)
    return f"{text} ({_fmt(summary.low)}-{_fmt(summary.high)})" if summary.n > 1 else text


def _intro_lines(result: dict) -> list[str]:
    """The section's heading (device, name, machine), versions, load, duration and the task."""
    machine = result["machine"]
    settings = result["settings"]
    load = ""
    if machine.get("load_avg_start") is not None:
        load = (f" Load average (1 min) {machine['load_avg_start']} at the start and "
                f"{machine.get('load_avg_end')} at the end, on {machine['cpu_cores_usable']} cores.")
    elapsed = f" The run took {result['elapsed_s']} s." if result.get("elapsed_s") else ""
    return [
        f"### {settings['device'].upper()} run `{result['name']}` — {machine_line(machine)}",
        "",
        f"{versions_line(machine)}.{load}{elapsed}",
        "",
        (f"Task: one random {settings['clip_len']}-frame window at stride {settings['frame_stride']} per video "
         f"(the same windows, crops and flips for every loader, seed {settings['seed']}), "
         f"{settings['crop_size']} crop after a random short-side resize, flip, normalise, "
         f"batch {settings['batch_size']}, {settings['workers']} workers; median (min-max) of {settings['runs']} "
         f"timed epochs after {settings['warmup']} warm-up; the CPU ceiling decodes with "
         f"{max(1, settings['workers'])} processes, as many as the loaders' workers. Datasets: "
         + "; ".join(f"`{d['name']}` {d['num_clips']} clips x {d['duration_s']:g} s ({d['description']})"
                     for d in result["datasets"]) + "."),
        "",
    ]


def _not_run_key(m: dict) -> str:
    """How the "Not measured here" list names a measurement: the loader, and the dataset where it matters."""
    key = f"`{m['loader']}`" + ("" if m["status"] == "unavailable" else f" on `{m['dataset']}`")
    if m["status"] == "unavailable" and m.get("dataset_specific"):
        key = f"`{m['loader']}` on `{m['dataset']}`"
    return key


def _table_row(m: dict, gpu: bool) -> str:
    """One ok measurement as a row of the main table (``~``: estimated frames, †: its own windows)."""
    f = m["figures"]
    frames = _fmt_summary(Summary(**f["frames_per_s"])) if f["frames_per_s"] else "–"
    if f["frames_per_s"] and not f["frames_counted"]:
        frames = "~" + frames
    waste = f["waste_per_clip"]
    waste_text = "–" if waste is None else ("~" if not f["frames_counted"] else "") + _fmt(waste, 0)
    name = m["loader"] + ("" if m["plan_windows"] else " †")
    row = [m["dataset"], f"**{name}**" if m["kind"] == "ceiling" else name,
           str(m["workers"]) if m["knob"] else "–",
           _fmt_summary(Summary(**f["clips_per_s"])), _fmt(f["ratio_clips"], 2), frames,
           _fmt(f["ratio_frames"], 2), waste_text, _fmt(f["peak_rss_mb"], 0),
           _fmt(Summary(**f["cores_busy"]).median, 2)]
    if gpu:
        row += [_fmt(f["gpu_mem_peak_mb"], 0), _fmt(f["nvdec_util_pct"], 0)]
    return "| " + " | ".join(row) + " |"


def _main_table(result: dict) -> tuple[list[str], dict[str, str]]:
    """The main table (ceilings first within each dataset) and, by name, the measurements that did not run."""
    gpu = result["settings"]["device"] == "cuda"
    header = ["dataset", "loader", "workers", "clips/s", "x ceil", "decoded frames/s", "x ceil",
              "waste frames/clip", "peak RSS MiB", "cores busy"]
    if gpu:
        header += ["GPU mem MiB", "NVDEC %"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    not_run: dict[str, str] = {}
    dataset_order = {d["name"]: i for i, d in enumerate(result["datasets"])}
    loader_order = {name: i for i, name in enumerate(dict.fromkeys(m["loader"] for m in result["measurements"]))}
    rows = sorted((m for m in result["measurements"] if m["sweep"] == "main"),
                  key=lambda m: (dataset_order.get(m["dataset"], 99), m["kind"] != "ceiling",
                                 loader_order[m["loader"]]))
    for m in rows:
        if m["status"] != "ok":
            not_run.setdefault(_not_run_key(m), f"{m['status']}: {m['reason']}")
            continue
        lines.append(_table_row(m, gpu))
    lines += ["", "Ceilings (bold) are files/s and frames/s of plain decoding of whole files (their `workers` "
              "are decoding processes); `x ceil` divides by the ceiling "
              f"of the same dataset ({'GPU: ' if gpu else ''}{result['ceiling_used']}). `~`: the loader cannot "
              "count decoded frames; credited with a seek to the keyframe before the window (DALI: with a "
              "decode from frame 0). `daliload` (the whole loader) counts the frames its fallback decodes "
              "(`loader.stats().frames_decoded_fallback`); where DALI decoded clips of an epoch it cannot "
              "count those, and the row has no decoded frames/s (`–`: DALI's estimate is on the DALI row). "
              "† picks its own windows (not the plan's).", "",
              "Set-up is not counted in clips/s, for any loader: building it happens before the timed epochs. "
              "For `daliload` that includes its scan of the dataset (probing every file for its route, frame "
              "count and keyframes) and the seek hints the fallback takes from it; `daliload-fallback` is given "
              "the same hints. The nearest torchcodec has is `seek_mode=\"approximate\"` "
              "(`torchcodec-cpu-approx`: no scan of each file when its decoder is made), where "
              "`torchcodec-cpu`'s exact mode scans every file again for every clip, inside the timed epochs."]
    return lines, not_run


def _sweep_table(result: dict) -> list[str]:
    """Clips/s per loader against workers on the sweep dataset; nothing with fewer than two worker counts."""
    settings = result["settings"]
    sweep = [m for m in result["measurements"] if m["kind"] == "loader" and m["status"] == "ok"
             and m["dataset"] == settings["sweep_dataset"] and m["knob"]]
    workers = sorted({m["workers"] for m in sweep})
    if len(workers) <= 1:
        return []
    lines = ["", f"Clips/s against workers (DataLoader workers or DALI threads), `{settings['sweep_dataset']}`:",
             "", "| loader | " + " | ".join(str(w) for w in workers) + " |",
             "|---|" + "---|" * len(workers)]
    for loader in dict.fromkeys(m["loader"] for m in sweep):
        cells = {m["workers"]: _fmt(m["figures"]["clips_per_s"]["median"]) for m in sweep if m["loader"] == loader}
        lines.append(f"| {loader} | " + " | ".join(cells.get(w, "–") for w in workers) + " |")
    return lines


def _loader_lines(result: dict) -> list[str]:
    """What each measured loader is, its decoder and its transform (the peers use the fallback's)."""
    seen = {m["loader"]: m.get("summary") for m in result["measurements"] if m["status"] == "ok"}
    if not seen:
        return []
    return (["", "The rows (peers that hand over RGB frames crop, resize, flip and normalise them with the "
             "fallback's own transform, `fallback.transform.apply_plan`; the DALI rows use DALI's):", ""]
            + [f"- `{name}`: {summary}" for name, summary in seen.items() if summary])


def markdown_report(result: dict) -> str:
    """The run as markdown: machine, settings, main table, workers sweep, what did not run."""
    from benchmarks.summary import stages_markdown, targets_markdown

    table, not_run = _main_table(result)
    lines = (_intro_lines(result) + table + _loader_lines(result) + targets_markdown(result)
             + stages_markdown(result) + _sweep_table(result))
    if not_run:
        lines += ["", "Not measured here:", ""]
        lines += [f"- {key}: {why}" for key, why in not_run.items()]
    plots = result.get("plots") or []
    if plots:
        lines += ["", "Plots: " + ", ".join(f"[{Path(p).name}](results/{Path(p).name})" for p in plots)]
    return "\n".join(lines) + "\n"


def load_average() -> str:
    """The 1, 5 and 15-minute load averages, as a run's JSON records them (e.g. ``"0.3 1.2 2.4"``)."""
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def add_output_options(parser: argparse.ArgumentParser, name: str, *, no_md_help: str = "do not touch RESULTS.md"
                       ) -> None:  # fmt: skip
    """The options every small benchmark shares: ``--json`` (default ``results/NAME.json``),
    ``--results-md``, ``--no-md`` and ``--machine``."""
    here = Path(__file__).resolve().parent
    parser.add_argument("--json", default=str(here / "results" / f"{name}.json"))
    parser.add_argument("--results-md", default=str(here / "RESULTS.md"))
    parser.add_argument("--no-md", action="store_true", help=no_md_help)
    parser.add_argument("--machine", default="", help="a label for the machine, e.g. '2-core CPU VM, no GPU'")


def record_section(text: str, results_md: str | os.PathLike | None, *, write_md=None) -> None:
    """Print a run's section (``text``) and put it in ``results_md`` (unless ``None``), replacing the last run's.

    ``write_md(path, text)`` writes it instead of :func:`append_markdown` when given.
    """
    print(text)
    if results_md is not None:
        (write_md or append_markdown)(Path(results_md), text)
        print(f"\n(section written to {results_md})")


def save_result(result: dict, json_path: str | os.PathLike) -> None:
    """Write a run's JSON on one line (the runs are kept in the repository, whose size is budgeted)."""
    Path(json_path).parent.mkdir(parents=True, exist_ok=True)
    Path(json_path).write_text(json.dumps(result), encoding="utf-8")


def publish(result: dict, json_path: str | os.PathLike, text: str, results_md: str | os.PathLike | None,
            *, write_md=None) -> None:
    """A run's outputs, from its one ``result``: the JSON (:func:`save_result`), then :func:`record_section`."""
    save_result(result, json_path)
    record_section(text, results_md, write_md=write_md)


def publish_run(result: dict, args: argparse.Namespace, text: str, *, chapter: str | None = None,
                marker: str | None = None, figures: Callable[[dict], str] | None = None) -> None:
    """A small benchmark's outputs from its one ``result``, as its options (:func:`add_output_options`) say.

    The JSON goes to ``args.json`` and the section ``text`` to ``args.results_md``
    under ``chapter`` (unless ``--no-md``, see :func:`publish`). With a ``marker``,
    the README's figures between its markers become ``figures(result)``
    (:func:`write_marked`), where the benchmark has ``--readme`` and it is set; a
    README without the markers is said and left as it is.
    """
    publish(result, args.json, text, None if args.no_md else args.results_md,
            write_md=lambda path, md: append_markdown(path, md, chapter=chapter))
    readme = getattr(args, "readme", None)
    if marker is not None and readme is not None:
        write_readme_figures(readme, marker, figures(result))


def write_readme_figures(readme: str | os.PathLike, marker: str, text: str) -> None:
    """:func:`write_marked`, saying so when ``readme`` lacks the ``marker`` markers (then nothing is written)."""
    if not write_marked(readme, marker, text):
        print(f"({readme} has no {marker} markers: not written)")


def write_marked(path: str | os.PathLike, name: str, text: str) -> bool:
    """Replace what stands between ``<!-- NAME:begin ... -->`` and ``<!-- NAME:end -->`` in ``path`` with ``text``.

    How a benchmark keeps the figures it owns in README.md written by code: the
    markers stay, the text between them is the run's. Returns False (and changes
    nothing) when the file or its markers are missing.
    """
    path = Path(path)
    if not path.exists():
        return False
    current = path.read_text(encoding="utf-8")
    begin = current.find(f"<!-- {name}:begin")
    begin_end = current.find("-->", begin) + 3 if begin >= 0 else -1
    end = current.find(f"<!-- {name}:end -->", begin_end)
    if begin < 0 or end < 0:
        return False
    path.write_text(current[:begin_end] + "\n" + text.rstrip("\n") + "\n" + current[end:], encoding="utf-8")
    return True


def append_markdown(path: str | os.PathLike, text: str, *, chapter: str | None = None) -> None:
    """Put a run's section (``text``, from :func:`markdown_report`) into ``path``: newest run only.

    The section of an earlier run of the same device and name (its heading,
    ``### CPU run `cpu` — ...``, up to the next heading of level 2 or 3) is
    replaced, where it stands; otherwise the section is appended, under
    ``chapter`` (a level-2 heading, e.g. ``"## Views: ..."``) when given, which
    is added first if the file lacks it. A missing file is created with a title.
    """
    path = Path(path)
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True) if path.exists() else [
        "# Benchmark results\n", "\n", "The newest run of each benchmark, with the machine it ran on. "
        "Compare loaders within a run, not across runs.\n"]
    heading = text.split(" — ", 1)[0]  # "### CPU run `cpu`"
    start = next((i for i, line in enumerate(lines) if line.startswith(heading + " ")), None)
    section = [line + "\n" for line in text.rstrip("\n").split("\n")]
    if start is None:
        if chapter is not None and chapter + "\n" not in lines:
            lines += ["\n", chapter + "\n"]
        lines += ["\n"] + section
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith(("## ", "### "))), len(lines))
        lines[start:end] = section + (["\n"] if end < len(lines) else [])
    path.write_text("".join(lines), encoding="utf-8")
