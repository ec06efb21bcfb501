"""A run's step budget: the one home of the agent steps one update takes.

An update takes B rollout columns of T steps on each of the run's learner ranks, so it counts
``batch_size x unroll_length x ranks`` agent steps (the learning-rate schedule, the learner's
stop, the acting loop's last rollouts and the progress display all read it here). The learner
takes whole batches while it is below ``total_steps``, so a run ends at most one update past it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Budget:
    """``total_steps`` agent steps, taken in updates of ``batch_size`` columns of ``unroll_length``
    steps on each of ``ranks`` learner ranks."""

    total_steps: int
    batch_size: int
    unroll_length: int
    ranks: int = 1

    @classmethod
    def of(cls, config, ranks: int = 1) -> "Budget":
        """The budget of a config (a ``TrainConfig``, or anything with its four fields) on ``ranks`` ranks."""
        return cls(int(config.total_steps), int(config.batch_size), int(config.unroll_length), int(ranks))

    @property
    def steps_per_update(self) -> int:
        """Agent steps of one update, every rank's columns counted."""
        return self.batch_size * self.unroll_length * self.ranks

    def reached(self, agent_steps: int) -> bool:
        """Whether ``agent_steps`` learnt so far meet the budget (the learner takes no more batches)."""
        return agent_steps >= self.total_steps

    def updates_left(self, agent_steps: int) -> int:
        """Updates still to make after ``agent_steps`` (a resumed run's count included): whole ones."""
        return -(-max(0, self.total_steps - agent_steps) // self.steps_per_update)

    def columns_needed(self, agent_steps: int) -> int:
        """Rollout columns (of T steps) one rank's acting must hand over for the updates left."""
        return self.updates_left(agent_steps) * self.batch_size
