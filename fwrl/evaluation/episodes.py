"""Collecting evaluation episodes: a trained agent plays test-mode envs on a worker pool.

The core state runs through whole episodes: the inference loop keeps it per
env slot and the ``done`` flag of an episode's first frame resets it.

Reproducibility: evaluation steps the workers in lock step (inference waits
for every worker still playing, so the batch seen by the model never depends
on timing) and every env slot plays a fixed number of episodes,
``ceil(N / slots)``. Of those, the first N in the order (episode index within
its slot, worker, slot) are kept, so no episode is chosen for being short.
With ``--policy sample`` the sampling generator is seeded as well. The same
checkpoint, protocol and seed give the same episodes.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from fwrl.agents.inference import InferenceLoop
from fwrl.agents.traced_core import traced_by_default
from fwrl.envs.backends import make_pool
from fwrl.envs.spec import parse_env_spec
from fwrl.envs.worker_pool import PoolSettings, StepResult, WorkerPool
from fwrl.errors import FwrlError


@dataclass
class EvalEpisode:
    episode_return: float
    length: int
    task: int
    worker: int
    slot: int  # index within the worker
    index: int  # how many episodes this slot finished before
    extra: dict = field(default_factory=dict)


class EpisodeCollector:
    """A lock-step view of a pool that records each finished episode with its env slot (a
    :class:`~fwrl.envs.worker_pool.StepSource`: the acting loop steps it as it steps a pool).

    ``wait`` returns the results of every worker still playing, sorted by
    worker, and only once all of them answered. A worker whose slots have all
    played their quota is no longer returned, so it is never stepped again.
    """

    def __init__(self, pool: WorkerPool, num_tasks: int, quota: Mapping[int, int],
                 stop: threading.Event | None = None):
        self.pool = pool
        self.num_workers = pool.num_workers
        self.envs_per_worker = pool.envs_per_worker
        self.num_tasks = num_tasks
        self.quota = dict(quota)
        self.stop = stop
        self.episodes: dict[tuple[int, int], list[EvalEpisode]] = {
            (w, j): [] for w in range(self.num_workers) for j in range(self.envs_per_worker)
        }
        self._lives: dict[int, int] = {}
        self._active = set(range(self.num_workers))
        self._buffer: dict[int, StepResult] = {}

    @property
    def num_slots(self) -> int:
        return self.pool.num_slots

    @property
    def complete(self) -> bool:
        return not self._active

    def counted(self) -> tuple[int, int, float]:
        """(episodes played towards the slots' quotas, the quotas' sum, the mean return of those played)."""
        done, total, returns = 0, 0, 0.0
        for (worker, _), played in self.episodes.items():
            need = self.quota[worker % self.num_tasks]
            total += need
            done += min(need, len(played))
            returns += sum(ep.episode_return for ep in played[:need])
        return done, total, returns / done if done else math.nan

    def _worker_done(self, worker: int) -> bool:
        need = self.quota[worker % self.num_tasks]
        return all(len(self.episodes[(worker, j)]) >= need for j in range(self.envs_per_worker))

    def _record(self, r: StepResult) -> None:
        if self._lives.get(r.worker) != r.life:  # first result of a (re)started worker: fresh envs
            self._lives[r.worker] = r.life
            return
        ended = np.flatnonzero(r.done)
        if len(ended) != len(r.episodes):
            raise RuntimeError(
                f"worker {r.worker} ended {len(ended)} episodes but reported {len(r.episodes)} finished games; "
                "evaluation needs test-mode envs, where every episode is a whole game."
            )
        for slot, rec in zip(ended, r.episodes):
            played = self.episodes[(r.worker, int(slot))]
            played.append(EvalEpisode(rec.episode_return, rec.episode_step, rec.task, r.worker, int(slot),
                                      len(played), dict(rec.extra)))

    def wait(self, timeout: float | None = None) -> list[StepResult]:
        """Every active worker's result once all have answered, else [] when ``timeout`` passes first (the
        answers so far are kept for the next call). The acting loop calls again before it acts when it waits
        for more workers to join a batch: no worker is stepping then, so the call ends at its timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._active.issubset(self._buffer):
            if self.stop is not None and self.stop.is_set():
                return []
            left = 0.5 if deadline is None else min(0.5, deadline - time.monotonic())
            if left <= 0:
                return []
            for r in self.pool.wait(left):
                self._record(r)
                self._buffer[r.worker] = r
        results = [self._buffer[w] for w in sorted(self._active)]
        self._buffer.clear()
        self._active = {r.worker for r in results if not self._worker_done(r.worker)}
        return [r for r in results if r.worker in self._active]

    def act(self, worker: int, actions: np.ndarray) -> None:
        self.pool.act(worker, actions)

    def start(self) -> None:
        self.pool.start()

    def close(self) -> None:
        self.pool.close()

    def select(self, episodes: int) -> dict[int, list[EvalEpisode]]:
        """Per task, the first ``episodes`` in the order (index, worker, slot)."""
        out: dict[int, list[EvalEpisode]] = {t: [] for t in range(self.num_tasks)}
        for played in self.episodes.values():
            for ep in played:
                out[ep.task].append(ep)
        return {t: sorted(eps, key=lambda e: (e.index, e.worker, e.slot))[:episodes] for t, eps in out.items()}


