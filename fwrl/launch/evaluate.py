"""``fwrl evaluate``: play test episodes with a trained agent, in parallel, reproducibly.

Protocols (REFERENCE.md section 5), the defaults per env family:

- Atari: 30 episodes x 5 repeats of full games (``mode="test"``: no episodic
  life; ALE's 108 000-frame cap), greedy;
- ProcGen: the train levels (0-199 in easy, 0-499 in hard / memory, or the
  spec's own ``start_level`` / ``num_levels``) and the three test splits of
  the SRWM paper (Sec. 4.3: levels 1000-1199, 1200-1399, 1400-1599), 200
  episodes each, greedy;
- DeepMind Lab: the test configuration (``mode="test"``), 3 x 100 episodes
  (RTRL paper, Table 1), greedy;
- other families: 100 episodes, greedy.

The core state runs through whole episodes: the inference loop keeps it per
env slot and the ``done`` flag of an episode's first frame resets it.

Reproducibility: evaluation steps the workers in lock step (inference waits
for every worker still playing, so the batch seen by the model never depends
on timing) and every env slot plays a fixed number of episodes,
``ceil(N / slots)``. Of those, the first N in the order (episode index within
its slot, worker, slot) are kept, so no episode is chosen for being short.
With ``--policy sample`` the sampling generator is seeded as well. The same
checkpoint, protocol and seed give the same JSON.
"""

from __future__ import annotations

import copy
import math
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from fwrl.agents.inference import InferenceLoop
from fwrl.envs.spec import EnvSpec, parse_env_spec
from fwrl.envs.backends import make_pool
from fwrl.envs.worker_pool import StepResult, WorkerPool
from fwrl.errors import FwrlError, unknown_choice
from fwrl.launch import scores

POLICIES = ("greedy", "sample")
PROCGEN_TEST_STARTS = (1000, 1200, 1400)
PROCGEN_SPLIT_LEVELS = 200
PROCGEN_TRAIN_LEVELS = {"easy": 200, "hard": 500, "memory": 500}


@dataclass(frozen=True)
class Split:
    """A named evaluation setting: ``train``, ``test``, ``test_1000``..., with its env spec."""

    name: str
    env: str


@dataclass(frozen=True)
class Protocol:
    episodes: int
    repeats: int
    splits: tuple[Split, ...]


def protocol_splits(env: str) -> tuple[Split, ...]:
    """The evaluation splits of ``env`` (ProcGen: train + three test splits; others: test)."""
    spec = parse_env_spec(env)
    if spec.family != "procgen":
        return (Split("test", spec.text),)
    from fwrl.envs.registry import resolve

    _, family = resolve(spec)
    opts = family.validate(spec)
    if opts["distribution"] == "exploration":
        return (Split("test", spec.text),)
    if opts["num_levels"] > 0:
        train = spec.with_options(start_level=opts["start_level"], num_levels=opts["num_levels"])
    else:
        n = PROCGEN_TRAIN_LEVELS.get(opts["distribution"], PROCGEN_SPLIT_LEVELS)
        train = spec.with_options(start_level=0, num_levels=n)
    tests = tuple(
        Split(f"test_{start}", spec.with_options(start_level=start, num_levels=PROCGEN_SPLIT_LEVELS).text)
        for start in PROCGEN_TEST_STARTS
    )
    return (Split("train", train.text), *tests)


def default_protocol(env: str) -> Protocol:
    family = parse_env_spec(env).family
    episodes, repeats = {"atari": (30, 5), "procgen": (200, 1), "dmlab": (100, 3)}.get(family, (100, 1))
    return Protocol(episodes, repeats, protocol_splits(env))


def select_splits(splits: Sequence[Split], names: Sequence[str] | None) -> tuple[Split, ...]:
    if not names:
        return tuple(splits)
    by_name = {s.name: s for s in splits}
    for name in names:
        if name not in by_name:
            raise unknown_choice("evaluation split", name, by_name)
    return tuple(by_name[n] for n in names)


# ----------------------------------------------------------------------------- collecting episodes

@dataclass
class EvalEpisode:
    episode_return: float
    length: int
    task: int
    worker: int
    slot: int  # index within the worker
    index: int  # how many episodes this slot finished before
    extra: dict = field(default_factory=dict)


