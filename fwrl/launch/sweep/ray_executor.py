"""The ray executor: each cell a Ray task on a cluster (``--ray-address``), scheduled by its resources.

A task runs the same cell runner as the local executor (``python -m
fwrl.launch.sweep.cell``) on whichever node Ray picks, so the sweep folder must
be on storage every node sees at the same path (NFS, Lustre, a shared volume),
and fwrl must be installed on every node. A task asks for ``--cell-cpus`` CPUs
(default: the cell's ``num_workers`` + 1) and ``--cell-gpus`` GPUs; the
driver's ``PYTHONPATH`` entries that exist on a node are added there (env
wrapper and ``gym:<module>:<id>`` modules). Ctrl-C or SIGTERM cancels the tasks:
each passes SIGTERM to its cell, which checkpoints, and the sweep waits.
"""

from __future__ import annotations

import os
import signal
import socket
from typing import Sequence

from fwrl.errors import FwrlError
from fwrl.launch.sweep.cell import cell_command
from fwrl.launch.sweep.plan import Sweep
from fwrl.launch.sweep.status import log_path, read_status
from fwrl.launch.sweep.sweep_progress import SweepProgress

POLL_SECONDS = 1.0


def _cell_task(cmd: list[str], log: str, pythonpath: Sequence[str]) -> tuple[int, str]:
    """The body of a Ray task: run one cell runner to its end; a cancel passes SIGTERM on to it."""
    import subprocess

    env = dict(os.environ)
    paths = [p for p in pythonpath if os.path.isdir(p)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    os.makedirs(os.path.dirname(log), exist_ok=True)
    with open(log, "a") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        try:
            return proc.wait(), socket.gethostname()
        except KeyboardInterrupt:  # ray.cancel: stop the cell cleanly (it checkpoints), then end
            proc.send_signal(signal.SIGTERM)
            return proc.wait(), socket.gethostname()


def cell_resources(sweep: Sweep, cell: str, cpus: float, gpus: float) -> tuple[float, float]:
    """CPUs and GPUs of one cell's task (``cpus`` 0: its env workers plus the learner)."""
    return (cpus or float(sweep.cell(cell).config.num_workers + 1)), gpus


def _connect(ray, address: str) -> None:
    try:
        if address == "local":  # a new private instance, even where another Ray runs on this machine
            ray.init(address="local", include_dashboard=False, logging_level="warning")
        else:
            ray.init(address=address, logging_level="warning")
    except ConnectionError as exc:
        raise FwrlError(f"cannot connect to a Ray cluster at --ray-address {address!r} ({exc}). Start one "
                        "(`ray start --head`, see docker/README.md), pass its HOST:PORT, or use --ray-address "
                        "local for a private Ray on this machine.") from None


def run_ray(sweep: Sweep, cells: Sequence[str], progress: SweepProgress, address: str, cpus: float, gpus: float,
            evaluate: bool, eval_episodes: int | None) -> int:
    """Run ``cells`` as Ray tasks; returns 0, or 128 + the signal that stopped the sweep."""
    from fwrl.envs.ray_workers import import_ray

    ray = import_ray()
    we_started = not ray.is_initialized()
    if we_started:
        _connect(ray, address)
    try:
        return _run_tasks(ray, sweep, cells, progress, address, cpus, gpus, evaluate, eval_episodes)
    finally:
        if we_started:
            ray.shutdown()


def _run_tasks(ray, sweep: Sweep, cells: Sequence[str], progress: SweepProgress, address: str, cpus: float,
               gpus: float, evaluate: bool, eval_episodes: int | None) -> int:
    from fwrl.envs.ray_workers import pythonpath_entries

    total = ray.cluster_resources()
    need = {c: cell_resources(sweep, c, cpus, gpus) for c in cells}
    for cell, (c, g) in need.items():
        if c > total.get("CPU", 0) or g > total.get("GPU", 0):
            raise FwrlError(f"cell {cell} asks for {c:g} CPUs and {g:g} GPUs but the Ray cluster at {address!r} "
                            f"has {total.get('CPU', 0):g} CPUs and {total.get('GPU', 0):g} GPUs in all; pass "
                            "--cell-cpus / --cell-gpus (or lower num_workers).")
    progress.parallel = max(1, int(total.get("CPU", 1) // max(c for c, _ in need.values())))
    task = ray.remote(max_retries=0)(_cell_task)
    paths = pythonpath_entries()
    root = sweep.path.resolve()
    refs = {}
    for cell in cells:
        c, g = need[cell]
        cmd = cell_command(root, cell, evaluate, eval_episodes, eval_workers=max(1, int(c)), stop_with_parent=True)
        refs[task.options(num_cpus=c, num_gpus=g, name=f"fwrl-sweep:{cell}").remote(
            cmd, str(log_path(root, cell)), paths)] = cell
    stop = {"signal": 0}

    def on_signal(signum, frame) -> None:
        if not stop["signal"]:
            stop["signal"] = signum
            for ref in refs:
                ray.cancel(ref)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        progress.show(force=True)
        seen_running: set[str] = set()
        while refs:
            done, _ = ray.wait(list(refs), num_returns=1, timeout=POLL_SECONDS)
            for cell in refs.values():  # a cell's status says when its task started on a node
                status = read_status(root, cell)
                if cell not in seen_running and status and status["state"] == "running":
                    seen_running.add(cell)
                    progress.start(cell)
            for ref in done:
                cell = refs.pop(ref)
                try:
                    ray.get(ref)
                except (ray.exceptions.TaskCancelledError, ray.exceptions.RayTaskError,
                        ray.exceptions.WorkerCrashedError):
                    pass
                status = read_status(root, cell) or {"log": str(log_path(root, cell)), "state": "pending"}
                if status["state"] != "pending" or cell in seen_running:
                    progress.end(cell, status, status["state"])
            progress.show()
        if stop["signal"]:
            print(f"sweep stopped by {signal.Signals(stop['signal']).name}; run the same command again to resume",
                  file=progress.out, flush=True)
            return 128 + stop["signal"]
        return 0
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
