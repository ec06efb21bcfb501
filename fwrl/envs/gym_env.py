"""Any gymnasium env (``gym:<id>`` or ``gym:<module>:<id>``).

``gym:CartPole-v1`` makes ``gymnasium.make("CartPole-v1")``. An env that a
third-party package registers is named in gymnasium's own convention,
``gym:<module>:<id>`` (e.g. ``gym:minigrid:MiniGrid-Empty-5x5-v0``): fwrl
imports ``<module>`` first, in the learner process and in every env worker,
so its registrations are there. Namespaced ids work as in gymnasium
(``gym:ALE/Pong-v5`` gives the raw Atari screen; use ``atari:Pong`` for the
IMPALA preprocessing; ``ale_py`` is imported on demand for ``ALE/`` ids).

A package that registers its ids through gymnasium's ``gymnasium.envs`` entry
points (MinAtar does: ``MinAtar = minatar.gym:register_envs``) works as
``gym:<Namespace>/<Id>`` (``gym:MinAtar/Breakout-v1``): gymnasium 1.x no longer
loads those entry points, so fwrl calls the one named after the id's namespace
when the id is not registered yet (in the learner and in every worker).

Observations and actions are turned into fwrl's fixed layout by
:mod:`fwrl.envs.layout` (images -> uint8 CHW ``obs``; vectors, ``Discrete``
and ``MultiDiscrete`` -> float32 ``obs``; ``Dict`` / ``Tuple`` -> the image
as ``obs`` and the rest as ``obs_extra``; ``Discrete`` / ``MultiDiscrete``
actions). Rewards and episode ends are passed through unchanged.

Options:

- ``size=HxW`` (or one number for a square): area-resize the image, e.g. ``size=84x84``;
- ``image_key=KEY``: which entry of a Dict / Tuple observation is the image
  (``none``: no image, flatten everything into ``obs``);
- ``max_episode_steps=N``: gymnasium's ``TimeLimit`` at N steps (an episode cut
  there is reported as ``truncated``).
"""

from __future__ import annotations

import difflib
import sys
from typing import Any

import gymnasium as gym

from fwrl.envs.registry import EnvFamily, register_family
from fwrl.envs.spec import EnvSpec, Option
from fwrl.envs.user_wrappers import import_module_for
from fwrl.envs.wrappers import SeedOnFirstReset
from fwrl.errors import FwrlError

# module -> the env ids its import added to gymnasium's registry (when fwrl imported it first)
_MODULE_IDS: dict[str, tuple[str, ...]] = {}


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


def positive_int(raw: str) -> int:
    value = int(raw)
    if value <= 0:
        raise ValueError(raw)
    return value


positive_int.__name__ = "positive int"


def split_id(name: str) -> tuple[str | None, str]:
    """``"mypkg.envs:Foo-v0"`` -> ``("mypkg.envs", "Foo-v0")``; ``"Foo-v0"`` -> ``(None, "Foo-v0")``."""
    module, sep, env_id = name.rpartition(":")
    return (module, env_id) if sep else (None, name)


def import_env_module(module: str, name: str) -> tuple[str, ...]:
    """Import ``module`` (gymnasium's ``module:id`` convention); returns the ids it registered."""
    if module in _MODULE_IDS:
        return _MODULE_IDS[module]
    before = set(gym.registry)
    fresh = module not in sys.modules
    import_module_for(module, f"gym env {name!r}")
    if fresh:
        ids = tuple(i for i in gym.registry if i not in before)
    else:  # imported before fwrl looked: the ids whose entry point lives in the module's package
        top = module.split(".")[0]
        ids = tuple(i for i, s in gym.registry.items() if _entry_module(s.entry_point).split(".")[0] == top)
    _MODULE_IDS[module] = ids
    return ids


def _entry_module(entry_point: Any) -> str:
    if isinstance(entry_point, str):
        return entry_point.partition(":")[0]
    return getattr(entry_point, "__module__", "") or ""


ENTRY_POINT_GROUP = "gymnasium.envs"
_LOADED_PLUGINS: set[str] = set()


