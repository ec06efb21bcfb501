"""gym:<module>:<id> envs of a third-party package, user wrappers and truncation, through worker
pools of both backends (``backend`` fixture: local processes and Ray actors).

The package is written by the tests into a temporary folder that each test puts on ``sys.path``
and ``PYTHONPATH`` (fixture ``on_path``, listed after ``backend``, so the session's Ray cluster
was started without it: Ray actors find it only through the learner's PYTHONPATH, which the ray
backend forwards; local workers inherit both). Nothing imports it before ``gym:`` names it.
"""

from __future__ import annotations

import os
import sys
import textwrap
import time

import numpy as np
import pytest

from fwrl.envs.worker_pool import COLUMN_NAMES
from fwrl.envs import describe_env, make_env
from fwrl.envs.env_group import worker_seed
from fwrl.errors import FwrlError

PKG = "fwrl_pkgtest_envs"
DICT = f"gym:{PKG}:FwrlPkg/Dict-v0"
LIMIT = f"gym:{PKG}:FwrlPkg/DictLimit-v0"
MULTI = f"gym:{PKG}:FwrlPkg/DictMulti-v0"
SCALE = f"{PKG}.wrappers:scale_reward"

PACKAGE = {
    "__init__.py": '''
        """A third-party package: registers its envs when imported (as gymnasium plugins do)."""
        import gymnasium as gym
        import numpy as np


        class DictEnv(gym.Env):
            """At step t (0 after reset): pixels all t (uint8 HWC 4x3x3), pos = [t, -t] / 10,
            mode = t % 3. Reward 1 + action (MultiDiscrete: 1 + 10 a0 + a1). Terminates at t = end."""

            def __init__(self, end=6, multi=False):
                self.observation_space = gym.spaces.Dict({
                    "pixels": gym.spaces.Box(0, 255, (4, 3, 3), np.uint8),
                    "pos": gym.spaces.Box(-10.0, 10.0, (2,), np.float32),
                    "mode": gym.spaces.Discrete(3),
                })
                self.action_space = gym.spaces.MultiDiscrete([3, 2]) if multi else gym.spaces.Discrete(2)
                self.end = end
                self.t = 0

            def _obs(self):
                return {"pixels": np.full((4, 3, 3), self.t, np.uint8),
                        "pos": np.array([self.t, -self.t], np.float32) / 10, "mode": self.t % 3}

            def reset(self, *, seed=None, options=None):
                super().reset(seed=seed)
                self.t = 0
                return self._obs(), {}

            def step(self, action):
                self.t += 1
                a = np.asarray(action)
                reward = 1.0 + (10 * a[0] + a[1] if a.ndim else a)
                return self._obs(), float(reward), self.t >= self.end, False, {}


        class MissionEnv(DictEnv):
            """DictEnv with a Text entry (a mission string) fwrl cannot encode."""

            def __init__(self):
                super().__init__()
                spaces = dict(self.observation_space.spaces, mission=gym.spaces.Text(32))
                self.observation_space = gym.spaces.Dict(spaces)

            def _obs(self):
                return {**super()._obs(), "mission": "reach the end"}


        class TextOnlyEnv(MissionEnv):
            """Nothing but a Text observation: no value fwrl can use."""

            def __init__(self):
                super().__init__()
                self.observation_space = gym.spaces.Text(32)

            def _obs(self):
                return "reach the end"


        gym.register("FwrlPkg/Mission-v0", entry_point=MissionEnv)
        gym.register("FwrlPkg/TextOnly-v0", entry_point=TextOnlyEnv)
        gym.register("FwrlPkg/Dict-v0", entry_point=DictEnv)
        gym.register("FwrlPkg/DictLimit-v0", entry_point=DictEnv, max_episode_steps=3)
        gym.register("FwrlPkg/DictMulti-v0", entry_point=DictEnv, kwargs={"multi": True})
    ''',
    "wrappers.py": '''
        import gymnasium as gym


        def scale_reward(env):
            """A user wrapper: rewards times 10."""
            return gym.wrappers.TransformReward(env, lambda r: 10.0 * r)


        NOT_A_WRAPPER = 42
    ''',
}
BROKEN = "fwrl_pkgtest_broken"
PLUGIN = "fwrl_plugtest"
PLUGIN_MODULE = '''
    """Registers FwrlPlug/Count-v0 only when its entry point's register_envs is called."""
    import gymnasium as gym
    import numpy as np


    class CountEnv(gym.Env):
        observation_space = gym.spaces.Box(0.0, 10.0, (1,), np.float32)
        action_space = gym.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.t = 0
            return np.zeros(1, np.float32), {}

        def step(self, action):
            self.t += 1
            return np.full(1, self.t, np.float32), float(action), self.t >= 3, False, {}


    def register_envs():
        gym.register("FwrlPlug/Count-v0", entry_point=CountEnv)
'''


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    """Write the package into a fresh folder; forget its import afterwards."""
    root = tmp_path_factory.mktemp("site")
    (root / PKG).mkdir()
    for name, text in PACKAGE.items():
        (root / PKG / name).write_text(textwrap.dedent(text))
    (root / f"{BROKEN}.py").write_text("raise RuntimeError('this package is broken')\n")
    # a plugin package as MinAtar ships one: its ids are registered by a gymnasium.envs entry point
    (root / f"{PLUGIN}.py").write_text(textwrap.dedent(PLUGIN_MODULE))
    info = root / f"{PLUGIN}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PLUGIN}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[gymnasium.envs]\nFwrlPlug = {PLUGIN}:register_envs\n")
    assert PKG not in sys.modules
    yield root
    for name in [m for m in sys.modules if m.startswith(PKG)]:
        del sys.modules[name]


