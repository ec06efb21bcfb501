"""The ``local`` worker backend: N processes on this machine, K envs each.

Observations and step results travel through shared memory (one
``multiprocessing.RawArray`` per field, laid out [slot, ...]); a pipe per
worker carries only the "step" command and the list of finished episodes.
Processes are started with ``spawn`` (no torch state is forked) and die with
the learner: each asks Linux for SIGKILL when its parent dies and also exits
on a closed pipe.

Faults: a worker that dies, raises, or takes longer than ``step_timeout`` for
one step is killed and restarted with fresh envs (new seeds); its result is
marked ``restarted`` and every one of its slots ``done``.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import signal
import sys
import time
import traceback
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_connections
from typing import TYPE_CHECKING, Sequence

import numpy as np

from fwrl.envs.groups import make_group
from fwrl.envs.worker_pool import PoolSettings, StepResult, WorkerPool

if TYPE_CHECKING:
    from fwrl.envs.registry import EnvInfo

_CTYPES = {"uint8": ctypes.c_uint8, "float32": ctypes.c_float, "bool": ctypes.c_bool, "int32": ctypes.c_int32,
           "int64": ctypes.c_int64}


def _views(raw: dict, specs: dict, num_slots: int) -> dict[str, np.ndarray]:
    return {
        name: np.frombuffer(raw[name], dtype=np.dtype(dtype)).reshape(num_slots, *shape)
        for name, (shape, dtype) in specs.items()
    }


def _die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux only)."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass


def _worker_main(settings: PoolSettings, worker: int, life: int, raw, specs, conn: Connection, parent_pid: int):
    _die_with_parent()
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the learner handles Ctrl-C and stops us
    from fwrl.envs.quiet import silence_env_noise

    silence_env_noise()
    views = _views(raw, specs, settings.num_slots)
    k = settings.envs_per_worker
    lo, hi = worker * k, (worker + 1) * k
    out = {name: v[lo:hi] for name, v in views.items()}
    group = None
    try:
        group = make_group(settings, worker, life)
        group.reset(out)
        conn.send(("ok", []))
        while True:
            try:
                command = conn.recv()
            except (EOFError, OSError):
                break
            if command != "step":
                break
            episodes = group.step(out["action"], out)
            conn.send(("ok", episodes))
    except KeyboardInterrupt:
        pass
    except Exception:
        try:
            conn.send(("error", traceback.format_exc()))
        except (OSError, BrokenPipeError):
            pass
    finally:
        if group is not None:
            group.close()


class _Worker:
    def __init__(self, process, conn):
        self.process = process
        self.conn = conn
        self.sent_at: float | None = None  # when the pending step (or the start) was sent
        self.answered = False  # False until the first result (imports + env resets) arrived


class LocalWorkerPool(WorkerPool):
    def __init__(self, settings: PoolSettings, info: "EnvInfo | None" = None):
        super().__init__(settings, info)
        self._ctx = mp.get_context("spawn")
        # the step record plus the actions the learner writes for each worker
        self._specs = {**self.record.specs(), "action": (self.info.action_shape, "int64")}
        n = self.num_slots
        self._raw = {
            name: self._ctx.RawArray(_CTYPES[dtype], int(np.prod((n, *shape))))
            for name, (shape, dtype) in self._specs.items()
        }
        self.arrays = _views(self._raw, self._specs, n)
        self._workers: list[_Worker | None] = [None] * self.num_workers
        self._closed = False

    # ------------------------------------------------------------------ processes
    def _spawn(self, worker: int) -> None:
        parent_conn, child_conn = self._ctx.Pipe()
        process = self._ctx.Process(
            target=_worker_main,
            name=f"fwrl-env-worker-{worker}",
            args=(self.settings, worker, self._lives[worker], self._raw, self._specs, child_conn, os.getpid()),
            daemon=True,
        )
        process.start()
        child_conn.close()
        w = _Worker(process, parent_conn)
        w.sent_at = time.monotonic()  # the reset counts as the first pending step
        self._workers[worker] = w

    def _kill(self, worker: int) -> None:
        w = self._workers[worker]
        if w is None:
            return
        try:
            w.conn.close()
        except OSError:
            pass
        if w.process.is_alive():
            w.process.kill()
        w.process.join(timeout=5)
        self._workers[worker] = None

    def _answered(self, worker: int) -> bool:
        w = self._workers[worker]
        return w is not None and w.answered

    def start(self) -> None:
        for worker in range(self.num_workers):
            self._spawn(worker)

    def pid(self, worker: int) -> int | None:
        w = self._workers[worker]
        return None if w is None else w.process.pid

    # ------------------------------------------------------------------ stepping
    def wait(self, timeout: float | None = None, workers: Sequence[int] | None = None) -> list[StepResult]:
        workers = self._chosen(workers)
        pending = {w.conn: i for i in workers if (w := self._workers[i]) is not None and w.sent_at is not None}
        if not pending:
            return []
        # Wake up by the earliest step/start deadline at the latest, so a hang is
        # detected even when every pending worker hangs (or timeout is None).
        deadline = min(self._deadline(self._workers[i]) for i in pending.values())
        until_deadline = max(0.0, deadline - time.monotonic()) + 0.01  # just past it
        timeout = until_deadline if timeout is None else min(timeout, until_deadline)
        ready = wait_connections(list(pending), timeout)
        results = []
        for conn in ready:
            worker = pending[conn]
            try:
                status, payload = conn.recv()
            except (EOFError, OSError):
                self._restart(worker, self._death(worker))
                continue
            if status == "error":
                self._restart(worker, payload.strip().splitlines()[-1])
                continue
            self._workers[worker].sent_at = None
            self._workers[worker].answered = True
            sl = self.slots_of(worker)
            results.append(self._result(worker, {name: a[sl] for name, a in self.arrays.items()}, payload))
        self._check_hangs(workers)
        return results

    def _death(self, worker: int) -> str:
        """Why a worker whose pipe broke is gone, with its exit code once reaped."""
        process = self._workers[worker].process
        process.join(timeout=5.0)  # a closed pipe means it is exiting: reap it, so the exit code is known
        return f"process died (exit code {process.exitcode})"

    def _deadline(self, w: _Worker) -> float:
        return w.sent_at + (self.settings.step_timeout if w.answered else self.settings.start_timeout)

    def _check_hangs(self, workers: Sequence[int] | None = None) -> None:
        now = time.monotonic()
        workers = self._chosen(workers)
        for i in workers:
            w = self._workers[i]
            if w is None or w.sent_at is None:
                continue
            # An answer that arrived after wait_connections returned is not a hang
            # (the learner may have been away longer than the timeout).
            if now > self._deadline(w) and not w.conn.poll():
                limit = self.settings.step_timeout if w.answered else self.settings.start_timeout
                self._restart(i, f"no answer within {limit:g} s")

    def act(self, worker: int, actions: np.ndarray) -> None:
        actions = self._actions(actions)
        w = self._workers[worker]
        if w is None:
            return
        self.arrays["action"][self.slots_of(worker)] = actions
        w.sent_at = time.monotonic()
        try:
            w.conn.send("step")
        except (OSError, BrokenPipeError):  # it died after its last answer
            self._restart(worker, self._death(worker))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for worker, w in enumerate(self._workers):
            if w is None:
                continue
            try:
                w.conn.send("close")
            except (OSError, BrokenPipeError):
                pass
        deadline = time.monotonic() + 5
        for worker, w in enumerate(self._workers):
            if w is None:
                continue
            w.process.join(timeout=max(0.0, deadline - time.monotonic()))
            self._kill(worker)