def load_plugin(namespace: str) -> bool:
    """Call the ``gymnasium.envs`` entry point named ``namespace`` (a package's ``register_envs``);
    False when no installed package declares one. An entry point that fails is an error naming it."""
    if namespace in _LOADED_PLUGINS:
        return True
    from importlib.metadata import entry_points

    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == namespace]
    for ep in found:
        try:
            register = ep.load()
            if callable(register):
                register()
        except Exception as err:  # the package is broken or needs something missing
            raise FwrlError(f"the gymnasium entry point {ep.name} = {ep.value} failed while registering its "
                            f"envs: {type(err).__name__}: {err}") from None
    if found:
        _LOADED_PLUGINS.add(namespace)
    return bool(found)


def _ensure_registered(env_id: str) -> None:
    """Register ALE envs on demand (they are only registered once ale_py is imported), quietly
    (also when ``gym:ale_py:ALE/...`` imported ale_py already); register a namespaced id through
    the package's ``gymnasium.envs`` entry point (:func:`load_plugin`)."""
    if env_id.startswith("ALE/"):
        from fwrl.envs.atari import _import_ale

        _import_ale()
    elif "/" in env_id and env_id not in gym.registry:
        load_plugin(env_id.split("/", 1)[0])


def _unknown_id(name: str, module: str | None, env_id: str) -> FwrlError:
    ids = list(gym.registry)
    if module is not None:
        own = list(import_env_module(module, name))
        close = difflib.get_close_matches(env_id, own, n=5, cutoff=0.5)
        close += [i for i in own if i.lower() == env_id.lower() and i not in close]
        if close:
            hint = f" Ids it registered that look alike: {', '.join(close)}."
        elif own:
            shown = ", ".join(own[:20]) + (", ..." if len(own) > 20 else "")
            hint = f" It registered: {shown}."
        else:
            hint = " It registered no gym env ids."
        others = [i for i in difflib.get_close_matches(env_id, ids, n=3, cutoff=0.6) if i not in own]
        if others:
            hint += f" Other registered ids that look alike: {', '.join(others)}."
        return FwrlError(f"unknown gym env id {env_id!r}: module {module!r} was imported, but the id is not "
                         f"registered.{hint}")
    close = difflib.get_close_matches(env_id, ids, n=5, cutoff=0.6)
    close += [i for i in ids if i.lower() == env_id.lower() and i not in close]
    hint = f" Close matches: {', '.join(close)}." if close else " See gymnasium.pprint_registry() for the registered ids."
    return FwrlError(
        f"unknown gym env id {env_id!r}.{hint} An env of a third-party package is only registered once its "
        f"module is imported: name the module as gymnasium does, gym:<module>:{env_id} (fwrl imports it in "
        "every worker)."
    )


class GymFamily(EnvFamily):
    name = "gym"
    options = {
        "size": Option(parse_size, None, "resize image observations to HxW, e.g. 84x84"),
        "image_key": Option(str, None, "the image entry of a Dict/Tuple observation (none: flatten all)"),
        "max_episode_steps": Option(positive_int, None, "cut episodes after N steps (reported as truncated)"),
    }

    def validate(self, spec: EnvSpec) -> dict[str, Any]:
        opts = super().validate(spec)
        for name in spec.names:
            module, env_id = split_id(name)
            if module is not None:
                import_env_module(module, name)
            _ensure_registered(env_id)
            if env_id not in gym.registry:
                raise _unknown_id(name, module, env_id)
        return opts

    def layout_options(self, spec: EnvSpec) -> dict[str, Any]:
        opts = self.validate(spec)
        return {"image_key": opts["image_key"], "size": opts["size"]}

    def make(self, spec: EnvSpec, *, worker_index: int, seed: int, mode: str = "train"):
        opts = self.validate(spec)
        _, env_id = split_id(spec.name_for_worker(worker_index))
        kwargs = {} if opts["max_episode_steps"] is None else {"max_episode_steps": opts["max_episode_steps"]}
        try:
            env = gym.make(env_id, **kwargs)
        except gym.error.DependencyNotInstalled as err:
            raise FwrlError(f"gym env {env_id!r} needs a package that is missing: {err}") from None
        return SeedOnFirstReset(env, seed)


register_family(GymFamily())
