"""Why the LSTM agent stays at random on Pong: its gates saturate within a few hundred updates.

Collects rollouts of the random policy on Pong (32 envs, T 20, fixed seeds),
then trains a fresh LSTM agent (nature stem, orthogonal init) on random
batches of them with fwrl's IMPALA loss, the clip at 40 and one optimiser
setting per run, and probes it on a held-out window every ``--probe-every``
updates:

- ``saturation``: share of the LSTM's gate pre-activations (input part plus
  biases) beyond +-5, where sigmoid and tanh are flat;
- ``stem_mean``: mean of the stem's output (its constant part), and
  ``stem_std``: its std across the held-out states (what the frame moves);
- ``value_mean``: the value, which has to go from about 0 to the discounted
  return of losing (about -2).

A setting is ``OPT:LR:EPS:B`` or ``OPT:LR:EPS:B:W``, W the updates of a linear
learning-rate warm-up from 0 (none without it), with ``:ln`` at the end for the
LSTM's ``input_norm`` (a LayerNorm on its input). ``torch`` is ``torch.optim.RMSprop``, eps added
outside the square root (fwrl and torchbeast); ``tf`` is the update of
TensorFlow 1's RMSProp, which the IMPALA paper's code used: eps inside the
square root, ``p -= lr * g / sqrt(ms + eps)`` (TF starts ``ms`` at 1; here at 0
like torch, so only the placement of eps differs).

    python benchmarks/learning/pong_gate_saturation.py --out benchmarks/results/learning/pong-cpu/gate_saturation.md
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

import numpy as np
import torch

from fwrl.agents.losses import impala_loss
from fwrl.agents.model import AgentNet
from fwrl.agents.optim import clip_grad_norm
from fwrl.envs.registry import make_env

SATURATED = 5.0
DEFAULT_SETTINGS = ("torch:1e-3:0.01:8", "torch:6e-4:0.01:8", "torch:6e-4:0.01:32", "torch:3e-4:0.01:8",
                    "torch:1e-3:0.1:8", "tf:1e-3:0.01:8")


class TFRMSprop(torch.optim.Optimizer):
    """TensorFlow 1's RMSProp without momentum: ms = alpha ms + (1 - alpha) g^2; p -= lr g / sqrt(ms + eps)."""

    def __init__(self, params, lr: float, alpha: float = 0.99, eps: float = 0.01):
        super().__init__(params, {"lr": lr, "alpha": alpha, "eps": eps})

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["ms"] = torch.zeros_like(p)
                state["ms"].mul_(group["alpha"]).addcmul_(p.grad, p.grad, value=1 - group["alpha"])
                p.addcdiv_(p.grad, (state["ms"] + group["eps"]).sqrt(), value=-group["lr"])


def collect(windows: int, unroll: int, envs: int, seed: int) -> dict[str, np.ndarray]:
    """``windows`` consecutive [T+1, envs] windows of the uniform random policy (row 0 repeats the last row
    of the window before, as fwrl's rollouts do)."""
    rng = np.random.default_rng(seed)
    made = [make_env("atari:Pong", seed=seed + i, worker_index=i) for i in range(envs)]
    obs = [np.asarray(e.reset(seed=seed + i)[0]) for i, e in enumerate(made)]
    reward, done = [0.0] * envs, [False] * envs
    data = {"obs": np.zeros((windows, unroll + 1, envs, *obs[0].shape), np.uint8),
            "reward": np.zeros((windows, unroll + 1, envs), np.float32),
            "done": np.zeros((windows, unroll + 1, envs), bool),
            "action": np.zeros((windows, unroll + 1, envs), np.int64)}
    for w in range(windows):
        for t in range(unroll + 1):
            if t == 0 and w > 0:
                for key in data:
                    data[key][w, 0] = data[key][w - 1, unroll]
                continue
            for i, env in enumerate(made):
                action = int(rng.integers(env.action_space.n))
                data["obs"][w, t, i], data["reward"][w, t, i], data["done"][w, t, i] = obs[i], reward[i], done[i]
                data["action"][w, t, i] = action
                o, r, terminated, truncated, _ = env.step(action)
                reward[i], done[i] = float(r), bool(terminated or truncated)
                obs[i] = np.asarray(env.reset()[0] if done[i] else o)
    for env in made:
        env.close()
    return data


def batch(data: dict[str, np.ndarray], window: int, columns: list[int]) -> dict[str, torch.Tensor]:
    out = {k: torch.as_tensor(v[window][:, columns]) for k, v in data.items()}
    out["policy_logits"] = torch.zeros(*out["reward"].shape, 6)  # the uniform behaviour policy
    return out


def probe(model: AgentNet, held_out: dict[str, torch.Tensor]) -> dict[str, float]:
    gates: list[torch.Tensor] = []
    lstm = model.core.lstm
    hook = lstm.register_forward_pre_hook(
        lambda m, args: gates.append(args[0] @ m.weight_ih_l0.T + m.bias_ih_l0 + m.bias_hh_l0))
    with torch.no_grad():
        out, _ = model(held_out, model.initial_state(held_out["obs"].shape[1]))
        obs = held_out["obs"]
        feats = model.stem(obs.reshape(-1, *obs.shape[2:]).float() / 255.0)
    hook.remove()
    pre = torch.cat([g.reshape(-1, g.shape[-1]) for g in gates])
    return {"saturation": float((pre.abs() > SATURATED).float().mean()), "stem_mean": float(feats.mean()),
            "stem_std": float(feats.std(0).mean()), "value_mean": float(out["baseline"].mean())}


