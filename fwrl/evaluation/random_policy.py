"""The uniform-random policy, played under an env's evaluation protocol: the floor a trained agent's
return is read against (a ProcGen game where an agent stays at its random return has learned nothing).

The policy is an agent network of the env's own shape (its stem, the feedforward core) whose policy
head is zero, so its logits are zero and every action (every dimension of a multi-discrete action)
is drawn uniformly; it acts through the same workers, levels, splits and episode selection as
:func:`fwrl.evaluation.evaluate.evaluate`, sampling (``greedy=False``), so its returns are on the
protocol's exact footing. The stem's forward is computed and unused: the cost of one small network
per step, for the certainty that nothing but the policy differs from a trained agent's evaluation.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Mapping, Sequence

import torch

from fwrl.agents.model import AgentNet
from fwrl.envs.registry import describe_env
from fwrl.evaluation.evaluate import evaluate


def uniform_policy(env: str, env_wrappers: Sequence[str] = ()) -> AgentNet:
    """An agent for ``env`` whose every action is uniform: zero policy logits (module docstring)."""
    info = describe_env(env, wrappers=tuple(env_wrappers))
    model = AgentNet(info.obs_shape, info.num_actions, "feedforward", {}, stem=None,
                     extra_size=info.extra_size, action_dims=info.action_dims)
    with torch.no_grad():
        model.policy.weight.zero_()
        model.policy.bias.zero_()
    return model.eval()


def evaluate_random_policy(
    env: str,
    *,
    episodes: int | None = None,
    repeats: int | None = None,
    splits: Sequence[str] | None = None,
    num_workers: int = 2,
    envs_per_worker: int = 1,
    seed: int = 0,
    backend: str = "local",
    env_wrappers: Sequence[str] = (),
    stop: threading.Event | None = None,
    progress: Callable[[str, int, int, float], None] | None = None,
    backend_options: Mapping[str, Any] | None = None,
) -> dict[str, Any] | None:
    """:func:`~fwrl.evaluation.evaluate.evaluate` of the uniform-random policy on ``env`` (the
    family's protocol unless overridden): its JSON, with ``policy`` "uniform random"; None if stopped."""
    result = evaluate(uniform_policy(env, env_wrappers), env, episodes=episodes, repeats=repeats, greedy=False,
                      splits=splits, num_workers=num_workers, envs_per_worker=envs_per_worker, seed=seed,
                      device="cpu", backend=backend, env_wrappers=env_wrappers, stop=stop, progress=progress,
                      backend_options=backend_options)
    if result is not None:
        result["policy"] = "uniform random"
    return result
