"""``fwrl bench ...``: benchmarks, not tests.

Each ``bench_<name>`` is the body of ``fwrl bench <name>`` (see
``fwrl.launch.cli``) and returns the exit status; ``bench_throughput`` takes
the TrainConfig the CLI resolved exactly as for ``fwrl train``. The kernel
benchmark (``fwrl bench kernels``, which parses its own options) is the
module ``kernels`` of this package.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from fwrl.errors import FwrlError
from fwrl.settings.config import TrainConfig


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


def _check_window(seconds: float, warmup: float) -> None:
    if not seconds > 0 or not warmup >= 0:
        raise FwrlError(f"bench envs needs --seconds > 0 and a warm-up >= 0, got {seconds:g} and {warmup:g}.")


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

    _check_window(seconds, warmup)
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


def _check_rounds(rounds: int) -> None:
    if rounds < 1:
        raise FwrlError(f"--rounds must be >= 1, got {rounds}.")


def measure_env_paths(env: str, paths: Sequence[str], rounds: int, num_workers: int, envs_per_worker: int,
                      seconds: float, warmup: float, seed: int = 0, backend: str = "local",
                      backend_options: dict | None = None,
                      progress: Callable[[str], None] | None = None) -> dict[str, list[EnvBenchResult]]:
    """:func:`measure_env_steps` for each of ``paths`` (values of the spec's ``vector`` option; ()
    for the spec as given) on the same workers, the paths alternating, ``rounds`` times; the
    results by path, in measuring order."""
    from fwrl.envs.groups import env_path, with_env_path

    _check_window(seconds, warmup)
    _check_rounds(rounds)
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


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known and len(known) == len(values) else None


def _number(value: float | None, digits: int = 0) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def env_paths_table(results: dict[str, list[EnvBenchResult]], title: str):
    """A rich table, one row per env path: means over the rounds (and each round's steps/s when there
    were several), per worker CPU second, and the ratios to the Python chain (``none``) where it was
    measured."""
    from rich.table import Table

    rounds = max(len(runs) for runs in results.values())
    base = results.get("none")
    base_rate = _mean([r.steps_per_second for r in base]) if base else None
    base_core = _mean([r.steps_per_cpu_second for r in base]) if base else None
    columns = ["path", "steps/s", *(["rounds"] if rounds > 1 else []), "per CPU s", "cores", "ms/trip",
               "episodes", "restarts", *(["x none", "x none/CPU s"] if base else [])]
    table = Table(*columns, title=title)
    for path, runs in results.items():
        rate = _mean([r.steps_per_second for r in runs])
        per_core = _mean([r.steps_per_cpu_second for r in runs])
        cells = [path, _number(rate)]
        if rounds > 1:
            cells.append(" ".join(_number(r.steps_per_second) for r in runs))
        cells += [_number(per_core), _number(_mean([r.cores_busy for r in runs]), 2),
                  _number(_mean([r.ms_per_round_trip for r in runs]), 1), f"{sum(r.episodes for r in runs):,}",
                  str(sum(r.restarts for r in runs))]
        if base:
            cells += [_number(rate / base_rate if base_rate else None, 2),
                      _number(per_core / base_core if base_core and per_core else None, 2)]
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
    _check_window(args.seconds, warmup)
    rounds = getattr(args, "rounds", 1)
    _check_rounds(rounds)
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
    table.add_row("env steps per worker CPU second", _number(r.steps_per_cpu_second))
    table.add_row("worker CPU cores busy", _number(r.cores_busy, 2))
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


# ----------------------------------------------------------------------------- bench throughput

# Stage shares of metrics rows shown by the bench, per thread (fwrl.runner.train): each thread's rows are
# fractions of that thread's wall time and sum to 100% (the last row of each is the rest).
ACTOR_ROWS = ("env_wait", "inference_forward", "rollout_bookkeeping", "actor_other")
LEARNER_ROWS = ("learner_idle", "learner_gather", "learner_forward", "learner_backward", "learner_allreduce",
                "learner_optimiser", "learner_publish", "learner_other")
THREADS = (("acting thread", ACTOR_ROWS), ("learner thread", LEARNER_ROWS))
SHARE_LABEL = "share of this thread's wall time"


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
    interrupted_by: int = 0  # the stop signal that ended the run before its window did (0: none)

    @property
    def steps_per_second(self) -> float:
        return self.agent_steps / self.seconds


def _window_summary(rows: list[dict[str, str]], warmup: float, until: float = float("inf"),
                    config: TrainConfig | None = None, learn: bool = True,
                    seconds: float | None = None) -> ThroughputResult:
    """Steps, updates and the time-weighted means of the pipeline columns of the metrics rows
    logged from ``warmup`` seconds (or from the first update, where it came later) to ``until``, or
    with ``seconds`` to that long after the window's start (each row covers the interval since the
    one before). A window without an update is a
    FwrlError that says why (:func:`_no_update_text`), never a rate of 0 steps/s. ``learn`` false
    (``--acting-only``): the window starts at the warm-up's end and needs handed-back batches
    (agent steps) instead of updates."""
    timed = [r for r in rows if r.get("steps_per_second", "") != ""]
    progress = "updates" if learn else "agent_steps"  # what must grow over the window
    first_update = next((float(r["time"]) for r in timed if int(float(r.get(progress) or 0)) > 0), None)
    start = max(warmup, first_update) if first_update is not None else warmup
    if seconds is not None:
        until = start + seconds
    after = [r for r in timed if start <= float(r["time"]) <= until]
    if first_update is None or len(after) < 2 or int(after[-1][progress]) <= int(after[0][progress]):
        raise FwrlError(_no_update_text(timed, warmup, until, first_update, config))
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


def _no_update_text(rows: list[dict[str, str]], warmup: float, until: float, first_update: float | None,
                    config: TrainConfig | None) -> str:
    """Why the measured window holds no update, and what to change."""
    last = rows[-1] if rows else {}
    ran = float(last.get("time") or 0.0)
    shape = f"B {config.batch_size} x T {config.unroll_length} of {config.core}" if config else "this batch"
    if first_update is None:
        columns = int(float(last.get("rollout_columns") or 0))
        acted = int(float(last.get("acted_steps") or 0))
        batch = config.batch_size if config else columns
        state = (f"was still filling its first batch ({min(columns, batch)} of {batch} rollouts ready, {acted:,} "
                 "agent steps acted)" if columns < batch else "had its first batch and was still in its first update")
        said = f"no update finished in {ran:.0f} s of training: the learner {state}"
    else:
        said = (f"too few updates to measure: the first finished {first_update:.0f} s into training and none after "
                f"it in the {ran:.0f} s the run lasted (the window starts at the warm-up's end, {warmup:g} s, or at "
                "the first update)")
    return (f"{said}: the window is too short for updates of {shape} here. Give it more time (--warmup, "
            "--seconds), or a smaller batch (--batch-size, --unroll-length) or a GPU (--device cuda); no agent "
            "steps/s is reported for a window without updates.")


class _BenchProgress:
    """What ``train`` reports while the bench runs: one status line (warm-up, then measuring)."""

    def __init__(self, console, warmup: float, seconds: float, learn: bool = True):
        from fwrl.runner.train_progress import SmoothedRate

        self.console, self.warmup, self.seconds, self.learn = console, warmup, seconds, learn
        self.status = None
        self.last_print = 0.0
        self.rate = SmoothedRate(10.0)  # over the last 10 s: a 1 s row without an update does not read 0
        self.window_start: float | None = None  # the warm-up's end, or the first update where later

    def start(self, budget=None, deadline: float = float("inf")) -> None:
        """The run starts (the bench's own window, not the run's budget or deadline, paces this line)."""
        self.status = self.console.status("starting workers ...")
        self.status.start()

    def update(self, row: dict) -> None:
        t = float(row.get("time", 0.0))
        steps = int(row.get("agent_steps", 0))
        self.rate.add(t, steps)
        started = int(row.get("updates" if self.learn else "agent_steps", 0)) > 0
        if self.window_start is None and t >= self.warmup and (started or not self.learn):
            self.window_start = t
        phase = (f"measuring {t - self.window_start:.0f} / {self.seconds:g} s" if self.window_start is not None
                 else f"warming up {t:.0f} / {self.warmup:g} s" if t < self.warmup
                 else f"warming up {t:.0f} s, until the first update")
        rate = self.rate.rate()
        if not started:
            speed = f"no {'update' if self.learn else 'batch'} yet ({int(row.get('acted_steps', 0)):,} agent steps acted)"
        elif rate != rate:  # one row so far
            speed = "rate known after the next row"
        else:
            span = self.rate.samples[-1][0] - self.rate.samples[0][0]
            speed = f"{rate:,.0f} steps/s over the last {span:.0f} s"
        text = f"{phase}: {steps:,} agent steps {'learnt' if self.learn else 'acted (no updates)'}, {speed}"
        if self.console.is_terminal:
            self.status.update(text)
        elif time.monotonic() - self.last_print >= 5.0:
            self.console.print(text, highlight=False)
            self.last_print = time.monotonic()

    def finish(self, row: dict) -> None:
        """The run's last row (its figures are in the bench's own table)."""

    def stop(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None


def measure_throughput(config: TrainConfig, seconds: float, warmup: float, progress=None,
                       profiler=None, acting_only: bool = False) -> ThroughputResult:
    """Train with ``config`` for ``warmup + seconds``, and at least ``seconds`` past the first
    update where that comes after the warm-up (no checkpoints but the last, in a temporary folder),
    and summarise the metrics rows logged from the warm-up's end or the first update, whichever is
    later.

    Steps are the learner's (T x B per update), read from rows logged every
    second, so the figure is what training really consumes. ``profiler`` (a
    :class:`fwrl.agents.stage_profile.WindowProfiler` whose window starts where the measured one
    ends) sees every row; the run goes on for its window, which the figures leave out.
    ``acting_only``: no updates (each batch handed back to the store unread), one learner rank.
    """
    import csv
    import tempfile

    from fwrl.runner.train import train

    _check_window(seconds, warmup)
    _check_acting_only(config, acting_only)
    config = config.model_copy(update=dict(max_seconds=0.0, total_steps=10**12, log_interval=1.0,
                                           checkpoint_interval=1e9, milestone_interval=0, eval_every=0))
    with tempfile.TemporaryDirectory(prefix="fwrl-bench-") as tmp:
        run = Path(tmp) / "run"
        if progress is None:
            from fwrl.runner.train_progress import Progress

            progress = Progress(config, run)
            progress.update = lambda row: None  # the caller prints its own table
        profiled = profiler.stop - profiler.start if profiler is not None else 0.0
        if profiler is not None:
            shown = progress.update
            waiting = [not acting_only]  # for the row of the first update

            def update(row: dict) -> None:
                if waiting[0] and int(float(row.get("updates") or 0)) > 0:
                    # the measured window starts at the first update where that is after the warm-up:
                    # the profiled seconds follow it
                    waiting[0] = False
                    profiler.start = max(profiler.start, float(row.get("time", 0.0)) + seconds)
                    profiler.stop = profiler.start + profiled
                profiler.update(row)
                shown(row)

            progress.update = update
        signal_number = 0
        # acting lasts the warm-up and the window, and the window at least ``seconds`` after the first
        # update (a slow start, such as a first update that compiles, does not eat the window)
        # (plus one log interval: the rows, which place the window, come a second apart)
        after_first_update = None if acting_only else seconds + profiled + config.log_interval
        try:
            if config.learners > 1:
                _train_ranks(config, run, warmup + seconds, warmup, after_first_update)
            else:
                stopped = train(config, run, progress=progress, acting_seconds=warmup + seconds + profiled,
                                learn=not acting_only, after_first_update=after_first_update)
                signal_number = stopped.signal
        finally:
            if profiler is not None:
                profiler.finish()
        with (run / "metrics.csv").open() as f:
            rows = list(csv.DictReader(f))
    # with a profile after it, the window ends where the profiled seconds begin: --acting-only's at
    # the warm-up and window's end, a learning run's ``seconds`` after the window's start
    profiled_learning = profiler is not None and not acting_only
    until = warmup + seconds if profiler is not None and acting_only else float("inf")
    result = _window_summary(rows, warmup, until, config, learn=not acting_only,
                             seconds=seconds if profiled_learning else None)
    result.interrupted_by = signal_number
    return result


def _check_acting_only(config: TrainConfig, acting_only: bool) -> None:
    if acting_only and config.learners > 1:
        raise FwrlError(f"--acting-only measures one learner rank that makes no updates; --learners "
                        f"{config.learners} runs ranks that all-reduce in theirs: drop --learners or --acting-only.")


def _train_ranks(config: TrainConfig, run: Path, acting_seconds: float, warmup: float,
                 after_first_update: float | None = None) -> None:
    """``--learners N``: train ``config`` as N learner ranks on this machine (processes started
    like ``fwrl train --learners N``'s, each acting for ``acting_seconds`` with its own share of the
    workers); rank 0 writes ``run``'s metrics, whose agent steps count every rank's."""
    import signal

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from fwrl.runner.learner_ranks import describe_exit, launch_ranks

    # a failed rank says why in its own line, not in the launcher's traceback and the other ranks' SIGTERM
    logs = [logging.getLogger(name) for name in ("torch.distributed.elastic", "torch.multiprocessing")]
    levels = [log.level for log in logs]
    for log in logs:
        log.setLevel(logging.CRITICAL)
    try:
        launch_ranks(config.learners, _bench_rank, config.to_dict(), str(run), acting_seconds, warmup,
                     after_first_update)
    except ChildFailedError as exc:
        rank, failure = sorted(exc.failures.items())[0]
        raise FwrlError(f"learner rank {rank} of {config.learners} {describe_exit(int(failure.exitcode))} "
                        f"(its own line above says why).") from None
    except SignalException as exc:  # the launcher stopped the ranks on a signal to this process
        if exc.sigval == signal.SIGINT:
            raise KeyboardInterrupt from None
        raise SystemExit(128 + int(exc.sigval)) from None  # the shell's convention, as fwrl train --learners
    finally:
        for log, level in zip(logs, levels):
            log.setLevel(level)


def _bench_rank(config: dict, run: str, acting_seconds: float, warmup: float,
                after_first_update: float | None = None) -> None:
    """One learner rank of :func:`_train_ranks` (a process of its own; rank 0 shows the progress)."""
    from rich.console import Console

    from fwrl.agents.distributed import ranks_from_env
    from fwrl.runner.rundir import prepare_run_dir
    from fwrl.runner.train import train

    ranks = ranks_from_env()
    try:
        path = prepare_run_dir(Path(run), resume=False, clean=ranks.is_main)
        progress = _BenchProgress(Console(stderr=True), warmup, acting_seconds - warmup) if ranks.is_main else None
        train(TrainConfig.from_dict(config, "the bench's learner ranks"), path, progress=progress,
              acting_seconds=acting_seconds, after_first_update=after_first_update)
    except FwrlError as exc:  # said in one line, as the CLI says it, not as a traceback of the launcher's
        print(f"fwrl: error: learner rank {ranks.rank}: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


def _acting_threads(config: TrainConfig) -> int:
    """The acting threads ``config``'s run had (``acting_threads`` 0: the default)."""
    from fwrl.runner.build import acting_threads

    return acting_threads(config.acting_threads, config.num_workers // config.learners)


def _acting_graph(config: TrainConfig) -> bool:
    """Whether ``config``'s run replayed its acting forward as CUDA graphs (``inference_graph`` unset:
    the default for its device and acting threads)."""
    from fwrl.runner.agent import pick_device
    from fwrl.runner.build import acting_graph

    return acting_graph(config.inference_graph, pick_device(config.device), _acting_threads(config))


def _throughput_record(config: TrainConfig, ceiling: EnvBenchResult | None, result: ThroughputResult,
                       acting_only: bool = False) -> dict:
    """What ``--json-path`` writes for one measured config (``acting_only``: measured without updates)."""
    from fwrl.envs.groups import env_path

    return {"config": config.to_dict(), "env_path": env_path(config.env), "acting_threads": _acting_threads(config),
            "worker_splits": config.worker_splits,
            "inference_graph": _acting_graph(config), "acting_priority": config.acting_priority,
            "acting_batch_wait": config.acting_batch_wait,
            "learners": config.learners, "acting_only": acting_only, "seconds": result.seconds,
            "agent_steps": result.agent_steps, "updates": result.updates, "steps_per_second": result.steps_per_second,
            "env_ceiling_steps_per_second": ceiling.steps_per_second if ceiling is not None else None,
            "env_ceiling_steps_per_cpu_second": ceiling.steps_per_cpu_second if ceiling is not None else None,
            "policy_lag_mean": result.policy_lag_mean, "policy_lag_max": result.policy_lag_max,
            "rollout_queue": result.rollout_queue, "peak_memory_mb": result.peak_memory_mb,
            "partial": bool(result.interrupted_by),  # a stop signal ended the run before its window did
            "shares": result.shares,
            "thread_shares": {title.split()[0]: {name: result.shares[f"share/{name}"] for name in names}
                              for title, names in THREADS}}


def _throughput_rows(config: TrainConfig, ceiling: EnvBenchResult | None,
                     result: ThroughputResult) -> list[tuple[str, str]]:
    """The (measure, value) rows of one measured config, as the bench prints them."""
    rows = [("agent steps/s", f"{result.steps_per_second:,.0f}")]
    if ceiling is not None:
        rows += [("env ceiling (random actions, same workers)", f"{ceiling.steps_per_second:,.0f} steps/s"),
                 ("env ceiling per worker CPU second", _number(ceiling.steps_per_cpu_second)),
                 ("ratio to the env ceiling", f"{result.steps_per_second / ceiling.steps_per_second:.1%}")]
    workers = f"{config.num_workers} x {config.envs_per_worker} ({config.backend} backend)"
    if config.worker_splits > 1:
        workers += f", each in {config.worker_splits} splits of {config.envs_per_worker // config.worker_splits}"
    threads = _acting_threads(config)
    rows += [("workers x envs per worker", workers),
             ("acting threads", f"{threads}" + ("; shares: the mean acting thread" if threads > 1 else "")
              + (" per learner rank" if config.learners > 1 else "")),
             ("acting forward", ("CUDA graphs" if _acting_graph(config) else "eager")
              + (", high-priority streams" if config.acting_priority == "high" else "")
              + f"; waits {1000 * config.acting_batch_wait:g} ms for more workers"),
             ("learner ranks", f"{config.learners}" + ("; shares: rank 0's, B per rank" if config.learners > 1
                                                        else "")),
             ("batch x unroll", f"{config.batch_size} x {config.unroll_length}"),
             ("updates in the window", f"{result.updates} in {result.seconds:.1f} s"),
             ("policy lag (updates)", f"mean {result.policy_lag_mean:.2f}, max {result.policy_lag_max}"),
             ("rollout queue (mean depth)", f"{result.rollout_queue:.2f}"),
             ("peak memory", f"{result.peak_memory_mb:,.0f} MiB")]
    for title, names in THREADS:
        rows.append((f"[bold]{title}[/bold]", SHARE_LABEL))
        rows += [(f"  {name}", f"{result.shares[f'share/{name}']:.1%}") for name in names]
        rows.append(("  (sum)", f"{sum(result.shares[f'share/{name}'] for name in names):.1%}"))
    return rows


def bench_throughput(config: TrainConfig, seconds: float = 60.0, warmup: float = 15.0, ceiling_seconds: float = 10.0,
                     json_path: str | None = None, paths: str | None = None, rounds: int = 1,
                     profile_path: str | None = None, profile_seconds: float = 5.0, acting_only: bool = False) -> int:
    """``fwrl bench throughput``: agent steps/s of ``config`` (a resolved training config), the env
    ceiling of the same workers measured in the same run, their ratio, and where the time goes;
    ``paths`` (``--paths``, as :func:`parse_env_paths` reads it): the same for each env path of
    the spec, alternating ``rounds`` times, side by side; ``json_path``: also write them (and
    the config) as JSON (one record, or ``{"paths": {path: [records]}}`` with ``--paths``);
    ``profile_path``: run ``profile_seconds`` longer, under ``torch.profiler`` (:mod:`fwrl.agents.stage_profile`;
    the figures leave that time out), and write the report there; ``acting_only``: no updates (the
    acting path's rate with no learner work beside it)."""
    from rich.console import Console
    from rich.table import Table

    from fwrl.envs.groups import env_path, with_env_path

    _check_window(seconds, warmup)
    _check_rounds(rounds)
    _check_acting_only(config, acting_only)
    if ceiling_seconds < 0:
        raise FwrlError(f"--ceiling-seconds must be >= 0 (0: skip the env ceiling), got {ceiling_seconds:g}.")
    chosen = parse_env_paths(config.env, paths)
    configs = ({path: config.model_copy(update={"env": with_env_path(config.env, path)}) for path in chosen}
               or {env_path(config.env): config})
    if profile_path and (len(configs) > 1 or rounds > 1):
        raise FwrlError(f"--profile-path profiles one measured run; this command measures {len(configs)} env "
                        f"path(s) x {rounds} round(s): drop --paths / --rounds, or --profile-path.")
    if profile_path and config.learners > 1:
        raise FwrlError(f"--profile-path profiles the acting thread of one process; --learners {config.learners} "
                        f"runs {config.learners}: drop --learners or --profile-path.")
    profiler = None
    if profile_path:
        from fwrl.agents.stage_profile import WindowProfiler
        from fwrl.runner.agent import pick_device

        profiler = WindowProfiler(warmup + seconds, warmup + seconds + profile_seconds, pick_device(config.device))
    console = Console(stderr=True)
    out = Console()
    measured: dict[str, list[tuple[TrainConfig, EnvBenchResult | None, ThroughputResult]]] = {p: [] for p in configs}
    interrupted = 0
    for round_ in range(rounds):
        if interrupted:
            break
        for path, cfg in configs.items():
            label = f"[{path}, round {round_ + 1} of {rounds}] " if len(configs) > 1 or rounds > 1 else ""
            ceiling = None
            if ceiling_seconds > 0:
                console.print(f"{label}env ceiling: {cfg.env} with random actions, {cfg.num_workers} workers x "
                              f"{cfg.envs_per_worker} envs, {ceiling_seconds:g} s ...")
                with console.status("stepping envs with random actions ...") as status:
                    ceiling = measure_env_steps(cfg.env, cfg.num_workers, cfg.envs_per_worker, ceiling_seconds,
                                                warmup=min(3.0, ceiling_seconds / 2), seed=cfg.seed,
                                                backend=cfg.backend,
                                                backend_options={"address": cfg.ray_address}
                                                if cfg.backend == "ray" else None, progress=status.update)
            console.print(f"{label}training {cfg.env} / {cfg.core} ({cfg.stem} stem) on {cfg.device}: "
                          f"{warmup:g} s warm-up, {seconds:g} s measured ...")
            result = measure_throughput(cfg, seconds, warmup, progress=_BenchProgress(console, warmup, seconds,
                                                                                      learn=not acting_only),
                                        profiler=profiler, acting_only=acting_only)
            measured[path].append((cfg, ceiling, result))
            interrupted = result.interrupted_by
            if interrupted:  # Ctrl-C (or SIGTERM, SIGHUP): no further runs; what was measured is shown as partial
                break
    measured = {path: runs for path, runs in measured.items() if runs}
    from fwrl.utils.console import show_table

    if len(measured) == 1 and rounds == 1:
        (path, [(cfg, ceiling, result)]), = measured.items()
        table = Table("measure", "value", title=f"fwrl bench throughput: {cfg.env} / {cfg.core} (env path {path})")
        for name, value in _throughput_rows(cfg, ceiling, result):
            table.add_row(name, value, style="bold" if name in ("agent steps/s", "ratio to the env ceiling") else None)
        if acting_only:
            table.add_row("learner", "none (--acting-only: each batch handed back to the store unread)")
        show_table(table, out)
        record = _throughput_record(cfg, ceiling, result, acting_only)
    else:
        show_table(_throughput_paths_table(config, measured), out)
        record = {"paths": {path: [_throughput_record(*m, acting_only) for m in runs] for path, runs in measured.items()}}
    if profiler is not None:
        _write_profile(profiler, Path(profile_path), config, console)
    if json_path:
        import json

        from fwrl.utils.files import atomic_write_text

        atomic_write_text(Path(json_path), json.dumps(record, indent=2) + "\n")
        console.print(f"wrote {json_path}")
    if interrupted:
        import signal

        console.print(f"fwrl bench throughput: stopped by {signal.Signals(interrupted).name} before the measured "
                      "window ended: the figures above are partial (a shorter window than asked for).")
        return 128 + interrupted  # the shell's convention, as every fwrl command (130 after Ctrl-C)
    return 0


def _write_profile(profiler, path: Path, config: TrainConfig, console) -> None:
    from fwrl.agents.stage_profile import write_profile

    if profiler.profiler is None:
        console.print(f"no profile written to {path}: the run ended before its profile window began")
        return
    title = (f"fwrl bench throughput profile: {config.env} / {config.core} ({config.stem} stem) on {config.device}, "
             f"{config.num_workers} workers x {config.envs_per_worker} envs")
    write_profile(profiler.profiler, path, title, profiler.seconds)
    console.print(f"wrote {path}")


def _throughput_paths_table(config: TrainConfig, measured: dict[str, list[tuple[TrainConfig, EnvBenchResult | None,
                                                                                ThroughputResult]]]):
    """Side by side, a column per env path: the mean over the rounds of each measure (each round's
    agent steps/s in its own row)."""
    from rich.table import Table

    table = Table("measure", *measured, title=f"fwrl bench throughput: {config.env} / {config.core}, by env path")

    def row(name: str, value: Callable[[TrainConfig, EnvBenchResult | None, ThroughputResult], float | None],
            fmt: Callable[[float | None], str] = _number, style: str | None = None) -> None:
        table.add_row(name, *(fmt(_mean([value(*m) for m in runs])) for runs in measured.values()), style=style)

    row("agent steps/s", lambda c, e, r: r.steps_per_second, style="bold")
    table.add_row("  each round", *(", ".join(f"{r.steps_per_second:,.0f}" for _, _, r in runs)
                                   for runs in measured.values()))
    row("env ceiling (steps/s)", lambda c, e, r: e.steps_per_second if e else None)
    row("env ceiling per worker CPU second", lambda c, e, r: e.steps_per_cpu_second if e else None)
    row("ratio to the env ceiling", lambda c, e, r: r.steps_per_second / e.steps_per_second if e else None,
        lambda v: "n/a" if v is None else f"{v:.1%}", style="bold")
    row("updates per second", lambda c, e, r: r.updates / r.seconds, lambda v: _number(v, 2))
    row("policy lag (updates, mean)", lambda c, e, r: r.policy_lag_mean, lambda v: _number(v, 2))
    row("peak memory (MiB)", lambda c, e, r: r.peak_memory_mb)
    for title, names in THREADS:
        table.add_row(f"[bold]{title}[/bold]", *([SHARE_LABEL] * len(measured)))
        for name in names:
            row(f"  {name}", lambda c, e, r, key=f"share/{name}": r.shares[key],
                lambda v: "n/a" if v is None else f"{v:.1%}")
    first = next(iter(measured.values()))[0][0]
    table.caption = (f"{first.num_workers} workers x {first.envs_per_worker} envs ({first.backend} backend), "
                     f"B {first.batch_size} x T {first.unroll_length}, {first.stem} stem, {first.device}")
    return table


# ----------------------------------------------------------------------------- bench kernels

def bench_kernels(args: argparse.Namespace) -> int:
    """``fwrl bench kernels ...``: the options are those of ``fwrl.launch.bench.kernels``."""
    from fwrl.launch.bench.kernels import main

    return main(args.rest)
