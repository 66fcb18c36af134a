"""The run's verdicts: the GOP-bound limit, the loader's ratios against its paths and that limit, the stage
profile, and the README's speed section, all computed from one run's JSON.

GOP-bound limit (per dataset): an exact-seeking decoder (torchcodec, decord)
must decode every frame from the keyframe at or before a window to the
window's end. The plan and the keyframes fix how many frames that is
(:func:`benchmarks.task.seek_decode_estimate`, summed over the plan: the
dataset's ``seek_estimate``), and the CPU ceiling measures how fast the same
number of processes decode whole files (frames/s). So no exact-seeking
decoder can deliver more than::

    limit clips/s = ceiling frames/s / (seek_estimate / clips)

even before it opens a file, converts a pixel or resizes. Worked example: a
ceiling of 6,000 frames/s and 170 frames per clip from the keyframe to the
window's end bound it at 35.3 clips/s; a fallback delivering 42.4 clips/s is
at 1.2x that limit. daliload's fallback can pass the limit because it skips
the non-reference frames a clip does not use.

The ratios of :data:`TARGETS` are printed with each run: the whole loader
with its defaults over the faster of its two paths alone on the dataset
(DALI alone or the fallback alone, whichever delivered more clips/s: the
default routing is meant to find it), and the fallback and the whole loader
over the GOP-bound limit on :data:`LIMIT_DATASET`.

The README's speed section sits between :data:`README_BEGIN` and
:data:`README_END`; :func:`write_readme` replaces only what is between them.
"""

from __future__ import annotations

import os
from pathlib import Path

#: (what, ratio name, threshold): the targets each run checks.
TARGETS = (
    ("whole loader / the faster path alone", "whole_over_path", 0.95),
    ("fallback alone / GOP-bound limit", "fallback_over_limit", 1.2),
    ("whole loader / GOP-bound limit", "whole_over_limit", 1.1),
)
#: The dataset the GOP-bound targets are read on: H.264 with a keyframe every 250 frames, as Kinetics.
LIMIT_DATASET = "h264-gop250"
README_BEGIN = "<!-- speed:begin: written by `python -m benchmarks` from its run's JSON; do not edit by hand -->"
README_END = "<!-- speed:end -->"
_PATHS = ("daliload-dali-gpu", "daliload-dali-cpu", "daliload-fallback")
#: loader -> (README column, the package whose version the column shows)
_README_LOADERS = {
    "blog-pyav": ("blog approach (whole-file PyAV)", None),
    "torchcodec-cpu": ("torchcodec", "torchcodec"),
    "torchcodec-cpu-approx": ("torchcodec {version}, approximate seek (no scan)", "torchcodec"),
    "decord-cpu": ("decord", "decord"),
    "decord-1thread": ("decord {version}, 1 thread", "decord"),
    "spdl-cpu": ("SPDL", "spdl_io"),
    "spdl-cpu-1process": ("SPDL {version}, 1 process", "spdl_io"),
    "spdl-cpu-pipeline": ("SPDL {version}, its thread pipeline", "spdl_io"),
    "torchcodec-cuda": ("torchcodec on NVDEC", "torchcodec"),
    "dali-readers-video": ("DALI readers.video", None),
    "daliload": ("daliload (its defaults)", None),  # runs before the row took the defaults: _own_title
    "daliload-static": ("daliload, routing='static'", None),
    "daliload-fallback": ("daliload fallback alone", None),
}


def defaults_row(result: dict) -> bool:
    """Whether the run's ``daliload`` row is the loader with its defaults: runs before 2026-12-03 forced
    ``routing="adaptive"`` and DALI threads = fallback workers = the knob there (their records name the knob)."""
    return not any(m["loader"] == "daliload" and m.get("knob") for m in result["measurements"])


def _own_title(result: dict, loader: str) -> str | None:
    """The column title of daliload's own rows in an older run (what its row really set), else None."""
    if defaults_row(result) or loader not in ("daliload", "daliload-static"):
        return None
    return {"daliload": "daliload, routing='adaptive', threads = workers",
            "daliload-static": "daliload, routing='static', threads = workers"}[loader]


def _median(result: dict, loader: str, dataset: str) -> float | None:
    """Clips/s (median) of ``loader`` on ``dataset`` in the main table, None if it did not run."""
    for m in result["measurements"]:
        if m["loader"] == loader and m["dataset"] == dataset and m["sweep"] == "main" and m["status"] == "ok":
            return m["figures"]["clips_per_s"]["median"]
    return None


