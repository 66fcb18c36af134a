#!/usr/bin/env bash
# daliload GPU tests and benchmarks on a GPU machine that has torch but no DALI and no package
# registry, reached by remote calls that each carry one piece of the wheels. See README.md beside this.
#
#   benchmarks/gpu/run_gpu_bench.sh --prepare       (here) download the locked wheels, check, pack (when missing)
#   benchmarks/gpu/run_gpu_bench.sh --plan          the visit: its calls, what each carries, seconds (changes nothing)
#   benchmarks/gpu/run_gpu_bench.sh --check         which pieces and wheels are here or missing (changes nothing)
#   benchmarks/gpu/run_gpu_bench.sh --preflight     call 1: receive piece 1, install what it completes, preflight
#   benchmarks/gpu/run_gpu_bench.sh --receive [--generate DATASET]...
#                                                   call 2: receive the piece, install what it completes,
#                                                   generate the datasets of later sweeps (PyAV, no GPU)
#   benchmarks/gpu/run_gpu_bench.sh --tests         call 3: receive the last piece, decompress and install DALI,
#                                                   import check, smoke decodes, the merge's timing, the GPU tests
#   benchmarks/gpu/run_gpu_bench.sh --sweep DATASET call 4: the NVDEC sweep, then peers in what is left; leaves
#                                                   its exit code in DALILOAD_VISIT_STATE/sweep-DATASET.rc
#   benchmarks/gpu/run_gpu_bench.sh --last-slot     call 5: from that file, the first sweep again (it failed or
#                                                   left none), the second sweep (it exited 0), or nothing (6)
#   benchmarks/gpu/run_gpu_bench.sh --smoke         receive the last piece, install DALI, smoke decodes only
#   benchmarks/gpu/run_gpu_bench.sh                 everything left, in one go: GPU tests, then the h264-gop250 sweep
#   benchmarks/gpu/run_gpu_bench.sh --install-only  receive and install everything here, import check, stop
#   benchmarks/gpu/run_gpu_bench.sh --no-tests      the one-go run without the GPU tests
#   benchmarks/gpu/run_gpu_bench.sh --out DIR ...   also copy the log and results to DIR (the call's $OUT)
#   benchmarks/gpu/run_gpu_bench.sh --pack          (here) cut the wheels into pieces, write the transfer plan
#   benchmarks/gpu/run_gpu_bench.sh --split FILE    (here) cut another file into pieces + FILE.sha256
#   benchmarks/gpu/run_gpu_bench.sh -- ARGS...      extra arguments for python -m benchmarks.bench_nvdec
#
# Environment: PYTHON (default python3: the one with torch), DALILOAD_WHEELS (wheel folder, default
# wheels/ beside this script, git-ignored), DALILOAD_BENCH_SITE (where wheels are installed, default
# /tmp/daliload-bench-site), DALILOAD_BENCH_BUDGET_S (seconds of a --tests or --sweep call, default from the
# visit plan), DALILOAD_DALI_FLAVOUR (cuda13 | cuda12; default from the driver version), DALILOAD_VISIT_STATE
# (where a sweep leaves its exit code for the last slot, default /tmp/daliload-visit).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
PY="${PYTHON:-python3}"
WHEELS="${DALILOAD_WHEELS:-$HERE/wheels}"
SITE="${DALILOAD_BENCH_SITE:-/tmp/daliload-bench-site}"
TESTS=1
MODE=run
OUT_DIR=""
GENERATE=()
STATE_DIR="${DALILOAD_VISIT_STATE:-/tmp/daliload-visit}"
DATASET=h264-gop250
START_S=$SECONDS
BENCH_ARGS=()
ARGS=("$@")