@pytest.fixture
def on_path(package, monkeypatch):
    """The package's folder on sys.path and PYTHONPATH (for the worker processes) during one test."""
    monkeypatch.syspath_prepend(str(package))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(package), os.environ.get("PYTHONPATH")) if p))
    return package


def _run(pool, actions, steps: int) -> list[dict]:
    """Start ``pool`` (one worker), reset, then ``steps`` steps with ``actions(i)``; copies of the results."""
    out = []
    pool.start()
    try:
        deadline = time.monotonic() + 120
        while len(out) < steps + 1:
            assert time.monotonic() < deadline, f"only {len(out)} results; errors: {pool.errors}"
            for r in pool.wait(1.0):
                assert not pool.errors, pool.errors
                columns = {name: getattr(r, name) for name in COLUMN_NAMES}  # None: a column the env has not
                out.append({"worker": r.worker, "life": r.life, "episodes": r.episodes, "restarted": r.restarted,
                            **{name: None if value is None else np.array(value) for name, value in columns.items()}})
                if len(out) <= steps:
                    pool.act(r.worker, actions(len(out) - 1))
    finally:
        pool.close()
    return out


def _expected_extra(t: int) -> np.ndarray:
    """obs_extra of the package's env at step t: keys in sorted order, mode one-hot then pos."""
    return np.concatenate([np.eye(3)[t % 3], np.array([t, -t], np.float32) / 10]).astype(np.float32)


# ----------------------------------------------------------------------------- learner process


def test_describe_imports_the_module_and_lays_out_the_dict(on_path):
    assert PKG not in sys.modules
    info = describe_env(DICT)
    assert PKG in sys.modules  # fwrl imported it, as gymnasium.make("module:id") would
    assert info.obs_shape == (3, 4, 3) and info.obs_dtype == "uint8"
    assert info.extra_size == 5 and info.action_dims == (2,) and info.num_actions == 2
    entries = info.obs_layout["obs_extra"]["entries"]
    assert [(e["key"], e["kind"], e["offset"], e["size"]) for e in entries] == [
        ("mode", "discrete", 0, 3), ("pos", "box", 3, 2)]
    assert describe_env(MULTI).action_dims == (3, 2)


def test_unknown_id_names_the_module_and_look_alikes(on_path):
    with pytest.raises(FwrlError, match=rf"unknown gym env id 'FwrlPkg/Dcit-v0': module '{PKG}' was imported.*"
                                        r"look alike: FwrlPkg/Dict-v0"):
        describe_env(f"gym:{PKG}:FwrlPkg/Dcit-v0")
    with pytest.raises(FwrlError, match=r"cannot import module 'fwrl_no_such_pkg_z'.*PYTHONPATH"):
        describe_env("gym:fwrl_no_such_pkg_z:Foo-v0")
    with pytest.raises(FwrlError, match=rf"importing module '{BROKEN}'.*failed: RuntimeError: this package is broken"):
        describe_env(f"gym:{BROKEN}:Foo-v0")
    # without the module, the message says how to name it
    with pytest.raises(FwrlError, match=r"gym:<module>:FwrlPkg/Nope-v0"):
        describe_env("gym:FwrlPkg/Nope-v0")


def test_bad_wrappers_are_refused_before_workers_start(backend, on_path):
    for wrapper, match in [
        (f"{PKG}.wrappers:NOT_A_WRAPPER", "is not callable"),
        (f"{PKG}.wrappers:scale", "has no attribute 'scale'; its callables: scale_reward"),
        ("fwrl_no_such_pkg_z:w", "cannot import module 'fwrl_no_such_pkg_z'"),
        (f"{PKG}.wrappers", "malformed"),
    ]:
        with pytest.raises(FwrlError, match=match):
            backend.pool(DICT, 1, 1, env_wrappers=[wrapper])  # raises in the constructor: nothing started


