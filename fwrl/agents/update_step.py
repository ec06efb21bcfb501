"""The maths of one learner update (PAPERS.md §4), wherever it runs: the learner thread
(:mod:`fwrl.agents.learner`) or the update process (:mod:`fwrl.agents.learner_process`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from torch import nn

from fwrl.agents.losses import impala_loss
from fwrl.agents.optim import clip_grad_norm
from fwrl.agents.stage_timer import StageTimer

if TYPE_CHECKING:
    from fwrl.agents.distributed import LearnerGroup


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


def optimise(model: nn.Module, optimizer, scheduler, params: list, settings: LearnerSettings, action_dims,
             tensors: dict, initial_state: dict, timer: StageTimer, group: LearnerGroup | None = None
             ) -> dict[str, float] | None:
    """One update: the forward over T + 1 steps from the stored initial states
    with the IMPALA loss, the backward, (several ranks: the gradients summed), the gradient-norm
    clip, the optimiser step and the schedule's. Returns the loss's statistics with ``grad_norm``
    and ``learning_rate`` (None: another rank voted to stop, no step)."""
    c = settings
    with timer.stage("learner_forward", device_work=True):
        outputs, _ = model(tensors, initial_state)
        loss, stats = impala_loss(
            outputs, tensors, discount=c.discount, baseline_cost=c.baseline_cost,
            entropy_cost=c.entropy_cost, reward_clip=c.reward_clip, action_dims=action_dims,
            bootstrap_truncation=c.bootstrap_truncation,
        )
    with timer.stage("learner_backward", device_work=True):
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
    if group is not None:
        with timer.stage("learner_allreduce", device_work=True):
            if group.sum_gradients(params):
                optimizer.zero_grad(set_to_none=True)
                return None
    with timer.stage("learner_optimiser", device_work=True):
        grad_norm = clip_grad_norm(params, c.grad_norm_clip)
        optimizer.step()
        scheduler.step()
    stats["grad_norm"] = float(grad_norm)
    stats["learning_rate"] = scheduler.get_last_lr()[0]
    return stats
