"""Environments: spec strings, families, wrappers and env workers.

Nothing here imports torch: env worker processes import only this package.
The names below are imported on first use (``fwrl.envs.describe_env``), so
``fwrl.envs.spec`` (parsing a spec) imports neither gymnasium nor any env
library: the command line checks its input before the heavy imports.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "EnvInfo": "fwrl.envs.registry", "build_env": "fwrl.envs.registry", "describe_env": "fwrl.envs.registry",
    "make_env": "fwrl.envs.registry", "resolve": "fwrl.envs.registry",
    "EnvSpec": "fwrl.envs.spec", "parse_env_spec": "fwrl.envs.spec",
}
__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fwrl.envs' has no attribute {name!r}")
