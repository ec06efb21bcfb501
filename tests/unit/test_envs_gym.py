"""gym:<id> family: the observation/action layout (images, vectors, Dict/Tuple, MultiDiscrete),
refused spaces, unknown ids, EnvInfo, user wrappers in one process (pools: test_envs_gym_packages.py)."""

from __future__ import annotations

import json
import warnings

import gymnasium as gym
import numpy as np
import pytest

from fwrl.envs import EnvInfo, describe_env, make_env
from fwrl.envs.registry import ObservationEntriesDropped
from fwrl.errors import FwrlError


class _ImageEnv(gym.Env):
    """Tiny image env: a 12x10 RGB frame whose pixel values are the step count."""

    def __init__(self, channels: int = 3):
        shape = (12, 10, channels) if channels else (12, 10)
        self.observation_space = gym.spaces.Box(0, 255, shape, np.uint8)
        self.action_space = gym.spaces.Discrete(3)
        self._t = 0

    def _obs(self):
        obs = np.zeros(self.observation_space.shape, np.uint8)
        obs[..., :] = self._t
        obs[0, 0] = 200  # a marker in the top-left corner
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = int(self.np_random.integers(10))
        return self._obs(), {}

    def step(self, action):
        self._t += 1
        return self._obs(), 1.0, self._t >= 20, False, {}


class _BadActionEnv(_ImageEnv):
    def __init__(self):
        super().__init__()
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)


class _SpaceEnv(gym.Env):
    """Observes ``space.sample()`` (seeded), records the actions it gets; never ends."""

    def __init__(self, space: gym.Space, action_space: gym.Space | None = None):
        self.observation_space = space
        self.action_space = action_space or gym.spaces.Discrete(2)
        self.last_obs = None
        self.actions = []

    def _obs(self):
        self.last_obs = self.observation_space.sample()
        return self.last_obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.observation_space.seed(seed)
        return self._obs(), {}

    def step(self, action):
        self.actions.append(action)
        return self._obs(), 0.0, False, False, {}


_IMG = gym.spaces.Box(0, 255, (6, 5, 3), np.uint8)
_FLOAT_CHW = gym.spaces.Box(0.0, 1.0, (3, 6, 5), np.float32)
_DICT = gym.spaces.Dict({"pixels": _IMG, "pos": gym.spaces.Box(-1.0, 1.0, (2, 2), np.float64),
                         "mode": gym.spaces.Discrete(3, start=1), "keys": gym.spaces.MultiDiscrete([2, 3])})

for _name, _entry in {
    "FwrlTest/Image-v0": _ImageEnv,
    "FwrlTest/Grey-v0": lambda: _ImageEnv(channels=0),
    "FwrlTest/BadAction-v0": _BadActionEnv,
    "FwrlTest/Text-v0": lambda: _SpaceEnv(gym.spaces.Dict({"a": gym.spaces.Discrete(2),
                                                           "t": gym.spaces.Text(5)})),
    "FwrlTest/Dict-v0": lambda: _SpaceEnv(_DICT),
    "FwrlTest/FloatCHW-v0": lambda: _SpaceEnv(_FLOAT_CHW),
    "FwrlTest/TwoImages-v0": lambda: _SpaceEnv(gym.spaces.Tuple((_IMG, gym.spaces.Discrete(2), _FLOAT_CHW))),
    "FwrlTest/NoImageDict-v0": lambda: _SpaceEnv(gym.spaces.Dict({"b": gym.spaces.Discrete(4),
                                                                  "a": gym.spaces.Box(0, 5, (3,), np.int64)})),
    "FwrlTest/MultiAction-v0": lambda: _SpaceEnv(gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
                                                 gym.spaces.MultiDiscrete([3, 2], start=[1, 0])),
}.items():
    if _name not in gym.registry:
        gym.register(_name, entry_point=_entry)


def test_vector_env_is_flat_float32():
    info = describe_env("gym:CartPole-v1")
    assert info.obs_shape == (4,) and info.obs_dtype == "float32" and info.num_actions == 2
    env = make_env("gym:CartPole-v1", seed=3)
    obs, _ = env.reset()
    assert obs.shape == (4,) and obs.dtype == np.float32
    obs2, r, term, trunc, _ = env.step(0)
    assert obs2.dtype == np.float32 and r == 1.0
    # seeded: a second env with the same seed starts in the same state
    again = make_env("gym:CartPole-v1", seed=3).reset()[0]
    assert np.array_equal(obs, again)


