"""procgen:<game> family: validation before the C++ library, gym3 translation,
multi-task assignment, normalised scores."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import types

import numpy as np
import pytest

from fwrl.envs import describe_env, make_env
from fwrl.envs import procgen as pg
from fwrl.envs.registry import resolve
from fwrl.errors import FwrlError

HAS_PROCGEN = importlib.util.find_spec("procgen") is not None
needs_procgen = pytest.mark.skipif(
    not HAS_PROCGEN, reason="procgen (procgen2 wheel) is not importable: pip install 'fwrl[procgen]'"
)


@pytest.mark.parametrize(
    "spec, match",
    [
        ("procgen:bigfish?distribution=memory", "memory mode exists only for: caveflyer"),
        ("procgen:maze+bigfish?distribution=memory", "'bigfish' has no 'memory'"),
        ("procgen:maze?distribution=extreme", "extreme mode exists only for: chaser"),
        ("procgen:bigfish?distribution=exploration", "exploration mode exists only for"),
        ("procgen:maze?distribution=exploration&num_levels=200", "remove num_levels"),
        ("procgen:maze?distribution=exploration&start_level=3", "remove start_level"),
        ("procgen:coinrun?num_levels=-1", "num_levels must be >= 0"),
        ("procgen:coinrun?start_level=-5", "start_level must be >= 0"),
        ("procgen:coinrun?start_level=2147483000&num_levels=1000", "int32"),
        ("procgen:coinrun?distribution=medium", "valid choices: easy, exploration"),
        ("procgen:coinrun?levels=3", "valid choices: center_agent"),
        ("procgen:coinrun?center_agent=sometimes", "center_agent"),
        ("procgen:coinrunn", "valid choices: bigfish"),
    ],
)
def test_bad_specs_refused_before_the_library(spec, match, monkeypatch):
    monkeypatch.setitem(sys.modules, "procgen", None)  # the library must not be needed
    with pytest.raises(FwrlError, match=match):
        resolve(spec)


def test_mode_table_accepts_exactly_the_supported_games(monkeypatch):
    monkeypatch.setitem(sys.modules, "procgen", None)
    for mode in pg.DISTRIBUTIONS:
        accepted = []
        for game in pg.GAMES:
            try:
                resolve(f"procgen:{game}?distribution={mode}")
                accepted.append(game)
            except FwrlError:
                pass
        assert tuple(accepted) == pg.MODE_GAMES.get(mode, pg.GAMES), mode


def test_describe_needs_no_library(monkeypatch):
    monkeypatch.setitem(sys.modules, "procgen", None)
    info = describe_env("procgen:bigfish+fruitbot?distribution=easy&num_levels=200")
    assert info.obs_shape == (3, 64, 64) and info.obs_dtype == "uint8"
    assert info.num_actions == 15 and info.task_names == ("bigfish", "fruitbot")
    with pytest.raises(FwrlError, match=r"pip install -e '\.\[procgen\]'"):
        make_env("procgen:bigfish")


def test_normalised_scores_hand_computed():
    # bigfish easy (1, 40): (20.5 - 1) / 39 = 0.5
    assert pg.normalised_score("bigfish", "easy", 20.5) == pytest.approx(0.5)
    # fruitbot easy (-1.5, 32.4): (15.45 + 1.5) / 33.9 = 0.5
    assert pg.normalised_score("fruitbot", "easy", 15.45) == pytest.approx(0.5)
    # fruitbot hard (-0.5, 27.2): (-0.5 + 0.5) / 27.7 = 0
    assert pg.normalised_score("fruitbot", "hard", -0.5) == pytest.approx(0.0)
    # starpilot hard (1.5, 35): 35 -> 1; easy (2.5, 64): 33.25 -> 0.5
    assert pg.normalised_score("starpilot", "hard", 35) == pytest.approx(1.0)
    assert pg.normalised_score("starpilot", "easy", 33.25) == pytest.approx(0.5)
    # memory mode uses the hard constants: caveflyer hard (2, 13.4): 7.7 -> 0.5
    assert pg.normalised_score("caveflyer", "memory", 7.7) == pytest.approx(0.5)
    # miner: hard max 20 (easy max 13): 20 -> 1 in memory mode
    assert pg.normalised_score("miner", "memory", 20) == pytest.approx(1.0)
    assert pg.normalised_score("miner", "easy", 13) == pytest.approx(1.0)
    # maze easy (5, 10): 0 -> -1 (below random is negative)
    assert pg.normalised_score("maze", "easy", 0) == pytest.approx(-1.0)
    assert set(pg.NORMALISATION) == set(pg.GAMES)
    with pytest.raises(FwrlError, match="no normalisation constants"):
        pg.normalised_score("chaser", "extreme", 3.0)
    with pytest.raises(FwrlError, match="unknown procgen game"):
        pg.normalised_score("pong", "easy", 3.0)


# --- gym3 -> gymnasium translation, against a scripted stand-in gym3 env ------------------


class _FakeGym3:
    """Scripted gym3 env: episodes of 3 steps; reward 1 per step, +10 on the last."""

    created: list[dict] = []

    def __init__(self, **kwargs):
        _FakeGym3.created.append(kwargs)
        self.t = 0
        self.episode = 0
        self.acts: list[int] = []
        self._first = True
        self._reward = 0.0

    def _ob(self):
        rgb = np.zeros((1, 64, 64, 3), np.uint8)
        rgb[0, :, :, 0] = self.episode  # red channel: episode index
        rgb[0, :, :, 1] = self.t  # green channel: step within the episode
        rgb[0, 0, 1, 2] = 255  # blue marker at row 0, column 1
        return {"rgb": rgb}

    def observe(self):
        return np.array([self._reward], np.float32), self._ob(), np.array([self._first])

    def act(self, ac):
        self.acts.append(int(ac[0]))
        self.t += 1
        self._reward = 1.0
        self._first = False
        if self.t == 3:
            self._reward = 11.0
            self.t, self.episode, self._first = 0, self.episode + 1, True

    def get_info(self):
        return [{"level_seed": np.int32(self.episode), "prev_level_complete": np.uint8(1)}]


@pytest.fixture
def fake_procgen(monkeypatch):
    _FakeGym3.created = []
    module = types.SimpleNamespace(ProcgenGym3Env=_FakeGym3)
    monkeypatch.setattr(pg, "_import_procgen", lambda: module)
    return module


def test_gym3_translation(fake_procgen):
    env = make_env("procgen:coinrun?num_levels=7&start_level=3", seed=12)
    assert not _FakeGym3.created  # created lazily at the first reset
    obs, info = env.reset()
    kwargs = _FakeGym3.created[0]
    assert kwargs["rand_seed"] == 12 and kwargs["num_levels"] == 7 and kwargs["start_level"] == 3
    assert kwargs["env_name"] == "coinrun" and kwargs["distribution_mode"] == "easy"
    assert kwargs["num"] == 1
    assert obs.shape == (3, 64, 64) and obs.dtype == np.uint8 and obs.flags.c_contiguous
    assert obs[2, 0, 1] == 255 and obs[2, 1, 0] == 0  # HWC -> CHW, not transposed H/W
    rewards, ends = [], []
    for _ in range(2):
        for a in (5, 6, 7):
            obs, r, term, trunc, info = env.step(a)
            rewards.append(r)
            ends.append(term)
            assert not trunc
        assert info["game_over"] and info["level_complete"] and info["task"] == 0
        # the step's frame is the new episode's first; reset returns it without acting
        n_acts = len(env._gym3.acts)
        reset_obs, _ = env.reset()
        assert np.array_equal(reset_obs, obs) and len(env._gym3.acts) == n_acts
        assert reset_obs[1].max() == 0  # step 0 of the new episode
    assert rewards == [1.0, 1.0, 11.0] * 2  # the ending step's reward is kept
    assert ends == [False, False, True] * 2
    assert env._gym3.acts == [5, 6, 7] * 2
    with pytest.raises(RuntimeError, match="mid-episode"):
        env.step(0)
        env.reset()


def test_exploration_mode_passes_no_level_options(fake_procgen):
    env = make_env("procgen:maze?distribution=exploration", seed=1)
    env.reset()
    kwargs = _FakeGym3.created[-1]
    assert kwargs["distribution_mode"] == "exploration"
    assert "num_levels" not in kwargs and "start_level" not in kwargs


def test_multi_task_assignment(fake_procgen):
    spec = "procgen:bigfish+fruitbot+maze"
    for worker, (game, task) in enumerate(
        [("bigfish", 0), ("fruitbot", 1), ("maze", 2), ("bigfish", 0), ("fruitbot", 1)]
    ):
        env = make_env(spec, worker_index=worker, seed=worker)
        _, info = env.reset()
        assert _FakeGym3.created[-1]["env_name"] == game
        assert info["task"] == task
        assert env.step(0)[4]["task"] == task


# --- the real library -------------------------------------------------------------------


@needs_procgen
def test_real_env_shapes_and_seeded_determinism():
    def rollout(seed):
        env = make_env("procgen:bigfish?num_levels=10", seed=seed)
        frames, seeds = [env.reset()[0]], []
        for i in range(120):
            obs, r, term, trunc, info = env.step(i % 15)
            frames.append(obs)
            if term:
                seeds.append(info["level_seed"])
                env.reset()
        return np.stack(frames), seeds

    a, _ = rollout(4)
    b, _ = rollout(4)
    c, _ = rollout(5)
    assert a.shape[1:] == (3, 64, 64) and a.dtype == np.uint8
    assert np.array_equal(a, b) and not np.array_equal(a, c)


@needs_procgen
def test_every_accepted_special_mode_runs_in_the_library():
    """Each game our table accepts for extreme/memory/exploration starts and steps
    (in a subprocess: a wrong table would abort the process)."""
    code = (
        "from fwrl.envs import make_env\n"
        "from fwrl.envs.procgen import MODE_GAMES\n"
        "for mode, games in MODE_GAMES.items():\n"
        "    for g in games:\n"
        "        e = make_env(f'procgen:{g}?distribution={mode}', seed=0); e.reset(); e.step(4)\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
    assert out.stderr == ""  # legacy gym's notice is kept out of the terminal
