"""The env-worker backends by name: :func:`make_pool` makes a ``local`` or ``ray`` pool.

The interface both implement is :class:`fwrl.envs.worker_pool.WorkerPool`;
this module sits above it and the two backends, so none of them imports another
in a circle. The backends are imported when a pool is made: the settings import
``BACKENDS`` without importing multiprocessing, numpy or Ray.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from fwrl.errors import FwrlError, unknown_choice

if TYPE_CHECKING:
    from fwrl.envs.worker_pool import WorkerPool

BACKENDS = ("local", "ray")


def make_pool(
    backend: str,
    env: str,
    num_workers: int,
    envs_per_worker: int,
    seed: int = 0,
    mode: str = "train",
    step_timeout: float = 60.0,
    max_start_failures: int = 5,
    env_wrappers: Sequence[str] = (),
    **backend_options,
) -> "WorkerPool":
    """Create a pool of the ``local`` (processes) or ``ray`` (Ray actors) backend;
    ``env_wrappers``: ``module:callable`` wrappers applied in order inside each worker
    (:mod:`fwrl.envs.user_wrappers`), checked here before any worker starts;
    ``backend_options`` go to :class:`~fwrl.envs.ray_workers.RayWorkerPool`."""

    if backend == "local":
        from fwrl.envs.local_workers import LocalWorkerPool

        if backend_options:
            raise FwrlError(f"the local worker backend takes no options {sorted(backend_options)}; they are "
                            "for the ray backend.")
        return LocalWorkerPool(env, num_workers, envs_per_worker, seed=seed, mode=mode, step_timeout=step_timeout,
                               max_start_failures=max_start_failures, env_wrappers=env_wrappers)
    if backend == "ray":
        from fwrl.envs.ray_workers import RayWorkerPool

        return RayWorkerPool(
            env, num_workers, envs_per_worker, seed=seed, mode=mode, step_timeout=step_timeout,
            max_start_failures=max_start_failures, env_wrappers=env_wrappers, **backend_options
        )
    raise unknown_choice("worker backend", backend, BACKENDS)