class EpisodeCollector(WorkerPool):
    """A lock-step view of a pool that records each finished episode with its env slot.

    ``wait`` returns the results of every worker still playing, sorted by
    worker, and only once all of them answered. A worker whose slots have all
    played their quota is no longer returned, so it is never stepped again.
    """

    def __init__(self, pool: WorkerPool, num_tasks: int, quota: Mapping[int, int],
                 stop: threading.Event | None = None):
        self.pool = pool
        self.num_workers = pool.num_workers
        self.envs_per_worker = pool.envs_per_worker
        self.num_tasks = num_tasks
        self.quota = dict(quota)
        self.stop = stop
        self.episodes: dict[tuple[int, int], list[EvalEpisode]] = {
            (w, j): [] for w in range(self.num_workers) for j in range(self.envs_per_worker)
        }
        self._lives: dict[int, int] = {}
        self._active = set(range(self.num_workers))
        self._buffer: dict[int, StepResult] = {}

    @property
    def restarts(self) -> int:  # type: ignore[override]
        return self.pool.restarts

    @property
    def complete(self) -> bool:
        return not self._active

    def _worker_done(self, worker: int) -> bool:
        need = self.quota[worker % self.num_tasks]
        return all(len(self.episodes[(worker, j)]) >= need for j in range(self.envs_per_worker))

    def _record(self, r: StepResult) -> None:
        if self._lives.get(r.worker) != r.life:  # first result of a (re)started worker: fresh envs
            self._lives[r.worker] = r.life
            return
        ended = np.flatnonzero(r.done)
        if len(ended) != len(r.episodes):
            raise RuntimeError(
                f"worker {r.worker} ended {len(ended)} episodes but reported {len(r.episodes)} finished games; "
                "evaluation needs test-mode envs, where every episode is a whole game."
            )
        for slot, rec in zip(ended, r.episodes):
            played = self.episodes[(r.worker, int(slot))]
            played.append(EvalEpisode(rec.episode_return, rec.episode_step, rec.task, r.worker, int(slot),
                                      len(played), dict(rec.extra)))

    def wait(self, timeout: float | None = None) -> list[StepResult]:
        while not self._active.issubset(self._buffer):
            if self.stop is not None and self.stop.is_set():
                return []
            for r in self.pool.wait(0.5):
                self._record(r)
                self._buffer[r.worker] = r
        results = [self._buffer[w] for w in sorted(self._active)]
        self._buffer.clear()
        self._active = {r.worker for r in results if not self._worker_done(r.worker)}
        return [r for r in results if r.worker in self._active]

    def act(self, worker: int, actions: np.ndarray) -> None:
        self.pool.act(worker, actions)

    def start(self) -> None:
        self.pool.start()

    def close(self) -> None:
        self.pool.close()

    def select(self, episodes: int) -> dict[int, list[EvalEpisode]]:
        """Per task, the first ``episodes`` in the order (index, worker, slot)."""
        out: dict[int, list[EvalEpisode]] = {t: [] for t in range(self.num_tasks)}
        for played in self.episodes.values():
            for ep in played:
                out[ep.task].append(ep)
        return {t: sorted(eps, key=lambda e: (e.index, e.worker, e.slot))[:episodes] for t, eps in out.items()}


def slots_per_task(num_tasks: int, num_workers: int, envs_per_worker: int) -> dict[int, int]:
    """Multi-task assignment: worker i runs game i mod n."""
    if num_workers < num_tasks:
        raise FwrlError(
            f"evaluating {num_tasks} games needs at least {num_tasks} workers (worker i runs game i mod "
            f"{num_tasks}), got --num-workers {num_workers}."
        )
    counts = {t: 0 for t in range(num_tasks)}
    for w in range(num_workers):
        counts[w % num_tasks] += envs_per_worker
    return counts


