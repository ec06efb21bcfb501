"""The learner: gathers B rollout columns on its device, computes the IMPALA loss,
steps the optimiser, and publishes the new weights to the acting copy (PAPERS.md §4).

One ``update`` is timed in stages (``LEARNER_STAGES``): gathering the batch
from the rollout store, the forward over T+1 steps with the loss, the
backward, the optimiser step (clip, step, schedule) and the publish. The time
spent waiting for rollouts is ``learner_idle`` (counted by the caller, which
owns the queue). Each update also logs ``policy_lag_mean`` / ``policy_lag_max``:
how many updates behind the learner's weights the acting weights of the batch
were.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

from torch import nn

from fwrl.agents.distributed import LearnerGroup
from fwrl.agents.losses import impala_loss
from fwrl.agents.optim import clip_grad_norm
from fwrl.agents.policy_weights import PolicyWeights
from fwrl.agents.rollouts import Batch, RolloutPiece, RolloutStore
from fwrl.agents.stage_timer import StageTimer
from fwrl.envs.step_record import REWARD

LEARNER_STAGES = ("learner_gather", "learner_forward", "learner_backward", "learner_allreduce",
                  "learner_optimiser", "learner_publish")


@dataclass(frozen=True)
class LearnerSettings:
    """What the learner takes of a run's settings (PAPERS.md §4): the IMPALA loss's weights, the
    reward clip, the gradient-norm clip, and whether V-trace bootstraps where a time limit cut an
    episode (``bootstrap_truncation``; else the cut ends the return there)."""

    discount: float = 0.99
    baseline_cost: float = 0.5
    entropy_cost: float = 0.01
    reward_clip: float = 1.0
    grad_norm_clip: float = 40.0
    bootstrap_truncation: bool = True


@dataclass
class LearnerStats:
    updates: int = 0
    agent_steps: int = 0
    last: dict[str, float] = field(default_factory=dict)
    update_seconds: float = 0.0


class Learner:
    """``update(pieces)``: gather B columns from the store, then ``update_batch``. With a
    :class:`~fwrl.agents.distributed.LearnerGroup` the gradients of all learner ranks are summed
    before the optimiser step (``learner_allreduce``), so every rank steps alike; agent steps
    count all ranks' columns."""

    def __init__(self, model: nn.Module, weights: PolicyWeights, optimizer, scheduler, settings: LearnerSettings,
                 store: RolloutStore | None, timer: StageTimer | None = None, group: LearnerGroup | None = None):
        self.model = model
        self.weights = weights
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.settings = settings
        self.store = store
        self.device = next(model.parameters()).device
        self.timer = timer if timer is not None else StageTimer(self.device)
        self.stats = LearnerStats()
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.action_dims = getattr(model, "action_dims", None)
        self.group = group
        self.world_size = group.ranks.world_size if group is not None else 1

    def update(self, pieces: Sequence[RolloutPiece]) -> dict[str, float] | None:
        """One optimiser step on the B columns of ``pieces`` (None: a rank voted to stop, no step)."""
        with self.timer.stage("learner_gather", device_work=True):
            batch = self.store.gather(pieces)
        return self.update_batch(batch)

    def discard(self, pieces: Sequence[RolloutPiece]) -> dict[str, float]:
        """No update: the columns of ``pieces`` go back to the store unread and count as agent steps
        (``fwrl bench throughput --acting-only``: the acting path's rate with no learner work beside
        it). Returns no statistics."""
        with self.timer.stage("learner_gather"):
            self.store.discard(pieces)
        self.stats.agent_steps += sum(p.width for p in pieces) * self.store.spec.unroll_length * self.world_size
        return {}

    def update_batch(self, batch: Batch) -> dict[str, float] | None:
        """One optimiser step on a gathered batch (None: a rank voted to stop, no step)."""
        start = time.perf_counter()
        timer, c = self.timer, self.settings
        lag_mean, lag_max = batch.policy_lag(self.weights.version)
        with timer.stage("learner_forward", device_work=True):
            outputs, _ = self.model(batch.tensors, batch.initial_state)
            loss, stats = impala_loss(
                outputs, batch.tensors, discount=c.discount, baseline_cost=c.baseline_cost,
                entropy_cost=c.entropy_cost, reward_clip=c.reward_clip, action_dims=self.action_dims,
                bootstrap_truncation=c.bootstrap_truncation,
            )
        with timer.stage("learner_backward", device_work=True):
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
        if self.group is not None:
            with timer.stage("learner_allreduce", device_work=True):
                if self.group.sum_gradients(self.params):
                    self.optimizer.zero_grad(set_to_none=True)
                    return None
        with timer.stage("learner_optimiser", device_work=True):
            grad_norm = clip_grad_norm(self.params, c.grad_norm_clip)
            self.optimizer.step()
            self.scheduler.step()
        with timer.stage("learner_publish", device_work=True):
            self.weights.publish(self.model)
        stats["grad_norm"] = float(grad_norm)
        stats["learning_rate"] = self.scheduler.get_last_lr()[0]
        stats["policy_lag_mean"] = round(lag_mean, 3)
        stats["policy_lag_max"] = lag_max
        rows, columns = batch.tensors[REWARD].shape[:2]  # T + 1 rows of B columns
        self.stats.updates += 1
        self.stats.agent_steps += (rows - 1) * columns * self.world_size
        self.stats.last = stats
        self.stats.update_seconds = time.perf_counter() - start
        return stats

    def vote_stop(self) -> None:
        """Tell the other learner ranks to stop after the update they are in (no step is taken)."""
        if self.group is not None:
            with self.timer.stage("learner_allreduce"):
                self.group.vote_stop(self.params)
