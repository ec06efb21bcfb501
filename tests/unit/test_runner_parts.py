"""The runner's parts one at a time, each built from stand-ins for its collaborators (no env
worker, no subprocess, no run): the budget's arithmetic, the acting loop, the learner loop, the
peers, the schedule, the metrics rows and the progress display (``ARCHITECTURE.md``, the runner's
parts: each takes its collaborators, never the run)."""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
import torch

from fwrl.agents.distributed import CollectiveFailed, Ranks
from fwrl.agents.learner import LearnerStats
from fwrl.agents.rollout_queue import RolloutQueue
from fwrl.agents.rollouts import Rollout
from fwrl.agents.stage_timer import StageTimer
from fwrl.envs.worker_pool import EpisodeRecord, PoolSlice
from fwrl.errors import FwrlError
from fwrl.runner.acting import ActingLoop
from fwrl.runner.budget import Budget
from fwrl.runner.counters import ACTING, Counters
from fwrl.runner.learner_loop import LearnerLoop
from fwrl.runner.peers import Peers
from fwrl.runner.run_metrics import Episodes, Mean
from fwrl.runner.schedule import periodic_jobs
from fwrl.runner.stats import RunStats
from fwrl.runner.stopping import Clock, Stop, TimeLimit
from fwrl.runner.train_progress import Progress

pytestmark = pytest.mark.timeout(10)


# ----------------------------------------------------------------------------- the budget

def test_one_update_counts_every_ranks_columns():
    assert Budget(1000, batch_size=4, unroll_length=5).steps_per_update == 20
    assert Budget(1000, batch_size=4, unroll_length=5, ranks=3).steps_per_update == 60
    config = SimpleNamespace(total_steps=2000, batch_size=8, unroll_length=10)
    assert Budget.of(config, ranks=2) == Budget(2000, 8, 10, 2)


@pytest.mark.parametrize("total, ranks, learnt, updates, columns", [
    (100, 1, 0, 5, 20),     # 5 updates of 4 x 5 steps; 4 columns each
    (101, 1, 0, 6, 24),     # a part of an update is a whole one: the learner takes whole batches
    (100, 2, 0, 3, 12),     # two ranks: 40 steps an update, each rank's acting hands over its own 4 columns
    (100, 1, 60, 2, 8),     # a resumed run: what its checkpoint learnt is not acted again
    (100, 2, 80, 1, 4),     # resumed on two ranks
    (100, 1, 100, 0, 0),    # the budget is met
    (100, 1, 120, 0, 0),    # past it (the last batch of an earlier session)
])
def test_updates_and_columns_left(total, ranks, learnt, updates, columns):
    budget = Budget(total, batch_size=4, unroll_length=5, ranks=ranks)
    assert budget.updates_left(learnt) == updates
    assert budget.columns_needed(learnt) == columns
    assert budget.reached(learnt) == (updates == 0)


# ----------------------------------------------------------------------------- the acting loop

class _Pool:
    """A pool of ``num_workers`` workers, not one of them started."""

    def __init__(self, num_workers: int = 2, restarts: int = 0):
        self.num_workers, self.envs_per_worker, self.restarts = num_workers, 2, restarts
        self.settings = SimpleNamespace(worker_splits=1)


class _Loop:
    """One acting thread's loop: each step acts ``per_step`` agent steps, hands over a rollout of
    ``columns`` columns and finishes an episode with the step's number as its return."""

    def __init__(self, source, timer, columns: int = 2, per_step: int = 10):
        self.source, self.timer, self.columns, self.per_step = source, timer, columns, per_step
        self.agent_steps = 0
        self.steps = 0

    def step(self, timeout, on_rollout, on_episode) -> None:
        self.steps += 1
        self.agent_steps += self.per_step
        on_rollout(Rollout(page=self.steps, worker=0, life=0, columns=self.columns))
        on_episode(EpisodeRecord(float(self.steps), 1, 0, 0))


