"""gym:<id> family: image and vector adapters, refused spaces, unknown ids."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from fwrl.envs import describe_env, make_env
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


class _DictObsEnv(_ImageEnv):
    def __init__(self):
        super().__init__()
        self.observation_space = gym.spaces.Dict({"a": gym.spaces.Discrete(2)})


for _name, _entry in {
    "FwrlTest/Image-v0": _ImageEnv,
    "FwrlTest/Grey-v0": lambda: _ImageEnv(channels=0),
    "FwrlTest/BadAction-v0": _BadActionEnv,
    "FwrlTest/DictObs-v0": _DictObsEnv,
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
    with pytest.raises(FwrlError, match=r"Box.*Discrete\(n\)"):
        make_env("gym:FwrlTest/BadAction-v0")
    with pytest.raises(FwrlError, match=r"Dict.*supported: uint8 image Box"):
        make_env("gym:FwrlTest/DictObs-v0")
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
