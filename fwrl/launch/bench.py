"""``fwrl bench ...``: benchmarks, not tests.

Each ``bench_<name>`` is the body of ``fwrl bench <name>`` (see
``fwrl.launch.cli``) and returns the exit status; ``bench_throughput`` takes
the TrainConfig the CLI resolved exactly as for ``fwrl train``.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import numpy as np

from fwrl.errors import FwrlError
from fwrl.launch.config import TrainConfig


# ----------------------------------------------------------------------------- bench envs

@dataclass
class EnvBenchResult:
    """Env steps through the worker layer over the measured window."""

    env: str
    num_workers: int
    envs_per_worker: int
    seconds: float  # length of the measured window
    env_steps: int  # slot steps (each worker round trip steps K envs)
    round_trips: int  # worker results that were steps (not resets after a start/restart)
    episodes: int
    restarts: int  # worker restarts during the window
    startup_seconds: float  # until every worker had reset its envs

    @property
    def steps_per_second(self) -> float:
        return self.env_steps / self.seconds

    @property
    def ms_per_round_trip(self) -> float:
        """Mean time between sending a worker its actions and getting its K results back."""
        return 1000.0 * self.seconds * self.num_workers / max(1, self.round_trips)


def _check_window(seconds: float, warmup: float) -> None:
    if not seconds > 0 or not warmup >= 0:
        raise FwrlError(f"bench envs needs --seconds > 0 and a warm-up >= 0, got {seconds:g} and {warmup:g}.")


def measure_env_steps(env: str, num_workers: int, envs_per_worker: int, seconds: float,
                      warmup: float = 3.0, seed: int = 0, backend: str = "local",
                      backend_options: dict | None = None) -> EnvBenchResult:
    """Step ``env`` with uniformly random actions through a worker pool, no model.

    The pool is started, every worker resets its envs, then ``warmup`` seconds
    are stepped but not counted, then steps are counted for ``seconds``. This
    is the ceiling of training throughput on the same workers: agent steps/s
    of ``fwrl train`` divided by this number is the fraction left after
    inference and learning.
    """
    from fwrl.envs.registry import describe_env
    from fwrl.envs.backends import make_pool

    _check_window(seconds, warmup)
    info = describe_env(env)
    rng = np.random.default_rng(seed)
    k = envs_per_worker
    pool = make_pool(backend, env, num_workers, envs_per_worker, seed=seed, **(backend_options or {}))
    acted = [False] * num_workers  # actions sent since the worker's last (re)start
    counting = False
    steps = round_trips = episodes = restarts0 = 0
    window_start = 0.0
    try:
        begin = time.monotonic()
        pool.start()
        answered: set[int] = set()
        startup = warm_end = end = None
        while True:
            now = time.monotonic()
            if startup is None and len(answered) == num_workers:
                startup = now - begin
                warm_end = now + warmup
            if warm_end is not None and not counting and now >= warm_end:
                counting, restarts0, end = True, pool.restarts, now + seconds
                window_start = now
            if counting and now >= end:
                break
            for r in pool.wait(0.05):
                answered.add(r.worker)
                was_step = acted[r.worker] and not r.restarted
                if counting and was_step:
                    steps += k
                    round_trips += 1
                    episodes += len(r.episodes)
                pool.act(r.worker, rng.integers(info.num_actions, size=k))
                acted[r.worker] = True
        window = time.monotonic() - window_start
        return EnvBenchResult(env, num_workers, envs_per_worker, window, steps, round_trips, episodes,
                              pool.restarts - restarts0, startup)
    finally:
        pool.close()


def bench_envs(args: argparse.Namespace) -> int:
    """``fwrl bench envs``: raw env steps/s through the worker layer, random actions."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    warmup = getattr(args, "warmup", None)
    if warmup is None:
        warmup = min(5.0, args.seconds / 4)
    _check_window(args.seconds, warmup)
    from fwrl.envs.registry import resolve

    resolve(args.env)  # a bad spec fails here, before any process starts
    console.print(f"stepping {args.env} with random actions: {args.num_workers} workers x "
                  f"{args.envs_per_worker} envs, {warmup:g} s warm-up, {args.seconds:g} s measured ...")
    backend = args.backend
    options = {"address": args.ray_address} if backend == "ray" else None
    r = measure_env_steps(args.env, args.num_workers, args.envs_per_worker, args.seconds, warmup=warmup,
                          backend=backend, backend_options=options)
    table = Table("measure", "value", title=f"fwrl bench envs: {r.env}")
    table.add_row("env steps/s", f"{r.steps_per_second:,.0f}", style="bold")
    table.add_row("env steps/s per worker", f"{r.steps_per_second / r.num_workers:,.0f}")
    table.add_row("env steps/s per env", f"{r.steps_per_second / (r.num_workers * r.envs_per_worker):,.0f}")
    table.add_row("ms per worker round trip", f"{r.ms_per_round_trip:.2f}")
    table.add_row("workers x envs per worker", f"{r.num_workers} x {r.envs_per_worker} ({backend} backend)")
    table.add_row("measured", f"{r.seconds:.1f} s, {r.env_steps:,} env steps, {r.episodes:,} episodes")
    table.add_row("worker restarts", str(r.restarts))
    table.add_row("startup (spawn + reset)", f"{r.startup_seconds:.1f} s")
    console.print(table)
    console.print("Training throughput (agent steps/s of fwrl train) divided by env steps/s is the "
                  "fraction left after inference and learning.")
    return 0