def _busy(result: dict, loader: str, dataset: str) -> float | None:
    """Cores busy (median) of ``loader`` on ``dataset`` in the main table."""
    for m in result["measurements"]:
        if m["loader"] == loader and m["dataset"] == dataset and m["sweep"] == "main" and m["status"] == "ok":
            return m["figures"]["cores_busy"]["median"]
    return None


def _ceiling(result: dict, dataset: str) -> dict | None:
    for m in result["measurements"]:
        if m["loader"] == "ceiling-pyav" and m["dataset"] == dataset and m["status"] == "ok":
            return m
    return None


def gop_bound(result: dict, dataset: dict) -> dict | None:
    """The GOP-bound limit on ``dataset`` (a ``result["datasets"]`` entry), or None without a CPU ceiling.

    Returns:
        ``{"clips_per_s", "frames_per_clip", "ceiling_frames_per_s", "processes"}``.
    """
    ceiling = _ceiling(result, dataset["name"])
    estimate = dataset.get("seek_estimate")
    if ceiling is None or not estimate or not ceiling["figures"]["frames_per_s"]:
        return None
    if ceiling["workers"] != max(1, result["settings"]["workers"]):
        return None  # a ceiling with other processes than the loaders' workers bounds nothing they do
    frames_per_s = ceiling["figures"]["frames_per_s"]["median"]
    frames_per_clip = estimate / dataset["num_clips"]
    busy = ceiling["figures"]["cores_busy"]["median"]
    return {"clips_per_s": frames_per_s / frames_per_clip, "frames_per_clip": frames_per_clip,
            "ceiling_frames_per_s": frames_per_s, "processes": ceiling["workers"],
            "clips_per_core_s": frames_per_s / busy / frames_per_clip if busy else None}


def ratios(result: dict) -> dict[str, dict]:
    """Per dataset: the GOP-bound limit and the ratios of :data:`TARGETS` (None where a row is missing)."""
    out = {}
    for dataset in result["datasets"]:
        name = dataset["name"]
        whole, fallback = _median(result, "daliload", name), _median(result, "daliload-fallback", name)
        fallback_busy = _busy(result, "daliload-fallback", name)
        speeds = {p: _median(result, p, name) for p in _PATHS if _median(result, p, name) is not None}
        path = max(speeds, key=speeds.__getitem__) if speeds else None  # the faster path alone
        path_speed = _median(result, path, name) if path else None
        limit = gop_bound(result, dataset)
        bound = limit["clips_per_s"] if limit else None
        out[name] = {
            "gop_bound": limit, "path": path,
            "whole_over_path": whole / path_speed if whole and path_speed else None,
            "whole_over_fallback": whole / fallback if whole and fallback else None,
            "fallback_over_limit": fallback / bound if fallback and bound else None,
            "whole_over_limit": whole / bound if whole and bound else None,
            # The same ratio per busy core: what it is when other jobs starve the ceiling or the loader.
            "fallback_over_limit_per_core": (fallback / fallback_busy / limit["clips_per_core_s"]
                                             if fallback and fallback_busy and limit and limit["clips_per_core_s"]
                                             else None),
        }
    return out


#: The issue's target against the peers: the whole loader over the best peer, every round, on this dataset.
PEER_TARGET = ("daliload", LIMIT_DATASET, 1.3)
#: daliload's own rows: not peers.
_OWN = ("daliload", "daliload-static", "daliload-workers", "daliload-dali-gpu", "daliload-dali-cpu",
        "daliload-fallback")


def _rounds(result: dict, loader: str, dataset: str) -> list[float] | None:
    for m in result["measurements"]:
        if (m["loader"] == loader and m["dataset"] == dataset and m["sweep"] == "main" and m["status"] == "ok"
                and m.get("round_clips_per_s")):
            return m["round_clips_per_s"]
    return None


