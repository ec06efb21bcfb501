"""Atari envs stepped in C++ threads (``atari:<Game>?vector=ale|envpool``), in fwrl's Atari protocol.

Both libraries emulate the game, repeat each action 4 frames, max-pool the last
two, convert to grey and area-resize to 84x84 in C++ (OpenCV's INTER_AREA;
the Python chain averages exactly, so a pixel may differ by one grey level).
They return the newest frame only: the stack of 4 is kept here, as the Python
chain keeps it (gymnasium's ``FrameStackObservation``): every episode, a life
included, starts as its first frame repeated 4 times. Episode ends follow
:class:`~fwrl.envs.vector_group.VectorStep`: a life loss (train mode) is a
termination with ``game_over`` False and the game goes on; the frame cap is a
truncation, with the cut episode's last stack in ``final_obs``; a game over
is a termination with ``game_over`` True.

Both libraries run without their own episodic-life mode (ale_py's resets the
game at a life loss, and so does EnvPool's when asked to reset the env then):
life losses are read here from ``lives``, as
:class:`~fwrl.envs.wrappers.EpisodicLife` reads them, and play goes on.

- :class:`AleVectorAtari`: ale_py's ``AtariVectorEnv`` (the same emulator and
  ROMs as the Python chain), which resets an ended game in the same step
  (``SameStep``) and hands back its last frame.
- :class:`EnvpoolAtari`: EnvPool, which resets an ended game at the next step
  (``NextStep``, dropping that step's action): such rows are reset at once
  here instead, so the new game's first frame is in the same result.

Where they differ from the Python chain (random play statistics agree, see
``tests/e2e/test_envs_atari_vector.py`` and ``benchmarks/results/atari_vector.md``):

=====================  ========================  =========================  =========================
                       Python chain (``none``)   ``ale``                    ``envpool``
=====================  ========================  =========================  =========================
no-ops at a new game   1-30 frames               0-29 frames (0-28 before   1-30 frames (0-29 before
                                                 FIRE)                      FIRE)
fire reset             FIRE, then action 2       FIRE for one frame         FIRE for one frame
                       (4 frames each)
after a life loss      one NOOP step, then the   nothing: play goes on (the agent presses FIRE itself)
                       fire reset
frame cap (108 000)    every frame since the     frames of agent steps      agent steps x 4 since the
                       game started              since the game started     game started
emulator, ROMs         ale_py                    ale_py (the same)          EnvPool's own ALE build
=====================  ========================  =========================  =========================
"""

from __future__ import annotations

import importlib
import math
import warnings
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from fwrl.envs.vector_group import VectorStep
from fwrl.envs.vector_paths import import_envpool
from fwrl.errors import FwrlError, missing_dependency


@dataclass(frozen=True)
class AtariVectorSettings:
    """What both vector paths need to know (``fwrl.envs.atari`` fills it from the spec)."""

    game: str  # ALE id name, e.g. "MsPacman"
    rom: str  # ale_py ROM id, e.g. "ms_pacman"
    episodic_life: bool  # train mode: a life loss ends the training episode
    sticky: float  # repeat_action_probability
    full_action_space: bool
    max_frames: int  # the frame cap (ALE's max_num_frames_per_episode)
    threads: int
    noop_max: int = 30
    skip: int = 4
    size: int = 84
    stack: int = 4


class FrameStack:
    """The last ``depth`` frames of K envs, ``frames[K, depth, H, W]`` (oldest first)."""

    def __init__(self, k: int, depth: int, size: int):
        self.frames = np.zeros((k, depth, size, size), np.uint8)

    def start(self, rows: np.ndarray, newest: np.ndarray) -> None:
        """Rows ``rows`` start an episode: their stack is ``newest[rows]`` repeated."""
        self.frames[rows] = newest[rows][:, None]

    def push(self, newest: np.ndarray) -> None:
        self.frames[:, :-1] = self.frames[:, 1:]
        self.frames[:, -1] = newest

    def after(self, rows: np.ndarray, newest: np.ndarray) -> np.ndarray:
        """The stacks of ``rows`` once ``newest[rows]`` were pushed (nothing is stored)."""
        return np.concatenate([self.frames[rows, 1:], newest[rows][:, None]], axis=1)


def import_ale_vector():
    """ale_py's vector env module, or the install hint."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return importlib.import_module("ale_py.vector_env")
    except ImportError:
        raise missing_dependency("ale_py", "atari", "atari envs with vector=ale") from None


def envpool_task_id(rom: str) -> str:
    """EnvPool's Atari task id for an ale_py ROM id (``ms_pacman`` -> ``MsPacman-v5``)."""
    return "".join(part.capitalize() for part in rom.split("_")) + "-v5"


