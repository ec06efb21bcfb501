"""What a training run reports: episode statistics, metrics rows, and where they go
(``metrics.csv``, TensorBoard, the live panel).

A metrics row (one per ``log_interval``) holds the counters (``time``,
``agent_steps``, ``acted_steps``, ``updates``, ``episodes``), the last
update's losses and policy entropy per step, episode means of the last 100 episodes (per task and
normalised where the family has constants), and how the pipeline spent the
interval: ``share/<stage>`` of each thread's wall time (summing to 1 per thread; several acting
threads are summed, so their shares are those of the mean acting thread), ``policy_lag_*``,
``rollout_queue`` and ``peak_memory_mb``.

``episodes.csv`` has a row per finished training episode (``agent_steps``, the count of the metrics
row written after it ended; ``task``, ``return``, ``length`` in agent steps, ``worker``): the data
for a confidence interval over a run's last episodes, per task.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from fwrl.agents.inference import INFERENCE_STAGES
from fwrl.agents.learner import LEARNER_STAGES
from fwrl.agents.stage_timer import StageTimer, shares
from fwrl.envs.worker_pool import EpisodeRecord
from fwrl.runner.rundir import RunDir

# Stage shares of the two threads in metrics rows (fractions of each thread's own wall time over
# the interval; each thread's shares sum to 1): the acting thread's rest is bookkeeping outside
# the stages (logging, checkpoints, callbacks); the learner's idle time is waiting for rollouts,
# its rest the time outside its stages (before it started, between updates).
ACTOR_SHARES = INFERENCE_STAGES
LEARNER_SHARES = ("learner_idle",) + LEARNER_STAGES


class Episodes:
    """Finished episodes with running means, per task and normalised where constants exist.

    ``normalise(task_name, mean_return)`` gives the paper's normalised score
    (Atari / DMLab human-normalised, ProcGen min-max) or None. ``count`` starts at
    ``count`` (a resumed run continues its episode count).
    """

    def __init__(self, task_names: tuple[str, ...], window: int = 100,
                 normalise: Callable[[str, float], float | None] | None = None, count: int = 0):
        self.task_names = task_names
        self.window = window
        self.normalise = normalise
        self.recent: deque[EpisodeRecord] = deque(maxlen=window)
        self.by_task = {i: deque(maxlen=window) for i in range(len(task_names))}
        self.count = count
        self.unwritten: deque[EpisodeRecord] = deque()  # finished since episodes.csv's last rows

    def add(self, record: EpisodeRecord) -> None:
        self.recent.append(record)
        self.by_task.setdefault(record.task, deque(maxlen=self.window)).append(record)
        self.unwritten.append(record)
        self.count += 1

    def take_rows(self, agent_steps: int) -> list[dict[str, Any]]:
        """episodes.csv's rows of the episodes finished since the last call (safe beside other acting
        threads' :meth:`add`), stamped with ``agent_steps``."""
        rows = []
        while self.unwritten:
            record = self.unwritten.popleft()
            name = self.task_names[record.task] if 0 <= record.task < len(self.task_names) else str(record.task)
            rows.append({"agent_steps": agent_steps, "task": name, "return": record.episode_return,
                         "length": record.episode_step, "worker": record.worker})
        return rows

    def mean_return(self) -> float:
        return mean([r.episode_return for r in self.recent])

    def mean_success(self) -> float:
        return mean([r.extra["success"] for r in self.recent if "success" in r.extra])

    def per_task(self) -> dict[str, float]:
        """``return/<task>`` for multi-task runs; ``normalised/<task>`` and their mean
        ``normalised_return`` where the family has normalisation constants."""
        row: dict[str, float] = {}
        normalised = []
        for t, records in self.by_task.items():
            name = self.task_names[t]
            value = mean([r.episode_return for r in records])
            if len(self.task_names) > 1:
                row[f"return/{name}"] = value
            score = self.normalise(name, value) if self.normalise and records else None
            if score is not None:
                normalised.append(score)
                if len(self.task_names) > 1:
                    row[f"normalised/{name}"] = score
        if self.normalise is not None:
            row["normalised_return"] = mean(normalised) if len(normalised) == len(self.task_names) else math.nan
        return row


def normaliser(env: str) -> Callable[[str, float], float | None] | None:
    """Per-task score normalisation for ``env``'s family (None where it has none)."""
    from fwrl.envs.spec import parse_env_spec
    from fwrl.evaluation.scores import normalisation_kind, normalise

    spec = parse_env_spec(env)
    if not normalisation_kind(spec.family):
        return None
    return lambda task, score: normalise(spec.family, task, score, spec.options)


def mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else math.nan


class Mean:
    """Running mean of samples, reset when read."""

    def __init__(self):
        self.total, self.count = 0.0, 0

    def add(self, value: float) -> None:
        self.total += value
        self.count += 1

    def take(self) -> float:
        value = self.total / self.count if self.count else 0.0
        self.total, self.count = 0.0, 0
        return value


def pipeline_row(actor_timers: Sequence[StageTimer], learner_timer: StageTimer, queue_depth: Mean,
                 device: torch.device) -> dict[str, Any]:
    """Where the time of the last interval went (the acting threads' stages summed over them, so the
    shares are those of the mean acting thread), the queue depth and the peak memory."""
    actor: dict[str, float] = {}
    actor_wall = 0.0
    for timer in actor_timers:
        seconds, wall = timer.collect()
        actor_wall += wall
        for name, value in seconds.items():
            actor[name] = actor.get(name, 0.0) + value
    learner, learner_wall = learner_timer.collect()
    row = shares(actor, actor_wall, ACTOR_SHARES, rest="actor_other")
    row.update(shares(learner, learner_wall, LEARNER_SHARES, rest="learner_other"))
    row["rollout_queue"] = round(queue_depth.take(), 2)
    row["peak_memory_mb"] = round(peak_memory_mb(device), 1)
    return row


