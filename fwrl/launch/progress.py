"""Live progress of a training run: a rich panel on a terminal, plain lines otherwise."""

from __future__ import annotations

import math

from rich.console import Console
from rich.live import Live
from rich.table import Table


def _fmt(value) -> str:
    if value == "" or value is None:
        return "-"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:.4g}"
    return str(value)


class Progress:
    SHOWN = ("agent_steps", "steps_per_second", "episodes", "mean_return", "mean_success",
             "total_loss", "pg_loss", "baseline_loss", "entropy_loss", "learning_rate", "worker_restarts")
    # panel rows: where the time of each thread went (share/<stage> columns of metrics rows)
    TIME_SHARES = {
        "acting time": (("env_wait", "envs"), ("inference_forward", "forward"), ("rollout_bookkeeping", "store"),
                        ("actor_other", "other")),
        "learner time": (("learner_idle", "idle"), ("learner_gather", "gather"), ("learner_forward", "forward"),
                         ("learner_backward", "backward"), ("learner_optimiser", "optimiser"),
                         ("learner_publish", "publish")),
    }

    def __init__(self, config, run_dir, console: Console | None = None):
        self.config = config
        self.run_dir = run_dir
        self.console = console or Console(stderr=True)
        self.live: Live | None = None

    def _table(self, row: dict) -> Table:
        table = Table(title=f"fwrl train {self.config.env} / {self.config.core}  ->  {self.run_dir}",
                      show_header=False)
        total = self.config.total_steps
        steps = row.get("agent_steps", 0)
        table.add_row("progress", f"{steps:,} / {total:,} steps ({100 * steps / total:.1f}%)")
        for key in self.SHOWN[1:]:
            if key in row:
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

    def start(self) -> None:
        if self.console.is_terminal:
            self.live = Live(self._table({}), console=self.console, refresh_per_second=2, transient=False)
            self.live.start()

    def update(self, row: dict) -> None:
        if self.live is not None:
            self.live.update(self._table(row))
        else:
            parts = [f"{k}={_fmt(row[k])}" for k in self.SHOWN if k in row]
            self.console.print(" ".join(parts), highlight=False, soft_wrap=True)

    def stop(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None
