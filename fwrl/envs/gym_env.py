"""Any registered gymnasium env with discrete actions (``gym:<id>``).

``gym:CartPole-v1`` makes ``gymnasium.make("CartPole-v1")`` and adapts its
observations to the env contract of :mod:`fwrl.envs.registry`:

- image observations (a uint8 ``Box`` of shape ``HxWxC`` or ``HxW``) become
  uint8 ``CxHxW`` frames for the vision stems; option ``size=HxW`` (or a
  single number for a square) area-resizes them, e.g. ``size=84x84``;
- any other ``Box`` becomes a flat float32 vector ``(D,)`` for the MLP stem;
- a ``Discrete(n)`` observation becomes a float32 one-hot vector ``(n,)``.

Only ``Discrete`` action spaces (starting at 0) are supported; other spaces
are refused with a message naming the space. Namespaced ids are accepted
(``gym:ALE/Pong-v5`` gives the raw Atari screen; use ``atari:Pong`` for the
IMPALA preprocessing). Rewards and episode ends are passed through unchanged.
"""

from __future__ import annotations

import difflib
from typing import Any

import gymnasium as gym
import numpy as np

from fwrl.envs.registry import EnvFamily, register_family
from fwrl.envs.spec import EnvSpec, Option
from fwrl.envs.wrappers import FlatFloat32, ImageToCHW, SeedOnFirstReset
from fwrl.errors import FwrlError

SUPPORTED_OBS = (
    "uint8 image Box (HxWxC or HxW), any other Box (flattened to float32), "
    "or Discrete (one-hot)"
)


def parse_size(raw: str) -> tuple[int, int]:
    """``"84x84"``, ``"84,84"`` or ``"84"`` -> ``(84, 84)``; ValueError if malformed."""
    parts = raw.replace(",", "x").lower().split("x")
    if len(parts) == 1:
        parts = parts * 2
    if len(parts) != 2:
        raise ValueError(raw)
    h, w = (int(p) for p in parts)
    if h <= 0 or w <= 0:
        raise ValueError(raw)
    return h, w


parse_size.__name__ = "size HxW"


class OneHot(gym.ObservationWrapper):
    """``Discrete(n)`` observation -> float32 one-hot vector ``(n,)``."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        space = env.observation_space
        self._n, self._start = int(space.n), int(space.start)
        self.observation_space = gym.spaces.Box(0.0, 1.0, (self._n,), np.float32)

    def observation(self, observation):
        out = np.zeros(self._n, np.float32)
        out[int(observation) - self._start] = 1.0
        return out


def _is_image(space: gym.Space) -> bool:
    return (
        isinstance(space, gym.spaces.Box)
        and space.dtype == np.uint8
        and (len(space.shape) == 2 or (len(space.shape) == 3 and space.shape[2] in (1, 3, 4)))
    )


def _ensure_registered(env_id: str) -> None:
    """Register ALE envs on demand (they are only registered once ale_py is imported)."""
    if env_id not in gym.registry and env_id.startswith("ALE/"):
        from fwrl.envs.atari import _import_ale

        _import_ale()


def adapt(env: gym.Env, env_id: str, size: tuple[int, int] | None) -> gym.Env:
    """Wrap ``env`` so that it fulfils fwrl's env contract, or raise FwrlError."""
    act = env.action_space
    if not isinstance(act, gym.spaces.Discrete) or int(act.start) != 0:
        env.close()
        raise FwrlError(
            f"gym env {env_id!r} has action space {act}; fwrl agents support only "
            "Discrete(n) action spaces starting at 0."
        )
    obs = env.observation_space
    if _is_image(obs):
        return ImageToCHW(env, size)
    if size is not None:
        env.close()
        raise FwrlError(
            f"option size applies only to image observations, but gym env {env_id!r} "
            f"observes {obs}."
        )
    if isinstance(obs, gym.spaces.Box):
        return FlatFloat32(env)
    if isinstance(obs, gym.spaces.Discrete):
        return OneHot(env)
    env.close()
    raise FwrlError(
        f"gym env {env_id!r} has observation space {obs}, which fwrl does not support; "
        f"supported: {SUPPORTED_OBS}."
    )


class GymFamily(EnvFamily):
    name = "gym"
    options = {
        "size": Option(parse_size, None, "resize image observations to HxW, e.g. 84x84"),
    }

    def validate(self, spec: EnvSpec) -> dict[str, Any]:
        opts = super().validate(spec)
        for env_id in spec.names:
            _ensure_registered(env_id)
            if env_id not in gym.registry:
                ids = list(gym.registry)
                close = difflib.get_close_matches(env_id, ids, n=5, cutoff=0.6)
                close += [i for i in ids if i.lower() == env_id.lower() and i not in close]
                hint = (
                    f" Close matches: {', '.join(close)}." if close else
                    " See gymnasium.pprint_registry() for the registered ids."
                )
                raise FwrlError(f"unknown gym env id {env_id!r}.{hint}")
        return opts

    def make(self, spec: EnvSpec, *, worker_index: int, seed: int, mode: str = "train"):
        opts = self.validate(spec)
        env_id = spec.name_for_worker(worker_index)
        try:
            env = gym.make(env_id)
        except gym.error.DependencyNotInstalled as err:
            raise FwrlError(f"gym env {env_id!r} needs a package that is missing: {err}") from None
        return SeedOnFirstReset(adapt(env, env_id, opts["size"]), seed)


register_family(GymFamily())
