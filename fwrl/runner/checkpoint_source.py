"""What a checkpoint is copied from: :class:`CheckpointSource` owns what a snapshot reads.

A snapshot (:meth:`CheckpointSource.snapshot`) is taken between two updates, under the lock the
learner holds for a whole update, so the learner waits only for the copy and the acting threads
not at all: the learner's model, optimiser, schedule and counters (brought back from its update
process first, where it has one), the run's clock and episode count, the acted steps and the
metrics rows written so far, the config, the env's description and the run's identity.
:class:`~fwrl.runner.checkpointing.CheckpointWriter` writes what it returns.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import torch

from fwrl.agents.checkpoint import checkpoint_payload
from fwrl.agents.learner import Learner
from fwrl.runner.run_metrics import Episodes
from fwrl.runner.stopping import Clock


@dataclass
class CheckpointSource:
    """The parts a checkpoint of one run is copied from, and how long the last copy took."""

    learner: Learner  # its model, optimiser, schedule and counters
    update_lock: threading.Lock  # held by the learner for a whole update
    learner_stream: torch.cuda.Stream | None  # the learner's CUDA stream, whose last work a copy waits for
    device: torch.device
    clock: Clock
    episodes: Episodes
    config: dict[str, Any]  # the run's config (TrainConfig.to_dict())
    env_info: dict[str, Any]  # the env's description (EnvInfo.to_dict())
    run: dict[str, str] | None  # the run's identity (RunDir.identity; rank 0's), None on other ranks
    copy_seconds: float = 0.0  # how long the last snapshot's copy took (a time limit keeps it back)

    def snapshot(self, acted_steps: int, metrics_rows: int = -1) -> dict[str, Any]:
        """A checkpoint's contents, copied between two updates (the actors go on); ``metrics_rows``:
        the rows of metrics.csv written so far (a resume keeps those, drops later ones)."""
        learner = self.learner
        with self.update_lock:
            began = time.monotonic()
            learner.sync()  # the optimiser and the schedule, from the update process where there is one
            if self.learner_stream is not None:  # the last update's work must be done before it is copied
                torch.cuda.current_stream(self.device).wait_stream(self.learner_stream)
            payload = checkpoint_payload(
                model=learner.model, optimizer=learner.optimizer, scheduler=learner.scheduler,
                agent_steps=learner.stats.agent_steps, updates=learner.stats.updates,
                config=self.config, env_info=self.env_info,
                progress={"elapsed_seconds": self.clock.elapsed(), "episodes": self.episodes.count,
                          "acted_steps": int(acted_steps), "metrics_rows": int(metrics_rows)},
                run=self.run)
            self.copy_seconds = time.monotonic() - began
            return payload
