"""``fwrl bench throughput``: agent steps/s of real training, its env ceiling, and where the time goes.

:func:`measure_throughput` trains a resolved config for a warm-up and a measured window (one
process, or ``--learners N`` ranks) and summarises the metrics rows logged in the window
(:func:`window_summary`: steps, updates, the stage shares per thread, policy lag, queue depth,
memory); :func:`bench_throughput` is the command's body (see ``fwrl.launch.cli``): the env ceiling
of the same workers (``fwrl.launch.bench.envs``), the run, their ratio, for each env path and round
asked for, as a table, JSON and, with ``--profile-path``, a profile of the acting thread.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from fwrl.errors import FwrlError
from fwrl.launch.bench.envs import EnvBenchResult, measure_env_steps, parse_env_paths
from fwrl.launch.bench.rounds import check_rounds, check_window, figure, mean_over_rounds
from fwrl.runner.hooks import SessionHook
from fwrl.settings.config import TrainConfig


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


# How long past its window's time acting waits for the session's first update before it stops without
# one (the bench then says the window held no update).
FIRST_UPDATE_WAIT = 120.0


class ActingWindow(SessionHook):
    """The bench's say in its training session (:class:`~fwrl.runner.hooks.SessionHook`): acting stops
    ``seconds`` after it started (the warm-up and the window, whatever the start-up took) and, with
    ``after_first_update``, no sooner than that many seconds after the session's first update, which it
    waits for up to :data:`FIRST_UPDATE_WAIT` seconds more (a window starts at its warm-up's end or at the
    first update, whichever is later, and lasts its seconds). ``learns`` false (``--acting-only``): no
    updates, each batch handed back to the store unread."""

    def __init__(self, seconds: float, after_first_update: float | None = None, learns: bool = True):
        self.seconds, self.after_first_update, self.learns = seconds, after_first_update, learns
        self.until = self.settle = float("inf")  # when acting stops; the earliest it may, after an update

    def acting_started(self, at: float) -> None:
        self.until = self.settle = at + self.seconds
        if self.after_first_update is not None:
            self.until += FIRST_UPDATE_WAIT

    def stop_acting(self, now: float, updated: bool) -> bool:
        if self.after_first_update is not None and updated:
            self.until, self.after_first_update = max(self.settle, now + self.after_first_update), None
        return now >= self.until


# the runs of each env path, in measuring order: (its config, its env ceiling or None, its throughput)
Measured = dict[str, list[tuple[TrainConfig, EnvBenchResult | None, ThroughputResult]]]


def window_summary(rows: list[dict[str, str]], warmup: float, until: float = float("inf"),
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
        # the window ends at the first row logged ``seconds`` or more after its start: the rows come a
        # log interval apart with some jitter, and a profile that follows begins at that same row
        until = start + seconds
        end = next((float(r["time"]) for r in timed if float(r["time"]) >= until), None)
        until = until if end is None else end
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

    check_window(seconds, warmup)
    _check_acting_only(config, acting_only)
    config = config.model_copy(update=dict(max_seconds=0.0, total_steps=10**12, log_interval=1.0, log_every_steps=0,
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
                if not waiting[0]:  # a slow first update must not start the profile before the window
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
                window = ActingWindow(warmup + seconds + profiled, after_first_update, learns=not acting_only)
                stopped = train(config, run, progress=progress, hook=window)
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
    result = window_summary(rows, warmup, until, config, learn=not acting_only,
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
    from fwrl.runner.rundir import RunDir
    from fwrl.runner.train import train

    ranks = ranks_from_env()
    folder = RunDir(Path(run))
    try:
        folder.open(resume=False, writer=ranks.is_main)
        progress = _BenchProgress(Console(stderr=True), warmup, acting_seconds - warmup) if ranks.is_main else None
        train(TrainConfig.from_dict(config, "the bench's learner ranks"), folder.path, progress=progress,
              hook=ActingWindow(acting_seconds, after_first_update))
    except FwrlError as exc:  # said in one line, as the CLI says it, not as a traceback of the launcher's
        print(f"fwrl: error: learner rank {ranks.rank}: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    finally:
        folder.close()


def _acting_threads(config: TrainConfig) -> int:
    """The acting threads ``config``'s run had (``acting_threads`` 0: the default)."""
    from fwrl.runner.concurrency import acting_threads

    return acting_threads(config.acting_threads, config.num_workers // config.learners)


def _acting_graph(config: TrainConfig) -> bool:
    """Whether ``config``'s run replayed its acting forward as CUDA graphs (``inference_graph`` unset:
    the default for its device and acting threads)."""
    from fwrl.runner.agent import pick_device
    from fwrl.agents.inference_graph import acting_graph

    return acting_graph(config.inference_graph, pick_device(config.device), _acting_threads(config))


def _throughput_record(config: TrainConfig, ceiling: EnvBenchResult | None, result: ThroughputResult,
                       acting_only: bool = False) -> dict:
    """What ``--json-path`` writes for one measured config (``acting_only``: measured without updates)."""
    from fwrl.envs.groups import env_path

    return {"config": config.to_dict(), "env_path": env_path(config.env), "acting_threads": _acting_threads(config),
            "worker_splits": config.worker_splits,
            "inference_graph": _acting_graph(config), "acting_priority": config.acting_priority,
            "acting_batch_wait": config.acting_batch_wait, "acting_staging": config.acting_staging,
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
                 ("env ceiling per worker CPU second", figure(ceiling.steps_per_cpu_second)),
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
              + f"; waits {1000 * config.acting_batch_wait:g} ms for more workers"
              + ("; observations read from the workers' shared memory" if config.acting_staging == "shared" else "")),
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

    from fwrl.envs.groups import env_path, with_env_path

    check_window(seconds, warmup)
    check_rounds(rounds)
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
    measured, interrupted = _measure_rounds(configs, rounds, seconds, warmup, ceiling_seconds, profiler, acting_only,
                                            console)
    record = _show_measured(config, measured, rounds, acting_only, Console())
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


def _measure_rounds(configs: dict[str, TrainConfig], rounds: int, seconds: float, warmup: float,
                    ceiling_seconds: float, profiler, acting_only: bool, console) -> tuple[Measured, int]:
    """Each of ``configs`` (one per env path), alternating, ``rounds`` times: its env ceiling (where
    ``ceiling_seconds``) and its throughput; (the runs measured by path, the stop signal that ended
    one before its window did, 0 if none: no further runs after it)."""
    measured: Measured = {p: [] for p in configs}
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
    return {path: runs for path, runs in measured.items() if runs}, interrupted


def _show_measured(config: TrainConfig, measured: Measured, rounds: int, acting_only: bool, out) -> dict:
    """The table of the measured runs on ``out`` (one run: a row per measure; several: a column per
    env path); returns what ``--json-path`` writes."""
    from rich.table import Table

    from fwrl.utils.console import show_table

    if len(measured) == 1 and rounds == 1:
        (path, [(cfg, ceiling, result)]), = measured.items()
        table = Table("measure", "value", title=f"fwrl bench throughput: {cfg.env} / {cfg.core} (env path {path})")
        for name, value in _throughput_rows(cfg, ceiling, result):
            table.add_row(name, value, style="bold" if name in ("agent steps/s", "ratio to the env ceiling") else None)
        if acting_only:
            table.add_row("learner", "none (--acting-only: each batch handed back to the store unread)")
        show_table(table, out)
        return _throughput_record(cfg, ceiling, result, acting_only)
    show_table(_throughput_paths_table(config, measured), out)
    return {"paths": {path: [_throughput_record(*m, acting_only) for m in runs] for path, runs in measured.items()}}


def _write_profile(profiler, path: Path, config: TrainConfig, console) -> None:
    from fwrl.agents.stage_profile import write_profile

    if profiler.profiler is None:
        console.print(f"no profile written to {path}: the run ended before its profile window began")
        return
    title = (f"fwrl bench throughput profile: {config.env} / {config.core} ({config.stem} stem) on {config.device}, "
             f"{config.num_workers} workers x {config.envs_per_worker} envs")
    write_profile(profiler.profiler, path, title, profiler.seconds)
    console.print(f"wrote {path}")


def _throughput_paths_table(config: TrainConfig, measured: Measured):
    """Side by side, a column per env path: the mean over the rounds of each measure (each round's
    agent steps/s in its own row)."""
    from rich.table import Table

    table = Table("measure", *measured, title=f"fwrl bench throughput: {config.env} / {config.core}, by env path")

    def row(name: str, value: Callable[[TrainConfig, EnvBenchResult | None, ThroughputResult], float | None],
            fmt: Callable[[float | None], str] = figure, style: str | None = None) -> None:
        table.add_row(name, *(fmt(mean_over_rounds([value(*m) for m in runs])) for runs in measured.values()),
                      style=style)

    row("agent steps/s", lambda c, e, r: r.steps_per_second, style="bold")
    table.add_row("  each round", *(", ".join(f"{r.steps_per_second:,.0f}" for _, _, r in runs)
                                   for runs in measured.values()))
    row("env ceiling (steps/s)", lambda c, e, r: e.steps_per_second if e else None)
    row("env ceiling per worker CPU second", lambda c, e, r: e.steps_per_cpu_second if e else None)
    row("ratio to the env ceiling", lambda c, e, r: r.steps_per_second / e.steps_per_second if e else None,
        lambda v: "n/a" if v is None else f"{v:.1%}", style="bold")
    row("updates per second", lambda c, e, r: r.updates / r.seconds, lambda v: figure(v, 2))
    row("policy lag (updates, mean)", lambda c, e, r: r.policy_lag_mean, lambda v: figure(v, 2))
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
