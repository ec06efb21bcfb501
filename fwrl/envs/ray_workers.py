"""The ``ray`` worker backend: env workers as Ray actors on a cluster's CPU nodes.

Each actor owns one group of K envs (:func:`~fwrl.envs.groups.make_group`) and plain
numpy output arrays; ``step`` writes into them and returns them, so results
travel through Ray's own object channels. The learner and central inference
stay in the driver process (ARCHITECTURE.md, Processes and machines), which calls
``ray.init(address=...)`` unless Ray is already initialised.

Placement: with ``resource="auto"`` every actor asks for one unit of the custom
resource ``envs`` when the cluster advertises it (CPU nodes started with
``ray start --resources '{"envs": N}'``), else for plain CPUs only. Where each
actor ran (node id, IP, pid) is recorded: :meth:`RayWorkerPool.placement`.

Results: the arrays of the step record (:class:`~fwrl.envs.step_record.StepRecord`),
packed for the trip (``pack``: the cut-only columns travel for the truncated rows
only; an image per slot per step would double the traffic); the pool unpacks
them into full arrays (zeros elsewhere).

Imports: a ``gym:<module>:<id>`` module or an ``--env-wrapper`` module must be
importable in the actors. Ray starts actors with the node's own environment,
so each actor first adds the learner's ``PYTHONPATH`` entries that exist on its
node to ``sys.path`` (``forward_pythonpath=True``, the default); on a cluster,
install the package on every env node or keep it on a path all nodes share.

Faults, as in the local backend (the shared bookkeeping is in
:class:`~fwrl.envs.worker_pool.WorkerPool`): an actor that dies (its node was
lost or it was killed), raises, or takes longer than ``step_timeout`` for one
step is replaced by a new actor with fresh envs (new seeds); its next result
has a new ``life``, every slot ``done`` and ``restarted=True``. Ray schedules
the new actor on any node with the resources; if no worker at all has been
running for ``start_timeout`` seconds (e.g. every env node is gone), ``wait``
raises :class:`WorkersLost`. A worker whose actors fail in their constructor
``max_start_failures`` times in a row is an error, as locally.

The head: Ray ends a driver whose cluster head (its GCS) stays unreachable for 60 s with its own
message and no Python code run after (no final checkpoint). :class:`HeadWatch` probes the head's
GCS port once a second from a thread; when it has not answered for :data:`HEAD_LOST_SECONDS`,
``wait`` raises :class:`WorkersLost` naming it, so the run stops with a final checkpoint well
before Ray would end the process, and ``close`` leaves the actors alone (there is no head to ask).
"""

from __future__ import annotations

import math
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from fwrl.envs.groups import make_group
from fwrl.envs.step_record import StepRecord
from fwrl.envs.worker_pool import EpisodeRecord, PoolSettings, StepResult, WorkerPool
from fwrl.envs.worker_pool import WorkersLost as _PoolWorkersLost
from fwrl.errors import FwrlError, missing_dependency

if TYPE_CHECKING:
    from fwrl.envs.registry import EnvInfo

ENV_RESOURCE = "envs"  # the custom resource of env (CPU) nodes in the recipes under docker/


HEAD_LOST_SECONDS = 10.0  # the head's GCS unreachable this long: the cluster is lost (Ray's own limit: 60 s)
_head_lost_here = False  # a pool of this process lost its cluster's head (see head_lost_in_this_process)


def head_lost_in_this_process() -> bool:
    """Whether a pool of this process found its cluster's head gone. The process should then end
    without Ray's exit handler: ``ray.shutdown`` (which Ray registers with ``atexit``) waits on the lost
    head, 5 s on an idle machine and past Ray's own 60 s end of the driver under load, while skipping it
    (``atexit.unregister``) crashes the interpreter's exit (SIGSEGV in Ray 2.60); the command's entry
    points end such a process with ``os._exit`` (:func:`fwrl.launch.exits.end_process`)."""
    return _head_lost_here


