"""ProcGen envs stepped in C++ threads (``procgen:<game>?vector=envpool``).

EnvPool builds the ProcGen games (0.10.7) into its own extension, which links
the system's Qt 5 runtime (``libQt5Core.so.5``, ``libQt5Gui.so.5``). Where
that runtime is missing, ``vector=envpool`` is an error that says what to
install, and ``vector=auto`` takes the procgen2 chain (``vector=none``).

The protocol is the procgen2 chain's (:mod:`fwrl.envs.procgen`): ``(3, 64,
64)`` uint8 frames, 15 actions, every episode end a termination and a
finished game. (EnvPool flags the games' time limits as truncations; they are
reported as terminations, as the procgen2 chain reports them, so both paths
train alike.) EnvPool resets an ended episode at the next step (dropping that
step's action); such rows are reset at once here, so the new episode's first
frame (of the next level) is in the same result. Levels: ``num_levels`` / ``start_level`` as in procgen2, each env's
level sequence seeded by its slot's seed; ``exploration`` is, as in procgen2,
the hard mode on one fixed level per game.
"""

from __future__ import annotations

import importlib
from typing import Any, Sequence

import numpy as np

from fwrl.envs.vector_group import VectorStep
from fwrl.envs.vector_paths import import_envpool
from fwrl.errors import FwrlError

# procgen2's fixed level of each game's exploration mode (procgen/env.py, 0.10.7)
EXPLORATION_LEVEL_SEEDS = {
    "coinrun": 1949448038, "caveflyer": 1259048185, "leaper": 1318677581, "jumper": 1434825276,
    "maze": 158988835, "heist": 876640971, "climber": 1561126160, "ninja": 1123500215,
}  # fmt: skip
PASSED_OPTIONS = ("num_levels", "start_level", "use_sequential_levels", "use_backgrounds", "use_monochrome_assets",
                  "restrict_themes", "center_agent", "paint_vel_info", "use_generated_assets")
QT_HINT = ("Install the Qt 5 runtime (Debian/Ubuntu: apt install libqt5gui5; Fedora: dnf install qt5-qtbase), "
           "or use vector=none (the procgen2 chain).")


def import_envpool_procgen():
    """EnvPool's ProcGen module, or an error naming what is missing (the envpool extra, or Qt 5)."""
    import_envpool("procgen envs with vector=envpool")
    try:
        procgen_module = importlib.import_module("envpool.procgen")
        procgen_module.ProcgenEnvSpec  # noqa: B018 - raises ImportError where the Qt 5 runtime is missing
    except ImportError as exc:
        cause = exc.__cause__ or exc  # EnvPool wraps the loader's error ("libQt5Gui.so.5: cannot open ...")
        raise FwrlError(f"procgen envs with vector=envpool need the system's Qt 5 runtime (libQt5Core.so.5, "
                        f"libQt5Gui.so.5), which EnvPool's ProcGen build links: {cause}. {QT_HINT}") from None
    return procgen_module


def task_id(game: str, distribution: str) -> str:
    """EnvPool's task id (``bigfish``, ``easy`` -> ``BigfishEasy-v0``; exploration runs the hard one)."""
    mode = "hard" if distribution == "exploration" else distribution
    return f"{game.capitalize()}{mode.capitalize()}-v0"


def level_options(game: str, options: dict[str, Any]) -> dict[str, Any]:
    """The level and drawing options passed to EnvPool (exploration: one fixed level, as procgen2)."""
    passed = {key: options[key] for key in PASSED_OPTIONS}
    if options["distribution"] == "exploration":
        passed.update(num_levels=1, start_level=EXPLORATION_LEVEL_SEEDS[game])
    return passed


class EnvpoolProcgen:
    """K envs of one ProcGen game on EnvPool (see the module docstring)."""

    def __init__(self, game: str, options: dict[str, Any], seeds: Sequence[int], threads: int):
        import_envpool_procgen()
        envpool = import_envpool("procgen envs with vector=envpool")
        tid = task_id(game, options["distribution"])
        if tid not in envpool.list_all_envs():
            raise FwrlError(f"envpool {envpool.__version__} has no ProcGen task {tid} ({game}, "
                            f"{options['distribution']}); use vector=none for it.")
        self.num_envs = len(seeds)
        self.env = envpool.make_gymnasium(
            tid, num_envs=self.num_envs, batch_size=self.num_envs, num_threads=min(threads, self.num_envs),
            seed=int(seeds[0]), env_seed=[int(s) for s in seeds], channel_first=True, **level_options(game, options))

    def reset(self) -> np.ndarray:
        obs, _ = self.env.reset()
        return obs

    def step(self, actions: np.ndarray) -> VectorStep:
        obs, reward, terminated, truncated, _ = self.env.step(np.asarray(actions, np.int32))
        ended = terminated | truncated
        if ended.any():  # EnvPool would reset these at the next step (NextStep); do it now
            ids = np.flatnonzero(ended).astype(np.int32)
            reset_obs, reset_info = self.env.reset(ids)
            obs = obs.copy()
            obs[reset_info["env_id"]] = reset_obs
        return VectorStep(obs, reward.astype(np.float32), ended, np.zeros_like(ended), ended)

    def close(self) -> None:
        self.env.close()
