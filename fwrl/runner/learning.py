"""The learner loop: the work of a run's learner thread.

It takes batches of B rollout columns from the queue, makes one update each (gather on the
device, loss, backward, optimiser step, publish to the acting copy: ``fwrl.agents.learner``)
and, with several learner ranks, trades episodes and counters with the others
(``fwrl.runner.peers``). It stops at the step budget, when the run stops, or when too little
time is left for another update and the stop (the first update's length is unknown: a limit that
ends during it is passed by the rest of it). Every way out votes the other ranks to stop after
the same update. With ``learn`` false (``fwrl bench throughput --acting-only``) it makes no update:
each batch's columns go back to the store unread and count as agent steps.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from fwrl.agents.policy_weights import DeviceStreams
from fwrl.runner.build import Run
from fwrl.runner.peers import Peers
from fwrl.runner.stopping import Stop, TimeLimit


class LearnerLoop:
    """The learner thread of ``run`` (started by :meth:`start`); ``acting()`` gives the acting
    counters the ranks trade."""

    def __init__(self, run: Run, stop: Stop, limit: TimeLimit, peers: Peers, acting: Callable[[], dict[str, int]],
                 learn: bool = True):
        if not learn and run.group is not None:
            raise ValueError("a run without updates (learn=False) has one learner rank: its ranks vote and "
                             "all-reduce in their updates")
        self.run = run
        self.learn = learn
        self.stop = stop
        self.limit = limit
        self.peers = peers
        self.acting = acting
        self.first_updates = run.learner.stats.updates
        self.thread = threading.Thread(target=self._loop, name="fwrl-learner", daemon=True)

    @property
    def updated(self) -> bool:
        """This session has made an update."""
        return self.run.learner.stats.updates > self.first_updates

    def start(self) -> None:
        self.thread.start()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread (up to ``timeout`` seconds; nothing if it never started)."""
        if self.thread.ident is not None:
            self.thread.join(timeout)

    def _loop(self) -> None:
        run, learner, stop = self.run, self.run.learner, self.stop
        try:
            with DeviceStreams.use(run.streams.learner):
                while learner.stats.agent_steps < run.config.total_steps:
                    pieces = None
                    if not stop.is_set():
                        with run.learner_timer.stage("learner_idle"):
                            pieces = run.rollouts.get_batch(run.config.batch_size, stop.event)
                    if pieces is not None and self.updated and self.limit.must_stop():
                        pieces = None  # no time left for this update and the stop: leave it
                        stop.request("time limit")
                    if pieces is None:  # this rank stops: the others stop after the same update
                        learner.vote_stop()
                        break
                    with run.update_lock:
                        stats = learner.update(pieces) if self.learn else learner.discard(pieces)
                    if stats is None:  # another learner rank voted to stop
                        self.peers.stopped = True
                        break
                    self.peers.exchange(learner.stats.updates, run.model, self.acting)
        except BaseException as exc:  # raised by the acting thread once the run has stopped
            stop.fail(self.peers.explain(exc, learner.stats.agent_steps))
        finally:
            stop.set()

    def report(self) -> dict[str, Any]:
        """This part's counters and the last update's statistics for the metrics rows."""
        stats = self.run.learner.stats
        return {"agent_steps": stats.agent_steps, "updates": stats.updates, **stats.last}
