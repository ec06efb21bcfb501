"""DeepMind Lab levels (``dmlab:<level>``) over the ``deepmind_lab`` Python module.

Beattie et al. 2016, as run by IMPALA (Espeholt et al. 2018) and the RTRL
paper (R2AC on rooms_watermaze etc.); PAPERS.md §5:

- ``dmlab:rooms_watermaze`` plays ``contributed/dmlab30/rooms_watermaze``
  (any DMLab-30 name); a name with a ``/`` is passed to Lab as a full level
  path (e.g. ``dmlab:contributed/dmlab30/rooms_watermaze``);
- ``deepmind_lab.Lab(level, ['RGB_INTERLEAVED'], config={'width': '96',
  'height': '72', 'logLevel': 'WARN', ...}, renderer='software')`` (config
  values are strings); frames ``(72, 96, 3)`` uint8 -> ``(3, 72, 96)``;
- the IMPALA 9-action set (:data:`ACTIONS`), each a 7-vector ``np.intc``
  (look left/right, look down/up, strafe, move, fire, jump, crouch);
- action repeat 4 via ``step(action, num_steps=4)``, which returns the summed
  reward; ``is_running()`` false ends the episode (then ``observations()`` is
  not available, so the terminal step returns the last frame again);
- episode seeds: ``reset(seed=s)`` with ``s`` drawn from an RNG seeded by the
  seed given to ``make``;
- test mode (``mode="test"``) adds ``allowHoldOutLevels='true'`` and
  ``mixerSeed='1611489005'`` (the held-out test levels).

Options: ``dataset_path=PATH`` (Lab's ``datasetPath``, for the levels that
need the Brady/Konkle/Oliva image dataset; ``dummy`` uses a synthetic one),
``renderer=software|hardware``, ``action_repeat=4``, ``level_cache=DIR`` (keeps
the maps Lab compiles for levels that generate one per episode, e.g.
``rooms_keys_doors_puzzle``, so that an episode seen before does not run
q3map2 again). Several levels joined by ``+`` make a multi-task run (worker i
plays level i mod n).

``deepmind_lab`` has no PyPI wheel: :data:`BUILD_COMMAND` builds it from source
with Bazel in a container (docker/README.md, `Dockerfile.dmlab`). Before any run folder exists,
:meth:`DMLabFamily.check_installed` says in one line what is wrong: no engine,
an engine this Python cannot load (built for another Python), a level the
engine does not have, a map or dataset folder missing (:func:`check_level`).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from fwrl.envs.registry import EnvFamily, EnvInfo, register_family
from fwrl.envs.spec import EnvSpec, Option
from fwrl.errors import FwrlError, unknown_choice

DMLAB30_LEVELS = (
    "rooms_collect_good_objects_train", "rooms_collect_good_objects_test",
    "rooms_exploit_deferred_effects_train", "rooms_exploit_deferred_effects_test",
    "rooms_select_nonmatching_object", "rooms_watermaze", "rooms_keys_doors_puzzle",
    "language_select_described_object", "language_select_located_object",
    "language_execute_random_task", "language_answer_quantitative_question",
    "lasertag_one_opponent_small", "lasertag_three_opponents_small",
    "lasertag_one_opponent_large", "lasertag_three_opponents_large",
    "natlab_fixed_large_map", "natlab_varying_map_regrowth", "natlab_varying_map_randomized",
    "skymaze_irreversible_path_hard", "skymaze_irreversible_path_varied",
    "psychlab_arbitrary_visuomotor_mapping", "psychlab_continuous_recognition",
    "psychlab_sequential_comparison", "psychlab_visual_search",
    "explore_object_locations_small", "explore_object_locations_large",
    "explore_obstructed_goals_small", "explore_obstructed_goals_large",
    "explore_goal_locations_small", "explore_goal_locations_large",
    "explore_object_rewards_few", "explore_object_rewards_many",
)  # fmt: skip
LEVEL_PREFIX = "contributed/dmlab30/"

# The IMPALA action set: (name, (look L/R, look D/U, strafe L/R, move B/F, fire, jump, crouch))
ACTIONS: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("forward", (0, 0, 0, 1, 0, 0, 0)),
    ("backward", (0, 0, 0, -1, 0, 0, 0)),
    ("strafe_left", (0, 0, -1, 0, 0, 0, 0)),
    ("strafe_right", (0, 0, 1, 0, 0, 0, 0)),
    ("look_left", (-20, 0, 0, 0, 0, 0, 0)),
    ("look_right", (20, 0, 0, 0, 0, 0, 0)),
    ("look_left_forward", (-20, 0, 0, 1, 0, 0, 0)),
    ("look_right_forward", (20, 0, 0, 1, 0, 0, 0)),
    ("fire", (0, 0, 0, 0, 1, 0, 0)),
)
ACTION_ARRAYS = tuple(np.array(vec, dtype=np.intc) for _, vec in ACTIONS)
WIDTH, HEIGHT = 96, 72
OBS_SHAPE = (3, HEIGHT, WIDTH)
OBSERVATION = "RGB_INTERLEAVED"
TEST_MIXER_SEED = 1611489005
MAX_SEED = 2**31 - 1

# (human, random) episode returns (PAPERS.md §5)
HUMAN_RANDOM: dict[str, tuple[float, float]] = {
    "rooms_watermaze": (54.0, 4.065),
    "rooms_select_nonmatching_object": (65.9, 0.312),
    "rooms_keys_doors_puzzle": (53.8, 4.135),
}


def human_normalised_score(level: str, score: float) -> float:
    """``(R - R_random) / (R_human - R_random)`` for the levels in :data:`HUMAN_RANDOM`."""
    if level not in HUMAN_RANDOM:
        raise unknown_choice("dmlab level with human/random scores", level, HUMAN_RANDOM)
    human, rand = HUMAN_RANDOM[level]
    return (float(score) - rand) / (human - rand)


# How to get the engine: the container recipe that builds it from source (docker/README.md, Dockerfile.dmlab).
BUILD_COMMAND = "docker build -f docker/Dockerfile.dmlab -t fwrl-dmlab ."


def _import_lab():
    """The ``deepmind_lab`` module, or a one-line FwrlError saying what is wrong and how to fix it.

    Two cases: no module of that name (not built or not installed for this Python), and a
    module that exists but does not import (an engine built for another Python, whose extension
    this one cannot load; upstream's package fails on ``import imp`` from Python 3.12).
    """
    try:
        import deepmind_lab
    except ImportError as error:
        if isinstance(error, ModuleNotFoundError) and error.name == "deepmind_lab":
            raise FwrlError(
                "DeepMind Lab envs need the Python module 'deepmind_lab' (no PyPI wheel), which is "
                f"not installed for this Python ({sys.executable}); build it from source for this Python "
                f"and install it, or run fwrl in the image that {BUILD_COMMAND} builds (docker/README.md, Dockerfile.dmlab)."
            ) from None
        raise FwrlError(
            f"the DeepMind Lab engine installed here does not load in this Python "
            f"{sys.version_info[0]}.{sys.version_info[1]} ({_one_line(error)}); rebuild it for this "
            f"Python, or run fwrl in the image that {BUILD_COMMAND} builds."
        ) from None
    return deepmind_lab


def engine_root(lab_module: Any) -> Path:
    """The folder of the engine's runfiles: ``baselab/`` (game scripts, maps, pk3 assets) and
    the renderer libraries."""
    return Path(lab_module.runfiles_path())


_QUOTED_NAME = re.compile(r"""['"]([A-Za-z0-9_]+)['"]""")


def check_level(root: Path, level: str, dataset_path: str = "") -> None:
    """Raise a one-line FwrlError where the engine at ``root`` cannot play ``level`` (a path
    under ``game_scripts/levels``, e.g. ``contributed/dmlab30/rooms_watermaze``).

    - the level's script is not in the engine (an unknown level path, or a source folder
      without it);
    - a map the script names by its quoted name has its bot navigation file (``.aas``) in
      the engine but not its built map (``.bsp``): a source folder without that asset
      (e.g. a copy that left out files of 4 MiB and more, as the natlab maps are);
    - ``dataset_path`` is set, not ``dummy``, and not a folder.
    """
    levels = root / "baselab" / "game_scripts" / "levels"
    script = levels / f"{level}.lua"
    if not script.is_file():
        raise FwrlError(
            f"DeepMind Lab level {level!r} is not in the engine at {root} (no {script}); name a "
            f"DMLab-30 level or a level path under {levels}."
        )
    maps = root / "baselab" / "maps"
    for name in sorted(set(_QUOTED_NAME.findall(script.read_text(errors="replace")))):
        if (maps / f"{name}.aas").is_file() and not (maps / f"{name}.bsp").is_file():
            raise FwrlError(
                f"DeepMind Lab level {level!r} needs the map {name}.bsp, which the engine at {root} "
                "lacks (its source folder had no assets/maps/built/" + name + ".bsp); rebuild from "
                "a complete source folder."
            )
    if dataset_path and dataset_path != "dummy" and not Path(dataset_path).is_dir():
        raise FwrlError(f"dmlab option dataset_path={dataset_path!r} is not a folder.")


class LevelCache:
    """Lab's level cache over a folder: compiled maps (``.pk3``) by Lab's key.

    ``fetch`` copies a cached map to where Lab wants it; ``write`` stores a new one
    (through a temporary file and a rename, so workers sharing the folder never read half
    a file).
    """

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def fetch(self, key: str, pk3_path: str) -> bool:
        cached = self.folder / key
        if not cached.is_file():
            return False
        shutil.copyfile(cached, pk3_path)
        return True

    def write(self, key: str, pk3_path: str) -> None:
        cached = self.folder / key
        if cached.is_file():
            return
        fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".incoming-")
        os.close(fd)
        try:
            shutil.copyfile(pk3_path, tmp)
            os.replace(tmp, cached)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)


