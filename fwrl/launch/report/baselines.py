"""Per-game reference scores: published normalisation constants, or a random policy's return.

- Atari and DeepMind Lab: human-normalised with the random / human scores of
  :mod:`fwrl.evaluation.scores`; ProcGen: min-max with Cobbe et al.'s constants; POPGym: the
  returns as they are (its package scales every task's rewards to episode returns in [-1, 1],
  POPGym's normalisation; the scores are MMER).
- Families without published constants (MinAtar, memory tasks, gym, ...): the
  mean return of a random-action policy, played here
  (``fwrl.envs.registry.make_env(spec, mode="test")``) and cached in
  ``random_policy.json`` of the report folder. For aggregates their scores are
  min-max normalised between that return and the best group mean of the game
  in this report (``relative``): 0 is random, 1 the best group here, so
  these numbers compare the groups of one report, not reports with each other.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from fwrl.envs.spec import parse_env_spec
from fwrl.evaluation import scores
from fwrl.utils.files import atomic_write_text

RANDOM_STEP_CAP = 200_000  # agent steps per game at most for the random policy (stops a never-ending env)
KIND_TEXT = {
    "human": "human-normalised, (R - random) / (human - random), published constants",
    "min-max": "min-max normalised with the published constants (Cobbe et al. 2020)",
    "relative": "min-max between the random policy's return and the best group mean of this report",
    "popgym": ("MMER as POPGym's package scales every task's rewards (Morad et al. 2023): an episode's return "
               "lies in [-1, 1] (the cart-poles': [0, 1]), so the scores are comparable across tasks as they are"),
}


@dataclass
class GameRef:
    """What a game's scores are measured against."""

    game: str
    family: str
    task: str
    kind: str  # "human", "min-max" (published constants), "popgym" (as they are), "relative" (random -> best here)
    random: float | None = None  # the random policy's mean return (published for atari / dmlab)
    random_source: str = ""  # "published", "random policy, N episodes", or why there is none
    best: float | None = None  # relative: the best group mean of this report

    def normalise(self, score: float) -> float | None:
        """``score`` normalised by this game's kind (None where it cannot be)."""
        if self.kind in ("human", "min-max", "popgym"):
            spec = parse_env_spec(self.game)
            return scores.normalise(self.family, self.task, score, spec.options)
        if self.kind == "relative" and self.random is not None and self.best is not None and self.best > self.random:
            return (float(score) - self.random) / (self.best - self.random)
        return None


def published_kind(game: str) -> tuple[str, float | None]:
    """The published normalisation of ``game`` ("" where there is none) and its published random score."""
    spec = parse_env_spec(game)
    task = spec.names[0]
    if scores.normalise(spec.family, task, 0.0, spec.options) is None:
        return "", None
    random = {"atari": scores.ATARI_RANDOM_HUMAN, "dmlab": scores.DMLAB_RANDOM_HUMAN}.get(spec.family, {}).get(task)
    return scores.normalisation_kind(spec.family), (random[0] if random else None)


def random_policy_return(game: str, episodes: int, seed: int) -> dict[str, Any]:
    """Play ``episodes`` random-action test episodes of ``game``: their returns and mean."""
    from fwrl.envs.registry import make_env

    env = make_env(game, seed=seed, mode="test")
    try:
        env.action_space.seed(seed)
        returns: list[float] = []
        steps = 0
        env.reset(seed=seed)
        total = 0.0
        while len(returns) < episodes and steps < RANDOM_STEP_CAP:
            _, reward, terminated, truncated, info = env.step(env.action_space.sample())
            total += float(reward)
            steps += 1
            if terminated or truncated:
                if info.get("game_over", True):
                    returns.append(total)
                    total = 0.0
                env.reset()
    finally:
        env.close()
    return {"episodes": len(returns), "seed": seed, "steps": steps,
            "mean": float(np.mean(returns)) if returns else None, "returns": returns}


class RandomPolicyCache:
    """``random_policy.json`` in the report folder: game -> the random policy's returns (per episodes, seed)."""

    def __init__(self, path: Path, compute: Callable[[str, int, int], dict[str, Any]] = random_policy_return):
        self.path = Path(path)
        self.compute = compute
        try:
            self.data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.data = {}
        self.changed = False

    def get(self, game: str, episodes: int, seed: int) -> dict[str, Any]:
        entry = self.data.get(game)
        if entry and entry.get("requested") == episodes and entry.get("seed") == seed:
            return entry
        entry = {**self.compute(game, episodes, seed), "requested": episodes}
        self.data[game] = entry
        self.changed = True
        return entry

    def save(self) -> None:
        if self.changed:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.path, json.dumps(self.data, indent=2) + "\n")
            self.changed = False


def game_refs(games: list[str], best: dict[str, float], cache: RandomPolicyCache | None, episodes: int,
              seed: int, say: Callable[[str], None] = lambda text: None) -> dict[str, GameRef]:
    """The reference of every game; ``best`` is each game's best group mean (for ``relative``)."""
    refs = {}
    for game in games:
        spec = parse_env_spec(game)
        kind, random = published_kind(game)
        ref = GameRef(game, spec.family, spec.names[0], kind, random, "published" if random is not None else "")
        if not kind:
            ref.kind, ref.best = "relative", best.get(game)
            if cache is None or episodes == 0:
                ref.random_source = "not computed (--random-episodes 0)"
            else:
                say(f"random policy: {game}, {episodes} episodes ...")
                try:
                    entry = cache.get(game, episodes, seed)
                except Exception as exc:  # the env cannot be made here (a missing library): said in the report
                    ref.random_source = f"unavailable: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
                else:
                    if entry.get("mean") is not None and math.isfinite(entry["mean"]):
                        ref.random = float(entry["mean"])
                        ref.random_source = f"random policy, {entry['episodes']} episodes"
                    else:
                        ref.random_source = f"random policy: no episode ended within {entry.get('steps', 0):,} steps"
        refs[game] = ref
    if cache is not None:
        cache.save()
    return refs
