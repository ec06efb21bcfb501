"""The local executor: N cell runners at a time on this machine, in the sweep's order.

Each cell runs as its own process (``python -m fwrl.launch.sweep.cell``, in its
own session, output to the cell's log). Ctrl-C, SIGTERM or SIGHUP stops the
sweep: no new cell starts, every running cell gets SIGTERM (fwrl train writes
a checkpoint and exits 143), and the sweep waits for them; a second signal
sends SIGKILL. Cells stop with the sweep also when it dies (the runners watch it).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import deque
from typing import Sequence

from fwrl.launch.sweep.cell import cell_command
from fwrl.launch.sweep.plan import Sweep
from fwrl.launch.sweep.status import is_running, log_path, read_status, write_status
from fwrl.launch.sweep.sweep_progress import SweepProgress

POLL_SECONDS = 0.5
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def allowed_cores() -> int:
    """Cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_parallel(sweep: Sweep, cells: Sequence[str]) -> int:
    """Cells at once that fit this machine's cores: each takes its env workers plus a learner."""
    need = max((sweep.cell(c).config.num_workers + 1 for c in cells), default=1)
    return max(1, allowed_cores() // need)


def run_local(sweep: Sweep, cells: Sequence[str], progress: SweepProgress, parallel: int, evaluate: bool,
              eval_episodes: int | None) -> int:
    """Run ``cells``, ``parallel`` at a time; returns 0, or 128 + the signal that stopped the sweep."""
    waiting = deque(cells)
    running: dict[str, subprocess.Popen] = {}
    stop = {"signal": 0, "count": 0}

    def on_signal(signum, frame) -> None:
        stop["signal"] = stop["signal"] or signum
        stop["count"] += 1
        for proc in running.values():  # the cells run in sessions of their own: pass the signal that came
            if proc.poll() is None:
                proc.send_signal(stop["signal"] if stop["count"] == 1 else signal.SIGKILL)

    old = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS}
    eval_workers = max(1, allowed_cores() // parallel)
    try:
        progress.show(force=True)
        while waiting or running:
            while waiting and len(running) < parallel and not stop["signal"]:
                cell = waiting.popleft()
                log = log_path(sweep.path, cell)
                log.parent.mkdir(parents=True, exist_ok=True)
                with log.open("a") as out:
                    running[cell] = subprocess.Popen(
                        cell_command(sweep.path, cell, evaluate, eval_episodes, eval_workers, stop_with_parent=True),
                        stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
                progress.start(cell)
            if stop["signal"] and not running:
                break
            time.sleep(POLL_SECONDS)
            for cell, proc in list(running.items()):
                if proc.poll() is None:
                    continue
                del running[cell]
                status = read_status(sweep.path, cell)
                if status is not None and status["state"] == "running" and is_running(sweep.path, cell):
                    progress.end(cell, {**status, "message": "it runs in another process"}, "running")
                    continue
                if status is None or status["state"] == "running":  # the runner died before writing its end
                    status = write_status(
                        sweep.path, cell, state="interrupted" if stop["signal"] else "failed",
                        exit_code=proc.returncode, log=str(log_path(sweep.path, cell)),
                        message=f"the cell runner ended (exit status {proc.returncode}) without writing its status")
                progress.end(cell, status, status["state"])
            progress.show()
        if stop["signal"]:
            name = signal.Signals(stop["signal"]).name
            print(f"sweep stopped by {name}: {len(waiting)} cells not started; run the same command again to "
                  "resume", file=progress.out, flush=True)
            return 128 + stop["signal"]
        return 0
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
