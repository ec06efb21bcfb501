"""Env stepping in C++ threads (issue 24): ``atari:<Game>?vector=ale|envpool`` against the Python
chain (``vector=none``), the worker protocol on top of it, and ProcGen through EnvPool.

Frames: with the no-ops fixed (the libraries draw them from their own generators) the stacked
frames, rewards and the first life loss are the Python chain's, up to one grey level of the
resize. Random play: game returns and rewards per step agree within a few standard errors,
pixel statistics within 1%, life and game lengths within the few steps the documented
difference makes (the libraries do not press FIRE for the agent after a life loss, see
``fwrl.envs.atari_vector``). Every test skips, saying why, where its library is missing.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import types
from collections import defaultdict
from functools import lru_cache

import numpy as np
import pytest

pytest.importorskip("ale_py", reason="ale_py is not installed (pip install 'fwrl[atari]')")

from fwrl.envs import describe_env  # noqa: E402
from fwrl.envs.atari import VECTOR_CLASSES, vector_library_problem  # noqa: E402
from fwrl.envs.atari_vector import AtariVectorSettings  # noqa: E402
from fwrl.envs.groups import env_path, env_paths, make_group, with_env_path  # noqa: E402
from fwrl.envs.registry import resolve  # noqa: E402
from fwrl.envs.vector_group import VectorEnvGroup  # noqa: E402
from fwrl.envs.step_record import StepRecord  # noqa: E402
from fwrl.envs.worker_pool import PoolSettings  # noqa: E402
from fwrl.errors import FwrlError  # noqa: E402

LIBRARY_REASONS = {library: vector_library_problem(library) for library in ("ale", "envpool")}
LIBRARIES = [pytest.param(library, marks=pytest.mark.skipif(reason is not None, reason=str(reason)))
             for library, reason in LIBRARY_REASONS.items()]
ANY_LIBRARY = next((library for library, reason in LIBRARY_REASONS.items() if reason is None), None)
needs_a_library = pytest.mark.skipif(ANY_LIBRARY is None, reason="neither ale_py's vector env nor envpool loads: "
                                     f"{LIBRARY_REASONS}")


def _out(spec: str, k: int) -> dict[str, np.ndarray]:
    info = describe_env(spec)
    return StepRecord.of(info.obs_shape, info.obs_dtype).allocate(k)


def _fresh(stack: np.ndarray) -> bool:
    """A stack that starts an episode: its first frame, 4 times."""
    return all(np.array_equal(stack[0], stack[i]) for i in range(1, len(stack)))


# ----------------------------------------------------------------------------- the option

def test_vector_option_is_checked():
    with pytest.raises(FwrlError, match="vector 'gpu'; valid choices: ale, auto, envpool, none"):
        resolve("atari:Pong?vector=gpu")
    with pytest.raises(FwrlError, match="threads=0 .* must be >= 1"):
        resolve("atari:Pong?threads=0")
    with pytest.raises(FwrlError, match="max_frames=2 .* must be >= 4"):
        resolve("atari:Pong?max_frames=2")
    with pytest.raises(FwrlError, match="vector 'ale'; valid choices: auto, envpool, none"):
        resolve("procgen:bigfish?vector=ale")
    with pytest.raises(FwrlError, match="gym envs have a single env path .* families with one: atari, procgen"):
        with_env_path("gym:CartPole-v1", "ale")


def test_auto_takes_ale_then_envpool_then_the_python_chain(monkeypatch):
    runnable = [library for library, reason in LIBRARY_REASONS.items() if reason is None]
    assert env_path("atari:Pong") == (runnable + ["none"])[0]
    assert env_paths("atari:Pong") == (*runnable, "none")
    assert env_path("atari:Pong?vector=none") == "none"
    monkeypatch.setitem(sys.modules, "ale_py.vector_env", None)
    assert env_path("atari:Pong") == ("envpool" if "envpool" in runnable else "none")
    monkeypatch.setitem(sys.modules, "envpool", None)
    assert env_path("atari:Pong") == "none"
    assert type(make_group(PoolSettings("atari:Pong", 1, 1, 0, "train"), 0)).__name__ == "EnvGroup"


def test_a_missing_library_names_its_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "envpool", None)
    with pytest.raises(FwrlError, match=r"the Python module 'envpool', needed for .*vector=envpool.*pip install -e '\.\[envpool\]'"):
        describe_env("atari:Pong?vector=envpool")
    monkeypatch.setitem(sys.modules, "ale_py.vector_env", None)
    with pytest.raises(FwrlError, match=r"the Python module 'ale_py', needed for .*vector=ale.*pip install -e '\.\[atari\]'"):
        describe_env("atari:Pong?vector=ale")
    from fwrl.envs.local_workers import LocalWorkerPool

    with pytest.raises(FwrlError, match=r"pip install -e '\.\[envpool\]'"):  # before any worker starts
        LocalWorkerPool(PoolSettings("atari:Pong?vector=envpool", 1, 1))


@needs_a_library
def test_env_wrappers_need_the_python_chain():
    from fwrl.envs.backends import make_pool

    wrapper = "gymnasium.wrappers:RecordEpisodeStatistics"
    with pytest.raises(FwrlError, match=f"asks for vector={ANY_LIBRARY} .* Use vector=none"):
        make_pool("local", PoolSettings(f"atari:Pong?vector={ANY_LIBRARY}", 1, 1, env_wrappers=(wrapper,)))
    group = make_group(PoolSettings("atari:Pong", 1, 1, 0, "train", env_wrappers=(wrapper,)), 0)  # auto: the Python chain
    assert type(group).__name__ == "EnvGroup"
    group.close()


# ----------------------------------------------------------------------------- frames

def _python_chain(game: str, noops: int):
    import gymnasium as gym

    from fwrl.envs.atari import _import_ale
    from fwrl.envs.wrappers import AtariPreprocess, EpisodicLife

    _import_ale()
    env = gym.make(f"ALE/{game}-v5", frameskip=1, repeat_action_probability=0.0)
    return gym.wrappers.FrameStackObservation(EpisodicLife(AtariPreprocess(env, noop_max=noops)), 4)


def _settings(**changes) -> AtariVectorSettings:
    base = dict(game="MsPacman", rom="ms_pacman", episodic_life=True, sticky=0.0, full_action_space=False,
                max_frames=108_000, threads=1)
    return AtariVectorSettings(**{**base, **changes})


def _assert_same_frames(a: np.ndarray, b: np.ndarray) -> None:
    """Equal up to one grey level (OpenCV's INTER_AREA rounds where the exact area mean does not)."""
    diff = np.abs(a.astype(np.int16) - b.astype(np.int16))
    assert diff.max() <= 1 and (diff == 0).mean() > 0.998, (diff.max(), (diff == 0).mean())


@pytest.mark.parametrize("library", LIBRARIES)
def test_frames_rewards_and_life_loss_match_the_python_chain(library):
    """MsPacman (no FIRE), the same seed and actions, the no-ops fixed on both sides (ale draws
    0-29 with noop_max=30, so noop_max=0 gives none; envpool draws 1-30, so noop_max=1 gives one)."""
    noops = 0 if library == "ale" else 1
    vec = VECTOR_CLASSES[library](_settings(noop_max=noops), [7])
    chain = _python_chain("MsPacman", noops)
    try:
        _assert_same_frames(vec.reset()[0], chain.reset(seed=7)[0])
        rng = np.random.default_rng(0)
        for t in range(600):
            action = int(rng.integers(9))
            s = vec.step(np.array([action]))
            obs, reward, terminated, truncated, info = chain.step(action)
            assert s.reward[0] == reward and not s.truncated[0] and not truncated, t
            assert bool(s.terminated[0]) == terminated and not s.game_over[0], t
            if terminated:  # the first life loss: the chain's last frame starts the library's next episode
                assert not info["game_over"] and _fresh(s.obs[0])
                _assert_same_frames(s.obs[0][-1], obs[-1])
                break
            _assert_same_frames(s.obs[0], obs)
        else:
            pytest.fail("no life was lost in 600 steps")
        assert t > 50
    finally:
        vec.close()
        chain.close()


@pytest.mark.parametrize("library", LIBRARIES)
def test_sticky_actions_repeat_the_last_action(library):
    """sticky=0.25 reaches ALE (it repeats the previous action each frame with that probability):
    a game whose action changes every step parts from the same game without sticky actions, and
    each replays the same frames for the same seed."""
    def frames(sticky: float) -> np.ndarray:
        vec = VECTOR_CLASSES[library](_settings(game="Pong", rom="pong", sticky=sticky), [3])
        try:
            out = [vec.reset().copy()]
            for t in range(60):
                out.append(vec.step(np.array([2 + t % 2])).obs.copy())  # RIGHT, LEFT, RIGHT, ... (up, down)
            return np.stack(out)
        finally:
            vec.close()

    plain, sticky = frames(0.0), frames(0.25)
    assert np.array_equal(plain, frames(0.0)) and np.array_equal(sticky, frames(0.25))
    assert not np.array_equal(plain, sticky)


# ----------------------------------------------------------------------------- random play statistics

def _z(a, b) -> float:
    """|mean(a) - mean(b)| in standard errors of the difference."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    se = np.sqrt(a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b))
    return abs(a.mean() - b.mean()) / se


@lru_cache(maxsize=None)
def _random_play(path: str, steps: int = 1000, k: int = 4) -> dict[str, np.ndarray]:
    """Breakout (train mode) under uniformly random actions (the same generator for every path)."""
    spec = f"atari:Breakout?vector={path}"
    out = _out(spec, k)
    group = make_group(PoolSettings(spec, 1, k, 0, "train"), 0)
    rng = np.random.default_rng(0)
    lives, games, game_steps, rewards, pixels, lit = [], [], [], [], [], []
    since = np.zeros(k, int)
    try:
        group.reset(out)
        for _ in range(steps):
            for record in group.step(rng.integers(4, size=k), out):
                games.append(record.episode_return)
                game_steps.append(record.episode_step)
            since += 1
            rewards.extend(out["reward"])
            lives.extend(since[out["done"]])
            since[out["done"]] = 0
            pixels.append(out["obs"].mean(axis=(0, 2, 3)))
            lit.append((out["obs"][:, -1] > 0).mean())
    finally:
        group.close()
    return {"lives": np.array(lives), "games": np.array(games), "game_steps": np.array(game_steps),
            "rewards": np.array(rewards), "pixels": np.array(pixels).mean(axis=0), "lit": np.mean(lit)}


@pytest.mark.parametrize("library", LIBRARIES)
def test_random_play_statistics_match_the_python_chain(library):
    """Returns and rewards agree within 4 standard errors; lives and games last about as long (the
    C++ paths' lives are some 4 steps longer: after a life loss the agent has to press FIRE itself,
    one of Breakout's 4 actions; 36 against 32 steps over 4 x 3000 steps, see
    benchmarks/results/atari_vector.md); frames have the same grey levels."""
    chain, vec = _random_play("none"), _random_play(library)
    assert len(chain["lives"]) > 80 and len(vec["lives"]) > 80 and len(vec["games"]) > 15
    for key in ("games", "rewards"):
        assert _z(chain[key], vec[key]) < 4.0, (key, chain[key].mean(), vec[key].mean())
    # frame skip, max-pooling and the life-loss reading agree: a life is 30-40 steps of random play
    # (twice that with a skip of 2, 5 times with no life losses read)
    assert 0.9 < vec["lives"].mean() / chain["lives"].mean() < 1.3
    assert 0.9 < vec["game_steps"].mean() / chain["game_steps"].mean() < 1.3
    # frames: the mean grey level of each stack position and the share of lit pixels
    np.testing.assert_allclose(vec["pixels"], chain["pixels"], rtol=0.01)
    assert vec["lit"] == pytest.approx(chain["lit"], rel=0.01)


# ----------------------------------------------------------------------------- episode ends

@pytest.mark.parametrize("mode", ["train", "test"])
@pytest.mark.parametrize("library", LIBRARIES)
def test_a_life_loss_ends_the_training_episode_not_the_game(library, mode):
    """Breakout, 5 lives: in train mode 5 episode ends per game (4 life losses, then the game over),
    in test mode one; the return and step count run over the whole game, and each game gives one
    record with them; every episode starts with a fresh stack."""
    k = 2
    spec = f"atari:Breakout?vector={library}"
    out = _out(spec, k)
    group = make_group(PoolSettings(spec, 1, k, 0, mode), 0)
    assert isinstance(group, VectorEnvGroup)
    rng = np.random.default_rng(1)
    game_return, game_steps, ends = np.zeros(k), np.zeros(k, int), np.zeros(k, int)
    ends_per_game, steps_per_game = [], []
    try:
        group.reset(out)
        while len(ends_per_game) < 4:
            records = group.step(rng.integers(4, size=k), out)
            game_return += out["reward"]
            game_steps += 1
            ends += out["done"]
            assert np.allclose(out["episode_return"], game_return) and (out["episode_step"] == game_steps).all()
            assert not out["truncated"].any() and all(_fresh(out["obs"][j]) for j in np.flatnonzero(out["done"]))
            over = set()
            for record in records:  # the slot whose game it was: done now, with that return and length
                j = next(j for j in np.flatnonzero(out["done"]) if j not in over and game_steps[j] ==
                         record.episode_step and game_return[j] == pytest.approx(record.episode_return))
                over.add(j)
                ends_per_game.append(int(ends[j]))
                steps_per_game.append(record.episode_step)
                game_return[j], game_steps[j], ends[j] = 0.0, 0, 0
    finally:
        group.close()
    assert ends_per_game == [5 if mode == "train" else 1] * len(ends_per_game)
    assert all(100 < n < 400 for n in steps_per_game), steps_per_game


@pytest.mark.parametrize("library", LIBRARIES)
def test_the_frame_cap_is_a_truncation_with_the_final_observation(library):
    """Pong, max_frames=200: every game is cut after 50 agent steps (no Pong game ends that soon): done
    and truncated, the cut game's last stack in final_obs (zeros elsewhere), a fresh stack in obs,
    one record per cut game."""
    k = 2
    spec = f"atari:Pong?vector={library}&max_frames=200"
    out = _out(spec, k)
    group = make_group(PoolSettings(spec, 1, k, 0, "train"), 0)
    rng = np.random.default_rng(2)
    cuts = []
    try:
        group.reset(out)
        for t in range(1, 121):
            before = out["obs"].copy()
            records = group.step(rng.integers(6, size=k), out)
            assert (out["done"] == out["truncated"]).all()  # nothing else ends a game this short
            assert (out["episode_step"] == (t - 1) % 50 + 1).all()  # the steps of the game (the cut one's at a cut)
            if t % 50:
                assert not out["done"].any() and not out["final_obs"].any() and not records, t
                continue
            assert out["truncated"].all() and len(records) == k and {r.episode_step for r in records} == {50}
            for j in range(k):
                final = out["final_obs"][j]
                assert np.array_equal(final[:3], before[j][1:]) and final[3].any()
                assert _fresh(out["obs"][j]) and not np.array_equal(out["obs"][j][-1], final[-1])
            assert [r.episode_return for r in records] == pytest.approx(list(out["episode_return"]))
            cuts.append(t)
    finally:
        group.close()
    assert cuts == [50, 100]


# ----------------------------------------------------------------------------- through the workers

@needs_a_library
def test_workers_carry_truncation_through_both_backends(backend):
    """The worker protocol on the vector path: fresh slots at the start, truncated rows with their
    final_obs (zeros elsewhere), a finished game per cut, over shared memory and over Ray."""
    k = 2
    pool = backend.pool(f"atari:Pong?vector={ANY_LIBRARY}&max_frames=120", 1, k, seed=4, step_timeout=60.0)
    results = []
    try:
        pool.start()
        end = time.monotonic() + 120
        while len(results) < 32:
            assert time.monotonic() < end
            for r in pool.wait(0.5):
                results.append((r.done.copy(), r.truncated.copy(), r.final_obs.copy(), r.obs.copy(), r.episodes))
                pool.act(r.worker, np.zeros(k, np.int64))
    finally:
        pool.close()
    done, truncated, final_obs, obs, episodes = results[0]
    assert done.all() and not truncated.any() and not final_obs.any()
    cut_steps = [i for i, r in enumerate(results) if r[1].any()]
    assert cut_steps == [30] and all(r[0].any() == r[1].any() for r in results[1:])  # 120 frames = 30 steps
    done, truncated, final_obs, obs, episodes = results[30]
    assert truncated.all() and final_obs.reshape(k, -1).any(axis=1).all() and len(episodes) == k
    assert np.array_equal(final_obs[:, :3], results[29][3][:, 1:]) and all(_fresh(o) for o in obs)
    assert all(not r[2].any() for i, r in enumerate(results) if i != 30)


@needs_a_library
def test_a_killed_vector_worker_drops_exactly_its_partial_rollouts():
    """SIGKILL a worker stepping Atari in C++ threads: its next result is a fresh life (every slot
    done, step 0), no rollout mixes two lives or two workers, and the store drops exactly the
    steps of the killed life's partial rollout (as ``tests/e2e/test_worker_faults.py`` checks for the
    Python chain)."""
    import torch

    from fwrl.agents.inference import InferenceLoop
    from fwrl.agents.model import AgentNet
    from fwrl.agents.rollouts import RolloutSpec, RolloutStore
    from fwrl.envs.local_workers import LocalWorkerPool
    from test_worker_faults import _StampedPool, deadline

    class Recording(_StampedPool):
        """Also keeps whether each restarted result was a fresh start."""

        def __init__(self, pool):
            super().__init__(pool)
            self.fresh: list[bool] = []

        def wait(self, timeout):
            out = super().wait(timeout)
            self.fresh += [bool(r.done.all() and (r.episode_step == 0).all() and (r.reward == 0).all())
                           for r in out if r.restarted]
            return out

    torch.manual_seed(0)
    T, K = 4, 2
    spec = f"atari:Pong?vector={ANY_LIBRARY}"
    info = describe_env(spec)
    pool = LocalWorkerPool(PoolSettings(spec, 2, K, seed=1, step_timeout=60.0))
    stamped = Recording(pool)
    model = AgentNet(info.obs_shape, info.num_actions, "lstm", {"hidden_size": 16}, "nature").eval()
    store = RolloutStore(RolloutSpec(T, K, StepRecord.of(info.obs_shape, "uint8"), info.num_actions), 2, torch.device("cpu"),
                         model.initial_state(1))
    rollouts = []

    def keep(rollout):
        rollouts.append(store.export(rollout))
        store.release(rollout)

    killed = None
    with deadline(240):
        try:
            pool.start()
            loop = InferenceLoop(model, stamped, store, torch.device("cpu"), threading.Lock())
            while not (killed and stamped.restarted == 1 and any(r.worker == 1 and r.life == 1 for r in rollouts)
                       and len(rollouts) >= 8):
                loop.step(0.05, on_rollout=keep)
                if killed is None and len(stamped.stream[1]) >= 2 * T + 2:
                    killed = pool.pid(1)
                    os.kill(killed, signal.SIGKILL)
        finally:
            pool.close()
    assert pool.restarts == stamped.restarted == loop.restarts_seen == 1 and stamped.fresh == [True]
    assert "process died" in pool.errors[0]
    lives = defaultdict(int)  # (worker, life) -> results
    for worker_life in stamped.origin.values():
        lives[worker_life] += 1
    emitted = defaultdict(int)
    for ro in rollouts:
        serials = ro.tensors["task"]
        rows = [int(s) for s in serials[:, 0]]
        assert (serials == serials[:, :1]).all() and {stamped.origin[s] for s in rows} == {(ro.worker, ro.life)}
        stream = stamped.stream[ro.worker]
        assert rows == stream[stream.index(rows[0]):stream.index(rows[0]) + T + 1]
        emitted[(ro.worker, ro.life)] += 1
    assert set(lives) == {(0, 0), (1, 0), (1, 1)}
    for worker_life, n in lives.items():
        assert emitted[worker_life] == (n - 1) // T
    dropped_life = lives[(1, 0)]
    assert store.dropped_steps == (dropped_life - T * emitted[(1, 0)]) * K > 0


# ----------------------------------------------------------------------------- fwrl bench

@needs_a_library
def test_bench_measures_each_path_on_the_same_workers():
    from fwrl.launch.bench.envs import measure_env_paths, parse_env_paths

    assert parse_env_paths("atari:Pong", None) == ()
    assert parse_env_paths("atari:Pong", "all") == env_paths("atari:Pong")
    assert parse_env_paths("atari:Pong", f"none,{ANY_LIBRARY}") == ("none", ANY_LIBRARY)
    for text, pattern in [("none,none", "each once"), ("auto", "not auto"), ("gpu", "valid choices: ale, auto")]:
        with pytest.raises(FwrlError, match=pattern):
            parse_env_paths("atari:Pong", text)
    with pytest.raises(FwrlError, match="single env path"):
        parse_env_paths("memory:cue_delay", "all")
    results = measure_env_paths("atari:Pong", ("none", ANY_LIBRARY), 1, 1, 2, seconds=0.5, warmup=0.2)
    assert list(results) == ["none", ANY_LIBRARY]
    for path, (r,) in results.items():
        assert r.env_path == path and r.env_steps == 2 * r.round_trips > 0 and r.restarts == 0
        assert r.cpu_seconds is not None and 0 < r.cpu_seconds and r.steps_per_cpu_second > 0


# ----------------------------------------------------------------------------- ProcGen through EnvPool

def _procgen_problem() -> str | None:
    from fwrl.envs.procgen_vector import import_envpool_procgen
    from fwrl.envs.vector_paths import library_problem

    return library_problem(import_envpool_procgen)


PROCGEN_PROBLEM = _procgen_problem()
HAS_ENVPOOL = LIBRARY_REASONS["envpool"] is None


@pytest.mark.skipif(not HAS_ENVPOOL or PROCGEN_PROBLEM is None,
                    reason="needs envpool installed and its ProcGen build unable to load (no Qt 5 runtime)")
def test_procgen_through_envpool_without_qt_says_what_to_install():
    with pytest.raises(FwrlError, match=r"Qt 5 runtime .*libQt5.*apt install libqt5gui5.*vector=none"):
        describe_env("procgen:bigfish?vector=envpool")
    assert env_path("procgen:bigfish") == "none"  # auto takes the procgen2 chain


@pytest.mark.skipif(not HAS_ENVPOOL, reason="envpool is not installed (pip install 'fwrl[envpool]')")
def test_procgen_qt_message_when_the_runtime_is_missing(monkeypatch):
    """The Qt message path wherever this runs: EnvPool's ProcGen module as it is without Qt 5."""
    loader_error = ImportError("libQt5Gui.so.5: cannot open shared object file: No such file or directory")

    def missing(name):
        if name == "ProcgenEnvSpec":
            raise ImportError("EnvPool Procgen requires the system Qt 5 runtime on Linux.") from loader_error
        raise AttributeError(name)

    fake = types.ModuleType("envpool.procgen")
    fake.__getattr__ = missing
    monkeypatch.setitem(sys.modules, "envpool.procgen", fake)
    with pytest.raises(FwrlError, match=r"need the system's Qt 5 runtime .*: libQt5Gui.so.5: cannot open shared "
                                        r"object file.*apt install libqt5gui5.*use vector=none"):
        resolve("procgen:bigfish?vector=envpool")
    assert env_path("procgen:bigfish") == "none"
    monkeypatch.setitem(sys.modules, "envpool", None)
    with pytest.raises(FwrlError, match=r"pip install -e '\.\[envpool\]'"):
        resolve("procgen:bigfish?vector=envpool")


@pytest.mark.skipif(PROCGEN_PROBLEM is not None, reason=f"EnvPool's ProcGen does not load here: {PROCGEN_PROBLEM}")
def test_procgen_through_envpool_keeps_the_procgen_protocol():
    """(3, 64, 64) frames; every end a termination and a finished game (time limits included, as the
    procgen2 chain reports them); coinrun pays 10 or nothing."""
    k = 2
    spec = "procgen:coinrun?vector=envpool&distribution=hard"
    assert env_path(spec) == "envpool"
    out = _out(spec, k)
    group = make_group(PoolSettings(spec, 2, k, 0, "train"), 1)
    assert isinstance(group, VectorEnvGroup) and group.task == 0
    rng = np.random.default_rng(0)
    records = []
    try:
        group.reset(out)
        assert out["obs"].shape == (k, 3, 64, 64) and out["obs"].any()
        for _ in range(2500):
            records += group.step(rng.integers(15, size=k), out)
            assert not out["truncated"].any()
    finally:
        group.close()
    assert len(records) >= 2 and all(0 < r.episode_step <= 1000 for r in records)
    assert {r.episode_return for r in records} <= {0.0, 10.0}