def _acting(budget: Budget, counters: Counters, threads: int = 1, pool=None, queue_size: int = 64):
    episodes: list[EpisodeRecord] = []
    pool = pool or _Pool()
    store = SimpleNamespace(dropped_steps=3)
    streams = SimpleNamespace(acting_stream=lambda index: None)
    rollouts = RolloutQueue(queue_size)
    acting = ActingLoop(pool, store, rollouts, streams, _Loop, [StageTimer() for _ in range(threads)], budget,
                        counters, Stop(), episodes.append)
    return acting, rollouts, episodes


def test_acting_hands_over_the_budgets_columns_and_pushes_its_counters():
    counters = Counters(agent_steps=0, acted_steps=500)  # acted_steps: the sessions before a resume
    acting, rollouts, episodes = _acting(Budget(100, batch_size=4, unroll_length=5), counters)
    assert acting.columns_needed == 20
    steps = 0
    while not acting.done:
        acting.step()
        steps += 1
    assert steps == 10 and acting.columns_done == 20 and rollouts.qsize() == 10
    assert [e.episode_return for e in episodes] == [float(i) for i in range(1, 11)]
    assert counters.acting() == {"acted_steps": 600, "worker_restarts": 0, "dropped_steps": 3, "rollout_columns": 20}
    assert tuple(counters.acting()) == ACTING
    assert acting.queue_depth.take() == pytest.approx(5.5)  # the queue grew by one each step


def test_a_resumed_run_acts_only_for_the_updates_left():
    counters = Counters(agent_steps=80, updates=4)
    acting, _, _ = _acting(Budget(100, batch_size=4, unroll_length=5), counters)
    assert acting.columns_needed == 4
    acting.step(), acting.step()
    assert acting.done


def test_several_acting_threads_serve_their_slices_and_episodes_reach_the_calling_thread():
    counters = Counters()
    acting, _, episodes = _acting(Budget(400, batch_size=4, unroll_length=5), counters, threads=2,
                                  pool=_Pool(num_workers=4, restarts=2))
    assert [loop.source.workers for loop in acting.loops] == [(0, 1), (2, 3)]
    assert all(isinstance(loop.source, PoolSlice) for loop in acting.loops)
    callers = set()
    acting.episodes.on_episode = lambda record: (callers.add(threading.current_thread().name), episodes.append(record))
    acting.start()
    while not acting.done:
        acting.step()
    acting.stop.set()
    acting.join()
    assert acting.columns_done >= 80 and callers == {threading.current_thread().name}
    steps = sum(loop.steps for loop in acting.loops)
    assert len(episodes) == steps and counters.acting()["acted_steps"] == 10 * steps
    assert counters.acting()["worker_restarts"] == 2


# ----------------------------------------------------------------------------- the learner loop

class _Learner:
    """Each update learns its batch's columns x T x ranks agent steps (as ``fwrl.agents.learner``);
    the update number ``vetoed`` (1-based, of this session) is where another rank votes to stop."""

    def __init__(self, unroll_length: int, ranks: int = 1, vetoed: int | None = None, stats: LearnerStats = None):
        self.unroll_length, self.ranks, self.vetoed = unroll_length, ranks, vetoed
        self.stats = stats or LearnerStats()
        self.group, self.model = None, object()
        self.updates, self.votes = 0, 0
        self.started = self.closed = False

    def start(self, stop=None) -> bool:
        self.started = True
        return True

    def close(self) -> None:
        self.closed = True

    def update(self, pieces):
        self.updates += 1
        if self.updates == self.vetoed:
            return None
        self.stats.updates += 1
        self.stats.agent_steps += sum(p.width for p in pieces) * self.unroll_length * self.ranks
        self.stats.last = {"total_loss": float(self.updates)}
        self.stats.update_seconds = 0.01
        return self.stats.last

    def vote_stop(self) -> None:
        self.votes += 1


@dataclass
class _Feed:
    """The rollout queue's stand-in: batches of ``width`` columns, None once the stop is set."""

    width: int
    taken: list = field(default_factory=list)

    def get_batch(self, batch_size: int, stop: threading.Event):
        if stop.is_set():
            return None
        self.taken.append(batch_size)
        return [SimpleNamespace(width=batch_size)]


