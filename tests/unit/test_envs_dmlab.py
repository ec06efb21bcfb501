"""dmlab:<level> family: the adapter against a stand-in Lab, and the real engine where built."""

from __future__ import annotations

import importlib.util
import sys
import types

import numpy as np
import pytest

from fwrl.envs import describe_env, make_env
from fwrl.envs import dmlab
from fwrl.errors import FwrlError


class _FakeLab:
    """Stand-in for ``deepmind_lab.Lab``: episodes of 3 agent steps.

    Frames encode (episode seed mod 256, steps taken) in the red/green
    channels; ``step`` returns ``num_steps`` times the move component
    (+1 forward, -1 backward), so the summed reward of the action repeat shows.
    """

    instances: list["_FakeLab"] = []

    def __init__(self, level, observations, config=None, renderer="software"):
        self.level, self.observation_names, self.config, self.renderer = (
            level, observations, config, renderer,
        )  # fmt: skip
        self.actions: list[np.ndarray] = []
        self.num_steps: list[int] = []
        self.seeds: list[int] = []
        self.t = 0
        self.running = False
        self.closed = False
        _FakeLab.instances.append(self)

    def reset(self, seed=None):
        self.seeds.append(seed)
        self.t = 0
        self.running = True

    def observations(self):
        if not self.running:
            raise RuntimeError("Environment in wrong status for call to observations()")
        rgb = np.zeros((dmlab.HEIGHT, dmlab.WIDTH, 3), np.uint8)
        rgb[..., 0] = self.seeds[-1] % 256
        rgb[..., 1] = self.t
        rgb[0, 1, 2] = 255  # marker at row 0, column 1
        return {"RGB_INTERLEAVED": rgb}

    def step(self, action, num_steps=1):
        assert action.dtype == np.intc and action.shape == (7,)
        self.actions.append(action.copy())
        self.num_steps.append(num_steps)
        self.t += 1
        if self.t == 3:
            self.running = False
        return float(action[3] * num_steps)

    def is_running(self):
        return self.running

    def close(self):
        self.closed = True


@pytest.fixture
def fake_lab(monkeypatch):
    _FakeLab.instances = []
    monkeypatch.setattr(dmlab, "_import_lab", lambda: types.SimpleNamespace(Lab=_FakeLab))
    return _FakeLab


def test_lab_construction_and_config(fake_lab):
    env = make_env("dmlab:rooms_watermaze?dataset_path=/data/brady", seed=0)
    lab = fake_lab.instances[-1]
    assert lab.level == "contributed/dmlab30/rooms_watermaze"
    assert lab.observation_names == ["RGB_INTERLEAVED"] and lab.renderer == "software"
    assert lab.config == {
        "width": "96", "height": "72", "logLevel": "WARN", "datasetPath": "/data/brady",
    }  # fmt: skip
    assert all(isinstance(v, str) for v in lab.config.values())
    assert env.observation_space.shape == (3, 72, 96) and env.action_space.n == 9
    make_env("dmlab:rooms_watermaze", seed=0, mode="test")
    test_cfg = fake_lab.instances[-1].config
    assert test_cfg["allowHoldOutLevels"] == "true" and test_cfg["mixerSeed"] == "1611489005"
    assert "datasetPath" not in test_cfg
    make_env("dmlab:contributed/dmlab30/rooms_keys_doors_puzzle", seed=0)
    assert fake_lab.instances[-1].level == "contributed/dmlab30/rooms_keys_doors_puzzle"


def test_action_mapping(fake_lab):
    env = make_env("dmlab:rooms_watermaze", seed=0)
    lab = fake_lab.instances[-1]
    expected = {
        0: (0, 0, 0, 1, 0, 0, 0), 1: (0, 0, 0, -1, 0, 0, 0), 2: (0, 0, -1, 0, 0, 0, 0),
        3: (0, 0, 1, 0, 0, 0, 0), 4: (-20, 0, 0, 0, 0, 0, 0), 5: (20, 0, 0, 0, 0, 0, 0),
        6: (-20, 0, 0, 1, 0, 0, 0), 7: (20, 0, 0, 1, 0, 0, 0), 8: (0, 0, 0, 0, 1, 0, 0),
    }  # fmt: skip
    for a, vec in expected.items():
        env.reset()
        env.step(a)
        assert tuple(lab.actions[-1]) == vec
    assert set(lab.num_steps) == {4}  # action repeat 4 inside Lab