def peer_ratios(result: dict) -> tuple[dict, dict | None]:
    """Per dataset, daliload's rows over the best peer, round by round; and :data:`PEER_TARGET` judged.

    The best peer is the peer (a loader of the plan's windows, not daliload's) with the highest median
    clips/s on the dataset; each ratio is taken within a round (the loaders ran minutes apart at most),
    and the target is met or missed only when every round is on one side of it
    (:func:`benchmarks.metrics.verdict`). A run measured before the rounds were interleaved has no
    per-round figures: ``({}, None)``.
    """
    from benchmarks.interleave import round_ratio

    out = {}
    for dataset in result["datasets"]:
        name = dataset["name"]
        peers = {m["loader"]: m["figures"]["clips_per_s"]["median"] for m in result["measurements"]
                 if m["kind"] == "loader" and m["dataset"] == name and m["sweep"] == "main"
                 and m["status"] == "ok" and m.get("plan_windows") and m["loader"] not in _OWN
                 and m.get("round_clips_per_s")}
        if not peers:
            continue
        best = max(peers, key=peers.get)
        row = {"best_peer": best, "best_peer_clips_per_s": peers[best]}
        for own in ("daliload", "daliload-fallback"):
            rounds = _rounds(result, own, name)
            row[f"{own.replace('-', '_')}_over_best_peer"] = (round_ratio(rounds, _rounds(result, best, name))
                                                              if rounds else None)
        out[name] = row
    _, dataset, target = PEER_TARGET
    return out, (_judge(dataset, out[dataset], target) if dataset in out else None)


def _judge(dataset: str, row: dict, target: float) -> dict:
    """daliload over the best peer on ``dataset`` (its ``round_ratios`` row) against ``target``, every round."""
    from benchmarks.metrics import verdict

    ratio = row.get("daliload_over_best_peer")
    return {"loader": "daliload", "dataset": dataset, "target": target, "best_peer": row["best_peer"],
            "ratio": ratio, "verdict": verdict(ratio, target) if ratio else "not measured"}


def _spread_x(ratio: dict | None) -> str:
    return "–" if not ratio else f"{ratio['median']:.2f}x ({ratio['min']:.2f}-{ratio['max']:.2f})"


#: The targets against the peers by a dataset's codec: daliload with its defaults over the best peer, every
#: round, on every dataset of that codec and at every batch size.
PEER_TARGETS = {"h264": 1.3, "vp9": 1.1}


def peer_judgments(result: dict) -> list[dict]:
    """:data:`PEER_TARGETS` judged on each dataset of the run, from its ``round_ratios`` (met or missed only
    when every round is on one side); a run whose datasets name no codec keeps its one ``peer_target``."""
    codecs = {d["name"]: d.get("codec") for d in result.get("datasets", [])}
    judged = [_judge(name, row, PEER_TARGETS[codecs.get(name)])
              for name, row in (result.get("round_ratios") or {}).items() if codecs.get(name) in PEER_TARGETS]
    if not judged and result.get("peer_target"):
        judged.append(result["peer_target"])
    return judged


def peer_target_lines(result: dict) -> list[str]:
    """The targets against the best peer, judged on every round (nothing for a run without rounds)."""
    return [f"- {j['loader']} / the best peer (`{j['best_peer']}`) on `{j['dataset']}`, round by round: "
            f"{_spread_x(j['ratio'])} (target >= {j['target']:g}: {j['verdict']})" for j in peer_judgments(result)]


def _x(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}x"


def _verdict(value: float | None, threshold: float) -> str:
    if value is None:
        return "not measured"
    return "met" if value >= threshold else "**missed**"


def target_lines(result: dict) -> list[str]:
    """One line per target of :data:`TARGETS`: the ratio and whether it is met."""
    table = ratios(result)
    lines = []
    for what, key, threshold in TARGETS:
        if key == "whole_over_path":
            for name, r in table.items():
                lines.append(f"- {what} (`{r['path'] or '–'}`) on `{name}`: {_x(r[key])} "
                             f"(target >= {threshold:g}: {_verdict(r[key], threshold)})")
        else:
            value = table.get(LIMIT_DATASET, {}).get(key)
            lines.append(f"- {what} on `{LIMIT_DATASET}`: {_x(value)} "
                         f"(target >= {threshold:g}: {_verdict(value, threshold)})")
    return lines + peer_target_lines(result)