while [ $# -gt 0 ]; do
    case "$1" in
        --prepare) MODE=prepare ;;
        --plan) MODE=plan ;;
        --check) MODE=check ;;
        --preflight) MODE=preflight ;;
        --receive) MODE=receive ;;
        --generate) [ $# -ge 2 ] || { echo "--generate needs a DATASET" >&2; exit 1; }; GENERATE+=("$2"); shift ;;
        --tests) MODE=tests ;;
        --sweep) [ $# -ge 2 ] || { echo "--sweep needs a DATASET" >&2; exit 1; }; MODE=sweep; DATASET="$2"; shift ;;
        --last-slot) MODE=last-slot ;;
        --smoke) MODE=smoke ;;
        --install-only) MODE=install ;;
        --no-tests) TESTS=0 ;;
        --pack) MODE=pack ;;
        --out) [ $# -ge 2 ] || { echo "--out needs a DIR" >&2; exit 1; }; OUT_DIR="$2"; shift ;;
        --split)
            [ $# -ge 2 ] || { echo "--split needs a FILE" >&2; exit 1; }
            exec "$PY" "$HERE/wheelhouse.py" split "$2" ;;
        --wheels) WHEELS="$2"; shift ;;
        -h|--help) sed -n '2,31p' "$0"; exit 0 ;;
        --) shift; BENCH_ARGS=("$@"); break ;;
        *) echo "unknown option $1 (see --help)" >&2; exit 1 ;;
    esac
    shift
done

command -v "$PY" >/dev/null || { echo "no $PY here; set PYTHON to the interpreter that has torch" >&2; exit 1; }

# With --out, everything this run prints also goes to OUT/visit.log (the call's reply keeps only its tail).
if [ -n "$OUT_DIR" ] && [ -z "${DALILOAD_BENCH_LOGGING:-}" ]; then
    mkdir -p "$OUT_DIR"
    set +e
    DALILOAD_BENCH_LOGGING=1 "$0" "${ARGS[@]}" 2>&1 | tee -a "$OUT_DIR/visit.log"
    code=${PIPESTATUS[0]}
    exit "$code"
fi

# A visit's calls keep FFmpeg's and DALI's own log lines (daliload.runtime): a failure's reason in DALI's words
# reaches visit.log. The plan's command lines set it too; this covers a call typed without it.
case "$MODE" in preflight|receive|tests|sweep|last-slot|smoke) export DALILOAD_NATIVE_LOGS="${DALILOAD_NATIVE_LOGS:-1}" ;; esac

# The last slot: decided here, on the host, from the exit code the first sweep left (nothing is decided between
# calls by whoever issues them). 0: the second sweep; 6: no NVDEC here, nothing to run; anything else or no
# file (the call was cut off): the first sweep again.
if [ "$MODE" = last-slot ]; then
    read -r FIRST SECOND <<< "$("$PY" "$HERE/visit.py" --sweeps)"
    PREVIOUS="$(cat "$STATE_DIR/sweep-$FIRST.rc" 2>/dev/null || echo none)"
    case "$PREVIOUS" in
        0) DATASET="$SECOND" ;;
        6) echo "== last slot: the $FIRST sweep found no NVDEC here (exit 6); nothing to run: give the machine back"
           exit 6 ;;
        *) DATASET="$FIRST" ;;
    esac
    echo "== last slot: the $FIRST sweep left exit code $PREVIOUS; sweeping $DATASET"
    MODE=sweep
fi

# DALI wheel flavour from the driver: CUDA 13 wheels need driver >= 580, CUDA 12 ones >= 525.
FLAVOUR="${DALILOAD_DALI_FLAVOUR:-}"
if [ -z "$FLAVOUR" ]; then
    DRIVER="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n1 || true)"
    MAJOR="${DRIVER%%.*}"
    if [ -z "$MAJOR" ]; then
        FLAVOUR=cuda13
        case "$MODE" in run|preflight|smoke|tests|sweep) echo "warning: nvidia-smi gave no driver version; assuming a CUDA 13 driver" >&2 ;; esac
    elif [ "$MAJOR" -ge 580 ]; then FLAVOUR=cuda13
    elif [ "$MAJOR" -ge 525 ]; then FLAVOUR=cuda12
    else echo "driver $DRIVER is older than 525: no DALI 2.x wheel runs on it" >&2; exit 1
    fi
