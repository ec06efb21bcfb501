"""``fwrl evaluate``: play test episodes with a trained agent, in parallel, reproducibly.

The pieces, beside this module: ``protocols`` (episodes, repeats and splits per
env family, PAPERS.md §5), ``episodes`` (a pool of test-mode workers,
lock step, fixed episodes per slot), ``results`` (aggregates, tables, files)
and ``scores`` (normalisation, published figures). This module runs whole
evaluations: :func:`evaluate` for ``fwrl evaluate``, :class:`PeriodicEvaluator`
for ``--eval-every`` during training. The same checkpoint, protocol and seed give the same JSON.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import nn

from fwrl.envs.spec import parse_env_spec
from fwrl.errors import FwrlError
from fwrl.evaluation import scores
from fwrl.evaluation.episodes import play_episodes
from fwrl.evaluation.periodic import PeriodicJob
from fwrl.evaluation.protocols import default_protocol, select_splits
from fwrl.evaluation.results import aggregate, attach_published, metrics_row, run_result


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
    env_wrappers: Sequence[str] = (),
    progress: Callable[[str, int, int, float], None] | None = None,
) -> dict[str, Any] | None:
    """Evaluate ``model`` on ``env`` with the family's protocol (overridable); None if stopped.
    ``env_wrappers``: the user wrappers the agent was trained with, applied in every worker.
    ``progress(what, done, total, mean_return)``: after every step of the envs, the episodes played
    of the whole evaluation (every split and repeat) and the mean return of the current split and
    repeat so far (``what`` names them: ``test, repeat 2 of 5``)."""
    protocol = default_protocol(env)
    episodes = protocol.episodes if episodes is None else episodes
    repeats = protocol.repeats if repeats is None else repeats
    if repeats < 1:
        raise FwrlError(f"--repeats must be at least 1, got {repeats}.")
    chosen = select_splits(protocol.splits, splits)
    spec = parse_env_spec(env)
    runs = []
    sessions = [(split, repeat) for split in chosen for repeat in range(repeats)]  # each plays alike
    for index, (split, repeat) in enumerate(sessions):
        run_seed = seed + 10_007 * repeat
        shown = None
        if progress is not None:
            what = split.name + (f", repeat {repeat + 1} of {repeats}" if repeats > 1 else "")

            def shown(done: int, total: int, mean: float, what: str = what, index: int = index) -> None:
                progress(what, index * total + done, len(sessions) * total, mean)
        per_task = play_episodes(model, split.env, episodes=episodes, greedy=greedy, num_workers=num_workers,
                                 envs_per_worker=envs_per_worker, seed=run_seed, device=device,
                                 backend=backend, step_timeout=step_timeout, stop=stop,
                                 backend_options=backend_options, env_wrappers=env_wrappers, progress=shown)
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


def check_env_fits(env: str, model: nn.Module, env_wrappers: Sequence[str] = ()) -> None:
    from fwrl.envs.registry import describe_env

    info = describe_env(env, wrappers=tuple(env_wrappers))
    if ((tuple(info.obs_shape), info.extra_size, tuple(info.action_dims))
            != (tuple(model.obs_shape), model.extra_size, tuple(model.action_dims))):
        raise FwrlError(
            f"env {env!r} has observations {info.obs_shape} and {info.num_actions} actions, but the agent "
            f"was built for {tuple(model.obs_shape)} and {model.num_actions}; evaluate it on an env like "
            "the one it was trained on."
        )


class PeriodicEvaluator(PeriodicJob[dict[str, Any]]):
    """``eval_every``: evaluate a snapshot of the acting weights every that many agent steps.

    Each evaluation runs in a background thread on its own small test-mode
    pool (greedy, ``eval_episodes`` per task and split, one repeat, a fixed
    seed so successive evaluations play the same episodes); finished ones
    come back from :meth:`poll` as metrics rows (``eval/<split>/...`` keys).
    """

    def __init__(self, config, device: torch.device, agent_steps: int = 0, start_time: float | None = None):
        super().__init__(config.eval_every, agent_steps, "fwrl-eval", "evaluation")
        self.config = config
        self.device = device
        self.start_time = time.monotonic() if start_time is None else start_time
        n = parse_env_spec(config.env).num_tasks
        self.num_workers = n * max(1, math.ceil(2 / n))
        per_task_workers = self.num_workers // n
        self.envs_per_worker = max(1, min(4, math.ceil(config.eval_episodes / per_task_workers)))

    def maybe_start(self, agent_steps: int, model: nn.Module, lock: threading.Lock) -> bool:
        """Start an evaluation if ``agent_steps`` passed the next mark and none is running."""
        return self._start(agent_steps, model, lock, agent_steps)

    def _work(self, model: nn.Module, agent_steps: int) -> dict[str, Any] | None:
        cfg = self.config
        result = evaluate(model, cfg.env, episodes=cfg.eval_episodes, repeats=1, greedy=True,
                          env_wrappers=tuple(cfg.env_wrappers),
                          num_workers=self.num_workers, envs_per_worker=self.envs_per_worker,
                          seed=cfg.seed + 100_003, device=self.device, backend="local",
                          step_timeout=cfg.step_timeout, core=cfg.core, core_options=cfg.core_options,
                          stop=self.stop)
        if result is None:
            return None
        row = metrics_row(result, agent_steps)
        row["time"] = round(time.monotonic() - self.start_time, 2)
        return row