def test_discrete_observation_is_one_hot():
    env = make_env("gym:FrozenLake-v1", seed=0)
    obs, _ = env.reset()
    assert obs.shape == (16,) and obs.dtype == np.float32
    assert obs.sum() == 1.0 and obs[0] == 1.0  # FrozenLake starts in state 0


@pytest.mark.parametrize("value", [2, np.int64(2), np.int32(2), np.array(2), np.array([2])])
def test_a_discrete_entry_is_one_hot_whatever_form_its_value_takes(value):
    """The entry's fast path (a Python or numpy integer) and the general one (arrays) write the same
    row, shifted by the space's start, and clear what the row held before; a value outside the space
    is refused either way."""
    from fwrl.envs.layout import build_obs_layout

    layout = build_obs_layout(gym.spaces.Tuple((gym.spaces.Discrete(4, start=1), gym.spaces.Discrete(3))))
    out = np.full(7, 9.0, np.float32)
    layout.flat[0].write(value, out)
    layout.flat[1].write(value, out)
    assert out.tolist() == [0, 1, 0, 0, 0, 0, 1]
    for bad in (0, 5, np.int64(5)):
        with pytest.raises(ValueError, match="outside 0..3"):
            layout.flat[0].write(bad, out)


def test_image_env_is_chw_uint8():
    env = make_env("gym:FwrlTest/Image-v0", seed=1)
    assert env.observation_space.shape == (3, 12, 10)
    obs, _ = env.reset()
    assert obs.shape == (3, 12, 10) and obs.dtype == np.uint8
    assert (obs[:, 0, 0] == 200).all() and (obs[:, 5, 5] == obs[0, 5, 5]).all()
    obs2, *_ = env.step(0)
    assert obs2[0, 5, 5] == obs[0, 5, 5] + 1
    grey = make_env("gym:FwrlTest/Grey-v0", seed=1)
    assert grey.reset()[0].shape == (1, 12, 10)


def test_image_resize_option():
    env = make_env("gym:FwrlTest/Image-v0?size=6x5", seed=1)
    obs, _ = env.reset()
    assert obs.shape == (3, 6, 5) and env.observation_space.shape == (3, 6, 5)
    # a 2x2 block mean: the marker 200 averaged with three pixels of value t
    t = int(obs[0, 3, 3])
    assert obs[0, 0, 0] == round((200 + 3 * t) / 4)
    assert describe_env("gym:FwrlTest/Image-v0?size=8").obs_shape == (3, 8, 8)


def test_unsupported_spaces_are_refused():
    with pytest.raises(FwrlError, match=r"action space Box.*supported: Discrete\(n\) and MultiDiscrete"):
        make_env("gym:FwrlTest/BadAction-v0")
    # a Dict's Text entry is left out (one warning naming it, tests/e2e/test_envs_gym_packages.py); the rest is used
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ObservationEntriesDropped)
        assert describe_env("gym:FwrlTest/Text-v0").obs_layout["dropped"] == ["t (Text)"]
    with pytest.raises(FwrlError, match="only to image observations"):
        make_env("gym:CartPole-v1?size=84")
    with pytest.raises(FwrlError, match="size HxW"):
        make_env("gym:FwrlTest/Image-v0?size=big")


def test_unknown_id_lists_close_matches():
    with pytest.raises(FwrlError, match="CartPole-v1"):
        make_env("gym:CartPol-v1")
    with pytest.raises(FwrlError, match="CartPole-v1"):
        make_env("gym:cartpole-v1")
    with pytest.raises(FwrlError, match="pprint_registry"):
        make_env("gym:Zzzzzzzz")


def test_ale_ids_are_registered_on_demand():
    pytest.importorskip("ale_py", reason="ale_py is not installed")
    info = describe_env("gym:ALE/Pong-v5?size=84x84")
    assert info.obs_shape == (3, 84, 84) and info.obs_dtype == "uint8"


