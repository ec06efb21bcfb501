"""Progress of a sweep: cells done, running, failed and pending, an ETA, and a line per finished cell.

Plain lines (they read the same in a terminal, a log file or a SLURM output):
a line when a cell starts or ends, and a summary line when the counts change or
every ``interval`` seconds. The ETA: each running cell's time left, from its
run's progress (``metrics.csv``: agent steps against the budget, at the run's
rate so far), and for each waiting cell the mean time of the cells finished so
far (in this invocation, else in earlier ones; before any finished, what the
running ones are expected to take), over the cells that run at once. Where a
running cell's time left is not known yet, no ETA is shown rather than a wrong one.
"""

from __future__ import annotations

import csv
import io
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, TextIO

from fwrl.launch.sweep.plan import CellState
from fwrl.runner.train_progress import format_duration

SHOWN = ("done", "running", "failed", "interrupted", "queued", "pending")


class SweepProgress:
    """Counts per state of a sweep's cells, updated as cells start and end."""

    def __init__(self, sweep_name: str, states: Sequence[CellState], parallel: int, out: TextIO | None = None,
                 interval: float = 30.0, time_left: Callable[[str], float | None] | None = None):
        self.name = sweep_name
        self.time_left = time_left or (lambda cell: None)  # a running cell's seconds left (None: unknown)
        self.state = {s.name: s.state for s in states}
        self.parallel = max(1, parallel)
        self.out = out or sys.stderr
        self.interval = interval
        self.started: dict[str, float] = {}
        self.durations = [float(s.status["seconds"]) for s in states
                          if s.state == "done" and s.status and s.status.get("seconds")]
        self.fresh: list[float] = []  # durations of cells finished in this invocation
        self.last_line = ""
        self.last_time = 0.0

    def counts(self) -> dict[str, int]:
        values = list(self.state.values())
        return {state: values.count(state) for state in SHOWN}

    def eta(self, now: float | None = None) -> float | None:
        """Seconds left (None where unknown): the running cells' time left, by their runs' progress
        (else the mean duration less their time so far, while that is positive), plus a mean duration
        per waiting cell, over the cells that run at once."""
        durations = self.fresh or self.durations
        mean = sum(durations) / len(durations) if durations else None
        now = time.time() if now is None else now
        running: list[tuple[float, float | None]] = []  # (seconds so far, seconds left) per running cell
        for cell, began in self.started.items():
            if self.state[cell] == "running":
                so_far, left = now - began, self.time_left(cell)
                if left is None and mean is not None and mean > so_far:
                    left = mean - so_far
                running.append((so_far, left))
        if any(left is None for _, left in running):
            return None  # a cell whose time left is not known (yet): no ETA rather than 0:00
        if mean is None and running:  # nothing finished yet: a waiting cell takes what a running one will
            mean = sum(so_far + left for so_far, left in running) / len(running)
        waiting = sum(1 for s in self.state.values() if s in ("pending", "interrupted", "queued"))
        if waiting and mean is None:
            return None
        return (waiting * (mean or 0.0) + sum(left for _, left in running)) / self.parallel

    def summary(self) -> str:
        counts = self.counts()
        parts = [f"{counts[s]} {s}" for s in SHOWN if counts[s] or s in ("done", "running", "failed", "pending")]
        eta = self.eta()
        left = counts["running"] + counts["pending"] + counts["interrupted"] + counts["queued"]
        tail = f", ETA {format_duration(eta)}" if eta is not None and left else ""
        return f"sweep {self.name}: {len(self.state)} cells: {', '.join(parts)}{tail}"

    def show(self, force: bool = False) -> None:
        """Print the summary line if the counts changed, ``interval`` passed, or ``force``."""
        line = self.summary()
        now = time.monotonic()
        counts_line = line.split(", ETA")[0]
        if force or counts_line != self.last_line.split(", ETA")[0] or now - self.last_time >= self.interval:
            print(line, file=self.out, flush=True)
            self.last_line, self.last_time = line, now

    def start(self, cell: str) -> None:
        self.state[cell] = "running"
        self.started[cell] = time.time()
        print(f"  start    {cell}", file=self.out, flush=True)

    def end(self, cell: str, status: dict[str, Any] | None, state: str) -> None:
        """A cell's runner ended; ``state`` is its status's (``failed`` lines carry the log path)."""
        self.state[cell] = state
        seconds = time.time() - self.started.get(cell, time.time())
        if state == "done":
            self.fresh.append(seconds)
            print(f"  done     {cell} in {format_duration(seconds)}", file=self.out, flush=True)
        elif state == "failed":
            status = status or {}
            what = f"{status.get('phase', 'train')} exit status {status.get('exit_code')}"
            message = f": {status['message']}" if status.get("message") else ""
            print(f"  FAILED   {cell} ({what}){message}\n           log: {status.get('log', '?')}",
                  file=self.out, flush=True)
        elif state == "running":
            print(f"  elsewhere {cell} (another process runs it)", file=self.out, flush=True)
        else:
            message = (status or {}).get("message") or state
            print(f"  stopped  {cell} ({message}); it resumes on the next run", file=self.out, flush=True)


def run_time_left(run_dir: Path, total_steps: int, now: float | None = None) -> float | None:
    """Seconds a run needs to reach ``total_steps`` at its rate so far, from the last row of its
    ``metrics.csv`` (agent steps, and the run's time at that row) less the time since that row was
    written; None before its first update."""
    row = last_metrics_row(Path(run_dir) / "metrics.csv")
    try:
        steps, seconds = int(float(row["agent_steps"])), float(row["time"])
    except (KeyError, TypeError, ValueError):
        return None
    if steps <= 0 or seconds <= 0:
        return None
    now = time.time() if now is None else now
    since = max(0.0, now - os.path.getmtime(Path(run_dir) / "metrics.csv"))
    return max(1.0, (total_steps - steps) * seconds / steps - since)


def last_metrics_row(path: Path, tail_bytes: int = 65536) -> Mapping[str, str] | None:
    """The header and last row of a CSV file, read from its start and its end only (None: no row)."""
    try:
        with open(path, "rb") as f:
            header = f.readline().decode("utf-8", "replace")
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(len(header), size - tail_bytes))
            tail = f.read().decode("utf-8", "replace")
            if not tail.endswith("\n"):  # a row still being written (or cut short): not one to show
                tail = tail[:tail.rfind("\n") + 1]
            lines = [line for line in tail.splitlines() if line.strip()]
    except OSError:
        return None
    if not header.strip() or not lines or size <= len(header.encode()):
        return None
    rows = list(csv.DictReader(io.StringIO(header + lines[-1] + "\n")))
    return rows[0] if rows else None
