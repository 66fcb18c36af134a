"""The benchmark's plots: clips/s per loader and dataset, and the sweeps, each captioned with its machine.

:func:`write_plots` draws them from a run's result (``python -m benchmarks``
calls it after :mod:`benchmarks.report` wrote the table); matplotlib is
imported only here.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

from benchmarks.machine import machine_line

def _datasets_and_loaders(main: list[dict]) -> tuple[list[str], list[str]]:
    """The datasets, and the loaders (not ceilings), of the main measurements, in the order they ran."""
    datasets = list(dict.fromkeys(m["dataset"] for m in main))
    loaders = list(dict.fromkeys(m["loader"] for m in main if m["kind"] == "loader"))
    return datasets, loaders


def _plot_loaders(plt, result: dict, main: list[dict], caption: str, path: Path) -> None:
    """Bars of clips/s (median, range) per loader and dataset, each dataset's ceiling dashed across."""
    datasets, loaders = _datasets_and_loaders(main)
    fig, ax = plt.subplots(figsize=(max(7, 1.8 * len(datasets)), 4.5))
    width = 0.8 / len(loaders)
    for k, loader in enumerate(loaders):
        xs, ys, errs = [], [], []
        for i, dataset in enumerate(datasets):
            match = [m for m in main if m["loader"] == loader and m["dataset"] == dataset]
            if match:
                s = match[0]["figures"]["clips_per_s"]
                xs.append(i + (k - (len(loaders) - 1) / 2) * width)
                ys.append(s["median"])
                errs.append([[s["median"] - s["low"]], [s["high"] - s["median"]]])
        if xs:
            lower = [e[0][0] for e in errs]
            upper = [e[1][0] for e in errs]
            ax.bar(xs, ys, width, yerr=[lower, upper], capsize=2, label=loader)
    for i, dataset in enumerate(datasets):
        ceiling = [m for m in main if m["kind"] == "ceiling" and m["dataset"] == dataset
                   and m["loader"] == result["ceiling_used"]]
        if ceiling:
            value = ceiling[0]["figures"]["clips_per_s"]["median"]
            ax.hlines(value, i - 0.45, i + 0.45, colors="black", linestyles="dashed",
                      label="ceiling (whole files/s)" if i == 0 else None)
    ax.set_xticks(range(len(datasets)), datasets)
    ax.set_ylabel("clips/s (median, range)")
    ax.set_title(f"Loaders on the same plan, {result['settings']['device']} run\n{caption}", fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(str(path), dpi=90)  # the checkout travels with every GPU visit call: keep it light
    plt.close(fig)


def _plot_workers_sweep(ax, result: dict, ok: list[dict]) -> bool:
    """Clips/s against workers, one line per loader with a workers knob, on the sweep dataset; whether any."""
    from matplotlib.ticker import MaxNLocator

    sweep_set = [m for m in ok if m["kind"] == "loader" and m["dataset"] == result["settings"]["sweep_dataset"]
                 and m["knob"]]
    for loader in dict.fromkeys(m["loader"] for m in sweep_set):
        points = sorted((m["workers"], m["figures"]["clips_per_s"]["median"]) for m in sweep_set
                        if m["loader"] == loader)
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=loader)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("workers (DataLoader workers / DALI threads)")
    ax.set_ylabel("clips/s")
    ax.set_title(f"vs workers ({result['settings']['sweep_dataset']})", fontsize=9)
    return bool(sweep_set)


def _plot_dataset_pair(ax, main: list[dict], title: str, pair: tuple[str, str], metric: str) -> None:
    """Bars of ``metric`` per loader for two datasets that differ in one property (resolution, GOP)."""
    datasets, loaders = _datasets_and_loaders(main)
    present = [d for d in pair if d in datasets]
    width = 0.8 / max(1, len(present))
    names = [lo for lo in loaders if any(m["loader"] == lo and m["dataset"] in present for m in main)]
    for j, dataset in enumerate(present):
        values = []
        for loader in names:
            match = [m for m in main if m["loader"] == loader and m["dataset"] == dataset]
            figure = match[0]["figures"][metric] if match else None
            values.append(figure["median"] if figure else 0.0)
        ax.bar([i + (j - (len(present) - 1) / 2) * width for i in range(len(names))], values, width,
               label=dataset)
    ax.set_xticks(range(len(names)), names, rotation=20, fontsize=7)
    ax.set_title(title, fontsize=9)
    if present:
        ax.legend(fontsize=7)


def _plot_scaling(plt, result: dict, ok: list[dict], main: list[dict], caption: str, path: Path) -> None:
    """Three panels: clips/s against workers, against resolution, against GOP length."""
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    swept = _plot_workers_sweep(axes[0], result, ok)
    _plot_dataset_pair(axes[1], main, "vs resolution: decoded frames/s", ("h264-gop250", "h264-720p"),
                       "frames_per_s")
    _plot_dataset_pair(axes[2], main, "vs GOP length: clips/s", ("h264-gop250", "h264-gop16"), "clips_per_s")
    if swept:
        axes[0].legend(fontsize=7)
    fig.suptitle(f"Scaling, {result['settings']['device']} run — {caption}", fontsize=8)
    fig.tight_layout()
    fig.savefig(str(path), dpi=90)  # the checkout travels with every GPU visit call: keep it light
    plt.close(fig)


def write_plots(result: dict, folder: str | os.PathLike) -> list[str]:
    """PNG plots of the run (``NAME-loaders.png`` if any loader ran, ``NAME-scaling.png`` if the workers sweep
    did); returns their paths.

    Empty without matplotlib.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    folder = Path(folder)
    name = result["name"]
    caption = textwrap.fill(machine_line(result["machine"]), 100)
    ok = [m for m in result["measurements"] if m["status"] == "ok"]
    main = [m for m in ok if m["sweep"] == "main"]
    paths = []
    if any(m["kind"] == "loader" for m in main):  # then there are datasets too
        paths.append(str(folder / f"{name}-loaders.png"))
        _plot_loaders(plt, result, main, caption, Path(paths[-1]))
    if any(m["sweep"] != "main" for m in ok):  # a run without the workers sweep has the tables alone
        paths.append(str(folder / f"{name}-scaling.png"))
        _plot_scaling(plt, result, ok, main, caption, Path(paths[-1]))
    return paths
