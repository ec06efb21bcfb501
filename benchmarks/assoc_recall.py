"""Delta Net vs Linear Transformer on associative recall with more pairs than key dimensions.

Paper 001 (Schlag et al. 2021), Sec. 4.1-4.2 and 6.1: a sum-rule fast weight
memory (Linear Transformer, Eq. 17) with keys in a d_dot-dimensional space
cannot hold more than d_dot associations without interference, and it cannot
re-bind a key (the old and new values add up). The delta rule (Eq. 20-25)
replaces the value stored under a key. ``memory:assoc_recall`` shows the agent
n key/value pairs, then a query key; the answer is the value last paired with
it; success = fraction of right answers (chance 1/num_values).

Two ways to train each (task, core, seed), both on a one-layer, one-head
agent (``AgentNet``: MLP stem, core, policy head; small head_dim) built from
the quickstart preset, and both evaluated the same way, greedily on
``--eval-episodes`` fresh episodes (all of length n + 1, run as one batch):

- ``supervised`` (paper 001 Sec. 6.1's protocol): mini-batches of 32 fresh
  episodes of the real env, cross-entropy between the policy logits at the
  query step and the right answer, Adam with default hyper-parameters, for
  ``--updates`` updates. This isolates what the memory can store from the
  variance of RL. ~2000 updates take ~10 s per run on a 2-core CPU.
- ``rl``: ``fwrl.train`` (IMPALA / V-trace, quickstart settings: lr 2e-3,
  unroll 40, batch 8) for ``--steps`` agent steps, reward 1 for a right answer.

    python benchmarks/assoc_recall.py results/assoc_recall.png [--table results/assoc_recall.md]

writes a PNG (success per task and mode, both cores, every seed) and a
Markdown table.

Measured (2-core CPU, ``--seeds 1 2 3``, in ``results/assoc_recall.md``).
Supervised, 2000 updates: on 8:4:4:r (n = 8 > d_key = 4, keys re-bound)
Delta Net reaches 1.000 on every seed, the Linear Transformer 0.632 / 0.576 /
0.617, held at the 0.630 any memory blind to the order of the pairs is capped
at (``order_blind_ceiling``; a one-layer sum-rule state is such a memory,
``tests/learning/test_assoc_recall_capacity.py``); on 4:4:4 (n = d_key) both reach
1.000. RL learns the same task slowly (~12k agent steps/s per run) and
unevenly: after 1M steps Delta Net 0.50 / 0.57 / 0.50 against the Linear
Transformer's 0.44 / 0.46 / 0.44 on 8:4:4:r, and both bimodal on 4:4:4 (0.25
to 0.85). Longer single runs on 8:4:4:r: Delta Net (seed 3) at 0.43 training
success after 0.3M steps, 0.74 at 1.4M, 0.79-0.84 at 1.7-1.9M; greedy after
2M 0.50 / 0.54 / 0.81 on seeds 1 / 2 / 3, while the Linear Transformer stayed
at 0.36-0.52 throughout.
"""

from __future__ import annotations

import argparse
import io
import math
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from rich.console import Console

from fwrl.agents.checkpoint import load_checkpoint, load_model_weights
from fwrl.agents.model import AgentNet
from fwrl.envs.memory_tasks import AssocRecallEnv
from fwrl.envs.registry import describe_env
from fwrl.errors import FwrlError, run_main
from fwrl.settings.config import TrainConfig, build_config
from fwrl.runner.agent import build_model
from fwrl.runner.train import train
from fwrl.runner.train_progress import Progress

CORES = ("linear_transformer", "delta_net")
MODES = ("supervised", "rl")
SUPERVISED_BATCH = 32  # paper 001, Sec. 6.1.1


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
    def ceiling(self) -> float:
        """The best success a memory blind to the order of the pairs can reach (1 without replacement)."""
        return order_blind_ceiling(self.n, self.num_keys, self.num_values) if self.replacement else 1.0

    @property
    def label(self) -> str:
        return f"n={self.n} S={self.num_keys} V={self.num_values}{' repl' if self.replacement else ''}"


def _no_value_drawn_more_than(c: int, draws: int, num_values: int) -> float:
    """P(every value appears at most c times among ``draws`` uniform draws over ``num_values`` values).
    Values are dealt one at a time: with ``left`` values to go, the next one's count among the r draws
    not yet assigned is Binomial(r, 1/left)."""
    remaining = {draws: 1.0}  # draws not yet assigned -> probability
    for left in range(num_values, 0, -1):
        p = 1 / left
        nxt: dict[int, float] = {}
        for r, weight in remaining.items():
            for j in range(min(r, c) + 1):
                nxt[r - j] = nxt.get(r - j, 0.0) + weight * math.comb(r, j) * p ** j * (1 - p) ** (r - j)
        remaining = nxt
    return remaining.get(0, 0.0)


