"""Shared gymnasium wrappers for fwrl's env families (no torch here).

Atari chain (torchbeast / IMPALA protocol, PAPERS.md §5), applied
by :mod:`fwrl.envs.atari` in this order on an ``ALE/<Game>-v5`` env made with
``frameskip=1``::

    AtariPreprocess   noop reset (1..30 no-ops), repeat each action 4 frames,
                      max over the last two frames, greyscale, 84x84 area resize
    EpisodicLife      (train mode only) a life loss ends the training episode;
                      the next reset continues the same game
    FireReset         press FIRE after every reset in games that need it
    FrameStackObservation (gymnasium) 4 frames -> (4, 84, 84) uint8
    SeedOnFirstReset  the seed given to ``make`` seeds the first reset

``info["game_over"]`` is set on every step: True only when the whole game
ended (ALE terminal or ALE's 108 000-frame truncation), False on a life-loss
end. The two kinds of episode end keep gymnasium's flags: a life loss is
``terminated=True, truncated=False`` (the torchbeast protocol: a terminal for
the value, the game goes on), ALE's frame cap is ``truncated=True,
terminated=False`` (the game was cut, not lost). gymnasium's ``AtariPreprocessing`` is not used: it needs OpenCV for the
resize (a heavy dependency whose wheels pin numpy versions that clash with
the ProcGen wheel) and its life-loss option ends the game. The area resize
here is exact area averaging (what OpenCV's INTER_AREA does when shrinking),
done as two small gathers (no BLAS).

Turning any other observation into fwrl's layout (images to uint8 CHW,
vectors, Dict / Tuple observations) is :mod:`fwrl.envs.layout`'s job.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import gymnasium as gym
import numpy as np


# ----------------------------------------------------------------------------
# Resizing


@lru_cache(maxsize=32)
def area_resize_weights(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray]:
    """Area resampling along one axis as ``(index, weight)``, each ``[n_out, K]``.

    Output pixel ``i`` covers the input interval ``[i*s, (i+1)*s)`` with
    ``s = n_in / n_out``; its value is the overlap-weighted mean of the (at
    most ``K``) input pixels under it: ``out[i] = sum_k weight[i, k] *
    in[index[i, k]]``. Weights of a row sum to 1. A gather, not a matrix
    product, so env workers never start BLAS threads.
    """
    if n_in <= 0 or n_out <= 0:
        raise ValueError(f"sizes must be positive, got {n_in} -> {n_out}")
    scale = n_in / n_out
    lo = np.arange(n_out, dtype=np.float64)[:, None] * scale
    hi = lo + scale
    j = np.arange(n_in, dtype=np.float64)[None, :]
    overlap = np.clip(np.minimum(hi, j + 1) - np.maximum(lo, j), 0.0, None) / scale
    k = int((overlap > 0).sum(axis=1).max())
    index = np.argsort(overlap <= 0, axis=1, kind="stable")[:, :k]
    weight = np.take_along_axis(overlap, index, axis=1)
    return index, weight.astype(np.float32)


def _resize_axis0(x: np.ndarray, n_out: int) -> np.ndarray:
    index, weight = area_resize_weights(x.shape[0], n_out)
    w = weight.reshape(weight.shape + (1,) * (x.ndim - 1))
    return (x[index] * w).sum(axis=1)


def resize_frame(frame: np.ndarray, height: int, width: int) -> np.ndarray:
    """Area-resize a uint8 ``HxW`` or ``HxWxC`` frame to ``height x width`` (uint8)."""
    h, w = frame.shape[:2]
    if (h, w) == (height, width):
        return frame
    out = frame.astype(np.float32)
    if h != height:
        out = _resize_axis0(out, height)
    if w != width:
        out = _resize_axis0(out.swapaxes(0, 1), width).swapaxes(0, 1)
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


# ----------------------------------------------------------------------------
# Atari


class AtariPreprocess(gym.Wrapper):
    """Noop reset, action repeat with max-pooling, greyscale, area resize.

    Mnih et al. 2015 / IMPALA (Espeholt et al. 2018) protocol. ``reset`` plays
    a random number (1..``noop_max``) of NOOPs, drawn from the env's seeded
    ``np_random``. ``step`` repeats the action ``skip`` frames, sums the
    rewards and returns the pixel-wise max of the last two frames, greyscale,
    resized to ``size x size``. ``info["game_over"]`` is ``terminated or
    truncated`` of the underlying game.
    """

    def __init__(self, env: gym.Env, noop_max: int = 30, skip: int = 4, size: int = 84):
        super().__init__(env)
        if getattr(env.unwrapped, "_frameskip", None) != 1:
            raise ValueError("AtariPreprocess needs the base ALE env made with frameskip=1")
        if noop_max > 0 and env.unwrapped.get_action_meanings()[0] != "NOOP":
            raise ValueError("noop reset needs action 0 to be NOOP")
        self.noop_max = noop_max
        self.skip = skip
        self.size = size
        h, w = env.observation_space.shape[:2]
        self._buf = np.zeros((2, h, w), np.uint8)
        self.observation_space = gym.spaces.Box(0, 255, (size, size), np.uint8)

    @property
    def ale(self):
        return self.env.unwrapped.ale

    def _frame(self) -> np.ndarray:
        pooled = np.maximum(self._buf[0], self._buf[1])
        return resize_frame(pooled, self.size, self.size)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        _, info = self.env.reset(seed=seed, options=options)
        noops = int(self.np_random.integers(1, self.noop_max + 1)) if self.noop_max > 0 else 0
        for _ in range(noops):
            _, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                _, info = self.env.reset(options=options)
        self.ale.getScreenGrayscale(self._buf[0])
        self._buf[1] = self._buf[0]
        info = dict(info)
        info["noops"] = noops
        return self._frame(), info

    def step(self, action):
        total = 0.0
        terminated = truncated = False
        info: dict[str, Any] = {}
        for t in range(self.skip):
            _, reward, terminated, truncated, info = self.env.step(action)
            total += float(reward)
            done = terminated or truncated
            if done or t == self.skip - 1:
                self.ale.getScreenGrayscale(self._buf[1])  # newest frame
                if self.skip < 2 or t < self.skip - 1:
                    self._buf[0] = self._buf[1]  # no earlier frame this step
                break
            if t == self.skip - 2:
                self.ale.getScreenGrayscale(self._buf[0])  # second newest
        info = dict(info)
        info["game_over"] = bool(terminated or truncated)
        return self._frame(), total, terminated, truncated, info


class EpisodicLife(gym.Wrapper):
    """A life loss ends the training episode but not the game (Mnih et al. 2015).

    On a life loss ``step`` returns ``terminated=True`` with
    ``info["game_over"] = False``; the following ``reset`` does not reset the
    game but plays one NOOP step and continues. A real game end (or a reset
    with an explicit seed) resets the game.
    """

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self._lives = 0
        self._game_over = True

    def _ale_lives(self) -> int:
        return int(self.env.unwrapped.ale.lives())

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._game_over = bool(terminated or truncated)
        lives = self._ale_lives()
        if not self._game_over and 0 < lives < self._lives:
            terminated = True
        self._lives = lives
        info = dict(info)
        info["game_over"] = self._game_over
        return obs, reward, terminated, truncated, info

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if self._game_over or seed is not None:
            obs, info = self.env.reset(seed=seed, options=options)
        else:
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset(options=options)
        self._game_over = False
        self._lives = self._ale_lives()
        info = dict(info)
        info.pop("game_over", None)
        return obs, info


class FireReset(gym.Wrapper):
    """Press FIRE, then action 2, after each reset (baselines / torchbeast).

    Only for games whose action set has FIRE (e.g. Breakout, which is frozen
    until FIRE is pressed). If one of those steps ends the episode, reset again.
    """

    def __init__(self, env: gym.Env):
        super().__init__(env)
        meanings = env.unwrapped.get_action_meanings()
        self.fire_action = meanings.index("FIRE") if "FIRE" in meanings else None
        self._second = 2 if len(meanings) >= 3 else None

    @staticmethod
    def needed(env: gym.Env) -> bool:
        return "FIRE" in env.unwrapped.get_action_meanings()

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        info = dict(info)
        for action in (self.fire_action, self._second):
            if action is None:
                continue
            obs, _, terminated, truncated, step_info = self.env.step(action)
            info.update(step_info)
            if terminated or truncated:
                obs, info = self.env.reset(options=options)
                info = dict(info)
        info.pop("game_over", None)
        return obs, info


class SeedOnFirstReset(gym.Wrapper):
    """Use ``seed`` for the first ``reset()`` that gets no seed; seeds the action space too.

    Lets ``make(..., seed=s)`` give a deterministic env without resetting it
    at construction (env workers call ``reset()`` themselves).
    """

    def __init__(self, env: gym.Env, seed: int | None):
        super().__init__(env)
        self._pending_seed = seed
        if seed is not None:
            self.action_space.seed(seed)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is None:
            seed = self._pending_seed
        self._pending_seed = None
        return self.env.reset(seed=seed, options=options)
