"""Live progress of a training run: a rich panel on a terminal, plain lines otherwise.

The panel shows the run folder, elapsed time and an ETA, steps/s smoothed
over the last 30 seconds (so an interval without an update does not read 0),
until the first update what the learner waits for ("filling the first batch:
R of B rollouts of T steps ready", then "first update running"), episode
statistics and losses, and where each thread's time went. A run past its step
budget (the learner takes whole batches) says by how much. It is fed the
metrics rows of ``fwrl.runner.run_metrics``; the run tells it its budget (every learner rank's
batches counted) and its deadline when it starts (:meth:`Progress.start`).
"""

from __future__ import annotations

import math
import time
from collections import deque

from rich.console import Console
from rich.live import Live
from rich.table import Table

from fwrl.runner.budget import Budget

SMOOTHING_SECONDS = 30.0


def _fmt(value) -> str:
    if value == "" or value is None:
        return "-"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:.4g}"
    return str(value)


def format_duration(seconds: float) -> str:
    """``3:07`` / ``1:02:03`` / ``2 d 03:04:05``."""
    if seconds is None or math.isnan(seconds) or seconds < 0:
        return "-"
    seconds = int(round(seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{hours}:{minutes:02d}:{secs:02d}" if hours or days else f"{minutes}:{secs:02d}"
    return f"{days} d {text}" if days else text


def steps_text(steps: int, total: int, per_update: int) -> str:
    """``1,600 / 2,000 agent steps (80.0%)``; past the budget, by how much (less than one batch of
    ``per_update`` steps: the learner takes whole batches while it is below the budget)."""
    if steps <= total:
        return f"{steps:,} / {total:,} agent steps ({100 * steps / total:.1f}%)"
    return (f"{steps:,} agent steps: budget {total:,} reached in whole batches of {per_update:,} steps, "
            f"the last one {steps - total:,} past it")


class SmoothedRate:
    """Steps per second over the last ``window`` seconds of (time, steps) samples."""

    def __init__(self, window: float = SMOOTHING_SECONDS):
        self.window = window
        self.samples: deque[tuple[float, int]] = deque()

    def add(self, t: float, steps: int) -> None:
        self.samples.append((t, steps))
        while len(self.samples) > 2 and self.samples[-1][0] - self.samples[1][0] >= self.window:
            self.samples.popleft()

    def rate(self) -> float:
        if len(self.samples) < 2:
            return math.nan
        (t0, s0), (t1, s1) = self.samples[0], self.samples[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else math.nan


class Progress:
    SHOWN = ("episodes", "mean_return", "mean_success", "total_loss", "pg_loss", "baseline_loss",
             "entropy_loss", "learning_rate", "worker_restarts")
    # panel rows: where the time of each thread went (share/<stage> columns of metrics rows)
    TIME_SHARES = {
        "acting time": (("env_wait", "envs"), ("inference_forward", "forward"), ("rollout_bookkeeping", "store"),
                        ("actor_other", "other")),
        "learner time": (("learner_idle", "idle"), ("learner_gather", "gather"), ("learner_forward", "forward"),
                         ("learner_backward", "backward"), ("learner_allreduce", "all-reduce"),
                         ("learner_optimiser", "optimiser"),
                         ("learner_publish", "publish"), ("learner_other", "other")),
    }

    def __init__(self, config, run_dir, console: Console | None = None):
        self.config = config
        self.run_dir = run_dir
        self.console = console or Console(stderr=True)
        self.live: Live | None = None
        self.rate = SmoothedRate()
        self.started = time.monotonic()
        self.budget = Budget.of(config)  # one learner rank's until the run starts it with its own
        self.deadline = math.inf  # time.monotonic() when --max-seconds runs out (given at the start)

    # ------------------------------------------------------------------ figures
    def eta(self, row: dict) -> float:
        """Seconds until the step budget (or this session's --max-seconds) at the smoothed rate."""
        left = max(0, self.budget.total_steps - int(row.get("agent_steps", 0)))
        rate = self.rate.rate()
        eta = left / rate if rate and rate > 0 else math.nan
        if self.deadline < math.inf:
            remaining = max(0.0, self.deadline - time.monotonic())
            eta = remaining if math.isnan(eta) else min(eta, remaining)
        return eta

    def status(self, row: dict) -> str:
        steps, total = int(row.get("agent_steps", 0)), self.budget.total_steps
        if not row:
            return "starting workers ..."
        batch, unroll = self.budget.batch_size, self.budget.unroll_length
        if int(row.get("updates", 0)) == 0 or steps == 0:
            ready = min(batch, int(row.get("rollout_columns", 0)))
            acted = f"{int(row.get('acted_steps', 0)):,} agent steps acted"
            if ready < batch:
                return f"filling the first batch: {ready} of {batch} rollouts of {unroll} steps ready ({acted})"
            return f"first update running: its batch of {batch} rollouts x {unroll} steps is ready ({acted})"
        elapsed = format_duration(float(row.get("time", 0)))
        if self.config.max_seconds > 0:  # this session's limit (a resumed run's elapsed time counts its past)
            elapsed += f" (time limit {format_duration(self.config.max_seconds)})"
        return (f"{steps_text(steps, total, self.budget.steps_per_update)}, {_fmt(round(self.rate.rate(), 1))} steps/s, "
                f"elapsed {elapsed}, ETA {format_duration(self.eta(row))}")

    # ------------------------------------------------------------------ rendering
    def _table(self, row: dict) -> Table:
        table = Table(title=f"fwrl train {self.config.env} / {self.config.core}  ->  {self.run_dir}",
                      show_header=False)
        table.add_row("progress", self.status(row))
        for key in self.SHOWN:
            if self._shown(row, key):
                table.add_row(key, _fmt(row[key]))
        for title, names in self.TIME_SHARES.items():
            parts = [f"{short} {100 * float(row[f'share/{name}']):.0f}%" for name, short in names
                     if f"share/{name}" in row]
            if parts:
                table.add_row(title, "  ".join(parts))
        if "policy_lag_mean" in row:
            table.add_row("policy lag", f"{_fmt(row['policy_lag_mean'])} updates (max {_fmt(row.get('policy_lag_max'))})")
        if "rollout_queue" in row:
            table.add_row("rollout queue", _fmt(row["rollout_queue"]))
        if "peak_memory_mb" in row:
            table.add_row("peak memory", f"{_fmt(row['peak_memory_mb'])} MiB")
        return table

    @staticmethod
    def _shown(row: dict, key: str) -> bool:
        """Whether a plain line shows ``key``: ``mean_success`` only where the env reports success."""
        if key not in row:
            return False
        return key != "mean_success" or _fmt(row[key]) != "-"

    def start(self, budget: Budget | None = None, deadline: float = math.inf) -> None:
        """The run starts: its ``budget`` (None: one learner rank's, from the config) and ``deadline``
        (``time.monotonic()`` when its --max-seconds runs out; inf: no limit)."""
        self.budget = budget or self.budget
        self.deadline = deadline
        self.started = time.monotonic()
        self.console.print(f"fwrl train: run folder {self.run_dir}", highlight=False, soft_wrap=True)
        if self.console.is_terminal:
            self.live = Live(self._table({}), console=self.console, refresh_per_second=2, transient=False)
            self.live.start()

    def update(self, row: dict) -> None:
        if "agent_steps" in row and "time" in row:
            self.rate.add(float(row["time"]), int(row["agent_steps"]))
        if self.live is not None:
            self.live.update(self._table(row))
        else:
            parts = [self.status(row)] + [f"{k}={_fmt(row[k])}" for k in self.SHOWN if self._shown(row, k)]
            self.console.print(" ".join(parts), highlight=False, soft_wrap=True)

    def finish(self, row: dict) -> None:
        """The run's last row: the panel shows it; plain output says nothing more (the command's
        own last line gives the run's account)."""
        if self.live is not None:
            self.live.update(self._table(row))

    def stop(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None
