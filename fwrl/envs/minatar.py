"""MinAtar games (``minatar:<game>``): miniature Atari on 10x10 boolean frames.

``minatar:breakout`` makes ``minatar.Environment("breakout")`` (Young & Tian
2019, the ``minatar`` package, extra ``minatar``) with the MinAtar paper's
defaults: sticky actions with probability 0.1, difficulty ramping, the full
set of 6 actions, no frame skip and no frame stack (the games are built to be
Markov in their channels). Frames are the game's ``10 x 10 x C`` booleans as
uint8 ``(C, 10, 10)`` with values 0 / 255 (the model divides by 255, so the
stem sees the 0 / 1 channels), C = 4 (breakout, asterix), 7 (freeway,
space_invaders) or 10 (seaquest). ``stem: auto`` picks the ``minatar`` stem
(the paper's one 3x3 convolution of 16 channels, then a linear layer) for
frames this small.

Options:

- ``sticky=P``: sticky-action probability (default 0.1, the paper's);
- ``ramping=false``: no difficulty ramping (default true);
- ``minimal_actions=true``: the game's minimal action set instead of all 6;
- ``max_episode_steps=N``: cut episodes after N steps, reported as a
  truncation (default 27 000, ALE's 108 000-frame cap over a skip of 4: a
  MinAtar game a good agent never loses, such as Breakout at its best, would
  otherwise never end an evaluation).

Episode ends are the game's own (MinAtar games have one life): a termination.
Rewards are the game's (+1 per brick, alien, ...; the learner clips them).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from fwrl.envs.registry import EnvFamily, register_family
from fwrl.envs.spec import EnvSpec, Option
from fwrl.errors import missing_dependency

GAMES = ("asterix", "breakout", "freeway", "seaquest", "space_invaders")
STICKY_PROBABILITY = 0.1
MAX_EPISODE_STEPS = 27_000


def probability(raw: str) -> float:
    value = float(raw)
    if not 0.0 <= value <= 1.0:
        raise ValueError(raw)
    return value


probability.__name__ = "probability in [0, 1]"


def positive_int(raw: str) -> int:
    value = int(raw)
    if value <= 0:
        raise ValueError(raw)
    return value


positive_int.__name__ = "positive int"


# What MinAtar's package imports only to render (``Environment.display_state``, which fwrl never
# calls), inside a try that falls back to no rendering: matplotlib's pyplot and seaborn (with scipy
# and pandas) took 2-5 s of every process that imports MinAtar here (the command, each env worker,
# the evaluator), against 0.1 s for MinAtar's games.
RENDER_ONLY_MODULES = ("matplotlib", "seaborn")


def import_minatar():
    """The ``minatar`` module, or an error naming the extra to install; imported without its
    renderer's modules (:data:`RENDER_ONLY_MODULES`) unless they are loaded already. They are
    hidden only while MinAtar imports: a later ``import seaborn`` in the process works as usual."""
    import logging
    import sys

    if sys.modules.get("minatar") is not None:
        return sys.modules["minatar"]
    hidden = [name for name in RENDER_ONLY_MODULES if name not in sys.modules]
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # minatar logs a warning when it cannot import its renderer's modules
    for name in hidden:
        sys.modules[name] = None  # an import of it raises ImportError, which minatar catches
    try:
        import minatar
    except ImportError:
        raise missing_dependency("minatar", "minatar", "MinAtar envs") from None
    finally:
        for name in hidden:
            if sys.modules.get(name, 0) is None:
                del sys.modules[name]
        root.setLevel(level)
    return minatar


class MinAtarEnv(gym.Env):
    """One MinAtar game as a gymnasium env with uint8 ``(C, 10, 10)`` frames."""

    metadata = {"render_modes": []}

    def __init__(self, game: str, sticky: float = STICKY_PROBABILITY, ramping: bool = True,
                 minimal_actions: bool = False):
        minatar = import_minatar()
        self.game_name = game
        self.game = minatar.Environment(game, sticky_action_prob=sticky, difficulty_ramping=ramping)
        self.action_set = list(self.game.minimal_action_set()) if minimal_actions else list(
            range(self.game.num_actions()))
        h, w, c = self.game.state_shape()
        self.observation_space = gym.spaces.Box(0, 255, shape=(c, h, w), dtype=np.uint8)
        self.action_space = gym.spaces.Discrete(len(self.action_set))

    def _frame(self) -> np.ndarray:
        return np.ascontiguousarray(self.game.state().transpose(2, 0, 1), dtype=np.uint8) * np.uint8(255)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self.game.seed(seed)
        self.game.reset()
        return self._frame(), {}

    def step(self, action):
        reward, done = self.game.act(self.action_set[int(action)])
        return self._frame(), float(reward), bool(done), False, {}


class MinAtarFamily(EnvFamily):
    name = "minatar"
    game_names = GAMES
    options = {
        "sticky": Option(probability, STICKY_PROBABILITY, "sticky-action probability"),
        "ramping": Option(bool, True, "difficulty ramping"),
        "minimal_actions": Option(bool, False, "the game's minimal action set instead of all 6"),
        "max_episode_steps": Option(positive_int, MAX_EPISODE_STEPS,
                                    "cut episodes after N steps (reported as truncated)"),
    }

    def validate(self, spec: EnvSpec) -> dict[str, Any]:
        opts = super().validate(spec)
        import_minatar()
        return opts

    def layout_options(self, spec: EnvSpec) -> dict[str, Any]:
        return {"chw": True}

    def make(self, spec: EnvSpec, *, worker_index: int, seed: int, mode: str = "train"):
        from fwrl.envs.wrappers import SeedOnFirstReset

        opts = self.validate(spec)
        env = MinAtarEnv(spec.name_for_worker(worker_index), sticky=opts["sticky"], ramping=opts["ramping"],
                         minimal_actions=opts["minimal_actions"])
        env = gym.wrappers.TimeLimit(env, max_episode_steps=opts["max_episode_steps"])
        return SeedOnFirstReset(env, seed)


register_family(MinAtarFamily())
