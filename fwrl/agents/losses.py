"""The IMPALA loss on a rollout batch (Espeholt et al. 2018, Sec. 4.2).

Rollouts follow ``ARCHITECTURE.md``: tensors ``[T+1, B, ...]`` whose
step 0 repeats the previous rollout's last step. At index t+1 the batch holds
what happened after observation t: ``action`` (taken at obs t), ``reward`` and
``done`` (its outcome; ``done[t+1]`` means obs t+1 starts a new episode) and
the actor's ``policy_logits`` / ``baseline`` computed from obs t. The learner
runs the model over all T+1 observations, so its output at index t belongs to
obs t. As in torchbeast, the learner therefore

- takes ``bootstrap_value`` = its baseline at the last observation (index T),
- drops the last step of its own outputs and the first step of the batch,

which pairs learner output t with action, reward, done and behaviour logits
of the transition leaving obs t.

Episode ends: ``done`` zeroes the discount (no bootstrap into the next
episode's first obs). Where the episode was cut by a time limit
(``truncated``, with ``bootstrap_truncation``), the world did not end: the
transition's reward becomes ``r + gamma * V(x_final)``, the value of the
cut episode's final observation, which the acting weights computed at the
cut (``bootstrap_value``; as in Pardo et al. 2018, "Time Limits in RL"). With
a constant reward r the targets before a cut are then r / (1 - gamma), not
the truncated sum. Then, all summed over T x B:

    pg loss       = sum_t  -log pi_t(a_t) * pg_advantage_t
    baseline loss = baseline_cost * 0.5 * sum_t (v_t - V(x_t))^2
    entropy loss  = entropy_cost * sum_t sum_a pi_t(a) log pi_t(a)

(minimising the last maximises the policy entropy). The V-trace targets v_t
and advantages are constants (computed without gradient), so the policy
gradient does not flow into the baseline through them.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch
from torch import Tensor

from fwrl.agents import policy, vtrace
from fwrl.agents.rollouts import BOOTSTRAP_KEY
from fwrl.envs.step_record import DONE, REWARD, TRUNCATED

LEARNER_KEYS = ("policy_logits", "baseline")
BATCH_KEYS = (REWARD, DONE, "action", "policy_logits")


def _require(mapping: Mapping[str, Tensor], keys: tuple[str, ...], what: str) -> None:
    missing = [k for k in keys if k not in mapping]
    if missing:
        raise KeyError(f"impala_loss: {what} lacks {', '.join(missing)} (has {', '.join(sorted(mapping))})")


def policy_gradient_loss(logits: Tensor, actions: Tensor, advantages: Tensor,
                         action_dims: Sequence[int] | None = None) -> Tensor:
    """sum over T x B of -log pi(a_t|x_t) * advantage_t (advantages detached)."""
    return torch.sum(-policy.log_prob(logits, actions, action_dims) * advantages.detach())


def baseline_loss(targets: Tensor, baseline: Tensor) -> Tensor:
    """0.5 * sum over T x B of (v_t - V(x_t))^2 (targets detached)."""
    return 0.5 * torch.sum((targets.detach() - baseline) ** 2)


def entropy_loss(logits: Tensor, action_dims: Sequence[int] | None = None) -> Tensor:
    """sum over T x B of sum_a pi(a) log pi(a): the negative policy entropy (summed over the
    action dimensions of a factored policy)."""
    return -torch.sum(policy.entropy(logits, action_dims))


def vtrace_returns(
    learner_outputs: Mapping[str, Tensor],
    batch: Mapping[str, Tensor],
    *,
    discount: float = 0.99,
    reward_clip: float | None = 1.0,
    clip_rho_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
    action_dims: Sequence[int] | None = None,
    bootstrap_truncation: bool = True,
) -> vtrace.VTraceReturns:
    """The V-trace targets and advantages of a batch (see :func:`impala_loss` for the arguments):
    rewards clipped, discounts ``discount * (1 - done)``, and where ``truncated`` (with
    ``bootstrap_truncation``) the reward plus ``discount * bootstrap_value``."""
    _require(learner_outputs, LEARNER_KEYS, "learner_outputs")
    _require(batch, BATCH_KEYS, "batch")
    baseline = learner_outputs["baseline"][:-1]
    rewards = batch[REWARD][1:].to(baseline.dtype)
    done = batch[DONE][1:].bool()
    if reward_clip is not None:
        rewards = rewards.clamp(-reward_clip, reward_clip)
    discounts = (~done).to(baseline.dtype) * discount
    if bootstrap_truncation and TRUNCATED in batch:
        cut = batch[TRUNCATED][1:].to(baseline.dtype)
        rewards = rewards + discount * cut * batch[BOOTSTRAP_KEY][1:].to(baseline.dtype)
    return vtrace.from_logits(
        behaviour_logits=batch["policy_logits"][1:],
        target_logits=learner_outputs["policy_logits"][:-1],
        actions=batch["action"][1:],
        discounts=discounts,
        rewards=rewards,
        values=baseline,
        bootstrap_value=learner_outputs["baseline"][-1],
        clip_rho_threshold=clip_rho_threshold,
        clip_pg_rho_threshold=clip_pg_rho_threshold,
        action_dims=action_dims,
    )


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
    action_dims: Sequence[int] | None = None,
    bootstrap_truncation: bool = True,
) -> tuple[Tensor, dict[str, float]]:
    """Total IMPALA loss and its parts (floats) for one batch of rollouts.

    ``learner_outputs``: ``policy_logits`` ``[T+1, B, A]`` and ``baseline``
    ``[T+1, B]`` from the learner's forward pass over the whole rollout.
    ``batch``: ``reward``, ``done`` (bool), ``action`` (``[T+1, B]``, or
    ``[T+1, B, D]`` for the D categoricals of ``action_dims``), ``policy_logits``
    (behaviour), and optionally ``truncated`` (bool) with ``bootstrap_value``,
    as ``[T+1, B, ...]``. Rewards are clipped to ``[-reward_clip, reward_clip]``
    (``None``: no clipping); discounts are ``discount * (1 - done)``; with
    ``bootstrap_truncation`` a truncated transition's reward gains
    ``discount * bootstrap_value``. Returns ``(total_loss, stats)`` with stats
    ``total_loss``, ``pg_loss``, ``baseline_loss``, ``entropy_loss`` (the terms,
    each summed over T x B and weighted by its cost) and ``entropy``: the mean
    policy entropy per agent step in nats, unweighted (ln A for a uniform policy
    over A actions), so runs of any B, T and entropy cost compare.
    """
    returns = vtrace_returns(
        learner_outputs, batch, discount=discount, reward_clip=reward_clip,
        clip_rho_threshold=clip_rho_threshold, clip_pg_rho_threshold=clip_pg_rho_threshold,
        action_dims=action_dims, bootstrap_truncation=bootstrap_truncation,
    )
    logits = learner_outputs["policy_logits"][:-1]
    baseline = learner_outputs["baseline"][:-1]
    pg = policy_gradient_loss(logits, batch["action"][1:], returns.pg_advantages, action_dims)
    base = baseline_cost * baseline_loss(returns.vs, baseline)
    negative_entropy = entropy_loss(logits, action_dims)
    entropy = entropy_cost * negative_entropy
    total = pg + base + entropy
    per_step = -negative_entropy / (logits.shape[0] * logits.shape[1])
    # one device-to-host copy for the five numbers (one sync on a GPU, not five)
    values = torch.stack([total, pg, base, entropy, per_step]).detach().tolist()
    stats = dict(zip(("total_loss", "pg_loss", "baseline_loss", "entropy_loss", "entropy"), values))
    return total, stats
