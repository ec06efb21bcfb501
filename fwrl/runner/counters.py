"""A run's counters, in one home: each part pushes its own, the others read them here.

The learner loop pushes the learner's counters after each update (its thread): agent steps,
updates, the last update's statistics and how long it took. The acting loop pushes its own after
each of the calling thread's steps and when its threads are joined: acted steps (the sessions
before a resume included), rollout columns handed over, worker restarts, dropped steps. The
metrics rows, the learner ranks' exchange (``fwrl.runner.peers``), the time limit's reserve and
the periodic jobs read them; no part reaches into another for its counters.
"""

from __future__ import annotations

from typing import Any

ACTING = ("acted_steps", "worker_restarts", "dropped_steps", "rollout_columns")  # in a metrics row's order


class Counters:
    """The counters of one learner rank's run, starting from ``agent_steps``, ``updates`` and
    ``acted_steps`` (a resumed run's checkpoint, else 0). One writer each: the learner thread for
    the learner's, the calling acting thread for the acting ones (whole values, swapped in one
    assignment, so a reader in another thread sees one push or the next, never half of one)."""

    def __init__(self, agent_steps: int = 0, updates: int = 0, acted_steps: int = 0):
        self.agent_steps = int(agent_steps)
        self.updates = int(updates)
        self.first_updates = int(updates)  # this session's first update makes ``updated`` true
        self.last: dict[str, Any] = {}  # the last update's statistics (losses, learning rate, policy lag)
        self.update_seconds = 0.0  # how long the last update took (the time limit keeps it back)
        self._acting = dict.fromkeys(ACTING, 0)
        self._acting["acted_steps"] = int(acted_steps)

    # ------------------------------------------------------------------ the learner loop's
    def learnt(self, agent_steps: int, updates: int, last: dict[str, Any], update_seconds: float) -> None:
        """After an update (learner thread): the learner's counters."""
        self.agent_steps, self.updates, self.last, self.update_seconds = agent_steps, updates, last, update_seconds

    @property
    def updated(self) -> bool:
        """This session has made an update."""
        return self.updates > self.first_updates

    # ------------------------------------------------------------------ the acting loop's
    def acted(self, acted_steps: int, worker_restarts: int, dropped_steps: int, rollout_columns: int) -> None:
        """The acting loop's counters now (calling acting thread)."""
        self._acting = {"acted_steps": acted_steps, "worker_restarts": worker_restarts,
                        "dropped_steps": dropped_steps, "rollout_columns": rollout_columns}

    @property
    def acted_steps(self) -> int:
        return self._acting["acted_steps"]

    def acting(self) -> dict[str, int]:
        """The acting counters (:data:`ACTING`), a copy."""
        return dict(self._acting)