# ----------------------------------------------------------------------------- worker pools


def test_dict_env_wrapper_and_termination_in_workers(backend, on_path):
    steps = 7
    res = _run(backend.pool(DICT, 1, 2, env_wrappers=[SCALE]), lambda i: np.array([i % 2, 1]), steps)
    for i, r in enumerate(res):
        t = i % 6  # terminated at t = 6 -> back to 0
        assert r["obs"].shape == (2, 3, 4, 3) and r["obs"].dtype == np.uint8
        assert (r["obs"] == t).all()
        assert r["obs_extra"].shape == (2, 5) and r["obs_extra"].dtype == np.float32
        assert np.allclose(r["obs_extra"], _expected_extra(t)[None])
        assert not r["truncated"].any() and (r["final_obs"] == 0).all() and (r["final_obs_extra"] == 0).all()
        assert r["done"].all() == (i in (0, 6))
        if i:  # the wrapper ran inside the worker: (1 + action) * 10
            assert r["reward"].tolist() == [10.0 * (1 + (i - 1) % 2), 20.0]
    assert [e.episode_return for e in res[6]["episodes"]] == [10.0 * 9, 20.0 * 6]


def test_truncation_reports_the_final_observation(backend, on_path):
    res = _run(backend.pool(LIMIT, 1, 2), lambda i: np.zeros(2, np.int64), 7)
    for i, r in enumerate(res[1:], start=1):
        cut = i % 3 == 0
        assert r["done"].all() == cut and r["truncated"].all() == cut and r["truncated"].any() == cut
        t = i % 3
        assert (r["obs"] == t).all() and np.allclose(r["obs_extra"], _expected_extra(t)[None])
        if cut:  # the observation gymnasium returned at the cut (t = 3), before the reset
            assert (r["final_obs"] == 3).all()
            assert np.allclose(r["final_obs_extra"], _expected_extra(3)[None])
            assert [e.episode_step for e in r["episodes"]] == [3, 3]
        else:
            assert (r["final_obs"] == 0).all() and (r["final_obs_extra"] == 0).all()


def test_multi_discrete_actions_reach_the_env(backend, on_path):
    pool = backend.pool(MULTI, 1, 2)
    assert pool.info.action_dims == (3, 2) and pool.info.action_shape == (2,)
    with pytest.raises(ValueError, match=r"expected \(2, 2\)"):
        pool.act(0, np.zeros(2, np.int64))
    acts = [np.array([[2, 1], [0, 0]]), np.array([[1, 0], [2, 1]])]
    res = _run(pool, lambda i: acts[i], 2)
    assert res[1]["reward"].tolist() == [22.0, 1.0] and res[2]["reward"].tolist() == [11.0, 22.0]


def test_time_limit_final_obs_matches_gymnasium(backend, on_path):
    """CartPole cut by max_episode_steps: final_obs is what gymnasium's step returned at the cut,
    and obs the first frame of the next episode (both from the worker's own seeded env)."""
    spec, limit, seed = "gym:CartPole-v1?max_episode_steps=4", 4, 3
    res = _run(backend.pool(spec, 1, 2, seed=seed), lambda i: np.full(2, i % 2), limit + 1)
    for j in range(2):
        env = make_env(spec, seed=worker_seed(seed, 0, 0, j))
        frames = [env.reset()[0]]
        for i in range(limit):
            obs, _, terminated, truncated, _ = env.step(i % 2)
            frames.append(obs)
        assert truncated and not terminated
        for i in range(limit):
            assert np.array_equal(res[i]["obs"][j], frames[i]) and not res[i]["truncated"][j]
        cut = res[limit]
        assert cut["done"][j] and cut["truncated"][j]
        assert np.array_equal(cut["final_obs"][j], frames[limit])
        assert np.array_equal(cut["obs"][j], env.reset()[0])  # the next episode's first frame
        assert cut["obs_extra"] is None and cut["final_obs_extra"] is None
        assert not res[limit + 1]["truncated"][j] and (res[limit + 1]["final_obs"][j] == 0).all()


# ----------------------------------------------------------------------------- training and evaluation