class _AtariVector:
    """What both libraries share: the frame stack, and life losses read from ``lives`` as
    :class:`~fwrl.envs.wrappers.EpisodicLife` reads them (the libraries' own episodic-life
    modes reset the game at a life loss: ale_py's at once, EnvPool's when asked to reset)."""

    settings: AtariVectorSettings
    num_envs: int

    def _start(self, newest: np.ndarray, lives: np.ndarray) -> np.ndarray:
        self.stack = FrameStack(self.num_envs, self.settings.stack, self.settings.size)
        self.stack.start(np.ones(self.num_envs, bool), newest)
        self.lives = lives.astype(np.int64)
        return self.stack.frames

    def _finish(self, newest: np.ndarray, reward: np.ndarray, terminated: np.ndarray, truncated: np.ndarray,
                lives: np.ndarray, final_newest: np.ndarray) -> VectorStep:
        """The step in fwrl's protocol, from the library's arrays: ``terminated`` / ``truncated``
        end the game (the library reset those rows: ``newest`` and ``lives`` are the new game's
        there, ``final_newest`` the cut game's last frame in the truncated rows)."""
        game_over = terminated | truncated
        lives = lives.astype(np.int64)
        life_lost = np.zeros_like(game_over)
        if self.settings.episodic_life:
            life_lost = ~game_over & (lives < self.lives) & (lives > 0)
        self.lives = lives
        final_obs = None
        if truncated.any():
            final_obs = np.zeros_like(self.stack.frames)
            final_obs[truncated] = self.stack.after(truncated, final_newest)
        self.stack.push(newest)
        self.stack.start(game_over | life_lost, newest)
        return VectorStep(self.stack.frames, reward.astype(np.float32), terminated | life_lost,
                          truncated & ~terminated, game_over, final_obs)


class AleVectorAtari(_AtariVector):
    """K Atari envs of ale_py's ``AtariVectorEnv`` (see the module docstring)."""

    def __init__(self, settings: AtariVectorSettings, seeds: Sequence[int]):
        from gymnasium.vector import AutoresetMode

        vector_env = import_ale_vector()
        self.settings = settings
        self.num_envs = len(seeds)
        self.seeds = np.asarray(seeds, np.int64)
        s = settings
        self.env = vector_env.AtariVectorEnv(
            s.rom, self.num_envs, num_threads=min(s.threads, self.num_envs), max_num_frames_per_episode=s.max_frames,
            repeat_action_probability=s.sticky, full_action_space=s.full_action_space,
            autoreset_mode=AutoresetMode.SAME_STEP, img_height=s.size, img_width=s.size, grayscale=True, stack_num=1,
            frameskip=s.skip, maxpool=True, noop_max=s.noop_max, episodic_life=False, life_loss_info=False,
            reward_clipping=False, use_fire_reset=True)

    def reset(self) -> np.ndarray:
        obs, info = self.env.reset(seed=self.seeds)
        return self._start(obs[:, 0], info["lives"])

    def step(self, actions: np.ndarray) -> VectorStep:
        obs, reward, terminated, truncated, info = self.env.step(np.asarray(actions, np.int64))
        # SameStep: rows whose game ended are reset already; info["final_obs"] (there when one was) holds
        # their last frame
        final = info["final_obs"][:, 0] if "final_obs" in info else obs[:, 0]
        return self._finish(obs[:, 0], reward, terminated, truncated, info["lives"], final)

    def close(self) -> None:
        self.env.close()


class EnvpoolAtari(_AtariVector):
    """K Atari envs of EnvPool (see the module docstring)."""

    def __init__(self, settings: AtariVectorSettings, seeds: Sequence[int]):
        envpool = import_envpool("atari envs with vector=envpool")
        task_id = envpool_task_id(settings.rom)
        if task_id not in envpool.list_all_envs():
            raise FwrlError(f"envpool {envpool.__version__} has no Atari game {settings.game!r} (task {task_id}); "
                            "use vector=ale or vector=none for it.")
        s = settings
        self.settings = settings
        self.num_envs = len(seeds)
        self.env = envpool.make_gymnasium(
            task_id, num_envs=self.num_envs, batch_size=self.num_envs, num_threads=min(s.threads, self.num_envs),
            seed=int(seeds[0]), env_seed=[int(x) for x in seeds], max_episode_steps=math.ceil(s.max_frames / s.skip),
            stack_num=1, frame_skip=s.skip, noop_max=max(1, s.noop_max), episodic_life=False, reward_clip=False,
            use_fire_reset=True, img_height=s.size, img_width=s.size, gray_scale=True, use_inter_area_resize=True,
            full_action_space=s.full_action_space, repeat_action_probability=s.sticky)

    def reset(self) -> np.ndarray:
        obs, info = self.env.reset()
        return self._start(obs[:, 0], info["lives"])

    def step(self, actions: np.ndarray) -> VectorStep:
        obs, reward, terminated, truncated, info = self.env.step(np.asarray(actions, np.int32))
        final_newest = obs[:, 0]
        newest, lives = final_newest, info["lives"]
        ended = terminated | truncated
        if ended.any():  # EnvPool would reset these at the next step (NextStep); do it now
            ids = np.flatnonzero(ended).astype(np.int32)
            reset_obs, reset_info = self.env.reset(ids)
            newest, lives = final_newest.copy(), lives.copy()
            newest[reset_info["env_id"]] = reset_obs[:, 0]
            lives[reset_info["env_id"]] = reset_info["lives"]
        return self._finish(newest, reward, terminated, truncated, lives, final_newest)

    def close(self) -> None:
        self.env.close()
