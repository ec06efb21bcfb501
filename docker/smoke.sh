#!/usr/bin/env bash
# docker/smoke.sh: build the images under docker/ and run the cluster recipes for real,
# on one Debian machine, as root, with nothing but Debian's and Python's package
# registries reachable (no container registry).
#
#   sudo docker/smoke.sh 2>&1 | tee smoke-output.txt
#
# Setup: Debian packages (podman, buildah, runc, debootstrap, slurm-wlm, munge, ...), a
# podman configuration for this machine, a local base image made by debootstrap, the CPU
# image from docker/Dockerfile.cpu, a host virtualenv (docker/install.sh) and an unprivileged
# host user `fwrl-smoke` who owns the run folders. Then the parts:
#   image     a. the quickstart trained in the image, the run folder on a mounted volume;
#                the checkpoint evaluated on the host, as the host user, who then deletes it
#   ray       b. a Ray cluster of containers (head + a worker node offering `envs`, Ray's
#                token authentication): `fwrl train --backend ray` on the head, the worker
#                container killed mid-run, a new node started: the workers move there
#   ray-lost  b2. every env node lost: the run stops cleanly after 5 minutes with a
#                checkpoint and the documented message; a new node, then --resume
#   slurm     c. a one-node SLURM cluster (munge, slurmctld, slurmd): docker/slurm-train.sh
#                for the quickstart; a second job scancel'ed mid-run leaves a checkpoint; a
#                third gets SIGTERM on the batch shell only (what --signal=B:TERM@300 sends)
#   cuda      d. docker/Dockerfile built from the local base; `import fwrl, torch` in it
#   dmlab     (only when asked for) docker/Dockerfile.dmlab: needs ubuntu:22.04 and github.com
# Each part prints PASS, FAIL or SKIP (with the reason); the exit status is 1 if any failed.
#
# Settings (environment):
#   FWRL_SMOKE_PARTS   parts to run (default "image ray ray-lost slurm cuda")
#   FWRL_SMOKE_DIR     work folder (default /var/tmp/fwrl-smoke); its logs/ stays afterwards
#   FWRL_SMOKE_KEEP=1  keep the images, the virtualenv and the run folders afterwards
#   FWRL_SMOKE_BASE    an existing base image to build on, instead of one made by debootstrap
#   FWRL_SMOKE_PYTHON  an existing Python with fwrl[ray], instead of a new host virtualenv
#   TORCH              docker/install.sh --torch (default: the version of a torch wheel in a
#                      local folder of pip's find-links, as `pip install torch==X.Y.Z` finds
#                      it; else cpu, from download.pytorch.org)
#   DEBIAN_MIRROR      debootstrap's mirror (default: this machine's apt source, else deb.debian.org)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${FWRL_SMOKE_DIR:-/var/tmp/fwrl-smoke}"
PARTS="${FWRL_SMOKE_PARTS:-image ray ray-lost slurm cuda}"
KEEP="${FWRL_SMOKE_KEEP:-0}"
LOGS="$WORK/logs"
RUNS="$WORK/runs"
FIGURES="$LOGS/figures.txt"

SMOKE_USER=fwrl-smoke
BASE_IMAGE="${FWRL_SMOKE_BASE:-localhost/fwrl-smoke-base:latest}"
CPU_IMAGE=localhost/fwrl-smoke:cpu
CUDA_IMAGE=localhost/fwrl-smoke:cuda
DMLAB_IMAGE=localhost/fwrl-smoke:dmlab
NET=fwrl-smoke
HEAD=fwrl-smoke-head
CONTAINERS=(fwrl-smoke-train "$HEAD" fwrl-smoke-worker1 fwrl-smoke-worker2 fwrl-smoke-worker3 fwrl-smoke-noauth)
# the fixed Ray ports of docker/README.md ("Ports"), as in every recipe
RAY_PORTS=(--object-manager-port=8076 --node-manager-port=8077
           --dashboard-agent-grpc-port=8078 --dashboard-agent-listen-port=52365
           --metrics-export-port=8079 --runtime-env-agent-port=8081
           --min-worker-port=10002 --max-worker-port=10101)
SLURM_DIR="$WORK/slurm"
# Debian's Python (python3-venv), not another python3 earlier on root's PATH (pyenv under
# /root is not readable by the unprivileged host user)
HOST_PYTHON=/usr/bin/python3
SLURM_CTLD_PORT=16817   # not SLURM's default ports: a site's own SLURM may run here
SLURM_D_PORT=16818

# state for the summary and the clean-up; what the parts (subshells) start is noted in files
RESULTS=()
STEP="start"
CREATED_USER=0
STATE="$WORK/state"   # images: the images made; munge, slurm: those daemons were started here

