"""K envs stepped together in C++ threads inside one worker: the twin of
:class:`~fwrl.envs.env_group.EnvGroup` for the ``vector=ale|envpool`` paths.

A family's ``make_vector`` returns a :class:`VectorEnvs`: K envs behind one
``reset`` / ``step`` whose arrays already follow fwrl's episode protocol (see
:class:`VectorStep`). :class:`VectorEnvGroup` does what ``EnvGroup`` does for
one env at a time, on whole arrays: per-game returns and lengths, ``done`` for
both kinds of episode end, ``truncated`` and ``final_obs`` only for a cut
episode, an :class:`~fwrl.envs.worker_pool.EpisodeRecord` per finished game
(not per Atari life). The worker backends cannot tell the two groups apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from fwrl.envs import step_record as R
from fwrl.envs.worker_pool import EpisodeRecord


@dataclass
class VectorStep:
    """One step of K envs, in fwrl's protocol ([K, ...] arrays, valid until the next call).

    ``obs``: where an episode ended (``terminated | truncated``), the first observation of the
    next one (the env was reset, or the game goes on after a life loss); elsewhere the next
    observation. ``terminated`` and ``truncated`` never both hold. ``game_over``: the whole game
    ended (False at an Atari life loss, True at a truncation). ``final_obs``: in the truncated
    rows, the cut episode's last observation (other rows are undefined); None when no row is
    truncated.
    """

    obs: np.ndarray
    reward: np.ndarray  # float32
    terminated: np.ndarray  # bool
    truncated: np.ndarray  # bool
    game_over: np.ndarray  # bool
    final_obs: np.ndarray | None = None


class VectorEnvs(Protocol):
    """K envs stepped together (what ``EnvFamily.make_vector`` returns)."""

    num_envs: int

    def reset(self) -> np.ndarray:
        """Start every env (seeded as made); the first observations, ``[K, ...]``."""

    def step(self, actions: np.ndarray) -> VectorStep:
        """Step env j with ``actions[j]``; ends are handled as :class:`VectorStep` says."""

    def close(self) -> None:
        """Stop the library's threads."""


class VectorEnvGroup:
    """A worker's K slots over one :class:`VectorEnvs` (same interface as ``EnvGroup``)."""

    def __init__(self, envs: VectorEnvs, worker: int, task: int):
        self.envs = envs
        self.worker = worker
        self.task = task
        self.k = envs.num_envs
        self.returns = np.zeros(self.k, np.float64)
        self.steps = np.zeros(self.k, np.int64)
        self._final_rows = np.zeros(self.k, bool)  # rows whose final_obs holds a value to clear

    def reset(self, out: dict[str, np.ndarray]) -> None:
        out[R.OBS][:] = self.envs.reset()
        R.write_start(out, self.task)
        self._final_rows[:] = False
        self.returns[:] = 0.0
        self.steps[:] = 0

    def step(self, actions: np.ndarray, out: dict[str, np.ndarray]) -> list[EpisodeRecord]:
        """Step all K envs with ``actions`` (int ``[K]``); returns the games that ended."""
        s = self.envs.step(np.asarray(actions).reshape(self.k))
        self.returns += s.reward
        self.steps += 1
        done = s.terminated | s.truncated
        cut = s.truncated & ~s.terminated
        out[R.REWARD][:] = s.reward
        out[R.DONE][:] = done
        out[R.TRUNCATED][:] = cut
        out[R.EPISODE_RETURN][:] = self.returns
        out[R.EPISODE_STEP][:] = self.steps
        if self._final_rows.any():
            R.clear_cut(out, self._final_rows)
        if cut.any():
            out[R.FINAL_OBS][cut] = s.final_obs[cut]
        self._final_rows = cut
        finished = []
        for j in np.flatnonzero(done & s.game_over):
            finished.append(EpisodeRecord(float(self.returns[j]), int(self.steps[j]), self.task, self.worker))
            self.returns[j] = 0.0
            self.steps[j] = 0
        out[R.OBS][:] = s.obs
        return finished

    def close(self) -> None:
        try:
            self.envs.close()
        except Exception:  # closing a broken env must not hide the original error
            pass
