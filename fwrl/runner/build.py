"""A training run, built and not yet started: :func:`build_run` makes every part from the config and
returns them in named groups (:class:`RunParts`), each of what belongs together.

The data path it builds (``ARCHITECTURE.md``): env workers (``ActingParts.pool``) -> the acting
threads' batched forward with the acting copy of the weights (``ActingParts.new_loop``: each
thread's :class:`~fwrl.agents.inference.InferenceLoop`, made here) -> the device rollout store
(``store``) -> the rollout queue (``rollouts``) -> the learner (``LearningParts.learner``) -> the
weights it publishes back to the acting copy. A resumed run restores the weights, the optimiser,
the learning-rate schedule, the RNG state and the counters of its checkpoint (:mod:`fwrl.runner.resume`).

Only :func:`fwrl.runner.train.train` reads the groups: it hands each part of the runner its own
collaborators (``ARCHITECTURE.md``, the runner's parts), never a group.
"""

from __future__ import annotations

import random
import sys
import threading
from pathlib import Path
from typing import Any, Callable, NamedTuple

import numpy as np
import torch

from fwrl.agents.checkpoint import load_checkpoint, load_model_weights
from fwrl.agents.distributed import LearnerGroup, Ranks, rank_device, ranks_from_env, share
from fwrl.agents.inference import InferenceLoop
from fwrl.agents.inference_graph import acting_graph
from fwrl.agents.learner import Learner
from fwrl.agents.learner_process import UpdateProcess
from fwrl.agents.model import AgentNet
from fwrl.agents.optim import linear_decay_scheduler, make_optimizer
from fwrl.agents.policy_weights import DeviceStreams, PolicyWeights, acting_copy
from fwrl.agents.rollout_queue import RolloutQueue
from fwrl.agents.rollouts import RolloutSpec, RolloutStore, queue_size, store_capacity
from fwrl.agents.stage_timer import StageTimer
from fwrl.agents.traced_core import traced_acting
from fwrl.envs.backends import make_pool
from fwrl.envs.registry import describe_env
from fwrl.envs.step_record import StepRecord
from fwrl.envs.worker_pool import StepSource, WorkerPool
from fwrl.errors import FwrlError
from fwrl.runner.agent import build_model, pick_device, resolve_core_options
from fwrl.runner.budget import Budget
from fwrl.runner.checkpoint_source import CheckpointSource
from fwrl.runner.concurrency import acting_threads, learner_threads, update_process
from fwrl.runner.counters import Counters
from fwrl.runner.resume import PROGRESS, restore, resume_line
from fwrl.runner.run_metrics import Episodes, normaliser
from fwrl.runner.rundir import RunDir
from fwrl.runner.stopping import Clock
from fwrl.settings.config import TrainConfig
from fwrl.utils.allocator import keep_freed_memory


class RunSetup(NamedTuple):
    """What this learner rank's run is and where it runs."""

    config: TrainConfig  # resolved: the output_scale and head_init it trains with
    folder: RunDir
    ranks: Ranks
    device: torch.device
    group: LearnerGroup | None  # the learner ranks' collectives; None for one rank

    @property
    def main(self) -> bool:
        """Rank 0 writes the run folder: checkpoints, metrics, the panel."""
        return self.ranks.is_main


class ActingParts(NamedTuple):
    """The acting side: the env workers, the rollouts they fill, the acting copy of the weights."""

    pool: WorkerPool
    store: RolloutStore  # the device rollout store
    rollouts: RolloutQueue  # finished rollouts, to the learner
    streams: DeviceStreams  # each acting thread's and the learner's CUDA streams
    new_loop: Callable[[StepSource, StageTimer], InferenceLoop]  # one acting thread's loop over its workers
    timers: tuple[StageTimer, ...]  # one per acting thread
    model: AgentNet  # the acting copy (evaluations and videos play it)
    weights: PolicyWeights  # publishes the learner's weights to the acting copy (its lock guards a read)