def play_episodes(
    model: nn.Module,
    env: str,
    *,
    episodes: int,
    greedy: bool = True,
    num_workers: int = 2,
    envs_per_worker: int = 1,
    seed: int = 0,
    device: torch.device | str = "cpu",
    backend: str = "local",
    step_timeout: float = 60.0,
    stop: threading.Event | None = None,
    backend_options: Mapping[str, Any] | None = None,
) -> dict[int, list[EvalEpisode]]:
    """``episodes`` finished test-mode episodes per task of ``env``, on a new pool of ``backend``."""
    if episodes < 1:
        raise FwrlError(f"the number of evaluation episodes must be at least 1, got {episodes}.")
    slots_per_task(parse_env_spec(env).num_tasks, num_workers, envs_per_worker)  # check before spawning
    pool = make_pool(backend, env, num_workers, envs_per_worker, seed=seed, mode="test",
                     step_timeout=step_timeout, **dict(backend_options or {}))
    return collect_episodes(model, pool, env, episodes=episodes, greedy=greedy, seed=seed, device=device,
                            stop=stop)


def collect_episodes(
    model: nn.Module,
    pool: WorkerPool,
    env: str,
    *,
    episodes: int,
    greedy: bool = True,
    seed: int = 0,
    device: torch.device | str = "cpu",
    stop: threading.Event | None = None,
) -> dict[int, list[EvalEpisode]]:
    """Start ``pool`` (test-mode envs of ``env``), play until every slot has its quota, close it.

    Returns, per task index, the chosen episodes; an empty dict if ``stop`` was set first.
    """
    spec = parse_env_spec(env)
    slots = slots_per_task(spec.num_tasks, pool.num_workers, pool.envs_per_worker)
    quota = {t: math.ceil(episodes / n) for t, n in slots.items()}
    device = torch.device(device)
    collector = EpisodeCollector(pool, spec.num_tasks, quota, stop)
    was_training = model.training
    model.eval()
    devices = [device.index or 0] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices, enabled=not greedy):
            if not greedy:
                torch.manual_seed(seed)
            collector.start()
            loop = InferenceLoop(model, collector, None, device, threading.Lock(), greedy=greedy)
            while not collector.complete:
                if stop is not None and stop.is_set():
                    break
                loop.step(1.0)
    finally:
        collector.close()
        model.train(was_training)
    if not collector.complete:
        return {}
    return collector.select(episodes)


# ----------------------------------------------------------------------------- summaries

def _stats(values: Sequence[float]) -> tuple[float, float]:
    arr = np.asarray(values, dtype=np.float64)
    return float(arr.mean()), float(arr.std())


def _normalised(family: str, task: str, score: float, options: Mapping[str, Any]) -> float | None:
    value = scores.normalise(family, task, score, options)
    return None if value is None else round(value, 6)


def run_result(spec: EnvSpec, task: int, split: Split, repeat: int, seed: int,
               eps: list[EvalEpisode]) -> dict[str, Any]:
    """One (task, split, repeat): episode returns, mean, std (over episodes), normalised mean."""
    returns = [e.episode_return for e in eps]
    mean, std = _stats(returns)
    name = spec.names[task]
    split_opts = parse_env_spec(split.env).options
    out: dict[str, Any] = {
        "task": name, "split": split.name, "repeat": repeat, "env": split.env, "seed": seed,
        "episodes": len(eps), "mean": mean, "std": std,
        "normalised": _normalised(spec.family, name, mean, split_opts),
        "returns": returns, "lengths": [e.length for e in eps],
    }
    success = [e.extra["success"] for e in eps if "success" in e.extra]
    if success:
        out["success"] = float(np.mean(success))
    return out


