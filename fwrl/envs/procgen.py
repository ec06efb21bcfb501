"""ProcGen games (``procgen:<game>[+<game>...]``) over the gym3 API of ``procgen2``.

Cobbe et al. 2020, as run in the SRWM paper (Irie et al. 2022, Sec. 4.3) and
the RTRL paper (chaser): 64x64x3 uint8 frames -> ``(3, 64, 64)``, 15 actions,
no frame skip or stack (PAPERS.md §5). Options (all forwarded to
``procgen.ProcgenGym3Env``)::

    distribution=easy|hard|extreme|memory|exploration   (default easy)
    num_levels=N  start_level=S  use_sequential_levels=false
    use_backgrounds=true  use_monochrome_assets=false  restrict_themes=false
    center_agent=true  paint_vel_info=false  use_generated_assets=false

Bad combinations are refused *before* the library sees them, because the C++
library aborts the whole process on them: ``extreme`` exists only for
chaser, dodgeball, leaper, starpilot; ``memory`` only for caveflyer,
dodgeball, heist, jumper, maze, miner; ``exploration`` only for coinrun,
caveflyer, leaper, jumper, maze, heist, climber, ninja, and it fixes its own
single level (so num_levels / start_level must not be given); num_levels and
start_level must be >= 0 (checked against the procgen2 0.10.7 wheel).

Env path (``vector=auto|envpool|none``, :mod:`fwrl.envs.vector_paths`):
``envpool`` steps each worker's K envs in C++ threads
(:mod:`fwrl.envs.procgen_vector`; it needs the ``envpool`` extra and the
system's Qt 5 runtime), ``none`` is the procgen2 chain below, ``auto`` (the
default) envpool where it loads, else none. ``threads=N``: C++ threads per
worker on the envpool path (default 1).

Multi-task: ``procgen:bigfish+fruitbot`` - worker i runs game i mod n, and
``info["task"]`` is that index; all games share the 15-action head.

gym3 -> gymnasium: a gym3 env is always mid-episode. ``act`` then
``observe()`` gives ``(reward, obs, first)``; ``first`` means that obs starts
a *new* episode (the env reset itself), so the reward belongs to the last
step of the episode that just ended. ``step`` therefore returns ``terminated
= first`` (ProcGen's time limits are not told apart from real ends) and, as
the observation, the new episode's first frame, which the following
``reset()`` returns again without stepping. The gym3 env is created at the
first ``reset``; its ``rand_seed`` is the seed given to ``make`` (or to
``reset(seed=...)``, which creates a fresh one).

Normalised scores (Cobbe et al. 2020; PAPERS.md §5): :data:`NORMALISATION`
and :func:`normalised_score`; memory-mode runs use the hard constants (as the
SRWM paper does).
"""

from __future__ import annotations

import contextlib
import io
import warnings
from typing import Any

import gymnasium as gym
import numpy as np

from fwrl.envs.procgen_vector import EnvpoolProcgen, import_envpool_procgen
from fwrl.envs.registry import EnvFamily, EnvInfo, register_family
from fwrl.envs.spec import EnvSpec, Option
from fwrl.envs.vector_paths import check_threads, library_problem, resolve_path, threads_option, vector_option
from fwrl.errors import FwrlError, install_command, unknown_choice

GAMES = (
    "bigfish", "bossfight", "caveflyer", "chaser", "climber", "coinrun", "dodgeball",
    "fruitbot", "heist", "jumper", "leaper", "maze", "miner", "ninja", "plunder", "starpilot",
)  # fmt: skip
DISTRIBUTIONS = ("easy", "hard", "extreme", "memory", "exploration")
# games that support a distribution mode other than easy / hard (others abort the process)
MODE_GAMES = {
    "extreme": ("chaser", "dodgeball", "leaper", "starpilot"),
    "memory": ("caveflyer", "dodgeball", "heist", "jumper", "maze", "miner"),
    "exploration": ("caveflyer", "climber", "coinrun", "heist", "jumper", "leaper", "maze", "ninja"),
}
NUM_ACTIONS = 15
OBS_SHAPE = (3, 64, 64)
MAX_SEED = 2**31 - 1
VECTOR_LIBRARIES = ("envpool",)

