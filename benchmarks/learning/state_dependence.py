"""Does a trained agent still look at its input? State dependence of a checkpoint's outputs.

Plays ``--steps`` steps of the run's env with the checkpoint's sampled policy
(one env, one thread) and reports, over the states it visits:

- ``value_std``: the std of the value across states, and ``value_corr``: its
  correlation with the discounted return-to-go of the same steps (0 when the
  value ignores the frame);
- ``logit_std``: the std of the policy logits across states (mean over
  actions), ``entropy`` and its spread across states;
- ``stem_rel_var``: the stem's output std across states over its mean
  magnitude (mean over units): how much of the feature vector the frame moves;
- for an LSTM core, ``gate_saturation``: the share of gate pre-activations
  beyond +-5 (sigmoid and tanh flat there, so no gradient reaches the stem).

``--fresh`` adds a row for a freshly initialised agent of the same run
settings, the baseline of all the figures. Written for the Pong runs of issue
26, whose LSTM agents stayed at -20.3: their outputs were found constant across
states (gates saturated), not merely unlearned.

``--per-task`` measures each task of a multi-task env (ProcGen's games: the env
worker i makes plays task i) in a row of its own, ``--steps`` steps each, and
adds two figures of how the policy uses the task, which no input names (issue
73): ``policy_kl``, the mean KL of a step's policy from its task's mean action
distribution (how much the frame moves the policy within a task), and, per
agent, ``task_action_mi``: the mutual information between task and action in
nats, H(mean of the tasks' mean action distributions) - the mean of their
entropies (0: every task gets the same action distribution).

    python benchmarks/learning/state_dependence.py RUN [RUN ...] --fresh --out state_dependence.md
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fwrl.agents.checkpoint import load_checkpoint
from fwrl.envs.registry import EnvInfo, make_env
from fwrl.errors import FwrlError
from fwrl.settings.config import TrainConfig, saved_settings
from fwrl.runner.agent import build_model, load_agent

SATURATED = 5.0  # |pre-activation| beyond which sigmoid' < 0.007 and tanh' < 0.0002
FIELDS = ("agent_steps", "value_std", "value_corr", "logit_std", "entropy", "entropy_std", "stem_rel_var",
          "gate_saturation")
TASK_FIELDS = ("agent_steps", "value_std", "value_corr", "entropy", "policy_kl", "top_action", "top_share")


def _model(source: Path, fresh: bool) -> tuple[torch.nn.Module, dict[str, Any]]:
    if not fresh:
        model, payload, _ = load_agent(source)
        return model, {"env": payload["config"]["env"], "agent_steps": int(payload["agent_steps"]),
                       **_tasks(payload)}
    path = source / "checkpoint.pt" if source.is_dir() else source
    payload = load_checkpoint(path)
    config = TrainConfig.from_dict(saved_settings(payload["config"]), source=str(path))
    torch.manual_seed(config.seed)
    model = build_model(config, EnvInfo.from_dict(payload["env_info"])).eval()
    return model, {"env": config.env, "agent_steps": 0, **_tasks(payload)}


def _tasks(payload: dict[str, Any]) -> dict[str, Any]:
    names = tuple(EnvInfo.from_dict(payload["env_info"]).task_names)
    return {"task_names": names, "num_tasks": max(1, len(names))}


def _lstm_gate_hook(model: torch.nn.Module, store: list[torch.Tensor]):
    """Record the LSTM's gate pre-activations (input part plus biases; the recurrent part is
    added from the state the core reports), or None for other cores."""
    lstm = getattr(model.core, "lstm", None)
    if not isinstance(lstm, torch.nn.LSTM):
        return None

    def hook(module, args):
        x, hc = args[0], args[1] if len(args) > 1 else None
        pre = x @ module.weight_ih_l0.T + module.bias_ih_l0 + module.bias_hh_l0
        if hc is not None:
            pre = pre + hc[0][0] @ module.weight_hh_l0.T
        store.append(pre.detach().reshape(-1, pre.shape[-1]))

    return lstm.register_forward_pre_hook(hook)


def measure(source: Path, steps: int, seed: int, fresh: bool = False, task: int | None = None,
            loaded: tuple[torch.nn.Module, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The figures above for the agent of ``source`` (a run folder or checkpoint file), on its env's
    task ``task`` (the env worker ``task`` plays it; None: the first); ``loaded``: its ``_model``
    already built (the tasks of one agent share it)."""
    model, meta = loaded or _model(source, fresh)
    if model.extra_size:
        raise FwrlError(f"{source}: agents with extra observation entries are not measured by this script.")
    env = make_env(meta["env"], seed=seed, worker_index=task or 0)
    obs, _ = env.reset(seed=seed)
    features: list[torch.Tensor] = []
    gates: list[torch.Tensor] = []
    stem_hook = model.stem.register_forward_hook(lambda m, a, out: features.append(out.detach()))
    gate_hook = _lstm_gate_hook(model, gates)
    state = model.initial_state(1)
    values, logits, rewards, reward, done = [], [], [], 0.0, False
    with torch.no_grad():
        for _ in range(steps):
            inputs = {"obs": torch.as_tensor(np.asarray(obs))[None, None], "reward": torch.tensor([[reward]]),
                      "done": torch.tensor([[done]])}
            out, state = model(inputs, state)
            values.append(float(out["baseline"][0, 0]))
            logits.append(out["policy_logits"][0, 0])
            obs, reward, terminated, truncated, _ = env.step(int(out["action"][0, 0]))
            rewards.append(float(np.clip(reward, -1, 1)))
            done = bool(terminated or truncated)
            if done:
                obs, _ = env.reset()
    stem_hook.remove()
    if gate_hook is not None:
        gate_hook.remove()
    env.close()
    value = np.array(values)
    to_go = np.zeros_like(value)
    running = 0.0
    for i in range(len(rewards) - 1, -1, -1):
        running = rewards[i] + 0.99 * running
        to_go[i] = running
    logit = torch.stack(logits)
    probs = torch.softmax(logit, -1)
    entropy = -(probs * probs.clamp_min(1e-12).log()).sum(-1)
    feats = torch.cat(features)
    corr = float(np.corrcoef(value, to_go)[0, 1]) if value.std() > 0 and to_go.std() > 0 else math.nan
    mean_probs = probs.mean(0)
    kl = (probs * (probs.clamp_min(1e-12).log() - mean_probs.clamp_min(1e-12).log())).sum(-1)
    return {
        "source": str(source) + (" (fresh init)" if fresh else ""),
        "task": None if task is None else model_task_name(meta, task),
        "agent_steps": meta["agent_steps"],
        "policy_kl": float(kl.mean()), "mean_probs": [round(float(p), 5) for p in mean_probs],
        "top_action": int(mean_probs.argmax()), "top_share": float(mean_probs.max()),
        "value_std": float(value.std()), "value_corr": corr,
        "logit_std": float(logit.std(0).mean()),
        "entropy": float(entropy.mean()), "entropy_std": float(entropy.std()),
        "stem_rel_var": float((feats.std(0) / (feats.abs().mean(0) + 1e-8)).mean()),
        "gate_saturation": float((torch.cat(gates).abs() > SATURATED).float().mean()) if gates else math.nan,
    }


