"""Which loss term moves a checkpoint's weights: the gradient of each IMPALA term, and the clip.

Plays ``--batch`` rollout columns of ``--unroll`` steps with the checkpoint's sampled policy (one
env per column, column b on task b mod n of a multi-task env, each after ``--warmup`` steps from
an episode's start, so columns sit inside episodes; the core's state carried in), runs the
learner's forward over them as ``fwrl train`` does (:func:`fwrl.agents.losses.impala_loss`, the
run's discount, costs and reward clip) and reports, for the policy-gradient, baseline and entropy
terms and their sum, the norm of its gradient over all weights; then the cosines between the
terms' gradients and ``clip_scale`` = min(1, grad_norm_clip / ||total||): the factor the
optimiser's clip multiplies every term's gradient by, so ``pg_step`` = clip_scale x ||pg|| is
how far the policy term moves the weights before the learning rate (issue 73: the ProcGen runs'
policy stayed near uniform while their gradient norm sat at 4-10x the clip of 40).

    python benchmarks/learning/loss_gradients.py RUN_OR_CHECKPOINT [...] --fresh --out gradients.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fwrl.agents.checkpoint import load_checkpoint
from fwrl.agents.losses import baseline_loss, entropy_loss, policy_gradient_loss, vtrace_returns
from fwrl.envs.registry import make_env
from fwrl.envs.step_record import DONE, OBS, REWARD
from fwrl.errors import FwrlError
from fwrl.settings.config import TrainConfig, saved_settings

sys.path.insert(0, str(Path(__file__).parent))
from state_dependence import _model, show  # noqa: E402  (a checkpoint's model, or a fresh one of its settings)


FIELDS = ("agent_steps", "pg", "baseline", "entropy", "total", "cos_pg_baseline", "clip_scale", "pg_step",
          "mean_entropy")


def _config(source: Path) -> TrainConfig:
    path = source / "checkpoint.pt" if source.is_dir() else source
    return TrainConfig.from_dict(saved_settings(load_checkpoint(path)["config"]), source=str(path))


def collect(model: torch.nn.Module, env_spec: str, num_tasks: int, batch: int, unroll: int, warmup: int,
            seed: int) -> tuple[dict[str, torch.Tensor], Any]:
    """``batch`` columns of ``unroll`` + 1 steps, as the learner's batch ``[T+1, B]``, and the core
    state at each column's start (stacked as the learner takes it)."""
    rng = np.random.default_rng(seed)
    columns, states = [], []
    with torch.no_grad():
        for b in range(batch):
            env = make_env(env_spec, worker_index=b % num_tasks, seed=seed + b)
            obs, _ = env.reset(seed=seed + b)
            state, reward, done = model.initial_state(1), 0.0, True
            steps: list[dict[str, Any]] = []
            skip = int(rng.integers(0, warmup + 1))
            for t in range(skip + unroll + 1):
                if t == skip:
                    states.append(state)
                inputs = {OBS: torch.as_tensor(np.asarray(obs))[None, None], REWARD: torch.tensor([[reward]]),
                          DONE: torch.tensor([[done]])}
                out, state = model(inputs, state)
                if t >= skip:
                    steps.append({OBS: inputs[OBS][0, 0], REWARD: float(reward), DONE: done,
                                  "action": int(out["action"][0, 0]), "policy_logits": out["policy_logits"][0, 0]})
                obs, reward, terminated, truncated, _ = env.step(int(out["action"][0, 0]))
                done = bool(terminated or truncated)
                if done:
                    obs, _ = env.reset()
            env.close()
            columns.append(steps)
    # the learner's layout: at index t+1 the action taken at obs t and its outcome (reward, done)
    tensors = {
        OBS: torch.stack([torch.stack([s[OBS] for s in col]) for col in columns], 1),
        REWARD: torch.tensor([[s[REWARD] for s in col] for col in columns]).T.float(),
        DONE: torch.tensor([[s[DONE] for s in col] for col in columns]).T,
        "action": torch.tensor([[0] + [s["action"] for s in col[:-1]] for col in columns]).T,
        "policy_logits": torch.stack([torch.stack([col[0]["policy_logits"] * 0] + [s["policy_logits"] for s in col[:-1]])
                                      for col in columns], 1),
    }
    initial = {name: torch.cat([s[name] for s in states], 0) for name in states[0]}  # a core's state: {name: [B, ...]}
    return tensors, initial