def _learning(learner, budget: Budget, counters: Counters, stop: Stop | None = None, limit: TimeLimit | None = None):
    stop = stop or Stop()
    peers = Peers(Ranks(), None, counters)
    feed = _Feed(budget.batch_size)
    loop = LearnerLoop(learner, feed, budget, StageTimer(), None, threading.Lock(), counters, stop,
                       limit or TimeLimit(time.monotonic(), 0.0), peers)
    return loop, feed, stop, peers


def test_the_learner_stops_at_the_budget_and_pushes_its_counters():
    budget, counters = Budget(100, batch_size=4, unroll_length=5, ranks=2), Counters()
    learner = _Learner(5, ranks=2)
    loop, feed, stop, _ = _learning(learner, budget, counters)
    assert not loop.updated
    loop.start()
    loop.join(5)
    assert not loop.thread.is_alive() and stop.is_set() and stop.stopped_by == "budget"
    assert learner.updates == 3 and feed.taken == [4, 4, 4] and learner.votes == 0  # 3 x 40 >= 100
    assert (counters.agent_steps, counters.updates, counters.last) == (120, 3, {"total_loss": 3.0})
    assert loop.updated and counters.update_seconds == 0.01
    assert learner.started and learner.closed  # its update process (where it has one) started and stopped


def test_a_resumed_learner_makes_only_the_updates_left():
    budget = Budget(100, batch_size=4, unroll_length=5)
    counters = Counters(agent_steps=80, updates=4)
    learner = _Learner(5, stats=LearnerStats(updates=4, agent_steps=80))
    loop, _, _, _ = _learning(learner, budget, counters)
    loop.start()
    loop.join(5)
    assert learner.updates == 1 and counters.agent_steps == 100 and counters.updates == 5


def test_another_ranks_stop_vote_ends_the_loop_after_the_same_update():
    budget, counters = Budget(1000, batch_size=4, unroll_length=5), Counters()
    learner = _Learner(5, vetoed=3)
    loop, _, stop, peers = _learning(learner, budget, counters)
    loop.start()
    loop.join(5)
    assert peers.stopped and stop.is_set() and counters.updates == 2 and learner.votes == 0


def test_a_stopped_run_votes_the_other_ranks_to_stop():
    stop = Stop()
    stop.request("signal SIGINT")
    learner = _Learner(5)
    loop, _, _, peers = _learning(learner, Budget(1000, 4, 5), Counters(), stop=stop)
    loop.start()
    loop.join(5)
    assert learner.votes == 1 and learner.updates == 0 and not peers.stopped


def test_no_time_for_another_update_stops_the_learner_with_a_vote():
    counters, now = Counters(), time.monotonic()
    limit = TimeLimit(now, 1.0, lambda: counters.update_seconds * 1000)  # each 0.01 s update leaves no time
    learner = _Learner(5)
    loop, _, stop, _ = _learning(learner, Budget(1000, 4, 5), counters, limit=limit)
    loop.start()
    loop.join(5)
    assert learner.updates == 1 and learner.votes == 1 and stop.stopped_by == "time limit"


def test_a_learner_that_fails_stops_the_run_with_its_error():
    class Failing(_Learner):
        def update(self, pieces):
            raise RuntimeError("out of memory")

    loop, _, stop, _ = _learning(Failing(5), Budget(1000, 4, 5), Counters())
    loop.start()
    loop.join(5)
    assert stop.stopped_by == "error" and str(stop.errors[0]) == "out of memory"


# ----------------------------------------------------------------------------- peers

class _Group:
    """Two learner ranks: ``gather`` gives this rank's and the other rank's (episodes, counters)."""

    def __init__(self, other):
        self.other = other
        self.checked, self.sent = 0, []

    def check_same_weights(self, model) -> None:
        self.checked += 1

    def gather(self, mine):
        self.sent.append(mine)
        return [mine, self.other]

    def missing_ranks(self):
        return [1]


