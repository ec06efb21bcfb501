"""Env families by name, and the contract every env fwrl makes fulfils.

The env contract (what env workers rely on):

- a ``gymnasium.Env`` with a ``Discrete`` action space;
- observations: uint8 frames ``(C, H, W)`` for the vision stems, or a flat
  float32 vector ``(D,)`` for the MLP stem;
- ``step`` returns gymnasium's 5-tuple; ``terminated or truncated`` ends the
  training episode (the worker then calls ``reset``);
- ``info["game_over"]`` (default True) says whether the *whole game* ended: an
  Atari life loss ends the training episode but not the game, and returns are
  logged per game;
- the task id of multi-task runs is the index of the worker's game in the spec.

A family module registers an :class:`EnvFamily` with :func:`register_family`.
Family modules are imported lazily, so the worker processes only import
what they run.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Mapping

from fwrl.envs.spec import EnvSpec, Option, parse_env_spec, parse_options
from fwrl.errors import FwrlError, unknown_choice

# family name -> module that registers it
FAMILY_MODULES = {
    "atari": "fwrl.envs.atari",
    "procgen": "fwrl.envs.procgen",
    "dmlab": "fwrl.envs.dmlab",
    "gym": "fwrl.envs.gym_env",
    "memory": "fwrl.envs.memory_tasks",
    "chaos": "fwrl.envs.chaos",  # fault injection, a testing aid
}


@dataclass(frozen=True)
class EnvInfo:
    """What the model needs to know about an env spec."""

    obs_shape: tuple[int, ...]
    obs_dtype: str  # "uint8" (frames) or "float32" (vectors)
    num_actions: int
    task_names: tuple[str, ...]

    @property
    def is_image(self) -> bool:
        return len(self.obs_shape) == 3


class EnvFamily:
    """Base class of an env family (``atari``, ``procgen``, ...)."""

    name: str = ""
    options: Mapping[str, Option] = {}
    # None: any name is accepted (e.g. gym ids); else the valid names.
    game_names: tuple[str, ...] | None = None
    multi_task: bool = False

    def validate(self, spec: EnvSpec) -> dict[str, Any]:
        """Check names and options; return typed options. Raise FwrlError if bad."""
        if len(spec.names) > 1 and not self.multi_task:
            raise FwrlError(
                f"env spec {spec.text!r} names several games, but {self.name} envs do not "
                "support multi-task runs."
            )
        if self.game_names is not None:
            for n in spec.names:
                if n not in self.game_names:
                    raise unknown_choice(f"{self.name} game", n, self.game_names)
        return parse_options(spec, self.options)

    def make(self, spec: EnvSpec, *, worker_index: int, seed: int, mode: str = "train"):
        """Create the env that worker ``worker_index`` runs; ``mode`` is train or test."""
        raise NotImplementedError

    def describe(self, spec: EnvSpec) -> EnvInfo:
        """Spaces of the env; by default, made once and closed."""
        env = self.make(spec, worker_index=0, seed=0)
        try:
            return EnvInfo(
                tuple(env.observation_space.shape),
                str(env.observation_space.dtype),
                int(env.action_space.n),
                tuple(spec.names),
            )
        finally:
            env.close()


_FAMILIES: dict[str, EnvFamily] = {}


def register_family(family: EnvFamily) -> EnvFamily:
    _FAMILIES[family.name] = family
    return family


def get_family(name: str) -> EnvFamily:
    if name not in FAMILY_MODULES:
        raise unknown_choice("env family", name, FAMILY_MODULES)
    if name not in _FAMILIES:
        importlib.import_module(FAMILY_MODULES[name])
    return _FAMILIES[name]


def resolve(spec: EnvSpec | str) -> tuple[EnvSpec, EnvFamily]:
    """Parse (if needed) and validate a spec; returns it with its family."""
    if isinstance(spec, str):
        spec = parse_env_spec(spec)
    family = get_family(spec.family)
    family.validate(spec)
    return spec, family


def make_env(spec: EnvSpec | str, *, worker_index: int = 0, seed: int = 0, mode: str = "train"):
    spec, family = resolve(spec)
    return family.make(spec, worker_index=worker_index, seed=seed, mode=mode)


def describe_env(spec: EnvSpec | str) -> EnvInfo:
    spec, family = resolve(spec)
    return family.describe(spec)
