"""The learner: batches rollouts, computes the IMPALA loss, steps the optimiser,
and publishes the new weights to the inference copy (REFERENCE §4).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import torch
from torch import nn

from fwrl.agents.losses import impala_loss
from fwrl.agents.optim import clip_grad_norm
from fwrl.agents.rollouts import Rollout, collate


@dataclass
class LearnerStats:
    updates: int = 0
    agent_steps: int = 0
    last: dict[str, float] = field(default_factory=dict)
    update_seconds: float = 0.0


class Learner:
    def __init__(self, model: nn.Module, inference_model: nn.Module, optimizer, scheduler,
                 config, device: torch.device, lock: threading.Lock):
        self.model = model
        self.inference_model = inference_model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.config = config
        self.device = device
        self.lock = lock
        self.stats = LearnerStats()
        self.params = [p for p in model.parameters() if p.requires_grad]

    def update(self, pieces: list[Rollout]) -> dict[str, float]:
        """One optimiser step on B rollout columns."""
        start = time.perf_counter()
        batch, initial_state = collate(pieces, self.device)
        outputs, _ = self.model(batch, initial_state)
        c = self.config
        loss, stats = impala_loss(
            outputs, batch, discount=c.discount, baseline_cost=c.baseline_cost,
            entropy_cost=c.entropy_cost, reward_clip=c.reward_clip,
        )
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        stats["grad_norm"] = float(clip_grad_norm(self.params, c.grad_norm_clip))
        self.optimizer.step()
        T, B = batch["reward"].shape[0] - 1, batch["reward"].shape[1]
        self.scheduler.step()
        stats["learning_rate"] = self.scheduler.get_last_lr()[0]
        self.publish()
        self.stats.updates += 1
        self.stats.agent_steps += T * B
        self.stats.last = stats
        self.stats.update_seconds = time.perf_counter() - start
        return stats

    @torch.no_grad()
    def publish(self) -> None:
        """Copy the learner's weights into the inference model."""
        with self.lock:
            for dst, src in zip(self.inference_model.state_dict().values(), self.model.state_dict().values()):
                dst.copy_(src)
