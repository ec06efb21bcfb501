"""A run's metrics rows, made of what its parts report (``fwrl.runner.run_metrics`` says what a
row holds).

The parts push their counters into the run's :class:`~fwrl.runner.counters.Counters` (the learner
loop: agent steps, updates, the last update's losses; the acting loop: acted steps, rollout
columns, worker restarts, dropped steps); a row reads them there, with the episodes (means of the
last 100, per task), the threads' stage timers (where the time went), the acting loop's queue
depth and, on rank 0 of several learners, the other ranks' acting counters (added to its own).
It takes those collaborators, not the run.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch

from fwrl.agents.stage_timer import StageTimer
from fwrl.runner.counters import Counters
from fwrl.runner.peers import Peers
from fwrl.runner.run_metrics import Episodes, Mean, pipeline_row
from fwrl.runner.stopping import Clock


class RunStats:
    """The metrics rows of one run: its ``counters``, ``episodes`` (with the ones ``peers``
    received), ``clock``, the stage timers of its acting threads and its learner, the acting
    loop's ``queue_depth`` and the peak memory of ``device``."""

    def __init__(self, counters: Counters, episodes: Episodes, peers: Peers, clock: Clock,
                 actor_timers: Sequence[StageTimer], learner_timer: StageTimer, queue_depth: Mean,
                 device: torch.device):
        self.counters, self.episodes, self.peers, self.clock = counters, episodes, peers, clock
        self.actor_timers, self.learner_timer, self.queue_depth, self.device = (actor_timers, learner_timer,
                                                                                queue_depth, device)

    def row(self, steps_per_second: float) -> dict[str, Any]:
        """A row now: counters, rates, episode means, losses and where the interval's time went."""
        counters, episodes = self.counters, self.episodes
        self.peers.deliver(episodes)
        acting = counters.acting()
        for key, value in self.peers.totals().items():  # every rank's workers count
            acting[key] += value
        row = {
            "time": round(self.clock.elapsed(), 2),
            "agent_steps": counters.agent_steps,
            "acted_steps": acting.pop("acted_steps"),
            "updates": counters.updates,
            "steps_per_second": round(steps_per_second, 1) if not math.isnan(steps_per_second) else "",
            "episodes": episodes.count,
            "mean_return": episodes.mean_return(),
            "mean_success": episodes.mean_success(),
            **acting,
            **counters.last,
            **episodes.per_task(),
        }
        row.update(pipeline_row(self.actor_timers, self.learner_timer, self.queue_depth, self.device))
        return row
