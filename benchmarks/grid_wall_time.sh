#!/usr/bin/env bash
# Wall time of the MinAtar grid's cores (benchmarks/learning/minatar-cpu.yaml: B 8, lr 1.2e-3, 2 workers
# x 8 envs, T 20) at two commits, side by side: one `fwrl train` of STEPS agent steps on Breakout, seed 1,
# per core and commit, the two commits alternated core by core (issue 53: the grid's time before and
# after the CPU paths).
#
#     git archive <old> | tar -x -C /tmp/old; git archive <new> | tar -x -C /tmp/new
#     benchmarks/grid_wall_time.sh /tmp/old /tmp/new [STEPS]     # default 300000
#
# Prints "core commit-dir rc wall_s" per run; the runs go to a temporary folder, removed at the end.
set -euo pipefail
OLD=${1:?old code folder}
NEW=${2:?new code folder}
STEPS=${3:-300000}
PYTHON=${PYTHON:-python3}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for core in lstm rdn delta_net srwm delta_rnn "elstm --elstm-grad rtrl" feedforward; do
    for code in "$OLD" "$NEW"; do
        name=$(echo "$core-$(basename "$code")" | tr -c 'a-zA-Z0-9_\n' '_')
        start=$(date +%s.%N)
        set +e
        # shellcheck disable=SC2086  # the core's flags split on purpose
        PYTHONPATH=$code "$PYTHON" -m fwrl train --env minatar:breakout --core $core --batch-size 8 \
            --learning-rate 0.0012 --num-workers 2 --envs-per-worker 8 --unroll-length 20 \
            --total-steps "$STEPS" --seed 1 --runs-dir "$out" --name "$name" > "$out/$name.log" 2>&1
        rc=$?
        set -e
        end=$(date +%s.%N)
        echo "$core $(basename "$code") rc=$rc wall_s=$(python3 -c "print(round($end - $start, 1))")"
    done
done
