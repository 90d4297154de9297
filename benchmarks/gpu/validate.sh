#!/usr/bin/env bash
# The one GPU validation run (issue 20): install the GPU extras, then run every GPU check
# (benchmarks/gpu/validate.py) and append its summary to benchmarks/RESULTS.md.
#
#   benchmarks/gpu/validate.sh [--only kernels,sft_mfu]   # on a machine with a CUDA GPU
#   benchmarks/gpu/validate.sh --dry-run                  # anywhere: scripts and configs only
#
# The GPU environment is a venv of its own (TWINKLE_GPU_VENV, default .venv-gpu) synced from
# uv.lock with the vllm, liger and fla extras: vLLM pins its own torch and transformers, and
# flash-linear-attention must stay out of CPU environments. flash-attn has no wheels on PyPI
# (its source builds against the local CUDA, or fetches a prebuilt binary); it is installed
# within a time limit, and without it the varlen attention check is reported as skipped.
# Designed to fit in about ten minutes on one H200; not run by CI.
set -uo pipefail
cd "$(dirname "$0")/../.."

if [[ " $* " == *" --dry-run "* ]]; then
    exec "${PYTHON:-.venv/bin/python}" benchmarks/gpu/validate.py "$@"
fi

VENV="${TWINKLE_GPU_VENV:-.venv-gpu}"
python3 -m uv --version >/dev/null 2>&1 || python3 -m pip install --quiet uv
UV_PROJECT_ENVIRONMENT="$VENV" timeout 300 python3 -m uv sync --frozen --no-default-groups \
    --all-packages --group=test --extra=vllm --extra=liger --extra=fla \
    || { echo "validate.sh: uv sync of the GPU environment failed" >&2; exit 1; }
MAX_JOBS=16 timeout 240 python3 -m uv pip install --python "$VENV/bin/python" \
    --no-build-isolation flash-attn \
    || echo "validate.sh: flash-attn not installed; its fast path will be reported skipped"

exec "$VENV/bin/python" benchmarks/gpu/validate.py --results benchmarks/RESULTS.md "$@"