def order_blind_ceiling(n: int, num_keys: int, num_values: int, tol: float = 1e-12) -> float:
    """Best success of a policy that sees the pairs only as a multiset (keys and values drawn with
    replacement, query = the key of a uniformly drawn pair): answer the most frequent value among the
    query key's m bindings, right with probability E[max count] / m. Terms below ``tol`` are dropped."""
    total = 0.0
    for m in range(1, n + 1):  # the query key's bindings: its own pair + Binomial(n-1, 1/num_keys) others
        p_m = math.comb(n - 1, m - 1) * (1 / num_keys) ** (m - 1) * (1 - 1 / num_keys) ** (n - m)
        if p_m < tol:
            continue
        expected_max = 0.0  # E[max] = sum_c P(max > c)
        for c in range(m):
            above = 1.0 - _no_value_drawn_more_than(c, m, num_values)
            if above < tol:
                break
            expected_max += above
        total += p_m * expected_max / m
    return total


@dataclass
class Result:
    task: Task
    mode: str
    core: str
    seed: int
    train_success: float  # rl: last 100 training episodes (sampled actions); supervised: last 100 batches
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


def agent_config(task: Task, core: str, seed: int, args: argparse.Namespace) -> TrainConfig:
    """The quickstart preset on ``task`` with a one-layer, one-head core of key dimension ``args.head_dim``."""
    options = {"num_layers": 1, "hidden_size": args.hidden_size, "num_heads": 1, "head_dim": args.head_dim,
               "ff_dim": 2 * args.hidden_size}
    return build_config("quickstart", {
        "env": task.env, "core": core, "core_options": options, "total_steps": args.steps, "seed": seed,
        "log_interval": 1e9, "checkpoint_interval": 1e9,
    })


def episode_batch(task: Task, envs: list[AssocRecallEnv]) -> tuple[torch.Tensor, torch.Tensor]:
    """One fresh episode per env: its observations [n + 1, B, D] up to the query, and the right answers [B]."""
    obs = [[env.reset()[0] for env in envs]]
    for _ in range(task.n):  # the action does not matter before the query
        obs.append([env.step(0)[0] for env in envs])
    answers = torch.tensor([env.answer for env in envs])
    return torch.from_numpy(np.array(obs)), answers


def train_supervised(task: Task, core: str, seed: int, args: argparse.Namespace) -> tuple[AgentNet, float]:
    """Paper 001 Sec. 6.1's protocol on the agent: ``args.updates`` Adam steps (default hyper-parameters) on
    batches of fresh episodes, cross-entropy of the query step's policy logits against the right answer.
    Returns the model and its training accuracy over the last 100 batches."""
    config = agent_config(task, core, seed, args)
    torch.manual_seed(seed)
    model = build_model(config, describe_env(config.env))
    optimizer = torch.optim.Adam(model.parameters())
    envs = [AssocRecallEnv(task.n, task.num_keys, task.num_values, task.replacement, seed=seed * 1_000_003 + i)
            for i in range(SUPERVISED_BATCH)]
    reward = torch.zeros(task.n + 1, SUPERVISED_BATCH)
    done = torch.zeros(task.n + 1, SUPERVISED_BATCH, dtype=torch.bool)
    done[0] = True
    accuracy = []
    for _ in range(args.updates):
        obs, answers = episode_batch(task, envs)
        out, _ = model({"obs": obs, "reward": reward, "done": done}, model.initial_state(SUPERVISED_BATCH))
        logits = out["policy_logits"][-1]
        loss = F.cross_entropy(logits, answers)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        accuracy.append((logits.argmax(-1) == answers).float().mean().item())
    return model.eval(), float(np.mean(accuracy[-100:]))


def train_rl(task: Task, core: str, seed: int, args: argparse.Namespace, workdir: Path) -> tuple[AgentNet, float]:
    """``fwrl.train`` for ``args.steps`` agent steps; the final weights and the last 100 episodes' success."""
    config = agent_config(task, core, seed, args)
    run_dir = workdir / f"{core}-{task.n}-{task.num_keys}-{task.num_values}-{int(task.replacement)}-{seed}"
    quiet = Progress(config, run_dir, console=Console(file=io.StringIO()))
    result = train(config, run_dir, progress=quiet)
    payload = load_checkpoint(run_dir / "checkpoint.pt")
    saved = TrainConfig.from_dict(payload["config"])
    model = build_model(saved, describe_env(saved.env)).eval()
    load_model_weights(model, payload["model"], str(run_dir / "checkpoint.pt"))
    return model, result.mean_success