def test_train_and_evaluate_a_dict_env_of_a_package(backend, on_path, tmp_path):
    """``fwrl train --env gym:<module>:<id>`` on the package's Dict-observation env with a
    MultiDiscrete action space and a time limit (image to the stem, the rest beside it, one head per
    action dimension), then ``fwrl evaluate`` of its checkpoint, as a user runs them (through fwrl's
    main in this process, run_cli: the ray backend's actors on the session's cluster, this process its
    driver, still find the package only through the PYTHONPATH the backend forwards)."""
    import json

    from cli_runs import run_cli

    spec = f"gym:{PKG}:FwrlPkg/DictMulti-v0?max_episode_steps=4"
    ray = ["--backend", "ray", "--ray-address", backend.ray_address] if backend.name == "ray" else []
    code, out, err = run_cli(
        ["train", "--env", spec, "--core", "lstm", "--core-opt", "hidden_size=16", "--num-workers", "2",
         "--envs-per-worker", "2", "--batch-size", "2", "--unroll-length", "5", "--total-steps", "300",
         "--device", "cpu", "--num-threads", "1", "--runs-dir", tmp_path, "--name", "dict", *ray])
    assert code == 0, out[-2000:] + err[-3000:]
    assert "stopped by budget" in out
    payload = torch_load(tmp_path / "dict" / "checkpoint.pt")
    assert payload["env_info"]["extra_size"] == 5 and payload["env_info"]["action_dims"] == [3, 2]
    code, out, err = run_cli(["evaluate", tmp_path / "dict", "--episodes", "4", "--num-workers", "2", *ray])
    assert code == 0, out[-2000:] + err[-3000:]
    result = json.loads((tmp_path / "dict" / "evaluation.json").read_text())
    (run,) = result["runs"]
    # every episode is cut after 4 steps; rewards are 1 + 10 a0 + a1 per step, so 4 <= return <= 88
    assert run["episodes"] == 4 and all(length == 4 for length in run["lengths"])
    assert all(4 <= ret <= 88 for ret in run["returns"])


def torch_load(path):
    import torch

    return torch.load(path, weights_only=True)


# ----------------------------------------------------------------------------- entry points, text entries

def test_an_entry_point_package_loads_as_namespace_id(backend, on_path):
    """gymnasium 1.x no longer calls ``gymnasium.envs`` entry points: fwrl calls the one named after
    the id's namespace, in the learner and in every worker (nothing imported the module before)."""
    import gymnasium as gym

    from fwrl.envs import gym_env

    gym.registry.pop("FwrlPlug/Count-v0", None)  # as if never loaded here (the other backend's run did)
    gym_env._LOADED_PLUGINS.discard("FwrlPlug")
    sys.modules.pop(PLUGIN, None)
    info = describe_env("gym:FwrlPlug/Count-v0")
    assert info.obs_shape == (1,) and info.num_actions == 2
    out = _run(backend.pool("gym:FwrlPlug/Count-v0", 1, 1, seed=0), lambda i: np.array([1]), 4)
    assert [float(r["obs"][0, 0]) for r in out] == [0.0, 1.0, 2.0, 0.0, 1.0]  # 3-step episodes, then a reset
    with pytest.raises(FwrlError, match="unknown gym env id 'FwrlPlug/Nope-v0'"):
        describe_env("gym:FwrlPlug/Nope-v0")


def test_dict_with_a_text_entry_trains_without_it(on_path, tmp_path):
    """The Text entry is left out with one warning naming it; the image and the rest are used."""
    import subprocess

    env = {**os.environ, "PYTHONWARNINGS": "ignore::DeprecationWarning"}
    train = subprocess.run(
        [sys.executable, "-m", "fwrl.launch.cli", "train", "--env", f"gym:{PKG}:FwrlPkg/Mission-v0",
         "--core", "lstm", "--core-opt", "hidden_size=8", "--num-workers", "1", "--envs-per-worker", "2",
         "--batch-size", "2", "--unroll-length", "5", "--total-steps", "100", "--device", "cpu",
         "--num-threads", "1", "--runs-dir", str(tmp_path), "--name", "mission"],
        capture_output=True, text=True, env=env, timeout=300)
    assert train.returncode == 0, train.stdout[-2000:] + train.stderr[-3000:]
    warned = [line for line in train.stderr.splitlines() if "mission (Text)" in line]
    assert len(warned) == 1 and warned[0].startswith("fwrl: warning:") and "--env-wrapper" in warned[0], train.stderr
    info = torch_load(tmp_path / "mission" / "checkpoint.pt")["env_info"]
    assert info["extra_size"] == 5 and info["obs_layout"]["dropped"] == ["mission (Text)"]


def test_an_unusable_observation_points_to_env_wrapper(on_path):
    with pytest.raises(FwrlError, match="Text.*--env-wrapper MODULE:CALLABLE"):
        describe_env(f"gym:{PKG}:FwrlPkg/TextOnly-v0")
