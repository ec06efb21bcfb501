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

What a worker returns per slot is its step record (``fwrl.envs.step_record``: the
observation, reward, episode ends with ``truncated`` where a time limit cut the
episode, and the cut episode's final observation for bootstrapping).

Several acting threads may share a pool, each waiting on its own workers
(:class:`PoolSlice`, ``wait(timeout, workers)``): a worker is waited on, acted
for and restarted by one thread only.

A worker that crashes, raises or hangs past ``step_timeout`` is restarted by
the pool. Its next result has a new ``life`` number, every slot marked
``done`` (a fresh episode) and ``restarted=True``, so the learner resets
those slots' core state and drops their partial rollouts.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, Sequence

import numpy as np

from fwrl.envs.step_record import StepRecord
from fwrl.errors import FwrlError

if TYPE_CHECKING:
    from fwrl.envs.registry import EnvInfo

COLUMN_NAMES = frozenset(StepRecord.of((1,), "float32", 1).names)  # every column a record may have


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
    """What one worker returns after stepping its K envs: the arrays of its step record
    (``[K, ...]``, one per column of :class:`~fwrl.envs.step_record.StepRecord`; read them as
    ``result.obs``, ``result.truncated``, ...: None for a column the env has not) and the games
    that ended.

    The arrays may be views of the backend's buffers (the local backend's are shared memory):
    they are valid until the next ``act`` for this worker, so copy what must outlive it.
    """

    worker: int
    life: int
    arrays: dict[str, np.ndarray]
    episodes: list[EpisodeRecord]
    restarted: bool = False

    def __getattr__(self, name: str) -> np.ndarray | None:
        if name in COLUMN_NAMES:
            return self.__dict__["arrays"].get(name)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")


@dataclass(frozen=True)
class PoolSettings:
    """What a pool runs: ``num_workers`` workers with ``envs_per_worker`` envs each of ``env``
    (in ``mode`` train or test, wrapped by ``env_wrappers``), seeded from ``seed``
    (:func:`fwrl.envs.env_group.worker_seed`), and how long a worker may take: ``step_timeout``
    per step, ``start_timeout`` for its imports and first reset, ``max_start_failures`` lives in a
    row that die before their first result. Every backend and every worker takes this one object.

    ``worker_splits`` S > 1 (the local backend): S consecutive workers share one process, which
    steps them in turn (double-buffered sampling, as sample-factory's ``worker_num_splits``): while
    the learner acts for one split, its process steps the next, so the process does not sit idle
    for the forward's round trip. A split is a worker like any other (its own K envs, seeds and
    results); a fault restarts the process, so every split of it starts a new life."""

    env: str
    num_workers: int
    envs_per_worker: int
    seed: int = 0
    mode: str = "train"
    step_timeout: float = 60.0
    env_wrappers: tuple[str, ...] = ()
    start_timeout: float = 300.0
    max_start_failures: int = 5
    worker_splits: int = 1

    @property
    def num_slots(self) -> int:
        return self.num_workers * self.envs_per_worker

    @property
    def num_processes(self) -> int:
        """Processes (or actors) that host the workers: ``worker_splits`` consecutive workers share one."""
        return self.num_workers // self.worker_splits


class StepSource(Protocol):
    """What an acting loop steps: a pool, or a view of one (evaluation's lock step). Results come
    from ``wait``; ``act`` sends a worker its K actions."""

    num_workers: int
    envs_per_worker: int

    @property
    def num_slots(self) -> int: ...

    def wait(self, timeout: float | None = None) -> list[StepResult]: ...

    def act(self, worker: int, actions: np.ndarray) -> None: ...


class PoolSlice:
    """The workers ``workers`` of ``pool`` as a step source of their own: what one of several acting
    threads steps (``fwrl.runner.acting``). Results and ``act`` name workers by their number in
    the whole pool; ``workers`` is the slice's list of them, in order."""

    def __init__(self, pool: "WorkerPool", workers: Sequence[int]):
        self.pool = pool
        self.workers = tuple(int(w) for w in workers)
        if not self.workers or len(set(self.workers)) != len(self.workers) or \
                not all(0 <= w < pool.num_workers for w in self.workers):
            raise ValueError(f"a pool slice needs distinct workers of 0..{pool.num_workers - 1}, got {workers}")
        siblings = getattr(pool, "siblings", None)  # a stand-in pool (benchmarks, tests) has no processes
        if siblings is not None and any(s not in self.workers for w in self.workers for s in siblings(w)):
            raise ValueError(f"a pool slice holds whole worker processes (worker_splits="
                             f"{pool.settings.worker_splits}), got workers {list(self.workers)}")
        self.num_workers = len(self.workers)
        self.envs_per_worker = pool.envs_per_worker

    @property
    def num_slots(self) -> int:
        return self.num_workers * self.envs_per_worker

    def wait(self, timeout: float | None = None) -> list[StepResult]:
        return self.pool.wait(timeout, self.workers)

    def shared_arrays(self) -> dict[str, np.ndarray] | None:
        return self.pool.shared_arrays()

    def act(self, worker: int, actions: np.ndarray) -> None:
        self.pool.act(worker, actions)


def split_workers(num_workers: int, parts: int, worker_splits: int = 1) -> list[range]:
    """``num_workers`` workers in ``parts`` contiguous slices of whole processes (``worker_splits``
    workers each) whose numbers of processes differ by at most one."""
    processes = num_workers // worker_splits
    if not 1 <= parts <= processes or num_workers % worker_splits:
        of = f" ({processes} processes of {worker_splits} splits)" if worker_splits > 1 else ""
        raise ValueError(f"cannot split {num_workers} workers{of} into {parts} slices")
    bounds = [processes * i // parts * worker_splits for i in range(parts + 1)]
    return [range(a, b) for a, b in zip(bounds, bounds[1:])]


class WorkersLost(Exception):
    """Raised by ``wait`` when no env worker can run any more (e.g. every env node of a
    Ray cluster is gone, or its head); training then stops with a final checkpoint. Subclasses of
    this and of ``FwrlError`` carry the user-facing message; the command exits with ``exit_status``."""

    exit_status = 69  # sysexits.h EX_UNAVAILABLE: the workers (or the cluster) are gone; --resume later


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
    verbose: bool = True  # say each restart on stderr, with the worker and the reason
    kind: str = "env"  # how the restart line names the workers ("env worker 3", "ray worker 3")

    def __init__(self, settings: PoolSettings, info: "EnvInfo | None" = None):
        """``info``: the env's description where the caller has it (else it is described here)."""
        from fwrl.envs.registry import describe_env, resolve
        from fwrl.envs.user_wrappers import check_wrappers
        from fwrl.envs.vector_paths import check_vector_wrappers

        if settings.num_workers < 1 or settings.envs_per_worker < 1:
            raise FwrlError(
                f"need at least one worker and one env per worker, got num_workers={settings.num_workers}, "
                f"envs_per_worker={settings.envs_per_worker}."
            )
        if settings.worker_splits < 1 or settings.num_workers % settings.worker_splits:
            raise FwrlError(f"worker_splits={settings.worker_splits} must be >= 1 and divide the pool's "
                            f"{settings.num_workers} workers ({settings.worker_splits} consecutive workers share one process).")
        if settings.max_start_failures < 1:
            raise FwrlError(f"max_start_failures must be >= 1, got {settings.max_start_failures}.")
        wrappers = check_wrappers(settings.env_wrappers)  # before any worker starts: a bad one is an error here
        check_vector_wrappers(resolve(settings.env)[0], wrappers)
        self.settings = PoolSettings(**{**vars(settings), "env_wrappers": tuple(wrappers)})
        self.env = settings.env
        self.info = info if info is not None else describe_env(settings.env, self.settings.env_wrappers)
        self.record = StepRecord.of(self.info.obs_shape, self.info.obs_dtype, self.info.extra_size)
        self.num_workers = settings.num_workers
        self.envs_per_worker = settings.envs_per_worker
        self.restarts = 0
        self.errors: list[str] = []  # "worker W (life L): reason" per restart
        self._lives = [0] * self.num_workers
        self._restarted = [False] * self.num_workers  # the next result is the first of a new life
        self._start_failures = [0] * self.num_workers  # lives in a row that died before their first result
        self._counts_lock = threading.Lock()  # restarts and errors: several acting threads may restart workers

    @property
    def num_slots(self) -> int:
        return self.num_workers * self.envs_per_worker

    def _chosen(self, workers: Sequence[int] | None) -> Sequence[int]:
        """``workers`` (a slice's), or every worker where None."""
        return range(self.num_workers) if workers is None else workers

    def shared_arrays(self) -> dict[str, np.ndarray] | None:
        """The ``[slots, ...]`` arrays, one per step-record column, that the workers write and every
        result's arrays are rows of (rows ``slots_of(worker)``), where they are shared with this
        process (the local backend); None where results arrive as copies (Ray)."""
        return None

    def slots_of(self, worker: int) -> slice:
        k = self.envs_per_worker
        return slice(worker * k, (worker + 1) * k)

    def start(self) -> None:
        raise NotImplementedError

    def pid(self, worker: int) -> int | None:
        """OS process id of ``worker``'s current life (None while it is being replaced,
        and for a Ray actor until its first result told where it runs)."""
        raise NotImplementedError

    def wait(self, timeout: float | None = None, workers: Sequence[int] | None = None) -> list[StepResult]:
        """Results of the workers that are ready (may be empty on timeout): of every worker, or of
        ``workers`` only (a :class:`PoolSlice`: only those are checked for hangs and restarted)."""
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

    def close(self, grace: float = 5.0) -> None:
        """Stop every worker: each gets up to ``grace`` seconds in all to leave on its own (a run
        under a time limit passes what is left of it), then is killed."""
        raise NotImplementedError

    # ------------------------------------------------------------------ shared fault handling
    def _spawn(self, worker: int) -> None:
        raise NotImplementedError

    def _kill(self, worker: int) -> None:
        raise NotImplementedError

    def _answered(self, worker: int) -> bool:
        raise NotImplementedError

    def siblings(self, worker: int) -> range:
        """The workers that share ``worker``'s process (``worker_splits`` of them, itself included)."""
        s = self.settings.worker_splits
        first = worker - worker % s
        return range(first, first + s)

    def _restart(self, worker: int, reason: str) -> None:
        """Replace a faulty worker by a new life with fresh envs (new seeds); the splits that share
        its process (:meth:`siblings`) start a new life with it.

        A worker whose lives keep dying before their first result (an env that
        cannot be made, a missing ROM) would be respawned forever: after
        ``max_start_failures`` such lives in a row this raises ``FwrlError``.
        """
        with self._counts_lock:
            self.restarts += 1
            siblings = self.siblings(worker)
            who = (f"worker {worker}" if len(siblings) == 1 else
                   f"worker process of workers {siblings[0]}-{siblings[-1]}")
            self.errors.append(f"{who} (life {self._lives[worker]}): {reason}")
        if self.verbose:
            print(f"fwrl: {self.kind} {who} (life {self._lives[worker]}) restarts: {reason}", file=sys.stderr,
                  flush=True)
        if not self._answered(worker):
            self._start_failures[worker] += 1
        self._kill(worker)
        if self._start_failures[worker] >= self.settings.max_start_failures:
            raise FwrlError(
                f"env worker {worker} failed {self._start_failures[worker]} times in a row before its envs "
                f"were reset ({self.env!r}); last error: {reason}"
            )
        for w in self.siblings(worker):
            self._lives[w] += 1
            self._restarted[w] = True
        self._spawn(worker)

    def _result(self, worker: int, arrays: dict[str, np.ndarray], episodes: list[EpisodeRecord]) -> StepResult:
        """The result of one answered step (or reset) of ``worker``, from its [K, ...] arrays."""
        self._start_failures[worker] = 0
        restarted = self._restarted[worker]
        self._restarted[worker] = False
        return StepResult(worker, self._lives[worker], arrays, list(episodes), restarted)

    def __enter__(self) -> "WorkerPool":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()