fi

case "$MODE" in
    plan) exec "$PY" "$HERE/visit.py" --flavour "$FLAVOUR" ;;
    check|pack|prepare) exec "$PY" "$HERE/wheelhouse.py" "$MODE" --wheels "$WHEELS" --flavour "$FLAVOUR" ;;
esac

# SITE first (the carried wheels), then the checkout (daliload, benchmarks), then the machine's packages.
mkdir -p "$SITE"
export PYTHONPATH="$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}"
echo "== $(date -u +%H:%M:%S) $MODE: wheels $WHEELS (DALI flavour $FLAVOUR), installing into $SITE"

# Seconds of this call (--tests, --sweep, the one-go run) and the GPU tests' share, from the visit plan (one
# source of truth); the script ends 10 s inside them. Without a transfer plan: one call of up to 8 minutes.
if PLAN="$("$PY" "$HERE/visit.py" --flavour "$FLAVOUR" --budget 2>/dev/null)"; then
    read -r SWEEP_S TESTS_S CALL4_S <<< "$PLAN"
else
    SWEEP_S=470 TESTS_S=150 CALL4_S=470
    echo "no transfer plan for $FLAVOUR: $SWEEP_S s a call (set DALILOAD_BENCH_BUDGET_S to change it)"
fi
case "$MODE" in tests) CALL_S=$CALL4_S ;; sweep) CALL_S=$SWEEP_S ;; *) CALL_S=$((CALL4_S + SWEEP_S)) ;; esac
BUDGET_S="${DALILOAD_BENCH_BUDGET_S:-$((CALL_S - 10))}"
left() { echo $((BUDGET_S - (SECONDS - START_S))); }

copy_out() {  # what a call brings back: at most the files visit.OUT_FILES names for its kind
    [ -n "$OUT_DIR" ] || return 0
    local f
    for f in "$@"; do [ -f "$f" ] && cp "$f" "$OUT_DIR/" || true; done
}

case "$MODE" in
    receive)
        RC=0
        "$PY" "$HERE/wheelhouse.py" receive --wheels "$WHEELS" --flavour "$FLAVOUR" --site "$SITE" || RC=$?
        for dataset in ${GENERATE[@]+"${GENERATE[@]}"}; do  # a later sweep's dataset, its own options (a cache hit there)
            echo "== generating $dataset ($((SECONDS - START_S)) s so far)"
            (cd "$REPO" && "$PY" -m benchmarks.bench_nvdec --dataset "$dataset" --generate-only) || RC=$((RC ? RC : 1))
        done
        echo "== receive done in $((SECONDS - START_S)) s, exit $RC"
        exit "$RC" ;;
    preflight|smoke)
        RC=0
        "$PY" "$HERE/wheelhouse.py" receive --wheels "$WHEELS" --flavour "$FLAVOUR" --site "$SITE" || RC=$?
        echo "== $MODE ($((SECONDS - START_S)) s so far)"
        if [ "$MODE" = preflight ]; then
            "$PY" "$HERE/checks.py" preflight --flavour "$FLAVOUR" --site "$SITE" ${OUT_DIR:+--out "$OUT_DIR"} || RC=$((RC ? RC : 1))
        else
            "$PY" "$HERE/checks.py" smoke ${OUT_DIR:+--out "$OUT_DIR"} || RC=$((RC ? RC : 1))
        fi
        echo "== $MODE done in $((SECONDS - START_S)) s, exit $RC"
        exit "$RC" ;;
esac

# install | tests | sweep | run: everything here installed (receiving whatever pieces came), or what is missing.
INSTALL_RC=0
"$PY" "$HERE/wheelhouse.py" install --wheels "$WHEELS" --flavour "$FLAVOUR" --site "$SITE" || INSTALL_RC=$?
case "$MODE" in install|run) [ "$INSTALL_RC" = 0 ] || exit "$INSTALL_RC" ;; esac  # a visit's call goes on

