"""The acting loop: the work of a run's acting threads.

The env workers are split into as many contiguous slices as the run has acting threads
(``acting_threads``: :func:`fwrl.runner.concurrency.acting_threads`); each thread serves its slice
with its own :class:`~fwrl.agents.inference.InferenceLoop` (its slots' core state, its staging
buffers, its forward with the shared acting weights, its CUDA stream and its stage timer) and
writes the same rollout store, whose pages of a worker only that worker's thread touches. The
calling thread serves the first slice (:meth:`ActingLoop.step`, between the run's periodic jobs);
:meth:`ActingLoop.start` starts a thread for each other slice.

Each step serves the ready workers of a slice: one batched forward with the acting weights, the
step written into the device rollout store, the actions sent back. A rollout that its last row
completes goes to the learner's queue, which blocks while it is full (back pressure on acting).
Acting stops once the rollouts of the step budget's last batch are handed over. Finished
episodes reach ``on_episode`` in the calling thread only (the other threads queue them), so
the episode log has one writer. The loop pushes its counters into the run's
:class:`~fwrl.runner.counters.Counters` after each of the calling thread's steps.

It takes its collaborators, not the run: the pool, the store, the rollout queue, the streams, a
maker of one thread's :class:`~fwrl.agents.inference.InferenceLoop` (a slice of the workers and
the thread's stage timer in, the loop out), the budget, the counters, the stop and the episode sink.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Callable, Sequence

from fwrl.agents.inference import InferenceLoop
from fwrl.agents.policy_weights import DeviceStreams
from fwrl.agents.rollout_queue import RolloutQueue
from fwrl.agents.rollouts import Rollout, RolloutStore
from fwrl.agents.stage_timer import StageTimer
from fwrl.envs.worker_pool import EpisodeRecord, PoolSlice, StepSource, WorkerPool, WorkersLost, split_workers
from fwrl.runner.budget import Budget
from fwrl.runner.counters import Counters
from fwrl.runner.run_metrics import Mean
from fwrl.runner.stopping import Stop


class Handover:
    """Finished rollouts handed to the learner's queue (``rollouts``) from any acting thread, their
    columns counted against the ``needed`` ones of the budget; ``put`` gives up when ``stop`` is set."""

    def __init__(self, rollouts: RolloutQueue, needed: int, stop: threading.Event):
        self.rollouts, self.needed, self.stop = rollouts, needed, stop
        self.columns = 0  # rollout columns handed over in this session
        self._lock = threading.Lock()

    @property
    def done(self) -> bool:
        """The rollouts of the budget's last batch are handed over."""
        return self.columns >= self.needed

    def put(self, rollout: Rollout) -> None:
        if self.rollouts.put(rollout, self.stop):
            with self._lock:
                self.columns += rollout.columns


class EpisodeRelay:
    """Finished episodes to ``on_episode`` in the calling thread only: the other acting threads queue
    theirs (:meth:`queue`), :meth:`deliver` hands them on, so the episode log has one writer."""

    def __init__(self, on_episode: Callable[[EpisodeRecord], None]):
        self.on_episode = on_episode
        self._queued: deque[EpisodeRecord] = deque()  # episodes of the other threads, not yet delivered

    def queue(self, episode: EpisodeRecord) -> None:
        self._queued.append(episode)

    def deliver(self) -> None:
        while self._queued:
            self.on_episode(self._queued.popleft())


class ActingLoop:
    """Acting for every env slot of ``pool``, one thread per timer in ``timers`` (each with the loop
    ``new_loop(slice, timer)`` makes), until the rollouts ``budget`` still needs after the counters'
    agent steps are handed to ``rollouts``; finished episodes go to ``on_episode``."""

    def __init__(self, pool: WorkerPool, store: RolloutStore, rollouts: RolloutQueue, streams: DeviceStreams,
                 new_loop: Callable[[StepSource, StageTimer], InferenceLoop], timers: Sequence[StageTimer],
                 budget: Budget, counters: Counters, stop: Stop, on_episode: Callable[[EpisodeRecord], None]):
        self.pool, self.store, self.streams = pool, store, streams
        self.counters = counters
        self.stop = stop
        threads = len(timers)
        splits = pool.settings.worker_splits  # a slice holds whole processes
        sources: list[StepSource] = [pool] if threads == 1 else [
            PoolSlice(pool, workers) for workers in split_workers(pool.num_workers, threads, splits)]
        self.loops = [new_loop(source, timer) for source, timer in zip(sources, timers)]
        self.handover = Handover(rollouts, budget.columns_needed(counters.agent_steps), stop.event)
        self.episodes = EpisodeRelay(on_episode)
        self.acted_before = counters.acted_steps  # by the sessions before a resume
        self.queue_depth = Mean()
        self.lost: WorkersLost | None = None  # set by a thread that found no worker able to run
        self._threads: list[threading.Thread] = []

    @property
    def columns_needed(self) -> int:
        """Rollout columns the budget still needs in this session."""
        return self.handover.needed

    @property
    def columns_done(self) -> int:
        """Rollout columns handed to the learner's queue in this session."""
        return self.handover.columns

    @property
    def done(self) -> bool:
        """The rollouts of the budget's last batch are handed over: no more acting."""
        return self.handover.done

    def start(self) -> None:
        """Start a thread for each slice but the first (the caller's): it acts until the run stops
        or the budget's rollouts are done."""
        for index, loop in enumerate(self.loops[1:], 1):
            thread = threading.Thread(target=self._serve, args=(index, loop), name=f"fwrl-acting-{index}",
                                      daemon=True)
            thread.start()
            self._threads.append(thread)

    def _serve(self, index: int, loop: InferenceLoop) -> None:
        try:
            with DeviceStreams.use(self.streams.acting_stream(index)):
                while not self.stop.is_set() and not self.done:
                    loop.step(0.1, on_rollout=self.handover.put, on_episode=self.episodes.queue)
        except WorkersLost as exc:  # the run stops cleanly: final checkpoint, then the message
            self.lost = self.lost or exc
            self.stop.request("workers lost")
        except BaseException as exc:  # noqa: BLE001 - re-raised by train() once the run has stopped
            self.stop.fail(exc)

    def step(self) -> None:
        """Serve the first slice's ready workers once (waiting up to 0.1 s for one) and deliver the
        episodes the other threads finished; raises ``WorkersLost`` when no worker can run any more."""
        self.loops[0].step(0.1, on_rollout=self.handover.put, on_episode=self.episodes.on_episode)
        self.deliver()
        self.queue_depth.add(self.handover.rollouts.qsize())

    def deliver(self) -> None:
        """Hand the episodes the other acting threads finished to ``on_episode`` and push the
        counters (calling thread)."""
        self.episodes.deliver()
        self.counters.acted(self.acted_steps, self.pool.restarts, self.store.dropped_steps, self.columns_done)

    def join(self) -> None:
        """Wait for the other acting threads (after the run's stop is set) and deliver their last episodes."""
        for thread in self._threads:
            thread.join()
        self._threads.clear()
        self.deliver()

    @property
    def acted_steps(self) -> int:
        """Agent steps acted, the sessions before a resume included."""
        return self.acted_before + sum(loop.agent_steps for loop in self.loops)
