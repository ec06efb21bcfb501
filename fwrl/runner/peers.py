"""What the learner ranks of one run tell each other (``fwrl.agents.distributed``).

Every ``EXCHANGE_EVERY`` updates the learner threads of all ranks gather each rank's finished
episodes (rank 0 logs them all) and its acting counters (rank 0's metrics rows count every
rank's workers), and every ``CHECK_EVERY`` updates they compare a weight checksum. The learner
thread exchanges (this rank's acting counters read from the run's
:class:`~fwrl.runner.counters.Counters`); rank 0's acting thread reads what came in.
"""

from __future__ import annotations

import queue
from dataclasses import replace
from typing import Callable

from torch import nn

from fwrl.agents.distributed import CollectiveFailed, LearnerGroup, Ranks, first_of_share
from fwrl.envs.worker_pool import EpisodeRecord
from fwrl.errors import FwrlError
from fwrl.runner.counters import Counters
from fwrl.runner.run_metrics import Episodes

SUMMED = ("worker_restarts", "dropped_steps", "acted_steps")  # acting counters summed over the ranks


class Peers:
    """The other learner ranks, as rank ``ranks.rank`` sees them through ``group`` (None: a single
    learner); this rank's acting counters come from ``counters``."""

    EXCHANGE_EVERY = 10
    CHECK_EVERY = 200

    def __init__(self, ranks: Ranks, group: LearnerGroup | None, counters: Counters):
        self.ranks = ranks
        self.group = group
        self.counters = counters
        self.outbox: list[EpisodeRecord] = []  # this rank's finished episodes not yet sent (ranks > 0)
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()  # the others' episodes (rank 0)
        self.counts: dict[int, dict[str, int]] = {}  # rank -> its latest acting counters (rank 0)
        self.stopped = False  # another rank voted to stop

    def episode_sink(self, episodes: Episodes, num_workers: int) -> Callable[[EpisodeRecord], None]:
        """Where this rank's finished episodes go: its own log on rank 0, the outbox elsewhere, each
        named by its run-wide worker (of the run's ``num_workers``; a rank numbers its own from 0)."""
        if self.ranks.is_main:
            return episodes.add
        first = first_of_share(num_workers, self.ranks)
        return lambda record: self.outbox.append(replace(record, worker=first + record.worker))

    def exchange(self, updates: int, model: nn.Module) -> None:
        """After update number ``updates`` (learner thread): the exchange of episodes and acting
        counters (:data:`SUMMED`) and the check of ``model``'s weights, when due."""
        if self.group is None:
            return
        if updates % self.CHECK_EVERY == 0:
            self.group.check_same_weights(model)
        if updates % self.EXCHANGE_EVERY:
            return
        sent, self.outbox = self.outbox, []
        counts = {key: value for key, value in self.counters.acting().items() if key in SUMMED}
        for rank, (episodes, their_counts) in enumerate(self.group.gather((sent, counts))):
            if rank != self.ranks.rank and self.ranks.is_main:
                self.counts[rank] = their_counts
                for record in episodes:
                    self.inbox.put(record)

    def deliver(self, episodes: Episodes) -> None:
        """Rank 0: add the other ranks' episodes received so far."""
        while True:
            try:
                episodes.add(self.inbox.get_nowait())
            except queue.Empty:
                return

    def totals(self) -> dict[str, int]:
        """The other ranks' acting counters, to add to rank 0's own (empty for a single learner)."""
        return {key: sum(c[key] for c in self.counts.values()) for key in SUMMED} if self.counts else {}

    def explain(self, exc: BaseException, agent_steps: int) -> BaseException:
        """A failed collective becomes a message that names the ranks that stopped answering."""
        if self.group is None or not isinstance(exc, CollectiveFailed):
            return exc
        missing = self.group.missing_ranks()
        return FwrlError(
            f"learner rank {self.ranks.rank} of {self.ranks.world_size}: a collective with the other ranks failed, "
            f"so another rank died or hangs ({missing or exc}). The run stops with a checkpoint at "
            f"{agent_steps:,} agent steps (written by rank 0); continue it with --resume, on any number of learners.")
