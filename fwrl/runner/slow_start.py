"""A slow first update says what to change.

``fwrl train`` shows "filling the first batch" and "first update running"
until the learner's first update; where that takes long (a fast-weight core at
a large batch on a CPU: the first update of ``--core rdn`` with B 32 x T 50 on
MinAtar came after 44 s), :class:`SlowStartHint` says once, on stderr, what the
learner waits for and which settings make the start faster. It wraps the run's
progress display (anything with ``start(budget, deadline)``, ``update(row)`` and ``stop``), fed
with the metrics rows, and changes nothing else.
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any, TextIO

from fwrl.runner.budget import Budget

# seconds after the workers started without an update before the hint is shown
HINT_AFTER = 30.0


def slow_start_text(config, row: dict, seconds: float) -> str:
    """What the learner waits for after ``seconds`` without an update, and what to change."""
    batch, unroll = config.batch_size, config.unroll_length
    slots = config.num_workers * config.envs_per_worker
    columns = int(float(row.get("rollout_columns") or 0))
    acted = int(float(row.get("acted_steps") or 0))
    if columns < batch:
        waits = (f"it is still filling its first batch ({columns} of {batch} rollouts of {unroll} steps, "
                 f"{acted:,} agent steps acted by {slots} envs)")
    else:
        waits = f"its first update of B {batch} x T {unroll} ({config.core}) is still running"
    return (f"fwrl train: no update after {seconds:.0f} s: {waits}. A faster start: a smaller batch or shorter "
            f"rollouts (--batch-size, --unroll-length), more envs (--envs-per-worker), or a GPU (--device cuda); "
            "the settings of the learning suite are in benchmarks/learning/README.md.")


class SlowStartHint:
    """The run's progress display, plus one line when the first update is slow in coming."""

    def __init__(self, progress: Any, config, after: float = HINT_AFTER, out: TextIO | None = None):
        self._inner = progress
        self._config = config
        self._after = after
        self._out = out
        self._started: float | None = None
        self._done = False

    def __getattr__(self, name: str) -> Any:  # the rest of the display (finish, its figures) is the display's
        return getattr(self._inner, name)

    def start(self, budget: Budget | None = None, deadline: float = math.inf) -> None:
        """The run starts (its budget and deadline go to the display)."""
        self._started = time.monotonic()
        self._inner.start(budget, deadline)

    def update(self, row: dict) -> None:
        self._inner.update(row)
        if self._done or self._started is None:
            return
        if int(float(row.get("updates") or 0)) > 0 and int(float(row.get("agent_steps") or 0)) > 0:
            self._done = True  # it came: nothing to say
            return
        waited = time.monotonic() - self._started
        if waited >= self._after:
            self._done = True
            print(slow_start_text(self._config, row, waited), file=self._out or sys.stderr, flush=True)

    def stop(self) -> None:
        self._inner.stop()
