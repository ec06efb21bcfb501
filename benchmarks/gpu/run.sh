#!/usr/bin/env bash
# Run one part of the GPU suite on a GPU box (or, with --dry-run, the same
# code at tiny sizes on the CPU, as CI does):
#
#     benchmarks/gpu/run.sh [--dry-run] [--budget SECONDS] kernels|learner|pong|procgen [OUT_DIR]
#
# Wheels carried in .whl/ (benchmarks/gpu/fetch_wheels.sh) are installed into
# a private target first (where the Python is 3.12, as on the box); fwrl itself
# runs from this checkout. Results go to OUT_DIR/<part>/ (default: $OUT/<part>
# when $OUT is set, as on the device tool's machines, else
# benchmarks/results/gpu/<part>; a dry run: a new temporary folder, never under
# benchmarks/results). FWRL_COMMIT names the commit in the results
# where the checkout has no .git.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PYTHON=${PYTHON:-python3}
# The wheels are built for the box's Python 3.12; another Python (a dry run here) uses its own packages.
if compgen -G "$ROOT/.whl/*.whl" > /dev/null && "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
    SITE=${FWRL_SITE:-/tmp/fwrl-site}
    if [[ ! -f "$SITE/.installed" ]]; then
        "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$SITE" "$ROOT"/.whl/*.whl
        touch "$SITE/.installed"
    fi
    export PYTHONPATH="$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}"
else
    export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
fi
# ProcGen for the procgen part, where stage_procgen.sh unpacked it in an earlier command
source "$ROOT/benchmarks/gpu/procgen_env.sh"
export PYTHONUNBUFFERED=1
exec "$PYTHON" "$ROOT/benchmarks/gpu/suite.py" "$@"
