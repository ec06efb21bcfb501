"""The env-worker interface shared by the ``local`` and ``ray`` backends.

A pool runs N workers with K envs each (N*K *slots*). Workers know nothing
about the model: they step their K envs with the actions they are given and
hand back numpy batches. The learner process drives them:

    pool.start()
    while training:
        for result in pool.wait(timeout):        # whichever workers are ready
            actions = policy(result.obs, ...)     # one batched forward for all
            pool.act(result.worker, actions)

Actions are int arrays ``[K]`` (one action dim: ``Discrete``) or ``[K, D]``
(``D = len(info.action_dims)``: ``MultiDiscrete``) of 0-based indices.

Episode ends: ``done`` marks a slot whose ``obs`` is the first frame of a new
episode (the core resets there), for both kinds of end; ``truncated`` marks
those whose previous episode was cut (a time limit) rather than terminated,
and only there ``final_obs`` (and ``final_obs_extra``) hold that episode's
last observation, as gymnasium's ``step`` returned it before the worker reset
the env (for bootstrapping); elsewhere they are zeros.

A worker that crashes, raises or hangs past ``step_timeout`` is restarted by
the pool. Its next result has a new ``life`` number, every slot marked
``done`` (a fresh episode) and ``restarted=True``, so the learner resets
those slots' core state and drops their partial rollouts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from fwrl.errors import FwrlError


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
    obs: np.ndarray  # [K, *info.obs_shape] of info.obs_dtype
    reward: np.ndarray  # float32 [K]: reward of the transition into obs
    done: np.ndarray  # bool [K]: obs is the first frame of a new episode (terminated or truncated)
    episode_return: np.ndarray  # float32 [K]: return of the current game so far
    episode_step: np.ndarray  # int32 [K]
    task: np.ndarray  # int32 [K]
    episodes: list[EpisodeRecord]
    restarted: bool = False
    # bool [K]: the previous episode was cut by a time limit (done is true there too); False for
    # a terminated episode and for a worker's fresh start
    truncated: np.ndarray | None = None
    final_obs: np.ndarray | None = None  # like obs: last obs of the cut episode, where truncated (else 0)
    obs_extra: np.ndarray | None = None  # float32 [K, info.extra_size]; None when extra_size == 0
    final_obs_extra: np.ndarray | None = None  # like obs_extra, where truncated (else 0)


FINAL_FIELDS = ("final_obs", "final_obs_extra")  # valid only in truncated rows


def result_fields(obs_shape: tuple[int, ...], obs_dtype: str,
                  extra_size: int = 0) -> dict[str, tuple[tuple[int, ...], str]]:
    """Per-slot (shape, dtype) of the arrays of a :class:`StepResult`, as both backends allocate them
    (``obs_extra`` and ``final_obs_extra`` only when ``extra_size > 0``)."""
    fields = {
        "obs": (tuple(obs_shape), obs_dtype),
        "reward": ((), "float32"),
        "done": ((), "bool"),
        "episode_return": ((), "float32"),
        "episode_step": ((), "int32"),
        "task": ((), "int32"),
        "truncated": ((), "bool"),
        "final_obs": (tuple(obs_shape), obs_dtype),
    }
    if extra_size > 0:
        fields["obs_extra"] = ((int(extra_size),), "float32")
        fields["final_obs_extra"] = ((int(extra_size),), "float32")
    return fields


class WorkersLost(Exception):
    """Raised by ``wait`` when no env worker can run any more (e.g. every env node of a
    Ray cluster is gone); training then stops with a final checkpoint. Subclasses of
    this and of ``FwrlError`` carry the user-facing message."""


class WorkerPool:
    """Base class of the worker backends: checks the counts, describes the env once,
    and keeps the fault bookkeeping both backends share (lives, the restart
    counter and log, workers that never start).

    A backend implements ``start``, ``wait``, ``act``, ``close``, ``pid`` and the
    two hooks ``_spawn(worker)`` (start the worker's current life, whose first
    result is the envs' reset) and ``_kill(worker)`` (stop it, whatever state it
    is in), plus ``_answered(worker)`` (its current life has sent a result).
    """

    num_workers: int
    envs_per_worker: int
    restarts: int = 0

    def __init__(self, env: str, num_workers: int, envs_per_worker: int, seed: int, mode: str,
                 step_timeout: float, start_timeout: float, max_start_failures: int = 5,
                 env_wrappers: Sequence[str] = ()):
        from fwrl.envs.registry import describe_env, resolve
        from fwrl.envs.user_wrappers import check_wrappers
        from fwrl.envs.vector_paths import check_vector_wrappers

        if num_workers < 1 or envs_per_worker < 1:
            raise FwrlError(
                f"need at least one worker and one env per worker, got num_workers={num_workers}, "
                f"envs_per_worker={envs_per_worker}."
            )
        self.env = env
        self.env_wrappers = check_wrappers(env_wrappers)  # before any worker starts: a bad one is an error here
        check_vector_wrappers(resolve(env)[0], self.env_wrappers)
        self.info = describe_env(env, self.env_wrappers)
        self.result_specs = result_fields(self.info.obs_shape, self.info.obs_dtype, self.info.extra_size)
        self.num_workers = num_workers
        self.envs_per_worker = envs_per_worker
        self.seed = seed
        self.mode = mode
        self.step_timeout = step_timeout
        self.start_timeout = start_timeout
        if max_start_failures < 1:
            raise FwrlError(f"max_start_failures must be >= 1, got {max_start_failures}.")
        self.max_start_failures = max_start_failures
        self.restarts = 0
        self.errors: list[str] = []  # "worker W (life L): reason" per restart
        self._lives = [0] * num_workers
        self._restarted = [False] * num_workers  # the next result is the first of a new life
        self._start_failures = [0] * num_workers  # lives in a row that died before their first result

    @property
    def num_slots(self) -> int:
        return self.num_workers * self.envs_per_worker

    def slots_of(self, worker: int) -> slice:
        k = self.envs_per_worker
        return slice(worker * k, (worker + 1) * k)

    def start(self) -> None:
        raise NotImplementedError

    def pid(self, worker: int) -> int | None:
        """OS process id of ``worker``'s current life (None while it is being replaced,
        and for a Ray actor until its first result told where it runs)."""
        raise NotImplementedError

    def wait(self, timeout: float | None = None) -> list[StepResult]:
        """Results of the workers that are ready (may be empty on timeout)."""
        raise NotImplementedError

    def act(self, worker: int, actions: np.ndarray) -> None:
        """Send K actions to ``worker`` (``[K]``, or ``[K, D]`` for several action dims); its result
        comes back from a later ``wait``."""
        raise NotImplementedError

    def _actions(self, actions: np.ndarray) -> np.ndarray:
        """``actions`` as int64 ``[K, *info.action_shape]``; ValueError for another shape."""
        a = np.asarray(actions)
        want = (self.envs_per_worker, *self.info.action_shape)
        if a.shape != want and not (len(self.info.action_dims) == 1 and a.shape == (self.envs_per_worker, 1)):
            raise ValueError(f"actions of shape {a.shape} for a worker of {self.envs_per_worker} envs with "
                             f"action_dims {self.info.action_dims}; expected {want}")
        if not np.issubdtype(a.dtype, np.integer):
            raise ValueError(f"actions must be integers, got dtype {a.dtype}")
        return a.astype(np.int64, copy=False).reshape(want)

    def close(self) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ shared fault handling
    def _spawn(self, worker: int) -> None:
        raise NotImplementedError

    def _kill(self, worker: int) -> None:
        raise NotImplementedError

    def _answered(self, worker: int) -> bool:
        raise NotImplementedError

    def _restart(self, worker: int, reason: str) -> None:
        """Replace a faulty worker by a new life with fresh envs (new seeds).

        A worker whose lives keep dying before their first result (an env that
        cannot be made, a missing ROM) would be respawned forever: after
        ``max_start_failures`` such lives in a row this raises ``FwrlError``.
        """
        self.restarts += 1
        self.errors.append(f"worker {worker} (life {self._lives[worker]}): {reason}")
        if not self._answered(worker):
            self._start_failures[worker] += 1
        self._kill(worker)
        if self._start_failures[worker] >= self.max_start_failures:
            raise FwrlError(
                f"env worker {worker} failed {self._start_failures[worker]} times in a row before its envs "
                f"were reset ({self.env!r}); last error: {reason}"
            )
        self._lives[worker] += 1
        self._restarted[worker] = True
        self._spawn(worker)

    def _result(self, worker: int, arrays: dict[str, np.ndarray], episodes: list[EpisodeRecord]) -> StepResult:
        """The result of one answered step (or reset) of ``worker``, from its [K, ...] arrays."""
        self._start_failures[worker] = 0
        restarted = self._restarted[worker]
        self._restarted[worker] = False
        return StepResult(
            worker=worker,
            life=self._lives[worker],
            obs=arrays["obs"],
            reward=arrays["reward"],
            done=arrays["done"],
            episode_return=arrays["episode_return"],
            episode_step=arrays["episode_step"],
            task=arrays["task"],
            episodes=list(episodes),
            restarted=restarted,
            truncated=arrays["truncated"],
            final_obs=arrays["final_obs"],
            obs_extra=arrays.get("obs_extra"),
            final_obs_extra=arrays.get("final_obs_extra"),
        )

    def __enter__(self) -> "WorkerPool":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()
