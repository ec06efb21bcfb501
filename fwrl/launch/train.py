"""``fwrl train``: one learner process, N env workers, until the step budget.

Threads of the learner process:
- main thread: central inference for all env slots, rollout assembly,
  metrics, checkpoints and signal handling (SIGINT / SIGTERM stop the run
  cleanly and write a final checkpoint);
- learner thread: B rollouts -> loss -> optimiser step -> publish weights.
"""

from __future__ import annotations

import copy
import math
import signal
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from fwrl.agents.checkpoint import load_checkpoint, load_model_weights, save_checkpoint, set_rng_state
from fwrl.agents.inference import InferenceLoop
from fwrl.agents.learner import Learner
from fwrl.agents.model import AgentNet
from fwrl.agents.optim import linear_decay_scheduler, make_optimizer
from fwrl.agents.rollouts import RolloutAssembler, RolloutQueue, RolloutSpec
from fwrl.envs.registry import describe_env
from fwrl.envs.backends import make_pool
from fwrl.envs.worker_pool import EpisodeRecord, WorkersLost
from fwrl.launch.agent import build_model, pick_device
from fwrl.launch.config import TrainConfig, save_config
from fwrl.launch.progress import Progress
from fwrl.launch.rundir import MetricsCSV


@dataclass
class TrainResult:
    agent_steps: int
    updates: int
    episodes: int
    mean_return: float
    mean_success: float
    stopped_by: str  # "budget" | "signal" | "error"


