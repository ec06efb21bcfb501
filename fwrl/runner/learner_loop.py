"""The learner loop: the work of a run's learner thread.

It takes batches of B rollout columns from the queue, makes one update each (gather on the
device, loss, backward, optimiser step, publish to the acting copy: ``fwrl.agents.learner``)
and, with several learner ranks, trades episodes and counters with the others
(``fwrl.runner.peers``). It stops at the step budget, when the run stops, or when too little
time is left for another update and the stop (the first update's length is unknown: a limit that
ends during it is passed by the rest of it). Every way out votes the other ranks to stop after
the same update. With ``learn`` false (``fwrl bench throughput --acting-only``) it makes no update:
each batch's columns go back to the store unread and count as agent steps.

It takes its collaborators, not the run: the learner, the rollout queue, the budget, the learner's
stage timer and stream, the lock a checkpoint's copy takes, the counters it pushes the learner's
into after each update, the stop, the time limit and the peers.
"""

from __future__ import annotations

import threading

import torch

from fwrl.agents.learner import Learner
from fwrl.agents.policy_weights import DeviceStreams
from fwrl.agents.rollout_queue import RolloutQueue
from fwrl.agents.stage_timer import StageTimer
from fwrl.runner.budget import Budget
from fwrl.runner.counters import Counters
from fwrl.runner.peers import Peers
from fwrl.runner.stopping import Stop, TimeLimit


class LearnerLoop:
    """The learner thread (started by :meth:`start`): batches of ``budget.batch_size`` columns from
    ``rollouts``, one ``learner`` update each (under ``update_lock``, on ``stream``), until the
    budget, the stop or the time limit."""

    def __init__(self, learner: Learner, rollouts: RolloutQueue, budget: Budget, timer: StageTimer,
                 stream: torch.cuda.Stream | None, update_lock: threading.Lock, counters: Counters, stop: Stop,
                 limit: TimeLimit, peers: Peers, learn: bool = True):
        if not learn and learner.group is not None:
            raise ValueError("a run without updates (learn=False) has one learner rank: its ranks vote and "
                             "all-reduce in their updates")
        self.learner, self.rollouts, self.budget, self.timer = learner, rollouts, budget, timer
        self.stream, self.update_lock, self.counters = stream, update_lock, counters
        self.learn = learn
        self.stop = stop
        self.limit = limit
        self.peers = peers
        self.thread = threading.Thread(target=self._loop, name="fwrl-learner", daemon=True)

    @property
    def updated(self) -> bool:
        """This session has made an update."""
        return self.counters.updated

    def start(self) -> None:
        self.thread.start()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread (up to ``timeout`` seconds; nothing if it never started)."""
        if self.thread.ident is not None:
            self.thread.join(timeout)

    def _loop(self) -> None:
        learner, stop, counters = self.learner, self.stop, self.counters
        try:
            if self.learn and not learner.start(stop.event):  # its update process, where it has one
                return  # the run stopped while that process started: nothing learnt, nothing to vote
            with DeviceStreams.use(self.stream):
                while not self.budget.reached(counters.agent_steps):
                    pieces = None
                    if not stop.is_set():
                        with self.timer.stage("learner_idle"):
                            pieces = self.rollouts.get_batch(self.budget.batch_size, stop.event)
                    if pieces is not None and self.updated and self.limit.must_stop():
                        pieces = None  # no time left for this update and the stop: leave it
                        stop.request("time limit")
                    if pieces is None:  # this rank stops: the others stop after the same update
                        learner.vote_stop()
                        break
                    with self.update_lock:
                        stats = learner.update(pieces) if self.learn else learner.discard(pieces)
                        done = learner.stats
                        counters.learnt(done.agent_steps, done.updates, done.last, done.update_seconds)
                    if stats is None:  # another learner rank voted to stop
                        self.peers.stopped = True
                        break
                    self.peers.exchange(counters.updates, learner.model)
        except BaseException as exc:  # raised by the acting thread once the run has stopped
            stop.fail(self.peers.explain(exc, counters.agent_steps))
        finally:
            stop.set()
            self._close()

    def _close(self) -> None:
        """The update process's state back and the process stopped (under the update lock: a
        checkpoint's copy may be reading it); a failure there stops the run with it."""
        try:
            with self.update_lock:
                self.learner.close()
        except Exception as exc:
            self.stop.fail(exc)
