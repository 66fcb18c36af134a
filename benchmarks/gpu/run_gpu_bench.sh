#!/usr/bin/env bash
# daliload GPU tests and benchmarks on a GPU machine that has torch but no DALI and no package
# registry, reached by remote calls that each carry one piece of the wheels. See README.md beside this.
#
#   benchmarks/gpu/run_gpu_bench.sh --plan          the visit: its calls, what each carries, seconds (changes nothing)
#   benchmarks/gpu/run_gpu_bench.sh --check         which pieces and wheels are here or missing (changes nothing)
#   benchmarks/gpu/run_gpu_bench.sh --preflight     call 1: receive piece 1, install what it completes, preflight
#   benchmarks/gpu/run_gpu_bench.sh --receive       calls 2, 3: receive the piece, install what it completes
#   benchmarks/gpu/run_gpu_bench.sh --smoke         call 4: receive the last piece, install DALI, smoke decodes
#   benchmarks/gpu/run_gpu_bench.sh                 the last step: GPU tests, then the benchmark (rerun to retry)
#   benchmarks/gpu/run_gpu_bench.sh --install-only  receive and install everything here, import check, stop
#   benchmarks/gpu/run_gpu_bench.sh --no-tests      the last step without the GPU tests
#   benchmarks/gpu/run_gpu_bench.sh --out DIR ...   also copy the log and results to DIR (the call's $OUT)
#   benchmarks/gpu/run_gpu_bench.sh --pack          (here) cut the wheels into pieces, write the transfer plan
#   benchmarks/gpu/run_gpu_bench.sh --split FILE    (here) cut another file into pieces + FILE.sha256
#   benchmarks/gpu/run_gpu_bench.sh -- ARGS...      extra arguments for python -m benchmarks
#
# Environment: PYTHON (default python3: the one with torch), DALILOAD_WHEELS (wheel folder, default
# wheels/ beside this script, git-ignored), DALILOAD_BENCH_SITE (where wheels are installed, default
# /tmp/daliload-bench-site), DALILOAD_BENCH_BUDGET_S (the last step, default from the visit plan),
# DALILOAD_DALI_FLAVOUR (cuda13 | cuda12; default from the driver version).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
PY="${PYTHON:-python3}"
WHEELS="${DALILOAD_WHEELS:-$HERE/wheels}"
SITE="${DALILOAD_BENCH_SITE:-/tmp/daliload-bench-site}"
TESTS=1
MODE=run
OUT_DIR=""
START_S=$SECONDS
BENCH_ARGS=()
ARGS=("$@")

while [ $# -gt 0 ]; do
    case "$1" in
        --plan) MODE=plan ;;
        --check) MODE=check ;;
        --preflight) MODE=preflight ;;
        --receive) MODE=receive ;;
        --smoke) MODE=smoke ;;
        --install-only) MODE=install ;;
        --no-tests) TESTS=0 ;;
        --pack) MODE=pack ;;
        --out) [ $# -ge 2 ] || { echo "--out needs a DIR" >&2; exit 1; }; OUT_DIR="$2"; shift ;;
        --split)
            [ $# -ge 2 ] || { echo "--split needs a FILE" >&2; exit 1; }
            exec "$PY" "$HERE/wheelhouse.py" split "$2" ;;
        --wheels) WHEELS="$2"; shift ;;
        -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
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

# DALI wheel flavour from the driver: CUDA 13 wheels need driver >= 580, CUDA 12 ones >= 525.
FLAVOUR="${DALILOAD_DALI_FLAVOUR:-}"
if [ -z "$FLAVOUR" ]; then
    DRIVER="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n1 || true)"
    MAJOR="${DRIVER%%.*}"
    if [ -z "$MAJOR" ]; then
        FLAVOUR=cuda13
        case "$MODE" in run|preflight|smoke) echo "warning: nvidia-smi gave no driver version; assuming a CUDA 13 driver" >&2 ;; esac
    elif [ "$MAJOR" -ge 580 ]; then FLAVOUR=cuda13
    elif [ "$MAJOR" -ge 525 ]; then FLAVOUR=cuda12
    else echo "driver $DRIVER is older than 525: no DALI 2.x wheel runs on it" >&2; exit 1
    fi
fi

case "$MODE" in
    plan) exec "$PY" "$HERE/visit.py" --flavour "$FLAVOUR" ;;
    check|pack) exec "$PY" "$HERE/wheelhouse.py" "$MODE" --wheels "$WHEELS" --flavour "$FLAVOUR" ;;
esac

# SITE first (the carried wheels), then the checkout (daliload, benchmarks), then the machine's packages.
mkdir -p "$SITE"
export PYTHONPATH="$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}"
echo "== $(date -u +%H:%M:%S) $MODE: wheels $WHEELS (DALI flavour $FLAVOUR), installing into $SITE"

