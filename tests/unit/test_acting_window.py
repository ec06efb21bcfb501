"""The acting loop of ``fwrl.runner.train`` stops when its session hook asks it to: the bench's
(``ActingWindow``) at its time (a bench's warm-up and window), put off to ``after_first_update``
seconds past the first update where that is later: a start that takes the warm-up and more leaves
the bench its whole window. Without an update it waits for one at most ``FIRST_UPDATE_WAIT`` past
its time. The base hook never stops a run."""

from __future__ import annotations

import time

import pytest

import fwrl.launch.bench.throughput as throughput
from fwrl.launch.bench.throughput import ActingWindow
from fwrl.runner.counters import Counters
from fwrl.runner.hooks import SessionHook
from fwrl.runner.stopping import Stop, TimeLimit
from fwrl.runner.train import _act


class _Acting:
    done, lost = False, None

    def step(self) -> None:
        time.sleep(0.005)


class _Learning:
    """``updated`` from ``at`` seconds after it was made (never for None)."""

    def __init__(self, at: float | None):
        self.since = time.monotonic()
        self.at = at

    @property
    def updated(self) -> bool:
        return self.at is not None and time.monotonic() - self.since >= self.at


@pytest.mark.parametrize("first_update, until, after, earliest", [
    (0.3, 0.1, 0.4, 0.7),   # a late first update: acting goes on for ``after`` past it
    (0.05, 0.6, 0.2, 0.6),  # an early one: acting_until is later, and stands
    (None, 0.2, 0.4, 0.5),  # no update at all: its time, and then the wait for one (0.3 s here)
    (0.3, 0.1, None, 0.1),  # no after_first_update (fwrl train, --acting-only): its time alone
])
def test_acting_stops_at_its_time_or_after_the_first_update(first_update, until, after, earliest, monkeypatch):
    monkeypatch.setattr(throughput, "FIRST_UPDATE_WAIT", 0.3)
    start = time.monotonic()
    stop = Stop()
    window = ActingWindow(until, after)
    window.acting_started(start)
    lost = _act(Counters(), _Acting(), _Learning(first_update), stop, TimeLimit(start, 0.0), None, window)
    took = time.monotonic() - start
    assert lost is None and stop.is_set() and stop.reason == "time limit"
    assert earliest <= took < earliest + 2.0, took


def test_the_base_hook_leaves_the_stop_to_the_run():
    """Without a hook of its own a session acts until its own stops: here the time limit's."""
    start = time.monotonic()
    stop = Stop()
    lost = _act(Counters(), _Acting(), _Learning(None), stop, TimeLimit(start, 0.4), None, SessionHook())
    took = time.monotonic() - start
    assert lost is None and stop.reason == "time limit" and took < 3.0
    assert SessionHook().learns and not SessionHook().stop_acting(time.monotonic() + 1e9, True)