# ----------------------------------------------------------------------------- bench throughput

@dataclass
class ThroughputResult:
    """Agent steps/s of real training (actors + inference + learner) over the measured window."""

    agent_steps: int
    seconds: float
    updates: int

    @property
    def steps_per_second(self) -> float:
        return self.agent_steps / self.seconds


def measure_throughput(config, seconds: float, warmup: float) -> ThroughputResult:
    """Train with ``config`` for ``warmup + seconds`` and count learner steps after the warm-up.

    Steps are the learner's (T x B per update), read from metrics rows logged
    every second, so the figure is what training really consumes.
    """
    import csv
    import tempfile
    from pathlib import Path

    from fwrl.launch.progress import Progress
    from fwrl.launch.train import train

    _check_window(seconds, warmup)
    config.max_seconds = warmup + seconds
    config.total_steps = 10**12
    config.log_interval = 1.0
    config.checkpoint_interval = 1e9
    with tempfile.TemporaryDirectory(prefix="fwrl-bench-") as tmp:
        run = Path(tmp) / "run"
        quiet = Progress(config, run)
        quiet.update = lambda row: None  # the bench prints its own table
        train(config, run, progress=quiet)
        with (run / "metrics.csv").open() as f:
            rows = [r for r in csv.DictReader(f) if r.get("steps_per_second", "") != ""]
    after = [r for r in rows if float(r["time"]) >= warmup]
    if len(after) < 2:
        raise FwrlError("the run logged too little to measure; give bench throughput more --seconds.")
    first, last = after[0], after[-1]
    return ThroughputResult(int(last["agent_steps"]) - int(first["agent_steps"]),
                            float(last["time"]) - float(first["time"]),
                            int(last["updates"]) - int(first["updates"]))


def bench_throughput(config: TrainConfig, seconds: float, warmup: float) -> int:
    """``fwrl bench throughput``: agent steps/s of training with ``config`` (resolved and checked
    by the CLI like ``fwrl train``'s) over ``seconds`` after ``warmup`` seconds."""
    from rich.console import Console
    from rich.table import Table

    result = measure_throughput(config, seconds, warmup)
    table = Table("env", "core", "stem", "workers x envs", "batch x unroll", "updates", "agent steps/s",
                  title="fwrl bench throughput")
    table.add_row(config.env, config.core, config.stem, f"{config.num_workers} x {config.envs_per_worker}",
                  f"{config.batch_size} x {config.unroll_length}", str(result.updates),
                  f"{result.steps_per_second:,.0f}")
    Console().print(table)
    return 0


# ----------------------------------------------------------------------------- bench kernels

def bench_kernels(args: argparse.Namespace) -> int:
    """``fwrl bench kernels ...``: the options are those of ``fwrl.kernels.benchmark``."""
    from fwrl.kernels.benchmark import main

    return main(args.rest)
