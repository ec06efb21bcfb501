"""K envs stepped together inside one worker (any backend), one Python env chain per slot.

This is the ``vector=none`` group; :mod:`fwrl.envs.vector_group` is its twin for
envs stepped in C++ threads, and :func:`fwrl.envs.groups.make_group` picks one.
Tracks per-game returns and lengths, resets envs whose episode ended, and
writes the step record (:mod:`fwrl.envs.step_record`) into caller-provided
arrays (shared memory for the local backend, plain numpy for Ray): ``done``
for both kinds of episode end, ``truncated`` (and the cut episode's last
observation in the cut-only columns) only for an episode that was cut, not
terminated.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fwrl.envs import step_record as R
from fwrl.envs.registry import build_env
from fwrl.envs.worker_pool import EpisodeRecord, PoolSettings


def worker_seed(seed: int, worker: int, life: int, env_index: int) -> int:
    """Distinct, reproducible seeds for every env of every worker life."""
    return (seed * 1_000_003 + worker * 10_007 + life * 101 + env_index) % (2**31)


class EnvGroup:
    """K envs of the Python chain (``vector=none``), made with :func:`~fwrl.envs.registry.build_env`
    and stepped one after the other."""

    def __init__(self, settings: PoolSettings, worker: int, life: int = 0):
        self.worker = worker
        self.task = spec_task_index(settings.env, worker)
        self.envs = []
        k = settings.envs_per_worker
        try:
            for j in range(k):
                env, obs_layout, action_layout = build_env(
                    settings.env, worker_index=worker, seed=worker_seed(settings.seed, worker, life, j),
                    mode=settings.mode, wrappers=settings.env_wrappers)
                self.envs.append(env)
        except BaseException:
            self.close()
            raise
        self.extras = obs_layout.extra_size > 0
        self.multi_action = len(action_layout.dims) > 1
        self.k = k
        self.returns = np.zeros(k, np.float64)
        self.steps = np.zeros(k, np.int64)
        self._final_set = np.zeros(k, bool)  # rows whose cut-only columns hold a value to clear

    def _write_obs(self, out: dict[str, np.ndarray], j: int, obs: Any, final: bool = False) -> None:
        """Env ``j``'s observation (``{"obs": ..., "obs_extra": ...}`` with extras) into its row of
        the observation columns, or of their cut-only copies (``final``)."""
        parts = obs if self.extras else {R.OBS: obs}
        for name, value in parts.items():
            out[R.FINAL_OF[name] if final else name][j] = value

    def _clear_final(self, out: dict[str, np.ndarray], j: int) -> None:
        if self._final_set[j]:
            R.clear_cut(out, j)
            self._final_set[j] = False

    def reset(self, out: dict[str, np.ndarray]) -> None:
        for j, env in enumerate(self.envs):
            obs, _ = env.reset()
            self._write_obs(out, j, obs)
        R.write_start(out, self.task)
        self._final_set[:] = False
        self.returns[:] = 0.0
        self.steps[:] = 0

    def step(self, actions: np.ndarray, out: dict[str, np.ndarray]) -> list[EpisodeRecord]:
        """Step env j with ``actions[j]`` (an int, or a row of ints for several action dims)."""
        finished = []
        for j, env in enumerate(self.envs):
            action = actions[j] if self.multi_action else int(actions[j])
            obs, reward, terminated, truncated, info = env.step(action)
            self.returns[j] += reward
            self.steps[j] += 1
            done = bool(terminated or truncated)
            cut = bool(truncated and not terminated)  # terminated wins: nothing to bootstrap from
            out[R.REWARD][j] = reward
            out[R.DONE][j] = done
            out[R.TRUNCATED][j] = cut
            out[R.EPISODE_RETURN][j] = self.returns[j]
            out[R.EPISODE_STEP][j] = self.steps[j]
            self._clear_final(out, j)
            if cut:
                self._write_obs(out, j, obs, final=True)
                self._final_set[j] = True
            if done:
                if info.get("game_over", True):
                    extra = {k: float(v) for k, v in info.items() if k in ("success",)}
                    finished.append(
                        EpisodeRecord(float(self.returns[j]), int(self.steps[j]), self.task, self.worker, extra)
                    )
                    self.returns[j] = 0.0
                    self.steps[j] = 0
                obs, _ = env.reset()
            self._write_obs(out, j, obs)
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
