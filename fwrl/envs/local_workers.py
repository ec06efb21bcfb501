"""The ``local`` worker backend: N processes on this machine, K envs each.

Observations and step results travel through shared memory (one
``multiprocessing.RawArray`` per field, laid out [slot, ...]); a pipe per
worker carries only the "step" command and the list of finished episodes.
Processes are started with ``spawn`` (no torch state is forked) and die with
the learner: each asks Linux for SIGKILL when its parent dies and also exits
on a closed pipe.

With ``worker_splits`` S > 1 a process hosts S consecutive workers (splits)
and steps them in turn, one ``("step", split)`` command each, so it steps
one split while the learner acts for another.

Faults: a worker that dies, raises, or takes longer than ``step_timeout`` for
one step is killed and restarted with fresh envs (new seeds); its result is
marked ``restarted`` and every one of its slots ``done`` (with splits: every
split of its process).
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import time
import traceback
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_connections
from typing import TYPE_CHECKING, Sequence

import numpy as np

from fwrl.envs.groups import make_group
from fwrl.envs.worker_pool import PoolSettings, StepResult, WorkerPool
from fwrl.utils.child_process import become_child_of

if TYPE_CHECKING:
    from fwrl.envs.registry import EnvInfo

_CTYPES = {"uint8": ctypes.c_uint8, "float32": ctypes.c_float, "bool": ctypes.c_bool, "int32": ctypes.c_int32,
           "int64": ctypes.c_int64}


def _views(raw: dict, specs: dict, num_slots: int) -> dict[str, np.ndarray]:
    return {
        name: np.frombuffer(raw[name], dtype=np.dtype(dtype)).reshape(num_slots, *shape)
        for name, (shape, dtype) in specs.items()
    }


def _worker_main(settings: PoolSettings, process: int, life: int, raw, specs, conn: Connection, parent_pid: int):
    """Process ``process`` of the pool: its ``worker_splits`` workers' envs, reset in turn (each
    answered as soon as it is ready), then one step per ``("step", split)`` command, in the order
    the commands came."""
    become_child_of(parent_pid)  # dies with the learner, which handles Ctrl-C and stops us
    from fwrl.envs.quiet import silence_env_noise

    silence_env_noise()
    views = _views(raw, specs, settings.num_slots)
    k, splits = settings.envs_per_worker, settings.worker_splits
    workers = range(process * splits, (process + 1) * splits)
    outs = [{name: v[w * k:(w + 1) * k] for name, v in views.items()} for w in workers]
    groups = []
    try:
        for split, (worker, out) in enumerate(zip(workers, outs)):
            groups.append(make_group(settings, worker, life))
            groups[-1].reset(out)
            conn.send(("ok", split, []))
        while True:
            try:
                command = conn.recv()
            except (EOFError, OSError):
                break
            if not (isinstance(command, tuple) and command[0] == "step"):
                break
            split = command[1]
            episodes = groups[split].step(outs[split]["action"], outs[split])
            conn.send(("ok", split, episodes))
    except KeyboardInterrupt:
        pass
    except Exception:
        try:
            conn.send(("error", traceback.format_exc()))
        except (OSError, BrokenPipeError):
            pass
    finally:
        for group in groups:
            group.close()


class _Process:
    """One worker process and the state of each of its splits (workers)."""

    def __init__(self, process, conn, splits: int):
        self.process = process
        self.conn = conn
        # per split: when its pending step (or its start) was sent, None while its result is out
        self.sent_at: list[float | None] = [time.monotonic()] * splits  # the resets count as pending steps
        self.answered = [False] * splits  # False until the split's first result (imports + env resets)


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
        self._splits = self.settings.worker_splits
        self._procs: list[_Process | None] = [None] * self.settings.num_processes
        self._closed = False

    def shared_arrays(self) -> dict[str, np.ndarray]:
        return self.arrays

    # ------------------------------------------------------------------ processes
    def _place(self, worker: int) -> tuple[int, int]:
        """(its process, its split in that process) of ``worker``."""
        return divmod(worker, self._splits)

    def _spawn(self, worker: int) -> None:
        """Start ``worker``'s process (every split of it) in its current life."""
        p, _ = self._place(worker)
        parent_conn, child_conn = self._ctx.Pipe()
        process = self._ctx.Process(
            target=_worker_main,
            name=f"fwrl-env-worker-{p}",
            args=(self.settings, p, self._lives[worker], self._raw, self._specs, child_conn, os.getpid()),
            daemon=True,
        )
        process.start()
        child_conn.close()
        self._procs[p] = _Process(process, parent_conn, self._splits)

    def _kill(self, worker: int) -> None:
        p, _ = self._place(worker)
        proc = self._procs[p]
        if proc is None:
            return
        try:
            proc.conn.close()
        except OSError:
            pass
        if proc.process.is_alive():
            proc.process.kill()
        proc.process.join(timeout=5)
        self._procs[p] = None

    def _answered(self, worker: int) -> bool:
        p, split = self._place(worker)
        proc = self._procs[p]
        return proc is not None and proc.answered[split]

    def start(self) -> None:
        for p in range(self.settings.num_processes):
            self._spawn(p * self._splits)

    def pid(self, worker: int) -> int | None:
        proc = self._procs[self._place(worker)[0]]
        return None if proc is None else proc.process.pid

    # ------------------------------------------------------------------ stepping
    def _pending(self, worker: int) -> bool:
        p, split = self._place(worker)
        proc = self._procs[p]
        return proc is not None and proc.sent_at[split] is not None

    def wait(self, timeout: float | None = None, workers: Sequence[int] | None = None) -> list[StepResult]:
        workers = self._chosen(workers)
        waiting = [w for w in workers if self._pending(w)]
        if not waiting:
            return []
        pending = {self._procs[p].conn: p for p in {self._place(w)[0] for w in waiting}}
        # Wake up by the earliest step/start deadline at the latest, so a hang is
        # detected even when every pending worker hangs (or timeout is None).
        deadline = min(self._deadline(w) for w in waiting)
        until_deadline = max(0.0, deadline - time.monotonic()) + 0.01  # just past it
        timeout = until_deadline if timeout is None else min(timeout, until_deadline)
        ready = wait_connections(list(pending), timeout)
        results = []
        for conn in ready:
            p = pending[conn]
            first = p * self._splits
            while True:  # every answer that has arrived (with splits, more than one may wait)
                try:
                    message = conn.recv()
                except (EOFError, OSError):
                    self._restart(first, self._death(first))
                    break
                if message[0] == "error":
                    self._restart(first, message[1].strip().splitlines()[-1])
                    break
                _, split, episodes = message
                proc = self._procs[p]
                proc.sent_at[split] = None
                proc.answered[split] = True
                worker = first + split
                sl = self.slots_of(worker)
                results.append(self._result(worker, {name: a[sl] for name, a in self.arrays.items()}, episodes))
                if not conn.poll():
                    break
        self._check_hangs(workers)
        return results

    def _death(self, worker: int) -> str:
        """Why a worker whose pipe broke is gone, with its exit code once reaped."""
        process = self._procs[self._place(worker)[0]].process
        process.join(timeout=5.0)  # a closed pipe means it is exiting: reap it, so the exit code is known
        return f"process died (exit code {process.exitcode})"

    def _limit(self, worker: int) -> float:
        """Seconds ``worker``'s pending request may take: its first (imports and resets) or a step."""
        return self.settings.step_timeout if self._answered(worker) else self.settings.start_timeout

    def _deadline(self, worker: int) -> float:
        p, split = self._place(worker)
        return self._procs[p].sent_at[split] + self._limit(worker)

    def _check_hangs(self, workers: Sequence[int] | None = None) -> None:
        now = time.monotonic()
        for worker in self._chosen(workers):
            if not self._pending(worker):
                continue
            proc = self._procs[self._place(worker)[0]]
            # An answer that arrived after wait_connections returned is not a hang
            # (the learner may have been away longer than the timeout).
            if now > self._deadline(worker) and not proc.conn.poll():
                self._restart(worker, f"no answer within {self._limit(worker):g} s")

    def act(self, worker: int, actions: np.ndarray) -> None:
        actions = self._actions(actions)
        p, split = self._place(worker)
        proc = self._procs[p]
        # None: being replaced; a pending step: the result acted on is of the life before a restart
        # of its process (a sibling split's fault), whose new life answers with its reset
        if proc is None or proc.sent_at[split] is not None:
            return
        self.arrays["action"][self.slots_of(worker)] = actions
        proc.sent_at[split] = time.monotonic()
        try:
            proc.conn.send(("step", split))
        except (OSError, BrokenPipeError):  # it died after its last answer
            self._restart(worker, self._death(worker))

    def close(self, grace: float = 5.0) -> None:
        if self._closed:
            return
        self._closed = True
        for proc in self._procs:
            if proc is None:
                continue
            try:
                proc.conn.send("close")
            except (OSError, BrokenPipeError):
                pass
        deadline = time.monotonic() + max(0.0, grace)  # a hung worker is killed when it runs out
        for p, proc in enumerate(self._procs):
            if proc is None:
                continue
            proc.process.join(timeout=max(0.0, deadline - time.monotonic()))
            self._kill(p * self._splits)
