"""Learning tests with a second seed.

IMPALA with asynchronous actors is not deterministic (which workers are batched
together depends on timing), and memory tasks are bimodal: an agent either
discovers the cue or stays at chance. A learning claim is therefore tested as
"reaches the threshold with seed 1, or else seed 2, or else seed 3", which still
fails for a model that cannot learn the task (feedforward never passes it).
"""

from __future__ import annotations

from typing import Callable

SEEDS = (1, 2, 3)


def reaches(run: Callable[[int], float], threshold: float, seeds=SEEDS) -> tuple[bool, list[float]]:
    """Run ``run(seed)`` for each seed until one reaches ``threshold``; returns (passed, scores)."""
    scores = []
    for seed in seeds:
        scores.append(run(seed))
        if scores[-1] >= threshold:
            return True, scores
    return False, scores
