#!/usr/bin/env bash
# Download the wheels the GPU suite needs on a box without a package registry
# (Python 3.12 x86-64, torch and triton already there) into .whl/ at the
# repository root (ignored by git). Run it where PyPI is reachable:
#
#     benchmarks/gpu/fetch_wheels.sh            # then carry .whl to the box
#     benchmarks/gpu/fetch_wheels.sh --procgen  # the procgen part's own set, into .whl-procgen/
#
# --procgen: ProcGen (procgen2, gym3, cffi) and the Debian packages of the system libraries its C
# library links (GL, X11, GLib), into .whl-procgen/, which stage_procgen.sh unpacks on the box in a
# command of its own: procgen2's only build is a cp311 wheel of 48 MB, most of what one call carries.
#
# Versions are pinned to what this machine's Python has installed where it has
# the package (so the box runs what the tests ran here), else the newest.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=.whl
PYTHON=${PYTHON:-python3}
if [[ "${1:-}" == "--procgen" ]]; then
    DEST=.whl-procgen
    mkdir -p "$DEST"
    common=(-q --no-deps --only-binary=:all: --implementation cp --platform manylinux_2_17_x86_64
            --platform manylinux2014_x86_64 -d "$DEST")
    # procgen2 ships cp311 wheels only; its libenv.so is a plain C library that gym3 opens through
    # cffi in ABI mode, so the cp311 files run on the box's 3.12 beside a cp312 cffi
    "$PYTHON" -m pip download "${common[@]}" --python-version 3.11 procgen2==0.10.7
    # gym3 imports imageio when it loads (its video recorder; imageio needs only numpy to load), and
    # procgen registers its envs with gym, whose last release is a source distribution: built here
    "$PYTHON" -m pip download "${common[@]}" --python-version 3.12 gym3==0.3.3 cffi imageio==2.38.1 \
        cloudpickle gym_notices pycparser
    "$PYTHON" -m pip wheel -q --no-deps -w "$DEST" gym==0.26.2
    # the shared libraries libenv.so (Qt5 Gui) needs from the system, as Debian bookworm packages
    (cd "$DEST" && apt-get download libgl1 libglx0 libglvnd0 libx11-6 libxcb1 libxau6 libxdmcp6 libbsd0 \
        libmd0 libglib2.0-0 libpcre2-8-0)
    ls -la "$DEST"
    du -sh "$DEST"
    exit 0
fi
# What the box lacks (device README / KINDS.md lists what it has): the env
# stack, FLA for the delta-rule comparison, and fwrl's own runtime
# dependencies the box image does not hold (pydantic wants a newer typing-extensions
# than the image may have; the carried one comes first on PYTHONPATH), and the test
# plugins pyproject.toml's addopts need (pytest-xdist with execnet, pytest-timeout).
PACKAGES=(gymnasium farama-notifications "ale-py<0.13" fla-core
          pydantic pydantic-core annotated-types typing-inspection typing-extensions
          pytest-xdist execnet pytest-timeout)
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64
           manylinux1_x86_64)

mkdir -p "$DEST"
grep -qxF "/$DEST/" .git/info/exclude 2>/dev/null || grep -qxF "/$DEST/" .gitignore || echo "/$DEST/" >> .git/info/exclude
platform_args=()
for p in "${PLATFORMS[@]}"; do platform_args+=(--platform "$p"); done

pinned() {  # NAME[<spec] -> NAME==installed version, or the spec as given
    local name=${1%%[<>=]*}
    local version
    version=$("$PYTHON" -c "import importlib.metadata as m, sys
try: print(m.version(sys.argv[1]))
except m.PackageNotFoundError: pass" "$name")
    if [[ -n "$version" ]]; then echo "$name==$version"; else echo "$1"; fi
}

for package in "${PACKAGES[@]}"; do
    spec=$(pinned "$package")
    echo "fetching $spec"
    "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${platform_args[@]}" -d "$DEST" "$spec"
done
ls -la "$DEST"
du -sh "$DEST"
