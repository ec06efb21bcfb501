"""Delta Net vs Linear Transformer on associative recall with more pairs than key dimensions.

Paper 001 (Schlag et al. 2021), Sec. 4.1-4.2 and 6.1: a sum-rule fast weight
memory (Linear Transformer, Eq. 17) with keys in a d_dot-dimensional space
cannot hold more than d_dot associations without interference, and it cannot
re-bind a key (the old and new values add up). The delta rule (Eq. 20-25)
replaces the value stored under a key. In RL form (``memory:assoc_recall``)
the agent sees n key/value pairs, then a query key, and must answer with the
value last paired with it; success = fraction of right answers (chance
1/num_values).

Each (task, core, seed) trains a one-layer agent with the quickstart settings
(lr 2e-3, unroll 40, batch 8; small head_dim, one head) through ``fwrl.train``
and then evaluates the final weights greedily on ``--eval-episodes`` fresh
episodes (all episodes of a task have length n + 1, so they run as one batch).

    python benchmarks/assoc_recall.py results/assoc_recall.png [--table results/assoc_recall.md]

writes a PNG (success per task, both cores, every seed) and a Markdown table.

Budget: RL learns this task slowly. On a 2-core CPU one run does ~12k agent
steps/s. On n=8 > d_key=4 (8:4:4:r) a one-layer Delta Net (seed 3, sampled
actions) was at 0.43 training success after 0.3M steps, 0.53-0.57 around
0.6-0.9M, 0.74 at 1.4M and 0.79-0.84 at 1.7-1.9M, while the Linear
Transformer stayed at 0.36-0.50 throughout 2M; its one-layer state is a sum,
blind to the order of the pairs, which caps it at 0.630 on this task (see
``tests/test_assoc_recall_capacity.py``, the slow test built on this script).
Delta Net's runs are bimodal: greedy success after 1M steps (the default, ~85
s per run) ranged 0.49-0.79 over five runs, after 2M 0.50 / 0.54 / 0.81 on
seeds 1 / 2 / 3, against 0.43-0.52 for the Linear Transformer. 150k-step runs
(~15 s each) only check that the script works.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from rich.console import Console

from fwrl.agents.checkpoint import load_checkpoint, load_model_weights
from fwrl.agents.model import AgentNet
from fwrl.envs.memory_tasks import AssocRecallEnv
from fwrl.envs.registry import describe_env
from fwrl.errors import FwrlError, run_main
from fwrl.launch.config import TrainConfig, build_config
from fwrl.launch.progress import Progress
from fwrl.launch.train import build_model, train

CORES = ("linear_transformer", "delta_net")


@dataclass(frozen=True)
class Task:
    n: int
    num_keys: int
    num_values: int
    replacement: bool

    @property
    def env(self) -> str:
        return (f"memory:assoc_recall?n={self.n}&num_keys={self.num_keys}&num_values={self.num_values}"
                f"&replacement={str(self.replacement).lower()}")

    @property
    def label(self) -> str:
        return f"n={self.n} S={self.num_keys} V={self.num_values}{' repl' if self.replacement else ''}"


@dataclass
class Result:
    task: Task
    core: str
    seed: int
    train_success: float  # mean over the last 100 training episodes (sampled actions)
    greedy_success: float  # greedy evaluation of the final weights
    seconds: float


def parse_task(text: str) -> Task:
    """``n:num_keys:num_values[:r]``, e.g. ``8:4:4:r`` (r = with replacement)."""
    parts = text.split(":")
    try:
        if len(parts) not in (3, 4) or (len(parts) == 4 and parts[3] != "r"):
            raise ValueError(text)
        return Task(int(parts[0]), int(parts[1]), int(parts[2]), len(parts) == 4)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"task {text!r} must be n:num_keys:num_values or n:num_keys:num_values:r (with replacement)"
        ) from None


@torch.no_grad()
def greedy_success(model: AgentNet, task: Task, episodes: int, seed: int) -> float:
    """Fraction of ``episodes`` fresh episodes answered right by the greedy policy, as one batch."""
    envs = [AssocRecallEnv(task.n, task.num_keys, task.num_values, task.replacement, seed=seed + i)
            for i in range(episodes)]
    obs = np.stack([env.reset()[0] for env in envs])
    state = model.initial_state(episodes)
    reward = torch.zeros(1, episodes)
    done = torch.ones(1, episodes, dtype=torch.bool)
    for _ in range(task.n + 1):
        out, state = model({"obs": torch.from_numpy(obs)[None], "reward": reward, "done": done}, state, greedy=True)
        actions = out["action"][0].tolist()
        steps = [env.step(a) for env, a in zip(envs, actions)]
        obs = np.stack([s[0] for s in steps])
        reward = torch.tensor([[s[1] for s in steps]], dtype=torch.float32)
        done = torch.zeros(1, episodes, dtype=torch.bool)
    if not all(s[2] for s in steps):
        raise RuntimeError("assoc_recall episodes did not end after n + 1 steps")
    return float(np.mean([s[4]["success"] for s in steps]))


def run_one(task: Task, core: str, seed: int, args: argparse.Namespace, workdir: Path) -> Result:
    options = {"num_layers": 1, "hidden_size": args.hidden_size, "num_heads": 1, "head_dim": args.head_dim,
               "ff_dim": 2 * args.hidden_size}
    config = build_config("quickstart", {
        "env": task.env, "core": core, "core_options": options, "total_steps": args.steps, "seed": seed,
        "log_interval": 1e9, "checkpoint_interval": 1e9,
    })
    run_dir = workdir / f"{core}-{task.n}-{task.num_keys}-{task.num_values}-{int(task.replacement)}-{seed}"
    start = time.monotonic()
    quiet = Progress(config, run_dir, console=Console(file=io.StringIO()))
    result = train(config, run_dir, progress=quiet)
    seconds = time.monotonic() - start
    payload = load_checkpoint(run_dir / "checkpoint.pt")
    saved = TrainConfig.from_dict(payload["config"])
    model = build_model(saved, describe_env(saved.env)).eval()
    load_model_weights(model, payload["model"], str(run_dir / "checkpoint.pt"))
    greedy = greedy_success(model, task, args.eval_episodes, seed=10_000 * seed + 1)
    return Result(task, core, seed, result.mean_success, greedy, seconds)


def markdown(results: list[Result], args: argparse.Namespace) -> str:
    lines = [
        f"Associative recall, one layer, one head, head_dim (d_key = d_dot) = {args.head_dim}, "
        f"hidden {args.hidden_size}, {args.steps:,} agent steps per run, quickstart settings; "
        f"greedy success on {args.eval_episodes} fresh episodes (training success: last 100 episodes).",
        "",
        "| task | chance | core | greedy success per seed | mean | training success per seed | s per run |",
        "|---|---|---|---|---|---|---|",
    ]
    for task in dict.fromkeys(r.task for r in results):
        for core in CORES:
            rows = [r for r in results if r.task == task and r.core == core]
            if not rows:
                continue
            lines.append(
                f"| {task.label} | {1 / task.num_values:.2f} | {core} | "
                f"{' '.join(f'{r.greedy_success:.3f}' for r in rows)} | "
                f"{statistics.mean(r.greedy_success for r in rows):.3f} | "
                f"{' '.join(f'{r.train_success:.2f}' for r in rows)} | "
                f"{statistics.mean(r.seconds for r in rows):.0f} |"
            )
    return "\n".join(lines) + "\n"


def plot(results: list[Result], path: Path, args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(dict.fromkeys(r.task for r in results))
    fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(tasks), 3.6))
    width = 0.38
    for c, (core, color) in enumerate(zip(CORES, ("tab:orange", "tab:blue"))):
        for t, task in enumerate(tasks):
            values = [r.greedy_success for r in results if r.task == task and r.core == core]
            if not values:
                continue
            x = t + (c - 0.5) * width
            ax.bar(x, statistics.mean(values), width * 0.9, color=color, alpha=0.6,
                   label=core if t == 0 else None)
            ax.scatter([x] * len(values), values, color=color, edgecolor="black", zorder=3, s=18)
    for t, task in enumerate(tasks):
        ax.hlines(1 / task.num_values, t - 0.45, t + 0.45, colors="gray", linestyles="dashed",
                  label="chance" if t == 0 else None)
    ax.set_xticks(range(len(tasks)), [task.label for task in tasks], fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("greedy success")
    ax.set_title(f"memory:assoc_recall, head_dim {args.head_dim}, {args.steps // 1000}k steps", fontsize=10)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("png", type=Path, help="where to write the plot (PNG)")
    p.add_argument("--table", type=Path, default=None, help="Markdown table (default: the PNG path with .md)")
    p.add_argument("--tasks", type=parse_task, nargs="+",
                   default=[parse_task("4:4:4"), parse_task("8:4:4:r")],
                   help="n:num_keys:num_values[:r] (r = keys and values drawn with replacement)")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    p.add_argument("--steps", type=int, default=1_000_000, help="agent steps per run")
    p.add_argument("--head-dim", type=int, default=4)
    p.add_argument("--hidden-size", type=int, default=32)
    p.add_argument("--eval-episodes", type=int, default=1000)
    args = p.parse_args(argv)
    if args.steps < 1 or args.head_dim < 1 or args.hidden_size < 1 or args.eval_episodes < 1:
        raise FwrlError("--steps, --head-dim, --hidden-size and --eval-episodes must be positive.")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for task in args.tasks:
            for seed in args.seeds:
                for core in CORES:
                    r = run_one(task, core, seed, args, Path(tmp))
                    print(f"{task.label:22s} {core:18s} seed {seed}: greedy {r.greedy_success:.3f} "
                          f"train {r.train_success:.2f} ({r.seconds:.0f} s)", flush=True)
                    results.append(r)
    table = markdown(results, args)
    table_path = args.table or args.png.with_suffix(".md")
    table_path.parent.mkdir(parents=True, exist_ok=True)
    table_path.write_text(table)
    plot(results, args.png, args)
    print(table)
    print(f"wrote {args.png} and {table_path}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
