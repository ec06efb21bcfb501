"""POPGym's partially observable tasks (``popgym:<Env>``), the benchmark memory models are judged on.

Morad, Kortvelesy, Bettini, Liwicki and Prorok, "POPGym: Benchmarking Partially Observable
Reinforcement Learning", ICLR 2023; the ``popgym`` package (extra ``popgym``). ``popgym:RepeatFirst``
makes the package's ``RepeatFirstEasy``; several games train one multi-task agent
(``popgym:RepeatFirst+CountRecall``, worker i plays game i mod n, as with ProcGen).

Options:

- ``difficulty=easy|medium|hard`` (default easy): the package's ``<Env>Easy`` / ``Medium`` /
  ``Hard`` classes (longer episodes, more cards, noisier observations);
- ``protocol=baseline|raw`` (default baseline): the observation POPGym's own baselines learn from
  (``popgym/baselines/ppo.py``: ``Antialias(PreviousAction(env))``), the env's observation with the
  previous action (a null action at the first step) and a flag that is 1 at the first step only;
  ``raw``: the env's observation alone.

Episode lengths are the package's: its envs end themselves (a deck dealt, a time limit reached:
terminated, or truncated where the package says so). Rewards are the package's, scaled by its
authors so that an episode's return lies in [-1, 1] (the cart-pole tasks: [0, 1]), which is POPGym's
normalisation: scores of different tasks are comparable as they are. POPGym's metric, MMER (the
maximum over training of the mean episode return), is what ``fwrl report`` takes as a popgym run's
score (``fwrl.launch.report.collect``).

The tasks with a continuous action (the pendulums) are left out: fwrl's policies are categorical.
``LabyrinthEscape`` and ``LabyrinthExplore`` need ``mazelib`` (``pip install mazelib``).
"""

from __future__ import annotations

from typing import Any

from fwrl.envs.registry import EnvFamily, register_family
from fwrl.envs.spec import EnvSpec, Option
from fwrl.errors import FwrlError, missing_dependency

GAMES = ("Autoencode", "Battleship", "Concentration", "CountRecall", "HigherLower", "LabyrinthEscape",
         "LabyrinthExplore", "MineSweeper", "MultiarmedBandit", "NoisyPositionOnlyCartPole", "PositionOnlyCartPole",
         "RepeatFirst", "RepeatPrevious", "VelocityOnlyCartPole")
NEEDS_MAZELIB = ("LabyrinthEscape", "LabyrinthExplore")
DIFFICULTIES = ("easy", "medium", "hard")
PROTOCOLS = ("baseline", "raw")


def import_popgym():
    """The ``popgym`` package, or an error naming the extra to install."""
    try:
        import popgym.envs
        import popgym.wrappers  # noqa: F401
    except ImportError:
        raise missing_dependency("popgym", "popgym", "POPGym envs") from None
    return popgym


def env_class(game: str, difficulty: str):
    """The package's class of ``game`` at ``difficulty`` (e.g. ``RepeatFirstEasy``)."""
    popgym = import_popgym()
    name = f"{game}{difficulty.capitalize()}"
    cls = getattr(popgym.envs, name, None)
    if cls is None and game in NEEDS_MAZELIB:
        raise FwrlError(f"POPGym's {game} needs mazelib, which is not installed: pip install mazelib.")
    if cls is None:
        raise FwrlError(f"the installed popgym has no {name}; fwrl knows popgym 1.0 (pip install 'popgym>=1.0').")
    return cls


class PopGymFamily(EnvFamily):
    name = "popgym"
    game_names = GAMES
    multi_task = True
    options = {
        "difficulty": Option(str, "easy", "the task's difficulty (its episode length, cards, noise)", DIFFICULTIES),
        "protocol": Option(str, "baseline", "baseline: observation, previous action and first-step flag, as "
                           "POPGym's baselines learn; raw: the observation alone", PROTOCOLS),
    }

    def validate(self, spec: EnvSpec) -> dict[str, Any]:
        opts = super().validate(spec)
        classes = [env_class(game, opts["difficulty"]) for game in spec.names]
        if len(classes) > 1:  # one agent plays them all: the same observations and actions
            spaces = {game: _spaces(cls(), opts["protocol"]) for game, cls in zip(spec.names, classes)}
            if len(set(map(str, spaces.values()))) > 1:
                said = "; ".join(f"{game}: observations {obs}, actions {act}" for game, (obs, act) in spaces.items())
                raise FwrlError(f"env spec {spec.text!r}: one multi-task agent needs games with the same observations "
                                f"and actions, and these differ ({said}). Train them in runs of their own (a sweep "
                                f"over the env: fwrl sweep ... --env popgym:A popgym:B).")
        return opts

    def make(self, spec: EnvSpec, *, worker_index: int, seed: int, mode: str = "train"):
        from fwrl.envs.wrappers import SeedOnFirstReset

        opts = self.validate(spec)
        env = _with_protocol(env_class(spec.name_for_worker(worker_index), opts["difficulty"])(), opts["protocol"])
        return SeedOnFirstReset(env, seed)


def _with_protocol(env, protocol: str):
    """``env`` as the protocol sees it: POPGym's baselines' wrappers (``baseline``) or as it is."""
    if protocol == "raw":
        return env
    wrappers = import_popgym().wrappers
    return wrappers.Antialias(wrappers.PreviousAction(env))


def _spaces(env, protocol: str) -> tuple[Any, Any]:
    wrapped = _with_protocol(env, protocol)
    return wrapped.observation_space, wrapped.action_space


register_family(PopGymFamily())
