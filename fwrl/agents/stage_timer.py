"""Where the time goes: seconds per named stage of one thread, per log interval.

``with timer.stage("inference_forward", device_work=True): ...`` adds the
stage's time to its total. On the CPU that is wall time, and a stage that
spans the end of an interval is split at it: each interval gets only its own
part, so the stages of one thread (which run one after another) never add up
to more than the interval's wall time. Work on a CUDA stream is asynchronous,
so for ``device_work`` stages on CUDA the timer records a pair of CUDA events
on the current stream and reads their elapsed time when the interval is
collected (one host sync per log interval, not per step); the thread's host
stages (e.g. waiting for rollouts) may then overlap its stream's work, and
``collect`` takes the overlap out of the host stages (the thread was waiting
while its stream ran), so the shares of one thread still sum to at most 1.
``collect()`` returns the totals since the last call and the wall time they
cover, and starts a new interval.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import torch


# The profiler range of one acting call (``InferenceLoop.step``: one batch of ready workers served),
# beside the ``fwrl/<stage>`` ranges of the stages inside it.
ACTING_CALL = "fwrl/acting_call"


class StageTimer:
    def __init__(self, device: torch.device | str = "cpu"):
        self.cuda = torch.device(device).type == "cuda"
        self._lock = threading.Lock()
        self._seconds: dict[str, float] = defaultdict(float)
        self._pending: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []
        self._open: dict[int, list] = {}  # stages under way: id -> [name, counted from]
        self._since = time.perf_counter()

    def stage(self, name: str, device_work: bool = False) -> "_Stage":
        """Count the block's time to ``name``; under ``torch.profiler`` it is the range ``fwrl/<name>``
        (``fwrl bench throughput --profile-path``). A plain object, not a generator context: an acting
        call opens about a dozen stages, and a generator's context costs several times as much."""
        return _Stage(self, name, device_work)

    def add(self, seconds: dict[str, float]) -> None:
        """Count stages timed elsewhere (the update process's, for the learner thread that waited on
        them) to this interval."""
        with self._lock:
            for name, value in seconds.items():
                self._seconds[name] += value

    def collect(self) -> tuple[dict[str, float], float]:
        """(seconds per stage, wall seconds) since the last call; stages under way count up to now."""
        with self._lock:
            now = time.perf_counter()
            for running in self._open.values():  # the part of a running stage that lies in this interval
                self._seconds[running[0]] += now - running[1]
                running[1] = now
            seconds, self._seconds = self._seconds, defaultdict(float)
            pending, self._pending = self._pending, []
            wall, self._since = now - self._since, now
        device: dict[str, float] = defaultdict(float)
        for name, start, end in pending:
            end.synchronize()
            device[name] += start.elapsed_time(end) / 1000.0
        return _fit(dict(seconds), dict(device), wall), wall


class _Stage:
    """One stage of a :class:`StageTimer` under way (its ``with`` block): on CUDA with ``device_work``
    a pair of events on the current stream, else the host clock (open in the timer's ``_open``, so
    that ``collect`` counts the part of it that lies in each interval)."""

    __slots__ = ("timer", "name", "device", "ranged", "begun")

    def __init__(self, timer: StageTimer, name: str, device_work: bool):
        self.timer, self.name = timer, name
        self.device = device_work and timer.cuda
        self.ranged = None
        self.begun = None

    def __enter__(self) -> None:
        if torch.autograd._profiler_enabled():  # a range costs a dispatcher call: only when a profiler runs
            self.ranged = torch.profiler.record_function(f"fwrl/{self.name}")
            self.ranged.__enter__()
        timer = self.timer
        if self.device:
            self.begun = torch.cuda.Event(enable_timing=True)
            self.begun.record()
            return
        self.begun = [self.name, time.perf_counter()]
        with timer._lock:
            timer._open[id(self.begun)] = self.begun

    def __exit__(self, kind, value, traceback) -> bool:
        timer = self.timer
        try:
            if self.device:
                if kind is None:  # a block that raised counts nothing
                    end = torch.cuda.Event(enable_timing=True)
                    end.record()
                    with timer._lock:
                        timer._pending.append((self.name, self.begun, end))
            else:
                now = time.perf_counter()
                with timer._lock:
                    del timer._open[id(self.begun)]
                    timer._seconds[self.name] += now - self.begun[1]
        finally:
            if self.ranged is not None:
                self.ranged.__exit__(kind, value, traceback)
        return False


def _fit(host: dict[str, float], device: dict[str, float], wall: float) -> dict[str, float]:
    """Host-timed and device-timed stages of one thread in one interval, summing to at most ``wall``.
    Device time overlaps the host stages (the thread waited while its stream worked): the overlap
    comes out of the host stages, in proportion; device time itself past ``wall`` (work queued in
    one interval and run in the next) is scaled down to it."""
    device_total = sum(device.values())
    if device_total > wall > 0:
        device = {name: value * wall / device_total for name, value in device.items()}
        device_total = wall
    host_total = sum(host.values())
    room = max(0.0, wall - device_total)
    if host_total > room and host_total > 0:
        host = {name: value * room / host_total for name, value in host.items()}
    out = dict(host)
    for name, value in device.items():
        out[name] = out.get(name, 0.0) + value
    return out


def shares(seconds: dict[str, float], wall: float, names: tuple[str, ...], prefix: str = "share/",
           rest: str | None = None) -> dict[str, float]:
    """``{prefix + name: seconds / wall}`` for ``names`` (0 where absent), plus ``rest`` = what is
    left of the wall time when given (then the shares sum to 1, up to rounding)."""
    out = {f"{prefix}{n}": round(seconds.get(n, 0.0) / wall, 4) if wall > 0 else 0.0 for n in names}
    if rest is not None:
        out[f"{prefix}{rest}"] = round(max(0.0, 1.0 - sum(out.values())), 4)
    return out
