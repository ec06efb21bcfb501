"""Episode videos: an MP4 per episode, from the env's own frames (``fwrl evaluate --video DIR``,
``fwrl train --video-every N``).

Frames, by env family (:func:`frame_renderer`), one per observation the agent acted on and one for
the episode's last:

- ``atari``: the emulator's RGB screen (210 x 160, shown at twice that), what a player sees, not
  the agent's 84 x 84 grey stack; 15 frames/s, the agent's rate (60 Hz over a skip of 4);
- ``procgen``: the 64 x 64 RGB observation (the agent's view), shown at 4x; 15 frames/s;
- ``minatar``: the 10 x 10 channels drawn as MinAtar's own display draws them (each cell the
  colour of its highest channel in seaborn's cubehelix palette of the game's channels, black where
  none is set), 16 pixels a cell; 10 frames/s;
- ``popgym``, ``memory``, ``gym`` (vector observations): no frames of their own, so a strip
  (:class:`StripRenderer`): the last 64 steps as columns, each the observation's entries (blue
  negative, red positive), then the action taken there, then the reward (a reward of any size at
  least half-coloured, POPGym's are tiny); the newest step on the right; 4 frames/s;
- an env whose observation is an RGB or grey frame (``dmlab``, a gym env of images): that frame;
- ``chaos`` (fault injection, a testing aid): refused, it has nothing to show.

Files: ``<task>-<split>-episode<k>-return<R>.mp4`` (:func:`video_name`), encoded by ffmpeg through
``imageio-ffmpeg`` (H.264, yuv420p: sides padded with black to multiples of 16), written into a
temporary ``.<name>.<random>.tmp`` file of the folder and renamed when the episode ends, so a crash
leaves no half-written video (``fwrl.utils.files.remove_temporary_files`` finds the leftovers).
The episodes are those the evaluation's worker of each task plays first
(:mod:`fwrl.evaluation.playback`).

Nothing here imports torch: the checks (:func:`check_video`) answer before it is loaded.
"""

from __future__ import annotations

import importlib.util
import os
import re
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from fwrl.envs.spec import parse_env_spec
from fwrl.errors import FwrlError, missing_dependency
from fwrl.evaluation.periodic import PeriodicJob
from fwrl.utils.files import check_writable_folder

MACRO_BLOCK = 16  # H.264 frames' sides: multiples of this (imageio-ffmpeg's default block), padded black
STRIP_STEPS = 64  # steps a strip shows (a RepeatFirst episode, 52 observations, whole)
NO_FRAMES = {"chaos": "chaos envs (fault injection, a testing aid) have no frames to record"}


# ----------------------------------------------------------------------------- renderers

class Renderer:
    """What an episode's frames look like: ``frame(env, obs, action, reward)`` -> ``(H, W, 3)``
    uint8 at one observation (``action`` None at the episode's last), ``fps``; ``start()`` before
    each episode."""

    fps: int = 15

    def start(self) -> None:
        pass

    def frame(self, env, obs: Any, action: Any, reward: float) -> np.ndarray:
        raise NotImplementedError


def _frame_of(obs: Any) -> np.ndarray:
    return np.asarray(obs["obs"] if isinstance(obs, dict) else obs)


def _scaled(image: np.ndarray, scale: int) -> np.ndarray:
    return image.repeat(scale, axis=0).repeat(scale, axis=1) if scale > 1 else image


class AtariRenderer(Renderer):
    """The emulator's RGB screen (ale_py's ``getScreenRGB``), at twice its size."""

    fps = 15

    def frame(self, env, obs, action, reward):
        return _scaled(env.unwrapped.ale.getScreenRGB(), 2)


class ObservationRenderer(Renderer):
    """A frame observation ``(C, H, W)`` uint8: RGB where C is 3, else its last channel in grey."""

    def __init__(self, scale: int = 1, fps: int = 15):
        self.scale, self.fps = scale, fps

    def frame(self, env, obs, action, reward):
        chw = _frame_of(obs)
        image = chw.transpose(1, 2, 0) if chw.shape[0] == 3 else np.repeat(chw[-1][..., None], 3, axis=2)
        return _scaled(np.ascontiguousarray(image, dtype=np.uint8), self.scale)


