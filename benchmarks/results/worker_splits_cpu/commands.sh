#!/bin/bash
. /work/venv/bin/activate
cd /tmp/sp
LAT="chaos:cue_delay?delay=2&hang_every=1&hang_seconds=0.001"
for rep in 1 2; do
for s in 1 2; do
  fwrl bench throughput --env "$LAT" --core lstm --device cpu --num-threads 1 --num-workers 2 --envs-per-worker 8 --worker-splits $s --batch-size 8 --unroll-length 20 --seconds 20 --warmup 5 --ceiling-seconds 0 --json-path /tmp/sp/lat-s$s-r$rep.json 2>&1 | grep -E "agent steps/s  |env_wait|inference_forward|rollout_book|workers x" 
done; done
for rep in 1 2; do
for s in 1 2; do
  fwrl bench throughput --preset pong-cpu --env atari:Pong --device cpu --num-workers 2 --envs-per-worker 8 --worker-splits $s --seconds 30 --warmup 10 --ceiling-seconds 0 --json-path /tmp/sp/pong-s$s-r$rep.json 2>&1 | grep -E "agent steps/s  |env_wait|inference_forward|rollout_book|workers x"
done; done
