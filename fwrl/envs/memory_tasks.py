"""Synthetic memory tasks (``memory:<task>``), seeded and deterministic.

``cue_delay?delay=N&num_cues=C``: at step 0 the observation shows one of C
cues (one-hot); then N blank steps; then a query step (a flag is set) where
the agent must choose the action equal to the cue. Reward 1 for the right
action, 0 otherwise, and the episode ends. Actions before the query do
nothing. Chance success is 1/C, so an agent without memory stays there.

Observations are flat float32 vectors ``[cue one-hot (C), query flag]``.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from fwrl.envs.registry import EnvFamily, register_family
from fwrl.envs.spec import EnvSpec, Option
from fwrl.errors import FwrlError


class CueDelayEnv(gym.Env):
    metadata: dict = {"render_modes": []}

    def __init__(self, delay: int = 10, num_cues: int = 2, seed: int | None = None):
        self.delay = delay
        self.num_cues = num_cues
        self.observation_space = gym.spaces.Box(0.0, 1.0, (num_cues + 1,), np.float32)
        self.action_space = gym.spaces.Discrete(num_cues)
        self._rng = np.random.default_rng(seed)
        self._cue = 0
        self._t = 0

    def _obs(self) -> np.ndarray:
        obs = np.zeros(self.num_cues + 1, np.float32)
        if self._t == 0:
            obs[self._cue] = 1.0
        if self._t == self.delay + 1:
            obs[-1] = 1.0
        return obs

    def reset(self, *, seed: int | None = None, options=None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._cue = int(self._rng.integers(self.num_cues))
        self._t = 0
        return self._obs(), {}

    def step(self, action):
        if self._t == self.delay + 1:
            reward = float(int(action) == self._cue)
            return self._obs(), reward, True, False, {"success": reward}
        self._t += 1
        return self._obs(), 0.0, False, False, {}


class MemoryFamily(EnvFamily):
    name = "memory"
    game_names = ("cue_delay",)
    options = {
        "delay": Option(int, 10, "blank steps between cue and query"),
        "num_cues": Option(int, 2, "number of distinct cues (= actions)"),
    }

    def validate(self, spec: EnvSpec):
        opts = super().validate(spec)
        if opts["delay"] < 0 or opts["num_cues"] < 2:
            raise FwrlError(
                f"memory:cue_delay needs delay >= 0 and num_cues >= 2, got {dict(spec.options)}."
            )
        return opts

    def make(self, spec: EnvSpec, *, worker_index: int, seed: int, mode: str = "train"):
        opts = self.validate(spec)
        env = CueDelayEnv(opts["delay"], opts["num_cues"], seed=seed)
        env.reset(seed=seed)
        return env


register_family(MemoryFamily())
