"""``fwrl train``: one learner process, N env workers, until the step budget.

The run is made of named parts (``ARCHITECTURE.md``), built by :func:`fwrl.runner.build.build_run`
(in groups: :class:`~fwrl.runner.build.RunParts`) and wired here: :func:`train` is the one reader of
the groups, and hands each part its own collaborators (the budget, the counters, the pool, the store, ...):

- the acting threads (this one and ``acting_threads - 1`` more, :class:`~fwrl.runner.acting.ActingLoop`):
  batched inference for their slices of the env slots, rollouts written into the store on the
  device and handed to the learner's queue; this thread runs, after each of its steps, the
  periodic jobs (:mod:`fwrl.runner.schedule`: metrics rows, checkpoints, milestones,
  evaluations) and the stop checks;
- the learner thread (:class:`~fwrl.runner.learner_loop.LearnerLoop`): B rollout columns gathered
  on the device -> loss -> optimiser step -> publish weights (and their version) to the acting copy;
- the checkpoint thread (:class:`~fwrl.runner.checkpointing.CheckpointWriter`): writes the snapshots
  of the :class:`~fwrl.runner.checkpoint_source.CheckpointSource`.

A caller's :class:`~fwrl.runner.hooks.SessionHook` may add a stop condition of its own and make a
session that acts without learning (``fwrl bench throughput`` ends acting with its window).

On CUDA each acting thread and the learner issue their work on their own streams (``fwrl.agents.policy_weights``). Every
metrics row (:class:`~fwrl.runner.stats.RunStats`) says where the time went (``share/...``), how
stale the acting policy was (``policy_lag_mean`` / ``_max``, in updates), the mean rollout queue
depth and the peak memory. SIGINT, SIGTERM and SIGHUP stop the run cleanly with a final
checkpoint (:mod:`fwrl.runner.stopping`).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from fwrl.agents.model import AgentNet
from fwrl.agents.policy_weights import DeviceStreams
from fwrl.envs.worker_pool import WorkersLost
from fwrl.runner.acting import ActingLoop
from fwrl.runner.build import build_run
from fwrl.runner.checkpointing import CheckpointWriter
from fwrl.runner.counters import Counters
from fwrl.runner.hooks import SessionHook
from fwrl.runner.learner_loop import LearnerLoop
from fwrl.runner.peers import Peers
from fwrl.runner.run_metrics import MetricsSink
from fwrl.runner.schedule import Schedule, periodic_jobs
from fwrl.runner.stats import RunStats
from fwrl.runner.stopping import STOP_ALLOWANCE, Stop, TimeLimit, switch_interval
from fwrl.runner.train_progress import Progress
from fwrl.settings.config import TrainConfig

VIDEOS = "videos"  # the run folder's --video-every videos

PeriodicJob = Callable[[float, int], None]  # one of rank 0's periodic jobs: (now, agent steps)


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


def train(config: TrainConfig, run_dir: Path, resume: bool = False, progress: Progress | None = None,
          started: float | None = None, accept_config_edits: bool = False, tracker=None,
          hook: SessionHook | None = None) -> TrainResult:
    """Train until the step budget, a time limit, a stop signal (SIGINT, SIGTERM, SIGHUP), the
    ``hook``'s stop or an error; every way out writes ``checkpoint.pt``. ``resume`` continues the
    run in ``run_dir`` (``accept_config_edits``: on a config.yaml edited since its checkpoint, recorded).

    Budgets: the learner takes whole batches of B x T agent steps (x learner ranks) while it is
    below ``total_steps``, so a run ends at most one batch past it; acting stops once the
    rollouts of the last batch are done. ``max_seconds`` limits the whole command, from
    ``started`` (``time.monotonic()`` when it began; default: now) to the return of this
    function, start-up and stop included: acting stops when the time left is what the last
    update, the last checkpoint write and :data:`~fwrl.runner.stopping.STOP_ALLOWANCE` took, and
    the learner starts no update it has no time for. ``hook`` (:class:`~fwrl.runner.hooks.SessionHook`):
    told when acting starts, asked after each acting step whether to stop acting (a stop it asks for
    reads as a time limit); its ``learns`` false: no updates, each batch handed back to the store
    unread. ``tracker``: rank 0's W&B run (:mod:`fwrl.runner.tracking`), sent every metrics row and
    the ``--video-every`` videos."""
    started = time.monotonic() if started is None else started
    hook = hook if hook is not None else SessionHook()
    setup, acting_parts, learning_parts, state, source = build_run(config, Path(run_dir), resume, accept_config_edits)
    config, counters, stop = setup.config, state.counters, Stop()
    peers = Peers(setup.ranks, setup.group, counters)
    acting = ActingLoop(acting_parts.pool, acting_parts.store, acting_parts.rollouts, acting_parts.streams,
                        acting_parts.new_loop, acting_parts.timers, state.budget, counters, stop,
                        peers.episode_sink(state.episodes, config.num_workers))
    sink: MetricsSink | None = None  # rank 0's, made below; a checkpoint records how many rows it wrote
    checkpoints = CheckpointWriter(lambda: source.snapshot(acting.acted_steps, sink.rows if sink is not None else -1))
    # what stopping needs: the last update (the learner may be in one), the last checkpoint's copy and write
    limit = TimeLimit(started, config.max_seconds, lambda: (counters.update_seconds + source.copy_seconds
                                                          + checkpoints.write_seconds + STOP_ALLOWANCE))
    learning = LearnerLoop(learning_parts.learner, acting_parts.rollouts, state.budget, learning_parts.timer,
                           learning_parts.stream, learning_parts.update_lock, counters, stop, limit, peers,
                           learn=hook.learns)
    stats = RunStats(counters, state.episodes, peers, state.clock, acting_parts.timers, learning_parts.timer,
                     acting.queue_depth, setup.device)
    run_dir = setup.folder.path
    progress = (progress or Progress(config, run_dir)) if setup.main else None
    sink = (MetricsSink(run_dir, progress, resumed=state.start if state.resumed else None, tracker=tracker,
                        episodes=state.episodes) if setup.main else None)
    evaluator = video = None
    try:
        with stop.on_signals(), switch_interval(0.001), DeviceStreams.use(acting_parts.streams.inference):
            if progress is not None:
                progress.start(state.budget, limit.deadline)
            if limit.allows_start():
                acting_parts.pool.start()
            else:  # start-up took the whole time limit: no workers are started, the run stops at once
                stop.request("time limit")
            learning.start()
            acting.start()
            state.clock.start()
            hook.acting_started(state.clock.started)
            if config.eval_every > 0 and setup.main:
                from fwrl.evaluation.evaluate import PeriodicEvaluator

                evaluator = PeriodicEvaluator(config, setup.device, counters.agent_steps, time.monotonic())
            if config.video_every > 0 and setup.main:
                from fwrl.evaluation.video import PeriodicVideo

                video = PeriodicVideo(config, run_dir / VIDEOS, setup.device, counters.updates)
            schedule = None
            if setup.main:
                schedule = _schedule(config, counters, stats, sink, lambda name: checkpoints.request(run_dir / name),
                                     _evaluation_job(evaluator, acting_parts.model, acting_parts.weights.lock, sink)
                                     if evaluator is not None else None,
                                     _video_job(video, counters, acting_parts.model, acting_parts.weights.lock, tracker)
                                     if video is not None else None)
            lost = _act(counters, acting, learning, stop, limit, schedule, hook)
            stop.set()
            learning.join()
            acting.join()
            if learning.peers.stopped and stop.reason == "budget":
                stop.reason = "another learner rank"
            if video is not None and stop.reason == "budget" and not stop.errors:  # the last video, whole
                # a mark the last updates passed after acting stopped (the learner trails the acting loop)
                video.maybe_start(counters.updates, counters.agent_steps, acting_parts.model, acting_parts.weights.lock)
                video.close(wait=True)
                for at_steps, videos in video.poll():
                    if tracker is not None:
                        tracker.log_videos(videos, at_steps)
            final = None
            if sink is not None and not stop.errors:  # the final row, over the whole session, before the
                session = state.clock.session()         # final checkpoint (which counts it)
                steps = counters.agent_steps - state.start["agent_steps"]
                final = stats.row(steps / session if session > 0 else math.nan)
                sink.write(final, show=False)
            if setup.main:
                checkpoints.request(setup.folder.checkpoint)
                checkpoints.flush()
            if stop.errors:
                raise stop.errors[0]
            if final is not None:
                progress.finish(final)
            if lost is not None:
                raise lost
    finally:
        stop.set()
        learning.join()
        acting.join()
        if evaluator is not None:
            evaluator.close()
        if video is not None:
            video.close()
        acting_parts.pool.close(grace=limit.close_grace())  # a hung worker does not outlast the time limit
        if progress is not None:
            progress.stop()
        if sink is not None:
            sink.close()
        checkpoints.close()
        if setup.group is not None:
            setup.group.close()
    episodes = state.episodes
    return TrainResult(counters.agent_steps, counters.updates, episodes.count,
                       episodes.mean_return(), episodes.mean_success(), stop.stopped_by, stop.signal,
                       time.monotonic() - started)


def _act(counters: Counters, acting: ActingLoop, learning: LearnerLoop, stop: Stop, limit: TimeLimit,
         schedule: Schedule | None, hook: SessionHook) -> WorkersLost | None:
    """The calling acting thread's loop until the run stops; returns the loss of every worker, if
    that stopped it (raised once the final checkpoint is written). After each step: the time limit,
    then the ``hook``'s own stop (both read as a time limit), then rank 0's periodic jobs."""
    while not stop.is_set():
        if not acting.done:
            try:
                acting.step()
            except WorkersLost as exc:  # stop cleanly: final checkpoint, then the message
                stop.request("workers lost")
                return exc
        else:  # the rollouts of the budget's last batch are done: wait for the learner
            acting.deliver()
            learning.join(0.1)
        now = time.monotonic()
        if hook.stop_acting(now, learning.updated) or limit.must_stop(now):
            stop.request("time limit")
            break
        if schedule is not None:
            schedule.run_due(now, counters.agent_steps)
    return acting.lost  # another acting thread's, if that stopped the run


def _schedule(config: TrainConfig, counters: Counters, stats: RunStats, sink: MetricsSink,
              checkpoint: Callable[[str], None], evaluation: PeriodicJob | None, video: PeriodicJob | None) -> Schedule:
    """Rank 0's periodic jobs (``fwrl.runner.schedule``) on the config's intervals: metrics rows
    (``stats``' rows into ``sink``), ``checkpoint(name)`` requests, and the evaluation and video jobs
    where the run has them."""
    return periodic_jobs(time.monotonic(), counters.agent_steps, log_interval=config.log_interval,
                         log_every_steps=config.log_every_steps,
                         checkpoint_interval=config.checkpoint_interval, milestone_interval=config.milestone_interval,
                         row=stats.row, write=sink.write, checkpoint=checkpoint, updated=lambda: counters.updated,
                         evaluation=evaluation, video=video)


def _evaluation_job(evaluator, model: AgentNet, lock: threading.Lock, sink: MetricsSink) -> PeriodicJob:
    """The periodic evaluation's job: start one of ``model`` (the acting copy, read under ``lock``) where
    due, write the rows of those done."""
    def evaluation(now: float, steps: int) -> None:
        evaluator.maybe_start(steps, model, lock)
        for row in evaluator.poll():
            sink.write(row, show=False)

    return evaluation


def _video_job(video, counters: Counters, model: AgentNet, lock: threading.Lock, tracker=None) -> PeriodicJob:
    """The periodic video's job: record ``model`` (the acting copy, read under ``lock``) where due, send
    the videos done to ``tracker``."""
    def record(now: float, steps: int) -> None:
        video.maybe_start(counters.updates, steps, model, lock)
        for at_steps, videos in video.poll():
            if tracker is not None:
                tracker.log_videos(videos, at_steps)

    return record