def run_one(task: Task, mode: str, core: str, seed: int, args: argparse.Namespace, workdir: Path) -> Result:
    """Train one agent in ``mode`` (supervised or rl) and evaluate it greedily on fresh episodes."""
    start = time.monotonic()
    if mode == "supervised":
        model, train_success = train_supervised(task, core, seed, args)
    else:
        model, train_success = train_rl(task, core, seed, args, workdir)
    seconds = time.monotonic() - start
    greedy = greedy_success(model, task, args.eval_episodes, seed=10_000 * seed + 1)
    return Result(task, mode, core, seed, train_success, greedy, seconds)


def describe_mode(mode: str, args: argparse.Namespace) -> str:
    if mode == "supervised":
        return f"supervised, {args.updates:,} updates of {SUPERVISED_BATCH} episodes"
    return f"rl, {args.steps:,} agent steps"


def markdown(results: list[Result], args: argparse.Namespace) -> str:
    lines = [
        f"Associative recall, one layer, one head, head_dim (d_key = d_dot) = {args.head_dim}, "
        f"hidden {args.hidden_size}, quickstart agent; supervised: {args.updates:,} Adam updates of "
        f"{SUPERVISED_BATCH} fresh episodes (cross-entropy at the query step); rl: {args.steps:,} agent steps "
        f"of fwrl.train; greedy success on {args.eval_episodes} fresh episodes (training success: last 100 "
        "batches / episodes).",
        "",
        "| task | chance | order-blind ceiling | mode | core | greedy success per seed | mean | training success per seed | s per run |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for task in dict.fromkeys(r.task for r in results):
        for mode in MODES:
            for core in CORES:
                rows = [r for r in results if r.task == task and r.mode == mode and r.core == core]
                if not rows:
                    continue
                lines.append(
                    f"| {task.label} | {1 / task.num_values:.2f} | {task.ceiling:.3f} | {mode} | {core} | "
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
    modes = [m for m in MODES if any(r.mode == m for r in results)]
    fig, axes = plt.subplots(1, len(modes), figsize=((1.8 + 1.6 * len(tasks)) * len(modes), 3.6), squeeze=False)
    width = 0.38
    for ax, mode in zip(axes[0], modes):
        for c, (core, color) in enumerate(zip(CORES, ("tab:orange", "tab:blue"))):
            for t, task in enumerate(tasks):
                values = [r.greedy_success for r in results if r.task == task and r.mode == mode and r.core == core]
                if not values:
                    continue
                x = t + (c - 0.5) * width
                ax.bar(x, statistics.mean(values), width * 0.9, color=color, alpha=0.6,
                       label=core if t == 0 else None)
                ax.scatter([x] * len(values), values, color=color, edgecolor="black", zorder=3, s=18)
        for t, task in enumerate(tasks):
            ax.hlines(1 / task.num_values, t - 0.45, t + 0.45, colors="gray", linestyles="dashed",
                      label="chance" if t == 0 else None)
            if task.ceiling < 1:
                ax.hlines(task.ceiling, t - 0.45, t + 0.45, colors="black", linestyles="dotted",
                          label="order-blind ceiling" if t == len(tasks) - 1 else None)
        ax.set_xticks(range(len(tasks)), [task.label for task in tasks], fontsize=8)
        ax.set_ylim(0, 1.3)
        ax.set_yticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
        ax.set_ylabel("greedy success")
        ax.set_title(f"head_dim {args.head_dim}: {describe_mode(mode, args)}", fontsize=9)
        ax.legend(fontsize=7, loc="upper center", ncol=2)
    fig.suptitle("memory:assoc_recall", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("png", type=Path, help="where to write the plot (PNG)")
    p.add_argument("--table", type=Path, default=None, help="Markdown table (default: the PNG path with .md)")
    p.add_argument("--tasks", type=parse_task, nargs="+",
                   default=[parse_task("4:4:4"), parse_task("8:4:4:r")],
                   help="n:num_keys:num_values[:r] (r = keys and values drawn with replacement)")
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES),
                   help="supervised (paper 001 Sec. 6.1, ~10 s per run) and/or rl (fwrl.train, ~85 s per 1M steps)")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    p.add_argument("--updates", type=int, default=2000, help="supervised: Adam updates per run")
    p.add_argument("--steps", type=int, default=1_000_000, help="rl: agent steps per run")
    p.add_argument("--head-dim", type=int, default=4)
    p.add_argument("--hidden-size", type=int, default=32)
    p.add_argument("--eval-episodes", type=int, default=1000)
    args = p.parse_args(argv)
    for name in ("updates", "steps", "head_dim", "hidden_size", "eval_episodes"):
        if getattr(args, name) < 1:
            raise FwrlError(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}.")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for task in args.tasks:
            for mode in args.modes:
                for seed in args.seeds:
                    for core in CORES:
                        r = run_one(task, mode, core, seed, args, Path(tmp))
                        print(f"{task.label:18s} {mode:10s} {core:18s} seed {seed}: greedy {r.greedy_success:.3f} "
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
