#!/bin/bash
# SLURM batch script: a Ray cluster inside one allocation, then `fwrl train` on it.
# The first LEARNER_NODES nodes run the learners (they need the GPUs; the first also
# runs the Ray head); every other node runs a Ray node offering the `envs` resource,
# where the env workers go. An allocation with no node beyond the learner nodes (one
# node) runs the env workers on the head node.
#
#   sbatch docker/slurm-train.sh --preset quickstart --name quickstart-ray
#   sbatch --nodes=1 --cpus-per-task="$(nproc)" --gres=none docker/slurm-train.sh \
#       --preset quickstart --name quickstart-cpu            # one CPU node, no GPU
#   LEARNER_NODES=2 GPUS_PER_NODE=4 sbatch --nodes=6 --gres=gpu:4 docker/slurm-train.sh \
#       --preset rfwp-atari --name pong-8 --num-workers 256     # 8 learner ranks (torchrun)
#
# One learner (LEARNER_NODES=1, GPUS_PER_NODE=1, the default) runs `fwrl train` here.
# More run as torch.distributed ranks started by torchrun on every learner node
# (rendezvous on the first node, port RDZV_PORT); each rank takes its share of
# --num-workers as Ray actors and a GPU of its node; gradients are summed across ranks.
# Extra arguments are passed to `fwrl train`. Needs fwrl[ray] installed on every
# node (docker/install.sh into a shared virtualenv, or the images under docker/), and
# --runs-dir on a file system every learner node sees. Ports: docker/README.md. The Ray
# token is made per job and lives in its environment. RAY_HEAD_IP overrides the address
# the head is reached at (default: the first address `hostname -I` gives on the head).
#
# Stopping: `scancel` sends SIGCONT and SIGTERM to every process of the job, and SIGKILL
# KillWait seconds later (slurm.conf, 30 s by default); the time limit does the same.
# fwrl stops on SIGTERM and writes its final checkpoint; this script traps SIGTERM and
# SIGINT, forwards them to `fwrl train` (or to the torchrun step) and waits for it before
# it stops Ray, because the batch step's remaining processes are killed as soon as this
# script exits. --signal=B:TERM@300 asks for that SIGTERM 5 minutes before the time
# limit (to this script only), so that the checkpoint is written well before the kill;
# `fwrl train --resume --name <run>` continues.
#SBATCH --job-name=fwrl-train
#SBATCH --nodes=3
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=32
#SBATCH --gres=gpu:1
#SBATCH --time=24:00:00
#SBATCH --signal=B:TERM@300
#SBATCH --output=fwrl-%j.out
set -euo pipefail

RAY_PORT="${RAY_PORT:-6379}"
RDZV_PORT="${RDZV_PORT:-29500}"
LEARNER_NODES="${LEARNER_NODES:-1}"
GPUS_PER_NODE="${GPUS_PER_NODE:-1}"
RUNS_DIR="${RUNS_DIR:-runs}"
CPUS="${SLURM_CPUS_PER_TASK:-$(nproc)}"
PORT_FLAGS=(--object-manager-port=8076 --node-manager-port=8077
            --dashboard-agent-grpc-port=8078 --dashboard-agent-listen-port=52365
            --metrics-export-port=8079 --runtime-env-agent-port=8081
            --min-worker-port=10002 --max-worker-port=10101)

# token authentication for every Ray process of this job (srun passes the environment on)
export RAY_AUTH_MODE=token
export RAY_AUTH_TOKEN="${RAY_AUTH_TOKEN:-$(python3 -c 'import secrets; print(secrets.token_hex(32))')}"
export RAY_USAGE_STATS_ENABLED=0

mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
HEAD="${NODES[0]}"
ENV_NODES=("${NODES[@]:$LEARNER_NODES}")
# `hostname --ip-address` resolves the host name, which is 127.0.1.1 on many Debian and
# Ubuntu machines; `hostname -I` lists the addresses of the network interfaces.
HEAD_IP="${RAY_HEAD_IP:-$(srun --nodes=1 --ntasks=1 --overlap -w "$HEAD" hostname -I | awk '{print $1}')}"
ADDRESS="${HEAD_IP}:${RAY_PORT}"
TMP="/tmp/ray-${SLURM_JOB_ID}"   # per-job Ray temp dir (sessions, logs, sockets)

