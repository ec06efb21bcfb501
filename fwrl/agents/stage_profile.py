"""The stages of ``StageTimer`` under ``torch.profiler``: where a thread's time goes, op by op
(``fwrl bench throughput --profile-path``).

The stage shares (``fwrl.agents.stage_timer``) say which stage holds a thread;
this says why. :class:`WindowProfiler` runs ``torch.profiler`` between two
times of a training run's metrics rows (the bench: for ``profile_seconds``
after its measured window). It records the CPU ops of the thread that starts
it (PyTorch's profiler is thread-local): the thread that logs the rows, which
is the acting thread (it batches inference and writes the store). On CUDA it
also records the runtime calls (kernel launches, copies, synchronisations) and
the device's kernels. Every ``StageTimer`` stage is a ``fwrl/<stage>`` range
there and every acting call (one batch of ready workers served) a
``fwrl/acting_call`` range, so per acting call the report gives each stage's
time and the acting thread's launches, copies and syncs. Only the ranges' CPU
events count (on CUDA each range that holds device work also has a device-side
event of the same name). The report is markdown.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import torch

from fwrl.agents.stage_timer import ACTING_CALL
from fwrl.utils.files import atomic_write_text

# CUDA runtime calls worth counting per acting call: launches cost host time, the
# synchronising ones stall the host until the device catches up.
RUNTIME_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cudaGraphLaunch", "cudaMemcpyAsync",
                 "cudaMemsetAsync", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize",
                 "cudaStreamWaitEvent", "cudaEventRecord", "cudaHostAlloc")


class WindowProfiler:
    """Profile the process between two times of a training run's metrics rows (``row["time"]``,
    seconds since the workers started): call :meth:`update` with every row, :meth:`finish`
    after training. Rows come once per log interval, so the window is whole intervals."""

    def __init__(self, start: float, stop: float, device: torch.device | str):
        if not stop > start >= 0:
            raise ValueError(f"the profile window must be 0 <= start < stop, got {start:g} .. {stop:g}")
        self.start, self.stop = start, stop
        self.cuda = torch.device(device).type == "cuda"
        self.profiler: torch.profiler.profile | None = None
        self.seconds: float | None = None
        self._started_at: float | None = None
        self._done = False
        self._lock = threading.Lock()
        self._warm_up()

    def _activities(self) -> list:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        return activities

    def _warm_up(self) -> None:
        """Start and stop a profile now: a process's first ``start()`` takes about 2 s (torch 2.13,
        on CPU), which would otherwise block the acting thread inside the window and leave the
        profile nearly empty."""
        warm = torch.profiler.profile(activities=self._activities())
        warm.start()
        warm.stop()

    def update(self, row: dict[str, Any]) -> None:
        t = float(row.get("time", 0.0))
        with self._lock:
            if self.profiler is None and not self._done and t >= self.start:
                self.profiler = torch.profiler.profile(activities=self._activities())
                self.profiler.start()
                self._started_at = t
            elif self.profiler is not None and not self._done and t >= self.stop:
                self._end(t)

    def _end(self, t: float | None) -> None:
        if self.cuda:
            torch.cuda.synchronize()
        self.profiler.stop()
        self._done = True
        if t is not None and self._started_at is not None:
            self.seconds = t - self._started_at

    def finish(self) -> torch.profiler.profile | None:
        """Stop the profiler if the run ended inside the window; the profile, or None if the run
        never reached the window's start."""
        with self._lock:
            if self.profiler is not None and not self._done:
                self._end(None)
            return self.profiler


def profile_report(profiler: torch.profiler.profile, title: str, seconds: float | None, row_limit: int = 30) -> str:
    """Markdown: per acting call, each ``fwrl/`` stage's time and the acting thread's CUDA runtime
    calls; then the ops by their own CPU time and, on CUDA, by device time."""
    events = [e for e in profiler.events() if e.device_type == torch.autograd.DeviceType.CPU]
    acting = {e.thread for e in events if e.name == ACTING_CALL}
    calls = sum(1 for e in events if e.name == ACTING_CALL)

    def per_call(value: float) -> str:
        return f"{value / calls:,.1f}" if calls else "n/a"

    span = f" in {seconds:.1f} s" if seconds else ""
    lines = [f"# {title}", "",
             f"Profiled window: {calls:,} acting calls (`{ACTING_CALL}` ranges){span}, on the acting thread "
             "(torch.profiler records the thread that starts it).", "",
             "## Stages of the acting thread (`fwrl/<stage>` ranges of `StageTimer`)", "",
             "| stage | count | CPU ms total | CPU us per acting call |", "|---|---|---|---|"]
    stages = _cpu_times(events, acting, lambda name: name.startswith("fwrl/") and name != ACTING_CALL)
    for name, times in sorted(stages.items(), key=lambda item: -sum(item[1])):
        lines.append(f"| {name} | {len(times):,} | {sum(times) / 1e3:,.1f} | {per_call(sum(times))} |")
    runtime = _cpu_times(events, acting, lambda name: name in RUNTIME_CALLS)
    if runtime:
        lines += ["", "## CUDA runtime calls of the acting thread", "",
                  "| call | count | per acting call | CPU us each |", "|---|---|---|---|"]
        for name in RUNTIME_CALLS:
            if name in runtime:
                times = runtime[name]
                lines.append(f"| {name} | {len(times):,} | {per_call(len(times))} | {sum(times) / len(times):,.1f} |")
    averages = profiler.key_averages()
    lines += ["", "## Ops by own CPU time", "", "```",
              averages.table(sort_by="self_cpu_time_total", row_limit=row_limit, max_name_column_width=60), "```"]
    if any(getattr(e, "device_time_total", 0) for e in averages):
        lines += ["", "## Ops by device time (every stream: the learner's kernels too)", "", "```",
                  averages.table(sort_by="device_time_total", row_limit=row_limit, max_name_column_width=60), "```"]
    return "\n".join(lines) + "\n"


def _cpu_times(events, threads: set[int], keep) -> dict[str, list[float]]:
    """Name -> the CPU time (us) of each event on ``threads`` whose name ``keep`` accepts."""
    times: dict[str, list[float]] = {}
    for e in events:
        if e.thread in threads and keep(e.name):
            times.setdefault(e.name, []).append(e.cpu_time_total)
    return times


def write_profile(profiler: torch.profiler.profile, path: Path, title: str, seconds: float | None) -> None:
    """Write :func:`profile_report` to ``path`` (atomically)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, profile_report(profiler, title, seconds))
