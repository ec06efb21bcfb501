"""Checks of a training config that need the env, the model or the machine, made before
any process starts or any file is written (``fwrl train``, ``fwrl bench throughput``, the
local executor of ``fwrl sweep``; :func:`check_workers_runnable` for ``fwrl evaluate`` and
``fwrl bench envs``). Heavy libraries (torch) are imported only once the cheap checks passed."""

from __future__ import annotations

import importlib.util
import os
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
    ``inference_graph`` has a CUDA device (``acting_trace=on`` the CPU).
    """
    check_workers_runnable(config.env, config.backend, config.env_wrappers)
    from fwrl.agents.stem_shapes import check_stem
    from fwrl.envs.registry import describe_env

    info = describe_env(config.env, wrappers=tuple(config.env_wrappers))
    check_stem(config.stem, info.obs_shape, config.env)  # before torch: one line naming the stems that fit
    import torch

    from fwrl.agents.inference_graph import acting_graph
    from fwrl.agents.traced_core import traced_acting
    from fwrl.runner.agent import build_model, pick_device

    check_threads(config.num_threads)
    device = pick_device(config.device)
    acting_graph(config.inference_graph, device, 1)  # inference_graph=true needs a CUDA device
    check_device_settings(config, device, learner_ranks(config))
    with torch.device("meta"):
        model = build_model(config, info)
    traced_acting(config.acting_trace, device, model.core)  # acting_trace=on needs the CPU
    check_memory(config, info, model.initial_state(1, "meta"), device, model_bytes(model))
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


def check_device_settings(config: TrainConfig, device, ranks: int) -> None:
    """Settings that need a CUDA device (``dist_backend=nccl``, ``acting_priority=high``) and the update
    process's one rank, refused in one line before any rank or file is made (in a rank they end in
    torch's tracebacks, once per rank)."""
    if config.dist_backend == "nccl" and device.type != "cuda":
        raise FwrlError(f"setting dist_backend='nccl' sums the learner ranks' gradients on CUDA devices (one per "
                        f"rank); this run's device is {device}: use dist_backend auto or gloo.")
    if config.dist_backend == "nccl" and ranks > 1:
        import torch

        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", ranks))
        if per_node > torch.cuda.device_count():
            raise FwrlError(f"setting dist_backend='nccl' needs a GPU of its own for each learner rank; {per_node} "
                            f"ranks here share {torch.cuda.device_count()} GPU(s): use dist_backend auto (gloo "
                            "there) or gloo, or fewer learners.")
    if config.acting_priority == "high" and device.type != "cuda":
        raise FwrlError(f"setting acting_priority='high' gives the acting CUDA streams priority over the learner's; "
                        f"this run's device is {device}, which has none: use acting_priority normal.")
    if config.learner_process == "on" and ranks > 1:
        raise FwrlError(f"setting learner_process='on' serves one learner rank; this run has {ranks} (their all-reduce "
                        "runs inside the update): use learner_process auto (off there) or off.")


def allowed_cores() -> int:
    """Cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def check_threads(num_threads: int, setting: str = "num_threads") -> None:
    """``num_threads`` torch threads fit the cores this process may run on: more only take turns on them
    (``--num-threads 10000`` on 2 cores: a load of ~500, the first update after minutes)."""
    cores = allowed_cores()
    if num_threads > cores:
        raise FwrlError(f"setting {setting}={num_threads} is more torch threads than the {cores} core(s) this "
                        f"process may run on (more only take turns on them); use 1..{cores}, or 0: the cores less "
                        "one per local env worker.")


# copies of the model's weights a learner rank holds: the weights, their gradients, RMSProp's square average
# and the acting copy (momentum adds its buffer)
MODEL_COPIES = 4


def model_bytes(model) -> int:
    """The bytes of a model's parameters and buffers (a model on the meta device allocates none)."""
    return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))


def check_model_memory(config: TrainConfig, info: "EnvInfo", copies: int = 1, what: str = "this model") -> None:
    """Refuse, in one line, a model whose weights alone (``copies`` of them) need more memory than is free here
    (or than this process's address-space limit leaves it): built on the meta device, nothing allocated.
    ``fwrl info`` builds the model for real; ``--core-opt hidden_size=100000000`` would ask for 100s of GB."""
    import torch

    from fwrl.runner.agent import build_model

    with torch.device("meta"):
        need = model_bytes(build_model(config, info)) * copies
    for free, where in ((available_memory(), "memory"), (address_space_left(), ADDRESS_SPACE)):
        if free is not None and need > free:
            raise FwrlError(f"{what} needs {_size(need)} of {where} for its weights ({_options_text(config)}), more "
                            f"than the {_size(free)} free here: lower those settings.")


