"""Environments: spec strings, families, wrappers and env workers.

Nothing here imports torch: env worker processes import only this package.
"""

from fwrl.envs.registry import EnvInfo, build_env, describe_env, make_env, resolve  # noqa: F401
from fwrl.envs.spec import EnvSpec, parse_env_spec  # noqa: F401
