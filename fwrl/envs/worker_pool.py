"""The env-worker interface shared by the ``local`` and ``ray`` backends.

A pool runs N workers with K envs each (N*K *slots*). Workers know nothing
about the model: they step their K envs with the actions they are given and
hand back numpy batches. The learner process drives them:

    pool.start()
    while training:
        for result in pool.wait(timeout):        # whichever workers are ready
            actions = policy(result.obs, ...)     # one batched forward for all
            pool.act(result.worker, actions)

A worker that crashes, raises or hangs past ``step_timeout`` is restarted by
the pool. Its next result has a new ``life`` number, every slot marked
``done`` (a fresh episode) and ``restarted=True``, so the learner resets
those slots' core state and drops their partial rollouts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class EpisodeRecord:
    """A finished game (Atari: all lives), as logged."""

    episode_return: float
    episode_step: int
    task: int
    worker: int
    extra: dict = field(default_factory=dict)  # e.g. {"success": 1.0} for memory tasks


@dataclass
class StepResult:
    """What one worker returns after stepping its K envs ([K, ...] arrays).

    The arrays may be views of the backend's buffers (the local backend's are
    shared memory): they are valid until the next ``act`` for this worker, so
    copy what must outlive it.
    """

    worker: int
    life: int
    obs: np.ndarray
    reward: np.ndarray  # float32 [K]: reward of the transition into obs
    done: np.ndarray  # bool [K]: obs is the first frame of a new episode
    episode_return: np.ndarray  # float32 [K]: return of the current game so far
    episode_step: np.ndarray  # int32 [K]
    task: np.ndarray  # int32 [K]
    episodes: list[EpisodeRecord]
    restarted: bool = False


class WorkersLost(Exception):
    """Raised by ``wait`` when no env worker can run any more (e.g. every env node of a
    Ray cluster is gone); training then stops with a final checkpoint. Subclasses of
    this and of ``FwrlError`` carry the user-facing message."""


class WorkerPool:
    """Base class of the worker backends: checks the counts, describes the env once."""

    num_workers: int
    envs_per_worker: int
    restarts: int = 0

    def __init__(self, env: str, num_workers: int, envs_per_worker: int, seed: int, mode: str,
                 step_timeout: float, start_timeout: float):
        from fwrl.envs.registry import describe_env
        from fwrl.errors import FwrlError

        if num_workers < 1 or envs_per_worker < 1:
            raise FwrlError(
                f"need at least one worker and one env per worker, got num_workers={num_workers}, "
                f"envs_per_worker={envs_per_worker}."
            )
        self.env = env
        self.info = describe_env(env)
        self.num_workers = num_workers
        self.envs_per_worker = envs_per_worker
        self.seed = seed
        self.mode = mode
        self.step_timeout = step_timeout
        self.start_timeout = start_timeout
        self.restarts = 0
        self.errors: list[str] = []

    @property
    def num_slots(self) -> int:
        return self.num_workers * self.envs_per_worker

    def slots_of(self, worker: int) -> slice:
        k = self.envs_per_worker
        return slice(worker * k, (worker + 1) * k)

    def start(self) -> None:
        raise NotImplementedError

    def wait(self, timeout: float | None = None) -> list[StepResult]:
        """Results of the workers that are ready (may be empty on timeout)."""
        raise NotImplementedError

    def act(self, worker: int, actions: np.ndarray) -> None:
        """Send K actions to ``worker``; its result comes back from a later ``wait``."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> "WorkerPool":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def make_pool(
    backend: str,
    env: str,
    num_workers: int,
    envs_per_worker: int,
    seed: int = 0,
    mode: str = "train",
    step_timeout: float = 60.0,
    **backend_options,
) -> WorkerPool:
    """Create a pool of the ``local`` (processes) or ``ray`` (Ray actors) backend."""
    from fwrl.errors import unknown_choice

    if backend == "local":
        from fwrl.envs.local_workers import LocalWorkerPool

        return LocalWorkerPool(env, num_workers, envs_per_worker, seed=seed, mode=mode, step_timeout=step_timeout)
    if backend == "ray":
        from fwrl.envs.ray_workers import RayWorkerPool

        return RayWorkerPool(
            env, num_workers, envs_per_worker, seed=seed, mode=mode, step_timeout=step_timeout, **backend_options
        )
    raise unknown_choice("worker backend", backend, ("local", "ray"))