def level_path(name: str) -> str:
    """``rooms_watermaze`` -> ``contributed/dmlab30/rooms_watermaze``; full paths unchanged."""
    return name if "/" in name else LEVEL_PREFIX + name


def lab_config(opts: dict[str, Any], mode: str) -> dict[str, str]:
    """The string-valued Lab config for ``opts`` and ``mode`` (train or test)."""
    config = {"width": str(WIDTH), "height": str(HEIGHT), "logLevel": "WARN"}
    if opts.get("dataset_path"):
        config["datasetPath"] = str(opts["dataset_path"])
    if mode == "test":
        config["allowHoldOutLevels"] = "true"
        config["mixerSeed"] = str(TEST_MIXER_SEED)
    return config


class DMLabEnv(gym.Env):
    """One DeepMind Lab level as a gymnasium env with the IMPALA action set."""

    metadata: dict = {"render_modes": []}

    def __init__(
        self,
        level: str,
        config: dict[str, str],
        seed: int,
        renderer: str = "software",
        action_repeat: int = 4,
        level_cache: str = "",
    ):
        self.level = level
        self.config = dict(config)
        self.renderer = renderer
        self.action_repeat = action_repeat
        self.observation_space = gym.spaces.Box(0, 255, OBS_SHAPE, np.uint8)
        self.action_space = gym.spaces.Discrete(len(ACTIONS))
        self.action_space.seed(seed)
        self._episode_rng = np.random.default_rng(seed)
        self._lab = None
        lab_module = _import_lab()
        cache = LevelCache(level_cache) if level_cache else None
        try:
            self._lab = lab_module.Lab(level, [OBSERVATION], config=self.config, renderer=renderer,
                                       level_cache=cache)
        except RuntimeError as error:  # Lab's own words, e.g. a level script it cannot load
            raise FwrlError(f"DeepMind Lab could not start level {level!r}: {_one_line(error)}") from None
        self._last: np.ndarray | None = None

    def _frame(self) -> np.ndarray:
        rgb = np.asarray(self._lab.observations()[OBSERVATION], dtype=np.uint8)
        return np.ascontiguousarray(rgb.transpose(2, 0, 1))

    def reset(self, *, seed: int | None = None, options=None):
        if seed is not None:
            self._episode_rng = np.random.default_rng(seed)
            self.action_space.seed(seed)
        episode_seed = int(self._episode_rng.integers(MAX_SEED))
        try:
            self._lab.reset(seed=episode_seed)
        except RuntimeError as error:  # e.g. a map the level needs is missing
            raise FwrlError(f"DeepMind Lab could not start an episode of {self.level!r}: "
                            f"{_one_line(error)}") from None
        self._last = self._frame()
        return self._last, {"episode_seed": episode_seed}

    def step(self, action):
        if self._last is None:
            raise RuntimeError("DMLabEnv.step() called before reset()")
        reward = float(self._lab.step(ACTION_ARRAYS[int(action)], num_steps=self.action_repeat))
        terminated = not self._lab.is_running()
        info: dict[str, Any] = {}
        if terminated:
            obs = self._last  # Lab has no observations after the episode ended
            self._last = None
            info["game_over"] = True
        else:
            obs = self._last = self._frame()
        return obs, reward, terminated, False, info

    def close(self):
        if getattr(self, "_lab", None) is not None:
            self._lab.close()
            self._lab = None


