"""POPGym's partially observable tasks (``popgym:<Task>``), the benchmark memory models are judged on.

Morad, Kortvelesy, Bettini, Liwicki and Prorok, "POPGym: Benchmarking Partially Observable
Reinforcement Learning", ICLR 2023 (PAPERS.md §5); the ``popgym`` package (extra ``popgym``,
github.com/proroklab/popgym, read at 1.0.7). ``popgym:RepeatFirst`` makes the package's
``RepeatFirstEasy``; several games train one multi-task agent (``popgym:RepeatFirst+RepeatPrevious``:
worker i plays game i mod n, and metrics.csv logs ``return/<task>`` per game, as with ProcGen).

Options:

- ``difficulty=easy|medium|hard`` (default easy): the package's ``<Task>Easy`` / ``Medium`` /
  ``Hard`` classes (``popgym/envs/__init__.py``: longer episodes, more cards or decks, more noise);
- ``protocol=baseline|raw`` (default baseline): ``baseline`` is the observation POPGym's baselines
  learn from (``popgym/baselines/ppo.py`` wraps every env as ``Antialias(PreviousAction(env))``):
  the env's observation, then the previous action (``popgym/wrappers/previous_action.py``: the null
  action, 0, at the first step), then a flag that is 1 at the first step of an episode only
  (``popgym/wrappers/antialias.py``), each one-hot or flat as fwrl's layout makes it
  (:mod:`fwrl.envs.layout`); ``raw`` is the env's observation alone.

Episode lengths and ends are the package's (``popgym/envs/*.py``): its envs end themselves, by a
termination (the deck dealt, the pole down, the ships sunk) or by a truncation where the package
calls it one (a time limit: MultiarmedBandit always; Battleship, Concentration and MineSweeper when
their step limit comes first; the cart-poles at 200 steps, the PositionOnly and VelocityOnly ones
at 400 / 600 on medium / hard); fwrl passes both on as they are, so V-trace bootstraps from a
truncated episode's last observation only (fwrl's ``--truncation auto``; ``--truncation
terminate`` ends the return there instead). Rewards are the
package's: each task scales them (by 1 / the deck size, 1 / the episode length, ...) so that an
episode's return lies in [-1, 1] (the cart-poles: [0, 1]); that scaling is POPGym's normalisation,
which ``fwrl report`` keeps (:func:`fwrl.evaluation.scores.normalise`). Seeds: every env is seeded
with its worker seed at its first reset, and the package draws from the env's ``np_random``
(LabyrinthEscape / LabyrinthExplore draw their mazes from the global ``random`` / ``np.random``,
which the package seeds at a seeded reset only).

POPGym's metric is MMER, the maximum over training of the mean episode return;
``fwrl report`` scores a popgym run by it (:func:`fwrl.evaluation.scores.mmer` says how it is
taken from metrics.csv).

Not here: the pendulums (PositionOnlyPendulum, NoisyPositionOnlyPendulum), whose action is
continuous (fwrl's policies are categorical); LabyrinthEscape and LabyrinthExplore need
``mazelib`` (``pip install mazelib``). Several games train one agent only where the agent's input
and action sizes agree (e.g. RepeatFirst+RepeatPrevious, or the three cart-poles); a spec of others
is refused, naming the groups that do agree.
"""

from __future__ import annotations

import difflib
import functools
from typing import Any, Sequence

from fwrl.envs.registry import EnvFamily, register_family
from fwrl.envs.spec import EnvSpec, Option
from fwrl.errors import FwrlError, missing_dependency

GAMES = ("Autoencode", "Battleship", "Concentration", "CountRecall", "HigherLower", "LabyrinthEscape",
         "LabyrinthExplore", "MineSweeper", "MultiarmedBandit", "NoisyPositionOnlyCartPole", "PositionOnlyCartPole",
         "RepeatFirst", "RepeatPrevious", "VelocityOnlyCartPole")
CONTINUOUS = ("NoisyPositionOnlyPendulum", "PositionOnlyPendulum")  # Box actions: not for categorical policies
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


def _close(value: str, choices: Sequence[str]) -> list[str]:
    """The choices ``value`` is probably a misspelling of (its own spelling in another case first)."""
    by_lower = {c.lower(): c for c in choices}
    if value.lower() in by_lower:
        return [by_lower[value.lower()]]
    return [by_lower[c] for c in difflib.get_close_matches(value.lower(), list(by_lower), n=3, cutoff=0.6)]


