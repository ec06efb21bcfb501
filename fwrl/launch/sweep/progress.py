"""Progress of a sweep: cells done, running, failed and pending, an ETA, and a line per finished cell.

Plain lines (they read the same in a terminal, a log file or a SLURM output):
a line when a cell starts or ends, and a summary line when the counts change or
every ``interval`` seconds. The ETA is the mean time of the cells finished so
far (in this invocation, else in earlier ones) times the cells left, over the
cells that run at once.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Sequence, TextIO

from fwrl.launch.sweep.plan import CellState
from fwrl.launch.training.progress import format_duration

SHOWN = ("done", "running", "failed", "interrupted", "queued", "pending")


class SweepProgress:
    """Counts per state of a sweep's cells, updated as cells start and end."""

    def __init__(self, sweep_name: str, states: Sequence[CellState], parallel: int, out: TextIO | None = None,
                 interval: float = 30.0):
        self.name = sweep_name
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
        """Seconds left, from the mean duration of finished cells (None before any finished)."""
        durations = self.fresh or self.durations
        if not durations:
            return None
        mean = sum(durations) / len(durations)
        now = time.time() if now is None else now
        waiting = sum(1 for s in self.state.values() if s in ("pending", "interrupted", "queued"))
        running = sum(max(0.0, mean - (now - t)) for c, t in self.started.items() if self.state[c] == "running")
        return (waiting * mean + running) / self.parallel

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
