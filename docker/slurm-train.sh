#!/bin/bash
# SLURM batch script: a Ray cluster inside one allocation, then `fwrl train` on it.
# The first node runs the Ray head and the learner (it needs the GPU); every other
# node runs a Ray node offering the `envs` resource, where the env workers go.
#
#   sbatch docker/slurm-train.sh --preset quickstart --name quickstart-ray
#
# Extra arguments are passed to `fwrl train`. Needs fwrl[ray] installed on every
# node (docker/install.sh into a shared virtualenv, or the images under docker/).
# Ports: docker/README.md. The Ray token is made per job and lives in its environment.
#SBATCH --job-name=fwrl-train
#SBATCH --nodes=3
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=32
#SBATCH --gres=gpu:1
#SBATCH --time=24:00:00
#SBATCH --output=fwrl-%j.out
set -euo pipefail

RAY_PORT="${RAY_PORT:-6379}"
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

echo "fwrl: Ray head on $HEAD ($ADDRESS), env nodes: ${NODES[*]:1}"
srun --nodes=1 --ntasks=1 --overlap -w "$HEAD" \
    ray start --head --block --node-ip-address="$HEAD_IP" --port="$RAY_PORT" \
        --include-dashboard=false --num-cpus=0 --temp-dir="$TMP" "${PORT_FLAGS[@]}" &

for _ in $(seq 60); do
    ray status --address "$ADDRESS" > /dev/null 2>&1 && break
    sleep 2
done

for node in "${NODES[@]:1}"; do
    srun --nodes=1 --ntasks=1 --overlap -w "$node" \
        ray start --block --address="$ADDRESS" --num-cpus="$CPUS" \
            --resources="{\"envs\": $CPUS}" --temp-dir="$TMP" "${PORT_FLAGS[@]}" &
done

# wait until every env node has joined (nodes = 1 head + the others)
want=${#NODES[@]}
for _ in $(seq 90); do
    have="$(python3 -c "import ray; ray.init(address='$ADDRESS', logging_level='error'); print(sum(n['Alive'] for n in ray.nodes()))" 2>/dev/null || echo 0)"
    [ "$have" -ge "$want" ] && break
    sleep 2
done
echo "fwrl: $have of $want Ray nodes up"

# the learner: this batch script runs on the first node
fwrl train --backend ray --ray-address "$ADDRESS" --runs-dir "$RUNS_DIR" "$@"
