"""Episode videos (``fwrl evaluate --video``, ``fwrl train --video-every``): each family's frames,
written as MP4 and played back (frame count and size), the names, nothing half-written, the
refusals before anything runs, and the episodes being the evaluation's own."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from fwrl.envs.registry import describe_env
from fwrl.errors import FwrlError
from fwrl.evaluation import video as V
from fwrl.evaluation.playback import env_for
from fwrl.evaluation.protocols import protocol_splits
from fwrl.runner.agent import build_model
from fwrl.settings.config import TrainConfig

imageio_ffmpeg = pytest.importorskip("imageio_ffmpeg")

MEMORY = "memory:cue_delay?delay=3"


def played_back(path: Path) -> tuple[int, tuple[int, int]]:
    """(frames, (width, height)) of an MP4, decoded by ffmpeg."""
    frames = imageio_ffmpeg.read_frames(str(path))
    meta = next(frames)
    count = sum(1 for _ in frames)
    return count, tuple(meta["size"])


def tiny_model(env: str, core: str = "lstm"):
    torch.manual_seed(0)
    options = {"hidden_size": 16} if core in ("lstm", "gru") else {}
    return build_model(TrainConfig.from_dict({"env": env, "core": core, "core_options": options}), describe_env(env))


def random_steps_video(env: str, folder: Path, steps: int) -> tuple[Path, tuple[int, int, int]]:
    """``steps`` random actions of ``env`` as the recorder draws them; returns the video and the
    first frame's shape."""
    renderer = V.renderer_for(env)
    made = env_for(env, seed=3)
    obs, _ = made.reset(seed=None)
    writer = V.VideoWriter(folder, renderer.fps)
    rng = np.random.default_rng(0)
    first = None
    try:
        for _ in range(steps):
            action = int(rng.integers(made.action_space.n))
            frame = renderer.frame(made, obs, action, 0.0)
            first = frame.shape if first is None else first
            assert frame.dtype == np.uint8 and frame.shape == first
            writer.add(frame)
            obs, _, terminated, truncated, _ = made.step(action)
            if terminated or truncated:
                obs, _ = made.reset()
        return writer.finish("clip.mp4"), first
    finally:
        made.close()