def _one_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


class DMLabFamily(EnvFamily):
    name = "dmlab"
    multi_task = True  # dmlab:a+b: worker i plays level i mod n
    options = {
        "dataset_path": Option(str, "", "Lab datasetPath (image dataset; 'dummy' = synthetic)"),
        "renderer": Option(str, "software", "Lab renderer", ("software", "hardware")),
        "action_repeat": Option(int, 4, "frames per agent step (Lab num_steps)"),
        "level_cache": Option(str, "", "folder for Lab's compiled maps, shared by workers ('' = none)"),
    }

    def validate(self, spec: EnvSpec) -> dict[str, Any]:
        opts = super().validate(spec)
        for level in spec.names:
            if "/" not in level and level not in DMLAB30_LEVELS:
                raise unknown_choice(
                    "dmlab level (a DMLab-30 name, or a full level path with '/')",
                    level,
                    DMLAB30_LEVELS,
                )
        if opts["action_repeat"] < 1:
            raise FwrlError(f"dmlab option action_repeat must be >= 1, got {opts['action_repeat']}.")
        return opts

    def make(self, spec: EnvSpec, *, worker_index: int, seed: int, mode: str = "train"):
        if mode not in ("train", "test"):
            raise unknown_choice("env mode", mode, ("train", "test"))
        opts = self.validate(spec)
        level = level_path(spec.name_for_worker(worker_index))
        return DMLabEnv(
            level,
            lab_config(opts, mode),
            seed,
            renderer=opts["renderer"],
            action_repeat=opts["action_repeat"],
            level_cache=opts["level_cache"],
        )

    def describe(self, spec: EnvSpec) -> EnvInfo:
        self.validate(spec)
        return EnvInfo(OBS_SHAPE, "uint8", len(ACTIONS), tuple(spec.names))

    def check_installed(self, spec: EnvSpec) -> None:
        """The engine imports in this Python and has every level of ``spec`` with its maps
        (:func:`check_level`); without starting the engine."""
        opts = self.validate(spec)
        root = engine_root(_import_lab())
        for name in spec.names:
            check_level(root, level_path(name), opts["dataset_path"])


register_family(DMLabFamily())