def test_env_families_do_not_import_torch():
    """Env worker processes import only fwrl.envs: no family module may pull in torch."""
    import subprocess
    import sys

    code = (
        "import sys, fwrl.envs.registry as r\n"
        "for fam in r.FAMILY_MODULES: r.get_family(fam)\n"
        "import fwrl.envs.wrappers\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ----------------------------------------------------------------------------- layouts


def _inner(env):
    """The _SpaceEnv under fwrl's wrappers."""
    return env.unwrapped


def test_dict_observation_image_and_extras_in_key_order():
    """Dict keys are laid out in the space's (sorted) order: keys, mode, pos; pixels is obs."""
    info = describe_env("gym:FwrlTest/Dict-v0")
    assert info.obs_shape == (3, 6, 5) and info.obs_dtype == "uint8"
    assert info.extra_size == 5 + 3 + 4  # MultiDiscrete [2, 3] one-hots, Discrete(3) one-hot, 2x2 Box
    extra = {e["key"]: e for e in info.obs_layout["obs_extra"]["entries"]}
    assert [(k, e["offset"], e["size"]) for k, e in extra.items()] == [("keys", 0, 5), ("mode", 5, 3), ("pos", 8, 4)]
    assert info.obs_layout["obs"]["entries"][0]["key"] == "pixels"
    json.dumps(info.obs_layout)  # JSON-able, for checkpoints

    env = make_env("gym:FwrlTest/Dict-v0", seed=4)
    for call in (env.reset, lambda: env.step(1), lambda: env.step(0)):
        obs = call()[0]
        raw = _inner(env).last_obs
        assert obs["obs"].dtype == np.uint8 and np.array_equal(obs["obs"], raw["pixels"].transpose(2, 0, 1))
        x = obs["obs_extra"]
        assert x.dtype == np.float32 and x.shape == (12,)
        k0, k1 = raw["keys"]
        assert np.array_equal(x[0:5], np.eye(5)[k0] + np.eye(5)[2 + k1])
        assert np.array_equal(x[5:8], np.eye(3)[raw["mode"] - 1])  # Discrete(3, start=1)
        assert np.allclose(x[8:12], raw["pos"].reshape(-1))


def test_float_chw_image_is_scaled_to_uint8():
    info = describe_env("gym:FwrlTest/FloatCHW-v0")
    assert info.obs_shape == (3, 6, 5) and info.obs_dtype == "uint8" and info.extra_size == 0
    env = make_env("gym:FwrlTest/FloatCHW-v0", seed=1)
    obs, _ = env.reset()
    assert obs.dtype == np.uint8
    assert np.array_equal(obs, np.rint(_inner(env).last_obs * 255).astype(np.uint8))
    small = make_env("gym:FwrlTest/FloatCHW-v0?size=3x5", seed=1)
    obs, _ = small.reset()
    expect = np.rint(_inner(small).last_obs * 255).reshape(3, 3, 2, 5).mean(axis=2)  # 2-row block means
    assert obs.shape == (3, 3, 5) and np.abs(obs.astype(float) - expect).max() <= 1


def test_several_images_need_image_key():
    with pytest.raises(FwrlError, match=r"several image entries \(0, 2\).*image_key"):
        describe_env("gym:FwrlTest/TwoImages-v0")
    info = describe_env("gym:FwrlTest/TwoImages-v0?image_key=2")
    assert info.obs_shape == (3, 6, 5) and info.extra_size == 6 * 5 * 3 + 2  # the other image is flattened
    env = make_env("gym:FwrlTest/TwoImages-v0?image_key=0", seed=2)
    obs, _ = env.reset()
    raw = _inner(env).last_obs
    assert np.array_equal(obs["obs"], raw[0].transpose(2, 0, 1))
    assert np.array_equal(obs["obs_extra"][:2], np.eye(2)[raw[1]])
    assert np.allclose(obs["obs_extra"][2:], raw[2].reshape(-1))
    with pytest.raises(FwrlError, match=r"image_key='3'.*entries: 0, 1, 2; image entries: 0, 2"):
        describe_env("gym:FwrlTest/TwoImages-v0?image_key=3")
    flat = describe_env("gym:FwrlTest/TwoImages-v0?image_key=none")
    assert flat.obs_shape == (90 + 2 + 90,) and flat.obs_dtype == "float32" and flat.extra_size == 0
    with pytest.raises(FwrlError, match="image_key.*only to Dict or Tuple"):
        describe_env("gym:CartPole-v1?image_key=pixels")


def test_dict_without_image_is_one_flat_vector():
    info = describe_env("gym:FwrlTest/NoImageDict-v0")
    assert info.obs_shape == (3 + 4,) and info.obs_dtype == "float32" and info.extra_size == 0
    env = make_env("gym:FwrlTest/NoImageDict-v0", seed=5)
    obs, _ = env.reset()
    raw = _inner(env).last_obs
    assert obs.dtype == np.float32
    assert np.array_equal(obs, np.concatenate([raw["a"].astype(np.float32), np.eye(4)[raw["b"]]]))
    with pytest.raises(FwrlError, match="size applies only to image"):
        describe_env("gym:FwrlTest/NoImageDict-v0?size=4")


def test_multi_discrete_actions():
    info = describe_env("gym:FwrlTest/MultiAction-v0")
    assert info.action_dims == (3, 2) and info.num_actions == 5 and info.action_shape == (2,)
    env = make_env("gym:FwrlTest/MultiAction-v0", seed=0)
    env.reset()
    env.step(np.array([2, 1]))
    env.step(np.array([0, 0]))
    assert [a.tolist() for a in _inner(env).actions] == [[3, 1], [1, 0]]  # start [1, 0] added back
    assert describe_env("gym:CartPole-v1").action_shape == ()


def test_max_episode_steps_truncates():
    env = make_env("gym:CartPole-v1?max_episode_steps=3", seed=0)
    env.reset()
    flags = [env.step(i % 2)[2:4] for i in range(3)]
    assert flags == [(False, False), (False, False), (False, True)]
    with pytest.raises(FwrlError, match="max_episode_steps=0.*positive int"):
        describe_env("gym:CartPole-v1?max_episode_steps=0")


def test_env_info_round_trip_and_old_checkpoints():
    info = describe_env("gym:FwrlTest/Dict-v0")
    raw = json.loads(json.dumps(info.to_dict()))
    assert EnvInfo.from_dict(raw) == info and EnvInfo.from_dict(raw).obs_layout == info.obs_layout
    old = {"obs_shape": [4], "obs_dtype": "float32", "num_actions": 2, "task_names": ["CartPole-v1"]}
    back = EnvInfo.from_dict(old)
    assert back.extra_size == 0 and back.action_dims == (2,) and back.obs_layout["obs"]["shape"] == [4]
    assert EnvInfo((4,), "float32", 2, ("CartPole-v1",)) == back  # positional construction still works
    with pytest.raises(ValueError, match="sum of action_dims"):
        EnvInfo((4,), "float32", 4, ("x",), action_dims=(3, 2))


# ----------------------------------------------------------------------------- user wrappers


class _Double(gym.RewardWrapper):
    def reward(self, reward):
        return 2 * reward


NOT_CALLABLE = 3


def _not_an_env(env):
    return "nope"


def test_wrappers_in_process():
    env = make_env("gym:CartPole-v1", seed=0, wrappers=[f"{__name__}:_Double", _Double])
    env.reset()
    assert env.step(0)[1] == 4.0
    for spec, match in [
        ("no_colon", "malformed; expected MODULE:CALLABLE"),
        ("fwrl_no_such_module_x:W", "cannot import module 'fwrl_no_such_module_x'"),
        (f"{__name__}:Missing", "has no attribute 'Missing'; its callables: .*make_env"),
        (f"{__name__}:NOT_CALLABLE", "is not callable \\(it is a int\\)"),
        (f"{__name__}:_not_an_env", "returned str, not a gymnasium.Env"),
    ]:
        with pytest.raises(FwrlError, match=match):
            make_env("gym:CartPole-v1", wrappers=[spec])
    # a wrapper that changes the spaces: describe_env sees the wrapped env
    info = describe_env("gym:CartPole-v1", wrappers=[lambda e: gym.wrappers.TransformObservation(
        e, lambda o: np.concatenate([o, o]), gym.spaces.Box(-np.inf, np.inf, (8,), np.float32))])
    assert info.obs_shape == (8,)
