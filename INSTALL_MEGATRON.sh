#!/bin/sh
# Install Twinkle's Megatron backend (the `megatron` extra: megatron-core 0.16) into the
# current Python environment, then check that MegatronModel imports.
#
#   sh INSTALL_MEGATRON.sh             # from a checkout: the workspace packages, editable
#   sh INSTALL_MEGATRON.sh --dry-run   # print the commands, run nothing
#   sh INSTALL_MEGATRON.sh --check     # only check an existing installation
#   PYTHON=/path/to/python sh INSTALL_MEGATRON.sh
#
# What the backend needs: Python 3.11 or later (megatron-core 0.17 and later need 3.12, so
# the extra pins 0.16), torch, and megatron-core. Transformer Engine and apex are NOT
# needed: MegatronModel builds its layers from torch's own ops. Without a GPU it runs on the
# CPU (gloo), a debug mode for checking a parallel layout on a laptop.
# Ascend NPUs use Megatron-LM with MindSpeed instead; follow the NPU guide (Megatron-LM
# v0.15.3, MindSpeed core_r0.15.3), then run this script with --check.
set -eu

PYTHON="${PYTHON:-python3}"
MODE=install
for arg in "$@"; do
    case "$arg" in
        --dry-run) MODE=dry-run ;;
        --check) MODE=check ;;
        -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
        *) echo "INSTALL_MEGATRON.sh: unknown option $arg (use --dry-run, --check or --help)" >&2; exit 2 ;;
    esac
done

ROOT="$(cd "$(dirname "$0")" && pwd)"

run() {
    echo "+ $*"
    if [ "$MODE" = install ]; then "$@"; fi
}

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "INSTALL_MEGATRON.sh: $("$PYTHON" -V 2>&1) is too old; Twinkle needs Python 3.11 or later" >&2
    exit 1
fi

if [ "$MODE" != check ]; then
    if [ -d "$ROOT/packages/twinkle-models" ]; then
        # A checkout: the packages the backend stands on, editable, with the megatron extra.
        run "$PYTHON" -m pip install \
            -e "$ROOT/packages/twinkle-mesh" \
            -e "$ROOT/packages/twinkle-data" \
            -e "$ROOT/packages/twinkle-kernels" \
            -e "$ROOT/packages/twinkle-models[megatron]"
    else
        run "$PYTHON" -m pip install "twinkle-kit[megatron]"
    fi
fi

if [ "$MODE" = dry-run ]; then
    exit 0
fi
"$PYTHON" - <<'EOF'
import megatron.core
import torch

from twinkle.model.megatron import MegatronModel  # noqa: F401

device = "cuda" if torch.cuda.is_available() else "cpu (gloo, the debug mode)"
print(f"megatron-core {megatron.core.__version__} with torch {torch.__version__}: "
      f"MegatronModel is ready on {device}")
EOF
