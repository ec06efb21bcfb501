"""``fwrl bench ...``: benchmarks, not tests.

Each ``bench_<name>`` is the body of ``fwrl bench <name>`` (see
``fwrl.launch.cli``) and returns the exit status; ``bench_throughput`` takes
the TrainConfig the CLI resolved exactly as for ``fwrl train``.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

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
                      backend_options: dict | None = None,
                      progress: Callable[[str], None] | None = None) -> EnvBenchResult:
    """Step ``env`` with uniformly random actions through a worker pool, no model.

    The pool is started, every worker resets its envs, then ``warmup`` seconds
    are stepped but not counted, then steps are counted for ``seconds``. This
    is the ceiling of training throughput on the same workers: agent steps/s
    of ``fwrl train`` divided by this number is the fraction left after
    inference and learning. ``progress(text)`` hears where it is, twice a second.
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
        last_report = 0.0
        while True:
            now = time.monotonic()
            if progress is not None and now - last_report >= 0.5:
                last_report = now
                if startup is None:
                    progress(f"starting workers: {len(answered)} of {num_workers} have reset their envs")
                elif not counting:
                    progress(f"warming up {now - (warm_end - warmup):.0f} / {warmup:g} s")
                else:
                    progress(f"measuring {now - window_start:.0f} / {seconds:g} s: {steps:,} env steps")
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
    with console.status("starting workers ...") as status:
        r = measure_env_steps(args.env, args.num_workers, args.envs_per_worker, args.seconds, warmup=warmup,
                              backend=backend, backend_options=options, progress=status.update)
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

# Stage shares of metrics rows shown by the bench, per thread (fwrl.launch.train).
ACTOR_ROWS = ("env_wait", "inference_forward", "rollout_bookkeeping", "actor_other")
LEARNER_ROWS = ("learner_idle", "learner_gather", "learner_forward", "learner_backward", "learner_allreduce",
                "learner_optimiser", "learner_publish")


@dataclass
class ThroughputResult:
    """Real training (actors + inference + learner) over the measured window."""

    agent_steps: int
    seconds: float
    updates: int
    shares: dict[str, float]  # share/<stage>: time-weighted mean over the window
    policy_lag_mean: float
    policy_lag_max: int
    rollout_queue: float
    peak_memory_mb: float

    @property
    def steps_per_second(self) -> float:
        return self.agent_steps / self.seconds


def _window_summary(rows: list[dict[str, str]], warmup: float) -> ThroughputResult:
    """Steps, updates and the time-weighted means of the pipeline columns of the metrics rows
    logged after ``warmup`` seconds (each row covers the interval since the one before)."""
    timed = [r for r in rows if r.get("steps_per_second", "") != ""]
    after = [r for r in timed if float(r["time"]) >= warmup]
    if len(after) < 2:
        raise FwrlError("the run logged too little to measure; give bench throughput more --seconds.")
    first, last = after[0], after[-1]
    spans = [(float(b["time"]) - float(a["time"]), b) for a, b in zip(after, after[1:])]
    total = sum(span for span, _ in spans) or 1.0

    def mean(key: str) -> float:
        return sum(span * float(row.get(key) or 0.0) for span, row in spans) / total

    share_keys = [f"share/{name}" for name in ACTOR_ROWS + LEARNER_ROWS]
    return ThroughputResult(
        int(last["agent_steps"]) - int(first["agent_steps"]), float(last["time"]) - float(first["time"]),
        int(last["updates"]) - int(first["updates"]), {key: mean(key) for key in share_keys},
        mean("policy_lag_mean"), max(int(float(row.get("policy_lag_max") or 0)) for _, row in spans),
        mean("rollout_queue"), max(float(row.get("peak_memory_mb") or 0.0) for _, row in spans))