def test_frames_rewards_and_episode_end(fake_lab):
    env = make_env("dmlab:rooms_watermaze", seed=3)
    lab = fake_lab.instances[-1]
    obs, info = env.reset()
    assert obs.shape == (3, 72, 96) and obs.dtype == np.uint8 and obs.flags.c_contiguous
    assert obs[2, 0, 1] == 255 and obs[2, 1, 0] == 0  # HWC -> CHW, H and W not swapped
    assert obs[0, 5, 5] == info["episode_seed"] % 256 and obs[1].max() == 0
    rewards, ends = [], []
    for a in (0, 1, 0):  # forward, backward, forward
        obs, r, term, trunc, info = env.step(a)
        rewards.append(r)
        ends.append(term)
        assert not trunc
    assert rewards == [4.0, -4.0, 4.0]  # summed over the 4 repeated frames
    assert ends == [False, False, True] and info["game_over"]
    assert obs[1, 0, 0] == 2  # the last frame Lab showed, repeated at the end
    with pytest.raises(RuntimeError, match="before reset"):
        env.step(0)
    env.reset()
    assert len(set(lab.seeds)) == 2  # a new episode seed per episode
    env.close()
    assert lab.closed


def test_episode_seeds_follow_the_make_seed(fake_lab):
    def seeds(seed):
        env = make_env("dmlab:rooms_watermaze", seed=seed)
        return [env.reset()[1]["episode_seed"] for _ in range(3)]

    assert seeds(1) == seeds(1) and seeds(1) != seeds(2)


def test_multi_task_assignment(fake_lab):
    for worker, level in enumerate(["rooms_watermaze", "rooms_keys_doors_puzzle"] * 2):
        make_env("dmlab:rooms_watermaze+rooms_keys_doors_puzzle", worker_index=worker, seed=0)
        assert fake_lab.instances[-1].level.endswith(level)


def test_validation_and_missing_module(monkeypatch):
    monkeypatch.setitem(sys.modules, "deepmind_lab", None)
    info = describe_env("dmlab:rooms_watermaze")
    assert info.obs_shape == (3, 72, 96) and info.num_actions == 9 and info.obs_dtype == "uint8"
    with pytest.raises(FwrlError, match="docker/Dockerfile.dmlab"):
        make_env("dmlab:rooms_watermaze")
    with pytest.raises(FwrlError, match="rooms_watermaze"):
        make_env("dmlab:rooms_watermazee")
    with pytest.raises(FwrlError, match="renderer"):
        make_env("dmlab:rooms_watermaze?renderer=gpu")
    with pytest.raises(FwrlError, match="action_repeat"):
        make_env("dmlab:rooms_watermaze?action_repeat=0")


def test_human_normalised_score():
    # watermaze: human 54, random 4.065 -> (29.0325 - 4.065) / 49.935 = 0.5
    assert dmlab.human_normalised_score("rooms_watermaze", 29.0325) == pytest.approx(0.5)
    assert dmlab.human_normalised_score("rooms_keys_doors_puzzle", 53.8) == pytest.approx(1.0)
    with pytest.raises(FwrlError):
        dmlab.human_normalised_score("lasertag_one_opponent_small", 1.0)


@pytest.mark.skipif(
    importlib.util.find_spec("deepmind_lab") is None,
    reason="deepmind_lab is not importable (build it with docker/Dockerfile.dmlab)",
)
def test_real_engine_episode():
    env = make_env("dmlab:rooms_watermaze?dataset_path=dummy", seed=0)
    obs, _ = env.reset()
    assert obs.shape == (3, 72, 96) and obs.dtype == np.uint8
    total = 0.0
    for t in range(50):
        obs, r, term, trunc, _ = env.step(t % 9)
        total += r
        assert obs.shape == (3, 72, 96)
        if term:
            break
    env.close()
