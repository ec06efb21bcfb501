"""Synthetic memory tasks (``memory:<task>``), seeded and deterministic.

All observations are flat float32 vectors (for the MLP stem); actions before
the recall step(s) do nothing; ``info["success"]`` is set when an episode
ends. An env made with ``seed`` replays the same episodes for that seed.

``cue_delay?delay=N&num_cues=C``: at step 0 the observation shows one of C
cues (one-hot); then N blank steps; then a query step (a flag is set) where
the agent must choose the action equal to the cue. Reward 1 for the right
action, 0 otherwise, and the episode ends. Actions before the query do
nothing. Chance success is 1/C, so an agent without memory stays there.
Observations: ``[cue one-hot (C), query flag]``.

``assoc_recall?n=L&num_keys=S&num_values=V&replacement=false``: associative
retrieval in the style of Schlag et al. 2021 (paper 001, Sec. 6.1). Steps
0..L-1 each show one key/value pair (one-hot key, one-hot value); step L
shows a query key (one of the L keys shown) with the query flag set, and the
agent must answer with the value last paired with it (action = value index):
reward 1 if right, else 0, and the episode ends. ``replacement=false``
(Setting 1, 6.1.1) samples distinct keys and distinct values (L <= S, V);
``replacement=true`` (Setting 2, 6.1.2, e.g. L = 2S) samples both with
replacement, so a key can be re-bound and the most recent value counts; L
may then exceed the number of keys, i.e. the number of associations written
exceeds the key dimension. Observations: ``[key one-hot (S), value one-hot
(V), query flag]``; chance success 1/V.

``copy?length=N&symbols=S&delay=D``: steps 0..N-1 show N random symbols
(one-hot); then D blank steps; then N recall steps (recall flag set) in
which the agent must output the N symbols in order. Each right symbol gives
reward 1/N (a perfect episode returns 1); the episode ends after the last
recall step with ``info["success"]`` = fraction of symbols right. The agent
must hold N symbols over N + D steps. Observations: ``[symbol one-hot (S),
recall flag]``.

``time_limit?length=N``: not a memory task but the test bed of time limits:
a reward of 1 at every step, whatever the action, and the episode is cut
(truncated, never terminated) after N steps. The observation is the phase
``t mod 4`` (one-hot): it does not tell how close the cut is, and the final
observation of a cut episode looks like states the agent learns from (so its
value is learned, not extrapolated). The world does not end at the cut, so
with discount g every state is worth 1 / (1 - g); a learner that treats the
cut as the end of the world learns values of a few steps' reward instead.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from fwrl.envs.registry import EnvFamily, register_family
from fwrl.envs.spec import EnvSpec, Option, parse_options
from fwrl.errors import FwrlError, unknown_choice


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


class AssocRecallEnv(gym.Env):
    """Associative retrieval: L key/value pairs, then a query key (paper 001, Sec. 6.1)."""

    metadata: dict = {"render_modes": []}

    def __init__(
        self,
        n: int = 8,
        num_keys: int = 8,
        num_values: int = 8,
        replacement: bool = False,
        seed: int | None = None,
    ):
        if n < 1 or num_keys < 1 or num_values < 2:
            raise ValueError("assoc_recall needs n >= 1, num_keys >= 1, num_values >= 2")
        if not replacement and n > min(num_keys, num_values):
            raise ValueError("without replacement n must not exceed num_keys or num_values")
        self.n = n
        self.num_keys = num_keys
        self.num_values = num_values
        self.replacement = replacement
        self.observation_space = gym.spaces.Box(
            0.0, 1.0, (num_keys + num_values + 1,), np.float32
        )
        self.action_space = gym.spaces.Discrete(num_values)
        self._rng = np.random.default_rng(seed)
        self._keys = np.zeros(n, np.int64)
        self._values = np.zeros(n, np.int64)
        self._query = 0
        self._t = 0

    @property
    def answer(self) -> int:
        """The value last paired with the query key (what an optimal agent answers)."""
        last = np.flatnonzero(self._keys == self._query)[-1]
        return int(self._values[last])

    def _obs(self) -> np.ndarray:
        obs = np.zeros(self.observation_space.shape, np.float32)
        if self._t < self.n:
            obs[self._keys[self._t]] = 1.0
            obs[self.num_keys + self._values[self._t]] = 1.0
        else:
            obs[self._query] = 1.0
            obs[-1] = 1.0
        return obs

    def reset(self, *, seed: int | None = None, options=None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        rng = self._rng
        if self.replacement:
            self._keys = rng.integers(self.num_keys, size=self.n)
            self._values = rng.integers(self.num_values, size=self.n)
        else:
            self._keys = rng.choice(self.num_keys, size=self.n, replace=False)
            self._values = rng.choice(self.num_values, size=self.n, replace=False)
        self._query = int(self._keys[rng.integers(self.n)])
        self._t = 0
        return self._obs(), {}

    def step(self, action):
        if self._t == self.n:
            reward = float(int(action) == self.answer)
            return self._obs(), reward, True, False, {"success": reward}
        self._t += 1
        return self._obs(), 0.0, False, False, {}


class CopyEnv(gym.Env):
    """Copy task: see N symbols, wait D steps, reproduce the N symbols in order."""

    metadata: dict = {"render_modes": []}

    def __init__(self, length: int = 5, symbols: int = 4, delay: int = 10, seed: int | None = None):
        if length < 1 or symbols < 2 or delay < 0:
            raise ValueError("copy needs length >= 1, symbols >= 2, delay >= 0")
        self.length = length
        self.symbols = symbols
        self.delay = delay
        self.observation_space = gym.spaces.Box(0.0, 1.0, (symbols + 1,), np.float32)
        self.action_space = gym.spaces.Discrete(symbols)
        self._rng = np.random.default_rng(seed)
        self._seq = np.zeros(length, np.int64)
        self._t = 0
        self._right = 0

    @property
    def recall_start(self) -> int:
        return self.length + self.delay

    @property
    def target(self) -> int | None:
        """The symbol to output at the current step (None before the recall phase)."""
        i = self._t - self.recall_start
        return int(self._seq[i]) if 0 <= i < self.length else None

    def _obs(self) -> np.ndarray:
        obs = np.zeros(self.symbols + 1, np.float32)
        if self._t < self.length:
            obs[self._seq[self._t]] = 1.0
        elif self._t >= self.recall_start:
            obs[-1] = 1.0
        return obs

    def reset(self, *, seed: int | None = None, options=None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._seq = self._rng.integers(self.symbols, size=self.length)
        self._t = 0
        self._right = 0
        return self._obs(), {}

    def step(self, action):
        target = self.target
        reward = 0.0
        if target is not None and int(action) == target:
            reward = 1.0 / self.length
            self._right += 1
        self._t += 1
        if self._t == self.recall_start + self.length:
            return self._obs(), reward, True, False, {"success": self._right / self.length}
        return self._obs(), reward, False, False, {}


class TimeLimitEnv(gym.Env):
    """Reward 1 per step; truncated after ``length`` steps; obs one-hot ``t mod PHASES``."""

    metadata: dict = {"render_modes": []}
    PHASES = 4

    def __init__(self, length: int = 10, seed: int | None = None):
        self.length = length
        self.observation_space = gym.spaces.Box(0.0, 1.0, (self.PHASES,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._t = 0

    def _obs(self) -> np.ndarray:
        obs = np.zeros(self.PHASES, np.float32)
        obs[self._t % self.PHASES] = 1.0
        return obs

    def reset(self, *, seed: int | None = None, options=None):
        self._t = 0
        return self._obs(), {}

    def step(self, action):
        self._t += 1
        return self._obs(), 1.0, False, self._t >= self.length, {}


@dataclass(frozen=True)
class MemoryTask:
    """One task of the family: its options, a check of them, and its env class."""

    options: Mapping[str, Option]
    check: Callable[[dict[str, Any]], str | None]  # a problem with the options, or None
    env: Callable[..., gym.Env]


# Upper bounds of the tasks' sizes: an episode of more steps never ends within a run's budget (a delay of
# 10^11 steps: no episode, nothing learnt), and an observation or action set larger is a typo that would
# allocate gigabytes per env (num_cues=10^9: a 4 GB observation).
MAX_EPISODE_STEPS = 1_000_000
MAX_SYMBOLS = 10_000


def _check_cue_delay(o: dict[str, Any]) -> str | None:
    if not (0 <= o["delay"] <= MAX_EPISODE_STEPS and 2 <= o["num_cues"] <= MAX_SYMBOLS):
        return f"needs 0 <= delay <= {MAX_EPISODE_STEPS:,} and 2 <= num_cues <= {MAX_SYMBOLS:,}"
    return None


def _check_assoc_recall(o: dict[str, Any]) -> str | None:
    if not (1 <= o["n"] <= MAX_EPISODE_STEPS and 1 <= o["num_keys"] <= MAX_SYMBOLS and 2 <= o["num_values"] <= MAX_SYMBOLS):
        return (f"needs 1 <= n <= {MAX_EPISODE_STEPS:,}, 1 <= num_keys <= {MAX_SYMBOLS:,} and "
                f"2 <= num_values <= {MAX_SYMBOLS:,}")
    if not o["replacement"] and o["n"] > min(o["num_keys"], o["num_values"]):
        return (
            "without replacement shows distinct keys and values, so it needs "
            "n <= num_keys and n <= num_values (use replacement=true for longer sequences)"
        )
    return None


def _check_time_limit(o: dict[str, Any]) -> str | None:
    if not 5 <= o["length"] <= MAX_EPISODE_STEPS:
        return f"needs 5 <= length <= {MAX_EPISODE_STEPS:,} (the final obs must repeat an earlier phase)"
    return None


def _check_copy(o: dict[str, Any]) -> str | None:
    if not (1 <= o["length"] <= MAX_SYMBOLS and 2 <= o["symbols"] <= MAX_SYMBOLS
            and 0 <= o["delay"] <= MAX_EPISODE_STEPS):
        return (f"needs 1 <= length <= {MAX_SYMBOLS:,}, 2 <= symbols <= {MAX_SYMBOLS:,} and "
                f"0 <= delay <= {MAX_EPISODE_STEPS:,}")
    return None


TASKS: dict[str, MemoryTask] = {
    "cue_delay": MemoryTask(
        {
            "delay": Option(int, 10, "blank steps between cue and query"),
            "num_cues": Option(int, 2, "number of distinct cues (= actions)"),
        },
        _check_cue_delay,
        CueDelayEnv,
    ),
    "assoc_recall": MemoryTask(
        {
            "n": Option(int, 8, "number of key/value pairs shown"),
            "num_keys": Option(int, 8, "number of distinct keys"),
            "num_values": Option(int, 8, "number of distinct values (= actions)"),
            "replacement": Option(bool, False, "sample keys and values with replacement"),
        },
        _check_assoc_recall,
        AssocRecallEnv,
    ),
    "copy": MemoryTask(
        {
            "length": Option(int, 5, "number of symbols to copy"),
            "symbols": Option(int, 4, "alphabet size (= actions)"),
            "delay": Option(int, 10, "blank steps between the sequence and its recall"),
        },
        _check_copy,
        CopyEnv,
    ),
    "time_limit": MemoryTask(
        {"length": Option(int, 10, "steps before the time limit cuts the episode")},
        _check_time_limit,
        TimeLimitEnv,
    ),
}


class MemoryFamily(EnvFamily):
    name = "memory"
    game_names = tuple(TASKS)
    # all options of all tasks (for listings); each task accepts only its own
    options = {k: v for task in TASKS.values() for k, v in task.options.items()}

    def validate(self, spec: EnvSpec) -> dict[str, Any]:
        super_spec = EnvSpec(spec.family, spec.names)  # names only; options per task below
        super().validate(super_spec)
        task = TASKS[spec.names[0]]
        for key in spec.options:
            if key not in task.options:
                raise unknown_choice(f"option for memory:{spec.names[0]}", key, task.options)
        opts = parse_options(spec, task.options)
        problem = task.check(opts)
        if problem:
            raise FwrlError(
                f"memory:{spec.names[0]} {problem}; got {dict(spec.options)}."
            )
        return opts

    def make(self, spec: EnvSpec, *, worker_index: int, seed: int, mode: str = "train"):
        opts = self.validate(spec)
        env = TASKS[spec.name_for_worker(worker_index)].env(**opts, seed=seed)
        env.reset(seed=seed)
        return env


register_family(MemoryFamily())
