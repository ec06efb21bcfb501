"""K envs stepped together inside one worker (any backend).

Tracks per-game returns and lengths, resets envs whose episode ended, and
writes results into caller-provided arrays (shared memory for the local
backend, plain numpy for Ray).
"""

from __future__ import annotations

import numpy as np

from fwrl.envs.registry import make_env
from fwrl.envs.worker_pool import EpisodeRecord


def worker_seed(seed: int, worker: int, life: int, env_index: int) -> int:
    """Distinct, reproducible seeds for every env of every worker life."""
    return (seed * 1_000_003 + worker * 10_007 + life * 101 + env_index) % (2**31)


class EnvGroup:
    def __init__(self, spec: str, worker: int, k: int, seed: int, mode: str, life: int = 0):
        self.worker = worker
        self.task = spec_task_index(spec, worker)
        self.envs = [
            make_env(spec, worker_index=worker, seed=worker_seed(seed, worker, life, j), mode=mode)
            for j in range(k)
        ]
        self.k = k
        self.returns = np.zeros(k, np.float64)
        self.steps = np.zeros(k, np.int64)

    def reset(self, out: dict[str, np.ndarray]) -> None:
        for j, env in enumerate(self.envs):
            obs, _ = env.reset()
            out["obs"][j] = obs
        out["reward"][:] = 0.0
        out["done"][:] = True
        out["episode_return"][:] = 0.0
        out["episode_step"][:] = 0
        out["task"][:] = self.task
        self.returns[:] = 0.0
        self.steps[:] = 0

    def step(self, actions: np.ndarray, out: dict[str, np.ndarray]) -> list[EpisodeRecord]:
        finished = []
        for j, env in enumerate(self.envs):
            obs, reward, terminated, truncated, info = env.step(int(actions[j]))
            self.returns[j] += reward
            self.steps[j] += 1
            done = terminated or truncated
            out["reward"][j] = reward
            out["done"][j] = done
            out["episode_return"][j] = self.returns[j]
            out["episode_step"][j] = self.steps[j]
            if done:
                if info.get("game_over", True):
                    extra = {k: float(v) for k, v in info.items() if k in ("success",)}
                    finished.append(
                        EpisodeRecord(float(self.returns[j]), int(self.steps[j]), self.task, self.worker, extra)
                    )
                    self.returns[j] = 0.0
                    self.steps[j] = 0
                obs, _ = env.reset()
            out["obs"][j] = obs
        return finished

    def close(self) -> None:
        for env in self.envs:
            try:
                env.close()
            except Exception:  # closing a broken env must not hide the original error
                pass


def spec_task_index(spec: str, worker: int) -> int:
    from fwrl.envs.spec import parse_env_spec

    parsed = parse_env_spec(spec)
    return worker % parsed.num_tasks
