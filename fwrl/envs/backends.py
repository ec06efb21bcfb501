"""The env-worker backends by name: :func:`make_pool` makes a ``local`` or ``ray`` pool.

The interface both implement is :class:`fwrl.envs.worker_pool.WorkerPool`;
this module sits above it and the two backends, so none of them imports another
in a circle. The backends are imported when a pool is made: the settings import
``BACKENDS`` without importing multiprocessing, numpy or Ray.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fwrl.errors import FwrlError, unknown_choice

if TYPE_CHECKING:
    from fwrl.envs.registry import EnvInfo
    from fwrl.envs.worker_pool import PoolSettings, WorkerPool

BACKENDS = ("local", "ray")


def make_pool(backend: str, settings: "PoolSettings", info: "EnvInfo | None" = None,
              **backend_options) -> "WorkerPool":
    """A pool of the ``local`` (processes) or ``ray`` (Ray actors) backend running ``settings``
    (its ``env_wrappers``, ``module:callable`` wrappers applied in order inside each worker, are
    checked here before any worker starts); ``info``: the env's description where the caller has
    it; ``backend_options`` go to :class:`~fwrl.envs.ray_workers.RayWorkerPool`."""
    if backend == "local":
        from fwrl.envs.local_workers import LocalWorkerPool

        if backend_options:
            raise FwrlError(f"the local worker backend takes no options {sorted(backend_options)}; they are "
                            "for the ray backend.")
        return LocalWorkerPool(settings, info)
    if backend == "ray":
        from fwrl.envs.ray_workers import RayWorkerPool

        return RayWorkerPool(settings, info, **backend_options)
    raise unknown_choice("worker backend", backend, BACKENDS)
