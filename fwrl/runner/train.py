"""``fwrl train``: one learner process, N env workers, until the step budget.

The run is made of named parts (``ARCHITECTURE.md``), built by :func:`fwrl.runner.build.build_run`
and wired here: :func:`train` is the one reader of the :class:`~fwrl.runner.build.Run`, and hands
each part its own collaborators (the budget, the counters, the pool, the store, ...):

- the acting threads (this one and ``acting_threads - 1`` more, :class:`~fwrl.runner.acting.ActingLoop`):
  batched inference for their slices of the env slots, rollouts written into the store on the
  device and handed to the learner's queue; this thread runs, after each of its steps, the
  periodic jobs (:mod:`fwrl.runner.schedule`: metrics rows, checkpoints, milestones,
  evaluations) and the stop checks;
- the learner thread (:class:`~fwrl.runner.learner_loop.LearnerLoop`): B rollout columns gathered
  on the device -> loss -> optimiser step -> publish weights (and their version) to the acting copy;
- the checkpoint thread (:class:`~fwrl.runner.checkpointing.CheckpointWriter`): writes snapshots.

On CUDA each acting thread and the learner issue their work on their own streams (``fwrl.agents.policy_weights``). Every
metrics row (:class:`~fwrl.runner.stats.RunStats`) says where the time went (``share/...``), how
stale the acting policy was (``policy_lag_mean`` / ``_max``, in updates), the mean rollout queue
depth and the peak memory. SIGINT, SIGTERM and SIGHUP stop the run cleanly with a final
checkpoint (:mod:`fwrl.runner.stopping`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

from fwrl.agents.policy_weights import DeviceStreams
from fwrl.envs.worker_pool import WorkersLost
from fwrl.runner.acting import ActingLoop
from fwrl.runner.build import Run, build_run
from fwrl.runner.checkpointing import CheckpointWriter
from fwrl.runner.counters import Counters
from fwrl.runner.learner_loop import LearnerLoop
from fwrl.runner.peers import Peers
from fwrl.runner.run_metrics import MetricsSink
from fwrl.runner.schedule import Schedule, periodic_jobs
from fwrl.runner.stats import RunStats
from fwrl.runner.stopping import STOP_ALLOWANCE, Stop, TimeLimit, switch_interval
from fwrl.runner.train_progress import Progress
from fwrl.settings.config import TrainConfig

VIDEOS = "videos"  # the run folder's --video-every videos

# With ``after_first_update`` (fwrl bench throughput): how long past its time acting waits for the
# first update before it stops without one (the bench then says the window held no update).
FIRST_UPDATE_WAIT = 120.0


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
          started: float | None = None, acting_seconds: float | None = None, learn: bool = True,
          accept_config_edits: bool = False, after_first_update: float | None = None, tracker=None) -> TrainResult:
    """Train until the step budget, a time limit, a stop signal (SIGINT, SIGTERM, SIGHUP) or an
    error; every way out writes ``checkpoint.pt``. ``resume`` continues the run in ``run_dir``
    (``accept_config_edits``: on a config.yaml edited since its checkpoint, recorded).

    Budgets: the learner takes whole batches of B x T agent steps (x learner ranks) while it is
    below ``total_steps``, so a run ends at most one batch past it; acting stops once the
    rollouts of the last batch are done. ``max_seconds`` limits the whole command, from
    ``started`` (``time.monotonic()`` when it began; default: now) to the return of this
    function, start-up and stop included: acting stops when the time left is what the last
    update, the last checkpoint write and :data:`~fwrl.runner.stopping.STOP_ALLOWANCE` took, and
    the learner starts no update it has no time for. ``acting_seconds`` (``fwrl bench
    throughput``): stop acting that many seconds after the workers started, whatever the
    start-up took, and with ``after_first_update`` no sooner than that many seconds after the
    acting thread saw the session's first update, which it waits for up to
    :data:`FIRST_UPDATE_WAIT` seconds more (a bench's window starts at its warm-up's end or at
    the first update, whichever is later, and lasts its seconds). ``learn`` false (``fwrl bench throughput --acting-only``): no updates, each
    batch handed back to the store unread. ``tracker``: rank 0's W&B run (:mod:`fwrl.runner.tracking`),
    sent every metrics row and the ``--video-every`` videos."""
    started = time.monotonic() if started is None else started
    run = build_run(config, Path(run_dir), resume, accept_config_edits)
    counters, stop = run.counters, Stop()
    peers = Peers(run.ranks, run.group, counters)
    acting = ActingLoop(run.pool, run.store, run.rollouts, run.streams, run.inference_loop, run.actor_timers,
                        run.budget, counters, stop, peers.episode_sink(run.episodes))
    sink: MetricsSink | None = None  # rank 0's, made below; a checkpoint records how many rows it wrote
    checkpoints = CheckpointWriter(lambda: run.snapshot(acting.acted_steps, sink.rows if sink is not None else -1))
    # what stopping needs: the last update (the learner may be in one), the last checkpoint's copy and write
    limit = TimeLimit(started, config.max_seconds, lambda: (counters.update_seconds + run.copy_seconds
                                                          + checkpoints.write_seconds + STOP_ALLOWANCE))
    learning = LearnerLoop(run.learner, run.rollouts, run.budget, run.learner_timer, run.streams.learner,
                           run.update_lock, counters, stop, limit, peers, learn=learn)
    stats = RunStats(counters, run.episodes, peers, run.clock, run.actor_timers, run.learner_timer,
                     acting.queue_depth, run.device)
    progress = (progress or Progress(run.config, run.run_dir)) if run.main else None
    sink = (MetricsSink(run.run_dir, progress, resumed=run.resumed if resume else None, tracker=tracker)
            if run.main else None)
    evaluator = video = None
    try:
        with stop.on_signals(), switch_interval(0.001), DeviceStreams.use(run.streams.inference):
            if progress is not None:
                progress.start(run.budget, limit.deadline)
            if limit.allows_start():
                run.pool.start()
            else:  # start-up took the whole time limit: no workers are started, the run stops at once
                stop.request("time limit")
            learning.start()
            acting.start()
            run.clock.start()
            acting_until = run.clock.started + acting_seconds if acting_seconds else math.inf
            if config.eval_every > 0 and run.main:
                from fwrl.evaluation.evaluate import PeriodicEvaluator

                evaluator = PeriodicEvaluator(run.config, run.device, counters.agent_steps, time.monotonic())
            if config.video_every > 0 and run.main:
                from fwrl.evaluation.video import PeriodicVideo

                video = PeriodicVideo(run.config, run.run_dir / VIDEOS, run.device, counters.updates)
            schedule = _schedule(run, stats, sink, checkpoints, evaluator, video, tracker) if run.main else None
            lost = _act(counters, acting, learning, stop, limit, schedule, acting_until, after_first_update)
            stop.set()
            learning.join()
            acting.join()
            if learning.peers.stopped and stop.reason == "budget":
                stop.reason = "another learner rank"
            if video is not None and stop.reason == "budget" and not stop.errors:  # the last video, whole
                # a mark the last updates passed after acting stopped (the learner trails the acting loop)
                video.maybe_start(counters.updates, counters.agent_steps, run.acting_model, run.weights.lock)
                video.close(wait=True)
                for at_steps, videos in video.poll():
                    if tracker is not None:
                        tracker.log_videos(videos, at_steps)
            final = None
            if sink is not None and not stop.errors:  # the final row, over the whole session, before the
                session = run.clock.session()           # final checkpoint (which counts it)
                steps = counters.agent_steps - run.resumed["agent_steps"]
                final = stats.row(steps / session if session > 0 else math.nan)
                sink.write(final, show=False)
            if run.main:
                checkpoints.request(run.run_dir / "checkpoint.pt")
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
        run.pool.close(grace=limit.close_grace())  # a hung worker does not outlast the time limit
        if progress is not None:
            progress.stop()
        if sink is not None:
            sink.close()
        checkpoints.close()
        if run.group is not None:
            run.group.close()
    episodes = run.episodes
    return TrainResult(counters.agent_steps, counters.updates, episodes.count,
                       episodes.mean_return(), episodes.mean_success(), stop.stopped_by, stop.signal,
                       time.monotonic() - started)


def _act(counters: Counters, acting: ActingLoop, learning: LearnerLoop, stop: Stop, limit: TimeLimit,
         schedule: Schedule | None, acting_until: float, after_first_update: float | None = None
         ) -> WorkersLost | None:
    """The calling acting thread's loop until the run stops; returns the loss of every worker, if
    that stopped it (raised once the final checkpoint is written). ``acting_until``: a time to stop
    acting at (``time.monotonic()``), put off to ``after_first_update`` seconds past the first
    update where that is later (until the first update, at most :data:`FIRST_UPDATE_WAIT` seconds)."""
    if after_first_update is not None:
        acting_until, settle = acting_until + FIRST_UPDATE_WAIT, acting_until
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
        if after_first_update is not None and learning.updated:
            acting_until, after_first_update = max(settle, now + after_first_update), None
        if limit.must_stop(now) or now >= acting_until:
            stop.request("time limit")
            break
        if schedule is not None:
            schedule.run_due(now, counters.agent_steps)
    return acting.lost  # another acting thread's, if that stopped the run


def _schedule(run: Run, stats: RunStats, sink: MetricsSink, checkpoints: CheckpointWriter, evaluator, video=None,
              tracker=None) -> Schedule:
    """Rank 0's periodic jobs (``fwrl.runner.schedule``), wired to this run's parts."""
    def evaluation(now: float, steps: int) -> None:
        evaluator.maybe_start(steps, run.acting_model, run.weights.lock)
        for row in evaluator.poll():
            sink.write(row, show=False)

    def record(now: float, steps: int) -> None:
        video.maybe_start(counters.updates, steps, run.acting_model, run.weights.lock)
        for at_steps, videos in video.poll():
            if tracker is not None:
                tracker.log_videos(videos, at_steps)

    config, counters = run.config, run.counters
    return periodic_jobs(time.monotonic(), counters.agent_steps, log_interval=config.log_interval,
                         log_every_steps=config.log_every_steps,
                         checkpoint_interval=config.checkpoint_interval, milestone_interval=config.milestone_interval,
                         row=stats.row, write=sink.write, checkpoint=lambda name: checkpoints.request(run.run_dir / name),
                         updated=lambda: counters.updated,
                         evaluation=evaluation if evaluator is not None else None,
                         video=record if video is not None else None)
