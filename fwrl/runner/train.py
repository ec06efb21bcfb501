"""``fwrl train``: one learner process, N env workers, until the step budget.

Threads of the learner process:
- main thread: central inference for all env slots, writes into the rollout
  store on the device, metrics, checkpoint snapshots and signal handling
  (SIGINT, SIGTERM and SIGHUP stop the run cleanly with a final checkpoint);
- learner thread: B rollout columns gathered on the device -> loss ->
  optimiser step -> publish weights (and their version) to the acting copy;
- checkpoint thread: writes the snapshots (``fwrl.runner.checkpointing``).

On CUDA each thread issues its work on its own stream
(``fwrl.agents.policy_weights``). Every metrics row says where the time went
(``share/...``: fractions of the interval's wall time per stage of each
thread), how stale the acting policy was (``policy_lag_mean`` / ``_max``, in
updates), the mean rollout queue depth and the peak memory.
"""

from __future__ import annotations

import math
import queue
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from fwrl.agents.checkpoint import checkpoint_payload, load_checkpoint, load_model_weights, set_rng_state
from fwrl.agents.distributed import CollectiveFailed, LearnerGroup, Ranks, rank_device, ranks_from_env, share
from fwrl.agents.inference import InferenceLoop
from fwrl.agents.learner import Learner
from fwrl.agents.model import AgentNet
from fwrl.agents.optim import linear_decay_scheduler, make_optimizer
from fwrl.agents.policy_weights import DeviceStreams, PolicyWeights, acting_copy
from fwrl.agents.rollout_queue import RolloutQueue
from fwrl.agents.rollouts import RolloutSpec, RolloutStore, store_capacity
from fwrl.agents.stage_timer import StageTimer
from fwrl.envs.backends import make_pool
from fwrl.envs.registry import describe_env
from fwrl.envs.worker_pool import WorkersLost
from fwrl.errors import FwrlError
from fwrl.settings.config import TrainConfig, save_config
from fwrl.runner.agent import build_model, pick_device, resolve_core_options
from fwrl.runner.checkpointing import CheckpointWriter
from fwrl.runner.progress import Progress
from fwrl.runner.run_metrics import Episodes, Mean, MetricsSink, normaliser, pipeline_row


@dataclass
class TrainResult:
    agent_steps: int
    updates: int
    episodes: int
    mean_return: float  # of the last 100 episodes of this session; nan: none finished
    mean_success: float
    stopped_by: str  # "budget" | "time limit" | "signal SIGINT" (SIGTERM, SIGHUP) | "workers lost" | "error"
    signal: int = 0  # the stop signal's number, 0 if none came
    wall_seconds: float = 0.0  # from ``started`` (the time budget's start) until train() returned


# Seconds kept back from a --max-seconds limit, besides the last update and the last checkpoint write
# (both measured), for stopping: closing the workers, the final metrics row, the panel.
STOP_ALLOWANCE = 1.0


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


def bootstraps_truncation(config: TrainConfig) -> bool:
    """Whether V-trace bootstraps where a time limit cut an episode (``truncation``): ``auto``
    keeps the torchbeast protocol on Atari (the 108k-frame cap ends the episode) and
    bootstraps everywhere else."""
    if config.truncation == "auto":
        from fwrl.envs.spec import parse_env_spec

        return parse_env_spec(config.env).family != "atari"
    return config.truncation == "bootstrap"


def load_vision(model: AgentNet, path: str) -> None:
    """R2AC protocol: take the stem from a (TBPTT-pretrained) checkpoint."""
    payload = load_checkpoint(Path(path))
    stem_state = {k[len("stem."):]: v for k, v in payload["model"].items() if k.startswith("stem.")}
    load_model_weights(model.stem, stem_state, f"{path} (vision stem)")


def freeze_vision(model: AgentNet) -> None:
    """Train the core and heads only (``--freeze-vision``)."""
    for p in model.stem.parameters():
        p.requires_grad_(False)


