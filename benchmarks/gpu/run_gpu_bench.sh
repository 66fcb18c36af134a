#!/usr/bin/env bash
# daliload GPU benchmarks, end to end, on a GPU machine that has torch but no DALI
# and cannot reach a package registry. See README.md beside this script.
#
#   benchmarks/gpu/run_gpu_bench.sh                 reassemble, install, GPU tests, benchmark (< 8 min)
#   benchmarks/gpu/run_gpu_bench.sh --check         name the pieces and wheels still missing; change nothing
#   benchmarks/gpu/run_gpu_bench.sh --install-only  reassemble and install, no tests, no benchmark
#   benchmarks/gpu/run_gpu_bench.sh --no-tests      reassemble, install, benchmark
#   benchmarks/gpu/run_gpu_bench.sh --pack          (here) cut the wheels into the transfer pieces
#   benchmarks/gpu/run_gpu_bench.sh --split FILE    (here) cut FILE into <= 60 MB pieces + FILE.sha256
#   benchmarks/gpu/run_gpu_bench.sh -- ARGS...      extra arguments for python -m benchmarks
#
# Environment: PYTHON (default python3: the one with torch), DALILOAD_WHEELS (wheel folder,
# default: wheels/ beside this script, git-ignored), DALILOAD_BENCH_SITE (where wheels are
# installed, default /tmp/daliload-bench-site), DALILOAD_BENCH_BUDGET_S (whole run, default
# 470 s), DALILOAD_DALI_FLAVOUR (cuda13 | cuda12; default from the driver version).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
PY="${PYTHON:-python3}"
WHEELS="${DALILOAD_WHEELS:-$HERE/wheels}"
TESTS=1
SITE="${DALILOAD_BENCH_SITE:-/tmp/daliload-bench-site}"
BUDGET_S="${DALILOAD_BENCH_BUDGET_S:-470}"
MODE=run
START_S=$SECONDS
BENCH_ARGS=()

while [ $# -gt 0 ]; do
    case "$1" in
        --check) MODE=check ;;
        --install-only) MODE=install ;;
        --no-tests) TESTS=0 ;;
        --pack) MODE=pack ;;
        --split)
            [ $# -ge 2 ] || { echo "--split needs a FILE" >&2; exit 1; }
            exec "$PY" "$HERE/wheelhouse.py" split "$2" ;;
        --wheels) WHEELS="$2"; shift ;;
        -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
        --) shift; BENCH_ARGS=("$@"); break ;;
        *) echo "unknown option $1 (see --help)" >&2; exit 1 ;;
    esac
    shift
done

command -v "$PY" >/dev/null || { echo "no $PY here; set PYTHON to the interpreter that has torch" >&2; exit 1; }

# DALI wheel flavour from the driver: CUDA 13 wheels need driver >= 580, CUDA 12 ones >= 525.
FLAVOUR="${DALILOAD_DALI_FLAVOUR:-}"
if [ -z "$FLAVOUR" ]; then
    DRIVER="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n1 || true)"
    MAJOR="${DRIVER%%.*}"
    if [ -z "$MAJOR" ]; then
        FLAVOUR=cuda13
        [ "$MODE" = run ] && echo "warning: nvidia-smi gave no driver version; assuming a CUDA 13 driver" >&2
    elif [ "$MAJOR" -ge 580 ]; then FLAVOUR=cuda13
    elif [ "$MAJOR" -ge 525 ]; then FLAVOUR=cuda12
    else echo "driver $DRIVER is older than 525: no DALI 2.x wheel runs on it" >&2; exit 1
    fi
fi

export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
echo "== wheels: $WHEELS (DALI flavour $FLAVOUR, installing into $SITE)"
if [ "$MODE" = check ] || [ "$MODE" = pack ]; then
    exec "$PY" "$HERE/wheelhouse.py" "$MODE" --wheels "$WHEELS" --flavour "$FLAVOUR"
fi
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

# The GPU tests (``cuda``-marked) must run, not skip: DALILOAD_FAIL_WITHOUT_CUDA=1.
TESTS_RC=0
if [ "$TESTS" = 1 ]; then
    echo "== GPU tests ($((BUDGET_S - (SECONDS - START_S))) s left)"
    DALILOAD_FAIL_WITHOUT_CUDA=1 timeout --signal=INT --kill-after=10 150 \
        "$PY" -m pytest -q -m cuda -p no:cacheprovider tests/test_pipeline.py tests/test_loader.py || TESTS_RC=$?
    echo "== GPU tests: exit code $TESTS_RC"
fi

# What is left of the budget goes to the benchmark. It starts no new measurement past
# --time-budget (leaving room for the last one, --timeout at most, and the report);
# `timeout` is the backstop, and the JSON is rewritten after every measurement, so
# `python -m benchmarks --report-from benchmarks/results/gpu.json` can still make the table.
# Ceilings first (the NVDEC ceiling shows the decoders work), then the DALI loaders.
LEFT=$((BUDGET_S - (SECONDS - START_S)))
[ "$LEFT" -gt 150 ] || { echo "only ${LEFT} s of the ${BUDGET_S} s budget left; not starting" >&2; exit 1; }
echo "== benchmark (${LEFT} s left)"
BENCH_RC=0
timeout --signal=INT --kill-after=20 "$((LEFT - 10))" \
    "$PY" -m benchmarks --device cuda --datasets h264-gop250 --clips 64 --runs 3 --warmup 1 --no-sweeps \
    --loaders daliload-dali-gpu,dali-readers-video,daliload,torchcodec-cuda,blog-pyav,daliload-fallback,decord-cpu \
    --time-budget "$((LEFT - 100))" --timeout 60 --machine "${DALILOAD_BENCH_MACHINE:-GPU machine}" \
    ${BENCH_ARGS[@]+"${BENCH_ARGS[@]}"} || BENCH_RC=$?
echo "== done in $((SECONDS - START_S)) s: GPU tests exit $TESTS_RC, benchmark exit $BENCH_RC"
[ "$BENCH_RC" = 0 ] || exit "$BENCH_RC"
[ "$TESTS_RC" = 0 ] || exit 5
