"""A training run, built and not yet started: :func:`build_run` makes every part from the config.

The data path it builds (``ARCHITECTURE.md``): env workers (``pool``) -> the acting thread's
batched forward with the acting copy of the weights (``acting_model``, ``weights``) -> the
device rollout store (``store``) -> the rollout queue (``rollouts``) -> the learner (``learner``)
-> the weights it publishes back to the acting copy. A resumed run restores the weights, the
optimiser, the learning-rate schedule, the RNG state and the counters of its checkpoint.

Only :func:`fwrl.runner.train.train` reads a :class:`Run`: it hands each part of the runner its
own collaborators (``ARCHITECTURE.md``, the runner's parts), never the run.
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fwrl.agents.checkpoint import checkpoint_payload, load_checkpoint, load_model_weights, set_rng_state
from fwrl.agents.distributed import LearnerGroup, Ranks, rank_device, ranks_from_env, share
from fwrl.agents.inference import InferenceLoop
from fwrl.agents.inference_graph import acting_graph
from fwrl.agents.learner import Learner
from fwrl.agents.learner_process import UpdateProcess
from fwrl.agents.model import AgentNet
from fwrl.agents.optim import linear_decay_scheduler, make_optimizer
from fwrl.agents.policy_weights import DeviceStreams, PolicyWeights, acting_copy
from fwrl.agents.rollout_queue import RolloutQueue
from fwrl.agents.traced_core import traced_acting
from fwrl.agents.rollouts import RolloutSpec, RolloutStore, queue_size, store_capacity
from fwrl.agents.stage_timer import StageTimer
from fwrl.envs.backends import make_pool
from fwrl.envs.registry import EnvInfo, describe_env
from fwrl.envs.step_record import StepRecord
from fwrl.envs.worker_pool import StepSource, WorkerPool
from fwrl.errors import FwrlError, unknown_choice
from fwrl.runner.agent import build_model, pick_device, resolve_core_options
from fwrl.runner.budget import Budget
from fwrl.runner.counters import Counters
from fwrl.runner.run_metrics import Episodes, normaliser
from fwrl.runner.rundir import foreign_checkpoint, new_run_id, read_run_id, run_identity, write_run_id
from fwrl.runner.stopping import Clock
from fwrl.settings.config import TrainConfig, changed_settings, save_config, saved_settings
from fwrl.utils.allocator import keep_freed_memory

# the counters a resumed run continues (a checkpoint's "progress"), and their start
# (metrics_rows: the rows of metrics.csv written when the checkpoint was taken; -1: not recorded)
PROGRESS = {"elapsed_seconds": 0.0, "episodes": 0, "acted_steps": 0, "metrics_rows": -1}


@dataclass
class Run:
    """Every part of one learner rank's training run (module docstring), and what it resumed from."""

    config: TrainConfig
    run_dir: Path
    ranks: Ranks
    device: torch.device
    info: EnvInfo
    group: LearnerGroup | None
    model: AgentNet
    optimizer: torch.optim.Optimizer
    scheduler: Any
    budget: Budget  # the step budget: agent steps of one update, all ranks' columns counted
    streams: DeviceStreams
    weights: PolicyWeights
    acting_model: AgentNet
    rollouts: RolloutQueue
    store: RolloutStore
    learner: Learner
    actor_timers: tuple[StageTimer, ...]  # one per acting thread
    inference_graph: bool  # the acting forward replays CUDA graphs (acting_graph)
    acting_trace: bool  # the core's acting step runs from TorchScript traces (traced_acting)
    learner_timer: StageTimer
    episodes: Episodes
    pool: WorkerPool
    clock: Clock
    counters: Counters  # the parts' counters, from the checkpoint's on a resume
    resumed: dict[str, Any] = field(default_factory=dict)  # the checkpoint's counters (PROGRESS), or the start's
    run_id: str | None = None  # the run's identity (run.json; rank 0's checkpoints carry it)
    update_lock: threading.Lock = field(default_factory=threading.Lock)  # held by the learner for a whole update
    copy_seconds: float = 0.0  # how long the last snapshot's copy took (a time limit keeps it back)

    @property
    def main(self) -> bool:
        """Rank 0 writes the run folder: checkpoints, metrics, the panel."""
        return self.ranks.is_main

    def inference_loop(self, source: StepSource, timer: StageTimer) -> InferenceLoop:
        """One acting thread's loop over ``source`` (a slice of the pool) with its stage timer."""
        return InferenceLoop(self.acting_model, source, self.store, self.device, weights=self.weights, timer=timer,
                             graph=self.inference_graph, trace=self.acting_trace,
                             batch_wait=self.config.acting_batch_wait, staging=self.config.acting_staging)

    def snapshot(self, acted_steps: int, metrics_rows: int = -1) -> dict[str, Any]:
        """A checkpoint's contents, copied between two updates (the actors go on); ``metrics_rows``:
        the rows of metrics.csv written so far (a resume keeps those, drops later ones)."""
        with self.update_lock:
            began = time.monotonic()
            self.learner.sync()  # the optimiser and the schedule, from the update process where there is one
            if self.streams.learner is not None:  # the last update's work must be done before it is copied
                torch.cuda.current_stream(self.device).wait_stream(self.streams.learner)
            payload = checkpoint_payload(
                model=self.model, optimizer=self.optimizer, scheduler=self.scheduler,
                agent_steps=self.learner.stats.agent_steps, updates=self.learner.stats.updates,
                config=self.config.to_dict(), env_info=self.info.to_dict(),
                progress={"elapsed_seconds": self.clock.elapsed(), "episodes": self.episodes.count,
                          "acted_steps": int(acted_steps), "metrics_rows": int(metrics_rows)},
                run=run_identity(self.run_dir, self.run_id) if self.run_id else None)
            self.copy_seconds = time.monotonic() - began
            return payload


