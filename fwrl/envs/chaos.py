"""Fault-injection envs (``chaos:<memory task>``): a testing aid, not a benchmark.

A chaos env is a memory task (:mod:`fwrl.envs.memory_tasks`) that breaks on
purpose, so the env-worker fault handling (restart, slots marked ``done``,
partial rollouts dropped, ``worker_restarts`` counter) can be exercised end
to end, inside real worker processes::

    chaos:cue_delay?delay=5&raise_every=50
    chaos:copy?length=3&hang_every=200&hang_seconds=600&only_worker=1
    chaos:assoc_recall?exit_every=100&fault_log=/tmp/faults.txt

Faults are deterministic: each env instance counts its own ``step`` calls
since it was made (1, 2, ...), and on step t it

- exits the process at once (``os._exit``, as a crash would) if
  ``exit_every`` divides t, else
- sleeps ``hang_seconds`` (a hang; the pool's ``step_timeout`` should fire)
  if ``hang_every`` divides t, else
- raises :class:`ChaosFault` if ``raise_every`` divides t.

0 (the default) turns a fault kind off. A restarted worker makes fresh envs,
so their counts start again at 0: with ``raise_every=N`` a worker faults
every N steps of each of its lives. ``only_worker=i`` limits the faults to
worker i (-1, the default: every worker). ``raise_on_make=true`` makes the
env raise as soon as it is made, i.e. a worker that can never start (combine
it with ``only_worker`` > 0: the spaces are read from worker 0's env in the
learner process). ``fault_log=PATH`` appends one line
``kind pid worker step`` per injected fault before it happens, so tests can
check that the pool's restart counter matches the faults injected. All other
options are the memory task's own; observations, actions and rewards are the
task's, unchanged.
"""

from __future__ import annotations

import os
import time
from typing import Any

import gymnasium as gym

from fwrl.envs.memory_tasks import TASKS, MemoryFamily
from fwrl.envs.registry import EnvFamily, register_family
from fwrl.envs.spec import EnvSpec, Option, parse_options
from fwrl.errors import FwrlError, unknown_choice

CHAOS_OPTIONS: dict[str, Option] = {
    "raise_every": Option(int, 0, "raise an exception on every N-th step of an env (0: never)"),
    "hang_every": Option(int, 0, "sleep hang_seconds on every N-th step of an env (0: never)"),
    "exit_every": Option(int, 0, "kill the worker process on every N-th step of an env (0: never)"),
    "hang_seconds": Option(float, 3600.0, "length of an injected hang"),
    "raise_on_make": Option(bool, False, "raise when the env is made (a worker that never starts)"),
    "only_worker": Option(int, -1, "inject faults only in this worker (-1: every worker)"),
    "fault_log": Option(str, "", "file to append one line per injected fault to"),
}

EXIT_CODE = 17  # exit status of a process killed by an injected exit


def _log_fault(path: str, kind: str, worker: int, step: int) -> None:
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{kind} {os.getpid()} {worker} {step}\n")


class ChaosFault(RuntimeError):
    """The exception an injected ``raise`` fault throws."""


class ChaosEnv(gym.Wrapper):
    """Wraps a memory-task env and injects faults by step count (see module docstring)."""

    def __init__(self, env: gym.Env, *, worker: int, raise_every: int = 0, hang_every: int = 0,
                 exit_every: int = 0, hang_seconds: float = 3600.0, fault_log: str = ""):
        super().__init__(env)
        self.worker = worker
        self.raise_every = raise_every
        self.hang_every = hang_every
        self.exit_every = exit_every
        self.hang_seconds = hang_seconds
        self.fault_log = fault_log
        self.steps = 0  # step calls since this env was made (resets do not count)

    def _due(self, every: int) -> bool:
        return every > 0 and self.steps % every == 0

    def _log(self, kind: str) -> None:
        _log_fault(self.fault_log, kind, self.worker, self.steps)

    def step(self, action):
        self.steps += 1
        if self._due(self.exit_every):
            self._log("exit")
            os._exit(EXIT_CODE)
        if self._due(self.hang_every):
            self._log("hang")
            time.sleep(self.hang_seconds)
        elif self._due(self.raise_every):
            self._log("raise")
            raise ChaosFault(f"chaos: injected exception at step {self.steps} of worker {self.worker}")
        return self.env.step(action)


class ChaosFamily(EnvFamily):
    name = "chaos"
    game_names = tuple(TASKS)
    options = {**CHAOS_OPTIONS, **MemoryFamily.options}

    def _split(self, spec: EnvSpec) -> tuple[dict[str, Any], EnvSpec]:
        """Typed chaos options, and the spec of the wrapped memory task."""
        if len(spec.names) != 1:
            raise FwrlError(f"env spec {spec.text!r}: chaos envs wrap exactly one memory task.")
        task = spec.names[0]
        if task not in TASKS:
            raise unknown_choice("chaos memory task", task, TASKS)
        chaos_raw = {k: v for k, v in spec.options.items() if k in CHAOS_OPTIONS}
        task_raw = {k: v for k, v in spec.options.items() if k not in CHAOS_OPTIONS}
        for key in task_raw:
            if key not in TASKS[task].options:
                raise unknown_choice(f"option for chaos:{task}", key, {**CHAOS_OPTIONS, **TASKS[task].options})
        chaos = parse_options(EnvSpec(spec.family, spec.names, chaos_raw), CHAOS_OPTIONS)
        for key in ("raise_every", "hang_every", "exit_every"):
            if chaos[key] < 0:
                raise FwrlError(f"env option {key}={chaos[key]} in {spec.text!r} must be >= 0 (0: never).")
        if chaos["hang_seconds"] < 0:
            raise FwrlError(f"env option hang_seconds={chaos['hang_seconds']} in {spec.text!r} must be >= 0.")
        return chaos, EnvSpec("memory", spec.names, task_raw)

    def validate(self, spec: EnvSpec) -> dict[str, Any]:
        chaos, task_spec = self._split(spec)
        return {**chaos, **MemoryFamily().validate(task_spec)}

    def make(self, spec: EnvSpec, *, worker_index: int, seed: int, mode: str = "train"):
        chaos, task_spec = self._split(spec)
        env = MemoryFamily().make(task_spec, worker_index=worker_index, seed=seed, mode=mode)
        only = chaos.pop("only_worker")
        if only >= 0 and only != worker_index:
            chaos.update(raise_every=0, hang_every=0, exit_every=0, raise_on_make=False)
        if chaos.pop("raise_on_make"):
            env.close()
            _log_fault(chaos["fault_log"], "make", worker_index, 0)
            raise ChaosFault(f"chaos: injected exception when making the env of worker {worker_index}")
        return ChaosEnv(env, worker=worker_index, **chaos)


register_family(ChaosFamily())
