"""A run's metrics rows, made of what its parts report (``fwrl.runner.run_metrics`` says what a
row holds).

Each part owns its counters and reports them through one call: the learner loop (agent steps,
updates, the last update's losses), the acting loop (acted steps, rollout columns, worker
restarts, dropped steps), the episodes (means of the last 100, per task), the threads' stage
timers (where the time went) and, on rank 0 of several learners, the other ranks' acting
counters (added to its own).
"""

from __future__ import annotations

import math
from typing import Any

from fwrl.runner.acting import ActingLoop
from fwrl.runner.build import Run
from fwrl.runner.learning import LearnerLoop
from fwrl.runner.peers import Peers
from fwrl.runner.run_metrics import pipeline_row


class RunStats:
    """The metrics rows of ``run``."""

    def __init__(self, run: Run, acting: ActingLoop, learning: LearnerLoop, peers: Peers):
        self.run, self.acting, self.learning, self.peers = run, acting, learning, peers

    def row(self, steps_per_second: float) -> dict[str, Any]:
        """A row now: counters, rates, episode means, losses and where the interval's time went."""
        run = self.run
        self.peers.deliver(run.episodes)
        learner = self.learning.report()
        acting = self.acting.report()
        for key, value in self.peers.totals().items():  # every rank's workers count
            acting[key] += value
        episodes = run.episodes
        row = {
            "time": round(run.clock.elapsed(), 2),
            "agent_steps": learner.pop("agent_steps"),
            "acted_steps": acting.pop("acted_steps"),
            "updates": learner.pop("updates"),
            "steps_per_second": round(steps_per_second, 1) if not math.isnan(steps_per_second) else "",
            "episodes": episodes.count,
            "mean_return": episodes.mean_return(),
            "mean_success": episodes.mean_success(),
            **acting,
            **learner,
            **episodes.per_task(),
        }
        row.update(pipeline_row(run.actor_timers, run.learner_timer, self.acting.queue_depth, run.device))
        return row
