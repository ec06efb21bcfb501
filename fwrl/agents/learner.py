"""The learner: gathers B rollout columns on its device, computes the IMPALA loss,
steps the optimiser, and publishes the new weights to the acting copy (PAPERS.md §4).

One ``update`` is timed in stages (``LEARNER_STAGES``): gathering the batch
from the rollout store, the forward over T+1 steps with the loss, the
backward, the optimiser step (clip, step, schedule) and the publish. The time
spent waiting for rollouts is ``learner_idle`` (counted by the caller, which
owns the queue). Each update also logs ``policy_lag_mean`` / ``policy_lag_max``:
how many updates behind the learner's weights the acting weights of the batch
were.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

from torch import nn

from fwrl.agents.distributed import LearnerGroup
from fwrl.agents.policy_weights import PolicyWeights
from fwrl.agents.rollouts import Batch, RolloutPiece, RolloutStore
from fwrl.agents.stage_timer import StageTimer
from fwrl.agents.update_step import LearnerSettings, optimise
from fwrl.envs.step_record import REWARD

if TYPE_CHECKING:
    from fwrl.agents.learner_process import UpdateProcess

LEARNER_STAGES = ("learner_gather", "learner_forward", "learner_backward", "learner_allreduce",
                  "learner_optimiser", "learner_publish")


@dataclass
class LearnerStats:
    updates: int = 0
    agent_steps: int = 0
    last: dict[str, float] = field(default_factory=dict)
    update_seconds: float = 0.0


class Learner:
    """``update(pieces)``: gather B columns from the store, then ``update_batch``. With a
    :class:`~fwrl.agents.distributed.LearnerGroup` the gradients of all learner ranks are summed
    before the optimiser step (``learner_allreduce``), so every rank steps alike; agent steps
    count all ranks' columns. With an :class:`~fwrl.agents.learner_process.UpdateProcess` (one
    rank on the CPU) the update's maths run in that process, off this process's GIL: the model's
    weights are shared with it, and :meth:`sync` brings its optimiser and schedule back."""

    def __init__(self, model: nn.Module, weights: PolicyWeights, optimizer, scheduler, settings: LearnerSettings,
                 store: RolloutStore | None, timer: StageTimer | None = None, group: LearnerGroup | None = None,
                 process: UpdateProcess | None = None):
        self.model = model
        self.weights = weights
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.settings = settings
        self.store = store
        self.device = next(model.parameters()).device
        self.timer = timer if timer is not None else StageTimer(self.device)
        self.stats = LearnerStats()
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.action_dims = getattr(model, "action_dims", None)
        self.group = group
        self.world_size = group.ranks.world_size if group is not None else 1
        if process is not None and group is not None:
            raise ValueError("an update process serves one learner rank: several ranks all-reduce inside the update")
        self.process = process

    def update(self, pieces: Sequence[RolloutPiece]) -> dict[str, float] | None:
        """One optimiser step on the B columns of ``pieces`` (None: a rank voted to stop, no step)."""
        with self.timer.stage("learner_gather", device_work=True):
            batch = self.store.gather(pieces)
        return self.update_batch(batch)

    def discard(self, pieces: Sequence[RolloutPiece]) -> dict[str, float]:
        """No update: the columns of ``pieces`` go back to the store unread and count as agent steps
        (``fwrl bench throughput --acting-only``: the acting path's rate with no learner work beside
        it). Returns no statistics."""
        with self.timer.stage("learner_gather"):
            self.store.discard(pieces)
        self.stats.agent_steps += sum(p.width for p in pieces) * self.store.spec.unroll_length * self.world_size
        return {}

    def update_batch(self, batch: Batch) -> dict[str, float] | None:
        """One optimiser step on a gathered batch (None: a rank voted to stop, no step): here, or
        in the update process where this learner has one (its stages' times come back with it)."""
        start = time.perf_counter()
        timer = self.timer
        lag_mean, lag_max = batch.policy_lag(self.weights.version)
        if self.process is not None:
            with timer.stage("learner_gather"):
                self.process.load(batch.tensors, batch.initial_state)
            stats, seconds = self.process.update()
            timer.add(seconds)
        else:
            stats = optimise(self.model, self.optimizer, self.scheduler, self.params, self.settings,
                             self.action_dims, batch.tensors, batch.initial_state, timer, self.group)
            if stats is None:
                return None
        with timer.stage("learner_publish", device_work=True):
            self.weights.publish(self.model)
        stats["policy_lag_mean"] = round(lag_mean, 3)
        stats["policy_lag_max"] = lag_max
        rows, columns = batch.tensors[REWARD].shape[:2]  # T + 1 rows of B columns
        self.stats.updates += 1
        self.stats.agent_steps += (rows - 1) * columns * self.world_size
        self.stats.last = stats
        self.stats.update_seconds = time.perf_counter() - start
        return stats

    def start(self, stop: threading.Event | None = None) -> bool:
        """Start the update process, where this learner has one, and wait until it is ready; False if
        ``stop`` was set first (no update can be made)."""
        if self.process is None:
            return True
        self.process.start()
        return self.process.wait_ready(stop)

    def sync(self) -> None:
        """Bring the optimiser's state and the schedule back from the update process (where this
        learner has one, started and alive) into ``optimizer`` and ``scheduler``, for a checkpoint;
        the weights need nothing: the process trains them in shared memory."""
        if self.process is not None and self.process.ready:
            optimizer_state, scheduler_state = self.process.training_state()
            self.optimizer.load_state_dict(optimizer_state)
            self.scheduler.load_state_dict(scheduler_state)

    def close(self) -> None:
        """Sync and stop the update process, where this learner has one (nothing otherwise)."""
        if self.process is not None:
            try:
                self.sync()
            finally:
                self.process.close()

    def vote_stop(self) -> None:
        """Tell the other learner ranks to stop after the update they are in (no step is taken)."""
        if self.group is not None:
            with self.timer.stage("learner_allreduce"):
                self.group.vote_stop(self.params)