def allowed_cores() -> int:
    """Cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def learner_threads(config: TrainConfig) -> int:
    """torch threads for the learner process.

    ``num_threads`` > 0 is taken as given. Otherwise the learner takes every
    core it is allowed except a share left to local env workers (one core per
    worker, at most half of the cores), so actors are not starved.
    """
    return torch_threads(config.num_threads, config.num_workers, config.backend)


def torch_threads(num_threads: int, num_workers: int, backend: str) -> int:
    """torch threads for a process that runs the model beside ``num_workers`` env workers: ``num_threads``
    where > 0, else the allowed cores less one per local worker (at most half of them). torch's default
    (every core) oversubscribes the cores its own workers need: ``fwrl evaluate`` of a Pong checkpoint
    took 65-92 s for 500 agent steps on the 2-core machine beside a training run, 4 s with one thread."""
    if num_threads > 0:
        return num_threads
    cores = allowed_cores()
    reserved = min(num_workers, cores // 2) if backend == "local" else 0
    return max(1, cores - reserved)


def acting_threads(requested: int, num_workers: int) -> int:
    """Acting threads of one learner rank: ``requested`` where > 0 (at most one per env worker), else 1.

    One is the default on every device, because the acting path is mostly Python, which threads
    share through the GIL: on the CPU proxy (``benchmarks/results/acting_threads_proxy.md``) two
    threads made a compute-bound forward (nature stem, Pong frames) 2.03x as fast but an
    overhead-bound one (a tiny MLP: per-call costs, what a GPU's acting thread pays) 0.51x, each
    thread's half-size batches paying the per-call costs twice. The GPU suite's learner part
    measures two threads against one on the box (its ``x8`` rows) before any default changes."""
    if requested > num_workers:
        raise FwrlError(f"acting_threads={requested} is more than the {num_workers} env worker(s) of this "
                        f"learner rank: each acting thread serves its own workers; use 1..{num_workers} "
                        "(or 0 for the default, 1).")
    return requested if requested > 0 else 1


# ``learner_process`` auto: the least agent steps left, and the shortest time limit, for a run's update
# process to pay for its start (spawning it and importing torch there: 2-3 s on the 2-core machine)
UPDATE_PROCESS_MIN_STEPS = 100_000
UPDATE_PROCESS_MIN_SECONDS = 60.0


def update_process(requested: str, device: torch.device, world_size: int, steps_left: int,
                   max_seconds: float = 0.0, python_recurrence: bool = True) -> bool:
    """Whether the learner's update runs in a process of its own (``learner_process``;
    :mod:`fwrl.agents.learner_process`): "on" (one rank on the CPU or a CUDA device; refused on
    others and with several learner ranks, whose all-reduce runs inside the update), "off", or
    auto: on for one rank on the CPU with at
    least :data:`UPDATE_PROCESS_MIN_STEPS` agent steps left and no time limit (``max_seconds`` 0)
    shorter than :data:`UPDATE_PROCESS_MIN_SECONDS`, for a core that steps through the unroll in
    Python (``python_recurrence``, ``Core.python_recurrence``: every core but feedforward and lstm,
    whose recurrence runs in C++ with the GIL released; the gru steps in Python on the CPU).

    Why: on the CPU the acting thread and the learner thread share one GIL, and a fast-weight core's
    learner is a Python loop of small calls; in its own process the update's Python no longer takes
    turns with the acting step's. The side by side, on against off, per core and stem:
    ``benchmarks/results/cpu_cores/learner_process.md``. On a GPU the acting thread's kernel
    launches take turns with the learner's; auto stays off there until the GPU suite's learner part
    has timed it (its row ``rdn x8 graph update process``)."""
    if requested not in ("auto", "on", "off"):
        raise unknown_choice("learner_process", requested, ("auto", "on", "off"))
    if requested == "on":
        if device.type not in ("cpu", "cuda"):
            raise FwrlError(f"learner_process=on runs the learner's update on the CPU or a CUDA device; this run's "
                            f"device is {device}: use learner_process=auto (off there) or off.")
        if world_size > 1:
            raise FwrlError(f"learner_process=on serves one learner rank; this run has {world_size} (their all-reduce "
                            "runs inside the update): use learner_process=auto (off there) or off.")
        return True
    long = steps_left >= UPDATE_PROCESS_MIN_STEPS and not 0 < max_seconds < UPDATE_PROCESS_MIN_SECONDS
    return requested == "auto" and device.type == "cpu" and world_size == 1 and long and python_recurrence


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def load_vision(model: AgentNet, path: str) -> None:
    """R2AC protocol: take the stem from a (TBPTT-pretrained) checkpoint."""
    payload = load_checkpoint(Path(path))
    stem_state = {k[len("stem."):]: v for k, v in payload["model"].items() if k.startswith("stem.")}
    load_model_weights(model.stem, stem_state, f"{path} (vision stem)")


def freeze_vision(model: AgentNet) -> None:
    """Train the core and heads only (``--freeze-vision``)."""
    for p in model.stem.parameters():
        p.requires_grad_(False)


def build_run(config: TrainConfig, run_dir: Path, resume: bool = False, accept_config_edits: bool = False) -> Run:
    """Every part of this learner rank's run (nothing started: no worker, no thread). ``resume``
    continues the run in ``run_dir`` from its ``checkpoint.pt`` (written by any number of ranks);
    ``accept_config_edits``: on the settings of a config.yaml edited since (recorded), where it differs."""
    ranks = ranks_from_env()  # several learners: torchrun / SLURM / fwrl train --learners set these
    if ranks.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
    seed_everything(config.seed)  # the same initial weights on every rank (rank 0's are broadcast too)
    num_workers = share(config.num_workers, ranks)
    if num_workers < 1:
        raise FwrlError(f"setting num_workers={config.num_workers} leaves learner rank {ranks.rank} of "
                        f"{ranks.world_size} without an env worker; use num_workers >= {ranks.world_size}.")
    torch.set_num_threads(learner_threads(config.model_copy(update={"num_workers": num_workers})))
    keep_freed_memory()  # no page faults for each step's tensors on the CPU (fwrl.utils.allocator)
    device = rank_device(pick_device(config.device), ranks)
    threads = acting_threads(config.acting_threads, num_workers)
    graph = acting_graph(config.inference_graph, device, threads)  # before any work: it may refuse the device
    info = describe_env(config.env, wrappers=tuple(config.env_wrappers))
    config = resolve_core_options(config, info)  # the run records the output_scale and head_init it trains with
    group = LearnerGroup(ranks, device, config.dist_timeout, config.dist_backend) if ranks.distributed else None

    model = build_model(config, info).to(device)
    optimizer = make_optimizer(model.parameters(), lr=config.learning_rate, alpha=config.rmsprop_alpha,
                               eps=config.rmsprop_eps, momentum=config.rmsprop_momentum,
                               bias_correction=config.rmsprop_bias_correction)
    budget = Budget.of(config, ranks.world_size)  # the schedule counts every rank
    scheduler = linear_decay_scheduler(optimizer, budget.total_steps, budget.steps_per_update)
    counters = {"agent_steps": 0, "updates": 0, **PROGRESS}
    if resume:  # a checkpoint of N ranks resumes on M: the weights and optimiser are the same on all
        counters.update(_restore(run_dir / "checkpoint.pt", model, optimizer, scheduler, config, budget,
                                 device, accept_config_edits, record_edits=ranks.is_main))
        if ranks.is_main:
            print(_resume_line(run_dir, config, counters), file=sys.stderr, flush=True)
    elif config.load_vision_from:
        load_vision(model, config.load_vision_from)
    if config.freeze_vision:
        freeze_vision(model)
    if group is not None:
        group.broadcast_weights(model)
        seed_everything(config.seed + 10_007 * ranks.rank + counters["updates"])  # each rank samples its own
    acting_model = acting_copy(model)
    run_id = None
    if ranks.is_main:  # the run's identity: a new run's own, a resumed run's from its folder (one of an older
        run_id = (read_run_id(run_dir) if resume else None) or new_run_id()  # fwrl version gets one now)
        if read_run_id(run_dir) != run_id:
            write_run_id(run_dir, run_id)
        save_config(config, run_dir / "config.yaml")

    streams = DeviceStreams(device, threads, config.acting_priority)
    weights = PolicyWeights(acting_model, streams, version=counters["updates"])
    record = StepRecord.of(info.obs_shape, info.obs_dtype, info.extra_size)
    seed = config.seed + 7919 * counters["updates"] + 1_000_003 * ranks.rank  # a resumed run's envs play anew
    pool_settings = config.pool_settings(num_workers, seed)  # its workers are the splits of the processes
    k = pool_settings.envs_per_worker
    spec = RolloutSpec(config.unroll_length, k, record, info.num_actions, info.action_dims)
    rollouts = RolloutQueue(maxsize=queue_size(config.batch_size, k))
    store = RolloutStore(spec, pool_settings.num_workers, device, model.initial_state(1, device),
                         capacity=store_capacity(pool_settings.num_workers, k, config.batch_size, rollouts.maxsize))
    actor_timers, learner_timer = tuple(StageTimer(device) for _ in range(threads)), StageTimer(device)
    process = None
    if update_process(config.learner_process, device, ranks.world_size, budget.total_steps - counters["agent_steps"],
                      config.max_seconds, model.core.python_recurrence):
        process = UpdateProcess(model, optimizer, scheduler, config.learner_settings(),
                                getattr(model, "action_dims", None), torch.get_num_threads())
    learner = Learner(model, weights, optimizer, scheduler, config.learner_settings(), store, learner_timer,
                      group=group, process=process)
    learner.stats.agent_steps, learner.stats.updates = counters["agent_steps"], counters["updates"]
    episodes = Episodes(info.task_names, normalise=normaliser(config.env), count=int(counters["episodes"]))
    pool = make_pool(config.backend, pool_settings, info, **config.backend_options())
    return Run(config=config, run_dir=run_dir, ranks=ranks, device=device, info=info, group=group, model=model,
               optimizer=optimizer, scheduler=scheduler, budget=budget, streams=streams,
               weights=weights, acting_model=acting_model, rollouts=rollouts, store=store, learner=learner,
               actor_timers=actor_timers, inference_graph=graph,
               acting_trace=traced_acting(config.acting_trace, device, model.core),
               learner_timer=learner_timer, episodes=episodes, pool=pool,
               clock=Clock(counters["elapsed_seconds"]), resumed=counters, run_id=run_id,
               counters=Counters(counters["agent_steps"], counters["updates"], int(counters["acted_steps"])))


def _restore(path: Path, model: AgentNet, optimizer, scheduler, config: TrainConfig, budget: Budget,
             device: torch.device, accept_edits: bool = False, record_edits: bool = True) -> dict[str, Any]:
    """Load a checkpoint into the model, optimiser and schedule (with this session's budget) and the
    RNGs, once ``config`` (config.yaml's) is checked against the config it was trained with; returns
    its counters."""
    payload = load_checkpoint(path, map_location=device)
    foreign = foreign_checkpoint(path.parent, path, payload)
    if foreign:  # before the config's check: an edited config.yaml is not the cause, and no edit is accepted
        raise FwrlError(f"cannot resume: {foreign}. A run resumes from its own checkpoints: resume that run in its "
                        "own folder (or move its whole folder), and put this folder's own checkpoint.pt back "
                        "(or a milestone of it, checkpoint-<steps>.pt).")
    check_config_edits(path.parent, payload.get("config"), config, accept_edits, record=record_edits)
    load_model_weights(model, payload["model"], str(path))
    optimizer.load_state_dict(payload["optimizer"])
    scheduler.load_state_dict(payload["scheduler"])
    scheduler.steps_per_update = budget.steps_per_update
    scheduler.rebudget(budget.total_steps)  # a resumed run may get another budget: its LR from now on
    set_rng_state(payload["rng"])
    return {"agent_steps": payload["agent_steps"], "updates": payload["updates"],
            **{key: payload.get("progress", {}).get(key, start) for key, start in PROGRESS.items()}}


CONFIG_EDITS_LOG = "config-edits.log"  # a run's record of the config.yaml edits it resumed on


def check_config_edits(run_dir: Path, trained: dict[str, Any] | None, config: TrainConfig, accept: bool,
                       record: bool = True) -> None:
    """Refuse to resume on a config.yaml edited since the checkpoint in a setting that defines the
    model or the learning problem (the learning rate, the env's options, ...), in one line naming each
    (the checkpoint's value and config.yaml's); with ``accept``, resume on the edited ones and append
    them to ``config-edits.log`` in the run folder (``record``: the run's writer, rank 0)."""
    if not trained:  # a checkpoint without its config: nothing to compare
        return
    saved = TrainConfig.from_dict(saved_settings(trained), source=f"the config of {run_dir / 'checkpoint.pt'}")
    edits = changed_settings(saved, config)
    if not edits:
        return
    values = lambda c, k: c.core_options if k == "core_options" else getattr(c, k)  # noqa: E731
    details = "; ".join(f"{key} {values(saved, key)!r} -> {values(config, key)!r}" for key in edits)
    log = run_dir / CONFIG_EDITS_LOG
    if not accept:
        raise FwrlError(f"{run_dir / 'config.yaml'} was edited since its checkpoint was written, in settings that "
                        f"define the model or the learning problem ({details}; checkpoint -> config.yaml). Put "
                        f"those values back, or pass --accept-config-edits to resume on them (recorded in {log}).")
    if not record:
        return
    line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} resumed on an edited config.yaml: {details}\n"
    with log.open("a") as f:
        f.write(line)
    print(f"fwrl train: resuming on an edited config.yaml ({details}); recorded in {log}", file=sys.stderr, flush=True)


def _resume_line(run_dir: Path, config: TrainConfig, counters: dict[str, Any]) -> str:
    limit = (f"time limit {config.max_seconds:g} s for this session (--max-seconds changes it)" if config.max_seconds
             else "no time limit (--max-seconds sets one)")
    return (f"fwrl train: resuming {run_dir} from its checkpoint at {counters['agent_steps']:,} agent steps "
            f"({counters['updates']:,} updates); budget {config.total_steps:,} agent steps; {limit}")