def test_rank_0_receives_the_other_ranks_episodes_and_counters_every_exchange():
    counters = Counters()
    counters.acted(acted_steps=50, worker_restarts=1, dropped_steps=2, rollout_columns=7)
    other = ([EpisodeRecord(3.0, 4, 0, 5)], {"acted_steps": 40, "worker_restarts": 2, "dropped_steps": 0})
    group = _Group(other)
    peers = Peers(Ranks(0, 2), group, counters)
    episodes = Episodes(("t",))
    assert peers.episode_sink(episodes, num_workers=4) == episodes.add
    assert peers.totals() == {}
    peers.exchange(9, model=None)  # not due
    assert group.sent == [] and group.checked == 0
    peers.exchange(Peers.EXCHANGE_EVERY, model=None)
    assert group.sent == [([], {"acted_steps": 50, "worker_restarts": 1, "dropped_steps": 2})]  # summed ones only
    assert peers.totals() == {"acted_steps": 40, "worker_restarts": 2, "dropped_steps": 0}
    peers.deliver(episodes)
    assert episodes.count == 1 and episodes.mean_return() == 3.0
    peers.exchange(Peers.CHECK_EVERY, model=None)
    assert group.checked == 1


def test_another_rank_sends_its_episodes_and_a_failed_collective_names_the_missing_ranks():
    counters = Counters()
    group = _Group(([], {}))
    peers = Peers(Ranks(1, 2), group, counters)
    sink = peers.episode_sink(Episodes(("t",)), num_workers=5)  # rank 0 plays workers 0-2, rank 1 3-4
    sink(EpisodeRecord(1.0, 2, 0, 1))
    assert peers.outbox[0].worker == 4  # its run-wide number, as rank 0's episodes.csv names it
    peers.exchange(Peers.EXCHANGE_EVERY, model=None)
    assert [len(episodes) for episodes, _ in group.sent] == [1] and peers.outbox == []
    assert peers.counts == {}  # only rank 0 keeps the others' counters
    error = peers.explain(CollectiveFailed("timeout"), agent_steps=1234)
    assert isinstance(error, FwrlError) and "learner rank 1 of 2" in str(error) and "[1]" in str(error)
    assert "1,234 agent steps" in str(error)
    single = Peers(Ranks(), None, counters)
    single.exchange(Peers.EXCHANGE_EVERY, model=None)  # a single learner trades nothing
    assert single.totals() == {}


# ----------------------------------------------------------------------------- the schedule

def test_rank_0s_periodic_jobs_run_on_their_triggers():
    rows, checkpoints, evaluations, updated = [], [], [], [False]
    schedule = periodic_jobs(100.0, 1000, log_interval=10.0, checkpoint_interval=60.0, milestone_interval=500,
                             row=lambda rate: {"steps_per_second": rate}, write=rows.append,
                             checkpoint=checkpoints.append, updated=lambda: updated[0],
                             evaluation=lambda now, steps: evaluations.append(steps))
    schedule.run_due(105.0, 1200)
    assert rows == [] and checkpoints == [] and evaluations == [1200]
    schedule.run_due(110.0, 1400)  # the first row: the rate since the schedule began
    assert rows == [{"steps_per_second": 40.0}] and checkpoints == []
    updated[0] = True
    schedule.run_due(111.0, 1600)  # the first update: a checkpoint at once; a milestone passed
    assert checkpoints == ["checkpoint.pt", "checkpoint-1600.pt"]
    schedule.run_due(130.0, 1800)  # a row over the 20 s since the last one
    assert rows[-1] == {"steps_per_second": 20.0} and checkpoints[2:] == []
    schedule.run_due(171.0, 1900)
    assert checkpoints[2:] == ["checkpoint.pt"] and len(evaluations) == 5