def peak_memory_mb(device: torch.device) -> float:
    """CUDA: peak memory allocated on ``device`` since the last call; CPU: the process's peak RSS."""
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        return peak / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


class MetricsSink:
    """Writes each row to ``metrics.csv``, TensorBoard (where installed), the live panel and, with
    ``--wandb``, the run's W&B tracker (:class:`fwrl.runner.tracking.WandbTracker`)."""

    def __init__(self, run_dir: Path, progress, resumed: Mapping[str, Any] | None = None, tracker=None,
                 episodes: Episodes | None = None):
        """``resumed``: a resumed run's checkpoint counters (``agent_steps``, and ``metrics_rows``, the
        rows written when it was taken; -1 in checkpoints that predate it): the folder keeps the rows
        written until then (:meth:`fwrl.runner.rundir.RunDir.metrics`, which also starts a new run's
        metrics anew), and TensorBoard hides a killed session's events from the checkpoint's step on.
        ``episodes``: the run's finished episodes, whose rows go to episodes.csv before each training row."""
        folder = RunDir(run_dir)
        metrics = folder.metrics(resumed)
        self.csv = metrics.csv
        self.episodes_csv, self.episodes = metrics.episodes, episodes
        # a resumed run's checkpoint step, until a row passes it
        self.resumed_steps: int | None = metrics.purge_step if self.csv.rows else None
        self.progress = progress
        self.tracker = tracker
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            self.tensorboard = None
        else:
            quiet_tensorboard_writer_faults()
            # hides the killed session's events from the checkpoint's step on (events at that step it wrote
            # after the checkpoint included); the kept rows of that step are written again
            self.tensorboard = SummaryWriter(str(folder.tensorboard), purge_step=metrics.purge_step)
        self.tensorboard_dir = folder.tensorboard
        for row in metrics.at_purge_step if self.tensorboard is not None else ():
            self._write_tensorboard({k: _number(v) for k, v in row.items()})

    @property
    def rows(self) -> int:
        """Rows in metrics.csv so far (a checkpoint records it)."""
        return self.csv.rows

    def write(self, row: dict[str, Any], show: bool = True) -> None:
        training = not any(str(k).startswith("eval/") for k in row)  # an evaluation row has eval/ columns
        if self.resumed_steps is not None and training:
            if row.get("agent_steps", 0) <= self.resumed_steps:  # a resumed session's training row before its
                if show and self.progress is not None:           # first update: the checkpoint's row holds
                    self.progress.update(row)                    # this step already; shown, not written
                return
            self.resumed_steps = None
        if self.episodes is not None and training and "agent_steps" in row:
            self.episodes_csv.write_rows(self.episodes.take_rows(int(row["agent_steps"])))
        self.csv.write(row)
        self._write_tensorboard(row)
        if self.tracker is not None:
            self.tracker.log_row(row)
        if show and self.progress is not None:
            self.progress.update(row)

    def _write_tensorboard(self, row: dict[str, Any]) -> None:
        if self.tensorboard is None:
            return
        try:
            self._add_scalars(row)
        except OSError as exc:  # TensorBoard's writer names no file: a disk fault is said with its folder
            raise OSError(exc.errno, exc.strerror, str(self.tensorboard_dir)) from None

    def _add_scalars(self, row: dict[str, Any]) -> None:
        step = row["agent_steps"]
        for key, value in row.items():
            if key in ("agent_steps", "time") or value == "" or value is None or isinstance(value, str):
                continue
            if isinstance(value, float) and math.isnan(value):
                continue
            self.tensorboard.add_scalar(key, value, step)
        self.tensorboard.flush()

    def close(self) -> None:
        if self.tensorboard is not None:
            try:
                self.tensorboard.close()
            except OSError as exc:  # its writer thread's disk fault, said with the folder
                raise OSError(exc.errno, exc.strerror, str(self.tensorboard_dir)) from None


def _number(value: Any) -> Any:
    """A metrics.csv field as a number where it reads as one (else as it is: skipped by TensorBoard's rows)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return value
    return int(number) if number.is_integer() and "." not in str(value) and "e" not in str(value).lower() else number


def quiet_tensorboard_writer_faults() -> None:
    """Keep a disk fault in TensorBoard's writer thread (a full disk, a read-only mount) from printing a
    traceback: that thread keeps the error and re-raises it, and the next ``add_scalar``, ``flush`` or
    ``close`` raises it again in the run's thread, where it ends the command in one line (exit 74).
    Every other thread exception goes to the hook that was there before. Installed once per process."""
    if getattr(threading.excepthook, "fwrl_tensorboard", False):
        return
    previous = threading.excepthook

    def hook(args: "threading.ExceptHookArgs") -> None:
        if not (isinstance(args.exc_value, OSError) and _raised_in_tensorboard(args.exc_traceback)):
            previous(args)

    hook.fwrl_tensorboard = True  # type: ignore[attr-defined]
    threading.excepthook = hook


def _raised_in_tensorboard(tb: Any) -> bool:
    """Whether a thread's traceback starts (past the threading module's own frames) in the tensorboard
    package: the exception came out of a thread that runs TensorBoard's code, its writer."""
    while tb is not None and tb.tb_frame.f_code.co_filename == threading.__file__:
        tb = tb.tb_next
    return tb is not None and "/tensorboard/" in tb.tb_frame.f_code.co_filename.replace("\\", "/")
