"""Defaults per env family: the settings the learning suite found, where nothing else sets them.

``TrainConfig``'s defaults are the papers' Atari settings (PAPERS.md §4). On
MinAtar the learning suite (``benchmarks/learning/README.md``: tuning runs on
Breakout at 1 M agent steps, then the CPU grid) found other settings, the same
for every core: small batches at a higher rate (B 8, lr 1.2e-3; the LSTM's
training return on Breakout 12.5 where B 32 at lr 6e-4 gives 4.7), 2 workers x
8 envs, T 20. The fast-weight cores took B 32 at lr 6e-4 until the grid showed
them better at B 8 too (issue 37: Space Invaders rdn 40.8 against 33.4,
delta_net 38.8 against 22.2, two seeds each).

A new run takes them for every setting that no layer gives (a preset, a
``--config`` file, a flag, a command's own defaults): defaults < family
defaults < preset < config file < flags. A run's ``config.yaml`` records the
values, so ``--resume`` keeps them. Other families keep ``TrainConfig``'s
defaults (Atari's are the papers', which the Pong runs on the CPU also used:
B 32, lr 6e-4; ``--preset pong-cpu`` is the CPU's whole recipe).
"""

from __future__ import annotations

from typing import Any, Mapping

# family -> settings
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "minatar": {"num_workers": 2, "envs_per_worker": 8, "unroll_length": 20, "batch_size": 8, "learning_rate": 0.0012},
}
SOURCE = "benchmarks/learning/README.md"


def family_defaults(settings: Mapping[str, Any], env: Any, core: Any) -> dict[str, Any]:
    """The family defaults that merged ``settings`` leave unset, for their ``env`` (the settings' own,
    or the config's default; the same for every ``core``); empty where the env's family has none, or
    the env or core is not a name yet (the config's own checks say so)."""
    from fwrl.envs.spec import parse_env_spec
    from fwrl.errors import FwrlError

    if not isinstance(env, str) or not isinstance(core, str):
        return {}
    try:
        family = parse_env_spec(env).family
    except FwrlError:
        return {}
    chosen = FAMILY_DEFAULTS.get(family, {})
    return {key: value for key, value in chosen.items() if key not in settings}


def describe(defaults: Mapping[str, Any], env: str, core: str) -> str:
    """One line saying which family defaults a run of ``env`` and ``core`` took (``fwrl train`` prints it)."""
    family = env.split(":", 1)[0]
    values = ", ".join(f"{key} {value:g}" if isinstance(value, float) else f"{key} {value}"
                       for key, value in defaults.items())
    return (f"{family} settings of the learning suite for {core} ({SOURCE}): {values}; a flag, --config "
            "or --preset sets them otherwise")