def measure(source: Path, batch: int, unroll: int, warmup: int, seed: int, fresh: bool = False) -> dict[str, Any]:
    model, meta = _model(source, fresh)
    config = _config(source)
    torch.manual_seed(seed)  # the sampled actions (the envs and the warm-up lengths take the seed too)
    tensors, initial = collect(model, meta["env"], meta["num_tasks"], batch, unroll, warmup, seed)
    model.train()
    outputs, _ = model(tensors, initial)  # one forward; each term's gradient through its graph
    loss_terms = _terms(outputs, tensors, config)
    params = [p for p in model.parameters() if p.requires_grad]
    grads = {}
    for term, loss in loss_terms.items():
        grads[term] = torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(
            torch.autograd.grad(loss, params, allow_unused=True, retain_graph=True), params)])
    total = sum(grads.values())
    logits = outputs["policy_logits"][:-1]
    mean_entropy = float(-entropy_loss(logits.detach())) / (logits.shape[0] * logits.shape[1])  # nats per step
    norm = {k: float(v.norm()) for k, v in grads.items()}
    scale = min(1.0, config.grad_norm_clip / float(total.norm())) if config.grad_norm_clip > 0 else 1.0
    cos = float(torch.nn.functional.cosine_similarity(grads["pg_loss"], grads["baseline_loss"], dim=0))
    return {"source": str(source) + (" (fresh init)" if fresh else ""), "agent_steps": meta["agent_steps"],
            "pg": norm["pg_loss"], "baseline": norm["baseline_loss"], "entropy": norm["entropy_loss"],
            "total": float(total.norm()), "cos_pg_baseline": cos, "clip_scale": scale,
            "pg_step": scale * norm["pg_loss"], "mean_entropy": mean_entropy,
            "grad_norm_clip": config.grad_norm_clip, "batch": batch, "unroll": unroll}


def _terms(outputs: dict[str, torch.Tensor], tensors: dict[str, torch.Tensor], config: TrainConfig) -> dict[str, Any]:
    """The three weighted terms of :func:`fwrl.agents.losses.impala_loss` as tensors (it returns their
    sum and floats), from the same parts."""
    returns = vtrace_returns(outputs, tensors, discount=config.discount, reward_clip=config.reward_clip or None)
    logits, baseline = outputs["policy_logits"][:-1], outputs["baseline"][:-1]
    return {"pg_loss": policy_gradient_loss(logits, tensors["action"][1:], returns.pg_advantages),
            "baseline_loss": config.baseline_cost * baseline_loss(returns.vs, baseline),
            "entropy_loss": config.entropy_cost * entropy_loss(logits)}


def markdown(rows: list[dict[str, Any]]) -> str:
    head = "| run | " + " | ".join(FIELDS) + " |\n|---|" + "---|" * len(FIELDS) + "\n"
    return head + "".join("| " + r["source"] + " | " + " | ".join(
        f"{r[k]:,}" if k == "agent_steps" else f"{r[k]:.4g}" for k in FIELDS) + " |\n" for r in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("runs", nargs="+", type=Path, help="run folders or checkpoint files")
    parser.add_argument("--batch", type=int, default=32, help="rollout columns (default 32, the presets' B)")
    parser.add_argument("--unroll", type=int, default=50, help="steps per column (default 50)")
    parser.add_argument("--warmup", type=int, default=300, help="at most this many steps before a column")
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--fresh", action="store_true", help="add a freshly initialised agent of the first run")
    parser.add_argument("--out", type=Path, help="markdown table path (a JSON beside it)")
    args = parser.parse_args(argv)
    for name in ("batch", "unroll"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    torch.set_num_threads(1)
    agents = ([(args.runs[0], True)] if args.fresh else []) + [(run, False) for run in args.runs]
    rows = []
    try:
        for run, fresh in agents:
            rows.append(measure(run, args.batch, args.unroll, args.warmup, args.seed, fresh))
            print(f"measured {run}{' (fresh init)' if fresh else ''}", file=sys.stderr)
    except (FwrlError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    show(markdown(rows), rows, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