def _options_text(config: TrainConfig) -> str:
    options = ", ".join(f"{k}={v}" for k, v in config.core_options.items()
                        if k in ("hidden_size", "num_layers", "num_heads", "head_dim", "ff_dim"))
    return f"core {config.core}" + (f", {options}" if options else "")


ADDRESS_SPACE = "address space (its limit: ulimit -v, prlimit --as)"


def address_space_left() -> int | None:
    """Bytes this process may still map under its address-space limit (``RLIMIT_AS``: ``ulimit -v``,
    ``prlimit --as``), None where there is no limit (or it cannot be read)."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft == resource.RLIM_INFINITY or soft < 0:
            return None
        with open("/proc/self/status") as status:
            size = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
    except (ImportError, OSError, ValueError, StopIteration):
        return None
    return max(0, soft - size)


# A local env worker process at least: a spawned Python with numpy, gymnasium and its env library
# (resident set measured here: Pong 70 MB, MinAtar 180 MB).
WORKER_BYTES = 60 * 2**20


def available_memory() -> int | None:
    """Bytes the system can still give this run (Linux: MemAvailable), None where unknown."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def memory_estimate(config: TrainConfig, info: "EnvInfo", state_template: dict, weights: int = 0) -> dict[str, int]:
    """A lower bound of the bytes ``config`` allocates, by part: every learner rank's rollout store and
    gathered batch (``fwrl.agents.rollouts``: the store's own formula), its copies of the model's weights
    (``weights`` bytes each: :data:`MODEL_COPIES`) and the local env workers."""
    from fwrl.agents.distributed import Ranks, share
    from fwrl.agents.rollouts import RolloutSpec, queue_size, step_bytes, store_bytes, store_capacity
    from fwrl.envs.step_record import StepRecord

    ranks = learner_ranks(config)
    record = StepRecord.of(info.obs_shape, info.obs_dtype, info.extra_size)
    store = batch = 0
    for rank in range(ranks):
        pool = config.pool_settings(share(config.num_workers, Ranks(rank, ranks)))
        spec = RolloutSpec(config.unroll_length, pool.envs_per_worker, record, info.num_actions, info.action_dims)
        capacity = store_capacity(pool.num_workers, pool.envs_per_worker, config.batch_size,
                                  queue_size(config.batch_size, pool.envs_per_worker))
        store += store_bytes(spec, capacity, state_template)
        row, state = step_bytes(spec, state_template)
        batch += config.batch_size * ((config.unroll_length + 1) * row + state)
    copies = MODEL_COPIES + (1 if config.rmsprop_momentum > 0 else 0)
    return {"rollout store": store, "learner batch": batch, "model weights": ranks * copies * weights,
            "env worker processes": config.num_workers * WORKER_BYTES if config.backend == "local" else 0}


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"


def check_memory(config: TrainConfig, info: "EnvInfo", state_template: dict, device, weights: int = 0) -> None:
    """Refuse, in one line and before anything is written, a run whose rollout store, batch, model weights
    (``weights`` bytes, each copy a learner rank holds) and env workers alone (:func:`memory_estimate`) need
    more memory than this machine has free (on a CUDA device, the store, batch and weights against the
    device's free memory; on the CPU also the learner's part against its address-space limit)."""
    parts = memory_estimate(config, info, state_template, weights)
    learner = ("rollout store", "learner batch", "model weights")
    on_device = sum(parts[name] for name in learner)
    checks = []
    if device.type == "cuda":
        import torch

        free, _ = torch.cuda.mem_get_info(device)
        checks.append((on_device, free, f"memory of {device}", learner))
        checks.append((parts["env worker processes"], available_memory(), "memory", ("env worker processes",)))
    else:
        checks.append((sum(parts.values()), available_memory(), "memory", tuple(parts)))
        ranks = learner_ranks(config)  # each rank a process of its own, under its own limit
        checks.append((on_device // max(1, ranks), address_space_left(), ADDRESS_SPACE, learner))
    for need, free, where, names in checks:
        if free is None or need <= free:
            continue
        detail = ", ".join(f"{name} {_size(parts[name])}" for name in names if parts[name])
        raise FwrlError(
            f"this run needs at least {_size(need)} of {where} ({detail}; batch_size={config.batch_size}, "
            f"unroll_length={config.unroll_length}, num_workers={config.num_workers}, "
            f"envs_per_worker={config.envs_per_worker}"
            + (f", {_options_text(config)}" if parts["model weights"] else "")
            + f"), more than the {_size(free)} free here: lower those settings."
        )

