"""Why the LSTM trails the GRU on POPGym's RepeatFirst: what reaches the first step, and the gates (issue 69).

RepeatFirst (Morad et al. 2023) shows a card's suit per step and asks at every step for the suit of
the *first* card: the answer at step t depends on the observation of step 0 alone. For each agent (an
untrained one built from the ``popgym`` preset with a core spec, or a trained one from a run folder's
``checkpoint.pt``) this plays episodes of RepeatFirst with random actions (the observations the
protocol gives: card, previous action, first-step flag), runs the agent over each whole episode (51
steps) from a fresh state, and reports per step t:

- ``reach``: the norm of the gradient of log pi(first card | steps 0..t) with respect to the
  observation of step 0 (mean over episodes): how much of the first step the answer can still see,
  which is also what truncated BPTT can learn from;
- ``p(first)``: the policy's probability of the first card (what the agent does with it);
- the gate that keeps the memory: the LSTM's forget gate f_t and the GRU's update gate z_t (h_t =
  (1 - z_t) n_t + z_t h_{t-1}: z is the GRU's "keep"), their mean, and the share of pre-activations
  saturated beyond +-5;
- the rms of the core's input (the stem's features and the reward).

    python benchmarks/learning/lstm_gru_probe.py --init gru lstm lstm:forget_bias=1 \\
        --run "lstm trained=runs/rf-lstm" --episodes 32 --out probe.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

STEPS_SHOWN = (0, 1, 5, 10, 20, 30, 40, 50)
SATURATED = 5.0


def _episodes(spec: str, count: int, seed: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """obs [T, E, D], reward [T, E], done [T, E] (step 0 only) and the first card [E] of ``count``
    episodes of ``spec`` under random actions (all RepeatFirst episodes have the same length)."""
    from fwrl.envs.registry import make_env

    rng = np.random.default_rng(seed)
    episodes, rewards, cards = [], [], []
    for e in range(count):
        env = make_env(spec, seed=seed * 1000 + e)
        obs, _ = env.reset()
        cards.append(int(np.argmax(obs[:4])))  # the card's suit: the first one-hot of the baseline protocol
        seen, got, end = [obs], [0.0], False
        while not end:
            obs, reward, terminated, truncated, _ = env.step(int(rng.integers(env.action_space.n)))
            end = terminated or truncated
            if not end:
                seen.append(obs)
                got.append(float(reward))
        env.close()
        episodes.append(np.stack(seen))
        rewards.append(np.asarray(got, np.float32))
    T = min(len(x) for x in episodes)
    obs = torch.tensor(np.stack([x[:T] for x in episodes], 1), dtype=torch.float32)
    reward = torch.tensor(np.stack([r[:T] for r in rewards], 1))
    done = torch.zeros(T, count, dtype=torch.bool)
    done[0] = True
    return obs, reward, done, torch.tensor(cards)


def _model(spec: str | None, run: Path | None):
    from fwrl.envs.registry import describe_env
    from fwrl.runner.agent import build_model, load_agent, resolve_core_options
    from fwrl.settings.config import build_config

    if run is not None:
        model, payload, _ = load_agent(run)
        return model.train(), payload["config"]["env"]
    name, *options = spec.split(":")
    config = build_config("popgym", {"core": name, "core_options": dict(o.split("=", 1) for o in options)})
    info = describe_env(config.env)
    torch.manual_seed(0)
    return build_model(resolve_core_options(config, info), info).train(), config.env


def _gates(model: nn.Module, x: Tensor, done: Tensor) -> tuple[Tensor, Tensor] | None:
    """The keep gate (LSTM: forget gate; GRU: update gate z) [T, E, H] and its pre-activation, recomputed
    step by step from the core's own weights (layer 0) on its input ``x`` [T, E, D]."""
    core = model.core
    rnn = getattr(core, "lstm", None) or getattr(core, "gru", None)
    if rnn is None:
        return None
    if getattr(core, "input_norm", None) is not None:
        x = core.input_norm(x)
    H = rnn.hidden_size
    w_ih, w_hh, b_ih, b_hh = (getattr(rnn, f"{n}_l0") for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))
    h = x.new_zeros(x.shape[1], H)
    c = x.new_zeros(x.shape[1], H)
    keeps, pres = [], []
    for t in range(x.shape[0]):
        keep = (~done[t]).to(x.dtype).unsqueeze(-1)
        h, c = h * keep, c * keep
        gi, gh = x[t] @ w_ih.t() + b_ih, h @ w_hh.t() + b_hh
        if isinstance(rnn, nn.LSTM):
            i, f, g, o = (gi + gh).chunk(4, -1)
            pres.append(f)
            keeps.append(torch.sigmoid(f))
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
        else:
            (i_r, i_z, i_n), (h_r, h_z, h_n) = gi.chunk(3, -1), gh.chunk(3, -1)
            r, z = torch.sigmoid(i_r + h_r), torch.sigmoid(i_z + h_z)
            pres.append(i_z + h_z)
            keeps.append(z)
            h = (1 - z) * torch.tanh(i_n + r * h_n) + z * h
    return torch.stack(keeps), torch.stack(pres)


