"""Evaluation protocols (PAPERS.md §5): episodes, repeats and splits per env family.

- Atari: 30 episodes x 5 repeats of full games (``mode="test"``: no episodic
  life; ALE's 108 000-frame cap), greedy;
- ProcGen: the train levels (0-199 in easy, 0-499 in hard / memory, or the
  spec's own ``start_level`` / ``num_levels``) and the three test splits of
  the SRWM paper (Sec. 4.3: levels 1000-1199, 1200-1399, 1400-1599), 200
  episodes each, greedy;
- DeepMind Lab: the test configuration (``mode="test"``), 3 x 100 episodes
  (RTRL paper, Table 1), greedy;
- other families: 100 episodes, greedy.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Sequence

from fwrl.envs.spec import parse_env_spec
from fwrl.errors import unknown_choice

PROCGEN_TEST_STARTS = (1000, 1200, 1400)
PROCGEN_SPLIT_LEVELS = 200
PROCGEN_TRAIN_LEVELS = {"easy": 200, "hard": 500, "memory": 500}


@dataclass(frozen=True)
class Split:
    """A named evaluation setting: ``train``, ``test``, ``test_1000``..., with its env spec."""

    name: str
    env: str


@dataclass(frozen=True)
class Protocol:
    episodes: int
    repeats: int
    splits: tuple[Split, ...]


def protocol_splits(env: str) -> tuple[Split, ...]:
    """The evaluation splits of ``env`` (ProcGen: train + three test splits; others: test)."""
    spec = parse_env_spec(env)
    if spec.family != "procgen":
        return (Split("test", spec.text),)
    from fwrl.envs.registry import resolve

    _, family = resolve(spec)
    opts = family.validate(spec)
    if opts["distribution"] == "exploration":
        return (Split("test", spec.text),)
    if opts["num_levels"] > 0:
        train = spec.with_options(start_level=opts["start_level"], num_levels=opts["num_levels"])
    else:
        n = PROCGEN_TRAIN_LEVELS.get(opts["distribution"], PROCGEN_SPLIT_LEVELS)
        train = spec.with_options(start_level=0, num_levels=n)
    tests = tuple(
        Split(f"test_{start}", spec.with_options(start_level=start, num_levels=PROCGEN_SPLIT_LEVELS).text)
        for start in PROCGEN_TEST_STARTS
    )
    return (Split("train", train.text), *tests)


def default_protocol(env: str) -> Protocol:
    family = parse_env_spec(env).family
    episodes, repeats = {"atari": (30, 5), "procgen": (200, 1), "dmlab": (100, 3)}.get(family, (100, 1))
    return Protocol(episodes, repeats, protocol_splits(env))


def select_splits(splits: Sequence[Split], names: Sequence[str] | None) -> tuple[Split, ...]:
    if not names:
        return tuple(splits)
    by_name = {s.name: s for s in splits}
    for name in names:
        if name not in by_name:
            raise unknown_choice("evaluation split", name, by_name)
    return tuple(by_name[n] for n in names)


def default_num_workers(env: str) -> int:
    n = parse_env_spec(env).num_tasks
    cpus = min(os.cpu_count() or 1, 8)
    return n * max(1, math.ceil(cpus / n))
