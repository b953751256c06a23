#!/usr/bin/env bash
# GPU check of collectx's CUDA executor, in one command on a machine with an NVIDIA GPU:
#   1. install the package with its CUDA extras (CuPy) and test tools;
#   2. run the GPU tests (pytest -m gpu) and the CPU-side CUDA tests;
#   3. print a collectx-perf sweep on the GPU (NRANKS ranks, several per GPU if needed), under
#      MPS when nvidia-cuda-mps-control exists and may start (ranks as processes sharing a GPU
#      are otherwise time-sliced by the driver); it says which;
#   4. print the thread-rank table (perf/gpu_threads.py: collectives and 8-byte latency against
#      the same run's device-to-device copy) and the kernel roofline (copy / reduce GB/s against
#      the same run's D2D memcpy);
#   5. if torch with NCCL is installed, the same sweep through NCCL beside ours
#      (NCCL_MULTI_RANK_GPU_ENABLE=1 lets NCCL try several ranks per GPU; a refusal is reported,
#      not fatal).
# Results go to $OUT_DIR (default perf/gpu_results). Exit status: that of the GPU tests.
# INSTALL=0 skips step 1 and uses the checkout as it is (a library built beforehand, found through
# COLLECTX_NATIVE_LIB or next to the package; collectx's run-time dependencies already importable):
# for machines with no package index. Each later step runs under STEP_TIMEOUT seconds (default 240).
#
#   perf/gpu_check.sh                 # defaults
#   NRANKS=4 MAX_BYTES=1G perf/gpu_check.sh
#   INSTALL=0 PYTHONPATH=$PWD perf/gpu_check.sh
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
OUT_DIR="${OUT_DIR:-$ROOT/perf/gpu_results}"
NRANKS="${NRANKS:-2}"
MAX_BYTES="${MAX_BYTES:-256M}"
CUPY_PKG="${CUPY_PKG:-cupy-cuda13x}"
INSTALL="${INSTALL:-1}"
STEP_TIMEOUT="${STEP_TIMEOUT:-240}"
PERF=("$PY" -m collectx.cli.perf)

section() { printf '\n== %s\n' "$*"; }

section "GPU"
if ! nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv; then
    echo "nvidia-smi failed: no NVIDIA GPU or driver here; nothing to check" >&2
    exit 2
fi
nvidia-smi topo -m || true
mkdir -p "$OUT_DIR"

section "install"
cd "$ROOT" || exit 2
if [[ "$INSTALL" != 0 ]]; then
    if ! "$PY" -m pip install -q ".[test,cuda]"; then
        echo "the [cuda] extra failed; trying $CUPY_PKG explicitly" >&2
        "$PY" -m pip install -q ".[test]" "$CUPY_PKG" || exit 2
    fi
else
    echo "INSTALL=0: using the checkout as it is"
fi
"$PY" -c 'import collectx; print(collectx.build_info())' || exit 2

section "GPU tests"
timeout "$STEP_TIMEOUT" "$PY" -m pytest -q -m gpu -rs tests/test_cuda_gpu.py tests/test_native_cuda.py \
    tests/test_cuda.py -p no:cacheprovider \
    2>&1 | tee "$OUT_DIR/pytest_gpu.txt"
status=${PIPESTATUS[0]}

section "collectx sweep (--device cuda, $NRANKS ranks)"
MPS=0
if command -v nvidia-cuda-mps-control >/dev/null; then
    export CUDA_MPS_PIPE_DIRECTORY="${CUDA_MPS_PIPE_DIRECTORY:-/tmp/collectx-mps}"
    export CUDA_MPS_LOG_DIRECTORY="${CUDA_MPS_LOG_DIRECTORY:-/tmp/collectx-mps-log}"
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    nvidia-cuda-mps-control -d 2>/dev/null && MPS=1
fi
echo "ranks as processes: $([[ $MPS == 1 ]] && echo "under MPS" || echo "without MPS (time-sliced)")"
timeout "$STEP_TIMEOUT" "${PERF[@]}" --device cuda -n "$NRANKS" -b 8 -e "$MAX_BYTES" -f 4 --collective all \
    --json "$OUT_DIR/sweep_collectx.json" --no-progress \
    || echo "collectx-perf --device cuda failed (see above)" >&2
[[ $MPS == 1 ]] && echo quit | nvidia-cuda-mps-control

section "thread ranks on GPU 0 (perf/gpu_threads.py)"
timeout "$STEP_TIMEOUT" "$PY" perf/gpu_threads.py --ranks 2,4,8 --sizes 64M,512M \
    --json "$OUT_DIR/gpu_threads.jsonl" || echo "gpu_threads.py failed (see above)" >&2
timeout "$STEP_TIMEOUT" "$PY" perf/gpu_threads.py --latency --graphs --ranks 2,8 \
    --json "$OUT_DIR/gpu_threads.jsonl" || echo "gpu_threads.py --latency failed" >&2

section "kernel roofline (copy / reduce vs D2D memcpy)"
timeout "$STEP_TIMEOUT" "$PY" perf/gpu_roofline.py --max-bytes "$MAX_BYTES" --json "$OUT_DIR/roofline.json" \
    || echo "roofline failed (see above)" >&2

section "NCCL beside collectx"
if "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() and torch.distributed.is_nccl_available() else 1)' 2>/dev/null; then
    NCCL_MULTI_RANK_GPU_ENABLE=1 timeout "$STEP_TIMEOUT" "${PERF[@]}" --device cuda -n "$NRANKS" -b 8 -e "$MAX_BYTES" \
        -f 4 --compare nccl --json "$OUT_DIR/sweep_vs_nccl.json" --no-progress \
        || echo "the NCCL comparison failed: NCCL may refuse $NRANKS ranks on $(nvidia-smi -L | wc -l) GPU(s)" >&2
else
    echo "torch with CUDA and NCCL is not installed: NCCL comparison skipped (pip install torch)"
fi

section "done: results in $OUT_DIR; GPU tests exit status $status"
exit "$status"
