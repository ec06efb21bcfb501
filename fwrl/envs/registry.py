"""Env families by name, and the contract every env fwrl makes fulfils.

The env contract (what env workers rely on), for the env :func:`make_env` returns:

- a ``gymnasium.Env`` whose action space is ``Discrete(n)`` or ``MultiDiscrete``
  (0-based; ``EnvInfo.action_dims``);
- observations: an array ``obs`` (uint8 frames ``(C, H, W)`` for the vision
  stems, or a flat float32 vector ``(D,)`` for the MLP stem), or, when
  ``EnvInfo.extra_size > 0``, a dict ``{"obs": frames, "obs_extra": float32 (E,)}``
  (the layout of :mod:`fwrl.envs.layout`, applied to whatever the family and
  the user's wrappers give);
- ``step`` returns gymnasium's 5-tuple; ``terminated or truncated`` ends the
  training episode (the worker then calls ``reset``); ``truncated`` (and not
  ``terminated``) means the episode was cut (a time limit), so its last
  observation is worth bootstrapping from;
- ``info["game_over"]`` (default True) says whether the *whole game* ended: an
  Atari life loss ends the training episode but not the game, and returns are
  logged per game;
- the task id of multi-task runs is the index of the worker's game in the spec.

A family's ``make`` returns its env with any supported spaces (the layout
adapter comes after it and after the user's wrappers). A family module
registers an :class:`EnvFamily` with :func:`register_family`. Family modules
are imported lazily, so the worker processes only import what they run.
"""

from __future__ import annotations

import importlib
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

import gymnasium as gym

from fwrl.envs.layout import (ActionLayout, FwrlAdapter, ObsLayout, build_action_layout, build_obs_layout,
                              trivial_obs_layout)
from fwrl.envs.spec import EnvSpec, Option, parse_env_spec, parse_options
from fwrl.envs.user_wrappers import WrapperSpec, apply_wrappers
from fwrl.errors import FwrlError, unknown_choice

# family name -> module that registers it
FAMILY_MODULES = {
    "atari": "fwrl.envs.atari",
    "procgen": "fwrl.envs.procgen",
    "dmlab": "fwrl.envs.dmlab",
    "minatar": "fwrl.envs.minatar",
    "gym": "fwrl.envs.gym_env",
    "memory": "fwrl.envs.memory_tasks",
    "popgym": "fwrl.envs.popgym",
    "chaos": "fwrl.envs.chaos",  # fault injection, a testing aid
}


class ObservationEntriesDropped(UserWarning):
    """A Dict / Tuple observation had entries fwrl cannot encode; the agent trains without them."""


_WARNED: set[str] = set()


