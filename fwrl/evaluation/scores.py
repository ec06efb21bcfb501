"""Score normalisation and published figures to compare evaluations with.

Normalisation (PAPERS.md §5):

- Atari: human-normalised ``(R - R_random) / (R_human - R_random)`` with the
  random / human scores of the DQN-zoo table (:data:`ATARI_RANDOM_HUMAN`);
- ProcGen: min-max normalised ``(R - R_min) / (R_max - R_min)`` with the
  constants of Cobbe et al. 2020 (:func:`fwrl.envs.procgen.normalised_score`;
  memory mode uses the hard constants, as the SRWM paper does);
- DeepMind Lab: human-normalised with the human / random scores of
  :data:`DMLAB_RANDOM_HUMAN`;
- POPGym: the returns as they are: the package's own scaling of each task's
  rewards is POPGym's normalisation (every episode's return in [-1, 1], the
  cart-poles' in [0, 1]; :mod:`fwrl.envs.popgym`). A POPGym run's score is
  MMER, the maximum over training of the mean episode return (:func:`mmer`).

Published figures (PAPERS.md §6) are data, :data:`PUBLISHED`: the
evaluation table shows the matching ones beside fwrl's own numbers. They
come from runs far longer than a scaled-down reproduction, so they are a
reference point, not a pass mark.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from fwrl.errors import unknown_choice

# game -> (random, human); DQN-zoo table (PAPERS.md §5)
ATARI_RANDOM_HUMAN: dict[str, tuple[float, float]] = {
    "Alien": (227.8, 7127.7),
    "Amidar": (5.8, 1719.5),
    "Assault": (222.4, 742.0),
    "BankHeist": (14.2, 753.1),
    "BattleZone": (2360.0, 37187.5),
    "BeamRider": (363.9, 16926.5),
    "Berzerk": (123.7, 2630.4),
    "Breakout": (1.7, 30.5),
    "DemonAttack": (152.1, 1971.0),
    "Gopher": (257.6, 2412.5),
    "Gravitar": (173.0, 3351.4),
    "Jamesbond": (29.0, 302.8),
    "KungFuMaster": (258.5, 22736.3),
    "MsPacman": (307.3, 6951.6),
    "Pong": (-20.7, 14.6),
    "Qbert": (163.9, 13455.0),
    "Robotank": (2.2, 11.9),
    "Seaquest": (68.4, 42054.7),
    "SpaceInvaders": (148.0, 1668.7),
    "StarGunner": (664.0, 10250.0),
    "UpNDown": (533.4, 11693.2),
    "Zaxxon": (32.5, 9173.3),
}

# level -> (random, human) (PAPERS.md §5, which lists human / random)
DMLAB_RANDOM_HUMAN: dict[str, tuple[float, float]] = {
    "rooms_watermaze": (4.065, 54.0),
    "rooms_select_nonmatching_object": (0.312, 65.9),
    "rooms_keys_doors_puzzle": (4.135, 53.8),
}


def human_normalised(score: float, random: float, human: float) -> float:
    """``(score - random) / (human - random)``: 0 is a random agent, 1 a human."""
    return (float(score) - random) / (human - random)


def atari_human_normalised(game: str, score: float) -> float:
    if game not in ATARI_RANDOM_HUMAN:
        raise unknown_choice("atari game with random/human scores", game, ATARI_RANDOM_HUMAN)
    return human_normalised(score, *ATARI_RANDOM_HUMAN[game])


def dmlab_human_normalised(level: str, score: float) -> float:
    if level not in DMLAB_RANDOM_HUMAN:
        raise unknown_choice("dmlab level with random/human scores", level, DMLAB_RANDOM_HUMAN)
    return human_normalised(score, *DMLAB_RANDOM_HUMAN[level])


def normalisation_kind(family: str) -> str:
    """How scores of ``family`` are normalised ("" where they are not)."""
    return {"atari": "human", "dmlab": "human", "procgen": "min-max", "popgym": "popgym"}.get(family, "")


def normalise(family: str, task: str, score: float, options: Mapping[str, Any] | None = None) -> float | None:
    """The normalised ``score`` of ``task`` in ``family``, or None where no constants exist.

    ``options`` are the env spec's options (ProcGen reads ``distribution``).
    """
    options = options or {}
    if family == "atari":
        return atari_human_normalised(task, score) if task in ATARI_RANDOM_HUMAN else None
    if family == "dmlab":
        return dmlab_human_normalised(task, score) if task in DMLAB_RANDOM_HUMAN else None
    if family == "popgym":  # the package scales each task's rewards: an episode's return lies in [-1, 1]
        return float(score)  # (its tasks' sources, popgym/envs/*.py; PAPERS.md §5)
    if family == "procgen":
        from fwrl.envs.procgen import NORMALISATION_TABLE_FOR, normalised_score

        distribution = str(options.get("distribution", "easy"))
        if distribution not in NORMALISATION_TABLE_FOR:
            return None
        return normalised_score(task, distribution, score)
    return None


# ----------------------------------------------------------------------------- POPGym's metric

MMER_FAMILIES = ("popgym",)  # families whose runs fwrl report scores by MMER
MMER_WINDOW = 100  # episodes in each mean return a metrics row logs (fwrl.runner.run_metrics.Episodes)


@dataclass(frozen=True)
class Mmer:
    """A run's MMER in one game: ``value``, the maximum of the logged means of ``rows`` metrics rows;
    ``full``: each of those means is over a full window of episodes (False: the run logged no row
    with a full window, and the maximum is over the means it has)."""

    value: float
    rows: int
    full: bool


def mmer(means: Sequence[float], episodes: Sequence[float | None], *, tasks: int = 1,
         window: int = MMER_WINDOW) -> Mmer | None:
    """POPGym's MMER (Morad et al. 2023; PAPERS.md §5), the maximum over training of the mean
    episode return, from a run's metrics rows (None where no row has a mean yet).

    ``means[i]``: the mean return row i logged (``mean_return``, or ``return/<task>`` of one game of a
    multi-task run: the mean of the last ``window`` episodes of that game, NaN before its first);
    ``episodes[i]``: the run's episodes ended by then (all games together), None where unknown.

    POPGym's baselines (RLlib's PPO, ``popgym/baselines/ppo.py``: by default a training iteration of
    1024 steps x 4 workers x 16 envs) log RLlib's ``episode_reward_mean`` each iteration: the mean
    return of the episodes that ended during it, topped up with earlier ones to at least 100 (RLlib's
    ``metrics_num_episodes_for_smoothing``, default 100); MMER is the maximum of those means over
    training. fwrl's rows log the mean of the last 100 episodes every ``log_interval`` seconds, and
    MMER is their maximum. Rows logged before the window first filled (fewer than ``window`` x ``tasks``
    episodes ended, the run's ``tasks`` games sharing them) do not count: a maximum over means of a
    handful of episodes would reward luck, where each of POPGym's means is over a whole iteration of
    episodes. A run that never filled the window is scored over the means it has (``full`` False). A
    resumed run's window starts empty again, and the few rows right after the resume count with the
    episodes they have.
    """
    rows = [(float(m), e) for m, e in zip(means, episodes) if m is not None and math.isfinite(float(m))]
    if not rows:
        return None
    full = [m for m, e in rows if e is not None and math.isfinite(float(e)) and float(e) >= window * tasks]
    if full:
        return Mmer(max(full), len(full), True)
    return Mmer(max(m for m, _ in rows), len(rows), False)


# ----------------------------------------------------------------------------- published figures

@dataclass(frozen=True)
class Published:
    """One published figure.

    ``task`` is a game / level, or ``"*"`` for an aggregate over the games of
    ``games``; ``split`` is the evaluation split it belongs to; ``metric`` is
    ``return`` (raw score) or ``normalised_x100`` (mean normalised score x 100).
    ``core`` is fwrl's core name; ``setting`` holds what else must match
    (e.g. ``{"grad": "rtrl", "unroll_length": 50}``).
    """

    source: str
    family: str
    task: str
    split: str
    core: str
    metric: str
    value: float
    note: str = ""
    games: tuple[str, ...] = ()
    setting: tuple[tuple[str, Any], ...] = ()


_RFWP = "RFWP paper (Irie et al. 2021) Tables 9-10"
_SRWM = "SRWM paper (Irie et al. 2022) Table 3"
_RTRL = "RTRL paper Table 1"
_SRWM_GAMES = ("bigfish", "fruitbot", "maze", "leaper", "plunder", "starpilot")
_POPGYM = "POPGym (Morad et al. 2023), per-environment MMER"


def _published() -> tuple[Published, ...]:
    rows: list[Published] = []
    for core in ("feedforward", "lstm", "linear_transformer", "delta_net", "rdn", "delta_rnn"):
        rows.append(Published(_RFWP, "atari", "Pong", "test", core, "return", 21.0, "50M steps"))
    rows.append(Published(_RFWP, "atari", "Qbert", "test", "rdn", "return", 987275.0, "200M steps"))
    rows.append(Published(_RFWP, "atari", "SpaceInvaders", "test", "rdn", "return", 170871.0, "200M steps"))
    srwm = {  # core: (train, test), normalised x100, 300M steps multi-task easy
        "feedforward": (22.5, 16.4), "lstm": (28.3, 15.7), "fake_sr": (27.0, 15.3),
        "delta_net": (35.0, 18.6), "srwm": (34.6, 20.0),
    }  # fmt: skip
    for core, (train, test) in srwm.items():
        rows.append(Published(_SRWM, "procgen", "*", "train", core, "normalised_x100", train,
                              "300M steps, 6 games, easy", _SRWM_GAMES))
        rows.append(Published(_SRWM, "procgen", "*", "test", core, "normalised_x100", test,
                              "300M steps, 6 games, easy, mean of 3 test splits", _SRWM_GAMES))
    rtrl = {  # (level, M): (TBPTT, RTRL), raw scores, < 1.2B frames
        ("rooms_select_nonmatching_object", 10): (54.5, 61.8),
        ("rooms_select_nonmatching_object", 50): (61.4, 62.0),
        ("rooms_select_nonmatching_object", 100): (61.7, 62.2),
        ("rooms_watermaze", 10): (15.8, 40.2),
        ("rooms_watermaze", 50): (44.5, 52.3),
        ("rooms_watermaze", 100): (45.6, 54.8),
    }
    popgym = {"RepeatFirst": 1.0, "RepeatPrevious": 1.0, "PositionOnlyCartPole": 1.0, "CountRecall": 0.177,
              "Autoencode": -0.283}  # the GRU, Easy (PAPERS.md §6: as copied, not yet checked against the table)
    for task, value in popgym.items():
        rows.append(Published(_POPGYM, "popgym", task, "test", "gru", "return", value,
                              "MMER, RLlib PPO, 15M steps, Easy", setting=(("difficulty", "easy"),)))
    for (level, m), (tbptt, rtrl_score) in rtrl.items():
        for grad, value in (("bptt", tbptt), ("rtrl", rtrl_score)):
            rows.append(Published(_RTRL, "dmlab", level, "test", "elstm", "return", value,
                                  f"{'RTRL' if grad == 'rtrl' else 'TBPTT'}, M={m}",
                                  setting=(("grad", grad), ("unroll_length", m))))
    return tuple(rows)


PUBLISHED: tuple[Published, ...] = _published()


def _setting_matches(p: Published, core_options: Mapping[str, Any], unroll_length: int | None,
                     env_options: Mapping[str, Any]) -> bool:
    for key, want in p.setting:
        if key == "unroll_length":
            have = unroll_length
        elif key == "difficulty":  # an env option (popgym's), easy unless the spec says otherwise
            have = env_options.get(key, "easy")
        else:
            have = core_options.get(key, "bptt" if key == "grad" else None)
        if have is None or str(have) != str(want):
            return False
    return True


def published_for(
    family: str,
    task: str,
    split: str,
    core: str,
    core_options: Mapping[str, Any] | None = None,
    unroll_length: int | None = None,
    games: tuple[str, ...] = (),
    env_options: Mapping[str, Any] | None = None,
) -> list[Published]:
    """Published figures for this setting; ``task="*"`` asks for aggregates over ``games``;
    ``env_options`` are the run's env spec options (a popgym figure is of one difficulty).

    A split named ``test_<start>`` counts as ``test``.
    """
    base_split = "test" if split.startswith("test") else split
    out = []
    for p in PUBLISHED:
        if (p.family, p.task, p.split, p.core) != (family, task, base_split, core):
            continue
        if task == "*" and set(p.games) != set(games):
            continue
        if _setting_matches(p, core_options or {}, unroll_length, env_options or {}):
            out.append(p)
    return out
