"""The user's own gymnasium wrappers, named ``module:callable`` (``--env-wrapper``).

Each wrapper is a callable that takes the env and returns a ``gymnasium.Env``
(a ``gymnasium.Wrapper`` subclass, or a function). They are applied in order
inside every env worker, after fwrl's own wrappers (the family's chain, e.g.
the Atari preprocessing) and before fwrl's observation/action layout
(:mod:`fwrl.envs.layout`), so a wrapper sees and may change the env's own
spaces. ``callable`` may be a dotted path inside the module
(``mypkg.wrappers:Scale.make``).

:func:`load_wrapper` imports one; the worker pools call :func:`check_wrappers`
in the learner process, so a wrapper that cannot be imported or is not
callable is an error before any worker starts. The module must be importable
in every worker too (local workers inherit ``sys.path`` and ``PYTHONPATH``;
Ray actors add the learner's ``PYTHONPATH`` entries that exist on their node); a module in the
current folder is found there, after the installed ones (:func:`import_module_for`).
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Sequence, Union

import gymnasium as gym

from fwrl.errors import FwrlError

WrapperSpec = Union[str, Callable[[gym.Env], gym.Env]]
FORM = "expected MODULE:CALLABLE, e.g. mypkg.wrappers:ScaleReward"


def import_module_for(module: str, purpose: str):
    """Import ``module`` or raise FwrlError saying why (not installed vs failed while importing).

    A module found nowhere on ``sys.path`` is looked for in the current folder too, last (appended to
    ``sys.path``, so it never shadows an installed package): the ``fwrl`` script does not put the
    current folder on the path as ``python -m`` does, nor do fwrl's child processes
    (:mod:`fwrl.utils.run_module`), and README's ``--env-wrapper mypkg.wrappers:ScaleReward`` names a
    package in the folder a run is started from. Local env workers inherit the path."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module == exc.name or module.startswith(exc.name + ".")):
            if _search_current_folder(exc.name):
                return import_module_for(module, purpose)
            raise FwrlError(
                f"cannot import module {module!r} for {purpose}: {exc}. Install the package that provides it "
                "or put its folder on PYTHONPATH (in every env worker's environment too, e.g. on each Ray node)."
            ) from None
        raise FwrlError(f"importing module {module!r} for {purpose} failed: {type(exc).__name__}: {exc}") from None
    except Exception as exc:  # the module itself is broken: say so, with its error
        raise FwrlError(f"importing module {module!r} for {purpose} failed: {type(exc).__name__}: {exc}") from None


def _search_current_folder(name: str) -> bool:
    """Append the current folder to ``sys.path`` where it holds top-level module or package ``name``'s
    first part and is not on the path yet; whether it did."""
    import os
    import sys

    top = name.split(".")[0]
    try:
        here = os.getcwd()
    except OSError:  # the folder was removed
        return False
    if here in sys.path or "" in sys.path or not (os.path.isdir(os.path.join(here, top))
                                                  or os.path.isfile(os.path.join(here, top + ".py"))):
        return False
    sys.path.append(here)
    importlib.invalidate_caches()
    return True


def load_wrapper(spec: WrapperSpec) -> Callable[[gym.Env], gym.Env]:
    """The callable named by ``spec`` (``"module:callable"``), or ``spec`` itself if callable."""
    if callable(spec):
        return spec
    if not isinstance(spec, str):
        raise FwrlError(f"env wrapper {spec!r} is neither a MODULE:CALLABLE string nor a callable; {FORM}.")
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr or ":" in attr:
        raise FwrlError(f"env wrapper {spec!r} is malformed; {FORM}.")
    obj: Any = import_module_for(module_name, f"env wrapper {spec!r}")
    for i, part in enumerate(attr.split(".")):
        if not hasattr(obj, part):
            owner = module_name if i == 0 else f"{module_name}:{'.'.join(attr.split('.')[:i])}"
            names = sorted(n for n in dir(obj) if not n.startswith("_") and callable(getattr(obj, n, None)))
            shown = ", ".join(names[:20]) + (", ..." if len(names) > 20 else "")
            raise FwrlError(f"env wrapper {spec!r}: {owner!r} has no attribute {part!r}; its callables: "
                            f"{shown or 'none'}.")
        obj = getattr(obj, part)
    if not callable(obj):
        raise FwrlError(f"env wrapper {spec!r} is not callable (it is a {type(obj).__name__}); {FORM}, where "
                        "CALLABLE takes the env and returns the wrapped env.")
    return obj


def check_wrappers(specs: Sequence[WrapperSpec]) -> tuple[str, ...]:
    """Load every wrapper (FwrlError for a bad one); returns the specs as strings for the workers.

    Worker pools need names (workers import them again), so callables are refused here."""
    if isinstance(specs, str):
        specs = (specs,)
    out = []
    for spec in specs:
        if not isinstance(spec, str):
            raise FwrlError(f"env wrappers of a worker pool are MODULE:CALLABLE strings (workers import them), "
                            f"got {spec!r}.")
        load_wrapper(spec)
        out.append(spec)
    return tuple(out)


def apply_wrappers(env: gym.Env, specs: Sequence[WrapperSpec]) -> gym.Env:
    """``env`` wrapped by each wrapper in order; FwrlError if one does not return an env."""
    if isinstance(specs, str):
        specs = (specs,)
    for spec in specs:
        wrapper = load_wrapper(spec)
        try:
            wrapped = wrapper(env)
        except FwrlError:
            raise
        except Exception as exc:  # e.g. os.path:join, or gymnasium.wrappers:TimeLimit without its argument
            detail = str(exc).splitlines()[0][:200] if str(exc) else ""
            raise FwrlError(f"env wrapper {spec!r} failed when called with the env ({type(exc).__name__}"
                            f"{': ' + detail if detail else ''}); a wrapper is a callable that takes the env alone "
                            "and returns a gymnasium.Env (a gymnasium.Wrapper subclass, or a function of your own "
                            "that fills in any other arguments).") from None
        if not isinstance(wrapped, gym.Env):
            raise FwrlError(f"env wrapper {spec!r} returned {type(wrapped).__name__}, not a gymnasium.Env.")
        env = wrapped
    return env
