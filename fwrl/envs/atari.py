"""Atari 2600 games (``atari:<Game>``) with the torchbeast / IMPALA protocol.

``atari:Pong`` makes ``ALE/Pong-v5`` (Bellemare et al. 2013, ale_py) with
``frameskip=1`` and ``repeat_action_probability=0``, the minimal action set,
and the wrappers of :mod:`fwrl.envs.wrappers`: noop reset (up to 30), skip 4
with max over the last two frames, episodic life in train mode, fire on
reset for games with FIRE, 84x84 greyscale, stack 4 -> ``(4, 84, 84)``
uint8 (PAPERS.md §5; Espeholt et al. 2018; Mnih et al. 2015).

Options:

- ``sticky=true``: sticky actions, ``repeat_action_probability=0.25``
  (Machado et al. 2018; the RFWP paper, Irie et al. 2021, mentions them);
- ``full_action_space=true``: all 18 actions instead of the minimal set;
- ``vector=auto|ale|envpool|none``: how each env worker steps its K envs
  (:mod:`fwrl.envs.vector_paths`): ``ale`` (ale_py's C++ vector env) or
  ``envpool`` in C++ threads (:mod:`fwrl.envs.atari_vector`, which lists where
  they differ from the Python chain), ``none`` the Python chain below, ``auto``
  (default) ale, then envpool, where installed, else none. ``ale`` is first:
  it stepped Pong with less CPU per env step than envpool on the 2-core
  development machine (``benchmarks/results/atari_vector.md``), needs nothing
  beyond the ``atari`` extra, and runs the Python chain's own emulator and ROMs;
- ``threads=N``: C++ threads per worker on the vector paths (default 1);
- ``max_frames=N``: the frame cap (default 108 000), e.g. small for tests.

In ``mode="test"`` there is no episodic life: an episode is a full game (the
evaluation protocol). Episodes are capped by ALE's 108 000 frames (``max_frames``). Rewards are
not clipped here (the learner clips them).

Episode ends (torchbeast protocol): a life loss (train mode) and the frame cap
both end the training episode (``done``: the core resets). A life loss is a
*termination* (``terminated=True``, ``info["game_over"] = False``: the game
goes on after the reset); the 108 000-frame cap is a *truncation*
(``truncated=True``, ``info["game_over"] = True``: the game was cut, not
lost), so workers report it as ``truncated`` with its ``final_obs``.
"""

from __future__ import annotations

import difflib
import warnings
from functools import lru_cache
from typing import Any

import gymnasium as gym

from fwrl.envs.atari_vector import AleVectorAtari, AtariVectorSettings, EnvpoolAtari, import_ale_vector
from fwrl.envs.registry import EnvFamily, register_family
from fwrl.envs.spec import EnvSpec, Option
from fwrl.envs.vector_paths import (check_threads, import_envpool, library_problem, resolve_path, threads_option,
                                    vector_option)
from fwrl.envs.wrappers import AtariPreprocess, EpisodicLife, FireReset, SeedOnFirstReset
from fwrl.errors import FwrlError, missing_dependency

STICKY_PROBABILITY = 0.25
NOOP_MAX = 30
FRAME_SKIP = 4
FRAME_SIZE = 84
FRAME_STACK = 4
MAX_FRAMES = 108_000
MODES = ("train", "test")
VECTOR_LIBRARIES = ("ale", "envpool")  # the order vector=auto tries them in (see the module docstring)
VECTOR_CLASSES = {"ale": AleVectorAtari, "envpool": EnvpoolAtari}


