"""The periodic jobs of a run's acting thread, each on its own trigger.

The acting loop calls :meth:`Schedule.run_due` after every acting step (rank 0 only); each job
runs when its trigger says it is due:

- ``metrics``: a metrics row every ``log_interval`` seconds (:class:`EverySeconds`), and every
  ``log_every_steps`` agent steps where that is set (:class:`EitherOf`);
- ``checkpoint``: ``checkpoint.pt`` soon after the session's first update, then every
  ``checkpoint_interval`` seconds (:class:`AfterFirstUpdate`);
- ``milestone``: a kept ``checkpoint-<steps>.pt`` every ``milestone_interval`` agent steps
  (:class:`EverySteps`);
- ``evaluation``: a look at the periodic evaluation (``--eval-every``, which keeps its own
  step marks) at every step (:class:`Always`);
- ``video``: a look at the periodic video (``--video-every``, which keeps its own update marks)
  at every step (:class:`Always`).

:func:`periodic_jobs` makes rank 0's schedule from the intervals and the jobs' collaborators (a
maker of metrics rows, where rows and checkpoints go, whether the first update is done), not the run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol


class Trigger(Protocol):
    def due(self, now: float, steps: int) -> bool:
        """Whether the job is due at ``now`` (monotonic seconds) and ``steps`` agent steps; a due
        trigger counts its next time from here."""


class Always:
    def due(self, now: float, steps: int) -> bool:
        return True


class EverySeconds:
    """Every ``seconds`` of wall time, the first ``seconds`` after ``start``."""

    def __init__(self, seconds: float, start: float):
        self.seconds, self.last = seconds, start

    def due(self, now: float, steps: int) -> bool:
        if now - self.last < self.seconds:
            return False
        self.last = now
        return True


class AfterFirstUpdate(EverySeconds):
    """As soon as ``updated()`` (the session's first update is done), then every ``seconds``."""

    def __init__(self, seconds: float, start: float, updated: Callable[[], bool]):
        super().__init__(seconds, start)
        self.updated = updated
        self.first_done = False

    def due(self, now: float, steps: int) -> bool:
        first = not self.first_done and self.updated()
        if not first and now - self.last < self.seconds:
            return False
        self.first_done, self.last = True, now
        return True


class EitherOf:
    """Due when ``seconds`` or ``steps`` is; each counts its next time from any row (no row twice close)."""

    def __init__(self, seconds: "EverySeconds", steps: "EverySteps"):
        self.seconds, self.steps = seconds, steps

    def due(self, now: float, steps: int) -> bool:
        if not (self.seconds.due(now, steps) or self.steps.due(now, steps)):
            return False
        self.seconds.last = now
        if self.steps.interval > 0:
            self.steps.next = self.steps._after(steps)
        return True


class EverySteps:
    """Each time the agent steps pass a multiple of ``interval`` (never for 0)."""

    def __init__(self, interval: int, steps: int):
        self.interval = interval
        self.next = self._after(steps)

    def _after(self, steps: int) -> int:
        return (steps // self.interval + 1) * self.interval if self.interval > 0 else 0

    def due(self, now: float, steps: int) -> bool:
        if not self.next or steps < self.next:
            return False
        self.next = self._after(steps)
        return True


@dataclass
class Job:
    name: str
    trigger: Trigger
    run: Callable[[float, int], None]  # (now, agent steps)


class Schedule:
    """The jobs, run in order when due."""

    def __init__(self, jobs: list[Job]):
        self.jobs = jobs

    def run_due(self, now: float, steps: int) -> None:
        for job in self.jobs:
            if job.trigger.due(now, steps):
                job.run(now, steps)


class MetricsJob:
    """A metrics row (``row(steps_per_second)``) written with ``write``, its rate the agent steps per
    second since the last row (or since ``now`` and ``steps``, the schedule's start)."""

    def __init__(self, row: Callable[[float], dict[str, Any]], write: Callable[[dict[str, Any]], None],
                 now: float, steps: int):
        self.make_row, self.write = row, write
        self.last_time, self.last_steps = now, steps

    def __call__(self, now: float, steps: int) -> None:
        self.write(self.make_row((steps - self.last_steps) / (now - self.last_time)))
        self.last_time, self.last_steps = now, steps


def periodic_jobs(now: float, steps: int, *, log_interval: float, checkpoint_interval: float,
                  milestone_interval: int, row: Callable[[float], dict[str, Any]],
                  write: Callable[[dict[str, Any]], None], checkpoint: Callable[[str], None],
                  updated: Callable[[], bool], evaluation: Callable[[float, int], None] | None = None,
                  video: Callable[[float, int], None] | None = None, log_every_steps: int = 0) -> Schedule:
    """Rank 0's schedule from ``now`` (monotonic seconds) and ``steps`` (the agent steps so far): a
    metrics row every ``log_interval`` seconds (and every ``log_every_steps`` agent steps, where > 0:
    whichever comes first), the periodic ``evaluation`` (where given) at every
    step, the periodic ``video`` (where given) at every step, ``checkpoint("checkpoint.pt")`` once
    ``updated()`` then every ``checkpoint_interval``
    seconds, and ``checkpoint("checkpoint-<steps>.pt")`` every ``milestone_interval`` agent steps."""
    metrics: Trigger = EverySeconds(log_interval, now)
    if log_every_steps > 0:
        metrics = EitherOf(metrics, EverySteps(log_every_steps, steps))
    jobs = [Job("metrics", metrics, MetricsJob(row, write, now, steps))]
    if evaluation is not None:
        jobs.append(Job("evaluation", Always(), evaluation))
    if video is not None:
        jobs.append(Job("video", Always(), video))
    jobs += [
        Job("checkpoint", AfterFirstUpdate(checkpoint_interval, now, updated),
            lambda now, steps: checkpoint("checkpoint.pt")),
        Job("milestone", EverySteps(milestone_interval, steps),
            lambda now, steps: checkpoint(f"checkpoint-{steps}.pt")),
    ]
    return Schedule(jobs)