def aggregate(runs: list[dict[str, Any]], family: str, options: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per (task, split) over repeats; then, over tasks and over the test splits, normalised means.

    ``mean`` is over every episode of every repeat, ``std`` over episodes,
    ``std_of_repeat_means`` across repeats. ``task="*"`` rows average the
    normalised scores of all tasks; ``split="test"`` rows (ProcGen) average the
    test splits, as the SRWM paper reports them.
    """
    rows: list[dict[str, Any]] = []
    keys = list(dict.fromkeys((r["task"], r["split"]) for r in runs))
    for task, split in keys:
        group = [r for r in runs if (r["task"], r["split"]) == (task, split)]
        returns = [x for r in group for x in r["returns"]]
        mean, std = _stats(returns)
        row = {"task": task, "split": split, "repeats": len(group), "episodes": len(returns), "mean": mean,
               "std": std, "std_of_repeat_means": _stats([r["mean"] for r in group])[1],
               "normalised": _normalised(family, task, mean, parse_env_spec(group[0]["env"]).options)}
        if all("success" in r for r in group):
            row["success"] = float(np.mean([r["success"] for r in group]))
        rows.append(row)
    tests = [s for s in dict.fromkeys(r["split"] for r in rows) if s.startswith("test_")]
    if len(tests) > 1:
        for task in dict.fromkeys(r["task"] for r in rows):
            per = [r for r in rows if r["task"] == task and r["split"] in tests]
            norm = [r["normalised"] for r in per]
            rows.append({"task": task, "split": "test", "repeats": len(per), "episodes": sum(r["episodes"] for r in per),
                         "mean": float(np.mean([r["mean"] for r in per])), "std": None,
                         "std_of_repeat_means": _stats([r["mean"] for r in per])[1],
                         "normalised": None if None in norm else round(float(np.mean(norm)), 6)})
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    if len(tasks) > 1:
        for split in list(dict.fromkeys(r["split"] for r in rows)):
            per = [r for r in rows if r["split"] == split and r["task"] != "*"]
            norm = [r["normalised"] for r in per]
            rows.append({"task": "*", "split": split, "repeats": per[0]["repeats"],
                         "episodes": sum(r["episodes"] for r in per),
                         "mean": float(np.mean([r["mean"] for r in per])), "std": None, "std_of_repeat_means": None,
                         "normalised": None if None in norm else round(float(np.mean(norm)), 6),
                         "median_normalised": None if None in norm else round(float(np.median(norm)), 6)})
    return rows


def attach_published(rows: list[dict[str, Any]], spec: EnvSpec, core: str, core_options: Mapping[str, Any],
                     unroll_length: int | None) -> None:
    for row in rows:
        found = scores.published_for(spec.family, row["task"], row["split"], core, core_options,
                                     unroll_length, games=tuple(spec.names))
        row["published"] = [{"source": p.source, "metric": p.metric, "value": p.value, "note": p.note}
                            for p in found]


# ----------------------------------------------------------------------------- whole evaluations

def evaluate(
    model: nn.Module,
    env: str,
    *,
    episodes: int | None = None,
    repeats: int | None = None,
    greedy: bool = True,
    splits: Sequence[str] | None = None,
    num_workers: int = 2,
    envs_per_worker: int = 1,
    seed: int = 0,
    device: torch.device | str = "cpu",
    backend: str = "local",
    step_timeout: float = 60.0,
    core: str = "",
    core_options: Mapping[str, Any] | None = None,
    unroll_length: int | None = None,
    stop: threading.Event | None = None,
    backend_options: Mapping[str, Any] | None = None,
) -> dict[str, Any] | None:
    """Evaluate ``model`` on ``env`` with the family's protocol (overridable); None if stopped."""
    protocol = default_protocol(env)
    episodes = protocol.episodes if episodes is None else episodes
    repeats = protocol.repeats if repeats is None else repeats
    if repeats < 1:
        raise FwrlError(f"--repeats must be at least 1, got {repeats}.")
    chosen = select_splits(protocol.splits, splits)
    spec = parse_env_spec(env)
    runs = []
    for split in chosen:
        for repeat in range(repeats):
            run_seed = seed + 10_007 * repeat
            per_task = play_episodes(model, split.env, episodes=episodes, greedy=greedy, num_workers=num_workers,
                                     envs_per_worker=envs_per_worker, seed=run_seed, device=device,
                                     backend=backend, step_timeout=step_timeout, stop=stop,
                                     backend_options=backend_options)
            if not per_task:
                return None
            for task, eps in per_task.items():
                runs.append(run_result(spec, task, split, repeat, run_seed, eps))
    rows = aggregate(runs, spec.family, spec.options)
    attach_published(rows, spec, core, core_options or {}, unroll_length)
    return {
        "env": spec.text, "family": spec.family, "normalisation": scores.normalisation_kind(spec.family),
        "policy": "greedy" if greedy else "sample", "episodes": episodes, "repeats": repeats,
        "splits": [s.name for s in chosen], "seed": seed, "num_workers": num_workers,
        "envs_per_worker": envs_per_worker, "core": core, "core_options": dict(core_options or {}),
        "aggregates": rows, "runs": runs,
    }


def load_agent(source: Path, device: torch.device | str = "cpu") -> tuple[nn.Module, dict[str, Any], Path]:
    """The model of a run folder (its ``checkpoint.pt``) or a checkpoint file, and the payload."""
    from fwrl.agents.checkpoint import load_checkpoint, load_model_weights
    from fwrl.envs.registry import EnvInfo
    from fwrl.launch.config import TrainConfig
    from fwrl.launch.train import build_model

    source = Path(source)
    path = source / "checkpoint.pt" if source.is_dir() else source
    if source.is_dir() and not path.is_file():
        raise FwrlError(f"{source} holds no checkpoint.pt; pass a run folder of fwrl train or a checkpoint file.")
    payload = load_checkpoint(path, map_location=device)
    config = TrainConfig.from_dict(payload["config"], source=str(path))
    raw = payload["env_info"]
    info = EnvInfo(tuple(raw["obs_shape"]), raw["obs_dtype"], int(raw["num_actions"]), tuple(raw["task_names"]))
    model = build_model(config, info).to(device)
    load_model_weights(model, payload["model"], str(path))
    return model.eval(), payload, path


def check_env_fits(env: str, model: nn.Module) -> None:
    from fwrl.envs.registry import describe_env

    info = describe_env(env)
    if tuple(info.obs_shape) != tuple(model.obs_shape) or info.num_actions != model.num_actions:
        raise FwrlError(
            f"env {env!r} has observations {info.obs_shape} and {info.num_actions} actions, but the agent "
            f"was built for {tuple(model.obs_shape)} and {model.num_actions}; evaluate it on an env like "
            "the one it was trained on."
        )


def default_num_workers(env: str) -> int:
    n = parse_env_spec(env).num_tasks
    cpus = min(os.cpu_count() or 1, 8)
    return n * max(1, math.ceil(cpus / n))


# ----------------------------------------------------------------------------- tables

def table_rows(result: Mapping[str, Any]) -> list[list[str]]:
    """Cells of the result table: task, split, episodes, return, normalised x100, success, published."""
    out = []
    for row in result["aggregates"]:
        spread = row["std_of_repeat_means"] if row["repeats"] > 1 else row["std"]
        ret = "" if row["task"] == "*" else f"{row['mean']:.4g}" + (f" ± {spread:.3g}" if spread is not None else "")
        norm = "" if row["normalised"] is None else f"{100 * row['normalised']:.1f}"
        success = f"{row['success']:.3f}" if "success" in row else ""
        published = "; ".join(
            f"{p['value']:g}{' (norm. x100)' if p['metric'] == 'normalised_x100' else ''}"
            + (f" [{p['note']}]" if p["note"] else "")
            for p in row.get("published", [])
        )
        out.append([row["task"], row["split"], str(row["episodes"]), ret, norm, success, published])
    return out


TABLE_HEADER = ["task", "split", "episodes", "return (mean ± sd)", "normalised x100", "success", "published"]


def _title(result: Mapping[str, Any]) -> str:
    return (f"{result['env']} / {result['core'] or 'agent'} / {result['policy']} / "
            f"{result['episodes']} episodes x {result['repeats']} repeats / seed {result['seed']}")


def markdown_table(result: Mapping[str, Any]) -> str:
    lines = [f"# Evaluation: {_title(result)}", ""]
    if result.get("checkpoint"):
        lines += [f"Checkpoint `{result['checkpoint']}` at {result.get('agent_steps', 0):,} agent steps.", ""]
    lines += ["| " + " | ".join(TABLE_HEADER) + " |", "|" + "---|" * len(TABLE_HEADER)]
    lines += ["| " + " | ".join(cells) + " |" for cells in table_rows(result)]
    lines += ["", "sd: across repeats where there are several, else across episodes. "
              f"Normalisation: {result['normalisation'] or 'none for this family'}. "
              "Published figures come from the papers' full-length runs (REFERENCE.md section 6)."]
    return "\n".join(lines) + "\n"


def print_table(result: Mapping[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(*TABLE_HEADER, title=_title(result))
    for cells in table_rows(result):
        table.add_row(*cells, style="bold" if cells[0] == "*" or cells[1] == "test" else None)
    Console().print(table)


def write_result(result: Mapping[str, Any], json_path: Path) -> Path:
    """Write the JSON and, beside it, the markdown table; returns the markdown path."""
    import json

    from fwrl.launch.rundir import atomic_write_text

    json_path = Path(json_path)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(json_path, json.dumps(result, indent=2) + "\n")
    md_path = json_path.with_suffix(".md")
    atomic_write_text(md_path, markdown_table(result))
    return md_path


# ----------------------------------------------------------------------------- during training

class PeriodicEvaluator:
    """``eval_every``: evaluate a snapshot of the acting weights every that many agent steps.

    Each evaluation runs in a background thread on its own small test-mode
    pool (greedy, ``eval_episodes`` per task and split, one repeat, a fixed
    seed so successive evaluations play the same episodes); finished ones
    come back from :meth:`poll` as metrics rows (``eval/<split>/...`` keys).
    """

    def __init__(self, config, device: torch.device, agent_steps: int = 0, start_time: float | None = None):
        self.config = config
        self.every = int(config.eval_every)
        self.device = device
        self.start_time = time.monotonic() if start_time is None else start_time
        self.next_at = (agent_steps // self.every + 1) * self.every if self.every > 0 else 0
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.rows: list[dict[str, Any]] = []
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()
        n = parse_env_spec(config.env).num_tasks
        self.num_workers = n * max(1, math.ceil(2 / n))
        per_task_workers = self.num_workers // n
        self.envs_per_worker = max(1, min(4, math.ceil(config.eval_episodes / per_task_workers)))

    def maybe_start(self, agent_steps: int, model: nn.Module, lock: threading.Lock) -> bool:
        """Start an evaluation if ``agent_steps`` passed the next mark and none is running."""
        if self.every <= 0 or agent_steps < self.next_at or (self.thread is not None and self.thread.is_alive()):
            return False
        self.next_at = (agent_steps // self.every + 1) * self.every
        with lock:
            snapshot = copy.deepcopy(model)
        self.thread = threading.Thread(target=self._run, args=(snapshot, agent_steps), name="fwrl-eval",
                                       daemon=True)
        self.thread.start()
        return True

    def _run(self, model: nn.Module, agent_steps: int) -> None:
        cfg = self.config
        try:
            result = evaluate(model, cfg.env, episodes=cfg.eval_episodes, repeats=1, greedy=True,
                              num_workers=self.num_workers, envs_per_worker=self.envs_per_worker,
                              seed=cfg.seed + 100_003, device=self.device, backend="local",
                              step_timeout=cfg.step_timeout, core=cfg.core, core_options=cfg.core_options,
                              stop=self.stop)
        except BaseException as exc:  # reported through poll()
            with self._lock:
                self.errors.append(exc)
            return
        if result is not None:
            row = metrics_row(result, agent_steps)
            row["time"] = round(time.monotonic() - self.start_time, 2)
            with self._lock:
                self.rows.append(row)

    def poll(self) -> list[dict[str, Any]]:
        """Rows of the evaluations finished since the last call; re-raises an evaluation's error."""
        with self._lock:
            rows, self.rows = self.rows, []
            errors, self.errors = self.errors, []
        if errors:
            raise FwrlError(f"evaluation during training failed: {errors[0]}") from errors[0]
        return rows

    def close(self, wait: bool = False) -> None:
        """Stop a running evaluation (or, with ``wait``, let it finish) and join its thread."""
        if not wait:
            self.stop.set()
        if self.thread is not None:
            self.thread.join()


def metrics_row(result: Mapping[str, Any], agent_steps: int) -> dict[str, Any]:
    """Evaluation results as metrics.csv columns: ``eval/<split>/mean_return`` and friends."""
    row: dict[str, Any] = {"agent_steps": agent_steps}
    rows = result["aggregates"]
    multi = len({r["task"] for r in rows if r["task"] != "*"}) > 1
    for r in rows:
        prefix = f"eval/{r['split']}"
        if r["task"] == "*":
            row[f"{prefix}/mean_return"] = r["mean"]
            if r["normalised"] is not None:
                row[f"{prefix}/normalised"] = r["normalised"]
            continue
        if multi:
            row[f"{prefix}/return/{r['task']}"] = r["mean"]
            continue
        row[f"{prefix}/mean_return"] = r["mean"]
        if r["normalised"] is not None:
            row[f"{prefix}/normalised"] = r["normalised"]
        if "success" in r:
            row[f"{prefix}/success"] = r["success"]
    return row