def slots_per_task(num_tasks: int, num_workers: int, envs_per_worker: int) -> dict[int, int]:
    """Multi-task assignment: worker i runs game i mod n."""
    if num_workers < num_tasks:
        raise FwrlError(
            f"evaluating {num_tasks} games needs at least {num_tasks} workers (worker i runs game i mod "
            f"{num_tasks}), got --num-workers {num_workers}."
        )
    counts = {t: 0 for t in range(num_tasks)}
    for w in range(num_workers):
        counts[w % num_tasks] += envs_per_worker
    return counts


def play_episodes(
    model: nn.Module,
    env: str,
    *,
    episodes: int,
    greedy: bool = True,
    num_workers: int = 2,
    envs_per_worker: int = 1,
    seed: int = 0,
    device: torch.device | str = "cpu",
    backend: str = "local",
    step_timeout: float = 60.0,
    stop: threading.Event | None = None,
    backend_options: Mapping[str, Any] | None = None,
    env_wrappers: Sequence[str] = (),
    progress: Callable[[int, int, float], None] | None = None,
) -> dict[int, list[EvalEpisode]]:
    """``episodes`` finished test-mode episodes per task of ``env``, on a new pool of ``backend``
    (``env_wrappers``: the user wrappers the agent was trained with; ``progress``: see
    :func:`collect_episodes`)."""
    if episodes < 1:
        raise FwrlError(f"the number of evaluation episodes must be at least 1, got {episodes}.")
    slots_per_task(parse_env_spec(env).num_tasks, num_workers, envs_per_worker)  # check before spawning
    pool = make_pool(backend, PoolSettings(env, num_workers, envs_per_worker, seed, "test", step_timeout,
                                           tuple(env_wrappers)), **dict(backend_options or {}))
    return collect_episodes(model, pool, env, episodes=episodes, greedy=greedy, seed=seed, device=device,
                            stop=stop, progress=progress)


def collect_episodes(
    model: nn.Module,
    pool: WorkerPool,
    env: str,
    *,
    episodes: int,
    greedy: bool = True,
    seed: int = 0,
    device: torch.device | str = "cpu",
    stop: threading.Event | None = None,
    progress: Callable[[int, int, float], None] | None = None,
) -> dict[int, list[EvalEpisode]]:
    """Start ``pool`` (test-mode envs of ``env``), play until every slot has its quota, close it.

    Returns, per task index, the chosen episodes; an empty dict if ``stop`` was set first.
    ``progress(done, total, mean_return)`` is called after every step of the envs (episodes played
    towards the slots' quotas, their sum, and the mean return of those played).
    """
    spec = parse_env_spec(env)
    slots = slots_per_task(spec.num_tasks, pool.num_workers, pool.envs_per_worker)
    quota = {t: math.ceil(episodes / n) for t, n in slots.items()}
    device = torch.device(device)
    collector = EpisodeCollector(pool, spec.num_tasks, quota, stop)
    was_training = model.training
    model.eval()
    devices = [device.index or 0] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices, enabled=not greedy):
            if not greedy:
                torch.manual_seed(seed)
            collector.start()
            trace = traced_by_default(getattr(model, "core", None), device)
            loop = InferenceLoop(model, collector, None, device, threading.Lock(), greedy=greedy, trace=trace)
            while not collector.complete:
                if stop is not None and stop.is_set():
                    break
                loop.step(1.0)
                if progress is not None:
                    progress(*collector.counted())
    finally:
        collector.close()
        model.train(was_training)
    if not collector.complete:
        return {}
    return collector.select(episodes)
