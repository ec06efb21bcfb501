"""Which group of K envs a worker runs (:func:`make_group`), and which env paths a spec has.

The family's ``make_vector`` decides (its ``vector`` option, see
:mod:`fwrl.envs.vector_paths`): a :class:`~fwrl.envs.vector_group.VectorEnvGroup`
over envs stepped in C++ threads, or the Python chain's
:class:`~fwrl.envs.env_group.EnvGroup`. Both have the same interface
(``reset(out)``, ``step(actions, out) -> episodes``, ``close()``), so the
worker backends use whichever this returns. :func:`env_paths`,
:func:`env_path` and :func:`with_env_path` name and pick the paths (for
``fwrl bench``, which measures them side by side).
"""

from __future__ import annotations

from fwrl.envs.env_group import EnvGroup, spec_task_index, worker_seed
from fwrl.envs.registry import FAMILY_MODULES, get_family, resolve
from fwrl.envs.vector_group import VectorEnvGroup
from fwrl.envs.vector_paths import AUTO, NONE, check_vector_wrappers
from fwrl.envs.worker_pool import PoolSettings
from fwrl.errors import FwrlError

Group = EnvGroup | VectorEnvGroup


def make_group(settings: PoolSettings, worker: int, life: int = 0) -> Group:
    """The K envs of ``worker``'s life ``life`` in a pool of ``settings``, seeded as
    :func:`worker_seed` says for both kinds of group. User wrappers (``env_wrappers``) wrap one
    Python env each: with them, ``vector=auto`` takes the Python chain and an explicit library
    is an error."""
    parsed, family = resolve(settings.env)
    check_vector_wrappers(parsed, settings.env_wrappers)
    if settings.env_wrappers:
        return EnvGroup(settings, worker, life)
    seeds = [worker_seed(settings.seed, worker, life, j) for j in range(settings.envs_per_worker)]
    envs = family.make_vector(parsed, worker_index=worker, seeds=seeds, mode=settings.mode)
    if envs is None:
        return EnvGroup(settings, worker, life)
    return VectorEnvGroup(envs, worker, spec_task_index(settings.env, worker))


# ----------------------------------------------------------------------------- env paths (fwrl bench)

def env_paths(spec: str) -> tuple[str, ...]:
    """The values of the ``vector`` option of ``spec``'s family that can run here (``ale``,
    ``envpool``, ``none``, in the option's order); () for a family without the option."""
    parsed, family = resolve(spec)
    option = family.options.get("vector")
    if option is None:
        return ()
    runnable = []
    for path in option.choices:
        if path == AUTO:
            continue
        try:
            family.validate(parsed.with_options(vector=path))
        except FwrlError:
            continue
        runnable.append(path)
    return tuple(runnable)


def env_path(spec: str) -> str:
    """The path ``spec``'s workers run: ``ale``, ``envpool`` or ``none`` (``none`` for a family
    without a ``vector`` option)."""
    parsed, family = resolve(spec)
    if "vector" not in family.options:
        return NONE
    return str(family.validate(parsed)["vector"])


def with_env_path(spec: str, path: str) -> str:
    """``spec`` with ``vector=path`` (checked: a family without the option, an unknown path or a
    library that is not installed is an error naming the choices)."""
    parsed, family = resolve(spec)
    option = family.options.get("vector")
    if option is None:
        raise FwrlError(f"{parsed.family} envs have a single env path (no vector option), so {spec!r} cannot be "
                        f"run with vector={path}; families with one: {', '.join(vector_families())}.")
    text = parsed.with_options(vector=path).text
    resolve(text)
    return text


def vector_families() -> tuple[str, ...]:
    """Families whose workers can step envs in C++ threads (they have a ``vector`` option)."""
    return tuple(name for name in FAMILY_MODULES if "vector" in get_family(name).options)