def train(config: TrainConfig, run_dir: Path, resume: bool = False, progress: Progress | None = None,
          started: float | None = None, acting_seconds: float | None = None) -> TrainResult:
    """Train until the step budget, a time limit, a stop signal (SIGINT, SIGTERM, SIGHUP) or an
    error; every way out writes ``checkpoint.pt``. ``resume`` continues the run in ``run_dir``.

    Budgets: the learner takes whole batches of B x T agent steps (x learner ranks) while it is
    below ``total_steps``, so a run ends at most one batch past it; acting stops once the
    rollouts of the last batch are done. ``max_seconds`` limits the whole command, from
    ``started`` (``time.monotonic()`` when it began; default: now) to the return of this
    function, start-up and stop included: acting stops when the time left is what the last
    update, the last checkpoint write and :data:`STOP_ALLOWANCE` took, and the learner starts
    no update it has no time for (the first update's length is unknown: a limit that ends
    during it is passed by the rest of it). ``acting_seconds`` (``fwrl bench throughput``):
    stop acting that many seconds after the workers started, whatever the start-up took."""
    started = time.monotonic() if started is None else started
    deadline = started + config.max_seconds if config.max_seconds > 0 else math.inf
    run_dir = Path(run_dir)
    ranks = ranks_from_env()  # several learners: torchrun / SLURM / fwrl train --learners set these
    main = ranks.is_main  # rank 0 writes the run folder: checkpoints, metrics, the panel
    if main:
        run_dir.mkdir(parents=True, exist_ok=True)
    _seed_everything(config.seed)  # the same initial weights on every rank (rank 0's are broadcast too)
    num_workers = share(config.num_workers, ranks)
    if num_workers < 1:
        raise FwrlError(f"setting num_workers={config.num_workers} leaves learner rank {ranks.rank} of "
                        f"{ranks.world_size} without an env worker; use num_workers >= {ranks.world_size}.")
    torch.set_num_threads(learner_threads(config.model_copy(update={"num_workers": num_workers})))
    device = rank_device(pick_device(config.device), ranks)
    if config.inference_graph and device.type != "cuda":
        raise FwrlError(f"--inference-graph replays CUDA graphs and needs a CUDA device; this run uses {device}.")
    info = describe_env(config.env, wrappers=tuple(config.env_wrappers))
    config = resolve_core_options(config, info)  # the run records the output_scale it trains with
    group = (LearnerGroup(ranks, device, config.dist_timeout, config.dist_backend) if ranks.distributed
             else None)

    # ---------------------------------------------------------------- model, optimiser, counters
    model = build_model(config, info).to(device)
    optimizer = make_optimizer(model.parameters(), lr=config.learning_rate, alpha=config.rmsprop_alpha,
                               eps=config.rmsprop_eps, momentum=config.rmsprop_momentum)
    # every rank's B x T columns count: the schedule runs on global agent steps
    steps_per_update = config.batch_size * config.unroll_length * ranks.world_size
    scheduler = linear_decay_scheduler(optimizer, config.total_steps, steps_per_update)
    counters = {"agent_steps": 0, "updates": 0, "elapsed_seconds": 0.0, "episodes": 0}
    if resume:  # a checkpoint of N ranks resumes on M: the weights and optimiser are the same on all
        payload = load_checkpoint(run_dir / "checkpoint.pt", map_location=device)
        load_model_weights(model, payload["model"], str(run_dir / "checkpoint.pt"))
        optimizer.load_state_dict(payload["optimizer"])
        scheduler.load_state_dict(payload["scheduler"])
        scheduler.steps_per_update = steps_per_update
        scheduler.rebudget(config.total_steps)  # a resumed run may get another budget: its LR from now on
        set_rng_state(payload["rng"])
        counters.update(agent_steps=payload["agent_steps"], updates=payload["updates"], **payload.get("progress", {}))
        if main:
            print(f"fwrl train: resuming {run_dir} from its checkpoint at {counters['agent_steps']:,} agent steps "
                  f"({counters['updates']:,} updates); budget {config.total_steps:,} agent steps",
                  file=sys.stderr, flush=True)
    elif config.load_vision_from:
        load_vision(model, config.load_vision_from)
    if config.freeze_vision:
        freeze_vision(model)
    if group is not None:
        group.broadcast_weights(model)
        _seed_everything(config.seed + 10_007 * ranks.rank + counters["updates"])  # each rank samples its own
    inference_model = acting_copy(model)
    if main:
        save_config(config, run_dir / "config.yaml")

    # ---------------------------------------------------------------- the data path (agents/)
    streams = DeviceStreams(device)
    weights = PolicyWeights(inference_model, streams, version=counters["updates"])
    spec = RolloutSpec(config.unroll_length, config.envs_per_worker, info.obs_shape,
                       torch.uint8 if info.obs_dtype == "uint8" else torch.float32, info.num_actions,
                       extra_size=info.extra_size, action_dims=info.action_dims)
    rollouts = RolloutQueue(maxsize=max(2, 2 * config.batch_size // config.envs_per_worker + 1))
    store = RolloutStore(spec, num_workers, device, model.initial_state(1, device),
                         capacity=store_capacity(num_workers, config.envs_per_worker,
                                                 config.batch_size, rollouts.maxsize))
    actor_timer, learner_timer = StageTimer(device), StageTimer(device)
    learner = Learner(model, weights, optimizer, scheduler, config, store, learner_timer,
                      bootstrap_truncation=bootstraps_truncation(config), group=group)
    learner.stats.agent_steps, learner.stats.updates = counters["agent_steps"], counters["updates"]
    episodes = Episodes(info.task_names, normalise=normaliser(config.env), count=int(counters["episodes"]))
    update_lock = threading.Lock()  # held by the learner for a whole update
    stop = threading.Event()
    errors: list[BaseException] = []
    clock = _Clock(counters["elapsed_seconds"])
    peers = _Peers(ranks)  # the other ranks' episodes and counters, gathered by the learner thread
    first_updates = learner.stats.updates
    # the budget's remaining updates need this many rollout columns (of T steps) from this rank's actors
    columns_needed = -(-max(0, config.total_steps - learner.stats.agent_steps) // steps_per_update) * config.batch_size
    columns_done = [0]  # rollout columns handed to the learner's queue in this session

    def stop_reserve() -> float:
        """Seconds to keep for stopping: the last update (the learner may be in one), the last
        checkpoint's copy and write, and the rest (:data:`STOP_ALLOWANCE`)."""
        return learner.stats.update_seconds + copy_seconds[0] + checkpoints.write_seconds + STOP_ALLOWANCE

    def on_rollout(rollout) -> None:
        if rollouts.put(rollout, stop):
            columns_done[0] += rollout.columns

    copy_seconds = [0.0]  # how long the last snapshot's copy took (a time limit keeps it back)

    def snapshot() -> dict:
        """A checkpoint's contents, copied between two updates (the actors go on)."""
        with update_lock:
            began = time.monotonic()
            if streams.learner is not None:  # the last update's work must be done before it is copied
                torch.cuda.current_stream(device).wait_stream(streams.learner)
            payload = checkpoint_payload(
                model=model, optimizer=optimizer, scheduler=scheduler, agent_steps=learner.stats.agent_steps,
                updates=learner.stats.updates, config=config.to_dict(), env_info=info.to_dict(),
                progress={"elapsed_seconds": clock.elapsed(), "episodes": episodes.count})
            copy_seconds[0] = time.monotonic() - began
            return payload

    def learner_loop() -> None:
        try:
            with DeviceStreams.use(streams.learner):
                while learner.stats.agent_steps < config.total_steps:
                    pieces = None
                    if not stop.is_set():
                        with learner_timer.stage("learner_idle"):
                            pieces = rollouts.get_batch(config.batch_size, stop)
                    if pieces is not None and learner.stats.updates > first_updates and (
                            time.monotonic() + stop_reserve() > deadline):
                        pieces = None  # no time left for this update and the stop: leave it
                        stopper.reason = "time limit"
                        stop.set()
                    if pieces is None:  # this rank stops: the others stop after the same update
                        learner.vote_stop()
                        break
                    with update_lock:
                        stats = learner.update(pieces)
                    if stats is None:  # another learner rank voted to stop
                        peers.stopped = True
                        break
                    if group is not None:
                        peers.exchange(group, learner.stats.updates, pool, store, inference, model)
        except BaseException as exc:  # surfaced by the main thread
            errors.append(_explain(exc, group, ranks, learner.stats.agent_steps))
        finally:
            stop.set()

    # ---------------------------------------------------------------- processes, threads, signals
    stopper = _Stopper(stop)
    # The inference (main) and learner threads hand the GIL back and forth around
    # every torch call; a 1 ms switch interval (Python's default is 5 ms) keeps
    # the actors from waiting on the learner's Python code.
    old_switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(0.001)
    progress = (progress or Progress(config, run_dir)) if main else _Quiet()
    progress.deadline, progress.steps_per_update = deadline, steps_per_update
    sink = MetricsSink(run_dir, progress) if main else _Quiet()
    checkpoints = CheckpointWriter(snapshot)
    pool = make_pool(config.backend, config.env, num_workers, config.envs_per_worker,
                     seed=config.seed + 7919 * counters["updates"] + 1_000_003 * ranks.rank,
                     step_timeout=config.step_timeout,
                     env_wrappers=tuple(config.env_wrappers),
                     **({"address": config.ray_address} if config.backend == "ray" else {}))
    evaluator = inference = None
    queue_depth = Mean()
    previous_stream = streams.make_current(streams.inference)  # this thread acts on the inference stream
    thread = threading.Thread(target=learner_loop, name="fwrl-learner", daemon=True)
    try:
        progress.start()
        if time.monotonic() + STOP_ALLOWANCE < deadline:
            pool.start()
        else:  # start-up took the whole time limit: no workers are started, the run stops at once
            stopper.reason = "time limit"
            stop.set()
        inference = InferenceLoop(inference_model, pool, store, device, weights=weights, timer=actor_timer,
                                  graph=config.inference_graph)
        thread.start()
        clock.start()
        acting_until = clock.started + acting_seconds if acting_seconds else math.inf
        last_log = last_ckpt = time.monotonic()
        last_steps = first_steps = learner.stats.agent_steps
        wrote_first = False
        next_milestone = _next_multiple(learner.stats.agent_steps, config.milestone_interval)
        if config.eval_every > 0 and main:
            from fwrl.evaluation.evaluate import PeriodicEvaluator

            evaluator = PeriodicEvaluator(config, device, learner.stats.agent_steps, time.monotonic())

        def row(sps: float) -> dict:
            peers.deliver(episodes)
            out = _metrics_row(learner, episodes, pool, store, sps, clock.elapsed(), inference.agent_steps)
            out["rollout_columns"] = columns_done[0]
            for key, value in peers.totals().items():  # every rank's workers count
                out[key] += value
            out.update(pipeline_row(actor_timer, learner_timer, queue_depth, device))
            return out

        on_episode = episodes.add if main else peers.outbox.append

        # ------------------------------------------------------------ the acting loop
        lost: WorkersLost | None = None
        while not stop.is_set():
            if columns_done[0] < columns_needed:
                try:
                    inference.step(0.1, on_rollout=on_rollout, on_episode=on_episode)
                except WorkersLost as exc:  # stop cleanly: final checkpoint below, then the message
                    stopper.reason, lost = "workers lost", exc
                    break
            else:  # the rollouts of the budget's last batch are done: no more acting
                thread.join(0.1)
            queue_depth.add(rollouts.qsize())
            now = time.monotonic()
            if now + stop_reserve() >= deadline:
                stopper.reason = "time limit"
                break
            if now >= acting_until:
                stopper.reason = "time limit"
                break
            if not main:
                continue
            if now - last_log >= config.log_interval:
                sink.write(row((learner.stats.agent_steps - last_steps) / (now - last_log)))
                last_log, last_steps = now, learner.stats.agent_steps
            if evaluator is not None:
                evaluator.maybe_start(learner.stats.agent_steps, inference_model, weights.lock)
                for eval_row in evaluator.poll():
                    sink.write(eval_row, show=False)
            # the first checkpoint soon after the first update, then every interval
            first_one = not wrote_first and learner.stats.updates > first_updates
            if first_one or now - last_ckpt >= config.checkpoint_interval:
                checkpoints.request(run_dir / "checkpoint.pt")
                last_ckpt, wrote_first = now, True
            if next_milestone and learner.stats.agent_steps >= next_milestone:
                checkpoints.request(run_dir / f"checkpoint-{learner.stats.agent_steps}.pt")
                next_milestone = _next_multiple(learner.stats.agent_steps, config.milestone_interval)
        stop.set()
        thread.join()
        if errors:
            stopper.reason = "error"
        elif peers.stopped and stopper.reason == "budget":
            stopper.reason = "another learner rank"
        if main:
            checkpoints.request(run_dir / "checkpoint.pt")
            checkpoints.flush()
        if errors:
            raise errors[0]
        session = clock.session()
        if main:
            sink.write(row((learner.stats.agent_steps - first_steps) / session if session > 0 else math.nan))
        if lost is not None:
            raise lost
    finally:
        stop.set()
        if thread.is_alive():
            thread.join()
        streams.make_current(previous_stream)
        if evaluator is not None:
            evaluator.close()
        pool.close()
        progress.stop()
        sink.close()
        checkpoints.close()
        stopper.restore()
        sys.setswitchinterval(old_switch_interval)
        if group is not None:
            group.close()
    return TrainResult(learner.stats.agent_steps, learner.stats.updates, episodes.count,
                       episodes.mean_return(), episodes.mean_success(), stopper.reason, stopper.signal,
                       time.monotonic() - started)


class _Quiet:
    """The panel and metrics of a learner rank other than 0: nothing is shown or written."""

    def start(self) -> None:
        pass

    def update(self, row: dict) -> None:
        pass

    def write(self, row: dict, show: bool = True) -> None:
        pass

    def stop(self) -> None:
        pass

    def close(self) -> None:
        pass


class _Peers:
    """What the learner ranks tell each other now and then (``EXCHANGE_EVERY`` updates): every
    rank's finished episodes (rank 0 logs them all) and counters, and a weight checksum
    (``CHECK_EVERY`` updates). The learner thread exchanges; the main thread reads."""

    EXCHANGE_EVERY = 10
    CHECK_EVERY = 200

    def __init__(self, ranks: Ranks):
        self.ranks = ranks
        self.outbox: list = []  # this rank's finished episodes not yet sent (ranks > 0)
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()  # the others' episodes (rank 0)
        self.counts: dict[int, dict[str, int]] = {}  # rank -> its latest counters (rank 0)
        self.stopped = False  # another rank voted to stop

    def exchange(self, group: LearnerGroup, updates: int, pool, store, inference, model) -> None:
        if updates % self.CHECK_EVERY == 0:
            group.check_same_weights(model)
        if updates % self.EXCHANGE_EVERY:
            return
        sent, self.outbox = self.outbox, []
        counts = {"worker_restarts": pool.restarts, "dropped_steps": store.dropped_steps,
                  "acted_steps": inference.agent_steps}
        for rank, (episodes, their_counts) in enumerate(group.gather((sent, counts))):
            if rank != self.ranks.rank and self.ranks.is_main:
                self.counts[rank] = their_counts
                for record in episodes:
                    self.inbox.put(record)

    def deliver(self, episodes: Episodes) -> None:
        """Rank 0: add the other ranks' episodes received so far."""
        while True:
            try:
                episodes.add(self.inbox.get_nowait())
            except queue.Empty:
                return

    def totals(self) -> dict[str, int]:
        """The other ranks' counters, to add to rank 0's own (empty for a single learner)."""
        return {key: sum(c[key] for c in self.counts.values())
                for key in ("worker_restarts", "dropped_steps", "acted_steps")} if self.counts else {}


def _explain(exc: BaseException, group: LearnerGroup | None, ranks: Ranks, agent_steps: int) -> BaseException:
    """A failed collective becomes a message that names the ranks that stopped answering."""
    if group is None or not isinstance(exc, CollectiveFailed):
        return exc
    missing = group.missing_ranks()
    return FwrlError(
        f"learner rank {ranks.rank} of {ranks.world_size}: a collective with the other ranks failed, so another "
        f"rank died or hangs ({missing or exc}). The run stops with a checkpoint at {agent_steps:,} agent steps "
        "(written by rank 0); continue it with --resume, on any number of learners.")


def _seed_everything(seed: int) -> None:
    import random

    import numpy as np

    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


class _Clock:
    """Wall time of the run: ``elapsed()`` includes the sessions before a resume, ``session()``
    only this one (``--max-seconds`` limits a session)."""

    def __init__(self, before: float = 0.0):
        self.before = float(before)
        self.started: float | None = None

    def start(self) -> None:
        self.started = time.monotonic()

    def session(self) -> float:
        return 0.0 if self.started is None else time.monotonic() - self.started

    def elapsed(self) -> float:
        return self.before + self.session()


STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


class _Stopper:
    """SIGINT (Ctrl-C), SIGTERM and SIGHUP (the terminal closed) stop the run cleanly: ``stop`` is set,
    the loop ends, the final checkpoint is written. ``signal`` is the one that came (0: none)."""

    def __init__(self, stop: threading.Event):
        self.stop = stop
        self.reason = "budget"
        self.signal = 0
        self._old = {s: signal.signal(s, self._on_signal) for s in STOP_SIGNALS}

    def _on_signal(self, signum, frame) -> None:
        self.reason = f"signal {signal.Signals(signum).name}"
        self.signal = signum
        self.stop.set()

    def restore(self) -> None:
        for s, handler in self._old.items():
            signal.signal(s, handler)


def _next_multiple(steps: int, interval: int) -> int:
    return (steps // interval + 1) * interval if interval > 0 else 0


def _metrics_row(learner, episodes, pool, store, sps, elapsed, acted_steps) -> dict:
    row = {
        "time": round(elapsed, 2),
        "agent_steps": learner.stats.agent_steps,
        "acted_steps": acted_steps,
        "updates": learner.stats.updates,
        "steps_per_second": round(sps, 1) if not math.isnan(sps) else "",
        "episodes": episodes.count,
        "mean_return": episodes.mean_return(),
        "mean_success": episodes.mean_success(),
        "worker_restarts": pool.restarts,
        "dropped_steps": store.dropped_steps,
    }
    row.update({k: v for k, v in learner.stats.last.items()})
    row.update(episodes.per_task())
    return row