def test_metrics_rows_by_agent_steps_as_well_as_by_seconds():
    """--log-every-steps: a short run's curves get their points by its steps too, not only every
    --log-interval seconds; each trigger counts on from any row."""
    rows = []
    schedule = periodic_jobs(0.0, 0, log_interval=5.0, checkpoint_interval=1e9, milestone_interval=0,
                             row=lambda rate: {"steps_per_second": rate}, write=rows.append,
                             checkpoint=lambda name: None, updated=lambda: False, log_every_steps=100)
    schedule.run_due(0.5, 60)
    assert rows == []
    schedule.run_due(1.0, 120)  # 100 steps passed within a second
    assert rows == [{"steps_per_second": 120.0}]
    schedule.run_due(1.5, 180)
    schedule.run_due(2.0, 250)  # the next hundred
    schedule.run_due(7.1, 260)  # 5 s since the last row
    schedule.run_due(7.2, 290)  # the steps count on from that row: next at 300
    schedule.run_due(7.3, 301)
    assert len(rows) == 4


def test_a_schedule_without_evaluations_or_milestones():
    checkpoints = []
    schedule = periodic_jobs(0.0, 0, log_interval=1e9, checkpoint_interval=1e9, milestone_interval=0,
                             row=lambda rate: {}, write=lambda row: None, checkpoint=checkpoints.append,
                             updated=lambda: False)
    assert [job.name for job in schedule.jobs] == ["metrics", "checkpoint", "milestone"]
    schedule.run_due(5.0, 10**9)
    assert checkpoints == []


# ----------------------------------------------------------------------------- the metrics rows

def test_a_metrics_row_reads_the_counters_episodes_and_timers():
    counters = Counters(agent_steps=100, updates=5, acted_steps=10)
    counters.learnt(140, 6, {"total_loss": 0.5}, 0.2)
    counters.acted(acted_steps=300, worker_restarts=1, dropped_steps=0, rollout_columns=12)
    episodes = Episodes(("t",), count=7)
    episodes.add(EpisodeRecord(2.0, 10, 0, 0))
    peers = Peers(Ranks(0, 2), None, counters)
    peers.counts = {1: {"acted_steps": 200, "worker_restarts": 0, "dropped_steps": 4}}
    peers.inbox.put(EpisodeRecord(4.0, 10, 0, 1))
    queue_depth = Mean()
    queue_depth.add(2.0), queue_depth.add(4.0)
    clock = Clock(before=50.0)
    stats = RunStats(counters, episodes, peers, clock, [StageTimer()], StageTimer(), queue_depth,
                     torch.device("cpu"))
    row = stats.row(12.34)
    assert list(row)[:12] == ["time", "agent_steps", "acted_steps", "updates", "steps_per_second", "episodes",
                              "mean_return", "mean_success", "worker_restarts", "dropped_steps", "rollout_columns",
                              "total_loss"]
    assert row["time"] == 50.0 and row["agent_steps"] == 140 and row["updates"] == 6
    assert row["acted_steps"] == 500 and row["worker_restarts"] == 1 and row["dropped_steps"] == 4  # both ranks
    assert row["rollout_columns"] == 12 and row["steps_per_second"] == 12.3 and row["total_loss"] == 0.5
    assert row["episodes"] == 9 and row["mean_return"] == 3.0 and math.isnan(row["mean_success"])
    assert row["rollout_queue"] == 3.0 and "share/env_wait" in row and row["peak_memory_mb"] > 0
    assert stats.row(math.nan)["steps_per_second"] == ""


# ----------------------------------------------------------------------------- the progress display

def test_progress_shows_the_budget_and_deadline_the_run_starts_it_with(tmp_path):
    from io import StringIO

    from rich.console import Console

    config = SimpleNamespace(total_steps=1000, batch_size=4, unroll_length=5, max_seconds=0, env="e", core="c")
    progress = Progress(config, tmp_path, console=Console(file=StringIO()))
    assert progress.budget == Budget(1000, 4, 5) and progress.deadline == math.inf
    progress.start(Budget(1000, 4, 5, ranks=3), time.monotonic() + 7.0)
    row = {"agent_steps": 1040, "updates": 18, "time": 5.0}
    assert "in whole batches of 60 steps, the last one 40 past it" in progress.status(row)
    progress.rate.add(0.0, 0), progress.rate.add(1.0, 1)  # 1 step/s: the deadline comes first
    assert 6.0 < progress.eta({"agent_steps": 100}) <= 7.0
    progress.stop()