def _valid(choices: Sequence[str]) -> str:
    return "valid choices: " + ", ".join(sorted(choices)) + "."


def unknown_game(game: str) -> FwrlError:
    """A one-line refusal of ``game``: what it probably meant, and the valid games."""
    if game in CONTINUOUS:
        return FwrlError(f"POPGym's {game} is not a popgym game fwrl plays: its action is continuous (a Box) and "
                         f"fwrl's policies are categorical; {_valid(GAMES)}")
    core = game.removeprefix("popgym-").removesuffix("-v0")
    for difficulty in DIFFICULTIES:  # the package's class name (RepeatFirstHard) or gym id (popgym-RepeatFirstHard-v0)
        stem = core[: -len(difficulty)] if core.lower().endswith(difficulty) else ""
        named = [g for g in GAMES if g.lower() == stem.lower()]
        if named:
            return FwrlError(f"unknown popgym game {game!r}; did you mean popgym:{named[0]}?difficulty={difficulty} "
                             f"(the difficulty is an option)? {_valid(GAMES)}")
    close = _close(core, GAMES + CONTINUOUS)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    return FwrlError(f"unknown popgym game {game!r}; {hint}{_valid(GAMES)}")


def _check_choice(spec: EnvSpec, key: str, choices: Sequence[str]) -> None:
    raw = spec.options.get(key)
    if raw is not None and raw not in choices:
        close = _close(raw, choices)
        hint = f"did you mean {key}={close[0]}? " if close else ""
        raise FwrlError(f"unknown value for env option {key} {raw!r} in {spec.text!r}; {hint}{_valid(choices)}")


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
        for game in spec.names:
            if game not in GAMES:
                raise unknown_game(game)
        _check_choice(spec, "difficulty", DIFFICULTIES)
        _check_choice(spec, "protocol", PROTOCOLS)
        opts = super().validate(spec)
        for game in spec.names:
            env_class(game, opts["difficulty"])  # the package and, for the labyrinths, mazelib
        if len(set(spec.names)) > 1:  # one agent plays them all: the same input and action sizes
            _check_sizes_agree(spec, opts["difficulty"], opts["protocol"])
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


@functools.lru_cache(maxsize=None)
def sizes(game: str, difficulty: str, protocol: str) -> tuple[tuple[int, ...], int, tuple[int, ...]]:
    """What the agent sees of ``game``: the ``obs`` shape, the ``obs_extra`` size and the action dims."""
    from fwrl.envs.layout import build_action_layout, build_obs_layout

    env = _with_protocol(env_class(game, difficulty)(), protocol)
    try:
        what = f"env 'popgym:{game}'"
        obs = build_obs_layout(env.observation_space, what=what)
        return obs.obs_shape, obs.extra_size, tuple(build_action_layout(env.action_space, what=what).dims)
    finally:
        env.close()


def _said(size: tuple[tuple[int, ...], int, tuple[int, ...]]) -> str:
    shape, extra, dims = size
    return (f"observations {'x'.join(map(str, shape))}" + (f" + {extra}" if extra else "")
            + f", actions {'x'.join(map(str, dims))}")


def _check_sizes_agree(spec: EnvSpec, difficulty: str, protocol: str) -> None:
    found = {game: sizes(game, difficulty, protocol) for game in spec.names}
    if len(set(found.values())) == 1:
        return
    groups: dict[Any, list[str]] = {}
    for game in GAMES:
        try:
            groups.setdefault(sizes(game, difficulty, protocol), []).append(game)
        except FwrlError:  # a labyrinth without mazelib
            continue
    agree = "; ".join("+".join(g) for g in groups.values() if len(g) > 1) or "none"
    said = "; ".join(f"{game}: {_said(size)}" for game, size in found.items())
    raise FwrlError(f"env spec {spec.text!r}: one multi-task agent needs the same observation and action sizes in "
                    f"every game, and these differ ({said}). Games that agree at difficulty {difficulty}: {agree}; "
                    f"train the others in runs of their own (fwrl sweep DIR --env popgym:A popgym:B ...).")


register_family(PopGymFamily())
