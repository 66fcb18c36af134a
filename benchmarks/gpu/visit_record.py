"""A GPU visit's record as a section of ``benchmarks/RESULTS.md``, written from the files the visit brought back.

``python benchmarks/gpu/visit_record.py benchmarks/results/gpu-visit-1`` reads the folder a visit's
outputs were saved in (``preflight.json``, ``smoke.json``, ``merge.json``, ``tests-summary.log``, the
sweep's ``nvdec-*.json`` and ``diagnostics.log``: the stdout of the calls made after the plan's, one
measurement a line) and writes its section into ``benchmarks/RESULTS.md`` (``--results-md``), replacing the
visit's earlier section. Every figure of the section is parsed from those files; a line of
``diagnostics.log`` that no pattern below reads is left out of the tables and named under them, so nothing
is copied by hand. ``tests/test_gpu_visit.py`` checks the committed section against this script.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # run as a script: the checkout's benchmarks package

from benchmarks.report import append_markdown  # noqa: E402

CHAPTER = "## GPU visits: `benchmarks/gpu/run_gpu_bench.sh`"

#: "fallback 14 workers epoch 1: 256 clips 0.90 s = 285.3 clips/s; dali 0 cut 0 fb 256; frames/clip dali 0 fb 45"
LOADER = re.compile(r"^(?:(?P<set>720p|gop16) )?(?P<setting>.+?) epoch (?P<epoch>\d+): (?P<clips>\d+) clips "
                    r"(?P<s>[\d.]+) s = (?P<rate>[\d.]+) clips/s; dali (?P<dali>\d+) cut (?P<cut>\d+) "
                    r"fb (?P<fb>\d+); frames/clip dali (?P<fdali>\d+)(?: fb (?P<ffb>\d+))?$")
#: "threads 8 run 0: 2.43 s, 9600 frames, 3947 fps, cpu 4.5 s" and "bs32 t4 end_frame: 2.877 s, 512 frames, ..."
OPERATOR = re.compile(r"^(?P<setting>threads \d+ run \d+|bs\d+ t\d+ \w+): (?P<s>[\d.]+) s, (?P<frames>\d+) frames, "
                      r"(?P<fps>\d+) fps(?:, (?P<files_s>[\d.]+) files/s)?, cpu (?P<cpu>[\d.]+)(?: s)?$")
DATASETS = {None: "h264-gop250 (340x256, 10 s, keyframe every 250)", "720p": "h264-720p (1280x720, 4 s)",
            "gop16": "h264-gop16 (340x256, 10 s, keyframe every 16)"}


def parse_diagnostics(text: str) -> tuple[list[dict], list[dict], list[str]]:
    """The loader rows, the operator rows, and the measurement lines no pattern read."""
    loader, operator, unread = [], [], []
    for line in text.splitlines():
        if not line.strip() or line.startswith(("#", "(", "files ")):
            continue
        if (m := LOADER.match(line)) is not None:
            loader.append({"dataset": DATASETS[m["set"]], "setting": m["setting"], "epoch": int(m["epoch"]),
                           "clips": int(m["clips"]), "wall_s": float(m["s"]), "clips_per_s": float(m["rate"]),
                           "dali": int(m["dali"]), "cut": int(m["cut"]), "fallback": int(m["fb"]),
                           "dali_frames_per_clip": int(m["fdali"])})
        elif (m := OPERATOR.match(line)) is not None:
            files = int(m["setting"].split()[0][2:]) if m["setting"].startswith("bs") else 32
            operator.append({"setting": m["setting"], "files": files, "wall_s": float(m["s"]),
                             "frames": int(m["frames"]), "files_per_s": files / float(m["s"]),
                             "cpu_s": float(m["cpu"])})
        elif not line.startswith("## "):
            unread.append(line)
    return loader, operator, unread


def _read(folder: Path, name: str):
    path = folder / name
    if not path.exists():
        return None
    return json.loads(path.read_text(encoding="utf-8")) if name.endswith(".json") else path.read_text("utf-8")


def markdown(folder: Path) -> str:
    """The visit's section."""
    preflight, smoke, merge = (_read(folder, n) for n in ("preflight.json", "smoke.json", "merge.json"))
    sweeps = sorted(folder.glob("nvdec-*.json"))
    machine = json.loads(sweeps[0].read_text("utf-8"))["machine"] if sweeps else {}
    diagnostics = _read(folder, "diagnostics.log") or ""
    loader, operator, unread = parse_diagnostics(diagnostics)
    header = diagnostics.split("\n\n", 1)[0]
    lines = [f"### GPU visit `{folder.name}` — {machine.get('gpu', 'GPU')}, {machine.get('cpu_cores', '?')} cores, "
             f"{machine.get('date_utc', '')}", "",
             " ".join(line.lstrip("# ") for line in header.splitlines()), ""]
    if preflight:
        checks = [f"{c['check']} {c['state']}" + (f" ({c['detail']})" if c["check"] == "nvdec" else "")
                  for c in preflight["checks"]]
        lines += ["Preflight: " + "; ".join(checks) + "."]
    if smoke:
        lines += ["Smoke: " + "; ".join(f"{c['check']}: {c['state']}, {c['detail']}" for c in smoke["checks"]) + "."]
    tests = _read(folder, "tests-summary.log")
    if tests:
        lines += ["GPU tests: " + "; ".join(line.strip() for line in tests.splitlines()
                                            if line.startswith(("PASSED", "FAILED", "XPASS", "XFAIL", "zero-copy"))
                                            or re.search(r"\d+ (passed|failed)", line)) + "."]
    for path in sweeps:
        sweep = json.loads(path.read_text("utf-8"))
        ceiling = sweep.get("ceiling") or {}
        rows = [r for r in sweep.get("rows", []) if r.get("status") == "ok"]
        if ceiling.get("status") == "ok":
            lines += [f"Sweep `{path.name}`: ceiling (fn.decoders.video over whole files, {ceiling['pipelines']} "
                      f"pipelines x {ceiling['threads']} threads) {ceiling['clips_per_s']:.1f} files/s, "
                      f"{ceiling['frames_per_s']:.0f} frames/s, NVDEC {ceiling['nvdec_util_pct']:.0f} % "
                      f"({ceiling['engines_busy']:.1f} engines busy), SM {ceiling['sm_util_pct']:.0f} %; "
                      f"{len(rows)} loader settings finished in the call's time."]
    lines.append("")
    if loader:
        lines += ["The loader on this host (clips/s of each epoch; clips by DALI on NVDEC, of them fed a cut, and by "
                  "the fallback; frames DALI decoded a clip):", "",
                  "| dataset | loader | epoch | clips/s | DALI clips (cut) | fallback clips | DALI frames a clip |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['dataset']} | {r['setting']} | {r['epoch']} | {r['clips_per_s']:.1f} | "
                  f"{r['dali']} ({r['cut']}) | {r['fallback']} | {r['dali_frames_per_clip'] or '–'} |" for r in loader]
        lines.append("")
    if operator:
        lines += ["DALI's `fn.decoders.video(device=\"mixed\")` alone on h264-gop250 files (a batch of files a run; "
                  "CPU: this process's user + system seconds):", "",
                  "| setting | s a batch | frames | files/s | CPU s |", "|---|---|---|---|---|"]
        lines += [f"| {r['setting']} | {r['wall_s']:.2f} | {r['frames']} | {r['files_per_s']:.1f} | {r['cpu_s']:.1f} |"
                  for r in operator]
        lines.append("")
    if merge:
        lines += ["The merge's host time per way a fallback batch reaches the GPU (`merge.json`, ms):", "",
                  "| way | float32 host ms | float32 on GPU ms | uint8 host ms | uint8 on GPU ms |",
                  "|---|---|---|---|---|"]
        for way, row in merge["modes"].items():
            u8 = merge.get("uint8", {}).get("modes", {}).get(way, {})
            lines.append(f"| {way} | {row['host_ms']:.1f} | {row['until_on_gpu_ms']:.1f} | "
                         f"{u8.get('host_ms', float('nan')):.1f} | {u8.get('until_on_gpu_ms', float('nan')):.1f} |")
        lines.append("")
    if unread:
        lines += ["Lines of `diagnostics.log` not in the tables: " + "; ".join(f"`{u}`" for u in unread) + ".", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--results-md", type=Path, default=HERE.parent / "RESULTS.md")
    parser.add_argument("--print", action="store_true", help="print the section instead of writing it")
    args = parser.parse_args(argv)
    text = markdown(args.folder)
    if args.print:
        print(text)
    else:
        append_markdown(args.results_md, text, chapter=CHAPTER)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