class WorkersLost(_PoolWorkersLost, FwrlError):
    """No env worker could run for ``start_timeout`` seconds (e.g. every env node died), or the
    cluster's head is gone."""


class HeadWatch:
    """Whether a Ray cluster's head still answers: a thread connects to its GCS address (HOST:PORT)
    every ``every`` seconds; ``silent_for()`` is how long it has not answered."""

    def __init__(self, gcs_address: str, every: float = 1.0, timeout: float = 1.0):
        host, _, port = gcs_address.rpartition(":")
        self.address, self.host, self.port = gcs_address, host.strip("[]"), int(port)
        self.every, self.timeout = every, timeout
        self.last_answer = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fwrl-ray-head-watch", daemon=True)
        self._thread.start()

    def answers(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=self.timeout):
                return True
        except OSError:
            return False

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            if self.answers():
                self.last_answer = time.monotonic()

    def silent_for(self) -> float:
        return time.monotonic() - self.last_answer

    def stop(self) -> None:
        self._stop.set()


def import_ray():
    """Import Ray or explain how to install it."""
    try:
        import ray
    except ImportError:
        raise missing_dependency("ray", "ray", "the ray worker backend") from None
    return ray


class EnvActor:
    """The body of one Ray actor: K envs and their output arrays (wrapped by ``ray.remote``)."""

    def __init__(self, settings: PoolSettings, worker: int, life: int, record: StepRecord,
                 import_paths: Sequence[str] = ()):
        from fwrl.envs.quiet import silence_env_noise

        silence_env_noise()
        add_import_paths(import_paths)
        self.record = record
        self.out = record.allocate(settings.envs_per_worker)
        self.group = make_group(settings, worker, life)

    def reset(self) -> tuple[dict[str, np.ndarray], list[EpisodeRecord], dict[str, object]]:
        """First observations, plus where this actor runs."""
        import ray

        self.group.reset(self.out)
        where = {"node_id": ray.get_runtime_context().get_node_id(), "ip": ray.util.get_node_ip_address(),
                 "hostname": socket.gethostname(), "pid": os.getpid()}
        return self.record.pack(self.out), [], where

    def step(self, actions: np.ndarray) -> tuple[dict[str, np.ndarray], list[EpisodeRecord], None]:
        episodes = self.group.step(actions, self.out)
        return self.record.pack(self.out), episodes, None

    def close(self) -> None:
        self.group.close()


def add_import_paths(paths: Sequence[str]) -> None:
    """Put the folders of ``paths`` that exist here at the front of ``sys.path`` (in order)."""
    for path in reversed([p for p in paths if p and os.path.isdir(p) and p not in sys.path]):
        sys.path.insert(0, path)


def pythonpath_entries() -> tuple[str, ...]:
    """This process's ``PYTHONPATH`` entries, as absolute paths."""
    return tuple(os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)


@dataclass
class _Actor:
    handle: object
    pending: object | None  # ObjectRef of the outstanding reset/step call
    sent_at: float
    answered: bool = False  # False until the reset result arrived (placement, imports, env resets)