# ------------------------------------------------------------------ output helpers
say() { printf '[smoke %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
header() { printf '\n==================== %s ====================\n' "$*"; }
fail() { printf '[smoke %s] FAILED: %s\n' "$(date +%H:%M:%S)" "$*" >&2; exit 1; }
note_image() { echo "$1" >> "$STATE/images"; }
figure() { printf '%-44s %s\n' "$1" "$2" >> "$FIGURES"; say "figure: $1 = $2"; }
# the lines of a log that match a pattern (the last N), without failing when none do
show() { local n="${3:-20}"; { grep -E "$1" "$2" || true; } | tail -n "$n" | sed 's/^/    | /'; }
want() { case " $PARTS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
# wait_for SECONDS WHAT COMMAND...: poll until COMMAND succeeds
wait_for() {
    local limit="$1" what="$2" start=$SECONDS
    shift 2
    until "$@"; do
        (( SECONDS - start < limit )) || fail "timed out after ${limit} s waiting for $what"
        sleep 1
    done
}
as_user() { runuser -u "$SMOKE_USER" -- env HOME="$WORK/home" "$@"; }
# agent steps stored in a checkpoint (read with weights_only=True, as fwrl does)
ckpt_steps() { "$PY" -c 'import sys, torch; print(torch.load(sys.argv[1], weights_only=True)["agent_steps"])' "$1"; }
# podman with the configuration this script writes (configure_podman)
pm() { podman "$@"; }

# ------------------------------------------------------------------ setup
require_root_on_debian() {
    [ "$(id -u)" -eq 0 ] || fail "run as root (apt-get, podman, SLURM daemons)"
    [ -f /etc/debian_version ] || fail "needs Debian (apt-get, debootstrap)"
}

install_packages() {
    # runc, not crun: crun (podman's first choice) fails on hosts with hybrid cgroups
    # (cgroup v1 controllers beside a v2 mount), as on this kind of VM
    local pkgs=(podman buildah runc conmon netavark aardvark-dns iptables catatonit
                debootstrap ca-certificates python3 python3-venv procps
                slurm-wlm slurm-client munge)
    say "apt-get install ${pkgs[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq > "$LOGS/apt.log" 2>&1 \
        || fail "apt-get update (see $LOGS/apt.log)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${pkgs[@]}" \
        >> "$LOGS/apt.log" 2>&1 || fail "apt-get install (see $LOGS/apt.log)"
    say "installed: $(dpkg-query -W -f '${Package} ${Version}, ' podman buildah runc slurm-wlm munge debootstrap | sed 's/, $//')"
}

# A hard limit as a number ("unlimited" -> the given default).
hard_limit() { local v; v="$(ulimit -H "$1")"; [ "$v" = unlimited ] && echo "$2" || echo "$v"; }

configure_podman() {
    # Podman's container defaults do not fit every host:
    # - RLIMIT_NOFILE 1048576 and RLIMIT_NPROC = kernel.pid_max. A root without
    #   CAP_SYS_RESOURCE (a VM or container host that dropped it) cannot raise a hard
    #   limit, so runc fails with "error setting rlimit type 7 (NOFILE) / 6 (NPROC):
    #   operation not permitted". Podman 4.3's --ulimit host copies Podman's own idea of
    #   the limits (1048576 again), not the real ones, so it does not help; limits at or
    #   below the host's hard limits do. Podman lowers its own NPROC to pid_max at start.
    # - the runtime: runc (see install_packages); cgroupfs: no systemd here.
    local nofile nproc pid_max
    nofile="$(hard_limit -n 1048576)"
    pid_max="$(cat /proc/sys/kernel/pid_max)"
    nproc="$(hard_limit -u "$pid_max")"
    (( nproc > pid_max )) && nproc="$pid_max"
    cat > "$WORK/containers.conf" <<EOF
# written by docker/smoke.sh for this host (docker/README.md, "Podman and Buildah")
[containers]
default_ulimits = ["nofile=${nofile}:${nofile}", "nproc=${nproc}:${nproc}"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
    export CONTAINERS_CONF="$WORK/containers.conf"
    say "podman configuration $CONTAINERS_CONF: runc, cgroupfs, ulimits nofile=$nofile nproc=$nproc"
}

# pip's settings on this host (environment first, then pip's configuration files), which the
# image builds get as build arguments; local folders among them are mounted read-only.
PIP_BUILD=()
PIP_SUMMARY=()
collect_pip_settings() {
    local line key value token path mount
    while IFS='=' read -r key value; do
        [ -n "$value" ] || continue
        if [ "$key" = PIP_CERT ]; then
            [ -f "$value" ] || continue
            PIP_BUILD+=(--secret "id=pip_cert,src=$value")
            PIP_SUMMARY+=("CA bundle $value (secret pip_cert)")
            continue
        fi
        PIP_BUILD+=(--build-arg "$key=$value")
        PIP_SUMMARY+=("$key=$value")
        for token in $value; do
            path="${token#file://}"
            [[ "$path" == /* && -e "$path" ]] || continue
            # a PEP 503 index <root>/simple links to files beside it: mount <root>
            mount="$path"
            [ "$(basename "$path")" = simple ] && mount="$(dirname "$path")"
            PIP_BUILD+=(--volume "$mount:$mount:ro")
        done
    done < <("$HOST_PYTHON" - <<'EOF'
import configparser, os
keys = {"index-url": "PIP_INDEX_URL", "extra-index-url": "PIP_EXTRA_INDEX_URL",
        "find-links": "PIP_FIND_LINKS", "trusted-host": "PIP_TRUSTED_HOST", "cert": "PIP_CERT"}
files = [os.path.join(d, "pip", "pip.conf") for d in os.environ.get("XDG_CONFIG_DIRS", "/etc/xdg").split(":")]
files += ["/etc/pip.conf", os.path.expanduser("~/.pip/pip.conf"), os.path.expanduser("~/.config/pip/pip.conf")]
files += [os.environ["PIP_CONFIG_FILE"]] if os.environ.get("PIP_CONFIG_FILE") else []
found = {}
for path in files:
    parser = configparser.ConfigParser()
    try:
        parser.read(path)
    except configparser.Error:
        continue
    for section in ("global", "install"):
        for key, env in keys.items():
            if parser.has_option(section, key):
                found[env] = " ".join(parser.get(section, key).split())
for env in keys.values():
    if os.environ.get(env):
        found[env] = " ".join(os.environ[env].split())
for env, value in found.items():
    print(f"{env}={value}")
EOF
)
    if [ ${#PIP_SUMMARY[@]} -eq 0 ]; then say "pip settings for the builds: pip's defaults"; fi
    for line in ${PIP_SUMMARY[@]+"${PIP_SUMMARY[@]}"}; do say "pip setting for the builds: $line"; done
}

# The torch the images get: $TORCH, else the version of a torch wheel for the base's
# Python in a local find-links folder (what `pip install torch==X.Y.Z` picks here), else cpu.
choose_torch() {
    if [ -n "${TORCH:-}" ]; then say "torch: --torch $TORCH (from TORCH)"; return; fi
    local tag dirs dir wheel
    tag="$(pm run --rm "$BASE_IMAGE" python3 -c 'import sys; print("cp%d%d" % sys.version_info[:2])')"
    dirs="${PIP_FIND_LINKS:-}"
    for arg in ${PIP_BUILD[@]+"${PIP_BUILD[@]}"}; do
        case "$arg" in PIP_FIND_LINKS=*) dirs="$dirs ${arg#PIP_FIND_LINKS=}" ;; esac
    done
    TORCH=cpu
    for dir in $dirs; do
        dir="${dir#file://}"
        [ -d "$dir" ] || continue
        for wheel in "$dir"/torch-*-"$tag"-*linux*x86_64.whl; do
            [ -f "$wheel" ] || continue
            TORCH="$(basename "$wheel" | sed -E 's/^torch-([0-9.]+).*/\1/')"
            say "torch: --torch $TORCH ($wheel, for the base's $tag)"
            return
        done
    done
    say "torch: --torch cpu (no local torch wheel for $tag; download.pytorch.org must be reachable)"
}

# The base image: Debian's minbase with Python, made by debootstrap and imported.
make_base() {
    if [ -n "${FWRL_SMOKE_BASE:-}" ]; then
        pm image exists "$BASE_IMAGE" || fail "FWRL_SMOKE_BASE=$BASE_IMAGE does not exist"
        say "base image: $BASE_IMAGE (given)"
        return
    fi
    local suite mirror rootfs start
    suite="$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")"
    mirror="${DEBIAN_MIRROR:-$(awk '/^URIs:/ && /debian\/?$/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)}"
    mirror="${mirror:-http://deb.debian.org/debian}"
    rootfs="$WORK/rootfs"
    rm -rf "$rootfs"
    say "debootstrap --variant=minbase $suite from $mirror (log: $LOGS/debootstrap.log)"
    start=$SECONDS
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
        "$suite" "$rootfs" "$mirror" > "$LOGS/debootstrap.log" 2>&1 \
        || fail "debootstrap (see $LOGS/debootstrap.log)"
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -c . | pm import - "$BASE_IMAGE" > /dev/null 2>> "$LOGS/podman.log"
    note_image "$BASE_IMAGE"
    rm -rf "$rootfs"
    figure "base image (debootstrap + import)" "$(( SECONDS - start )) s, $(image_size "$BASE_IMAGE")"
}

image_size() { pm image inspect --format '{{.Size}}' "$1" | awk '{printf "%.2f GB", $1 / 1e9}'; }

# build_image DOCKERFILE TAG LOG: podman build from the repository root, with the base,
# the torch and pip's settings as build arguments
build_image() {
    local dockerfile="$1" tag="$2" log="$3" start
    say "podman build -f $dockerfile -t $tag --build-arg BASE=$BASE_IMAGE --build-arg TORCH=$TORCH (log: $log)"
    start=$SECONDS
    pm rmi -f "$tag" > /dev/null 2>&1 || true   # an image kept from an earlier run (FWRL_SMOKE_KEEP=1)
    pm build --network host --layers=false -f "$REPO/$dockerfile" -t "$tag" \
        --build-arg BASE="$BASE_IMAGE" --build-arg TORCH="$TORCH" --build-arg EXTRAS=ray,atari \
        ${PIP_BUILD[@]+"${PIP_BUILD[@]}"} "$REPO" > "$log" 2>&1 \
        || { tail -n 30 "$log" | sed 's/^/    | /'; fail "podman build of $dockerfile (see $log)"; }
    note_image "$tag"
    show '^install.sh:' "$log"
    BUILD_SECONDS=$(( SECONDS - start ))
}

make_host_python() {
    if [ -n "${FWRL_SMOKE_PYTHON:-}" ]; then
        PY="$FWRL_SMOKE_PYTHON"
        "$PY" -c 'import fwrl, ray, torch' || fail "FWRL_SMOKE_PYTHON=$PY cannot import fwrl, ray and torch"
    else
        say "host virtualenv $WORK/venv: docker/install.sh --torch $TORCH --extras ray (log: $LOGS/host-venv.log)"
        "$HOST_PYTHON" -m venv "$WORK/venv"
        "$REPO/docker/install.sh" --python "$WORK/venv/bin/python" --torch "$TORCH" --extras ray \
            > "$LOGS/host-venv.log" 2>&1 || fail "docker/install.sh into $WORK/venv (see $LOGS/host-venv.log)"
        PY="$WORK/venv/bin/python"
    fi
    BIN="$(dirname "$PY")"
    say "host Python: $PY ($("$PY" -c 'import fwrl, ray, torch; print("fwrl", fwrl.__version__, "ray", ray.__version__, "torch", torch.__version__)'))"
}

make_smoke_user() {
    if ! id "$SMOKE_USER" > /dev/null 2>&1; then
        useradd --system --no-create-home --home-dir "$WORK/home" --shell /usr/sbin/nologin "$SMOKE_USER"
        CREATED_USER=1
    fi
    install -d -o "$SMOKE_USER" -g "$(id -gn "$SMOKE_USER")" -m 0755 "$WORK/home" "$RUNS" "$WORK/jobs"
    USER_IDS="$(id -u "$SMOKE_USER"):$(id -g "$SMOKE_USER")"
    say "host user $SMOKE_USER ($USER_IDS) owns $RUNS"
}

# ------------------------------------------------------------------ part a: the image
part_image() {
    local run="$RUNS/quickstart" start first rc success
    rm -rf "$run"
    say "podman run --user $USER_IDS -v $RUNS:/work/runs $CPU_IMAGE fwrl train --preset quickstart"
    start="$(date +%s.%N)"
    pm run -d --name fwrl-smoke-train --user "$USER_IDS" -v "$RUNS:/work/runs" "$CPU_IMAGE" \
        fwrl train --preset quickstart --name quickstart --runs-dir /work/runs > /dev/null 2>> "$LOGS/podman.log" \
        || { tail -n 5 "$LOGS/podman.log"; fail "podman run fwrl-smoke-train"; }
    # fwrl writes the first checkpoint right after the first update
    wait_for 600 "the first checkpoint" test -f "$run/checkpoint.pt"
    first="$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')"
    figure "time to first update in a container" "$first s (podman run to the first checkpoint)"
    rc="$(timeout 1800 podman wait fwrl-smoke-train)" || fail "the training container did not end in 30 minutes"
    pm logs fwrl-smoke-train > "$LOGS/a-train.log" 2>&1
    pm rm fwrl-smoke-train > /dev/null
    show '^run |^fwrl train' "$LOGS/a-train.log"
    [ "$rc" -eq 0 ] || fail "training in the container exited with $rc (see $LOGS/a-train.log)"
    grep -q 'stopped by budget' "$LOGS/a-train.log" || fail "the quickstart did not run to its budget"

    say "what the container wrote, as the host sees it:"
    find "$run" -printf '%M %u:%g %6s %P\n' | sed 's/^/    | /'
    [ -z "$(find "$run" ! -user "$SMOKE_USER")" ] || fail "files in $run not owned by $SMOKE_USER"
    say "fwrl evaluate on the host, as $SMOKE_USER"
    as_user "$BIN/fwrl" evaluate "$run" --episodes 100 > "$LOGS/a-evaluate.log" 2>&1 \
        || { cat "$LOGS/a-evaluate.log"; fail "fwrl evaluate as $SMOKE_USER"; }
    show '│|wrote' "$LOGS/a-evaluate.log"
    success="$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["aggregates"][0]["success"])' "$run/evaluation.json")"
    "$PY" -c "import sys; sys.exit(0 if $success >= 0.9 else 1)" \
        || fail "the quickstart's evaluated success is $success (< 0.9)"
    as_user rm -r "$run" || fail "$SMOKE_USER cannot delete $run"
    [ ! -e "$run" ] || fail "$run still exists"
    say "the quickstart trained in the image (success $success); $SMOKE_USER read and deleted its run folder"
}

# ------------------------------------------------------------------ part b: Ray in containers
RAY_AUTH=()
ray_setup_auth() {
    local version
    version="$(pm run --rm "$CPU_IMAGE" python -c 'import ray; print(ray.__version__)')"
    if "$PY" -c "import sys; v = tuple(int(x) for x in '$version'.split('.')[:2]); sys.exit(0 if v >= (2, 52) else 1)"; then
        # one token for every node and the driver, as a read-only file (not in `podman inspect`)
        if [ ! -f "$WORK/ray_auth_token" ]; then
            "$HOST_PYTHON" -c 'import secrets; print(secrets.token_hex(32))' > "$WORK/ray_auth_token"
            chown "$SMOKE_USER" "$WORK/ray_auth_token"
            chmod 0400 "$WORK/ray_auth_token"
        fi
        RAY_AUTH=(-v "$WORK/ray_auth_token:/run/secrets/ray_auth_token:ro"
                  -e RAY_AUTH_MODE=token -e RAY_AUTH_TOKEN_PATH=/run/secrets/ray_auth_token)
        say "Ray $version in the image: token authentication (RAY_AUTH_MODE=token, RAY_AUTH_TOKEN_PATH)"
    else
        RAY_AUTH=()
        say "Ray $version in the image has no token authentication (Ray >= 2.52): the cluster runs without it; keep its ports private (docker/README.md, Security)"
    fi
}

ray_node() {  # ray_node NAME ray start ARGS...: a Ray node in its own container
    local name="$1"
    shift
    pm rm -f "$name" > /dev/null 2>&1 || true
    pm run -d --name "$name" --hostname "$name" --network "$NET" --user "$USER_IDS" \
        --shm-size=1g -e RAY_USAGE_STATS_ENABLED=0 ${RAY_AUTH[@]+"${RAY_AUTH[@]}"} \
        -v "$RUNS:/work/runs" "$CPU_IMAGE" "$@" "${RAY_PORTS[@]}" > /dev/null 2>> "$LOGS/podman.log" \
        || { tail -n 5 "$LOGS/podman.log"; fail "podman run $name"; }
}

ray_start_cluster() {
    pm network exists "$NET" || pm network create "$NET" > /dev/null
    ray_setup_auth
    say "head container $HEAD: ray start --head --num-cpus=0 (no env worker there)"
    ray_node "$HEAD" ray start --head --block --port=6379 --num-cpus=0 --include-dashboard=false \
        --object-store-memory=300000000
    ray_add_worker fwrl-smoke-worker1
}

ray_add_worker() {
    local cpus
    cpus="$(nproc)"
    say "worker container $1: ray start --address=$HEAD:6379 --resources='{\"envs\": $cpus}'"
    ray_node "$1" ray start --block --address="$HEAD:6379" --num-cpus="$cpus" \
        --resources="{\"envs\": $cpus}" --object-store-memory=300000000
}

ray_alive_nodes() {
    pm exec "$HEAD" python -c "import ray; ray.init(address='auto', logging_level='error'); print(sum(n['Alive'] for n in ray.nodes()))" 2>/dev/null || echo 0
}
nodes_at_least() { [ "$(ray_alive_nodes)" -ge "$1" ]; }
ray_wait_nodes() { wait_for 180 "$1 alive Ray nodes" nodes_at_least "$1"; }
# wait_pid PID SECONDS WHAT: wait for a background command, its exit status in $PID_RC
wait_pid() {
    local start=$SECONDS
    while kill -0 "$1" 2> /dev/null; do
        if (( SECONDS - start >= $2 )); then kill "$1" 2> /dev/null; fail "$3 did not end within $2 s"; fi
        sleep 2
    done
    PID_RC=0
    wait "$1" || PID_RC=$?
}

ray_check_token_refused() {
    [ ${#RAY_AUTH[@]} -gt 0 ] || return 0
    local log="$LOGS/b-noauth.log"
    say "a client without the token: ray.init(address='$HEAD:6379') must be refused"
    if timeout 120 podman run --rm --name fwrl-smoke-noauth --network "$NET" "$CPU_IMAGE" \
        python -c "import ray; ray.init(address='$HEAD:6379', logging_level='error')" > "$log" 2>&1; then
        fail "a client without the token joined the cluster"
    fi
    grep -q 'Authentication token is missing or incorrect' "$log" || fail "no authentication error (see $log)"
    show 'Authentication token' "$log" 1
}

# the last progress line of a training log ("N / M steps ..."), shortened
progress() { { grep -E '^[0-9,]+ / [0-9,]+ ' "$1" || true; } | tail -n 1 | cut -c1-70; }

container_ip() { pm inspect --format "{{(index .NetworkSettings.Networks \"$NET\").IPAddress}}" "$1"; }

# node ids the log says workers of a given life range run on ("ray worker W (life L) runs on node ID (IP, ...")
nodes_of_lives() {
    awk -v lo="$2" -v hi="$3" '/ray worker .* runs on node/ {
        life = $6; sub(/\)/, "", life); ip = $11; gsub(/[(,]/, "", ip)
        if (life + 0 >= lo && life + 0 <= hi) print "node " $10 " (" ip ")" }' "$1" | sort -u
}

part_ray() {
    local log="$LOGS/b-train.log" run="$RUNS/ray-quickstart" pid rc old new ip2
    rm -rf "$run"
    ray_start_cluster
    ray_wait_nodes 2
    say "cluster up: $(ray_alive_nodes) nodes"
    pm exec "$HEAD" ray status 2>/dev/null | grep -E 'envs|CPU|node_' | sed 's/^/    | /' || true
    ray_check_token_refused

    say "fwrl train --backend ray --ray-address auto on the head (log: $log)"
    pm exec "$HEAD" fwrl train --backend ray --ray-address auto --preset quickstart \
        --total-steps 200000 --name ray-quickstart --runs-dir /work/runs > "$log" 2>&1 &
    pid=$!
    wait_for 300 "training on the Ray cluster" test -f "$run/checkpoint.pt"
    sleep 10
    old="$(nodes_of_lives "$log" 0 0)"
    say "training runs on $old: $(progress "$log")"
    say "podman kill fwrl-smoke-worker1: the env node is lost mid-run"
    pm kill fwrl-smoke-worker1 > /dev/null
    wait_for 180 "fwrl to restart the lost workers" grep -q 'restarts: actor died' "$log"
    ray_add_worker fwrl-smoke-worker2
    ip2="$(container_ip fwrl-smoke-worker2)"
    wait_pid "$pid" 900 "fwrl train on the Ray cluster"
    rc=$PID_RC
    show 'runs on node|restarts: |marked dead|^run ' "$log" 30
    [ "$rc" -eq 0 ] || fail "fwrl train on the Ray cluster exited with $rc (see $log)"
    grep -q 'stopped by budget' "$log" || fail "the Ray run did not reach its budget"
    new="$(nodes_of_lives "$log" 1 99 | tail -n 1)"
    if [ -z "$new" ] || [ "$new" = "$old" ]; then fail "no worker was restarted on another node"; fi
    case "$new" in *"($ip2)"*) ;; *) fail "the restarted workers are not on fwrl-smoke-worker2 ($ip2): $new" ;; esac
    say "the workers of the lost node were restarted on fwrl-smoke-worker2, $new; the run finished: $(ckpt_steps "$run/checkpoint.pt") steps"
    pm rm -f fwrl-smoke-worker1 > /dev/null
}

# b2: no env node at all: the pool gives up after start_timeout (300 s) and the run stops
# cleanly with a checkpoint (docker/README.md, "Faults"); a new node and --resume continue it.
part_ray_lost() {
    local log="$LOGS/b2-train.log" run="$RUNS/ray-lost" pid rc lost_at steps resumed
    rm -rf "$run"
    if pm container exists "$HEAD"; then ray_setup_auth; else ray_start_cluster; ray_wait_nodes 2; fi
    local worker
    worker="$(pm ps --format '{{.Names}}' | { grep -E '^fwrl-smoke-worker' || true; } | tail -n 1)"
    [ -n "$worker" ] || { ray_add_worker fwrl-smoke-worker2; worker=fwrl-smoke-worker2; ray_wait_nodes 2; }
    say "fwrl train --backend ray on the head, the only env node is $worker (log: $log)"
    pm exec "$HEAD" fwrl train --backend ray --ray-address auto --preset quickstart \
        --name ray-lost --runs-dir /work/runs > "$log" 2>&1 &
    pid=$!
    wait_for 300 "training on the Ray cluster" test -f "$run/checkpoint.pt"
    sleep 10
    say "training runs: $(progress "$log")"
    say "podman kill $worker: no env node is left; fwrl should stop cleanly after 300 s"
    pm kill "$worker" > /dev/null
    pm rm -f "$worker" > /dev/null
    lost_at="$(date +%s)"
    wait_pid "$pid" 900 "fwrl train without env nodes"
    rc=$PID_RC
    say "fwrl train exited with $rc after $(( $(date +%s) - lost_at )) s without env nodes"
    show 'restarts: |no Ray env worker|^run |rror' "$log" 12
    [ "$rc" -ne 0 ] || fail "fwrl train should report the lost workers with a non-zero exit"
    grep -q 'no Ray env worker has been running for 300 s' "$log" || fail "no 'workers lost' message (see $log)"
    (( $(stat -c %Y "$run/checkpoint.pt") >= lost_at )) || fail "no checkpoint was written at the stop"
    steps="$(ckpt_steps "$run/checkpoint.pt")"
    say "final checkpoint (written at the stop): $steps agent steps"

    ray_add_worker fwrl-smoke-worker3
    ray_wait_nodes 2
    say "a new env node is up: fwrl train --resume --name ray-lost --total-steps $(( steps + 30000 ))"
    pm exec "$HEAD" fwrl train --backend ray --ray-address auto --resume --name ray-lost \
        --runs-dir /work/runs --total-steps $(( steps + 30000 )) > "$LOGS/b2-resume.log" 2>&1 \
        || { tail -n 20 "$LOGS/b2-resume.log"; fail "the resumed run failed"; }
    show 'runs on node|^run ' "$LOGS/b2-resume.log" 4
    resumed="$(ckpt_steps "$run/checkpoint.pt")"
    (( resumed > steps )) || fail "the resumed run did not go past $steps steps"
    say "the run stopped cleanly with its checkpoint ($steps steps) and resumed on the new node to $resumed"
}

ray_stop_cluster() {
    local c
    for c in "$HEAD" fwrl-smoke-worker1 fwrl-smoke-worker2 fwrl-smoke-worker3; do
        pm rm -f -t 5 "$c" > /dev/null 2>&1 || true
    done
    if pm network exists "$NET" 2> /dev/null; then pm network rm "$NET" > /dev/null 2>&1 || true; fi
}

# ------------------------------------------------------------------ part c: SLURM
start_munge() {
    if [ -S /run/munge/munge.socket.2 ] && munge -n > /dev/null 2>&1; then
        say "munged already runs"
        return
    fi
    [ -f /etc/munge/munge.key ] || runuser -u munge -- mungekey --create
    install -d -o munge -g munge -m 0755 /run/munge
    runuser -u munge -- /usr/sbin/munged
    touch "$STATE/munge"
    wait_for 20 "munged" test -S /run/munge/munge.socket.2
    munge -n | unmunge > /dev/null || fail "munge does not work"
    say "munged started"
}

start_slurm() {
    local node cpus mem
    node="$(hostname -s)"
    cpus="$(nproc)"
    mem="$(slurmd -C | sed -nE 's/.*RealMemory=([0-9]+).*/\1/p')"
    rm -rf "$SLURM_DIR"
    install -d -o slurm -g slurm "$SLURM_DIR" "$SLURM_DIR/state" "$SLURM_DIR/log"
    install -d "$SLURM_DIR/spool"
    cat > "$SLURM_DIR/slurm.conf" <<EOF
# a one-node cluster on this machine, written by docker/smoke.sh
ClusterName=fwrlsmoke
SlurmctldHost=${node}(127.0.0.1)
SlurmctldPort=${SLURM_CTLD_PORT}
SlurmdPort=${SLURM_D_PORT}
SlurmUser=slurm
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=${SLURM_DIR}/state
SlurmdSpoolDir=${SLURM_DIR}/spool
SlurmctldPidFile=${SLURM_DIR}/slurmctld.pid
SlurmdPidFile=${SLURM_DIR}/slurmd.pid
SlurmctldLogFile=${SLURM_DIR}/log/slurmctld.log
SlurmdLogFile=${SLURM_DIR}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
KillWait=30
NodeName=${node} NodeAddr=127.0.0.1 CPUs=${cpus} RealMemory=${mem} State=UNKNOWN
PartitionName=smoke Nodes=${node} Default=YES MaxTime=INFINITE State=UP
EOF
    export SLURM_CONF="$SLURM_DIR/slurm.conf"
    touch "$STATE/slurm"
    slurmctld -f "$SLURM_CONF"
    slurmd -f "$SLURM_CONF"
    wait_for 60 "the SLURM node to be idle" bash -c "sinfo -h -o %t 2>/dev/null | grep -q idle"
    say "SLURM up: $(sinfo -h -o '%P %a %D nodes %t, %c CPUs')"
}

# submit NAME [sbatch options...]: docker/slurm-train.sh for the quickstart, as the host user
submit() {
    local name="$1"
    shift
    as_user env PATH="$BIN:/usr/bin:/bin" SLURM_CONF="$SLURM_CONF" RUNS_DIR="$RUNS" \
        sbatch --parsable --chdir="$WORK/jobs" --nodes=1 --cpus-per-task="$(nproc)" --gres=none "$@" \
        "$REPO/docker/slurm-train.sh" --preset quickstart --name "$name"
}

job_field() { scontrol show job -o "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p"; }
wait_job() {  # wait_job ID SECONDS: until the job has left the queue, then print its state
    local start=$SECONDS state
    while :; do
        state="$(job_field "$1" JobState)"
        case "$state" in PENDING|RUNNING|CONFIGURING|COMPLETING|"") ;; *) break ;; esac
        (( SECONDS - start < $2 )) || fail "job $1 still $state after $2 s"
        sleep 3
    done
    echo "$state $(job_field "$1" ExitCode)"
}

# the steps the last "run ...: N agent steps" line of a job's output reports
# the agent steps of fwrl train's last line: "run DIR: 30,400 / 300,000 agent steps (10.1%), ..." or, past
# the budget, "run DIR: 300,160 agent steps: budget 300,000 reached ..."
reported_steps() { sed -nE 's/^run [^:]*: ([0-9,]+)( \/ [0-9,]+)? agent steps.*/\1/p' "$1" | tail -n 1 | tr -d ,; }

part_slurm() {
    local job out state run steps
    start_munge
    start_slurm

    say "c1: sbatch docker/slurm-train.sh --preset quickstart (one node, CPU, --gres=none) as $SMOKE_USER"
    rm -rf "$RUNS/slurm-quickstart"
    job="$(submit slurm-quickstart)"
    state="$(wait_job "$job" 1200)"
    out="$WORK/jobs/fwrl-$job.out"
    cp "$out" "$LOGS/c1-job.out"
    say "job $job: $state"
    show '^fwrl:|^run ' "$out"
    [ "$state" = "COMPLETED 0:0" ] || fail "job $job ended $state (see $out)"
    run="$RUNS/slurm-quickstart"
    for f in config.yaml metrics.csv checkpoint.pt; do [ -f "$run/$f" ] || fail "$run/$f is missing"; done
    [ -z "$(find "$run" ! -user "$SMOKE_USER")" ] || fail "files in $run not owned by $SMOKE_USER"
    steps="$(ckpt_steps "$run/checkpoint.pt")"
    (( steps >= 300000 )) || fail "the checkpoint has $steps steps, the quickstart's budget is 300000"
    say "run folder: $(find "$run" -mindepth 1 -maxdepth 1 -printf '%f ' | sort); checkpoint at $steps steps"

    slurm_cancel_check c2 slurm-cancel "scancel JOB" ""
    slurm_cancel_check c3 slurm-batch-signal "scancel --batch --signal=TERM JOB" "--batch --signal=TERM"
}

# slurm_cancel_check TAG NAME TITLE SCANCEL_OPTIONS: a job stopped mid-run leaves a checkpoint
slurm_cancel_check() {
    local tag="$1" name="$2" title="$3" opts="$4" job out state run steps reported before
    run="$RUNS/$name"
    rm -rf "$run"
    say "$tag: submit, then $title once training runs"
    job="$(submit "$name")"
    wait_for 300 "job $job to train" test -f "$run/checkpoint.pt"
    sleep 8
    before="$(ckpt_steps "$run/checkpoint.pt")"
    # shellcheck disable=SC2086  # the options are words
    scancel $opts "$job"
    state="$(wait_job "$job" 120)"
    out="$WORK/jobs/fwrl-$job.out"
    cp "$out" "$LOGS/$tag-job.out"
    say "job $job: $state"
    show '^fwrl:|^run |CANCELLED|SIGTERM received' "$out"
    grep -q 'stopped by signal SIGTERM' "$out" || fail "fwrl did not stop on SIGTERM (see $out)"
    steps="$(ckpt_steps "$run/checkpoint.pt")"
    reported="$(reported_steps "$out")"
    [ "$steps" = "$reported" ] || fail "the checkpoint has $steps steps, fwrl reported $reported at its stop"
    (( steps > before )) || fail "no checkpoint was written at the stop ($steps steps, as before)"
    if [ -n "$opts" ]; then
        grep -q 'fwrl: got SIGTERM, stopping the learner' "$out" || fail "slurm-train.sh did not forward the signal"
    fi
    say "the stopped job left its final checkpoint: $steps agent steps (the periodic one had $before)"
}

# the daemons this script started, by their pid files (SLURM's are under $SLURM_DIR)
stop_slurm() {
    [ -f "$STATE/slurm" ] || return 0
    local pid f
    export SLURM_CONF="$SLURM_DIR/slurm.conf"
    scancel -u "$SMOKE_USER" 2> /dev/null || true
    scontrol shutdown > /dev/null 2>&1 || true
    for f in "$SLURM_DIR/slurmd.pid" "$SLURM_DIR/slurmctld.pid"; do
        [ -f "$f" ] || continue
        pid="$(cat "$f")"
        for _ in $(seq 30); do kill -0 "$pid" 2> /dev/null || break; sleep 1; done
        kill "$pid" 2> /dev/null || true
    done
    rm -f "$STATE/slurm"
}

stop_munge() {
    [ -f "$STATE/munge" ] || return 0
    if [ -f /run/munge/munged.pid ]; then kill "$(cat /run/munge/munged.pid)" 2> /dev/null || true; fi
    rm -f "$STATE/munge"
}

# ------------------------------------------------------------------ part d: the CUDA image
part_cuda() {
    build_image docker/Dockerfile "$CUDA_IMAGE" "$LOGS/d-build-cuda.log"
    figure "CUDA image build (docker/Dockerfile)" "$BUILD_SECONDS s"
    figure "CUDA image size" "$(image_size "$CUDA_IMAGE")"
    say "podman run $CUDA_IMAGE python -c 'import fwrl, torch'"
    pm run --rm "$CUDA_IMAGE" python -c "import fwrl, torch; print('    | fwrl', fwrl.__version__, 'torch', torch.__version__, 'CUDA available:', torch.cuda.is_available())" \
        || fail "import fwrl, torch in $CUDA_IMAGE"
    say "built from the local base $BASE_IMAGE with --torch $TORCH; no GPU here runs it"
}

# ------------------------------------------------------------------ dmlab (opt-in)
part_dmlab() {
    local ubuntu="${FWRL_SMOKE_UBUNTU:-docker.io/library/ubuntu:22.04}"
    if ! pm image exists "$ubuntu" && ! timeout 60 podman pull -q "$ubuntu" > /dev/null 2>&1; then
        echo "needs the image $ubuntu (set FWRL_SMOKE_UBUNTU), which cannot be pulled here" > "$WORK/skip"
        return 0
    fi
    if ! timeout 20 "$HOST_PYTHON" -c 'import urllib.request; urllib.request.urlopen("https://github.com", timeout=15)' 2>/dev/null; then
        echo "needs github.com (bazelisk, DeepMind Lab's source), which this machine cannot reach" > "$WORK/skip"
        return 0
    fi
    pm build --network host -f "$REPO/docker/Dockerfile.dmlab" -t "$DMLAB_IMAGE" --build-arg UBUNTU="$ubuntu" \
        --build-arg TORCH="$TORCH" ${PIP_BUILD[@]+"${PIP_BUILD[@]}"} "$REPO" > "$LOGS/dmlab-build.log" 2>&1 \
        || fail "podman build of docker/Dockerfile.dmlab (see $LOGS/dmlab-build.log)"
    note_image "$DMLAB_IMAGE"
}

# ------------------------------------------------------------------ running the parts
# run_part KEY TITLE FUNCTION: in a subshell (its own `set -e`), then PASS/FAIL/SKIP
run_part() {
    local key="$1" title="$2" fn="$3" start=$SECONDS rc=0 reason
    if ! want "$key"; then return; fi
    header "part $key: $title"
    rm -f "$WORK/skip"
    ( "$fn" ) &
    wait $! || rc=$?
    if [ "$rc" -eq 0 ] && [ -f "$WORK/skip" ]; then
        reason="$(cat "$WORK/skip")"
        RESULTS+=("SKIP  $key: $title ($reason)")
        say "part $key: SKIP ($reason)"
    elif [ "$rc" -eq 0 ]; then
        RESULTS+=("PASS  $key: $title ($(( SECONDS - start )) s)")
        say "part $key: PASS"
    else
        RESULTS+=("FAIL  $key: $title ($(( SECONDS - start )) s; logs in $LOGS)")
        say "part $key: FAIL"
    fi
}

summary() {
    local line failed=0
    header "summary"
    if [ -s "$FIGURES" ]; then echo "figures:"; sed 's/^/  /' "$FIGURES"; fi
    for line in ${RESULTS[@]+"${RESULTS[@]}"}; do
        echo "$line"
        case "$line" in FAIL*) failed=1 ;; esac
    done
    if [ "$STEP" != "done" ]; then
        echo "FAIL  setup: stopped at '$STEP' (logs in $LOGS)"
        failed=1
    fi
    if [ "$failed" -eq 0 ]; then echo "SMOKE: PASS"; else echo "SMOKE: FAIL"; fi
    return "$failed"
}