class _BenchProgress:
    """What ``train`` reports while the bench runs: one status line (warm-up, then measuring)."""

    def __init__(self, console, warmup: float, seconds: float):
        self.console, self.warmup, self.seconds = console, warmup, seconds
        self.status = None
        self.last_print = 0.0

    def start(self) -> None:
        self.status = self.console.status("starting workers ...")
        self.status.start()

    def update(self, row: dict) -> None:
        t = float(row.get("time", 0.0))
        phase = (f"warming up {t:.0f} / {self.warmup:g} s" if t < self.warmup
                 else f"measuring {t - self.warmup:.0f} / {self.seconds:g} s")
        text = f"{phase}: {int(row.get('agent_steps', 0)):,} agent steps, {row.get('steps_per_second', 0) or 0} steps/s"
        if self.console.is_terminal:
            self.status.update(text)
        elif time.monotonic() - self.last_print >= 5.0:
            self.console.print(text, highlight=False)
            self.last_print = time.monotonic()

    def stop(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None


def measure_throughput(config: TrainConfig, seconds: float, warmup: float, progress=None) -> ThroughputResult:
    """Train with ``config`` for ``warmup + seconds`` (no checkpoints but the last, in a temporary
    folder) and summarise the metrics rows logged after the warm-up.

    Steps are the learner's (T x B per update), read from rows logged every
    second, so the figure is what training really consumes.
    """
    import csv
    import tempfile

    from fwrl.launch.train import train

    _check_window(seconds, warmup)
    config = config.model_copy(update=dict(max_seconds=warmup + seconds, total_steps=10**12, log_interval=1.0,
                                           checkpoint_interval=1e9, milestone_interval=0, eval_every=0))
    with tempfile.TemporaryDirectory(prefix="fwrl-bench-") as tmp:
        run = Path(tmp) / "run"
        if progress is None:
            from fwrl.launch.progress import Progress

            progress = Progress(config, run)
            progress.update = lambda row: None  # the caller prints its own table
        train(config, run, progress=progress)
        with (run / "metrics.csv").open() as f:
            rows = list(csv.DictReader(f))
    return _window_summary(rows, warmup)


def bench_throughput(config: TrainConfig, seconds: float = 60.0, warmup: float = 15.0, ceiling_seconds: float = 10.0,
                     json_path: str | None = None) -> int:
    """``fwrl bench throughput``: agent steps/s of ``config`` (a resolved training config), the env
    ceiling of the same workers measured in the same run, their ratio, and where the time goes;
    ``json_path``: also write them (and the config) as JSON."""
    from rich.console import Console
    from rich.table import Table

    _check_window(seconds, warmup)
    if ceiling_seconds < 0:
        raise FwrlError(f"--ceiling-seconds must be >= 0 (0: skip the env ceiling), got {ceiling_seconds:g}.")
    console = Console(stderr=True)
    out = Console()
    workers = f"{config.num_workers} x {config.envs_per_worker}"
    ceiling = None
    if ceiling_seconds > 0:
        console.print(f"env ceiling: {config.env} with random actions, {config.num_workers} workers x "
                      f"{config.envs_per_worker} envs, {ceiling_seconds:g} s ...")
        with console.status("stepping envs with random actions ...") as status:
            ceiling = measure_env_steps(config.env, config.num_workers, config.envs_per_worker, ceiling_seconds,
                                        warmup=min(3.0, ceiling_seconds / 2), seed=config.seed,
                                        backend=config.backend,
                                        backend_options={"address": config.ray_address}
                                        if config.backend == "ray" else None, progress=status.update)
    console.print(f"training {config.env} / {config.core} ({config.stem} stem) on {config.device}: "
                  f"{warmup:g} s warm-up, {seconds:g} s measured ...")
    result = measure_throughput(config, seconds, warmup, progress=_BenchProgress(console, warmup, seconds))
    table = Table("measure", "value", title=f"fwrl bench throughput: {config.env} / {config.core}")
    table.add_row("agent steps/s", f"{result.steps_per_second:,.0f}", style="bold")
    if ceiling is not None:
        table.add_row("env ceiling (random actions, same workers)", f"{ceiling.steps_per_second:,.0f} steps/s")
        table.add_row("ratio to the env ceiling", f"{result.steps_per_second / ceiling.steps_per_second:.1%}",
                      style="bold")
    table.add_row("workers x envs per worker", f"{workers} ({config.backend} backend)")
    table.add_row("batch x unroll", f"{config.batch_size} x {config.unroll_length}")
    table.add_row("updates in the window", f"{result.updates} in {result.seconds:.1f} s")
    table.add_row("policy lag (updates)", f"mean {result.policy_lag_mean:.2f}, max {result.policy_lag_max}")
    table.add_row("rollout queue (mean depth)", f"{result.rollout_queue:.2f}")
    table.add_row("peak memory", f"{result.peak_memory_mb:,.0f} MiB")
    for title, names in (("acting thread", ACTOR_ROWS), ("learner thread", LEARNER_ROWS)):
        table.add_row(f"[bold]{title}[/bold]", "share of wall time")
        for name in names:
            table.add_row(f"  {name}", f"{result.shares[f'share/{name}']:.1%}")
    out.print(table)
    if json_path:
        import json

        from fwrl.utils.files import atomic_write_text

        record = {"config": config.to_dict(), "seconds": result.seconds, "agent_steps": result.agent_steps,
                  "updates": result.updates, "steps_per_second": result.steps_per_second,
                  "env_ceiling_steps_per_second": ceiling.steps_per_second if ceiling is not None else None,
                  "policy_lag_mean": result.policy_lag_mean, "policy_lag_max": result.policy_lag_max,
                  "rollout_queue": result.rollout_queue, "peak_memory_mb": result.peak_memory_mb,
                  "shares": result.shares}
        atomic_write_text(Path(json_path), json.dumps(record, indent=2) + "\n")
        console.print(f"wrote {json_path}")
    return 0


# ----------------------------------------------------------------------------- bench kernels

def bench_kernels(args: argparse.Namespace) -> int:
    """``fwrl bench kernels ...``: the options are those of ``fwrl.kernels.benchmark``."""
    from fwrl.kernels.benchmark import main

    return main(args.rest)
