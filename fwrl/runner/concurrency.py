"""How one learner rank spreads its work over threads and processes: the torch threads of a process
that runs the model beside env workers (:func:`torch_threads`, :func:`learner_threads`), the acting
threads (:func:`acting_threads`) and whether the learner's update runs in a process of its own
(:func:`update_process`). :func:`fwrl.runner.build.build_run` asks these before it builds the parts;
``fwrl evaluate`` and ``fwrl bench throughput`` ask them too.
"""

from __future__ import annotations

import os

import torch

from fwrl.errors import FwrlError, unknown_choice
from fwrl.settings.config import TrainConfig


def allowed_cores() -> int:
    """Cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def learner_threads(config: TrainConfig) -> int:
    """torch threads for the learner process.

    ``num_threads`` > 0 is taken as given. Otherwise the learner takes every
    core it is allowed except a share left to local env workers (one core per
    worker, at most half of the cores), so actors are not starved.
    """
    return torch_threads(config.num_threads, config.num_workers, config.backend)


def torch_threads(num_threads: int, num_workers: int, backend: str) -> int:
    """torch threads for a process that runs the model beside ``num_workers`` env workers: ``num_threads``
    where > 0, else the allowed cores less one per local worker (at most half of them). torch's default
    (every core) oversubscribes the cores its own workers need: ``fwrl evaluate`` of a Pong checkpoint
    took 65-92 s for 500 agent steps on the 2-core machine beside a training run, 4 s with one thread."""
    if num_threads > 0:
        return num_threads
    cores = allowed_cores()
    reserved = min(num_workers, cores // 2) if backend == "local" else 0
    return max(1, cores - reserved)


def acting_threads(requested: int, num_workers: int) -> int:
    """Acting threads of one learner rank: ``requested`` where > 0 (at most one per env worker), else 1.

    One is the default on every device, because the acting path is mostly Python, which threads
    share through the GIL: on the CPU proxy (``benchmarks/results/acting_threads_proxy.md``) two
    threads made a compute-bound forward (nature stem, Pong frames) faster but an overhead-bound one
    (a tiny MLP: per-call costs, what a GPU's acting thread pays) slower, each thread's half-size
    batches paying the per-call costs twice. The GPU suite's learner part
    measures two threads against one on the box (its ``x8`` rows) before any default changes."""
    if requested > num_workers:
        raise FwrlError(f"acting_threads={requested} is more than the {num_workers} env worker(s) of this "
                        f"learner rank: each acting thread serves its own workers; use 1..{num_workers} "
                        "(or 0 for the default, 1).")
    return requested if requested > 0 else 1


# ``learner_process`` auto: the least agent steps left, and the shortest time limit, for a run's update
# process to pay for its start (spawning it and importing torch there: 2-3 s on the 2-core machine)
UPDATE_PROCESS_MIN_STEPS = 100_000
UPDATE_PROCESS_MIN_SECONDS = 60.0


def update_process(requested: str, device: torch.device, world_size: int, steps_left: int,
                   max_seconds: float = 0.0, python_recurrence: bool = True) -> bool:
    """Whether the learner's update runs in a process of its own (``learner_process``;
    :mod:`fwrl.agents.learner_process`): "on" (one rank on the CPU or a CUDA device; refused on
    others and with several learner ranks, whose all-reduce runs inside the update), "off", or
    auto: on for one rank on the CPU with at
    least :data:`UPDATE_PROCESS_MIN_STEPS` agent steps left and no time limit (``max_seconds`` 0)
    shorter than :data:`UPDATE_PROCESS_MIN_SECONDS`, for a core that steps through the unroll in
    Python (``python_recurrence``, ``Core.python_recurrence``: every core but feedforward and lstm,
    whose recurrence runs in C++ with the GIL released; the gru steps in Python on the CPU).

    Why: on the CPU the acting thread and the learner thread share one GIL, and a fast-weight core's
    learner is a Python loop of small calls; in its own process the update's Python no longer takes
    turns with the acting step's. The side by side, on against off, per core and stem:
    ``benchmarks/results/cpu_cores/learner_process.md``. On a GPU the acting thread's kernel
    launches take turns with the learner's; auto stays off there until the GPU suite's learner part
    has timed it (its row ``rdn x8 graph update process``)."""
    if requested not in ("auto", "on", "off"):
        raise unknown_choice("learner_process", requested, ("auto", "on", "off"))
    if requested == "on":
        if device.type not in ("cpu", "cuda"):
            raise FwrlError(f"learner_process=on runs the learner's update on the CPU or a CUDA device; this run's "
                            f"device is {device}: use learner_process=auto (off there) or off.")
        if world_size > 1:
            raise FwrlError(f"learner_process=on serves one learner rank; this run has {world_size} (their all-reduce "
                            "runs inside the update): use learner_process=auto (off there) or off.")
        return True
    long = steps_left >= UPDATE_PROCESS_MIN_STEPS and not 0 < max_seconds < UPDATE_PROCESS_MIN_SECONDS
    return requested == "auto" and device.type == "cpu" and world_size == 1 and long and python_recurrence
