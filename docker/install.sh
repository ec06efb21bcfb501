#!/usr/bin/env bash
# Install fwrl (and torch) into the current Python environment: the ONE install
# path of every image under docker/ and of CI (tests/e2e/test_docker_recipes.py runs
# it in a fresh virtualenv), so the recipes cannot drift from the package.
#
# Usage: docker/install.sh [--torch cpu|cu118|cu121|cu124|cu126|cu128|X.Y.Z|existing]
#                          [--extras ray,atari] [--python PYTHON] [--pip-arg ARG]...
#
#   --torch     which torch wheel to install: "cpu" (default) or a CUDA tag such as
#               "cu126" from download.pytorch.org; a version "X.Y.Z" as
#               `pip install torch==X.Y.Z` from pip's configured indexes (what
#               README.md's commands do; a local wheel on the CPU machines); or
#               "existing" to keep the torch that the Python already imports
#               (fails if there is none).
#   --extras    comma-separated fwrl extras (setup.py): ray, atari, procgen, envpool,
#               kernels, test, all; "" for none. Default: ray,atari.
#   --python    the interpreter to install into (default: python3, or $PYTHON).
#   --pip-arg   an extra argument for the fwrl `pip install` (repeatable),
#               e.g. --pip-arg=--no-build-isolation.
#
# The fwrl source is the folder above this script (the repository root).
set -euo pipefail

TORCH=cpu
EXTRAS=ray,atari
PY="${PYTHON:-python3}"
PIP_ARGS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --torch) TORCH="$2"; shift 2 ;;
        --torch=*) TORCH="${1#*=}"; shift ;;
        --extras) EXTRAS="$2"; shift 2 ;;
        --extras=*) EXTRAS="${1#*=}"; shift ;;
        --python) PY="$2"; shift 2 ;;
        --python=*) PY="${1#*=}"; shift ;;
        --pip-arg) PIP_ARGS+=("$2"); shift 2 ;;
        --pip-arg=*) PIP_ARGS+=("${1#*=}"); shift ;;
        -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
        *) echo "install.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done

SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
test -f "$SRC/setup.py" || { echo "install.sh: no setup.py in $SRC" >&2; exit 2; }

"$PY" -c 'import sys; assert sys.version_info >= (3, 10), sys.version' \
    || { echo "install.sh: fwrl needs Python >= 3.10 ($PY)" >&2; exit 2; }

case "$TORCH" in
    existing)
        "$PY" -c 'import torch; print("install.sh: using torch", torch.__version__)' \
            || { echo "install.sh: --torch existing, but $PY cannot import torch" >&2; exit 2; } ;;
    cpu|cu[0-9][0-9]*)
        "$PY" -m pip install --index-url "https://download.pytorch.org/whl/$TORCH" torch ;;
    [0-9]*.[0-9]*)
        case "$TORCH" in
            *[!0-9.]*) echo "install.sh: --torch version must be digits and dots, like 2.13.0; got '$TORCH'" >&2; exit 2 ;;
        esac
        "$PY" -m pip install "torch==$TORCH" ;;
    *) echo "install.sh: --torch must be cpu, a CUDA tag like cu126, a version like 2.13.0, or existing; got '$TORCH'" >&2; exit 2 ;;
esac

case "$EXTRAS" in
    *[!a-z0-9,_-]*) echo "install.sh: bad --extras '$EXTRAS' (comma-separated names)" >&2; exit 2 ;;
esac
TARGET="$SRC"
if [ -n "$EXTRAS" ]; then TARGET="${SRC}[${EXTRAS}]"; fi
"$PY" -m pip install ${PIP_ARGS[@]+"${PIP_ARGS[@]}"} "$TARGET"

# smoke test of the installed package (from /, not the source tree): it imports,
# the CLI runs, and the asked-for extras import
cd /
"$PY" -c 'import fwrl, torch; print("install.sh: fwrl", fwrl.__version__, "from", fwrl.__file__, "torch", torch.__version__)'
"$PY" -m fwrl.launch.cli info --cores > /dev/null
for extra in ${EXTRAS//,/ }; do
    case "$extra" in
        ray) "$PY" -c 'import ray; print("install.sh: ray", ray.__version__)' ;;
        atari) "$PY" -c 'import ale_py; print("install.sh: ale-py", ale_py.__version__)' ;;
    esac
done
echo "install.sh: done"
