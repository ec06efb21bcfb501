"""A resume: a run's checkpoint restored into a freshly built model, optimiser and schedule, once it is
checked to be the run's own (:meth:`~fwrl.runner.rundir.RunDir.foreign_checkpoint`) and trained with
the settings of the folder's config.yaml (:func:`check_config_edits`), and the counters the run
continues (:data:`PROGRESS`). :func:`fwrl.runner.build.build_run` calls :func:`restore`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from fwrl.agents.checkpoint import load_checkpoint, load_model_weights, set_rng_state
from fwrl.agents.model import AgentNet
from fwrl.errors import FwrlError
from fwrl.runner.budget import Budget
from fwrl.runner.rundir import CONFIG_EDITS_LOG, RunDir
from fwrl.settings.config import TrainConfig, changed_settings, saved_settings

# the counters a resumed run continues (a checkpoint's "progress"), and their start
# (metrics_rows: the rows of metrics.csv written when the checkpoint was taken; -1: not recorded)
PROGRESS = {"elapsed_seconds": 0.0, "episodes": 0, "acted_steps": 0, "metrics_rows": -1}


def restore(folder: RunDir, model: AgentNet, optimizer, scheduler, config: TrainConfig, budget: Budget,
            device: torch.device, accept_edits: bool = False, record_edits: bool = True) -> dict[str, Any]:
    """Load the folder's ``checkpoint.pt`` into the model, optimiser and schedule (with this session's
    budget) and the RNGs, once ``config`` (config.yaml's) is checked against the config it was trained
    with; returns its counters (:data:`PROGRESS` and the learner's)."""
    path = folder.checkpoint
    payload = load_checkpoint(path, map_location=device)
    foreign = folder.foreign_checkpoint(path, payload)
    if foreign:  # before the config's check: an edited config.yaml is not the cause, and no edit is accepted
        raise FwrlError(f"cannot resume: {foreign}. A run resumes from its own checkpoints: resume that run in its "
                        "own folder (or move its whole folder), and put this folder's own checkpoint.pt back "
                        "(or a milestone of it, checkpoint-<steps>.pt).")
    check_config_edits(folder, payload.get("config"), config, accept_edits, record=record_edits)
    load_model_weights(model, payload["model"], str(path))
    optimizer.load_state_dict(payload["optimizer"])
    scheduler.load_state_dict(payload["scheduler"])
    scheduler.steps_per_update = budget.steps_per_update
    scheduler.rebudget(budget.total_steps)  # a resumed run may get another budget: its LR from now on
    set_rng_state(payload["rng"])
    return {"agent_steps": payload["agent_steps"], "updates": payload["updates"],
            **{key: payload.get("progress", {}).get(key, start) for key, start in PROGRESS.items()}}


def check_config_edits(folder: RunDir, trained: dict[str, Any] | None, config: TrainConfig, accept: bool,
                       record: bool = True) -> None:
    """Refuse to resume on a config.yaml edited since the checkpoint in a setting that defines the
    model or the learning problem (the learning rate, the env's options, ...), in one line naming each
    (the checkpoint's value and config.yaml's); with ``accept``, resume on the edited ones and append
    them to ``config-edits.log`` in the run folder (``record``: the run's writer, rank 0)."""
    if not trained:  # a checkpoint without its config: nothing to compare
        return
    saved = TrainConfig.from_dict(saved_settings(trained), source=f"the config of {folder.checkpoint}")
    edits = changed_settings(saved, config)
    if not edits:
        return
    values = lambda c, k: c.core_options if k == "core_options" else getattr(c, k)  # noqa: E731
    details = "; ".join(f"{key} {values(saved, key)!r} -> {values(config, key)!r}" for key in edits)
    log = folder.path / CONFIG_EDITS_LOG
    if not accept:
        raise FwrlError(f"{folder.config_file} was edited since its checkpoint was written, in settings that "
                        f"define the model or the learning problem ({details}; checkpoint -> config.yaml). Put "
                        f"those values back, or pass --accept-config-edits to resume on them (recorded in {log}).")
    if not record:
        return
    folder.record_config_edits(details)
    print(f"fwrl train: resuming on an edited config.yaml ({details}); recorded in {log}", file=sys.stderr, flush=True)


def resume_line(run_dir: Path, config: TrainConfig, counters: dict[str, Any]) -> str:
    """What a resumed run says as it starts: where from, its budget, its time limit."""
    limit = (f"time limit {config.max_seconds:g} s for this session (--max-seconds changes it)" if config.max_seconds
             else "no time limit (--max-seconds sets one)")
    return (f"fwrl train: resuming {run_dir} from its checkpoint at {counters['agent_steps']:,} agent steps "
            f"({counters['updates']:,} updates); budget {config.total_steps:,} agent steps; {limit}")