def _import_ale():
    """Import ale_py quietly (no banner) and register its gymnasium envs."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import ale_py
    except ImportError:
        raise missing_dependency("ale_py", "atari", "Atari envs") from None
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
    gym.register_envs(ale_py)
    return ale_py


@lru_cache(maxsize=1)
def atari_games() -> tuple[str, ...]:
    """Names ``X`` of the registered ``ALE/X-v5`` envs (e.g. Pong, SpaceInvaders)."""
    _import_ale()
    names = [
        env_id[len("ALE/") : -len("-v5")]
        for env_id in gym.registry
        if env_id.startswith("ALE/") and env_id.endswith("-v5")
    ]
    return tuple(sorted(names))


class AtariFamily(EnvFamily):
    name = "atari"
    options = {
        "sticky": Option(bool, False, "sticky actions (repeat_action_probability=0.25)"),
        "full_action_space": Option(bool, False, "use all 18 actions, not the minimal set"),
        "vector": vector_option(VECTOR_LIBRARIES),
        "threads": threads_option(),
        "max_frames": Option(int, MAX_FRAMES, "frame cap of an episode (a truncation)"),
    }

    def validate(self, spec: EnvSpec) -> dict[str, Any]:
        opts = super().validate(spec)
        check_threads(opts["threads"], spec.text)
        if opts["max_frames"] < FRAME_SKIP:
            raise FwrlError(f"env option max_frames={opts['max_frames']} in {spec.text!r} must be >= {FRAME_SKIP} "
                            "(one agent step).")
        games = atari_games()
        for game in spec.names:
            if game not in games:
                close = difflib.get_close_matches(game, games, n=3, cutoff=0.5)
                close += [g for g in games if g.lower() == game.lower() and g not in close]
                hint = f" Did you mean {', '.join(close)}?" if close else ""
                raise FwrlError(
                    f"unknown atari game {game!r}.{hint} The {len(games)} games are the <Game> of ale_py's "
                    f"ALE/<Game>-v5 ids (gymnasium.pprint_registry() lists them once ale_py is imported)."
                )
        opts["vector"] = vector_path(opts["vector"])
        return opts

    def check_installed(self, spec: EnvSpec) -> None:
        _import_ale()  # the game list of validate is cached: import it again here
        self.validate(spec)  # an explicit vector=envpool is checked there

    def make(self, spec: EnvSpec, *, worker_index: int, seed: int, mode: str = "train"):
        if mode not in MODES:
            raise FwrlError(f"unknown env mode {mode!r}; valid choices: {', '.join(MODES)}.")
        opts = self.validate(spec)
        game = spec.name_for_worker(worker_index)
        env = gym.make(
            f"ALE/{game}-v5",
            frameskip=1,
            repeat_action_probability=STICKY_PROBABILITY if opts["sticky"] else 0.0,
            full_action_space=opts["full_action_space"],
            max_num_frames_per_episode=opts["max_frames"],
        )
        env = AtariPreprocess(env, noop_max=NOOP_MAX, skip=FRAME_SKIP, size=FRAME_SIZE)
        if mode == "train":
            env = EpisodicLife(env)
        if FireReset.needed(env):
            env = FireReset(env)
        env = gym.wrappers.FrameStackObservation(env, FRAME_STACK)
        return SeedOnFirstReset(env, seed)

    def make_vector(self, spec: EnvSpec, *, worker_index: int, seeds, mode: str = "train"):
        """The K envs of a worker stepped in C++ threads (``vector=ale|envpool``), or None for ``none``."""
        if mode not in MODES:
            raise FwrlError(f"unknown env mode {mode!r}; valid choices: {', '.join(MODES)}.")
        opts = self.validate(spec)
        if opts["vector"] == "none":
            return None
        settings = AtariVectorSettings(
            game=spec.name_for_worker(worker_index), rom=rom_id(spec.name_for_worker(worker_index)),
            episodic_life=mode == "train", sticky=STICKY_PROBABILITY if opts["sticky"] else 0.0,
            full_action_space=opts["full_action_space"], max_frames=opts["max_frames"], threads=opts["threads"],
            noop_max=NOOP_MAX, skip=FRAME_SKIP, size=FRAME_SIZE, stack=FRAME_STACK)
        return VECTOR_CLASSES[opts["vector"]](settings, seeds)


def rom_id(game: str) -> str:
    """ale_py's ROM id of an ``ALE/<game>-v5`` env (``MsPacman`` -> ``ms_pacman``)."""
    _import_ale()
    return str(gym.spec(f"ALE/{game}-v5").kwargs["game"])


def vector_library_problem(library: str) -> str | None:
    """Why ``library`` cannot step Atari envs here (None: it can)."""
    importer = {"ale": import_ale_vector, "envpool": lambda: import_envpool("atari envs with vector=envpool")}
    return library_problem(importer[library])


def vector_path(requested: str) -> str:
    """The path ``vector=requested`` runs here: ale, envpool or none (see the module docstring)."""
    return resolve_path(requested, VECTOR_LIBRARIES, vector_library_problem)


register_family(AtariFamily())