def model_task_name(meta: dict[str, Any], task: int) -> str:
    names = meta["task_names"]
    return names[task] if task < len(names) else str(task)


def task_action_mi(rows: list[dict[str, Any]]) -> float:
    """Mutual information (nats) between task and action for one agent's per-task rows (each task
    weighted equally): H(mean of the mean action distributions) - the mean of their entropies."""
    probs = np.array([r["mean_probs"] for r in rows])

    def entropy(p: np.ndarray) -> np.ndarray:
        return -(p * np.log(np.clip(p, 1e-12, None))).sum(-1)

    return float(entropy(probs.mean(0)) - entropy(probs).mean())


def _cell(row: dict[str, Any], key: str) -> str:
    value = row[key]
    if key in ("agent_steps", "top_action"):
        return f"{value:,}"
    return "-" if math.isnan(value) else f"{value:.4g}"


def markdown(rows: list[dict[str, Any]]) -> str:
    if rows and rows[0]["task"] is not None:
        head = "| run | task | " + " | ".join(TASK_FIELDS) + " |\n|---|---|" + "---|" * len(TASK_FIELDS) + "\n"
        body = "".join(f"| {r['source']} | {r['task']} | " + " | ".join(_cell(r, k) for k in TASK_FIELDS) + " |\n"
                       for r in rows)
        by_source: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            by_source.setdefault(r["source"], []).append(r)
        mi = "".join(f"- {source}: task_action_mi {task_action_mi(group):.4f} nats (at most ln {len(group)} = "
                     f"{math.log(len(group)):.3f})\n" for source, group in by_source.items())
        return head + body + "\n" + mi
    head = "| run | " + " | ".join(FIELDS) + " |\n|---|" + "---|" * len(FIELDS) + "\n"
    body = "".join("| " + r["source"] + " | " + " | ".join(_cell(r, k) for k in FIELDS) + " |\n" for r in rows)
    return head + body


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("runs", nargs="+", type=Path, help="run folders or checkpoint files")
    parser.add_argument("--steps", type=int, default=3000, help="env steps played per agent (default 3000)")
    parser.add_argument("--seed", type=int, default=3, help="env seed (default 3)")
    parser.add_argument("--fresh", action="store_true", help="add a freshly initialised agent of the first run")
    parser.add_argument("--per-task", action="store_true", help="a row per task of a multi-task env, --steps each")
    parser.add_argument("--out", type=Path, help="markdown table path (a JSON beside it)")
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error(f"--steps must be at least 2, got {args.steps}")
    torch.set_num_threads(1)
    agents = ([(args.runs[0], True)] if args.fresh else []) + [(run, False) for run in args.runs]
    try:
        rows = []
        for run, fresh in agents:
            loaded = _model(run, fresh)
            tasks = range(loaded[1]["num_tasks"]) if args.per_task else [None]
            for task in tasks:
                rows.append(measure(run, args.steps, args.seed, fresh=fresh, task=task, loaded=loaded))
                print(f"measured {run}{' (fresh init)' if fresh else ''}{'' if task is None else f' task {task}'}",
                      file=sys.stderr)
    except (FwrlError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    show(markdown(rows), rows, args.out)
    return 0


def show(table: str, rows: list[dict[str, Any]], out: Path | None) -> None:
    """Print the table; with ``out``, write it there and the rows as JSON beside it."""
    print(table)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(table)
        out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