case "$MODE" in
    receive) exec "$PY" "$HERE/wheelhouse.py" receive --wheels "$WHEELS" --flavour "$FLAVOUR" --site "$SITE" ;;
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

# install | run: everything here installed (receiving whatever pieces came), or exactly what is missing.
"$PY" "$HERE/wheelhouse.py" install --wheels "$WHEELS" --flavour "$FLAVOUR" --site "$SITE"

echo "== import check"
if ! "$PY" - <<'EOF'
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
EOF
then
    echo "import check failed (see above)" >&2
    exit 4
fi
[ "$MODE" = install ] && exit 0
cd "$REPO"

# The last step's budget and the tests' share of it come from the visit plan (one source of truth);
# the script ends 10 s inside it. Without a transfer plan there is no visit: one call of up to 8 minutes.
if PLAN="$("$PY" "$HERE/visit.py" --flavour "$FLAVOUR" --budget 2>/dev/null)"; then
    read -r PLAN_S TESTS_S <<< "$PLAN"
    PLAN_S=$((PLAN_S - 10))
else
    PLAN_S=470 TESTS_S=150
    echo "no transfer plan for $FLAVOUR: budget $PLAN_S s (set DALILOAD_BENCH_BUDGET_S to change it)"
fi
BUDGET_S="${DALILOAD_BENCH_BUDGET_S:-$PLAN_S}"

copy_results() {  # what the call brings back: at most the files visit.OUT_FILES names for the last step
    [ -n "$OUT_DIR" ] || return 0
    local results="$REPO/benchmarks/results"
    for f in "$results/gpu.json" "$results/gpu-loaders.png" "$results/gpu-scaling.png" "$REPO/benchmarks/RESULTS.md"; do
        [ -f "$f" ] && cp "$f" "$OUT_DIR/" || true
    done
    local runs="$REPO/bench_out/datasets/runs"
    [ -d "$runs" ] && tar -czf "$OUT_DIR/bench-logs.tar.gz" -C "$runs" . 2>/dev/null || true
}
trap copy_results EXIT

# The GPU tests (``cuda``-marked) must run, not skip: DALILOAD_FAIL_WITHOUT_CUDA=1.
TESTS_RC=0
if [ "$TESTS" = 1 ]; then
    echo "== GPU tests ($((BUDGET_S - (SECONDS - START_S))) s of $BUDGET_S left, at most $TESTS_S)"
    set +e
    DALILOAD_FAIL_WITHOUT_CUDA=1 timeout --signal=INT --kill-after=10 "$TESTS_S" \
        "$PY" -m pytest -q -rA -m cuda -p no:cacheprovider \
        tests/test_pipeline.py tests/test_gpu_readiness.py tests/test_loader.py 2>&1 \
        | tee ${OUT_DIR:+"$OUT_DIR/tests.log"}
    TESTS_RC=${PIPESTATUS[0]}
    set -e
    echo "== GPU tests: exit code $TESTS_RC"
fi

# What is left goes to the benchmark. It starts no new measurement past --time-budget (leaving
# room for the last one, --timeout at most, and the report); `timeout` is the backstop, and the
# JSON is rewritten after every measurement, so a cut run still makes its table (--report-from).
# Ceilings first (the NVDEC ceiling shows the decoders work), then the DALI loaders; the peers
# the visit does not carry (torchcodec-cuda, decord-cpu) last: they are listed as unavailable.
LEFT=$((BUDGET_S - (SECONDS - START_S)))
[ "$LEFT" -gt 60 ] || { echo "only ${LEFT} s of the ${BUDGET_S} s budget left; no benchmark" >&2; exit 1; }
echo "== benchmark (${LEFT} s left)"
BENCH_RC=0
timeout --signal=INT --kill-after=5 "$((LEFT - 5))" \
    "$PY" -m benchmarks --device cuda --datasets h264-gop250 --clips 32 --runs 2 --warmup 1 --no-sweeps \
    --profile-clips 0 \
    --loaders daliload-dali-gpu,dali-readers-video,daliload,blog-pyav,daliload-fallback,torchcodec-cuda,decord-cpu \
    --time-budget "$((LEFT - 45))" --timeout 35 --machine "${DALILOAD_BENCH_MACHINE:-GPU machine}" \
    ${BENCH_ARGS[@]+"${BENCH_ARGS[@]}"} || BENCH_RC=$?
if [ "$BENCH_RC" != 0 ] && [ -f benchmarks/results/gpu.json ]; then
    "$PY" -m benchmarks --report-from benchmarks/results/gpu.json || true
fi
echo "== done in $((SECONDS - START_S)) s: GPU tests exit $TESTS_RC, benchmark exit $BENCH_RC"
[ "$BENCH_RC" = 0 ] || exit "$BENCH_RC"
[ "$TESTS_RC" = 0 ] || exit 5