@dataclass(frozen=True)
class EnvInfo:
    """What the model needs to know about an env spec.

    ``obs_shape`` / ``obs_dtype``: the ``obs`` array of every slot. ``extra_size``: length of
    the float32 ``obs_extra`` vector fed beside the stem's features (0: there is none).
    ``num_actions``: total number of policy logits, ``sum(action_dims)``; ``action_dims``: one
    entry per categorical action component (``(n,)`` for ``Discrete(n)``). ``obs_layout``: the
    JSON-able description of what ``obs`` and ``obs_extra`` hold (:meth:`ObsLayout.describe`).
    """

    obs_shape: tuple[int, ...]
    obs_dtype: str  # "uint8" (frames) or "float32" (vectors)
    num_actions: int
    task_names: tuple[str, ...]
    extra_size: int = 0
    action_dims: tuple[int, ...] = ()  # () -> (num_actions,)
    obs_layout: dict[str, Any] | None = field(default=None, compare=False)  # None -> the trivial layout

    def __post_init__(self):
        object.__setattr__(self, "obs_shape", tuple(int(d) for d in self.obs_shape))
        object.__setattr__(self, "task_names", tuple(self.task_names))
        dims = tuple(int(d) for d in self.action_dims) or (int(self.num_actions),)
        if sum(dims) != self.num_actions:
            raise ValueError(f"num_actions={self.num_actions} is not the sum of action_dims={dims}")
        object.__setattr__(self, "action_dims", dims)
        if self.obs_layout is None:
            if self.extra_size:
                raise ValueError("an EnvInfo with extra_size > 0 needs its obs_layout")
            object.__setattr__(self, "obs_layout", trivial_obs_layout(self.obs_shape, self.obs_dtype))

    @property
    def is_image(self) -> bool:
        return len(self.obs_shape) == 3

    @property
    def action_shape(self) -> tuple[int, ...]:
        """Per-slot shape of the int actions workers take: ``()`` for one action dim, else ``(D,)``."""
        return () if len(self.action_dims) == 1 else (len(self.action_dims),)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able (lists, not tuples), for checkpoints; :meth:`from_dict` reads it back."""
        out = asdict(self)
        out.update(obs_shape=list(self.obs_shape), task_names=list(self.task_names),
                   action_dims=list(self.action_dims))
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "EnvInfo":
        """From :meth:`to_dict` (or a checkpoint written before the newer fields existed)."""
        return cls(tuple(raw["obs_shape"]), str(raw["obs_dtype"]), int(raw["num_actions"]),
                   tuple(raw["task_names"]), int(raw.get("extra_size", 0)), tuple(raw.get("action_dims", ())),
                   raw.get("obs_layout"))


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

    def make_vector(self, spec: EnvSpec, *, worker_index: int, seeds: Sequence[int], mode: str = "train") -> Any:
        """The envs of worker ``worker_index``, one per seed, stepped together in C++ threads: a
        :class:`~fwrl.envs.vector_group.VectorEnvs`, or None when the worker should step one
        :meth:`make` env per slot (the Python chain; the default). Families with a ``vector``
        option (:mod:`fwrl.envs.vector_paths`) implement it."""
        return None

    def layout_options(self, spec: EnvSpec) -> dict[str, Any]:
        """Options of :func:`~fwrl.envs.layout.build_obs_layout` (``image_key``, ``size``) for ``spec``."""
        return {}

    def describe(self, spec: EnvSpec) -> EnvInfo:
        """Spaces of the env; by default, made once (as workers make it) and closed."""
        return _describe_made(spec, self, ())

    def check_installed(self, spec: EnvSpec) -> None:
        """Raise FwrlError (naming the extra to install) when a library the env workers need for
        ``spec`` cannot be imported here; by default :meth:`validate` imports what it needs. Called
        before any run folder or worker exists (``fwrl.runner.preflight``); ``describe`` need not
        call it (``fwrl info`` describes envs whose library is missing, e.g. DMLab's spaces)."""
        self.validate(spec)


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
        if ":" not in spec and spec.split("?")[0] in FAMILY_MODULES:  # a family without its game: say its games
            raise FwrlError(family_without_game(spec.split("?")[0]))
        spec = parse_env_spec(spec)
    family = get_family(spec.family)
    family.validate(spec)
    return spec, family


def family_without_game(name: str) -> str:
    """What an env spec that names family ``name`` alone (``memory``) lacks: a game, with the family's."""
    try:
        games = tuple(get_family(name).game_names or ())
    except Exception:  # noqa: BLE001 - its library is missing: the form alone
        games = ()
    shown = f"; its games: {', '.join(games[:12])}{', ...' if len(games) > 12 else ''}" if games else ""
    return (f"env spec {name!r} names the env family {name} but no game: write {name}:NAME"
            f"{f' (e.g. {name}:{games[0]})' if games else ''}{shown}.")


def build_env(spec: EnvSpec | str, *, worker_index: int = 0, seed: int = 0, mode: str = "train",
              wrappers: Sequence[WrapperSpec] = ()) -> tuple[gym.Env, ObsLayout, ActionLayout]:
    """The env worker ``worker_index`` runs, and its layouts: the family's env, then the user's
    ``wrappers`` in order (``"module:callable"`` strings or callables, see
    :mod:`fwrl.envs.user_wrappers`), then :class:`~fwrl.envs.layout.FwrlAdapter` unless the spaces
    already have the output form."""
    spec, family = resolve(spec)
    env = family.make(spec, worker_index=worker_index, seed=seed, mode=mode)
    try:
        env = apply_wrappers(env, wrappers)
        what = f"env {spec.text!r}" + (" (after the env wrappers)" if wrappers else "")
        obs_layout = build_obs_layout(env.observation_space, what=what, **family.layout_options(spec))
        action_layout = build_action_layout(env.action_space, what=what)
    except BaseException:
        env.close()
        raise
    if not (obs_layout.identity and action_layout.identity):
        env = FwrlAdapter(env, obs_layout, action_layout)
    return env, obs_layout, action_layout


def make_env(spec: EnvSpec | str, *, worker_index: int = 0, seed: int = 0, mode: str = "train",
             wrappers: Sequence[WrapperSpec] = ()) -> gym.Env:
    """The env as a worker steps it (see :func:`build_env` and the contract above)."""
    return build_env(spec, worker_index=worker_index, seed=seed, mode=mode, wrappers=wrappers)[0]


def _describe_made(spec: EnvSpec, family: EnvFamily, wrappers: Sequence[WrapperSpec]) -> EnvInfo:
    env, obs_layout, action_layout = build_env(spec, wrappers=wrappers)
    message = obs_layout.dropped_message(f"env {spec.text!r}")
    if message and message not in _WARNED:  # said once per process, here (workers stay quiet)
        _WARNED.add(message)
        warnings.warn(message, ObservationEntriesDropped, stacklevel=3)
    try:
        return EnvInfo(obs_layout.obs_shape, obs_layout.obs_dtype, sum(action_layout.dims), tuple(spec.names),
                       obs_layout.extra_size, action_layout.dims, obs_layout.describe())
    finally:
        env.close()


def check_installed(spec: EnvSpec | str) -> EnvSpec:
    """Validate ``spec`` and check that the libraries its envs need are importable here (a
    FwrlError naming the extra to install where one is missing); returns the parsed spec."""
    spec, family = resolve(spec)
    family.check_installed(spec)
    return spec


def describe_env(spec: EnvSpec | str, wrappers: Sequence[WrapperSpec] = ()) -> EnvInfo:
    """What the model needs to know about ``spec`` (with the user's ``wrappers`` applied)."""
    spec, family = resolve(spec)
    if wrappers:  # a wrapper may change the spaces: make the env as workers do
        return _describe_made(spec, family, wrappers)
    return family.describe(spec)
