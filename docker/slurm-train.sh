#!/bin/bash
# SLURM batch script: a Ray cluster inside one allocation, then `fwrl train` on it.
# The first LEARNER_NODES nodes run the learners (they need the GPUs; the first also
# runs the Ray head); every other node runs a Ray node offering the `envs` resource,
# where the env workers go.
#
#   sbatch docker/slurm-train.sh --preset quickstart --name quickstart-ray
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
# token is made per job and lives in its environment.
#SBATCH --job-name=fwrl-train
#SBATCH --nodes=3
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=32
#SBATCH --gres=gpu:1
#SBATCH --time=24:00:00
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
HEAD_IP="$(srun --nodes=1 --ntasks=1 --overlap -w "$HEAD" hostname --ip-address | awk '{print $1}')"
ADDRESS="${HEAD_IP}:${RAY_PORT}"
TMP="/tmp/ray-${SLURM_JOB_ID}"   # per-job Ray temp dir (sessions, logs, sockets)

cleanup() { kill $(jobs -p) 2>/dev/null || true; }
trap cleanup EXIT

echo "fwrl: Ray head on $HEAD ($ADDRESS), learner nodes: ${NODES[*]:0:$LEARNER_NODES}, env nodes: ${NODES[*]:$LEARNER_NODES}"
srun --nodes=1 --ntasks=1 --overlap -w "$HEAD" \
    ray start --head --block --node-ip-address="$HEAD_IP" --port="$RAY_PORT" \
        --include-dashboard=false --num-cpus=0 --temp-dir="$TMP" "${PORT_FLAGS[@]}" &

for _ in $(seq 60); do
    ray status --address "$ADDRESS" > /dev/null 2>&1 && break
    sleep 2
done

for node in "${NODES[@]:$LEARNER_NODES}"; do
    srun --nodes=1 --ntasks=1 --overlap -w "$node" \
        ray start --block --address="$ADDRESS" --num-cpus="$CPUS" \
            --resources="{\"envs\": $CPUS}" --temp-dir="$TMP" "${PORT_FLAGS[@]}" &
done

# wait until every env node has joined (nodes = 1 head + the env nodes)
want=$(( ${#NODES[@]} - LEARNER_NODES + 1 ))
for _ in $(seq 90); do
    have="$(python3 -c "import ray; ray.init(address='$ADDRESS', logging_level='error'); print(sum(n['Alive'] for n in ray.nodes()))" 2>/dev/null || echo 0)"
    [ "$have" -ge "$want" ] && break
    sleep 2
done
echo "fwrl: $have of $want Ray nodes up"

if [ "$LEARNER_NODES" -eq 1 ] && [ "$GPUS_PER_NODE" -eq 1 ]; then
    # one learner: this batch script runs on the first node
    fwrl train --backend ray --ray-address "$ADDRESS" --runs-dir "$RUNS_DIR" "$@"
else
    # learner ranks: torchrun on each learner node, one rank per GPU, rendezvous on the first node
    srun --nodes="$LEARNER_NODES" --ntasks-per-node=1 --overlap -w "$(IFS=,; echo "${NODES[*]:0:$LEARNER_NODES}")" \
        torchrun --nnodes="$LEARNER_NODES" --nproc-per-node="$GPUS_PER_NODE" \
            --rdzv-backend=c10d --rdzv-endpoint="$HEAD_IP:$RDZV_PORT" --rdzv-id="fwrl-$SLURM_JOB_ID" \
            -m fwrl train --backend ray --ray-address "$ADDRESS" --runs-dir "$RUNS_DIR" "$@"
fi