def targets_markdown(result: dict) -> list[str]:
    """The GOP-bound limit per dataset, the loader's ratios, and each target met or missed."""
    table = ratios(result)
    if not table:
        return []
    lines = ["", "GOP-bound limit and the loader's ratios (clips/s medians of this run):", "",
             "| dataset | frames per clip from keyframe to window end | ceiling frames/s (processes) "
             "| GOP-bound limit clips/s | the faster path alone | whole / that path | whole / fallback "
             "| fallback / limit | whole / limit | fallback / limit per busy core |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in table.items():
        limit = r["gop_bound"]
        cells = ["–", "–", "–"] if limit is None else [
            f"{limit['frames_per_clip']:.1f}", f"{limit['ceiling_frames_per_s']:,.0f} ({limit['processes']})",
            f"{limit['clips_per_s']:.1f}"]
        lines.append(f"| {name} | " + " | ".join(cells + [
            f"`{r['path']}`" if r["path"] else "–", _x(r["whole_over_path"]), _x(r["whole_over_fallback"]),
            _x(r["fallback_over_limit"]), _x(r["whole_over_limit"]), _x(r["fallback_over_limit_per_core"])])
            + " |")
    return lines + ["", "The limit needs a CPU ceiling with as many processes as the loaders' workers (`–` "
                    "otherwise). Per busy core: the fallback's clips per CPU second over the ceiling's frames "
                    "per CPU second divided by the frames per clip; on a shared machine it shows whether "
                    "other jobs' load, not the decoder, decided the wall-clock ratio.",
                    "", "Targets:", ""] + target_lines(result) + _round_ratio_lines(result)


def _round_ratio_lines(result: dict) -> list[str]:
    """daliload's rows over the best peer per dataset, median (min-max) of the rounds' ratios."""
    table = result.get("round_ratios") or {}
    if not table:
        return []
    lines = ["", "Against the best peer, round by round (the loaders of a dataset ran interleaved, one epoch "
             "each per round, the order rotated; each ratio is taken within a round):", "",
             "| dataset | best peer (median clips/s) | daliload / it | daliload-fallback / it |", "|---|---|---|---|"]
    for name, r in table.items():
        lines.append(f"| {name} | `{r['best_peer']}` ({r['best_peer_clips_per_s']:.1f}) | "
                     f"{_spread_x(r['daliload_over_best_peer'])} | "
                     f"{_spread_x(r['daliload_fallback_over_best_peer'])} |")
    return lines


def stages_markdown(result: dict) -> list[str]:
    """The fallback's per-stage profile per dataset (ms per clip), with the exact decode of the same spans."""
    from benchmarks.stages import STAGES

    profiles = result.get("profiles") or {}
    if not profiles:
        return []
    lines = ["", "Where a fallback clip's time goes (one worker's view: one clip after another on one core, "
             "ms per clip, `python -m benchmarks.stages`):", "",
             "| dataset | clips | " + " | ".join(STAGES) + " | total | frames decoded | exact-seek decode "
             "of the same spans, ms (frames) |", "|---|---|" + "---|" * (len(STAGES) + 3)]
    for name, p in profiles.items():
        if "error" in p:
            lines.append(f"| {name} | failed: {p['error']} |")
            continue
        stages = [f"{p['ms_per_clip'][s]:.1f}" for s in STAGES]
        lines.append(f"| {name} | {p['clips']} | " + " | ".join(stages) + f" | {p['total_ms']:.1f} | "
                     f"{p['frames_decoded_per_clip']:.0f} | {p['exact_ms_per_clip']:.1f} "
                     f"({p['exact_frames_per_clip']:.0f}) |")
    return lines


def _ceiling_processes(result: dict) -> str:
    counts = sorted({m["workers"] for m in result["measurements"] if m["loader"] == "ceiling-pyav"})
    return " or ".join(str(c) for c in counts) + (" process" if counts == [1] else " processes")


def _cell(result: dict, loader: str, dataset: str) -> str:
    for m in result["measurements"]:
        if m["loader"] == loader and m["dataset"] == dataset and m["sweep"] == "main" and m["status"] == "ok":
            s = m["figures"]["clips_per_s"]
            return f"{s['median']:.1f} ({s['low']:.1f}-{s['high']:.1f})" if s["n"] > 1 else f"{s['median']:.1f}"
    return "–"


def readme_section(result: dict) -> str:
    """The README's speed section for this run (what goes between the markers)."""
    from benchmarks.machine import machine_line

    machine, settings = result["machine"], result["settings"]
    present = [lo for lo in _README_LOADERS if any(m["loader"] == lo and m["status"] == "ok"
                                                   for m in result["measurements"])]
    columns = []
    for loader in present:
        title, package = _README_LOADERS[loader]
        title = _own_title(result, loader) or title
        version = machine["versions"].get(package) if package else None
        if "{version}" in title:
            columns.append(title.format(version=version or "").replace(" ,", ","))
        else:
            columns.append(f"{title} {version}" if version else title)
    table = ratios(result)
    load = f"load average {machine.get('load_avg_start')} to {machine.get('load_avg_end')}"
    lines = [f"Generated from run `{result['name']}` ({machine_line(machine)}; {load} on "
             f"{machine['cpu_cores_usable']} cores): every loader decodes the same plan, one random "
             f"{settings['clip_len']}-frame window at stride {settings['frame_stride']} per clip, "
             f"{settings['crop_size']} crop, flip, normalise, {settings['workers']} workers, batch "
             f"{settings['batch_size']}. Clips/s, median (min-max) of {settings['runs']} timed epochs; the "
             f"ceiling decodes whole files with {_ceiling_processes(result)}. Full table, memory, the stage "
             "profile and the versions: `benchmarks/RESULTS.md`.", "",
             "| dataset | clips | " + " | ".join(columns) + " | ceiling files/s | GOP-bound limit "
             "| fallback / limit | whole / limit |", "|---|---|" + "---|" * (len(present) + 4)]
    for d in result["datasets"]:
        name, r = d["name"], table[d["name"]]
        limit = r["gop_bound"]
        label = f"`{name}`: {d['width']}x{d['height']} {d['codec']}, keyframe every {d['gop']}"
        lines.append(f"| {label} | {d['num_clips']} x {d['duration_s']:g} s | "
                     + " | ".join(_cell(result, lo, name) for lo in present)
                     + f" | {_cell(result, 'ceiling-pyav', name)} | "
                     + ("–" if limit is None else f"{limit['clips_per_s']:.1f}")
                     + f" | {_x(r['fallback_over_limit'])} | {_x(r['whole_over_limit'])} |")
    lines += [""] + target_lines(result)
    return "\n".join(lines) + "\n"


HEADLINE_MARKER = "speed-headline"


def headline(result: dict) -> str:
    """The README's few lines on speed: daliload against the best peer per dataset, round by round.

    What goes between the README's :data:`HEADLINE_MARKER` markers; the full
    table is the speed section (:func:`readme_section`) of the page it links to.
    A run without per-round figures says so instead of quoting medians of
    separate blocks.
    """
    from benchmarks.machine import machine_line

    machine, settings = result["machine"], result["settings"]
    table = result.get("round_ratios") or {}
    where = "on a GPU" if settings["device"] == "cuda" else \
        'on the CPU (no GPU table yet: the one GPU visit is in benchmarks/RESULTS.md, "GPU visits")'
    lines = [f"Measured {where} by run `{result['name']}` of `python -m benchmarks` ({machine_line(machine)}; "
             f"load average {machine.get('load_avg_start')} to {machine.get('load_avg_end')}): every loader "
             f"decodes the same plan with the same transform, {settings['workers']} workers, batch "
             f"{settings['batch_size']}, interleaved epoch by epoch. daliload "
             + ("with its defaults" if defaults_row(result) else "with routing='adaptive' and DALI threads = "
                "fallback workers (this run predates the row of its defaults)")
             + f" against the fastest other loader, median (min-max) of the {settings['runs']} rounds' ratios:",
             ""]
    if not table:
        return "\n".join(lines[:1] + ["", "(this run has no per-round figures)"]) + "\n"
    judged = {j["dataset"]: j for j in peer_judgments(result)}
    lines += ["| dataset | daliload clips/s | best peer, clips/s | daliload / best peer | target, every round |",
              "|---|---|---|---|---|"]
    for name, r in table.items():
        goal = f">= {judged[name]['target']:g}: {judged[name]['verdict']}" if name in judged else "–"
        lines.append(f"| `{name}` | {_cell(result, 'daliload', name)} | `{r['best_peer']}`, "
                     f"{_cell(result, r['best_peer'], name)} | {_spread_x(r['daliload_over_best_peer'])} | {goal} |")
    return "\n".join(lines) + "\n"


def write_readme(path: str | os.PathLike, result: dict) -> bool:
    """Replace the text between :data:`README_BEGIN` and :data:`README_END` in ``path`` with this run's section.

    Returns:
        False (and changes nothing) when the file or its markers are missing.
    """
    path = Path(path)
    if not path.exists():
        return False
    text = path.read_text(encoding="utf-8")
    start, end = text.find(README_BEGIN), text.find(README_END)
    if start < 0 or end < start:
        return False
    new = text[:start + len(README_BEGIN)] + "\n" + readme_section(result) + text[end:]
    path.write_text(new, encoding="utf-8")
    return True
