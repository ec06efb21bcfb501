"""Checks of a training config that need the env, the model or the machine, made before
any process starts or any file is written (``fwrl train``, ``fwrl bench throughput``, the
local executor of ``fwrl sweep``; :func:`check_workers_runnable` for ``fwrl evaluate`` and
``fwrl bench envs``). Heavy libraries (torch) are imported only once the cheap checks passed."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from fwrl.envs.spec import parse_env_spec
from fwrl.errors import FwrlError, missing_dependency
from fwrl.settings.config import TrainConfig

if TYPE_CHECKING:
    from fwrl.envs.registry import EnvInfo


def check_workers_runnable(env: str, backend: str, wrappers: Sequence[str] = ()) -> None:
    """Raise FwrlError when env workers of ``backend`` could not run ``env`` here: a bad spec,
    a library its family needs that is not installed (naming the extra: ``atari`` for ale-py,
    ``procgen``, ``minatar``, ``envpool`` where ``vector=envpool`` asks for it, DMLab's
    container recipe, the module of ``gym:<module>:<id>``), Ray for ``--backend ray``, and
    user env wrappers that cannot be imported."""
    from fwrl.envs.registry import check_installed

    check_installed(env)
    if backend == "ray" and importlib.util.find_spec("ray") is None:
        raise missing_dependency("ray", "ray", "--backend ray")
    if wrappers:
        from fwrl.envs.user_wrappers import load_wrapper

        for wrapper in wrappers:
            load_wrapper(wrapper)


def learner_ranks(config: TrainConfig) -> int:
    """The learner ranks of this run: the launcher's (torchrun, SLURM) where it set them, else ``learners``."""
    from fwrl.agents.distributed import ranks_from_env

    ranks = ranks_from_env()
    return ranks.world_size if ranks.distributed else config.learners


def check_runnable(config: TrainConfig, resume: bool = False) -> "EnvInfo":
    """Raise FwrlError for anything that would stop ``config`` from training here; return the env's info.

    Checks the env (family, games, options, its optional dependency; first, before
    torch is imported: :func:`check_workers_runnable`), the
    device, that the stem fits the observations (before torch is imported,
    :func:`fwrl.agents.stem_shapes.check_stem`) and the core builds for
    them (on the meta device: nothing is allocated), the worker count of a
    multi-task env, ``load_vision_from`` (read only by a new run, not on
    ``resume``), the Ray backend's dependency, user env wrappers (importable, callable) and that
    ``inference_graph`` has a CUDA device.
    """
    check_workers_runnable(config.env, config.backend, config.env_wrappers)
    from fwrl.agents.stem_shapes import check_stem
    from fwrl.envs.registry import describe_env

    info = describe_env(config.env, wrappers=tuple(config.env_wrappers))
    check_stem(config.stem, info.obs_shape, config.env)  # before torch: one line naming the stems that fit
    import torch

    from fwrl.runner.agent import build_model, pick_device

    device = pick_device(config.device)
    if config.inference_graph and device.type != "cuda":
        raise FwrlError(f"setting inference_graph=true replays CUDA graphs and needs a CUDA device; device "
                        f"{config.device!r} is {device} here.")
    with torch.device("meta"):
        build_model(config, info)
    games = parse_env_spec(config.env).num_tasks
    if config.num_workers < games:
        raise FwrlError(f"env {config.env!r} has {games} games and worker i runs game i mod {games}, so "
                        f"num_workers must be at least {games}; got num_workers={config.num_workers}.")
    ranks = learner_ranks(config)
    if config.num_workers // ranks < games:
        raise FwrlError(f"setting num_workers={config.num_workers} is shared by {ranks} learner ranks, and each "
                        f"needs at least {games} worker(s) (one per game of {config.env!r}); use num_workers >= "
                        f"{ranks * games} or fewer learners.")
    if config.load_vision_from and not resume and not Path(config.load_vision_from).is_file():
        raise FwrlError(f"setting load_vision_from={config.load_vision_from!r}: no such checkpoint file.")
    return info
