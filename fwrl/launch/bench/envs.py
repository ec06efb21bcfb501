"""``fwrl bench envs``: env steps/s through the worker layer with random actions, no model.

:func:`measure_env_steps` steps one env spec on a worker pool for a measured window (and the worker
processes' CPU time over it), :func:`measure_env_paths` each env path of the spec (its ``vector``
option) on the same workers, alternating; ``fwrl bench throughput`` measures its env ceiling with
the same :func:`measure_env_steps`. :func:`bench_envs` is the command's body (see
``fwrl.launch.cli``) and returns the exit status.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from fwrl.errors import FwrlError
from fwrl.launch.bench.rounds import check_rounds, check_window, figure, mean_over_rounds


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
    env_path: str = "none"  # how the workers stepped their envs: ale, envpool or none (the Python chain)
    cpu_seconds: float | None = None  # CPU time of the worker processes (all threads) in the window; local only

    @property
    def steps_per_second(self) -> float:
        return self.env_steps / self.seconds

    @property
    def ms_per_round_trip(self) -> float:
        """Mean time between sending a worker its actions and getting its K results back."""
        return 1000.0 * self.seconds * self.num_workers / max(1, self.round_trips)

    @property
    def steps_per_cpu_second(self) -> float | None:
        """Env steps per second of worker CPU time: env steps/s per core the workers kept busy."""
        return self.env_steps / self.cpu_seconds if self.cpu_seconds else None

    @property
    def cores_busy(self) -> float | None:
        """Mean number of cores the worker processes used in the window."""
        return self.cpu_seconds / self.seconds if self.cpu_seconds is not None else None

    def to_dict(self) -> dict:
        return {**asdict(self), "steps_per_second": self.steps_per_second,
                "steps_per_cpu_second": self.steps_per_cpu_second, "cores_busy": self.cores_busy,
                "ms_per_round_trip": self.ms_per_round_trip}


def process_cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU time of process ``pid``, all its threads (Linux ``/proc``); None where unknown."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _workers_cpu(pool, backend: str) -> dict[int, tuple[int, float]] | None:
    """``worker -> (pid, CPU seconds)`` of every worker process (local backend only: Ray actors may run
    on other machines); None where one is unknown."""
    if backend != "local":
        return None
    out = {}
    for worker in range(pool.num_workers):
        pid = pool.pid(worker)
        cpu = process_cpu_seconds(pid)
        if cpu is None:
            return None
        out[worker] = (pid, cpu)
    return out


def _cpu_between(before: dict[int, tuple[int, float]] | None, after: dict[int, tuple[int, float]] | None
                 ) -> float | None:
    """Worker CPU seconds between two snapshots; None when a worker was replaced in between."""
    if before is None or after is None or any(before[w][0] != after[w][0] for w in before):
        return None
    return sum(after[w][1] - before[w][1] for w in before)


def measure_env_steps(env: str, num_workers: int, envs_per_worker: int, seconds: float,
                      warmup: float = 3.0, seed: int = 0, backend: str = "local",
                      backend_options: dict | None = None,
                      progress: Callable[[str], None] | None = None) -> EnvBenchResult:
    """Step ``env`` with uniformly random actions through a worker pool, no model.

    The pool is started, every worker resets its envs, then ``warmup`` seconds
    are stepped but not counted, then steps are counted for ``seconds``. This
    is the ceiling of training throughput on the same workers: agent steps/s
    of ``fwrl train`` divided by this number is the fraction left after
    inference and learning. With the local backend the worker processes' CPU
    time over the window is measured too (env steps per core). ``progress(text)``
    hears where it is, twice a second.
    """
    from fwrl.envs.backends import make_pool
    from fwrl.envs.groups import env_path
    from fwrl.envs.registry import describe_env
    from fwrl.envs.worker_pool import PoolSettings

    check_window(seconds, warmup)
    info = describe_env(env)
    path = env_path(env)
    rng = np.random.default_rng(seed)
    k = envs_per_worker
    pool = make_pool(backend, PoolSettings(env, num_workers, envs_per_worker, seed), info, **(backend_options or {}))
    acted = [False] * num_workers  # actions sent since the worker's last (re)start
    counting = False
    steps = round_trips = episodes = restarts0 = 0
    window_start = 0.0
    cpu0 = None
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
                cpu0 = _workers_cpu(pool, backend)
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
        cpu = _cpu_between(cpu0, _workers_cpu(pool, backend))
        return EnvBenchResult(env, num_workers, envs_per_worker, window, steps, round_trips, episodes,
                              pool.restarts - restarts0, startup, path, cpu)
    finally:
        pool.close()


def parse_env_paths(env: str, text: str | None) -> tuple[str, ...]:
    """The env paths ``--paths`` names for ``env``: () for none given (the spec as it is), every path
    that can run here for ``all``, else the comma-separated values of the family's ``vector``
    option (each checked: unknown ones and libraries that are not installed are errors)."""
    from fwrl.envs.groups import env_paths, with_env_path

    if text is None:
        return ()
    if text.strip() == "all":
        paths = env_paths(env)
        if not paths:
            with_env_path(env, "none")  # raises: the family has no vector option
        return paths
    paths = tuple(p.strip() for p in text.split(","))
    if not all(paths) or len(set(paths)) != len(paths):
        raise FwrlError(f"--paths {text!r} must be env paths separated by commas, each once (e.g. none,ale), "
                        "or all.")
    for path in paths:
        if path == "auto":
            raise FwrlError("--paths names the paths to compare: ale, envpool or none (or all), not auto.")
        with_env_path(env, path)
    return paths


def measure_env_paths(env: str, paths: Sequence[str], rounds: int, num_workers: int, envs_per_worker: int,
                      seconds: float, warmup: float, seed: int = 0, backend: str = "local",
                      backend_options: dict | None = None,
                      progress: Callable[[str], None] | None = None) -> dict[str, list[EnvBenchResult]]:
    """:func:`measure_env_steps` for each of ``paths`` (values of the spec's ``vector`` option; ()
    for the spec as given) on the same workers, the paths alternating, ``rounds`` times; the
    results by path, in measuring order."""
    from fwrl.envs.groups import env_path, with_env_path

    check_window(seconds, warmup)
    check_rounds(rounds)
    specs = {path: with_env_path(env, path) for path in paths} or {env_path(env): env}
    results: dict[str, list[EnvBenchResult]] = {path: [] for path in specs}
    for round_ in range(rounds):
        for path, spec in specs.items():
            label = f"{path}, round {round_ + 1} of {rounds}: " if len(specs) > 1 or rounds > 1 else ""
            results[path].append(measure_env_steps(
                spec, num_workers, envs_per_worker, seconds, warmup=warmup, seed=seed, backend=backend,
                backend_options=backend_options,
                progress=None if progress is None else (lambda text, label=label: progress(label + text))))
    return results


def env_paths_table(results: dict[str, list[EnvBenchResult]], title: str):
    """A rich table, one row per env path: means over the rounds (and each round's steps/s when there
    were several), per worker CPU second, and the ratios to the Python chain (``none``) where it was
    measured."""
    from rich.table import Table

    rounds = max(len(runs) for runs in results.values())
    base = results.get("none")
    base_rate = mean_over_rounds([r.steps_per_second for r in base]) if base else None
    base_core = mean_over_rounds([r.steps_per_cpu_second for r in base]) if base else None
    columns = ["path", "steps/s", *(["rounds"] if rounds > 1 else []), "per CPU s", "cores", "ms/trip",
               "episodes", "restarts", *(["x none", "x none/CPU s"] if base else [])]
    table = Table(*columns, title=title)
    for path, runs in results.items():
        rate = mean_over_rounds([r.steps_per_second for r in runs])
        per_core = mean_over_rounds([r.steps_per_cpu_second for r in runs])
        cells = [path, figure(rate)]
        if rounds > 1:
            cells.append(" ".join(figure(r.steps_per_second) for r in runs))
        cells += [figure(per_core), figure(mean_over_rounds([r.cores_busy for r in runs]), 2),
                  figure(mean_over_rounds([r.ms_per_round_trip for r in runs]), 1),
                  f"{sum(r.episodes for r in runs):,}", str(sum(r.restarts for r in runs))]
        if base:
            cells += [figure(rate / base_rate if base_rate else None, 2),
                      figure(per_core / base_core if base_core and per_core else None, 2)]
        table.add_row(*cells)
    return table


def bench_envs(args: argparse.Namespace) -> int:
    """``fwrl bench envs``: raw env steps/s through the worker layer, random actions; with ``--paths``,
    each env path of the spec on the same workers, alternating (``--rounds``)."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    warmup = getattr(args, "warmup", None)
    if warmup is None:
        warmup = min(5.0, args.seconds / 4)
    check_window(args.seconds, warmup)
    rounds = getattr(args, "rounds", 1)
    check_rounds(rounds)
    from fwrl.envs.registry import resolve

    resolve(args.env)  # a bad spec fails here, before any process starts
    paths = parse_env_paths(args.env, getattr(args, "paths", None))
    what = f" ({', '.join(paths)}, alternating, {rounds} round{'s' * (rounds > 1)})" if paths else ""
    console.print(f"stepping {args.env}{what} with random actions: {args.num_workers} workers x "
                  f"{args.envs_per_worker} envs, {warmup:g} s warm-up, {args.seconds:g} s measured ...")
    backend = args.backend
    options = {"address": args.ray_address} if backend == "ray" else None
    with console.status("starting workers ...") as status:
        results = measure_env_paths(args.env, paths, rounds, args.num_workers, args.envs_per_worker, args.seconds,
                                    warmup, backend=backend, backend_options=options, progress=status.update)
    json_path = getattr(args, "json_path", None)
    if json_path:
        import json

        from fwrl.utils.files import atomic_write_text

        record = {"env": args.env, "num_workers": args.num_workers, "envs_per_worker": args.envs_per_worker,
                  "backend": backend, "seconds": args.seconds, "warmup": warmup, "rounds": rounds,
                  "paths": {path: [r.to_dict() for r in runs] for path, runs in results.items()}}
        atomic_write_text(Path(json_path), json.dumps(record, indent=2) + "\n")
    if len(results) > 1 or rounds > 1:
        from fwrl.utils.console import show_table

        show_table(env_paths_table(results, f"fwrl bench envs: {args.env}, {args.num_workers} workers x "
                                               f"{args.envs_per_worker} envs ({backend} backend)"))
        console.print("steps/s: env steps per second (mean over the rounds); per CPU s: env steps per second of "
                      "CPU time of the worker processes, all their threads (per core they kept busy; n/a where a "
                      "worker was restarted, or under Ray); cores: the cores they kept busy; ms/trip: per worker "
                      "round trip; x none: the ratios to the Python chain.")
        if json_path:
            console.print(f"wrote {json_path}")
        return 0
    (path, (r,)), = results.items()
    table = Table("measure", "value", title=f"fwrl bench envs: {r.env}")
    table.add_row("env steps/s", f"{r.steps_per_second:,.0f}", style="bold")
    table.add_row("env steps/s per worker", f"{r.steps_per_second / r.num_workers:,.0f}")
    table.add_row("env steps/s per env", f"{r.steps_per_second / (r.num_workers * r.envs_per_worker):,.0f}")
    table.add_row("env steps per worker CPU second", figure(r.steps_per_cpu_second))
    table.add_row("worker CPU cores busy", figure(r.cores_busy, 2))
    table.add_row("ms per worker round trip", f"{r.ms_per_round_trip:.2f}")
    table.add_row("env path", f"{path} ({'the Python chain' if path == 'none' else 'C++ threads'})")
    table.add_row("workers x envs per worker", f"{r.num_workers} x {r.envs_per_worker} ({backend} backend)")
    table.add_row("measured", f"{r.seconds:.1f} s, {r.env_steps:,} env steps, {r.episodes:,} episodes")
    table.add_row("worker restarts", str(r.restarts))
    table.add_row("startup (spawn + reset)", f"{r.startup_seconds:.1f} s")
    from fwrl.utils.console import show_table

    show_table(table, console)
    console.print("Training throughput (agent steps/s of fwrl train) divided by env steps/s is the "
                  "fraction left after inference and learning.")
    if json_path:
        console.print(f"wrote {json_path}")
    return 0
