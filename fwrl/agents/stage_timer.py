"""Where the time goes: seconds per named stage of one thread, per log interval.

``with timer.stage("inference_forward", device_work=True): ...`` adds the
stage's time to its total. On the CPU that is wall time. Work on a CUDA
stream is asynchronous, so for ``device_work`` stages on CUDA the timer
records a pair of CUDA events on the current stream and reads their elapsed
time when the interval is collected (one host sync per log interval, not
per step). ``collect()`` returns the totals since the last call and the wall
time they cover, and starts a new interval.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import defaultdict
from typing import Iterator

import torch


class StageTimer:
    def __init__(self, device: torch.device | str = "cpu"):
        self.cuda = torch.device(device).type == "cuda"
        self._lock = threading.Lock()
        self._seconds: dict[str, float] = defaultdict(float)
        self._pending: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []
        self._since = time.perf_counter()

    @contextlib.contextmanager
    def stage(self, name: str, device_work: bool = False) -> Iterator[None]:
        if device_work and self.cuda:
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            with self._lock:
                self._pending.append((name, start, end))
            return
        began = time.perf_counter()
        yield
        elapsed = time.perf_counter() - began
        with self._lock:
            self._seconds[name] += elapsed

    def collect(self) -> tuple[dict[str, float], float]:
        """(seconds per stage, wall seconds) since the last call."""
        with self._lock:
            seconds, self._seconds = self._seconds, defaultdict(float)
            pending, self._pending = self._pending, []
            now = time.perf_counter()
            wall, self._since = now - self._since, now
        for name, start, end in pending:
            end.synchronize()
            seconds[name] += start.elapsed_time(end) / 1000.0
        return dict(seconds), wall


def shares(seconds: dict[str, float], wall: float, names: tuple[str, ...], prefix: str = "share/",
           rest: str | None = None) -> dict[str, float]:
    """``{prefix + name: seconds / wall}`` for ``names`` (0 where absent), plus ``rest`` = what is
    left of the wall time when given."""
    out = {f"{prefix}{n}": round(seconds.get(n, 0.0) / wall, 4) if wall > 0 else 0.0 for n in names}
    if rest is not None:
        out[f"{prefix}{rest}"] = round(max(0.0, 1.0 - sum(out.values())), 4)
    return out
