#!/usr/bin/env bash
# On the GPU box, before the procgen part, in a command of its own (ProcGen's wheel alone is most of
# what one call carries, so it travels without the suite's other wheels):
#
#     run(command="benchmarks/gpu/stage_procgen.sh", carry=[".whl-procgen"], timeout_s=120)
#     run(command="FWRL_COMMIT=<sha> benchmarks/gpu/run.sh procgen", carry=[".whl"], timeout_s=600)
#
# It unpacks .whl-procgen/ (benchmarks/gpu/fetch_wheels.sh --procgen) into .procgen-site/, ignored by
# git, so the box keeps it for the next command while it stays warm; run.sh puts it on PYTHONPATH and
# its libraries on LD_LIBRARY_PATH. pip refuses procgen2's cp311 wheel on Python 3.12, so it is
# unzipped as it is: its C library (libenv.so and the Qt5 it bundles) is opened by gym3 through cffi
# in ABI mode and holds no CPython code. The Debian packages of the system libraries it links (GL,
# X11, GLib) are unpacked under .procgen-site/lib, never into /. Ends by creating one ProcGen env.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PYTHON=${PYTHON:-python3}
SRC=$ROOT/.whl-procgen
DEST=$ROOT/.procgen-site
if ! compgen -G "$SRC/procgen2-*.whl" > /dev/null; then
    echo "stage_procgen.sh: no procgen2 wheel in $SRC: run benchmarks/gpu/fetch_wheels.sh --procgen where a" \
         "package registry is reachable, then carry .whl-procgen" >&2
    exit 2
fi
rm -rf "$DEST"
mkdir -p "$DEST/lib"
wheels=()
for wheel in "$SRC"/*.whl; do
    [[ "$(basename "$wheel")" == procgen2-* ]] || wheels+=("$wheel")
done
"$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$DEST" "${wheels[@]}"
"$PYTHON" -m zipfile -e "$SRC"/procgen2-*.whl "$DEST"
for deb in "$SRC"/*.deb; do
    if [[ -e "$deb" ]]; then
        dpkg -x "$deb" "$DEST/lib"
    fi
done
"$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])' > "$DEST/.python"
source "$ROOT/benchmarks/gpu/procgen_env.sh"
"$PYTHON" -c "
import procgen
env = procgen.ProcgenGym3Env(num=1, env_name='bigfish', distribution_mode='easy')
_, obs, _ = env.observe()
print('procgen', procgen.__file__, 'observation', obs['rgb'].shape)
"
du -sh "$DEST"