IMPORT_RC=0
if [ "$MODE" != sweep ]; then  # a sweep call comes after the tests call checked this: its seconds are the sweep's
echo "== import check"
"$PY" - <<'EOF' || IMPORT_RC=$?
import ctypes
import sys
import torch
import av
import nvidia.dali
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), PyAV {av.__version__}, DALI {nvidia.dali.__version__}")
if not torch.cuda.is_available():
    sys.exit("torch sees no CUDA device: the GPU benchmark needs one")
print(f"GPU: {torch.cuda.get_device_name()}")
import pynvml  # the NVDEC proof: every GPU row samples the decoder utilisation through NVML
pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByIndex(0)
print(f"NVML: decoder utilisation now {pynvml.nvmlDeviceGetDecoderUtilization(handle)[0]} %")
try:
    ctypes.CDLL("libnvcuvid.so.1")
except OSError as err:
    print(f"libnvcuvid.so.1 does not load ({err}): no NVDEC; the rows that need it are reported unavailable")
EOF
if [ "$IMPORT_RC" != 0 ]; then
    echo "import check failed (see above)" >&2
    # Only the one-go run and --install-only stop here; a visit's call goes on with what can run.
    case "$MODE" in install|run) exit 4 ;; esac
fi
fi
[ "$INSTALL_RC" = 0 ] || echo "installing failed with exit $INSTALL_RC (see above); going on with what is installed" >&2
[ "$MODE" = install ] && exit "$INSTALL_RC"
cd "$REPO"

# The GPU tests (``cuda``-marked) must run, not skip: DALILOAD_FAIL_WITHOUT_CUDA=1. The batch hand-off tests
# (a GPU batch stays valid; fallback clips through registered memory) first: they are this visit's news.
gpu_tests() {
    echo "== GPU tests ($(left) s of $BUDGET_S left, at most $TESTS_S)"
    set +e
    DALILOAD_FAIL_WITHOUT_CUDA=1 timeout --signal=INT --kill-after=10 "$TESTS_S" \
        "$PY" -m pytest -q -rA -m cuda -p no:cacheprovider \
        tests/test_batch_handoff.py tests/test_dali_cut.py tests/test_gpu_readiness.py tests/test_pipeline.py \
        tests/test_loader.py 2>&1 \
        | tee ${OUT_DIR:+"$OUT_DIR/tests.log"}
    TESTS_RC=${PIPESTATUS[0]}
    set -e
    echo "== GPU tests: exit code $TESTS_RC"
}

if [ "$MODE" = tests ]; then
    set +e
    "$PY" "$HERE/checks.py" smoke ${OUT_DIR:+--out "$OUT_DIR"}
    SMOKE_RC=$?
    echo "== merge timing ($(left) s left)"
    timeout --signal=INT 60 "$PY" "$HERE/merge_time.py" ${OUT_DIR:+--out "$OUT_DIR"}
    MERGE_RC=$?
    set -e
    # daliload doctor's verdict on this host (its own decode check left out: the smoke decoded already).
    if [ -n "$OUT_DIR" ]; then timeout 30 "$PY" -m daliload.cli doctor --json --no-decode > "$OUT_DIR/doctor.json" || true; fi
    TESTS_RC=0
    gpu_tests
    echo "== tests call done in $((SECONDS - START_S)) s: install $INSTALL_RC, import $IMPORT_RC, smoke $SMOKE_RC," \
         "merge timing $MERGE_RC, GPU tests $TESTS_RC"
    [ "$TESTS_RC" = 0 ] && [ "$SMOKE_RC" = 0 ] && [ "$MERGE_RC" = 0 ] && [ "$INSTALL_RC" = 0 ] || exit 5
    exit 0
fi

TESTS_RC=0
if [ "$MODE" = run ] && [ "$TESTS" = 1 ]; then
    gpu_tests
fi