# The Ray nodes run as background job steps (srun ... &); stop them when this script ends.
# shellcheck disable=SC2317  # (called by the EXIT trap)
stop_ray() {
    local steps
    mapfile -t steps < <(jobs -p)
    if [ "${#steps[@]}" -gt 0 ]; then
        kill "${steps[@]}" 2>/dev/null || true
        wait "${steps[@]}" 2>/dev/null || true
    fi
}
trap stop_ray EXIT

if [ "${#ENV_NODES[@]}" -eq 0 ]; then
    # no env node in the allocation: the head node offers the envs (and CPUs) itself
    HEAD_RESOURCES=(--num-cpus="$CPUS" --resources="{\"envs\": $CPUS}")
else
    HEAD_RESOURCES=(--num-cpus=0)
fi
echo "fwrl: Ray head on $HEAD ($ADDRESS), learner nodes: ${NODES[*]:0:$LEARNER_NODES}, env nodes: ${ENV_NODES[*]:-none, the head offers envs}"
srun --nodes=1 --ntasks=1 --overlap -w "$HEAD" \
    ray start --head --block --node-ip-address="$HEAD_IP" --port="$RAY_PORT" \
        --include-dashboard=false "${HEAD_RESOURCES[@]}" --temp-dir="$TMP" "${PORT_FLAGS[@]}" &

for _ in $(seq 60); do
    ray status --address "$ADDRESS" > /dev/null 2>&1 && break
    sleep 2
done

for node in ${ENV_NODES[@]+"${ENV_NODES[@]}"}; do
    srun --nodes=1 --ntasks=1 --overlap -w "$node" \
        ray start --block --address="$ADDRESS" --num-cpus="$CPUS" \
            --resources="{\"envs\": $CPUS}" --temp-dir="$TMP" "${PORT_FLAGS[@]}" &
done

# wait until every env node has joined (nodes = 1 head + the env nodes)
want=$(( ${#ENV_NODES[@]} + 1 ))
have=0
for _ in $(seq 90); do
    have="$(python3 -c "import ray; ray.init(address='$ADDRESS', logging_level='error'); print(sum(n['Alive'] for n in ray.nodes()))" 2>/dev/null || echo 0)"
    [ "$have" -ge "$want" ] && break
    sleep 2
done
echo "fwrl: $have of $want Ray nodes up"

# The learner(s), run with exec in a background subshell so that $! is their process.
learners() {
    if [ "$LEARNER_NODES" -eq 1 ] && [ "$GPUS_PER_NODE" -eq 1 ]; then
        # one learner: this batch script runs on the first node
        exec fwrl train --backend ray --ray-address "$ADDRESS" --runs-dir "$RUNS_DIR" "$@"
    else
        # learner ranks: torchrun on each learner node, one rank per GPU, rendezvous on the first node
        exec srun --nodes="$LEARNER_NODES" --ntasks-per-node=1 --overlap -w "$(IFS=,; echo "${NODES[*]:0:$LEARNER_NODES}")" \
            torchrun --nnodes="$LEARNER_NODES" --nproc-per-node="$GPUS_PER_NODE" \
                --rdzv-backend=c10d --rdzv-endpoint="$HEAD_IP:$RDZV_PORT" --rdzv-id="fwrl-$SLURM_JOB_ID" \
                -m fwrl train --backend ray --ray-address "$ADDRESS" --runs-dir "$RUNS_DIR" "$@"
    fi
}
learners "$@" &
LEARNER_PID=$!

# SIGTERM / SIGINT (scancel, the time limit, --signal=B:TERM@...): pass it on to the
# learner, then keep waiting until it has written its checkpoint and exited.
# shellcheck disable=SC2317  # (called by the traps)
forward() { echo "fwrl: got SIG$1, stopping the learner (it writes a final checkpoint)"; kill -s "$1" "$LEARNER_PID" 2>/dev/null || true; }
trap 'forward TERM' TERM
trap 'forward INT' INT
status=0
while :; do
    wait "$LEARNER_PID" && status=0 || status=$?
    kill -0 "$LEARNER_PID" 2>/dev/null || break   # it exited (wait also returns when a trap ran)
done
echo "fwrl: learner exited with status $status"
exit "$status"