def allowed_cores() -> int:
    """Cores this process may run on (its affinity mask, not the machine's count)."""
    import os

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
    if config.num_threads > 0:
        return config.num_threads
    cores = allowed_cores()
    reserved = min(config.num_workers, cores // 2) if config.backend == "local" else 0
    return max(1, cores - reserved)


def load_vision(model: AgentNet, path: str) -> None:
    """R2AC protocol: take the stem from a (TBPTT-pretrained) checkpoint."""
    payload = load_checkpoint(Path(path))
    stem_state = {k[len("stem."):]: v for k, v in payload["model"].items() if k.startswith("stem.")}
    load_model_weights(model.stem, stem_state, f"{path} (vision stem)")


def freeze_vision(model: AgentNet) -> None:
    """Train the core and heads only (``--freeze-vision``)."""
    for p in model.stem.parameters():
        p.requires_grad_(False)


class _Episodes:
    """Finished episodes with running means, per task and normalised where constants exist.

    ``normalise(task_name, mean_return)`` gives the paper's normalised score
    (Atari / DMLab human-normalised, ProcGen min-max) or None.
    """

    def __init__(self, task_names: tuple[str, ...], window: int = 100,
                 normalise: Callable[[str, float], float | None] | None = None):
        self.task_names = task_names
        self.window = window
        self.normalise = normalise
        self.recent: deque[EpisodeRecord] = deque(maxlen=window)
        self.by_task = {i: deque(maxlen=window) for i in range(len(task_names))}
        self.count = 0

    def add(self, record: EpisodeRecord) -> None:
        self.recent.append(record)
        self.by_task.setdefault(record.task, deque(maxlen=self.window)).append(record)
        self.count += 1

    def mean_return(self) -> float:
        return _mean([r.episode_return for r in self.recent])

    def mean_success(self) -> float:
        return _mean([r.extra["success"] for r in self.recent if "success" in r.extra])

    def per_task(self) -> dict[str, float]:
        """``return/<task>`` for multi-task runs; ``normalised/<task>`` and their mean
        ``normalised_return`` where the family has normalisation constants."""
        row: dict[str, float] = {}
        normalised = []
        for t, records in self.by_task.items():
            name = self.task_names[t]
            mean = _mean([r.episode_return for r in records])
            if len(self.task_names) > 1:
                row[f"return/{name}"] = mean
            score = self.normalise(name, mean) if self.normalise and records else None
            if score is not None:
                normalised.append(score)
                if len(self.task_names) > 1:
                    row[f"normalised/{name}"] = score
        if self.normalise is not None:
            row["normalised_return"] = _mean(normalised) if len(normalised) == len(self.task_names) else math.nan
        return row


def _normaliser(env: str) -> Callable[[str, float], float | None] | None:
    """Per-task score normalisation for ``env``'s family (None where it has none)."""
    from fwrl.envs.spec import parse_env_spec
    from fwrl.launch.scores import normalisation_kind, normalise

    spec = parse_env_spec(env)
    if not normalisation_kind(spec.family):
        return None
    return lambda task, score: normalise(spec.family, task, score, spec.options)


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else math.nan


def train(config: TrainConfig, run_dir: Path, resume: bool = False, progress: Progress | None = None) -> TrainResult:
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(config.seed)
    import numpy as np
    import random

    np.random.seed(config.seed)
    random.seed(config.seed)
    torch.set_num_threads(learner_threads(config))
    device = pick_device(config.device)
    info = describe_env(config.env)

    model = build_model(config, info).to(device)
    optimizer = make_optimizer(model.parameters(), lr=config.learning_rate, alpha=config.rmsprop_alpha,
                               eps=config.rmsprop_eps, momentum=config.rmsprop_momentum)
    steps_per_update = config.batch_size * config.unroll_length
    scheduler = linear_decay_scheduler(optimizer, config.total_steps, steps_per_update)
    agent_steps = updates = 0
    if resume:
        payload = load_checkpoint(run_dir / "checkpoint.pt", map_location=device)
        load_model_weights(model, payload["model"], str(run_dir / "checkpoint.pt"))
        optimizer.load_state_dict(payload["optimizer"])
        scheduler.load_state_dict(payload["scheduler"])
        scheduler.total_steps = config.total_steps  # a resumed run may get a larger budget
        set_rng_state(payload["rng"])
        agent_steps, updates = payload["agent_steps"], payload["updates"]
    elif config.load_vision_from:
        load_vision(model, config.load_vision_from)
    if config.freeze_vision:
        freeze_vision(model)
    inference_model = copy.deepcopy(model).eval()
    for p in inference_model.parameters():
        p.requires_grad_(False)
    save_config(config, run_dir / "config.yaml")

    lock = threading.Lock()
    update_lock = threading.Lock()
    learner = Learner(model, inference_model, optimizer, scheduler, config, device, lock)
    learner.stats.agent_steps, learner.stats.updates = agent_steps, updates
    spec = RolloutSpec(config.unroll_length, config.envs_per_worker, info.obs_shape,
                       torch.uint8 if info.obs_dtype == "uint8" else torch.float32, info.num_actions)
    assembler = RolloutAssembler(spec, config.num_workers)
    rollouts = RolloutQueue(maxsize=max(2, 2 * config.batch_size // config.envs_per_worker + 1))
    stop = threading.Event()
    errors: list[BaseException] = []
    episodes = _Episodes(info.task_names, normalise=_normaliser(config.env))

    def checkpoint(path: Path) -> None:
        with update_lock:
            save_checkpoint(path, model=model, optimizer=optimizer, scheduler=scheduler,
                            agent_steps=learner.stats.agent_steps, updates=learner.stats.updates,
                            config=config.to_dict(), env_info=info.__dict__ | {"obs_shape": list(info.obs_shape),
                                                                               "task_names": list(info.task_names)})

    def learner_loop() -> None:
        try:
            while not stop.is_set() and learner.stats.agent_steps < config.total_steps:
                pieces = rollouts.get_batch(config.batch_size, stop)
                if pieces is None:
                    break
                with update_lock:
                    learner.update(pieces)
        except BaseException as exc:  # surfaced by the main thread
            errors.append(exc)
        finally:
            stop.set()

    stopped_by = ["budget"]

    def on_signal(signum, frame):
        stopped_by[0] = "signal"
        stop.set()

    old_handlers = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    # The inference (main) and learner threads hand the GIL back and forth around
    # every torch call; a 1 ms switch interval (Python's default is 5 ms) keeps
    # the actors from waiting on the learner's Python code.
    old_switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(0.001)
    metrics = MetricsCSV(run_dir / "metrics.csv")
    writer = _tensorboard(run_dir)
    pool = make_pool(config.backend, config.env, config.num_workers, config.envs_per_worker,
                     seed=config.seed + 7919 * updates, step_timeout=config.step_timeout,
                     **({"address": config.ray_address} if config.backend == "ray" else {}))
    progress = progress or Progress(config, run_dir)
    evaluator = None
    try:
        pool.start()
        inference = InferenceLoop(inference_model, pool, assembler, device, lock)
        thread = threading.Thread(target=learner_loop, name="fwrl-learner", daemon=True)
        thread.start()
        start_time = last_log = last_ckpt = time.monotonic()
        last_steps = first_steps = learner.stats.agent_steps
        next_milestone = _next_multiple(learner.stats.agent_steps, config.milestone_interval)
        progress.start()
        if config.eval_every > 0:
            from fwrl.launch.evaluate import PeriodicEvaluator

            evaluator = PeriodicEvaluator(config, device, learner.stats.agent_steps, start_time)
        lost: WorkersLost | None = None
        while not stop.is_set():
            try:
                inference.step(0.1, on_rollout=lambda r: rollouts.put(r, stop), on_episode=episodes.add)
            except WorkersLost as exc:  # stop cleanly: final checkpoint below, then the message
                stopped_by[0], lost = "workers lost", exc
                break
            now = time.monotonic()
            if now - last_log >= config.log_interval:
                sps = (learner.stats.agent_steps - last_steps) / (now - last_log)
                row = _metrics_row(learner, episodes, pool, assembler, sps, now - start_time)
                metrics.write(row)
                _write_tb(writer, row)
                progress.update(row)
                last_log, last_steps = now, learner.stats.agent_steps
            if evaluator is not None:
                evaluator.maybe_start(learner.stats.agent_steps, inference_model, lock)
                for eval_row in evaluator.poll():
                    metrics.write(eval_row)
                    _write_tb(writer, eval_row)
            if config.max_seconds > 0 and now - start_time >= config.max_seconds:
                stopped_by[0] = "time limit"
                break
            if now - last_ckpt >= config.checkpoint_interval:
                checkpoint(run_dir / "checkpoint.pt")
                last_ckpt = now
            if next_milestone and learner.stats.agent_steps >= next_milestone:
                checkpoint(run_dir / f"checkpoint-{learner.stats.agent_steps}.pt")
                next_milestone = _next_multiple(learner.stats.agent_steps, config.milestone_interval)
        stop.set()
        thread.join()
        if errors:
            stopped_by[0] = "error"
            raise errors[0]
        checkpoint(run_dir / "checkpoint.pt")
        elapsed = time.monotonic() - start_time
        average_sps = (learner.stats.agent_steps - first_steps) / elapsed if elapsed > 0 else math.nan
        row = _metrics_row(learner, episodes, pool, assembler, average_sps, elapsed)
        metrics.write(row)
        _write_tb(writer, row)
        progress.update(row)
        if lost is not None:
            raise lost
    finally:
        stop.set()
        if evaluator is not None:
            evaluator.close()
        pool.close()
        progress.stop()
        if writer is not None:
            writer.close()
        for s, h in old_handlers.items():
            signal.signal(s, h)
        sys.setswitchinterval(old_switch_interval)
    return TrainResult(learner.stats.agent_steps, learner.stats.updates, episodes.count,
                       episodes.mean_return(), episodes.mean_success(), stopped_by[0])


def _next_multiple(steps: int, interval: int) -> int:
    return (steps // interval + 1) * interval if interval > 0 else 0


def _metrics_row(learner, episodes, pool, assembler, sps, elapsed) -> dict:
    row = {
        "time": round(elapsed, 2),
        "agent_steps": learner.stats.agent_steps,
        "updates": learner.stats.updates,
        "steps_per_second": round(sps, 1) if not math.isnan(sps) else "",
        "episodes": episodes.count,
        "mean_return": episodes.mean_return(),
        "mean_success": episodes.mean_success(),
        "worker_restarts": pool.restarts,
        "dropped_steps": assembler.dropped_steps,
    }
    row.update({k: v for k, v in learner.stats.last.items()})
    row.update(episodes.per_task())
    return row


def _tensorboard(run_dir: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(str(run_dir / "tensorboard"))


def _write_tb(writer, row: dict) -> None:
    if writer is None:
        return
    step = row["agent_steps"]
    for key, value in row.items():
        if key in ("agent_steps", "time") or value == "" or value is None:
            continue
        if isinstance(value, float) and math.isnan(value):
            continue
        writer.add_scalar(key, value, step)
    writer.flush()