# (R_min, R_max) per game and distribution (Cobbe et al. 2020, PAPERS.md §5)
NORMALISATION: dict[str, dict[str, tuple[float, float]]] = {
    "bigfish": {"easy": (1.0, 40.0), "hard": (0.0, 40.0)},
    "bossfight": {"easy": (0.5, 13.0), "hard": (0.5, 13.0)},
    "caveflyer": {"easy": (3.5, 12.0), "hard": (2.0, 13.4)},
    "chaser": {"easy": (0.5, 13.0), "hard": (0.5, 14.2)},
    "climber": {"easy": (2.0, 12.6), "hard": (1.0, 12.6)},
    "coinrun": {"easy": (5.0, 10.0), "hard": (5.0, 10.0)},
    "dodgeball": {"easy": (1.5, 19.0), "hard": (1.5, 19.0)},
    "fruitbot": {"easy": (-1.5, 32.4), "hard": (-0.5, 27.2)},
    "heist": {"easy": (3.5, 10.0), "hard": (2.0, 10.0)},
    "jumper": {"easy": (1.0, 10.0), "hard": (1.0, 10.0)},
    "leaper": {"easy": (1.5, 10.0), "hard": (1.5, 10.0)},
    "maze": {"easy": (5.0, 10.0), "hard": (4.0, 10.0)},
    "miner": {"easy": (1.5, 13.0), "hard": (1.5, 20.0)},
    "ninja": {"easy": (3.5, 10.0), "hard": (2.0, 10.0)},
    "plunder": {"easy": (4.5, 30.0), "hard": (3.0, 30.0)},
    "starpilot": {"easy": (2.5, 64.0), "hard": (1.5, 35.0)},
}
# distribution mode -> which constants normalise it
NORMALISATION_TABLE_FOR = {"easy": "easy", "hard": "hard", "memory": "hard"}


def normalised_score(game: str, distribution: str, score: float) -> float:
    """``(R - R_min) / (R_max - R_min)`` with the constants of ``game`` / ``distribution``.

    ``memory`` uses the hard constants; extreme and exploration have no
    published constants and are refused.
    """
    if game not in NORMALISATION:
        raise unknown_choice("procgen game", game, NORMALISATION)
    if distribution not in NORMALISATION_TABLE_FOR:
        raise FwrlError(
            f"no normalisation constants for procgen distribution {distribution!r}; "
            f"they exist for: {', '.join(NORMALISATION_TABLE_FOR)}."
        )
    r_min, r_max = NORMALISATION[game][NORMALISATION_TABLE_FOR[distribution]]
    return (float(score) - r_min) / (r_max - r_min)


def _import_procgen():
    """Import procgen with legacy gym's deprecation notice and warnings swallowed."""
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        try:
            import procgen
        except ImportError:
            raise FwrlError(
                "ProcGen envs need the Python module 'procgen' (the procgen2 wheel), which is not "
                f"installed. Install it with: {install_command('procgen')} && pip install --no-deps procgen2 gym3 "
                "(procgen2 and gym3 pin numpy<2 in their metadata but run on numpy 2)."
            ) from None
    return procgen


def check_combination(game: str, opts: dict[str, Any], given: set[str]) -> None:
    """Refuse option combinations the C++ library would abort the process on."""
    mode = opts["distribution"]
    if mode in MODE_GAMES and game not in MODE_GAMES[mode]:
        raise FwrlError(
            f"procgen game {game!r} has no {mode!r} distribution mode; {mode} mode exists "
            f"only for: {', '.join(MODE_GAMES[mode])}."
        )
    if mode == "exploration":
        fixed = sorted(given & {"num_levels", "start_level"})
        if fixed:
            raise FwrlError(
                f"procgen exploration mode fixes its own single level; remove "
                f"{' and '.join(fixed)} from the env spec."
            )
    for key in ("num_levels", "start_level"):
        if opts[key] < 0:
            raise FwrlError(f"procgen option {key} must be >= 0, got {opts[key]}.")
    if opts["start_level"] + opts["num_levels"] > MAX_SEED:
        raise FwrlError(
            f"procgen start_level + num_levels must be <= {MAX_SEED} (level seeds are int32), "
            f"got {opts['start_level']} + {opts['num_levels']}."
        )