def cubehelix_palette(n: int) -> np.ndarray:
    """``n`` RGB colours (uint8) of matplotlib's cubehelix map sampled as seaborn's
    ``color_palette("cubehelix", n)`` samples it (MinAtar's display)."""
    from matplotlib import colormaps

    return (colormaps["cubehelix"](np.linspace(0, 1, n + 2)[1:-1])[:, :3] * 255).round().astype(np.uint8)


class MinAtarRenderer(Renderer):
    """MinAtar's channels in its display's colours: a cell takes its highest set channel's colour."""

    fps = 10

    def __init__(self, channels: int, cell: int = 16):
        self.colours = np.concatenate([np.zeros((1, 3), np.uint8), cubehelix_palette(channels)])
        self.cell = cell

    def frame(self, env, obs, action, reward):
        chw = _frame_of(obs) > 0
        index = np.arange(1, chw.shape[0] + 1).reshape(-1, 1, 1)
        return _scaled(self.colours[(chw * index).max(axis=0)], self.cell)


def _diverging(values: np.ndarray) -> np.ndarray:
    """Values clipped to [-1, 1] as colours: white at 0, red towards 1, blue towards -1."""
    v = np.clip(np.nan_to_num(values.astype(np.float64)), -1.0, 1.0)[..., None]
    white = np.array([255.0, 255.0, 255.0])
    red, blue = np.array([200.0, 30.0, 30.0]), np.array([30.0, 60.0, 200.0])
    return np.where(v >= 0, white + v * (red - white), white - v * (blue - white)).round().astype(np.uint8)


