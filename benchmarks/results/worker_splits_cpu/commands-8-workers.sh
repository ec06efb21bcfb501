#!/bin/bash
# 8 worker processes x 8 envs on the 2-core CPU, splits 1 against 2 (the background run paused)
. /work/venv/bin/activate
cd /tmp/sp
LAT="chaos:cue_delay?delay=2&hang_every=1&hang_seconds=0.0005"
for rep in 1 2; do
for s in 1 2; do
  fwrl bench throughput --env "$LAT" --core lstm --device cpu --num-threads 1 --num-workers 8 --envs-per-worker 8 --worker-splits $s --batch-size 16 --unroll-length 20 --seconds 20 --warmup 5 --ceiling-seconds 0 --json-path /tmp/sp/mb-s$s-r$rep.json 2>&1 | grep -E "agent steps/s  |env_wait|inference_forward"
done; done
