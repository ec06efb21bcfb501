"""dmlab:<level> family: the adapter against a stand-in Lab, bad input refused before any run
folder exists (no engine needed), and the real engine where it is built and installed
(``dmlab.BUILD_COMMAND``; skipped elsewhere, with that command as the reason).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from fwrl.envs import describe_env, make_env
from fwrl.envs import dmlab
from fwrl.envs.spec import parse_env_spec
from fwrl.errors import FwrlError


class _FakeLab:
    """Stand-in for ``deepmind_lab.Lab``: episodes of 3 agent steps.

    Frames encode (episode seed mod 256, steps taken) in the red/green
    channels; ``step`` returns ``num_steps`` times the move component
    (+1 forward, -1 backward), so the summed reward of the action repeat shows.
    """

    instances: list["_FakeLab"] = []

    def __init__(self, level, observations, config=None, renderer="software", level_cache=None):
        self.level, self.observation_names, self.config, self.renderer = (
            level, observations, config, renderer,
        )  # fmt: skip
        self.level_cache = level_cache
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
    with pytest.raises(FwrlError, match="not installed for this Python") as missing:
        make_env("dmlab:rooms_watermaze")
    assert "docker/Dockerfile.dmlab" in str(missing.value) and "\n" not in str(missing.value)
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


# ----------------------------------------------------------------------------- bad input, no engine


def run_cli(argv: list) -> tuple[int, str]:
    """``fwrl ARGV`` in this process: (exit status, stderr)."""
    from fwrl.launch.cli import main

    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, err.getvalue()


def assert_one_line_refusal(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fwrl: error:"), err
    for needle in needles:
        assert needle in err, (needle, err)


def fake_engine(root: Path, levels: dict[str, str], maps: dict[str, tuple[str, ...]]) -> types.SimpleNamespace:
    """An installed engine's files as check_level reads them: level scripts (path -> Lua text)
    under baselab/game_scripts/levels and map files (name -> suffixes) under baselab/maps."""
    for level, text in levels.items():
        script = root / "baselab" / "game_scripts" / "levels" / f"{level}.lua"
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(text)
    (root / "baselab" / "maps").mkdir(parents=True, exist_ok=True)
    for name, suffixes in maps.items():
        for suffix in suffixes:
            (root / "baselab" / "maps" / f"{name}{suffix}").write_bytes(b"x")
    return types.SimpleNamespace(Lab=_FakeLab, runfiles_path=lambda: str(root))


NATLAB_SCRIPT = "local maps = {'natlab_a', 'natlab_b'}\nreturn factory.createLevelApi{mapName = maps[1]}\n"


@pytest.fixture
def engine_files(tmp_path, monkeypatch):
    """A stand-in engine with rooms_watermaze (map complete) and natlab_fixed_large_map (natlab_b
    has its .aas but not its .bsp, as in a source folder without its files of 4 MiB and more)."""
    engine = fake_engine(
        tmp_path / "engine",
        {
            "contributed/dmlab30/rooms_watermaze": "return factory.createLevelApi{mapName = 'em_watermaze'}",
            "contributed/dmlab30/natlab_fixed_large_map": NATLAB_SCRIPT,
        },
        {"em_watermaze": (".aas", ".bsp"), "natlab_a": (".aas", ".bsp"), "natlab_b": (".aas",)},
    )
    monkeypatch.setattr(dmlab, "_import_lab", lambda: engine)
    return tmp_path / "engine"


def test_check_level_names_what_is_missing(engine_files, tmp_path):
    dmlab.check_level(engine_files, "contributed/dmlab30/rooms_watermaze")
    with pytest.raises(FwrlError, match=r"needs the map natlab_b\.bsp") as missing_map:
        dmlab.check_level(engine_files, "contributed/dmlab30/natlab_fixed_large_map")
    assert "natlab_a" not in str(missing_map.value)
    with pytest.raises(FwrlError, match="'contributed/dmlab30/no_such_level' is not in the engine"):
        dmlab.check_level(engine_files, "contributed/dmlab30/no_such_level")
    with pytest.raises(FwrlError, match="dataset_path='/no/such/folder' is not a folder"):
        dmlab.check_level(engine_files, "contributed/dmlab30/rooms_watermaze", "/no/such/folder")
    dmlab.check_level(engine_files, "contributed/dmlab30/rooms_watermaze", "dummy")
    dmlab.check_level(engine_files, "contributed/dmlab30/rooms_watermaze", str(tmp_path))


BAD_INPUT = {
    # case: (env spec, what the one line must say)
    "unknown DMLab-30 name": ("dmlab:rooms_watermazee", "unknown dmlab level"),
    "unknown level path": ("dmlab:contributed/dmlab30/rooms_nothing", "is not in the engine"),
    "missing map": ("dmlab:natlab_fixed_large_map", "needs the map natlab_b.bsp"),
    "missing dataset": ("dmlab:rooms_watermaze?dataset_path=/no/such/folder", "is not a folder"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
@pytest.mark.parametrize("command", ["train", "bench envs"])
def test_bad_level_or_asset_is_refused_before_any_folder(case, command, engine_files, tmp_path, monkeypatch):
    spec, needle = BAD_INPUT[case]
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    argv = {"train": ["train", "--env", spec, "--runs-dir", work / "runs"],
            "bench envs": ["bench", "envs", "--env", spec, "--seconds", "1"]}[command]
    code, err = run_cli(argv)
    assert_one_line_refusal(code, err, needle)
    assert list(work.iterdir()) == [], "a file or folder was written"


def test_missing_engine_is_refused_before_any_folder(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "deepmind_lab", None)
    monkeypatch.chdir(tmp_path)
    code, err = run_cli(["train", "--env", "dmlab:rooms_watermaze", "--runs-dir", tmp_path / "runs"])
    assert_one_line_refusal(code, err, "not installed for this Python", "docker/Dockerfile.dmlab")
    assert list(tmp_path.iterdir()) == []


def test_engine_built_for_another_python_is_refused_before_any_folder(tmp_path, fwrl_cli):
    """A deepmind_lab package whose extension is for another Python (its file name carries that
    Python's tag, so this one finds no extension to load), in a subprocess: exit 2, one line."""
    package = tmp_path / "site" / "deepmind_lab"
    package.mkdir(parents=True)
    (package / "deepmind_lab.cpython-399-x86_64-linux-gnu.so").write_bytes(b"\x7fELF")
    (package / "__init__.py").write_text("from deepmind_lab.deepmind_lab import Lab\n")
    work = tmp_path / "work"
    work.mkdir()
    env = {**__import__("os").environ, "PYTHONPATH": f"{tmp_path / 'site'}:{Path(dmlab.__file__).parents[2]}"}
    done = subprocess.run([*fwrl_cli, "train", "--env", "dmlab:rooms_watermaze", "--runs-dir", work / "runs"],
                          cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert_one_line_refusal(done.returncode, done.stderr, "does not load in this Python",
                            "No module named 'deepmind_lab.deepmind_lab'", "rebuild it for this Python")
    assert list(work.iterdir()) == []


def test_level_cache_round_trip(tmp_path):
    cache = dmlab.LevelCache(tmp_path / "cache")
    compiled = tmp_path / "compiled.pk3"
    compiled.write_bytes(b"map bytes")
    wanted = tmp_path / "wanted.pk3"
    assert not cache.fetch("key1", str(wanted)) and not wanted.exists()
    cache.write("key1", str(compiled))
    assert cache.fetch("key1", str(wanted)) and wanted.read_bytes() == b"map bytes"
    compiled.write_bytes(b"other bytes")
    cache.write("key1", str(compiled))  # a key once written keeps its map
    assert cache.fetch("key1", str(wanted)) and wanted.read_bytes() == b"map bytes"
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["key1"]  # no temporary left


def test_level_cache_option_reaches_lab(fake_lab, tmp_path):
    make_env(f"dmlab:rooms_watermaze?level_cache={tmp_path / 'levels'}", seed=0)
    cache = fake_lab.instances[-1].level_cache
    assert isinstance(cache, dmlab.LevelCache) and cache.folder == tmp_path / "levels"
    make_env("dmlab:rooms_watermaze", seed=0)
    assert fake_lab.instances[-1].level_cache is None


# ----------------------------------------------------------------------------- the real engine

needs_engine = pytest.mark.skipif(
    importlib.util.find_spec("deepmind_lab") is None,
    reason=f"deepmind_lab is not installed for this Python; build it from source, e.g. in the image of "
           f"{dmlab.BUILD_COMMAND} (docker/README.md, Dockerfile.dmlab)",
)


def play(env, actions) -> tuple[list[np.ndarray], list[float], int | None]:
    """Frames (reset's first), rewards, and the step the episode ended at (None if it did not)."""
    obs, _ = env.reset()
    frames, rewards = [obs.copy()], []
    for t, action in enumerate(actions):
        obs, reward, terminated, truncated, _ = env.step(action)
        frames.append(obs.copy())
        rewards.append(reward)
        if terminated or truncated:
            return frames, rewards, t + 1
    return frames, rewards, None


@needs_engine
def test_engine_installed_and_checked():
    import deepmind_lab

    root = dmlab.engine_root(deepmind_lab)
    assert (root / "baselab").is_dir()
    for level in ("rooms_watermaze", "rooms_select_nonmatching_object", "rooms_keys_doors_puzzle"):
        dmlab.DMLabFamily().check_installed(parse_env_spec(f"dmlab:{level}"))


@needs_engine
def test_engine_reward_and_episode_end_on_a_known_level():
    """Lab's tests/final_reward_test adds score t at frame t = 1..10 and ends after frame 10:
    with action repeat 4 the episode ends in the third agent step, with 1 + ... + 10 = 55."""
    env = make_env("dmlab:tests/final_reward_test", seed=0)
    frames, rewards, end = play(env, [0] * 10)
    env.close()
    assert end == 3
    assert sum(rewards) == 55.0
    assert frames[0].shape == (3, 72, 96) and frames[0].dtype == np.uint8


@needs_engine
def test_engine_frames_follow_the_seed():
    """rooms_watermaze at the R2AC settings: 96x72 RGB frames, not blank; the same seed gives the
    same frames step for step, another seed another start."""
    actions = [0, 4, 6, 7, 1, 2, 3, 5] * 3

    def frames(seed):
        env = make_env("dmlab:rooms_watermaze", seed=seed)
        try:
            return play(env, actions)[0]
        finally:
            env.close()

    first, again, other = frames(1), frames(1), frames(2)
    assert first[0].shape == (3, 72, 96) and first[0].dtype == np.uint8 and first[0].flags.c_contiguous
    assert first[0].std() > 5, "a blank frame"
    assert len(first) == len(actions) + 1
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert any(not np.array_equal(a, b) for a, b in zip(first[1:], first[:-1])), "the view never changed"
    assert not np.array_equal(first[0], other[0])


@needs_engine
def test_engine_select_nonmatching_object_episode_ends_on_time():
    """rooms_select_nonmatching_object lasts 12 s at 60 frames/s: 720 frames, 180 agent steps."""
    env = make_env("dmlab:rooms_select_nonmatching_object", seed=0)
    _, rewards, end = play(env, [int(a) for a in np.random.default_rng(0).integers(9, size=400)])
    obs, _ = env.reset()  # a new episode after the end
    env.close()
    assert end == 180
    assert obs.shape == (3, 72, 96)
    assert all(r in (-10.0, -9.0, 0.0, 1.0, 10.0, 11.0) for r in rewards), sorted(set(rewards))