cleanup() {
    local rc=$? c img
    set +e
    trap - EXIT INT TERM
    summary || rc=1
    say "clean-up"
    stop_slurm
    stop_munge
    for c in "${CONTAINERS[@]}"; do podman rm -f -t 5 "$c" > /dev/null 2>&1; done
    ray_stop_cluster
    if [ "$KEEP" != 1 ]; then
        if [ -f "$STATE/images" ]; then
            while read -r img; do podman rmi -f "$img" > /dev/null 2>&1; done < "$STATE/images"
            rm -f "$STATE/images"
        fi
        rm -rf "${WORK:?}/venv" "$WORK/runs" "$WORK/rootfs" "$WORK/jobs" "${WORK:?}/home" "$WORK/ray_auth_token" \
            "$SLURM_DIR/spool" "$SLURM_DIR/state"
        [ "$CREATED_USER" -eq 1 ] && userdel "$SMOKE_USER" 2> /dev/null
    else
        say "kept (FWRL_SMOKE_KEEP=1): images $(tr '\n' ' ' < "$STATE/images" 2> /dev/null), $WORK"
    fi
    say "logs: $LOGS"
    exit "$rc"
}

main() {
    require_root_on_debian
    mkdir -p "$LOGS" "$STATE"
    cd "$WORK"   # a folder of our own: Python puts the working folder first on sys.path
    : > "$FIGURES"
    trap cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    header "setup: $(. /etc/os-release && echo "$PRETTY_NAME"), $(nproc) CPUs, $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo 'no git') ($REPO)"
    STEP="packages";       install_packages
    STEP="podman config";  configure_podman
    for c in "${CONTAINERS[@]}"; do pm rm -f "$c" > /dev/null 2>&1 || true; done
    STEP="pip settings";   collect_pip_settings
    STEP="base image";     make_base
    STEP="torch";          choose_torch
    if want image || want ray || want ray-lost; then
        STEP="CPU image";  build_image docker/Dockerfile.cpu "$CPU_IMAGE" "$LOGS/build-cpu.log"
        figure "CPU image build (docker/Dockerfile.cpu)" "$BUILD_SECONDS s"
        figure "CPU image size" "$(image_size "$CPU_IMAGE")"
    fi
    STEP="host Python";    make_host_python
    STEP="host user";      make_smoke_user
    STEP="done"
    run_part image "quickstart trained in the image, evaluated and deleted on the host" part_image
    run_part ray "Ray cluster of containers, worker node killed mid-run" part_ray
    run_part ray-lost "every env node lost: clean stop with a checkpoint, then --resume" part_ray_lost
    ray_stop_cluster
    run_part slurm "one-node SLURM cluster: slurm-train.sh, scancel mid-run" part_slurm
    run_part cuda "CUDA Dockerfile from a local base" part_cuda
    run_part dmlab "DeepMind Lab Dockerfile" part_dmlab
}

main "$@"