class LearningParts(NamedTuple):
    """The learning side: the learner, its stage timer, its stream and the lock it holds for an update."""

    learner: Learner  # its model, optimiser, schedule and counters
    timer: StageTimer
    stream: torch.cuda.Stream | None
    update_lock: threading.Lock  # held by the learner for a whole update (a checkpoint's copy waits for it)


class RunState(NamedTuple):
    """Where the run stands: its budget, counters, clock and episodes, and where this session started."""

    budget: Budget  # the step budget: agent steps of one update, all ranks' columns counted
    counters: Counters  # the parts' counters, from the checkpoint's on a resume
    clock: Clock
    episodes: Episodes
    start: dict[str, Any]  # the checkpoint's counters (resume.PROGRESS and the learner's), or the start's
    resumed: bool


class RunParts(NamedTuple):
    """Every part of one learner rank's run (module docstring), in its groups."""

    setup: RunSetup
    acting: ActingParts
    learning: LearningParts
    state: RunState
    checkpoints: CheckpointSource  # what a checkpoint is copied from


def seed_everything(seed: int) -> None:
    """Seed torch, numpy and Python's ``random`` alike."""
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


def build_run(config: TrainConfig, run_dir: Path, resume: bool = False, accept_config_edits: bool = False
              ) -> RunParts:
    """Every part of this learner rank's run (nothing started: no worker, no thread). ``resume``
    continues the run in ``run_dir`` from its ``checkpoint.pt`` (written by any number of ranks);
    ``accept_config_edits``: on the settings of a config.yaml edited since (recorded), where it differs."""
    ranks = ranks_from_env()  # several learners: torchrun / SLURM / fwrl train --learners set these
    folder = RunDir(run_dir)
    if ranks.is_main:
        folder.create()  # where the caller has not (fwrl train opens it, with its lock, before this)
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
        counters.update(restore(folder, model, optimizer, scheduler, config, budget, device, accept_config_edits,
                                record_edits=ranks.is_main))
        if ranks.is_main:
            print(resume_line(folder.path, config, counters), file=sys.stderr, flush=True)
    elif config.load_vision_from:
        load_vision(model, config.load_vision_from)
    if config.freeze_vision:
        freeze_vision(model)
    if group is not None:
        group.broadcast_weights(model)
        seed_everything(config.seed + 10_007 * ranks.rank + counters["updates"])  # each rank samples its own
    acting_model = acting_copy(model)
    run_id = None
    if ranks.is_main:  # the run's identity: a new run's own, a resumed run's from its folder
        run_id = folder.identify(resume)
        folder.save_config(config)

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
    trace = traced_acting(config.acting_trace, device, model.core)

    def new_loop(source: StepSource, timer: StageTimer) -> InferenceLoop:
        """One acting thread's loop over ``source`` (a slice of the pool) with its stage timer."""
        return InferenceLoop(acting_model, source, store, device, weights=weights, timer=timer, graph=graph,
                             trace=trace, batch_wait=config.acting_batch_wait, staging=config.acting_staging)

    pool = make_pool(config.backend, pool_settings, info, **config.backend_options())
    clock, update_lock = Clock(counters["elapsed_seconds"]), threading.Lock()
    return RunParts(
        setup=RunSetup(config, folder, ranks, device, group),
        acting=ActingParts(pool, store, rollouts, streams, new_loop, actor_timers, acting_model, weights),
        learning=LearningParts(learner, learner_timer, streams.learner, update_lock),
        state=RunState(budget, Counters(counters["agent_steps"], counters["updates"], int(counters["acted_steps"])),
                       clock, episodes, counters, resume),
        checkpoints=CheckpointSource(learner, update_lock, streams.learner, device, clock, episodes, config.to_dict(),
                                     info.to_dict(), folder.identity(run_id) if run_id else None))
