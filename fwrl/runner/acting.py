"""The acting loop: the work of a run's acting thread.

Each :meth:`ActingLoop.step` serves the env workers that are ready: one batched forward with
the acting weights, the step written into the device rollout store, the actions sent back
(``fwrl.agents.inference.InferenceLoop``). A rollout that its last row completes goes to the
learner's queue, which blocks while it is full (back pressure on acting). Acting stops once the
rollouts of the step budget's last batch are handed over.
"""

from __future__ import annotations

from typing import Callable

from fwrl.agents.inference import InferenceLoop
from fwrl.agents.rollouts import Rollout
from fwrl.envs.worker_pool import EpisodeRecord
from fwrl.runner.build import Run
from fwrl.runner.run_metrics import Mean
from fwrl.runner.stopping import Stop


class ActingLoop:
    """Acting for every env slot of ``run``'s pool; finished episodes go to ``on_episode``."""

    def __init__(self, run: Run, stop: Stop, on_episode: Callable[[EpisodeRecord], None]):
        self.run = run
        self.stop = stop
        self.on_episode = on_episode
        self.inference = InferenceLoop(run.acting_model, run.pool, run.store, run.device, weights=run.weights,
                                       timer=run.actor_timer, graph=run.config.inference_graph)
        self.columns_needed = run.columns_needed()
        self.columns_done = 0  # rollout columns handed to the learner's queue in this session
        self.acted_before = int(run.resumed.get("acted_steps", 0))  # by the sessions before a resume
        self.queue_depth = Mean()

    @property
    def done(self) -> bool:
        """The rollouts of the budget's last batch are handed over: no more acting."""
        return self.columns_done >= self.columns_needed

    def step(self) -> None:
        """Serve the ready workers once (waiting up to 0.1 s for one); raises ``WorkersLost`` when
        no worker can run any more."""
        self.inference.step(0.1, on_rollout=self._hand_over, on_episode=self.on_episode)
        self.queue_depth.add(self.run.rollouts.qsize())

    def _hand_over(self, rollout: Rollout) -> None:
        if self.run.rollouts.put(rollout, self.stop.event):
            self.columns_done += rollout.columns

    @property
    def acted_steps(self) -> int:
        """Agent steps acted, the sessions before a resume included."""
        return self.acted_before + self.inference.agent_steps

    def report(self) -> dict[str, int]:
        """This part's counters for the metrics rows."""
        return {"acted_steps": self.acted_steps, "worker_restarts": self.run.pool.restarts,
                "dropped_steps": self.run.store.dropped_steps, "rollout_columns": self.columns_done}