# The sweep: the NVDEC ceiling and every DALI threads x pipelines setting (benchmarks.bench_nvdec), its JSON
# rewritten after every row; then, in what is left, the peers (python -m benchmarks; they are listed as
# skipped past its --time-budget). `timeout` is the backstop of both.
RESULTS="${DALILOAD_BENCH_RESULTS:-$REPO/benchmarks/results}"
sweep_out() {
    copy_out "$RESULTS/nvdec-$DATASET.json" "$RESULTS/nvdec-$DATASET.md" "$RESULTS/gpu.json" "$REPO/benchmarks/RESULTS.md"
    local runs="$REPO/bench_out/datasets/runs"
    if [ -n "$OUT_DIR" ] && [ -d "$runs" ]; then tar -czf "$OUT_DIR/bench-logs.tar.gz" -C "$runs" . 2>/dev/null || true; fi
}
trap sweep_out EXIT
LEFT=$(left)
[ "$LEFT" -gt 30 ] || { echo "only ${LEFT} s of the ${BUDGET_S} s budget left; no sweep" >&2; exit 1; }
echo "== NVDEC sweep on $DATASET (${LEFT} s left)"
SWEEP_RC=0
timeout --signal=INT --kill-after=5 "$((LEFT - 5))" \
    "$PY" -m benchmarks.bench_nvdec --dataset "$DATASET" --time-budget "$((LEFT - 15))" --json "$RESULTS/nvdec-$DATASET.json" \
    --machine "${DALILOAD_BENCH_MACHINE:-GPU machine}" ${BENCH_ARGS[@]+"${BENCH_ARGS[@]}"} || SWEEP_RC=$?
if [ "$SWEEP_RC" != 0 ] && [ -f "$RESULTS/nvdec-$DATASET.json" ]; then  # cut short: its table from its JSON
    "$PY" -m benchmarks.bench_nvdec --dataset "$DATASET" --report-from "$RESULTS/nvdec-$DATASET.json" \
        --json "$RESULTS/nvdec-$DATASET.json" >/dev/null || true
fi

LEFT=$(left)
PEERS_RC=0
if [ "$LEFT" -gt 60 ]; then
    echo "== peers on $DATASET (${LEFT} s left)"
    timeout --signal=INT --kill-after=5 "$((LEFT - 5))" \
        "$PY" -m benchmarks --device cuda --datasets "$DATASET" --clips 256 --clips-hd 128 --duration-hd 4 \
        --workers 16 --runs 1 --warmup 1 --no-sweeps --profile-clips 0 \
        --loaders daliload,daliload-static,dali-readers-video,blog-pyav,daliload-fallback,torchcodec-cuda,decord-cpu \
        --time-budget "$((LEFT - 45))" --timeout 35 --results-dir "$RESULTS" \
        --machine "${DALILOAD_BENCH_MACHINE:-GPU machine}" || PEERS_RC=$?
    if [ "$PEERS_RC" != 0 ] && [ -f "$RESULTS/gpu.json" ]; then
        "$PY" -m benchmarks --report-from "$RESULTS/gpu.json" || true
    fi
else
    echo "== peers: only ${LEFT} s left, not run"
fi
echo "== done in $((SECONDS - START_S)) s: GPU tests exit $TESTS_RC, sweep exit $SWEEP_RC, peers exit $PEERS_RC"
FINAL=0
if [ "$SWEEP_RC" = 1 ] && grep -q '"status": "unavailable"' "$RESULTS/nvdec-$DATASET.json" 2>/dev/null; then
    FINAL=6  # no NVDEC here (bench_nvdec measured nothing, by design): a rerun cannot do better
elif [ "$SWEEP_RC" != 0 ]; then FINAL=$SWEEP_RC
elif [ "$TESTS_RC" != 0 ]; then FINAL=5
fi
if [ "$MODE" = sweep ]; then  # for the last slot (--last-slot); a call cut off leaves none, and is run again
    mkdir -p "$STATE_DIR" && echo "$FINAL" > "$STATE_DIR/sweep-$DATASET.rc"
fi
exit "$FINAL"
