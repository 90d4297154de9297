#!/bin/sh
# Make an environment named twinkle-client with Twinkle's torch-free client (twinkle_client:
# TwinkleClient, the remote model, sampler and data proxies), for training on a Twinkle server.
#
#   sh INSTALL_CLIENT.sh                  # conda env `twinkle-client` when conda is present,
#                                         # else a venv in ~/.venvs/twinkle-client
#   sh INSTALL_CLIENT.sh --venv DIR       # a venv in DIR (named twinkle-client or not), even with conda
#   sh INSTALL_CLIENT.sh --with-tinker    # also the Tinker SDK (the `tinker` extra)
#   sh INSTALL_CLIENT.sh --from-pypi      # the packages from PyPI, not from this checkout
#   sh INSTALL_CLIENT.sh --dry-run        # print the commands, run nothing
#   PYTHON=/path/to/python3 sh INSTALL_CLIENT.sh   # the interpreter a venv is made from
#
# From a checkout (packages/ next to this script) it installs packages/twinkle-mesh and
# packages/twinkle-client; elsewhere, or with --from-pypi, `twinkle-client` from the index.
# Python 3.11 or later. Nothing of torch, transformers or peft is installed; the script
# checks that at the end.
set -eu

PYTHON="${PYTHON:-python3}"
ENV_NAME=twinkle-client
VENV=""
USE_CONDA=auto
TINKER=no
FROM=checkout
DRY_RUN=no
while [ $# -gt 0 ]; do
    case "$1" in
        --venv)
            [ $# -ge 2 ] || { echo "INSTALL_CLIENT.sh: --venv needs a folder" >&2; exit 2; }
            VENV="$2"; USE_CONDA=no; shift ;;
        --with-tinker) TINKER=yes ;;
        --from-pypi) FROM=pypi ;;
        --dry-run) DRY_RUN=yes ;;
        -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
        *) echo "INSTALL_CLIENT.sh: unknown option $1 (use --venv DIR, --with-tinker, --from-pypi, --dry-run or --help)" >&2; exit 2 ;;
    esac
    shift
done

ROOT="$(cd "$(dirname "$0")" && pwd)"
if [ "$FROM" = checkout ] && [ ! -d "$ROOT/packages/twinkle-client" ]; then
    FROM=pypi
fi
EXTRA=""
if [ "$TINKER" = yes ]; then EXTRA="[tinker]"; fi
if [ "$FROM" = checkout ]; then
    set -- "$ROOT/packages/twinkle-mesh" "$ROOT/packages/twinkle-client$EXTRA"
else
    set -- "twinkle-client$EXTRA"
fi

run() {
    echo "+ $*"
    if [ "$DRY_RUN" = no ]; then "$@"; fi
}

if [ "$USE_CONDA" = auto ] && command -v conda >/dev/null 2>&1; then
    if conda env list | awk '{print $1}' | grep -qx "$ENV_NAME"; then
        echo "conda env $ENV_NAME exists: installing into it"
    else
        run conda create -y -n "$ENV_NAME" python=3.11
    fi
    ENV_PYTHON="conda run --no-capture-output -n $ENV_NAME python"
    ACTIVATE="conda activate $ENV_NAME"
else
    VENV="${VENV:-$HOME/.venvs/$ENV_NAME}"
    if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
        echo "INSTALL_CLIENT.sh: $("$PYTHON" -V 2>&1 || echo "$PYTHON: not found") is not Python 3.11 or later; set PYTHON=/path/to/python3.11" >&2
        exit 1
    fi
    if [ ! -x "$VENV/bin/python" ]; then
        run "$PYTHON" -m venv "$VENV"
    fi
    ENV_PYTHON="$VENV/bin/python"
    ACTIVATE=". $VENV/bin/activate"
fi

# shellcheck disable=SC2086  # ENV_PYTHON is a command line of several words for conda
run $ENV_PYTHON -m pip install --upgrade pip
# shellcheck disable=SC2086
run $ENV_PYTHON -m pip install "$@"

if [ "$DRY_RUN" = yes ]; then
    exit 0
fi
CHECK='
import importlib.util

import twinkle_client
from twinkle_client import TwinkleClient

heavy = [name for name in ("torch", "transformers", "peft") if importlib.util.find_spec(name)]
if heavy:
    raise SystemExit(f"the client environment has {heavy}; it should be torch-free")
print(f"twinkle_client imports from {twinkle_client.__file__}; no torch, transformers or peft")
'
# shellcheck disable=SC2086
$ENV_PYTHON -c "$CHECK"
echo "Done. Activate it with: $ACTIVATE"
