"""Atari family: torchbeast / IMPALA protocol facts (PAPERS.md §5)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("ale_py", reason="ale_py is not installed (pip install 'fwrl[atari]')")

from fwrl.envs import describe_env, make_env  # noqa: E402
from fwrl.envs import atari  # noqa: E402
from fwrl.envs.wrappers import EpisodicLife, FireReset, resize_frame  # noqa: E402
from fwrl.errors import FwrlError  # noqa: E402


def _find(env, cls):
    while env is not None:
        if isinstance(env, cls):
            return env
        env = getattr(env, "env", None)
    return None


def test_shape_dtype_and_spaces():
    info = describe_env("atari:Pong")
    assert info.obs_shape == (4, 84, 84) and info.obs_dtype == "uint8"
    assert info.num_actions == 6  # minimal action set
    env = make_env("atari:Pong", seed=0)
    obs, _ = env.reset()
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
    assert env.observation_space.contains(obs)
    # the stack starts as 4 copies of the first frame and then shifts by one
    assert all(np.array_equal(obs[0], obs[i]) for i in range(4))
    nxt, *_ = env.step(0)
    assert np.array_equal(nxt[:3], obs[1:])
    env.close()


def test_seeded_determinism():
    def rollout(seed):
        env = make_env("atari:SpaceInvaders", seed=seed)
        frames = [env.reset()[0]]
        rng = np.random.default_rng(0)
        for _ in range(30):
            frames.append(env.step(int(rng.integers(6)))[0])
        env.close()
        return np.stack(frames)

    a, b = rollout(5), rollout(5)
    assert np.array_equal(a, b)


def test_noop_reset_and_no_fire_for_games_without_fire():
    noops = []
    for seed in range(6):
        env = make_env("atari:MsPacman", seed=seed)
        assert _find(env, FireReset) is None
        _, info = env.reset()
        assert 1 <= info["noops"] <= atari.NOOP_MAX
        assert info["episode_frame_number"] == info["noops"]  # one frame per no-op
        noops.append(info["noops"])
        env.close()
    assert len(set(noops)) > 1  # the number of no-ops is random


def test_fire_reset_presses_fire_then_action_2():
    env = make_env("atari:Breakout", seed=1)
    fire = _find(env, FireReset)
    assert fire is not None and fire.fire_action == 1
    _, info = env.reset()
    # noops (1 frame each) + FIRE and action 2 (4 frames each)
    assert info["episode_frame_number"] == info["noops"] + 2 * atari.FRAME_SKIP
    env.close()


def test_life_loss_ends_training_episode_but_not_game():
    env = make_env("atari:Breakout", seed=2)
    assert _find(env, EpisodicLife) is not None
    rng = np.random.default_rng(0)
    env.reset()
    ends = []
    while True:
        _, _, term, trunc, info = env.step(int(rng.integers(4)))
        if term or trunc:
            assert term and not trunc  # a life loss is a termination, not a truncation
            ends.append((info["lives"], info["game_over"], info["episode_frame_number"]))
            if info["game_over"]:
                break
            _, reset_info = env.reset()
            # the game continues: same lives, frame counter not restarted
            assert reset_info["lives"] == info["lives"]
            assert reset_info["episode_frame_number"] > info["episode_frame_number"]
    assert [lives for lives, _, _ in ends] == [4, 3, 2, 1, 0]
    assert [over for _, over, _ in ends] == [False] * 4 + [True]
    frames = [f for _, _, f in ends]
    assert frames == sorted(frames)
    env.close()


def test_frame_cap_is_a_truncation_that_ends_the_game():
    """ALE's frame cap (108 000 in atari:, 200 here) comes through the chain as truncated, not
    terminated, with game_over True (logged as a finished game); the next reset restarts the game."""
    import gymnasium as gym

    from fwrl.envs.wrappers import AtariPreprocess

    atari._import_ale()
    env = gym.make("ALE/Breakout-v5", frameskip=1, repeat_action_probability=0.0, max_num_frames_per_episode=200)
    env = EpisodicLife(AtariPreprocess(env, noop_max=0))
    env.reset(seed=0)
    for steps in range(1, 100):  # no FIRE: the ball is never served, no life is lost
        _, _, term, trunc, info = env.step(0)
        if term or trunc:
            break
    assert trunc and not term and info["game_over"] and info["lives"] == 5
    assert info["episode_frame_number"] == 200 and steps == 50
    _, reset_info = env.reset()
    assert reset_info["episode_frame_number"] == 0  # a new game, not a continued one
    env.close()


def test_test_mode_plays_through_lives():
    env = make_env("atari:Breakout", seed=2, mode="test")
    assert _find(env, EpisodicLife) is None
    rng = np.random.default_rng(0)
    env.reset()
    lives_seen = set()
    while True:
        _, _, term, trunc, info = env.step(int(rng.integers(4)))
        lives_seen.add(info["lives"])
        if term or trunc:
            break
    assert info["game_over"] and info["lives"] == 0
    assert lives_seen == {0, 1, 2, 3, 4, 5}
    env.close()


def test_sticky_and_full_action_space_reach_ale():
    env = make_env("atari:Pong", seed=0)
    assert env.unwrapped.ale.getFloat("repeat_action_probability") == 0.0
    env.close()
    env = make_env("atari:Pong?sticky=true&full_action_space=true", seed=0)
    assert env.unwrapped.ale.getFloat("repeat_action_probability") == pytest.approx(0.25)
    assert env.action_space.n == 18
    env.close()


def test_bad_specs_are_refused():
    with pytest.raises(FwrlError, match="Did you mean Pong"):
        make_env("atari:Pongg")
    with pytest.raises(FwrlError, match="sticky"):
        make_env("atari:Pong?sticky=maybe")
    with pytest.raises(FwrlError, match="full_action_space"):
        make_env("atari:Pong?frameskip=2")
    with pytest.raises(FwrlError, match="multi-task"):
        make_env("atari:Pong+Breakout")
    with pytest.raises(FwrlError, match="mode"):
        make_env("atari:Pong", mode="eval")


def test_missing_ale_py_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "ale_py", None)
    with pytest.raises(FwrlError, match=r"pip install -e '\.\[atari\]'"):
        atari._import_ale()


def test_no_banner_on_stderr():
    code = (
        "from fwrl.envs import make_env; e = make_env('atari:Pong'); e.reset(); e.step(0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stderr == "" and out.stdout == ""


def test_area_resize_is_block_mean_for_integer_factors():
    frame = np.random.default_rng(0).integers(0, 256, (8, 6, 3)).astype(np.uint8)
    small = resize_frame(frame, 4, 3)
    expected = np.rint(frame.reshape(4, 2, 3, 2, 3).astype(np.float64).mean(axis=(1, 3)))
    assert np.array_equal(small, expected.astype(np.uint8))
    grey = resize_frame(frame[..., 0], 4, 3)
    assert np.array_equal(grey, small[..., 0])