def probe(model: nn.Module, obs: Tensor, reward: Tensor, done: Tensor, cards: Tensor) -> dict[str, list[float]]:
    """Per step: reach, p(first), keep gate mean and saturation, core-input rms (module docstring)."""
    obs = obs.clone().requires_grad_(True)
    core_inputs = []
    hook = model.core.register_forward_pre_hook(lambda module, args: core_inputs.append(args[0]))
    try:
        out, _ = model({"obs": obs, "reward": reward, "done": done}, model.initial_state(obs.shape[1]))
    finally:
        hook.remove()
    logp = torch.log_softmax(out["policy_logits"], -1)  # [T, E, A]
    first = logp.gather(-1, cards.view(1, -1, 1).expand(logp.shape[0], -1, 1)).squeeze(-1)  # [T, E]
    rows: dict[str, list[float]] = {"reach": [], "p_first": [], "keep_mean": [], "keep_saturated": [],
                                    "input_rms": []}
    x = core_inputs[0].detach()
    gates = _gates(model, x, done)
    for t in range(obs.shape[0]):
        (grad,) = torch.autograd.grad(first[t].sum(), obs, retain_graph=True)
        rows["reach"].append(float(grad[0].norm(dim=-1).mean()))
        rows["p_first"].append(float(first[t].detach().exp().mean()))
        rows["input_rms"].append(float(x[t].pow(2).mean().sqrt()))
        if gates is not None:
            keep, pre = gates
            rows["keep_mean"].append(float(keep[t].mean()))
            rows["keep_saturated"].append(float((pre[t].abs() > SATURATED).float().mean()))
    return rows


def markdown(results: dict[str, dict[str, list[float]]], episodes: int, argv: list[str]) -> str:
    shown = [t for t in STEPS_SHOWN if t < len(next(iter(results.values()))["reach"])]
    lines = ["# What reaches the first step: the LSTM and the GRU on POPGym's RepeatFirst", "",
             f"`python benchmarks/learning/lstm_gru_probe.py {' '.join(argv)}`", "",
             f"{episodes} episodes of popgym:RepeatFirst under random actions, each agent run over every whole "
             "episode from a fresh state (module docstring of the script says what each row is).", ""]
    for key, title, fmt in (("reach", "reach: |d log pi(first card at t) / d obs_0|", ".2e"),
                            ("p_first", "p(first card) at step t", ".3f"),
                            ("keep_mean", "keep gate (LSTM f, GRU z): mean", ".3f"),
                            ("keep_saturated", f"keep gate: share of pre-activations beyond +-{SATURATED:g}", ".3f"),
                            ("input_rms", "core input rms", ".3f")):
        lines += [f"## {title}", "", "| agent | " + " | ".join(f"t={t}" for t in shown) + " |",
                  "|---|" + "---|" * len(shown)]
        for name, rows in results.items():
            values = rows[key]
            cells = [format(values[t], fmt) if t < len(values) else "" for t in shown]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--init", nargs="*", default=["gru", "lstm", "lstm:forget_bias=1"],
                        help="untrained agents of the popgym preset: core[:key=value...]")
    parser.add_argument("--run", action="append", default=[], help="LABEL=RUN_DIR: a trained agent (the last = splits)")
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    agents = [(f"{spec} (init)", spec, None) for spec in args.init]
    agents += [(label, None, Path(path)) for label, _, path in (r.rpartition("=") for r in args.run)]
    results = {}
    data = None
    for label, spec, run in agents:
        model, env = _model(spec, run)
        if data is None:
            data = _episodes(env, args.episodes, args.seed)
        results[label] = probe(model, *data)
        print(f"{label}: done", file=sys.stderr, flush=True)
    text = markdown(results, args.episodes, argv)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
