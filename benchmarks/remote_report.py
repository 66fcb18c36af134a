"""The figures, targets and sections of ``python -m benchmarks.bench_remote`` (its JSON is the one source).

Per row and store configuration (:func:`figures`):

- clips/s: median (min-max) over the timed rounds;
- bytes per clip: response body bytes the proxy served during the row's
  epochs, per clip (median over rounds), and that over the plan's file size
  per clip (``x file``: 1.0 is every file read whole once) and over the least
  (``x least``: :mod:`benchmarks.remote_least`);
- requests per clip: requests the proxy served (every method), per clip, and
  of them the HEAD requests (size look-ups);
- for daliload, its own ``stats()`` counters per clip and their ratio to the
  proxy's (close to 1 when both count the same reads).

Targets (:func:`evaluate`), PASS or FAIL on the median, with the rounds'
verdict (:func:`benchmarks.metrics.verdict`) where it is a ratio of speeds:

1. daliload's bytes per clip from the store at most 1.2x the least (each S3
   row, its worst store configuration);
2. at 20 ms per request and no cap, daliload from S3 at least 0.9x daliload
   on local files (same workers), round by round;
3. with the store capped at 20 MB/s, daliload from S3 at least 1.5x
   torchcodec over fsspec, round by round.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict

from benchmarks.interleave import round_ratio
from benchmarks.metrics import summarize, verdict
from benchmarks.report import run_heading

CHAPTER = "## Reading from an object store: `python -m benchmarks.bench_remote`"
BYTES_TARGET = 1.2
LOCAL_TARGET = 0.9
LOCAL_TARGET_STORE = (20.0, None)
CAPPED_TARGET = 1.5
CAPPED_TARGET_CAP = 20.0
S3_ROWS = ("daliload s3", "daliload s3 shards")


def figures(row: dict, least: dict) -> dict | None:
    """A row's figures from its timed runs (None when it did not run)."""
    runs = row.get("runs") or []
    if row.get("status") != "ok" or not runs:
        return None
    per_clip = lambda key: statistics.median(r[key] / r["clips"] for r in runs)  # noqa: E731
    served = per_clip("body_bytes")
    out = {"clips": runs[0]["clips"], "clips_per_s": asdict(summarize([r["clips"] / r["wall_s"] for r in runs])),
           "bytes_per_clip": served, "requests_per_clip": per_clip("requests"), "heads_per_clip": per_clip("heads"),
           "bytes_over_file": served / least["file_per_clip"], "bytes_over_least": served / least["per_clip"],
           "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
           "cores_busy": statistics.median(r["cpu_s"] / r["wall_s"] for r in runs)}
    stats = [(r["daliload_stats"], r) for r in runs if r.get("daliload_stats")]
    if stats:
        own_bytes = statistics.median(s["remote_bytes"] / r["clips"] for s, r in stats)
        own_requests = statistics.median(s["remote_requests"] / r["clips"] for s, r in stats)
        out |= {"daliload_bytes_per_clip": own_bytes, "daliload_requests_per_clip": own_requests,
                "daliload_over_proxy_bytes": own_bytes / served if served else None,
                "daliload_over_proxy_requests": own_requests / out["requests_per_clip"]
                if out["requests_per_clip"] else None}
    return out


def _speeds(row: dict) -> dict[int, float]:
    return {r["round"]: r["clips"] / r["wall_s"] for r in row.get("runs") or []} if row.get("status") == "ok" else {}


def _ratio(numerator: dict, denominator: dict) -> dict | None:
    rounds = sorted(numerator.keys() & denominator.keys())
    return round_ratio([numerator[r] for r in rounds], [denominator[r] for r in rounds])


def _store_named(result: dict, latency: float | None, cap: float | None) -> list[str]:
    return [name for name, store in result["stores"].items()
            if (latency is None or store["config"]["latency_ms"] == latency) and store["config"]["cap_mb_s"] == cap]


def _target(text: str, want: str, row: str, store: str | None, measured: float | None, passed: bool | None,
            rounds: dict | None = None, why: str | None = None) -> dict:
    return {"target": text, "want": want, "row": row, "store": store, "measured": measured, "pass": passed,
            "rounds": rounds, "verdict": verdict(rounds, float(want.split()[-1].rstrip("x"))) if rounds else None,
            "why_not_evaluated": why}


