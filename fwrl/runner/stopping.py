"""How a run stops: one stop every part watches, why it came, the stop signals, and the time limit.

A run stops at its step budget, at ``--max-seconds``, on SIGINT (Ctrl-C), SIGTERM or SIGHUP (the
terminal closed), when every env worker is lost, or on an error in a thread; each way out writes
the final checkpoint (``fwrl.runner.train``).
"""

from __future__ import annotations

import contextlib
import math
import signal
import sys
import threading
import time
from typing import Callable, Iterator

STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))

# Seconds kept back from a --max-seconds limit, besides the last update and the last checkpoint write
# (both measured), for stopping: closing the workers, the final metrics row, the panel, and the
# interpreter's own exit after the command returns (about a second with torch and a run in memory:
# measured 0.95-1.01 s on the 2-core machine, where 1 s of allowance ended a 35 s limit at 35.1-35.3 s).
STOP_ALLOWANCE = 2.0
# Of that, what the interpreter's exit takes after the workers are closed: a worker that does not
# leave on its own (a hung env) is killed once only this much of the limit is left.
EXIT_ALLOWANCE = 1.0


class Stop:
    """The run's stop: an event every loop watches, the reason (``budget`` until another comes;
    the first reason given wins, but a stop signal always names itself), the signal's number
    (0: none came) and the errors the threads raised (the run then stopped by ``error``)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.reason = "budget"
        self.signal = 0
        self.errors: list[BaseException] = []

    def is_set(self) -> bool:
        return self.event.is_set()

    def request(self, reason: str) -> None:
        """Stop, for ``reason`` unless the run is already stopping for another."""
        if not self.event.is_set() and self.reason == "budget":
            self.reason = reason
        self.event.set()

    def fail(self, error: BaseException) -> None:
        """A thread failed: stop, and raise ``error`` once the run has stopped cleanly."""
        self.errors.append(error)
        self.event.set()

    def set(self) -> None:
        """Stop without a reason of its own (the budget's end, or the way out of a failure)."""
        self.event.set()

    @property
    def stopped_by(self) -> str:
        return "error" if self.errors else self.reason

    def _on_signal(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if not self.signal:  # said at once: an update in progress may take seconds to end
            print(f"fwrl: {name} received: stopping after the current update, then the final checkpoint",
                  file=sys.stderr, flush=True)
        self.reason = f"signal {name}"
        self.signal = signum
        self.event.set()

    @contextlib.contextmanager
    def on_signals(self) -> Iterator["Stop"]:
        """Stop on SIGINT, SIGTERM and SIGHUP while inside (the old handlers come back after)."""
        old = {s: signal.signal(s, self._on_signal) for s in STOP_SIGNALS}
        try:
            yield self
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)


class Clock:
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


class TimeLimit:
    """``--max-seconds``: the command's deadline, counted from ``started`` (``time.monotonic()``
    when the command began, so start-up counts), and what stopping needs before it: ``reserve()``
    seconds (the last update, the last checkpoint's copy and write, :data:`STOP_ALLOWANCE`)."""

    def __init__(self, started: float, max_seconds: float, reserve: Callable[[], float] = lambda: STOP_ALLOWANCE):
        self.started = started
        self.deadline = started + max_seconds if max_seconds > 0 else math.inf
        self.reserve = reserve

    def allows_start(self) -> bool:
        """Whether any time is left to start the workers (start-up may have taken all of it)."""
        return time.monotonic() + STOP_ALLOWANCE < self.deadline

    def must_stop(self, now: float | None = None) -> bool:
        """Whether stopping must begin now to end within the limit."""
        return (time.monotonic() if now is None else now) + self.reserve() >= self.deadline

    def close_grace(self, most: float = 5.0) -> float:
        """Seconds the env workers may take to leave on their own at the end: ``most``, or less
        where the limit leaves less before the interpreter's exit (:data:`EXIT_ALLOWANCE`)."""
        return min(most, max(0.0, self.deadline - time.monotonic() - EXIT_ALLOWANCE))


@contextlib.contextmanager
def switch_interval(seconds: float) -> Iterator[None]:
    """Python's GIL switch interval while inside. The acting and learner threads hand the GIL back
    and forth around every torch call; 1 ms (Python's default is 5 ms) keeps the actors from
    waiting on the learner's Python code."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    try:
        yield
    finally:
        sys.setswitchinterval(old)