class StripRenderer(Renderer):
    """Vector observations as a strip of the last :data:`STRIP_STEPS` steps (columns, newest on the
    right): rows of the observation's entries (and ``obs_extra``'s), a grey line, the action taken
    (one row per action of each action dimension, black where taken), a grey line, the reward (its
    sign, at least half-coloured)."""

    fps = 4

    def __init__(self, obs_size: int, action_dims: Sequence[int], steps: int = STRIP_STEPS):
        self.action_dims = tuple(int(d) for d in action_dims)
        self.rows = obs_size + 1 + sum(self.action_dims) + 1 + 1
        self.steps = steps
        self.cell = max(2, min(10, 480 // self.rows))
        self.columns: list[np.ndarray] = []

    def start(self) -> None:
        self.columns = []

    def _column(self, obs, action, reward) -> np.ndarray:
        parts = [obs[k] for k in ("obs", "obs_extra") if k in obs] if isinstance(obs, dict) else [obs]
        values = np.concatenate([np.asarray(p, np.float64).reshape(-1) for p in parts])
        grey = np.full((1, 3), 160, np.uint8)
        taken = np.full((sum(self.action_dims), 3), 255, np.uint8)
        if action is not None:
            picks = np.atleast_1d(np.asarray(action)).astype(np.int64)
            for offset, pick in zip(np.cumsum((0,) + self.action_dims[:-1]), picks):
                taken[offset + int(pick)] = 0
        shown = np.sign(reward) * max(abs(reward), 0.5) if reward else 0.0  # POPGym's rewards are ~1/50: seen
        return np.concatenate([_diverging(values), grey, taken, grey, _diverging(np.array([shown]))])

    def frame(self, env, obs, action, reward):
        self.columns = (self.columns + [self._column(obs, action, reward)])[-self.steps:]
        strip = np.full((self.rows, self.steps, 3), 235, np.uint8)
        strip[:, self.steps - len(self.columns):] = np.stack(self.columns, axis=1)
        image = _scaled(strip, self.cell)
        image[:, -self.cell:][:, [0, -1]] = 0  # a frame round the newest step
        image[[0, -1], -self.cell:] = 0
        return image


def frame_renderer(env: str, obs_shape: Sequence[int], obs_dtype: str, extra_size: int,
                   action_dims: Sequence[int]) -> Renderer:
    """The renderer of ``env``'s videos (module docstring) for its observations; a FwrlError where
    it has nothing to show."""
    family = parse_env_spec(env).family
    if family in NO_FRAMES:
        raise FwrlError(f"cannot record videos of {env!r}: {NO_FRAMES[family]}.")
    if family == "atari":
        return AtariRenderer()
    if family == "minatar":
        return MinAtarRenderer(int(obs_shape[0]))
    if len(obs_shape) == 3 and obs_dtype == "uint8":
        return ObservationRenderer(scale=4 if max(obs_shape[1:]) <= 64 else 1)
    if len(obs_shape) == 1:
        return StripRenderer(int(obs_shape[0]) + int(extra_size), action_dims)
    raise FwrlError(f"cannot record videos of {env!r}: its observations {tuple(obs_shape)} ({obs_dtype}) are "
                    "neither a frame (C, H, W) of uint8 nor a vector.")


def renderer_for(env: str, env_wrappers: Sequence[str] = ()) -> Renderer:
    """:func:`frame_renderer` for ``env`` as the agent sees it (described, not stepped)."""
    from fwrl.envs.registry import describe_env

    family = parse_env_spec(env).family
    if family in NO_FRAMES:
        raise FwrlError(f"cannot record videos of {env!r}: {NO_FRAMES[family]}.")
    info = describe_env(env, wrappers=tuple(env_wrappers))
    return frame_renderer(env, info.obs_shape, info.obs_dtype, info.extra_size, info.action_dims)


def check_video_folder(folder: Path | str | None) -> None:
    """The encoder (``imageio-ffmpeg``, the ``video`` extra) is installed and ``folder`` (where
    given) is a folder videos can be written into, or can be made."""
    if importlib.util.find_spec("imageio_ffmpeg") is None:
        raise missing_dependency("imageio_ffmpeg", "video", "episode videos")
    if folder is not None:
        folder = Path(folder)
        if folder.exists() and not folder.is_dir():
            raise FwrlError(f"video folder {folder} is a file; pass a folder to write the videos into.")
        check_writable_folder(folder, "video folder", "Pass another --video folder.")


def check_video(env: str, folder: Path | str | None, env_wrappers: Sequence[str] = ()) -> None:
    """Everything a video of ``env`` into ``folder`` needs, before anything runs: the encoder, a
    writable folder (:func:`check_video_folder`) and a family with frames."""
    check_video_folder(folder)
    renderer_for(env, env_wrappers)


# ----------------------------------------------------------------------------- files

def _padded(frame: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    h, w = frame.shape[:2]
    if (h, w) == size:
        return frame
    out = np.zeros((*size, 3), np.uint8)
    out[:h, :w] = frame[: size[0], : size[1]]
    return out


def _block(n: int) -> int:
    return -(-n // MACRO_BLOCK) * MACRO_BLOCK


class VideoWriter:
    """One MP4 written frame by frame into a temporary file of ``folder``, renamed by
    :meth:`finish` (:meth:`discard` removes it). Frames of one video share the first frame's size
    (padded to multiples of 16)."""

    def __init__(self, folder: Path, fps: int):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.fps = fps
        fd, tmp = tempfile.mkstemp(prefix=".video.", suffix=".tmp", dir=self.folder)
        os.close(fd)
        self.tmp = Path(tmp)
        self.frames = 0
        self.size: tuple[int, int] | None = None
        self._writer = None

    def add(self, frame: np.ndarray) -> None:
        if self._writer is None:
            import imageio_ffmpeg

            h, w = frame.shape[:2]
            self.size = (_block(h), _block(w))
            self._writer = imageio_ffmpeg.write_frames(str(self.tmp), (self.size[1], self.size[0]), fps=self.fps,
                                                       codec="libx264", macro_block_size=MACRO_BLOCK,
                                                       output_params=["-f", "mp4"], ffmpeg_log_level="error")
            self._writer.send(None)
        self._writer.send(np.ascontiguousarray(_padded(frame, self.size)))
        self.frames += 1

    def finish(self, name: str) -> Path:
        """Close the video and give it its name in the folder; returns its path."""
        if self._writer is None:
            raise ValueError("a video needs at least one frame")
        self._writer.close()
        self._writer = None
        path = self.folder / name
        os.chmod(self.tmp, 0o644)
        os.replace(self.tmp, path)
        return path

    def discard(self) -> None:
        if self._writer is not None:
            try:
                self._writer.close()
            except Exception:  # noqa: BLE001 - an encoder that failed: its file goes anyway
                pass
            self._writer = None
        self.tmp.unlink(missing_ok=True)


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]+", "-", text).strip("-") or "x"


def video_name(task: str, split: str, episode: int, episode_return: float, prefix: str = "") -> str:
    """``[prefix-]<task>-<split>-episode<k>-return<R>.mp4`` (R to 4 significant digits)."""
    return f"{prefix}{_safe(task)}-{_safe(split)}-episode{episode}-return{episode_return:.4g}.mp4"


@dataclass
class Video:
    """A written video: its path, task, split, episode index, return, episode length and frames."""

    path: Path
    task: str
    split: str
    episode: int
    episode_return: float
    length: int
    frames: int

    def describe(self) -> dict[str, Any]:
        return {"path": str(self.path), "task": self.task, "split": self.split, "episode": self.episode,
                "return": self.episode_return, "length": self.length, "frames": self.frames}


# ----------------------------------------------------------------------------- recording

def record_videos(model, env: str, folder: Path, *, episodes: int = 1, splits: Sequence[Any] | None = None,
                  seed: int = 0, greedy: bool = True, device="cpu", env_wrappers: Sequence[str] = (),
                  prefix: str = "", tasks: Sequence[int] | None = None, stop: threading.Event | None = None,
                  progress: Callable[[str], None] | None = None) -> list[Video]:
    """Record the first ``episodes`` episodes of every task (``tasks``: these only) and split
    (``splits``: :class:`~fwrl.evaluation.protocols.Split` objects; default: the protocol's) of
    ``env`` into ``folder``, played by ``model`` as the evaluation of ``seed`` plays them in its
    worker of that task (:mod:`fwrl.evaluation.playback`). ``progress(line)`` after each video."""
    from fwrl.evaluation.playback import env_for, play
    from fwrl.evaluation.protocols import protocol_splits

    spec = parse_env_spec(env)
    renderer = renderer_for(env, env_wrappers)
    folder = Path(folder)
    videos: list[Video] = []
    for split in (splits if splits is not None else protocol_splits(env)):
        for task in (tasks if tasks is not None else range(spec.num_tasks)):
            made = env_for(split.env, task, seed, env_wrappers)
            writer: list[VideoWriter] = []

            def on_step(step, made=made) -> None:
                if not writer:
                    renderer.start()
                    writer.append(VideoWriter(folder, renderer.fps))
                writer[0].add(renderer.frame(made, step.obs, step.action, step.reward))

            def on_episode(played, task=task, split=split) -> None:
                w = writer.pop()
                name = video_name(spec.names[task], split.name, played.index, played.episode_return, prefix)
                video = Video(w.finish(name), spec.names[task], split.name, played.index, played.episode_return,
                              played.length, w.frames)
                videos.append(video)
                if progress is not None:
                    progress(f"wrote {video.path} ({video.frames} frames, return {played.episode_return:.4g})")

            try:
                play(model, made, episodes=episodes, greedy=greedy, seed=seed, device=device, on_step=on_step,
                     on_episode=on_episode, stop=stop)
            finally:
                for w in writer:  # an episode cut short (a stop, an error): no half-written video
                    w.discard()
                made.close()
            if stop is not None and stop.is_set():
                return videos
    return videos


class PeriodicVideo(PeriodicJob[tuple[int, list[Video]]]):
    """``video_every``: record a greedy episode of the run's first task and split every that many
    updates, with a snapshot of the acting weights, in a background thread (one at a time), into
    ``folder`` (``update<N>-<task>-<split>-episode0-return<R>.mp4``); :meth:`poll` hands the
    finished ones over (with the agent steps of their snapshot) and re-raises a recording's error."""

    def __init__(self, config, folder: Path, device, updates: int = 0):
        from fwrl.evaluation.protocols import protocol_splits

        super().__init__(config.video_every, updates, "fwrl-video", "recording a video")
        self.config = config
        self.folder = Path(folder)
        self.device = device
        self.split = protocol_splits(config.env)[0]

    def maybe_start(self, updates: int, agent_steps: int, model, lock) -> bool:
        """Start a recording if ``updates`` passed the next mark and none is running."""
        return self._start(updates, model, lock, updates, agent_steps)

    def _work(self, model, updates: int, agent_steps: int) -> tuple[int, list[Video]]:
        cfg = self.config
        videos = record_videos(model, cfg.env, self.folder, episodes=1, splits=[self.split], tasks=[0],
                               seed=cfg.seed + 100_003, device=self.device, env_wrappers=tuple(cfg.env_wrappers),
                               prefix=f"update{updates}-", stop=self.stop)
        return agent_steps, videos
