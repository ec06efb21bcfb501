"""Central batched inference for every env slot (ARCHITECTURE.md, Processes).

One ``InferenceLoop.step`` takes the results of whichever workers are ready,
runs one batched forward (T = 1) over their slots with the per-slot core state
kept on the learner's device, sends the actions back, and feeds the rollout
assembler. The inference model is a copy of the learner's model; the learner
publishes new weights into it under ``lock`` after each update.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

import numpy as np
import torch
from torch import nn

from fwrl.agents.rollouts import AGENT_KEYS, Rollout, RolloutAssembler
from fwrl.envs.worker_pool import EpisodeRecord, StepResult, WorkerPool


class InferenceLoop:
    def __init__(
        self,
        model: nn.Module,
        pool: WorkerPool,
        assembler: RolloutAssembler | None,
        device: torch.device,
        lock: threading.Lock,
        greedy: bool = False,
        min_batch: int | None = None,
        batch_wait: float = 0.004,
    ):
        self.model = model
        self.pool = pool
        self.assembler = assembler
        self.device = device
        self.lock = lock
        self.greedy = greedy
        self.state = model.initial_state(pool.num_slots, device)
        self.k = pool.envs_per_worker
        # Dynamic batching: act on whichever workers are ready, but give the
        # others up to ``batch_wait`` seconds to join until ``min_batch``
        # workers are ready: a forward over 4 slots costs little more than over 1.
        self.min_batch = min_batch if min_batch is not None else max(1, pool.num_workers // 2)
        self.batch_wait = batch_wait
        self.agent_steps = 0
        self.restarts_seen = 0

    @torch.no_grad()
    def step(
        self,
        timeout: float,
        on_rollout: Callable[[Rollout], None] | None = None,
        on_episode: Callable[[EpisodeRecord], None] | None = None,
    ) -> int:
        """Serve the ready workers once; returns the number of slots stepped."""
        results: list[StepResult] = self.pool.wait(timeout)
        if not results:
            return 0
        if len(results) < self.min_batch and self.batch_wait > 0:
            deadline = time.monotonic() + self.batch_wait
            while len(results) < self.min_batch and (left := deadline - time.monotonic()) > 0:
                results += self.pool.wait(left)
        k = self.k
        slots = torch.cat([torch.arange(r.worker * k, (r.worker + 1) * k) for r in results]).to(self.device)
        env = {
            "obs": torch.from_numpy(np.concatenate([r.obs for r in results])),
            "reward": torch.from_numpy(np.concatenate([r.reward for r in results])),
            "done": torch.from_numpy(np.concatenate([r.done for r in results])),
            "episode_return": torch.from_numpy(np.concatenate([r.episode_return for r in results])),
            "episode_step": torch.from_numpy(np.concatenate([r.episode_step for r in results])),
            "task": torch.from_numpy(np.concatenate([r.task for r in results])),
        }
        state_in = {name: value[slots] for name, value in self.state.items()}
        if self.assembler is not None:
            state_cpu = {name: value.cpu() for name, value in state_in.items()}
            for i, r in enumerate(results):
                part = slice(i * k, (i + 1) * k)
                rollout = self.assembler.add_env_output(
                    r.worker, r.life, {key: v[part] for key, v in env.items()},
                    {name: v[part] for name, v in state_cpu.items()},
                )
                if rollout is not None and on_rollout is not None:
                    on_rollout(rollout)
        inputs = {key: env[key].to(self.device).unsqueeze(0) for key in ("obs", "reward", "done")}
        with self.lock:
            out, state_out = self.model(inputs, state_in, greedy=self.greedy)
        for name, value in state_out.items():
            self.state[name][slots] = value
        actions = out["action"][0].cpu()
        agent = {key: out[key][0].cpu() for key in AGENT_KEYS}
        actions_np = actions.numpy()
        for i, r in enumerate(results):
            part = slice(i * k, (i + 1) * k)
            self.pool.act(r.worker, actions_np[part])
            if self.assembler is not None:
                self.assembler.add_agent_output(r.worker, {key: v[part] for key, v in agent.items()})
            if on_episode is not None:
                for record in r.episodes:
                    on_episode(record)
        self.restarts_seen += sum(r.restarted for r in results)
        n = len(results) * k
        self.agent_steps += n
        return n