def train(data: dict[str, np.ndarray], setting: str, updates: int, probe_every: int, seed: int) -> list[dict]:
    opt, lr, eps, batch_size, *rest = setting.split(":")
    norm = "ln" in rest
    warmup = [w for w in rest if w != "ln"]
    lr, eps, batch_size, warmup = float(lr), float(eps), int(batch_size), int(warmup[0]) if warmup else 0
    torch.manual_seed(seed)
    model = AgentNet(data["obs"].shape[3:], 6, core="lstm", core_options={"input_norm": norm}, stem="nature",
                     init="orthogonal")
    if opt == "torch":
        optimiser = torch.optim.RMSprop(model.parameters(), lr=lr, alpha=0.99, eps=eps)
    elif opt == "tf":
        optimiser = TFRMSprop(model.parameters(), lr=lr, eps=eps)
    else:
        raise SystemExit(f"unknown optimiser {opt!r} in setting {setting!r}; choose torch or tf")
    windows, envs = data["reward"].shape[0], data["reward"].shape[2]
    if batch_size > envs:
        raise SystemExit(f"batch {batch_size} in {setting!r} is more than the {envs} envs collected")
    held_out = batch(data, windows - 1, list(range(envs)))
    rng = np.random.default_rng(seed)
    rows, start = [], time.time()
    for update in range(updates + 1):
        if update % probe_every == 0:
            rows.append({"setting": setting, "update": update, **probe(model, held_out)})
            print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in rows[-1].items()),
                  f"({time.time() - start:.0f} s)", file=sys.stderr, flush=True)
        if update == updates:
            break
        columns = rng.choice(envs, batch_size, replace=False).tolist()
        b = batch(data, int(rng.integers(windows - 1)), columns)
        outputs, _ = model(b, model.initial_state(batch_size))
        loss, _ = impala_loss(outputs, b)
        for group in optimiser.param_groups:
            group["lr"] = lr * min(1.0, (update + 1) / warmup) if warmup else lr
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        clip_grad_norm(model.parameters(), 40.0)
        optimiser.step()
    return rows


def render(rows: list[dict]) -> str:
    """The markdown table of the probes ``rows`` (every setting's last probe, its peak, its first above 25%)."""
    settings = list(dict.fromkeys(r["setting"] for r in rows))
    final = {r["setting"]: r for r in rows}
    first_saturated = {s: next((r["update"] for r in rows if r["setting"] == s and r["saturation"] > 0.25), None)
                       for s in settings}
    peak = {s: max(r["saturation"] for r in rows if r["setting"] == s) for s in settings}
    table = ("| optimiser:lr:eps:B[:W] | saturation at the end | peak | first probe above 25% | stem mean | stem std "
             "| value |\n|---|---|---|---|---|---|---|\n")
    for s, r in final.items():
        table += (f"| {s} | {r['saturation']:.1%} | {peak[s]:.1%} "
                  f"| {first_saturated[s] if first_saturated[s] is not None else '-'} "
                  f"| {r['stem_mean']:.3g} | {r['stem_std']:.3g} | {r['value_mean']:.3g} |\n")
    return table + (f"\nAfter {final[settings[0]]['update']} updates; fresh agent: stem mean {rows[0]['stem_mean']:.3g}, "
                    f"stem std {rows[0]['stem_std']:.3g}, saturation {rows[0]['saturation']:.1%}.\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--settings", nargs="+", default=list(DEFAULT_SETTINGS), help="OPT:LR:EPS:B[:W][:ln] each")
    parser.add_argument("--updates", type=int, default=300)
    parser.add_argument("--probe-every", type=int, default=50)
    parser.add_argument("--windows", type=int, default=60, help="windows of T 20 x --envs collected")
    parser.add_argument("--envs", type=int, default=32, help="envs collected side by side (at least the largest B)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, help="markdown table (a CSV of every probe beside it)")
    parser.add_argument("--table-from", type=Path, help="only re-render the table of a CSV this script wrote")
    args = parser.parse_args(argv)
    if args.table_from:
        with open(args.table_from, newline="") as f:
            rows = [{k: (v if k == "setting" else int(v) if k == "update" else float(v)) for k, v in r.items()}
                    for r in csv.DictReader(f)]
        print(render(rows))
        return 0
    torch.set_num_threads(1)
    data = collect(args.windows, 20, args.envs, args.seed)
    print(f"collected {data['reward'].size:,} random-policy steps: {(data['reward'] < 0).sum()} points lost, "
          f"{(data['reward'] > 0).sum()} won", file=sys.stderr)
    rows = [row for setting in args.settings for row in train(data, setting, args.updates, args.probe_every,
                                                              args.seed)]
    table = render(rows)
    print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(table)
        with open(args.out.with_suffix(".csv"), "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