def evaluate(result: dict) -> list[dict]:
    """The targets (module docstring), each with its row, store, measured value and PASS (True) or FAIL."""
    targets = []
    for row in S3_ROWS:
        found = [(f["bytes_over_least"], name) for name, store in result["stores"].items()
                 if (f := (store["rows"].get(row) or {}).get("figures"))]
        text = "bytes per clip over the least"
        if not found:
            targets.append(_target(text, f"<= {BYTES_TARGET}x", row, None, None, None, why=f"{row} did not run"))
            continue
        worst, store = max(found)
        targets.append(_target(text, f"<= {BYTES_TARGET}x", row, store, worst, worst <= BYTES_TARGET))
    for row in S3_ROWS:
        text = "clips/s over daliload local, 20 ms per request, no cap"
        names = _store_named(result, LOCAL_TARGET_STORE[0], LOCAL_TARGET_STORE[1])
        rows = result["stores"][names[0]]["rows"] if names else {}
        ratio = _ratio(_speeds(rows.get(row, {})), _speeds(rows.get("daliload local", {}))) if names else None
        why = (None if ratio else "no 20 ms store without a cap in --stores" if not names
               else f"{row} or daliload local did not run")
        targets.append(_target(text, f">= {LOCAL_TARGET}x", row, names[0] if names else None,
                               ratio and ratio["median"], ratio and ratio["median"] >= LOCAL_TARGET, ratio, why))
    capped = _store_named(result, None, CAPPED_TARGET_CAP)
    for name in capped or [None]:
        text = f"clips/s over torchcodec, store capped at {CAPPED_TARGET_CAP:g} MB/s"
        rows = result["stores"][name]["rows"] if name else {}
        ratio = _ratio(_speeds(rows.get("daliload s3", {})), _speeds(rows.get("torchcodec", {}))) if name else None
        why = (None if ratio else f"no store capped at {CAPPED_TARGET_CAP:g} MB/s in --stores" if not name
               else "daliload s3 or torchcodec did not run")
        targets.append(_target(text, f">= {CAPPED_TARGET}x", "daliload s3", name, ratio and ratio["median"],
                               ratio and ratio["median"] >= CAPPED_TARGET, ratio, why))
    return targets


def target_lines(result: dict) -> list[str]:
    """One ``PASS``/``FAIL``/``NOT EVALUATED`` line per target."""
    lines = []
    for t in result["targets"]:
        if t["pass"] is None:
            lines.append(f"NOT EVALUATED {t['row']}: {t['target']} {t['want']}: {t['why_not_evaluated']}")
            continue
        spread = (f"; rounds {t['rounds']['min']:.2f}-{t['rounds']['max']:.2f}x: {t['verdict']}"
                  if t["rounds"] and len(t["rounds"]["runs"]) > 1 else "")
        lines.append(f"{'PASS' if t['pass'] else 'FAIL'} {t['row']} ({t['store']}): {t['target']} "
                     f"{t['measured']:.2f}x, want {t['want']}{spread}")
    return lines


