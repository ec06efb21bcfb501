"""What a second learner rank costs per update: the gradient all-reduce against the update itself.

Two learner ranks (``torch.distributed``, gloo; on a GPU box both may share the
one GPU) each take ``--updates`` optimiser steps on fixed synthetic rollout
batches of the Pong / nature-stem / LSTM agent (B 8, T 80 per rank: the
``fwrl bench throughput`` defaults; ``--unroll`` shortens T, as the GPU suite's dry run does),
timing each update's stages as training
does (``fwrl.agents.learner``); one rank alone does the same for the baseline.
No env workers run, so the figures are the learner's alone. Printed: update
time with one rank and with two, the all-reduce time and its share of a
two-rank update, and the gradient size.

    python benchmarks/multi_learner_overhead.py [--device cuda] [--updates 30] [--unroll 80] [--warmup 3] [--json-path out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fwrl.agents.distributed import LearnerGroup, Ranks  # noqa: E402
from fwrl.agents.learner import Learner  # noqa: E402
from fwrl.agents.model import AgentNet  # noqa: E402
from fwrl.agents.optim import linear_decay_scheduler, make_optimizer  # noqa: E402
from fwrl.agents.policy_weights import PolicyWeights  # noqa: E402
from fwrl.agents.rollouts import Batch  # noqa: E402
from fwrl.agents.stage_timer import StageTimer  # noqa: E402
from fwrl.errors import run_main  # noqa: E402
from fwrl.settings.config import TrainConfig  # noqa: E402

OBS, ACTIONS, B, T = (4, 84, 84), 6, 8, 80


def _model(device: torch.device) -> AgentNet:
    torch.manual_seed(0)
    return AgentNet(OBS, ACTIONS, "lstm", {}, stem="nature").to(device)


def _batch(device: torch.device, seed: int, T: int = T) -> Batch:
    g = torch.Generator().manual_seed(seed)
    tensors = {
        "obs": torch.randint(0, 256, (T + 1, B, *OBS), generator=g, dtype=torch.uint8),
        "reward": torch.randn(T + 1, B, generator=g), "done": torch.rand(T + 1, B, generator=g) < 0.01,
        "action": torch.randint(ACTIONS, (T + 1, B), generator=g), "policy_logits": torch.randn(T + 1, B, ACTIONS, generator=g),
        "baseline": torch.zeros(T + 1, B),
    }
    state = {"h": torch.zeros(B, 1, 256), "c": torch.zeros(B, 1, 256)}
    return Batch({k: v.to(device) for k, v in tensors.items()}, {k: v.to(device) for k, v in state.items()},
                 [[0] * (T + 1)], [B])


def _measure(rank: int, world: int, port: int, device_name: str, updates: int, out: str, unroll: int = T,
             warmup: int = 3) -> None:
    device = torch.device(device_name)
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // world))
    group = None
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        group = LearnerGroup(Ranks(rank, world, rank), device, timeout=300, backend="gloo")
    model = _model(device)
    config = TrainConfig()
    optimizer = make_optimizer(model.parameters(), lr=config.learning_rate)
    timer = StageTimer(device)
    learner = Learner(model, PolicyWeights(_model(device)), optimizer,
                      linear_decay_scheduler(optimizer, 10**9, B * unroll * world), config.learner_settings(), None,
                      timer=timer, group=group)
    batch = _batch(device, seed=rank, T=unroll)
    for _ in range(warmup):
        learner.update_batch(batch)
    if device.type == "cuda":
        torch.cuda.synchronize()
    timer.collect()
    totals, allreduce = [], []
    for _ in range(updates):
        start = time.perf_counter()
        learner.update_batch(batch)
        if device.type == "cuda":
            torch.cuda.synchronize()
        totals.append(time.perf_counter() - start)
        seconds, _ = timer.collect()
        allreduce.append(seconds.get("learner_allreduce", 0.0))
    grad_mib = sum(p.numel() for p in learner.params) * 4 / 2**20
    if rank == 0:
        Path(out).write_text(json.dumps({"update_ms": 1000 * statistics.median(totals),
                                         "allreduce_ms": 1000 * statistics.median(allreduce),
                                         "gradient_mib": grad_mib}))
    if group is not None:
        group.close()


def _run(world: int, device: str, updates: int, tmp: Path, unroll: int = T, warmup: int = 3) -> dict:
    out = tmp / f"world{world}.json"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_measure, args=(world, port, device, updates, str(out), unroll, warmup), nprocs=world, join=True)
    return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (two ranks share one GPU)")
    parser.add_argument("--updates", type=int, default=30, help="timed updates per rank (median reported)")
    parser.add_argument("--unroll", type=int, default=T, help="T of each rank's batch (B stays 8)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed updates per rank first")
    parser.add_argument("--json-path", "--json", dest="json_path", metavar="PATH",
                        help="also write the figures here (--json: its old name, deprecated)")
    args = parser.parse_args(argv)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        one = _run(1, args.device, args.updates, Path(tmp), args.unroll, args.warmup)
        two = _run(2, args.device, args.updates, Path(tmp), args.unroll, args.warmup)
    result = {"device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
              "cpus": os.cpu_count(), "batch_per_rank": B, "unroll": args.unroll, "one_rank": one, "two_ranks": two,
              "allreduce_share_of_two_rank_update": two["allreduce_ms"] / two["update_ms"],
              "two_rank_update_over_one": two["update_ms"] / one["update_ms"]}
    print(f"Pong / nature / lstm, B {B} x T {args.unroll} per rank, {result['device']}, {result['cpus']} CPUs, "
          f"gradient {one['gradient_mib']:.1f} MiB")
    print(f"one rank:  update {one['update_ms']:8.1f} ms")
    print(f"two ranks: update {two['update_ms']:8.1f} ms, of which all-reduce {two['allreduce_ms']:.1f} ms "
          f"({100 * result['allreduce_share_of_two_rank_update']:.1f}%); "
          f"{result['two_rank_update_over_one']:.2f}x the one-rank update for 2x the columns")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
