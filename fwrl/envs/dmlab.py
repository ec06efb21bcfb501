"""DeepMind Lab levels (``dmlab:<level>``) over the ``deepmind_lab`` Python module.

Beattie et al. 2016, as run by IMPALA (Espeholt et al. 2018) and the RTRL
paper (R2AC on rooms_watermaze etc.); REFERENCE.md section 5:

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
``renderer=software|hardware``, ``action_repeat=4``. Several levels joined by
``+`` make a multi-task run (worker i plays level i mod n).

``deepmind_lab`` has no PyPI wheel: it is built from source with Bazel in
``docker/Dockerfile.dmlab``. Where it is missing, making an env raises a
FwrlError that says so.
"""

from __future__ import annotations

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

# (human, random) episode returns (REFERENCE.md section 5)
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


def _import_lab():
    """The ``deepmind_lab`` module, or a FwrlError saying how to get it."""
    try:
        import deepmind_lab
    except ImportError:
        raise FwrlError(
            "DeepMind Lab envs need the Python module 'deepmind_lab', which has no PyPI "
            "wheel and is not installed here. Build it from source in the container "
            "recipe docker/Dockerfile.dmlab (docker build -f docker/Dockerfile.dmlab "
            "-t fwrl-dmlab .) and run fwrl inside that container."
        ) from None
    return deepmind_lab


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
    ):
        self.level = level
        self.config = dict(config)
        self.renderer = renderer
        self.action_repeat = action_repeat
        self.observation_space = gym.spaces.Box(0, 255, OBS_SHAPE, np.uint8)
        self.action_space = gym.spaces.Discrete(len(ACTIONS))
        self.action_space.seed(seed)
        self._episode_rng = np.random.default_rng(seed)
        lab_module = _import_lab()
        self._lab = lab_module.Lab(level, [OBSERVATION], config=self.config, renderer=renderer)
        self._last: np.ndarray | None = None

    def _frame(self) -> np.ndarray:
        rgb = np.asarray(self._lab.observations()[OBSERVATION], dtype=np.uint8)
        return np.ascontiguousarray(rgb.transpose(2, 0, 1))

    def reset(self, *, seed: int | None = None, options=None):
        if seed is not None:
            self._episode_rng = np.random.default_rng(seed)
            self.action_space.seed(seed)
        episode_seed = int(self._episode_rng.integers(MAX_SEED))
        self._lab.reset(seed=episode_seed)
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


class DMLabFamily(EnvFamily):
    name = "dmlab"
    multi_task = True  # dmlab:a+b: worker i plays level i mod n
    options = {
        "dataset_path": Option(str, "", "Lab datasetPath (image dataset; 'dummy' = synthetic)"),
        "renderer": Option(str, "software", "Lab renderer", ("software", "hardware")),
        "action_repeat": Option(int, 4, "frames per agent step (Lab num_steps)"),
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
        )

    def describe(self, spec: EnvSpec) -> EnvInfo:
        self.validate(spec)
        return EnvInfo(OBS_SHAPE, "uint8", len(ACTIONS), tuple(spec.names))

    def check_installed(self, spec: EnvSpec) -> None:
        self.validate(spec)
        _import_lab()


register_family(DMLabFamily())
