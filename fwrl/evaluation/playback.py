"""One env in this process, played by a trained agent one step at a time (T = 1, B = 1).

What ``fwrl evaluate --video`` records and ``fwrl inspect`` looks inside: the worker pool
(:mod:`fwrl.evaluation.episodes`) plays many envs at once in other processes, where neither the
env's frames nor the core's insides can be seen. Here the env is made as the evaluation's worker
``task`` makes the first env of its first life (:func:`env_for`: the same spec, mode ``test``,
seed and wrappers), so the episodes played are the ones that slot of the evaluation plays first;
the inputs follow the worker's step record (:class:`fwrl.envs.env_group.EnvGroup`): the first
observation of an episode comes with ``done`` true (the core resets) and the reward of the step
before it, an Atari life loss in train mode resets the core but not the game.

A greedy agent plays the same episodes and returns as the evaluation's slot wherever the batched
forward's rounding does not change an argmax; a sampled one draws from its own seeded generator.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn

from fwrl.envs.env_group import worker_seed
from fwrl.envs.registry import make_env
from fwrl.envs.step_record import DONE, OBS, OBS_EXTRA, REWARD


@dataclass
class Step:
    """One observation of an episode, as the agent saw it, and what it did there.

    ``t``: the step within the episode (0: its first observation); ``obs``: the env's observation
    (an array, or ``{"obs": ..., "obs_extra": ...}``); ``reward``: the reward that came with it
    (0 at an episode's first step); ``action``: the agent's action there (an int, or an int array
    for several action dims), None at the episode's last observation, where it does not act;
    ``episode_return``: the rewards so far, ``reward`` included."""

    t: int
    obs: Any
    reward: float
    action: Any
    episode_return: float


@dataclass
class Played:
    """An episode played to its end: its index (0: the first the env played), return and length
    (agent steps), and the info of its last step (``success`` where the env gives one)."""

    index: int
    episode_return: float
    length: int
    info: dict


def env_for(env: str, task: int = 0, seed: int = 0, env_wrappers: Sequence[str] = ()):
    """The env the evaluation's worker ``task`` steps first (life 0, slot 0) for ``seed``: worker
    i runs the spec's game i mod n, so worker ``task`` (< n) runs game ``task``."""
    return make_env(env, worker_index=task, seed=worker_seed(seed, task, 0, 0), mode="test",
                    wrappers=tuple(env_wrappers))


def _inputs(obs: Any, reward: float, done: bool, device: torch.device) -> dict[str, torch.Tensor]:
    parts = obs if isinstance(obs, dict) else {OBS: obs}
    inputs = {name: torch.as_tensor(np.asarray(value)).to(device).unsqueeze(0).unsqueeze(0)
              for name, value in parts.items() if name in (OBS, OBS_EXTRA)}
    inputs[REWARD] = torch.tensor([[reward]], dtype=torch.float32, device=device)
    inputs[DONE] = torch.tensor([[done]], dtype=torch.bool, device=device)
    return inputs


def _action(tensor: torch.Tensor) -> Any:
    value = tensor.reshape(-1).cpu().numpy()
    return int(value[0]) if value.size == 1 else value.astype(np.int64)


def play(model: nn.Module, env, *, episodes: int, greedy: bool = True, seed: int = 0,
         device: torch.device | str = "cpu", on_step: Callable[[Step], None] | None = None,
         on_episode: Callable[[Played], None] | None = None, stop: threading.Event | None = None) -> list[Played]:
    """Play ``episodes`` whole episodes of ``env`` (a made env: :func:`env_for`) with ``model``, in
    order, carrying the core state through each and resetting it at the next one's first step.

    ``on_step(step)`` is called at every observation, after the agent acted on it and before the
    env steps (and once more at each episode's last observation, with no action); ``on_episode``
    when an episode ends (whole games: an Atari life loss in train mode goes on). The model's
    forward runs under ``torch.inference_mode``; hooks on its modules see each step's call.
    Returns the episodes played; fewer where ``stop`` was set."""
    device = torch.device(device)
    generator = None if greedy else torch.Generator(device=device).manual_seed(seed)
    was_training = model.training
    model.eval()
    played: list[Played] = []
    try:
        with torch.inference_mode():
            state = model.initial_state(1, device)
            obs, _ = env.reset()
            reward, done = 0.0, True
            for index in range(episodes):
                total, t = 0.0, 0
                while True:
                    if stop is not None and stop.is_set():
                        return played
                    out, state = model(_inputs(obs, reward, done, device), state, greedy=greedy, generator=generator)
                    action = _action(out["action"])
                    if on_step is not None:
                        on_step(Step(t, obs, float(reward) if t else 0.0, action, total))
                    obs, reward, terminated, truncated, info = env.step(action)
                    reward = float(reward)
                    total += reward
                    t += 1
                    done = bool(terminated or truncated)
                    if done and info.get("game_over", True):
                        break
                    if done:  # a life lost in train mode: the core resets, the game goes on
                        obs, _ = env.reset()
                if on_step is not None:
                    on_step(Step(t, obs, reward, None, total))
                episode = Played(index, total, t, dict(info))
                played.append(episode)
                if on_episode is not None:
                    on_episode(episode)
                obs, _ = env.reset()
    finally:
        model.train(was_training)
    return played