class RayWorkerPool(WorkerPool):
    """N Ray actors with K envs each, behind the :class:`WorkerPool` interface."""

    kind = "ray"

    def __init__(
        self,
        settings: PoolSettings,
        info: "EnvInfo | None" = None,
        address: str = "auto",
        resource: str | None = "auto",
        cpus_per_worker: float = 1.0,
        include_dashboard: bool = False,
        verbose: bool = True,
        forward_pythonpath: bool = True,
    ):
        """``address``: ``auto`` (the running cluster), ``HOST:PORT``, ``ray://HOST:PORT``, or
        ``local`` (start a private single-machine Ray). ``resource``: ``auto`` (``envs`` if the
        cluster has it), a custom resource name, or None (CPUs only). ``include_dashboard``
        only matters with ``local``; the dashboard then listens on 127.0.0.1 only.
        ``forward_pythonpath``: actors add this process's ``PYTHONPATH`` entries that exist on
        their node to ``sys.path`` (for ``gym:<module>:<id>`` modules and env wrappers)."""
        if cpus_per_worker < 0:
            raise FwrlError(f"cpus_per_worker must be >= 0, got {cpus_per_worker}.")
        if settings.worker_splits != 1:
            raise FwrlError(f"worker_splits={settings.worker_splits} is for the local backend (splits of one "
                            "worker process); a Ray actor steps one group of envs: use worker_splits 1 and more "
                            "actors (num_workers) with --backend ray.")
        self._ray = import_ray()
        super().__init__(settings, info)
        self.import_paths = pythonpath_entries() if forward_pythonpath else ()
        self.address = address
        self.resource_option = resource
        self.cpus_per_worker = cpus_per_worker
        self.include_dashboard = include_dashboard
        self.verbose = verbose
        self.resource: str | None = None  # decided in start()
        self.placements: list[dict[str, object]] = []  # every actor life: worker, life, node_id, ip, ...
        self._actors: list[_Actor | None] = [None] * self.num_workers
        self._where: dict[int, dict[str, object]] = {}
        self._remote_class = None
        self._we_initialised = False
        self._last_running = time.monotonic()
        self._closed = False
        self.head: HeadWatch | None = None  # started once connected
        self.head_lost = False

    # ------------------------------------------------------------------ cluster
    def _connect(self) -> None:
        ray = self._ray
        if ray.is_initialized():
            return
        kwargs = {"include_dashboard": self.include_dashboard, "logging_level": "warning"}
        if self.include_dashboard:
            kwargs["dashboard_host"] = "127.0.0.1"
        # ray.init replaces the driver's SIGTERM handler (its own, which exits at once): keep a
        # Python handler installed before (fwrl train's stop: final checkpoint on SIGTERM)
        sigterm = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
        try:
            if self.address == "local":
                # as many logical CPUs as the workers ask for, at least the machine's: a private Ray
                # places every worker (oversubscribing the cores, as the local backend's processes do)
                # instead of leaving those past the core count waiting for a CPU that never frees
                ray.init(num_cpus=self._local_cpus(), **kwargs)
            else:
                ray.init(address=self.address, logging_level="warning")
        except ConnectionError as exc:
            raise FwrlError(
                f"cannot connect to a Ray cluster at --ray-address {self.address!r} ({exc}). Start one "
                "(`ray start --head`, see docker/README.md), pass its HOST:PORT, or use --ray-address local "
                "for a private Ray on this machine."
            ) from None
        finally:
            if callable(sigterm):
                signal.signal(signal.SIGTERM, sigterm)
        self._we_initialised = True

    def _local_cpus(self) -> int:
        """Logical CPUs of a private Ray (``--ray-address local``): the machine's, or what the workers
        ask for where that is more."""
        return max(os.cpu_count() or 1, math.ceil(self.num_workers * self.cpus_per_worker - 1e-9))

    def _check_capacity(self) -> None:
        """Refuse, in one line, more workers than the cluster can ever hold at once: Ray would keep
        the others waiting for resources without a word."""
        total = self._ray.cluster_resources()
        if self.resource:
            fits, each = math.floor(total.get(self.resource, 0) + 1e-9), f"1 {self.resource!r}"
        elif self.cpus_per_worker > 0:
            fits, each = math.floor(total.get("CPU", 0) / self.cpus_per_worker + 1e-9), f"{self.cpus_per_worker:g} CPU"
        else:
            return
        if fits < self.num_workers:
            raise FwrlError(
                f"the Ray cluster at {self.address!r} can hold {fits} env worker(s) at once (each asks for "
                f"{each}; cluster resources: {_short_resources(total)}), not the {self.num_workers} asked "
                f"for: use --num-workers {max(fits, 1)} or fewer, or add env nodes."
            )

    def _choose_resource(self) -> str | None:
        available = self._ray.cluster_resources()
        option = self.resource_option
        if option in (None, "", "none", "cpu"):
            return None
        if option == "auto":
            return ENV_RESOURCE if available.get(ENV_RESOURCE, 0) > 0 else None
        if available.get(option, 0) <= 0:
            custom = sorted(k for k in available if not k.startswith("node:") and k not in
                            ("CPU", "GPU", "memory", "object_store_memory"))
            raise FwrlError(
                f"no node of the Ray cluster offers the resource {option!r} asked for the env workers; "
                f"the cluster's custom resources: {', '.join(custom) or 'none'}. Start env nodes with "
                f"`ray start --resources '{{\"{option}\": N}}'` or use resource='auto'."
            )
        return option

    def _spawn(self, worker: int) -> None:
        # max_restarts=0: a lost actor is replaced by the pool (new life, new seeds), not by Ray
        options = {"num_cpus": self.cpus_per_worker, "max_restarts": 0, "scheduling_strategy": "SPREAD"}
        if self.resource:
            options["resources"] = {self.resource: 1}
        handle = self._remote_class.options(**options).remote(
            self.settings, worker, self._lives[worker], self.record, self.import_paths)
        self._actors[worker] = _Actor(handle, handle.reset.remote(), time.monotonic())

    def _kill(self, worker: int) -> None:
        a = self._actors[worker]
        if a is None:
            return
        try:
            self._ray.kill(a.handle, no_restart=True)
        except Exception:  # the actor (or its node) may already be gone
            pass
        self._actors[worker] = None

    def _answered(self, worker: int) -> bool:
        a = self._actors[worker]
        return a is not None and a.answered

    def _restart(self, worker: int, reason: str) -> None:
        self._where.pop(worker, None)
        super()._restart(worker, reason)

    def start(self) -> None:
        ray = self._ray
        self._connect()
        self.resource = self._choose_resource()
        self._check_capacity()
        self._remote_class = ray.remote(EnvActor)
        self._last_running = time.monotonic()
        gcs = ray.get_runtime_context().gcs_address
        if gcs and self.head is None:
            self.head = HeadWatch(gcs)
        for worker in range(self.num_workers):
            self._spawn(worker)

    def _check_head(self) -> None:
        """Raise :class:`WorkersLost` once the cluster's head has not answered for HEAD_LOST_SECONDS."""
        if self.head is None or self.head.silent_for() < HEAD_LOST_SECONDS:
            return
        global _head_lost_here
        self.head_lost = _head_lost_here = True
        given = f" (--ray-address {self.address})" if self.address not in ("local", self.head.address) else ""
        raise WorkersLost(
            f"the Ray cluster's head at {self.head.address}{given} has not answered for {self.head.silent_for():.0f} s: "
            "the cluster is gone (no worker can be placed or replaced without it). The run stopped with a final "
            "checkpoint; start the cluster again and continue with --resume."
        )

    def actor(self, worker: int):
        """The Ray actor handle of ``worker``'s current life (None while it is replaced)."""
        a = self._actors[worker]
        return None if a is None else a.handle

    def pid(self, worker: int) -> int | None:
        where = self._where.get(worker)
        return None if where is None else int(where["pid"])

    def placement(self) -> dict[int, str]:
        """Node id of every worker's current actor (workers that have started)."""
        return {worker: str(where["node_id"]) for worker, where in self._where.items()}

    # ------------------------------------------------------------------ stepping
    def wait(self, timeout: float | None = None, workers: Sequence[int] | None = None) -> list[StepResult]:
        ray = self._ray
        workers = self._chosen(workers)
        pending = {a.pending: i for i in workers if (a := self._actors[i]) is not None and a.pending is not None}
        self._check_head()
        if not pending:
            return []
        refs = list(pending)
        # Wake up by the earliest step deadline (or the start_timeout check, or the head's next
        # probe) at the latest, so a hang or a lost head is seen even when every actor hangs.
        until = min(self._next_deadline(workers) - time.monotonic(), 1.0 if self.head is not None else math.inf)
        timeout = max(0.0, until) + 0.01 if timeout is None else max(0.0, min(timeout, until + 0.01))
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)
        if ready:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        results = []
        for ref in ready:
            worker = pending[ref]
            try:
                arrays, episodes, where = ray.get(ref)
            except ray.exceptions.RayActorError as exc:
                if getattr(exc, "_actor_init_failed", False):  # the constructor raised: say what
                    self._restart(worker, f"actor failed to start: {_last_line(exc)}")
                else:
                    self._restart(worker, f"actor died ({_first_line(exc)})")
                continue
            except ray.exceptions.RayTaskError as exc:
                self._restart(worker, _last_line(exc))
                continue
            a = self._actors[worker]
            a.pending = None
            if where is not None:
                a.answered = True
                self._where[worker] = where
                self.placements.append({"worker": worker, "life": self._lives[worker], **where})
                if self.verbose:
                    print(f"fwrl: ray worker {worker} (life {self._lives[worker]}) runs on node "
                          f"{where['node_id']} ({where['ip']}, pid {where['pid']})", file=sys.stderr)
            results.append(self._result(worker, self.record.unpack(arrays, self.envs_per_worker), episodes))
        self._check_hangs(workers)
        return results

    def _next_deadline(self, workers: Sequence[int]) -> float:
        steps = [a.sent_at + self.settings.step_timeout for i in workers
                 if (a := self._actors[i]) is not None and a.pending is not None and a.answered]
        return min(steps + [self._last_running + self.settings.start_timeout])

    def _check_hangs(self, workers: Sequence[int] | None = None) -> None:
        now = time.monotonic()
        workers = self._chosen(workers)
        if any(a is not None and a.answered for a in self._actors):
            self._last_running = now
        elif now - self._last_running > self.settings.start_timeout:
            need = f"{self.cpus_per_worker:g} CPU" + (f" and 1 {self.resource!r}" if self.resource else "")
            raise WorkersLost(
                f"no Ray env worker has been running for {self.settings.start_timeout:.0f} s: the cluster has no "
                f"node that can hold one (each needs {need}; cluster resources now: "
                f"{_short_resources(self._ray.cluster_resources())}). Add env nodes and resume the run "
                "with --resume."
            )
        for i in workers:
            a = self._actors[i]
            if a is None or a.pending is None or not a.answered:
                continue  # an actor waiting for a node is not hung; see start_timeout above
            # an answer that arrived after ray.wait returned is not a hang (the learner may
            # have been away longer than step_timeout)
            if now - a.sent_at > self.settings.step_timeout and not self._ray.wait([a.pending], timeout=0)[0]:
                self._restart(i, f"no answer within {self.settings.step_timeout:g} s")

    def act(self, worker: int, actions: np.ndarray) -> None:
        actions = self._actions(actions)
        a = self._actors[worker]
        if a is None:
            return
        a.sent_at = time.monotonic()
        a.pending = a.handle.step.remote(actions)

    def close(self, grace: float = 5.0) -> None:
        if self._closed:
            return
        self._closed = True
        if self.head is not None:
            self.head.stop()
        if self.head_lost:  # nothing to ask: killing actors or shutting down waits on the lost head
            return
        for worker in range(self.num_workers):  # actors are killed at once: no grace needed
            self._kill(worker)
        if self._we_initialised and self._ray.is_initialized():
            self._ray.shutdown()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


def _last_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[-1][:200] if text else type(exc).__name__


def _short_resources(resources: dict) -> str:
    keep = {k: v for k, v in resources.items() if not k.startswith("node:") and k not in ("memory", "object_store_memory")}
    return ", ".join(f"{k}={v:g}" for k, v in sorted(keep.items())) or "none"