def padded(shape: tuple[int, ...]) -> tuple[int, int]:
    """(width, height) of a frame after the padding to multiples of 16."""
    return (-(-shape[1] // 16) * 16, -(-shape[0] // 16) * 16)


@pytest.mark.parametrize("env, library, shape", [
    ("atari:Pong?max_frames=400", "ale_py", (420, 320, 3)),  # the emulator's RGB screen at 2x
    ("minatar:breakout", "minatar", (160, 160, 3)),  # 10 x 10 cells of 16 pixels
    ("procgen:coinrun", "procgen", (256, 256, 3)),  # the 64 x 64 observation at 4x
    ("popgym:RepeatFirst", "popgym", None),
    (MEMORY, None, None),
])
def test_each_family_gives_frames_that_play_back(env, library, shape, tmp_path):
    if library:
        pytest.importorskip(library)
    path, first = random_steps_video(env, tmp_path, 12)
    if shape is not None:
        assert first == shape
    frames, size = played_back(path)
    assert frames == 12 and size == padded(first)
    assert [p.name for p in tmp_path.iterdir()] == ["clip.mp4"]  # the temporary file was renamed


def test_minatar_cells_take_their_highest_channels_colour():
    renderer = V.MinAtarRenderer(channels=3, cell=1)
    obs = np.zeros((3, 10, 10), np.uint8)
    obs[0, 0, 0] = 255
    obs[[0, 2], 1, 1] = 255
    image = renderer.frame(None, obs, 0, 0.0)
    palette = V.cubehelix_palette(3)
    assert (image[0, 0] == palette[0]).all() and (image[1, 1] == palette[2]).all() and (image[5, 5] == 0).all()


def test_strip_shows_observation_action_and_reward_of_the_newest_step():
    renderer = V.StripRenderer(obs_size=3, action_dims=(2,), steps=4)
    renderer.start()
    image = renderer.frame(None, np.array([1.0, 0.0, -1.0], np.float32), 1, 0.5)
    cell = renderer.cell
    newest = image[:, -cell:][cell // 2::cell, cell // 2]  # one pixel per row of the last column
    assert tuple(newest[0]) == (200, 30, 30) and tuple(newest[1]) == (255, 255, 255)  # +1 red, 0 white
    assert tuple(newest[2]) == (30, 60, 200)  # -1 blue
    assert tuple(newest[4]) == (255, 255, 255) and tuple(newest[5]) == (0, 0, 0)  # action 1 of 2 taken
    assert newest[7][1] < 255  # a positive reward
    assert (image[:, :-cell] == 235).all()  # no older steps yet


def test_memory_and_popgym_episodes_are_recorded_whole_and_named_by_their_return(tmp_path):
    pytest.importorskip("popgym")
    for env in (MEMORY, "popgym:RepeatFirst"):
        videos = V.record_videos(tiny_model(env), env, tmp_path, episodes=2, seed=5)
        assert [v.episode for v in videos] == [0, 1]
        for v in videos:
            assert v.path.name == V.video_name(v.task, "test", v.episode, v.episode_return)
            assert v.path.name.startswith(f"{v.task}-test-episode{v.episode}-return")
            frames, _ = played_back(v.path)
            assert frames == v.frames == v.length + 1  # every observation the agent acted on, and the last
    assert not list(tmp_path.glob(".*"))


def test_a_recording_cut_short_leaves_no_file(tmp_path, monkeypatch):
    """A stop mid-episode, or an error, leaves neither a video nor its temporary file."""
    model = tiny_model(MEMORY)
    stop = threading.Event()
    frame = V.StripRenderer.frame

    def frame_then_stop(self, *args):
        stop.set()  # the recorder looks at it before the next step
        return frame(self, *args)

    monkeypatch.setattr(V.StripRenderer, "frame", frame_then_stop)
    assert V.record_videos(model, MEMORY, tmp_path, episodes=1, stop=stop) == []
    assert list(tmp_path.iterdir()) == []

    calls = []

    def frame_then_fail(self, *args):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("renderer broke")
        return frame(self, *args)

    monkeypatch.setattr(V.StripRenderer, "frame", frame_then_fail)
    with pytest.raises(RuntimeError, match="renderer broke"):
        V.record_videos(model, MEMORY, tmp_path, episodes=1)
    assert list(tmp_path.iterdir()) == []


def test_refusals_before_anything_runs(tmp_path, monkeypatch):
    with pytest.raises(FwrlError, match="chaos envs"):
        V.check_video("chaos:cue_delay", tmp_path / "v")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(FwrlError, match="is a file"):
        V.check_video(MEMORY, blocker)
    with pytest.raises(FwrlError, match="not writable"):
        V.check_video(MEMORY, blocker / "inside")
    with pytest.raises(FwrlError, match="unknown env family"):
        V.check_video("nope:x", tmp_path / "v")
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "imageio_ffmpeg" else real(name, *a))
    with pytest.raises(FwrlError, match=r"imageio_ffmpeg.*\[video\]"):
        V.check_video(MEMORY, tmp_path / "v")
    assert not (tmp_path / "v").exists()


def test_cli_evaluate_records_the_evaluations_own_episodes(tmp_path):
    """``--video`` records the first episodes of the evaluation's worker of each task: with one
    worker of one env, the evaluation's episodes themselves (same seeds, same returns)."""
    from cli_runs import assert_refused, run_cli, write_memory_checkpoint

    write_memory_checkpoint(tmp_path)  # a fresh LSTM agent of memory:cue_delay
    videos = tmp_path / "videos"
    code, _, err = run_cli(["evaluate", tmp_path, "--episodes", "4", "--num-workers", "1", "--envs-per-worker", "1",
                            "--seed", "3", "--video", videos, "--video-episodes", "4"])
    assert code == 0, err
    result = json.loads((tmp_path / "evaluation.json").read_text())
    recorded = sorted(result["videos"], key=lambda v: v["episode"])
    assert [v["return"] for v in recorded] == result["runs"][0]["returns"]
    assert sorted(p.name for p in videos.iterdir()) == sorted(Path(v["path"]).name for v in recorded)
    for v in recorded:
        assert played_back(Path(v["path"]))[0] == v["frames"] == v["length"] + 1
    # refused in one line before anything is written: --video-episodes alone, a file as the folder, an env without frames
    for argv, needle in ([["--video-episodes", "2"], "--video DIR"], [["--video", tmp_path / "checkpoint.pt"], "is a file"],
                         [["--video", tmp_path / "v2", "--env", "chaos:cue_delay"], "chaos envs"]):
        code, _, err = run_cli(["evaluate", tmp_path, *argv])
        assert_refused(code, err, needle, one_line=True)
    assert not (tmp_path / "v2").exists()


def test_periodic_video_records_snapshots_into_the_run_folder(tmp_path):
    config = TrainConfig.from_dict({"env": MEMORY, "core": "lstm", "core_options": {"hidden_size": 16},
                                    "video_every": 5})
    model = tiny_model(MEMORY)
    video = V.PeriodicVideo(config, tmp_path / "videos", "cpu", updates=0)
    lock = threading.Lock()
    assert not video.maybe_start(4, 100, model, lock)
    assert video.maybe_start(5, 200, model, lock)
    video.close(wait=True)
    ((steps, (clip,)),) = video.poll()
    assert steps == 200 and clip.path.name.startswith("update5-cue_delay-test-episode0-return")
    assert played_back(clip.path)[0] == clip.length + 1
    assert not video.maybe_start(9, 300, model, lock) and video.next_at == 10