class ProcgenEnv(gym.Env):
    """One ProcGen game as a gymnasium env (gym3 ``ProcgenGym3Env`` with ``num=1``)."""

    metadata: dict = {"render_modes": []}

    def __init__(self, game: str, options: dict[str, Any], seed: int, task: int = 0):
        self.game = game
        self.task = task
        self.observation_space = gym.spaces.Box(0, 255, OBS_SHAPE, np.uint8)
        self.action_space = gym.spaces.Discrete(NUM_ACTIONS)
        self.action_space.seed(seed)
        self._options = dict(options)
        self._seed = int(seed) % MAX_SEED
        self._gym3 = None
        self._pending: np.ndarray | None = None  # first frame of the next episode

    def _kwargs(self) -> dict[str, Any]:
        o = self._options
        kwargs = {
            "num": 1,
            "env_name": self.game,
            "distribution_mode": o["distribution"],
            "rand_seed": self._seed,
            "num_threads": 0,
            "use_sequential_levels": o["use_sequential_levels"],
            "use_backgrounds": o["use_backgrounds"],
            "use_monochrome_assets": o["use_monochrome_assets"],
            "restrict_themes": o["restrict_themes"],
            "center_agent": o["center_agent"],
            "paint_vel_info": o["paint_vel_info"],
            "use_generated_assets": o["use_generated_assets"],
        }
        if o["distribution"] != "exploration":
            kwargs["num_levels"] = o["num_levels"]
            kwargs["start_level"] = o["start_level"]
        return kwargs

    def _create(self) -> None:
        procgen = _import_procgen()
        self.close()
        self._gym3 = procgen.ProcgenGym3Env(**self._kwargs())
        _, ob, _ = self._gym3.observe()
        self._pending = self._frame(ob)

    @staticmethod
    def _frame(ob: dict) -> np.ndarray:
        return np.ascontiguousarray(ob["rgb"][0].transpose(2, 0, 1))

    def _info(self) -> dict[str, Any]:
        info = {"task": self.task}
        raw = self._gym3.get_info()[0]
        for key in ("level_seed", "prev_level_seed", "prev_level_complete"):
            if key in raw:
                info[key] = int(raw[key])
        return info

    def reset(self, *, seed: int | None = None, options=None):
        if seed is not None:
            self._seed = int(seed) % MAX_SEED
            self.action_space.seed(seed)
            self._gym3 = None
        if self._gym3 is None:
            self._create()
        if self._pending is None:
            raise RuntimeError(
                "ProcgenEnv.reset() mid-episode: gym3 envs cannot be reset before an episode "
                "ends; call reset(seed=...) to start a fresh env."
            )
        obs, self._pending = self._pending, None
        return obs, self._info()

    def step(self, action):
        if self._gym3 is None or self._pending is not None:
            raise RuntimeError("ProcgenEnv.step() called before reset()")
        self._gym3.act(np.array([int(action)], dtype=np.int32))
        reward, ob, first = self._gym3.observe()
        obs = self._frame(ob)
        info = self._info()
        terminated = bool(first[0])
        if terminated:
            self._pending = obs
            info["game_over"] = True
            info["level_complete"] = bool(info.get("prev_level_complete", 0))
        return obs, float(reward[0]), terminated, False, info

    def close(self):
        if self._gym3 is not None:
            self._gym3 = None


class ProcgenFamily(EnvFamily):
    name = "procgen"
    game_names = GAMES
    multi_task = True
    options = {
        "distribution": Option(str, "easy", "level distribution mode", DISTRIBUTIONS),
        "num_levels": Option(int, 0, "number of levels (0: unlimited)"),
        "start_level": Option(int, 0, "seed of the first level"),
        "use_sequential_levels": Option(bool, False, "go to the next level when one ends"),
        "use_backgrounds": Option(bool, True, "draw backgrounds"),
        "use_monochrome_assets": Option(bool, False, "monochrome rectangles instead of sprites"),
        "restrict_themes": Option(bool, False, "one theme per asset type"),
        "center_agent": Option(bool, True, "centre the view on the agent"),
        "paint_vel_info": Option(bool, False, "paint the agent's velocity in the corner"),
        "use_generated_assets": Option(bool, False, "procedurally generated assets"),
        "vector": vector_option(VECTOR_LIBRARIES),
        "threads": threads_option(),
    }

    def validate(self, spec: EnvSpec) -> dict[str, Any]:
        opts = super().validate(spec)
        for game in spec.names:
            check_combination(game, opts, set(spec.options))
        check_threads(opts["threads"], spec.text)
        opts["vector"] = resolve_path(opts["vector"], VECTOR_LIBRARIES,
                                      lambda library: library_problem(import_envpool_procgen))
        return opts

    def check_installed(self, spec: EnvSpec) -> None:
        if self.validate(spec)["vector"] == "none":  # envpool (explicit or auto) was checked by validate
            _import_procgen()

    def make_vector(self, spec: EnvSpec, *, worker_index: int, seeds, mode: str = "train"):
        """The K envs of a worker on EnvPool (``vector=envpool``), or None for the procgen2 chain."""
        opts = self.validate(spec)
        if opts["vector"] == "none":
            return None
        return EnvpoolProcgen(spec.name_for_worker(worker_index), opts, seeds, opts["threads"])

    def make(self, spec: EnvSpec, *, worker_index: int, seed: int, mode: str = "train"):
        opts = self.validate(spec)
        _import_procgen()  # fail early with the install hint
        task = worker_index % spec.num_tasks
        return ProcgenEnv(spec.name_for_worker(worker_index), opts, seed, task)

    def describe(self, spec: EnvSpec) -> EnvInfo:
        self.validate(spec)
        return EnvInfo(OBS_SHAPE, "uint8", NUM_ACTIONS, tuple(spec.names))


register_family(ProcgenFamily())
