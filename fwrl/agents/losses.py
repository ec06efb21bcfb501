"""The IMPALA loss on a rollout batch (Espeholt et al. 2018, Sec. 4.2).

Rollouts follow ``shared/ARCHITECTURE.md``: tensors ``[T+1, B, ...]`` whose
step 0 repeats the previous rollout's last step. At index t+1 the batch holds
what happened after observation t: ``action`` (taken at obs t), ``reward`` and
``done`` (its outcome; ``done[t+1]`` means obs t+1 starts a new episode) and
the actor's ``policy_logits`` / ``baseline`` computed from obs t. The learner
runs the model over all T+1 observations, so its output at index t belongs to
obs t. As in torchbeast, the learner therefore

- takes ``bootstrap_value`` = its baseline at the last observation (index T),
- drops the last step of its own outputs and the first step of the batch,

which pairs learner output t with action, reward, done and behaviour logits
of the transition leaving obs t. Then, all summed over T x B:

    pg loss       = sum_t  cross_entropy(pi_t, a_t) * pg_advantage_t
    baseline loss = baseline_cost * 0.5 * sum_t (v_t - V(x_t))^2
    entropy loss  = entropy_cost * sum_t sum_a pi_t(a) log pi_t(a)

(minimising the last maximises the policy entropy). The V-trace targets v_t
and advantages are constants (computed without gradient), so the policy
gradient does not flow into the baseline through them.
"""

from __future__ import annotations

from typing import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor

from fwrl.agents import vtrace

LEARNER_KEYS = ("policy_logits", "baseline")
BATCH_KEYS = ("reward", "done", "action", "policy_logits")


def _require(mapping: Mapping[str, Tensor], keys: tuple[str, ...], what: str) -> None:
    missing = [k for k in keys if k not in mapping]
    if missing:
        raise KeyError(f"impala_loss: {what} lacks {', '.join(missing)} (has {', '.join(sorted(mapping))})")


def policy_gradient_loss(logits: Tensor, actions: Tensor, advantages: Tensor) -> Tensor:
    """sum over T x B of -log pi(a_t|x_t) * advantage_t (advantages detached)."""
    cross_entropy = F.cross_entropy(
        logits.flatten(0, 1), actions.flatten(0, 1).long(), reduction="none"
    ).view_as(advantages)
    return torch.sum(cross_entropy * advantages.detach())


def baseline_loss(targets: Tensor, baseline: Tensor) -> Tensor:
    """0.5 * sum over T x B of (v_t - V(x_t))^2 (targets detached)."""
    return 0.5 * torch.sum((targets.detach() - baseline) ** 2)


def entropy_loss(logits: Tensor) -> Tensor:
    """sum over T x B of sum_a pi(a) log pi(a): the negative policy entropy."""
    log_policy = F.log_softmax(logits, dim=-1)
    return torch.sum(torch.exp(log_policy) * log_policy)


def impala_loss(
    learner_outputs: Mapping[str, Tensor],
    batch: Mapping[str, Tensor],
    *,
    discount: float = 0.99,
    baseline_cost: float = 0.5,
    entropy_cost: float = 0.01,
    reward_clip: float | None = 1.0,
    clip_rho_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
) -> tuple[Tensor, dict[str, float]]:
    """Total IMPALA loss and its parts (floats) for one batch of rollouts.

    ``learner_outputs``: ``policy_logits`` ``[T+1, B, A]`` and ``baseline``
    ``[T+1, B]`` from the learner's forward pass over the whole rollout.
    ``batch``: ``reward``, ``done`` (bool), ``action``, ``policy_logits``
    (behaviour) as ``[T+1, B, ...]``. Rewards are clipped to
    ``[-reward_clip, reward_clip]`` (``None``: no clipping); discounts are
    ``discount * (1 - done)``. Returns ``(total_loss, stats)`` with stats
    ``total_loss``, ``pg_loss``, ``baseline_loss``, ``entropy_loss``.
    """
    _require(learner_outputs, LEARNER_KEYS, "learner_outputs")
    _require(batch, BATCH_KEYS, "batch")

    bootstrap_value = learner_outputs["baseline"][-1]
    logits = learner_outputs["policy_logits"][:-1]
    baseline = learner_outputs["baseline"][:-1]
    rewards = batch["reward"][1:].to(baseline.dtype)
    done = batch["done"][1:].bool()
    actions = batch["action"][1:]
    behaviour_logits = batch["policy_logits"][1:]

    if reward_clip is not None:
        rewards = rewards.clamp(-reward_clip, reward_clip)
    discounts = (~done).to(baseline.dtype) * discount

    returns = vtrace.from_logits(
        behaviour_logits=behaviour_logits,
        target_logits=logits,
        actions=actions,
        discounts=discounts,
        rewards=rewards,
        values=baseline,
        bootstrap_value=bootstrap_value,
        clip_rho_threshold=clip_rho_threshold,
        clip_pg_rho_threshold=clip_pg_rho_threshold,
    )

    pg = policy_gradient_loss(logits, actions, returns.pg_advantages)
    base = baseline_cost * baseline_loss(returns.vs, baseline)
    entropy = entropy_cost * entropy_loss(logits)
    total = pg + base + entropy
    # one device-to-host copy for the four numbers (one sync on a GPU, not four)
    values = torch.stack([total, pg, base, entropy]).detach().tolist()
    stats = dict(zip(("total_loss", "pg_loss", "baseline_loss", "entropy_loss"), values))
    return total, stats
