"""The ``vector`` env option: how an env worker steps its block of K envs.

``vector=none`` is the Python chain: one gymnasium env per slot, stepped one
after the other (:class:`~fwrl.envs.env_group.EnvGroup`). The other values
name a library that steps the K envs of a worker in C++ threads
(:class:`~fwrl.envs.vector_group.VectorEnvGroup`): ``ale`` (ale_py's
``AtariVectorEnv``) and ``envpool`` (EnvPool). ``auto`` (the default) takes
the first of the family's preferred libraries that is installed and usable,
else ``none``; a library named explicitly and not usable is an error that
says what to install.

A family offers the option by putting :func:`vector_option` in its options
and implementing ``EnvFamily.make_vector``. Only the env workers read it:
``make_env`` (one env, e.g. ``fwrl info --probe``) always builds the Python
chain, whose spaces the vector paths share.
"""

from __future__ import annotations

import warnings
from typing import Callable, Sequence

from fwrl.envs.spec import EnvSpec, Option
from fwrl.errors import FwrlError, missing_dependency

AUTO = "auto"
NONE = "none"


def vector_option(libraries: Sequence[str]) -> Option:
    """The ``vector`` option of a family whose workers can step through ``libraries`` (preferred first)."""
    choices = (AUTO, *libraries, NONE)
    preferred = ", then ".join(libraries)
    return Option(str, AUTO, f"how each worker steps its envs: {'|'.join(libraries)} (C++ threads), none (the "
                             f"Python chain), auto ({preferred} where installed, else none)", choices)


def threads_option() -> Option:
    """The ``threads`` option: C++ threads per worker for the vector paths."""
    return Option(int, 1, "C++ threads per env worker on the vector paths (default 1: the worker processes "
                          "already spread over the cores)")


def check_threads(threads: int, spec_text: str) -> None:
    """Refuse a ``threads`` option below 1."""
    if threads < 1:
        raise FwrlError(f"env option threads={threads} in {spec_text!r} must be >= 1.")


def resolve_path(requested: str, preferred: Sequence[str], problem: Callable[[str], str | None]) -> str:
    """The path to run: ``requested`` itself (``none``, or a library ``problem`` finds no fault
    with), or for ``auto`` the first of ``preferred`` that ``problem`` accepts, else ``none``.

    ``problem(library)`` returns None when the library can run, else why not (a full
    sentence naming what to install); for an explicitly requested library that sentence
    is raised as :class:`FwrlError`.
    """
    if requested == NONE:
        return NONE
    if requested != AUTO:
        reason = problem(requested)
        if reason is not None:
            raise FwrlError(reason)
        return requested
    for library in preferred:
        if problem(library) is None:
            return library
    return NONE


def import_envpool(purpose: str):
    """Import envpool quietly, or raise the install hint for ``purpose``."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import envpool
    except ImportError:
        raise missing_dependency("envpool", "envpool", purpose) from None
    return envpool


def library_problem(importer: Callable[[], object]) -> str | None:
    """None when ``importer()`` succeeds, else the message of the FwrlError it raised."""
    try:
        importer()
    except FwrlError as exc:
        return str(exc)
    return None


def check_vector_wrappers(spec: EnvSpec, wrappers: Sequence[object]) -> None:
    """User env wrappers wrap one Python env each: refuse them with an explicit ``vector`` library
    (``vector=auto`` takes the Python chain when wrappers are given)."""
    requested = spec.options.get("vector", AUTO)
    if wrappers and requested not in (AUTO, NONE):
        raise FwrlError(
            f"env wrappers wrap one Python env each, but {spec.text!r} asks for vector={requested} (the envs "
            f"of a worker stepped together in C++). Use vector=none, or leave vector=auto (with wrappers it "
            f"takes the Python chain)."
        )
