"""The two env-worker backends as the tests drive them: the same worker tests
run against ``local`` (processes) and ``ray`` (actors on the session's Ray
cluster, ``ray_cluster.py``) through the ``backend`` fixture of ``conftest.py``.
"""

from __future__ import annotations

import dataclasses

from fwrl.envs.backends import make_pool
from fwrl.envs.worker_pool import PoolSettings, WorkerPool


@dataclasses.dataclass
class Backend:
    """One worker backend as the tests use it."""

    name: str
    ray_address: str | None = None

    def pool(self, spec: str, num_workers: int, envs_per_worker: int, **settings) -> WorkerPool:
        """A pool of this backend (``settings``: the other fields of ``PoolSettings``)."""
        extra = {"address": self.ray_address, "verbose": False} if self.name == "ray" else {}
        return make_pool(self.name, PoolSettings(spec, num_workers, envs_per_worker, **settings), **extra)

    def died(self, exit_code: int) -> str:
        """What ``pool.errors`` says of a worker process that died with ``exit_code``."""
        return f"process died (exit code {exit_code})" if self.name == "local" else "actor died"

    def train_options(self) -> dict:
        return {"backend": "ray", "ray_address": self.ray_address} if self.name == "ray" else {}