def _fmt(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def _clips(f: dict) -> str:
    s = f["clips_per_s"]
    return _fmt(s["median"]) + (f" ({_fmt(s['low'])}-{_fmt(s['high'])})" if s["n"] > 1 else "")


def table(result: dict, *, full: bool = True) -> list[str]:
    """The rows of every store configuration as one markdown table."""
    header = ["store", "row", "clips/s", "x local", "KB/clip", "x file", "x least", "requests/clip (HEAD)"]
    if full:
        header += ["daliload's own KB/clip, requests/clip", "peak RSS MiB"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, store in result["stores"].items():
        local = _speeds(store["rows"].get("daliload local", {}))
        for row, record in store["rows"].items():
            f = record.get("figures")
            if f is None:
                lines.append(f"| {name} | {row} | {record.get('status')}: {record.get('reason')} |"
                             + " |" * (len(header) - 3))
                continue
            ratio = _ratio(_speeds(record), local) if row != "daliload local" else None
            cells = [name, row, _clips(f), _fmt(ratio and ratio["median"], 2), _fmt(f["bytes_per_clip"] / 1e3),
                     _fmt(f["bytes_over_file"], 2), _fmt(f["bytes_over_least"], 2),
                     f"{_fmt(f['requests_per_clip'])} ({_fmt(f['heads_per_clip'])})"]
            if full:
                own = ("–" if "daliload_bytes_per_clip" not in f else
                       f"{_fmt(f['daliload_bytes_per_clip'] / 1e3)}, {_fmt(f['daliload_requests_per_clip'])}")
                cells += [own, _fmt(f["peak_rss_mb"], 0)]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def _least_line(result: dict) -> str:
    least = result["least"]
    return (f"The least a clip can cost: {_fmt(least['per_clip'] / 1e3)} KB (its window's packets from the entry "
            f"keyframe, {_fmt(least['windows_per_clip'] / 1e3)} KB, plus each file's header once); the files "
            f"average {_fmt(least['file_per_clip'] / 1e3)} KB.")


def agreement_line(result: dict) -> str:
    """How daliload's own ``stats()`` counters compare with the proxy's over its rows that read the store."""
    pairs = [(f["daliload_over_proxy_bytes"], f["daliload_over_proxy_requests"])
             for store in result["stores"].values() for row in store["rows"].values()
             if (f := row.get("figures")) and f.get("daliload_over_proxy_bytes") is not None]
    if not pairs:
        return "No daliload row read from the store: its own counters were not compared with the proxy's."
    span = lambda values: f"{min(values):.2f}-{max(values):.2f}x"  # noqa: E731
    requests = [r for _, r in pairs if r is not None]
    return (f"daliload's own counters over the proxy's, on its {len(pairs)} measurements from the store: bytes "
            f"{span([b for b, _ in pairs])}" + (f", requests {span(requests)}." if requests else "."))


def markdown(result: dict) -> str:
    """The run's section of ``benchmarks/RESULTS.md``."""
    s = result["settings"]
    description = (
        f"{s['clips']} clips ({s['classes']} classes x {s['clips_per_class']}), {s['size']}, {s['duration_s']:g} s "
        f"at {s['fps']} fps, keyframe every {s['gop']} frames, {s['codecs']}; one {s['clip_len']}-frame window at "
        f"stride {s['frame_stride']} per clip (daliload's plan for epoch 0, the same for every row), "
        f"{s['crop_size']} crop, batch {s['batch_size']}. The store: moto's S3 server on 127.0.0.1 behind a proxy "
        f"adding a delay per request and, where named, a bandwidth cap over all connections together; it counts "
        f"requests and body bytes. daliload rows with their defaults (2 fallback workers), the peers in "
        f"{s['workers']} DataLoader workers; s3fs's default block size {s['s3fs_block_size']} bytes. Median "
        f"(min-max) of {s['rounds']} interleaved rounds after {s['warmup']} warm-up. The run took "
        f"{result['elapsed_s']} s.")
    lines = run_heading("Remote", result["name"], "python -m benchmarks.bench_remote", result, description)
    lines += ["", _least_line(result), ""] + table(result)
    lines += ["", "`x local`: clips/s over daliload local's in the same rounds (median of the rounds' ratios). "
              "`x file`: bytes served per clip over the file's size; `x least`: over the least. `requests/clip`: every "
              "request the store served (listings, HEADs, GETs), in brackets the HEADs. daliload's own "
              "counters are `loader.stats().remote_bytes` / `remote_requests` over the same epochs.", "",
              agreement_line(result), "",
              "Targets:", ""] + [f"- {line}" for line in target_lines(result)]
    return "\n".join(lines) + "\n"


def readme_figures(result: dict) -> str:
    """The ``remote`` section of ``docs/remote.md``: the table, the least and the targets, from the run's JSON."""
    m, s = result["machine"], result["settings"]
    lines = [f"Written by `python -m benchmarks.bench_remote` from its run's JSON (`benchmarks/results/remote.json`; "
             f"{m['date_utc']}, {m['cpu_cores_usable']} cores, {s['clips']} clips of {s['duration_s']:g} s, "
             f"{s['size']}, keyframe every {s['gop']} frames, {s['codecs']}; {s['rounds']} rounds). "
             + _least_line(result), ""] + table(result, full=False)
    lines += ["", "Targets:", ""] + [f"- {line}" for line in target_lines(result)]
    return "\n".join(lines) + "\n"
