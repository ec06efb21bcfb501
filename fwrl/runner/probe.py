"""The init probe: how hard the first updates of a fresh agent hit its policy and value.

``fwrl info --env ENV --core CORE --probe`` acts with the freshly initialised
agent in B envs of ENV for T + 1 steps (after ``warmup`` random steps, so the
frames are mid-game), then on that one fixed batch (rows as the learner gets
them: row t + 1 holds the action taken at obs t and its behaviour logits):

- the gradient norm of the IMPALA loss at init, before clipping, in total and
  for the modules that carry most of it;
- after one optimiser step (the run's RMSProp, learning rate and clip), the
  largest and the mean change of a logit and of a value over the batch: the
  **first** step;
- the **steady** step: the same update from the same weights with RMSProp's
  square average already filled (with this gradient, clipped, squared), the
  size of a step once the average has settled. torch's RMSprop starts the
  average at 0, so its first step is up to 10x the steady one; a start made
  gentle by shrinking the model (a small readout scale) shrinks the steady
  step as well, which only this number shows;
- the heads' input: the root mean square of what the policy and value heads
  read, the scale a readout factor changes;
- ``updates`` optimiser steps on the same batch: after each, the policy's
  mean entropy (nats per step; ln A is uniform) and the mean distance of the
  value from the batch's discounted returns (clipped rewards, bootstrapped at
  the end with the initial value), which stay fixed while the model moves.

A stable agent moves a little per update and keeps its entropy; an unstable
one swings its value by several units and collapses its policy within a few
updates on one batch (``tests/learning/test_learning_stability.py`` holds every core to
stated bounds).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor, nn

from fwrl.agents.losses import entropy_loss, impala_loss
from fwrl.agents.optim import clip_grad_norm, make_optimizer
from fwrl.envs.registry import make_env
from fwrl.envs.step_record import DONE, OBS, OBS_EXTRA, REWARD


@dataclass
class ProbeResult:
    """What :func:`probe` measured (see the module docstring)."""

    init_grad_norm: float
    grad_norm_by_module: list[tuple[str, float]]
    first_logit_change: float  # largest |change| of a logit over the batch after the first step
    first_value_change: float  # largest |change| of a value
    first_logit_change_mean: float = 0.0  # mean |change| of a logit
    first_value_change_mean: float = 0.0
    steady_logit_change_mean: float = 0.0  # the same step with the square average filled (docstring)
    steady_value_change_mean: float = 0.0
    head_input_rms: float = 0.0  # root mean square of the heads' input at init
    entropy: list[float] = field(default_factory=list)  # after each update
    value_error: list[float] = field(default_factory=list)  # after each update
    initial_entropy: float = 0.0
    initial_value_error: float = 0.0
    max_entropy: float = 0.0  # ln of the number of actions (per action dimension, summed)

    def to_dict(self) -> dict[str, Any]:
        return {"init_grad_norm": self.init_grad_norm, "grad_norm_by_module": self.grad_norm_by_module,
                "first_logit_change": self.first_logit_change, "first_value_change": self.first_value_change,
                "first_logit_change_mean": self.first_logit_change_mean,
                "first_value_change_mean": self.first_value_change_mean,
                "steady_logit_change_mean": self.steady_logit_change_mean,
                "steady_value_change_mean": self.steady_value_change_mean, "head_input_rms": self.head_input_rms,
                "initial_entropy": self.initial_entropy, "initial_value_error": self.initial_value_error,
                "entropy": self.entropy, "value_error": self.value_error, "max_entropy": self.max_entropy}


@torch.no_grad()
def collect_batch(env: str, model: nn.Module, batch_size: int, unroll_length: int, seed: int = 0,
                  warmup: int = 100, say: Callable[[str, int, int], None] | None = None) -> dict[str, Tensor]:
    """One batch of ``batch_size`` rollouts of ``unroll_length`` steps acted by ``model`` from a zero
    core state, in the learner's row convention (``obs``, ``reward``, ``done``, ``action``,
    ``policy_logits`` as ``[T + 1, B, ...]``; row 0 is the first observation). ``warmup`` random
    steps come first in every env. ``say(phase, done, of)``: progress, called as each env is made
    ("envs made") and at each warm-up and acting step ("warm-up steps", "acting steps")."""
    say = say or (lambda phase, done, of: None)
    envs = []
    for i in range(batch_size):
        envs.append(make_env(env, worker_index=i, seed=seed * 1000 + i))
        say("envs made", i + 1, batch_size)
    try:
        for i, e in enumerate(envs):
            e.action_space.seed(seed * 1000 + i)
        obs = [e.reset()[0] for e in envs]
        for step in range(warmup):
            say("warm-up steps", step + 1, warmup)
            for i, e in enumerate(envs):
                o, _, terminated, truncated, _ = e.step(e.action_space.sample())
                obs[i] = e.reset()[0] if terminated or truncated else o
        model.eval()
        state = model.initial_state(batch_size)
        reward = torch.zeros(batch_size)
        done = torch.ones(batch_size, dtype=torch.bool)
        rows: dict[str, list[Tensor]] = {OBS: [], REWARD: [], DONE: [], "action": [], "policy_logits": []}
        action = logits = None
        for t in range(unroll_length + 1):
            say("acting steps", t + 1, unroll_length + 1)
            frame = torch.as_tensor(np.stack(_frames(obs)))
            step_in = {OBS: frame[None], REWARD: reward[None], DONE: done[None]}
            if isinstance(obs[0], dict):
                step_in[OBS_EXTRA] = torch.as_tensor(np.stack([o[OBS_EXTRA] for o in obs]))[None]
            out, state = model(step_in, state)
            rows[OBS].append(frame)
            rows[REWARD].append(reward)
            rows[DONE].append(done)
            rows["action"].append(action if action is not None else torch.zeros_like(out["action"][0]))
            rows["policy_logits"].append(logits if logits is not None else torch.zeros_like(out["policy_logits"][0]))
            if OBS_EXTRA in step_in:
                rows.setdefault(OBS_EXTRA, []).append(step_in[OBS_EXTRA][0])
            action, logits = out["action"][0], out["policy_logits"][0]
            rewards, dones = [], []
            for i, e in enumerate(envs):
                a = action[i]
                o, r, terminated, truncated, _ = e.step(a.item() if a.dim() == 0 else a.numpy())
                if terminated or truncated:
                    o = e.reset()[0]
                obs[i] = o
                rewards.append(float(r))
                dones.append(bool(terminated or truncated))
            reward = torch.tensor(rewards, dtype=torch.float32)
            done = torch.tensor(dones)
        return {key: torch.stack(values) for key, values in rows.items()}
    finally:
        for e in envs:
            e.close()


def _frames(obs: list[Any]) -> list[Any]:
    return [o[OBS] if isinstance(o, dict) else o for o in obs]


def discounted_returns(batch: dict[str, Tensor], bootstrap: Tensor, discount: float,
                       reward_clip: float | None) -> Tensor:
    """G_t for t < T over the batch: clipped rewards discounted, cut at episode ends, ``bootstrap``
    [B] (a value of obs T) at the end. Row t + 1 holds the reward of the step taken at obs t."""
    rewards = batch[REWARD][1:]
    if reward_clip is not None:
        rewards = rewards.clamp(-reward_clip, reward_clip)
    not_done = (~batch[DONE][1:]).float()
    out = torch.empty_like(rewards)
    g = bootstrap
    for t in reversed(range(rewards.shape[0])):
        g = rewards[t] + discount * not_done[t] * g
        out[t] = g
    return out


def _mean_entropy(logits: Tensor, action_dims) -> float:
    steps = logits.shape[0] * logits.shape[1]
    return -entropy_loss(logits, action_dims).item() / steps


def _module_of(name: str) -> str:
    """``core.blocks.0.ff.0.weight`` -> ``core.blocks.0.ff``; ``stem.convs.3.bias`` -> ``stem.convs``."""
    parts = name.split(".")[:-1] or [name]
    return ".".join(parts[:4 if name.startswith("core.blocks.") else 2])


def probe(model: nn.Module, batch: dict[str, Tensor], *, updates: int = 10, learning_rate: float = 6e-4,
          rmsprop_alpha: float = 0.99, rmsprop_eps: float = 0.01, rmsprop_momentum: float = 0.0,
          rmsprop_bias_correction: bool = False, grad_norm_clip: float = 40.0, discount: float = 0.99,
          baseline_cost: float = 0.5, entropy_cost: float = 0.01, reward_clip: float | None = 1.0,
          top: int = 6, say: Callable[[str, int, int], None] | None = None) -> ProbeResult:
    """Run the probe on ``batch`` (from :func:`collect_batch`); ``model`` is trained in place.
    ``say(phase, done, of)``: progress, as each update begins ("updates")."""
    say = say or (lambda phase, done, of: None)
    action_dims = getattr(model, "action_dims", None)
    B = batch[REWARD].shape[1]
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(params, lr=learning_rate, alpha=rmsprop_alpha, eps=rmsprop_eps,
                               momentum=rmsprop_momentum, bias_correction=rmsprop_bias_correction)
    loss_kwargs = dict(discount=discount, baseline_cost=baseline_cost, entropy_cost=entropy_cost,
                       reward_clip=reward_clip, action_dims=action_dims)
    model.train()

    def forward() -> dict[str, Tensor]:
        out, _ = model(batch, model.initial_state(B))
        return out

    head_inputs: list[Tensor] = []
    hook = model.policy.register_forward_pre_hook(lambda m, args: head_inputs.append(args[0])) \
        if isinstance(getattr(model, "policy", None), nn.Module) else None
    with torch.no_grad():
        start = forward()
        returns = discounted_returns(batch, start["baseline"][-1], discount, reward_clip)

    def value_error(out: dict[str, Tensor]) -> float:
        return (out["baseline"][:-1] - returns).abs().mean().item()

    result = ProbeResult(0.0, [], 0.0, 0.0, initial_entropy=_mean_entropy(start["policy_logits"][:-1], action_dims),
                         initial_value_error=value_error(start),
                         max_entropy=sum(math.log(n) for n in (action_dims or (start["policy_logits"].shape[-1],))))
    if hook is not None:
        hook.remove()
        result.head_input_rms = head_inputs[0].pow(2).mean().sqrt().item()
    for update in range(max(1, updates)):
        say("updates", update + 1, max(1, updates))
        out = forward()
        loss, _ = impala_loss(out, batch, **loss_kwargs)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if update == 0:
            by_module: dict[str, float] = {}
            for name, p in model.named_parameters():
                if p.grad is not None:
                    key = _module_of(name)
                    by_module[key] = by_module.get(key, 0.0) + p.grad.pow(2).sum().item()
            result.grad_norm_by_module = sorted(((k, math.sqrt(v)) for k, v in by_module.items()),
                                                key=lambda kv: -kv[1])[:top]
        norm = float(clip_grad_norm(params, grad_norm_clip))
        if update == 0:
            result.steady_logit_change_mean, result.steady_value_change_mean = _steady_step(
                model, batch, out, learning_rate, rmsprop_alpha, rmsprop_eps)
        optimizer.step()
        with torch.no_grad():
            after = forward()
        if update == 0:
            result.init_grad_norm = norm
            d_logit, d_value = _changes(after, out)
            result.first_logit_change, result.first_logit_change_mean = d_logit.max().item(), d_logit.mean().item()
            result.first_value_change, result.first_value_change_mean = d_value.max().item(), d_value.mean().item()
        result.entropy.append(_mean_entropy(after["policy_logits"][:-1], action_dims))
        result.value_error.append(value_error(after))
    return result


def _steady_step(model: nn.Module, batch: dict[str, Tensor], out: dict[str, Tensor], learning_rate: float,
                 alpha: float, eps: float) -> tuple[float, float]:
    """Mean |change| of a logit and of a value after one plain RMSProp step on a copy of ``model``
    (whose gradients are this update's, clipped) with the square average filled with those gradients
    squared: the step once the average has settled. ``model`` itself is left as it is."""
    twin = copy.deepcopy(model)
    params = []
    for source, p in zip(model.parameters(), twin.parameters()):
        if source.grad is not None:
            p.grad = source.grad.detach().clone()
            params.append(p)
    optimizer = make_optimizer(params, lr=learning_rate, alpha=alpha, eps=eps)
    for p in params:
        optimizer.state[p] = {"step": torch.tensor(1.0), "square_avg": p.grad.detach().pow(2)}
    optimizer.step()
    with torch.no_grad():
        after, _ = twin(batch, twin.initial_state(out["baseline"].shape[1]))
    d_logit, d_value = _changes(after, out)
    return d_logit.mean().item(), d_value.mean().item()


def _changes(after: dict[str, Tensor], before: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """|change| of every logit and of every value between two forwards over the same batch."""
    return ((after["policy_logits"] - before["policy_logits"]).abs(),
            (after["baseline"] - before["baseline"]).abs())


REFERENCE_FIGURES = (  # (label, ProbeResult field) that format_reference compares
    ("gradient norm", "init_grad_norm"), ("heads' input rms", "head_input_rms"),
    ("first dlogit", "first_logit_change_mean"), ("first dV", "first_value_change_mean"),
    ("steady dlogit", "steady_logit_change_mean"), ("steady dV", "steady_value_change_mean"))


def format_reference(result: ProbeResult, reference: ProbeResult, title: str) -> str:
    """The probed agent's figures as multiples of a reference core's on the same batch: the absolute
    numbers depend on the env, stem and init; the ratios say whether a start is harder (> 1) or softer
    (< 1) than the reference's."""
    def ratio(a: float, b: float) -> str:
        return f"{a / b:.2g}x" if b > 0 else "n/a"

    lines = [title] + [f"  {label}: {getattr(reference, key):.4g} -> {ratio(getattr(result, key), getattr(reference, key))}"
                       for label, key in REFERENCE_FIGURES]
    return "\n".join(lines)


def format_probe(result: ProbeResult, title: str) -> str:
    """The probe as a few lines of text (what ``fwrl info --probe`` prints)."""
    lines = [title,
             f"  gradient norm at init (before clipping): {result.init_grad_norm:,.1f}; largest parts: "
             + ", ".join(f"{name} {norm:,.1f}" for name, norm in result.grad_norm_by_module),
             f"  heads' input rms at init: {result.head_input_rms:.3f}",
             f"  first update: logits move by {result.first_logit_change_mean:.4f} on average (up to "
             f"{result.first_logit_change:.3f}), values by {result.first_value_change_mean:.3f} (up to "
             f"{result.first_value_change:.3f})",
             f"  steady update (RMSProp's square average filled): logits move by "
             f"{result.steady_logit_change_mean:.4f} on average, values by {result.steady_value_change_mean:.3f}",
             f"  entropy per step (uniform {result.max_entropy:.3f}): {result.initial_entropy:.3f} at init, then "
             + " ".join(f"{h:.3f}" for h in result.entropy),
             f"  mean |value - discounted return|: {result.initial_value_error:.3f} at init, then "
             + " ".join(f"{e:.2f}" for e in result.value_error)]
    return "\n".join(lines)
