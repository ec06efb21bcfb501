"""R2AC vs truncated BPTT on a long-delay memory task (Paper 004, Sec. 4).

``python benchmarks/r2ac_cue_delay.py OUT [--delay 40] [--configs rtrl:10,bptt:10,rtrl:50,bptt:50]
[--seeds 1,2] [--steps 300000] [--hidden 64] [--forget-bias 2] [--lr 2e-3] ...``

``memory:cue_delay?delay=N`` shows a cue at step 0 and asks for it at step
N+1 (chance success 0.5). Every configuration trains the same agent (MLP
stem, one eLSTM layer, heads) with the same step budget, seeds and
hyper-parameters; only the gradient of the recurrence (``grad=rtrl``: exact
RTRL, untruncated; ``grad=bptt``: backprop inside each rollout of length T)
and T differ. As in the paper's DMLab protocol (Sec. 4.1), the vision stem
(here the MLP) is first pretrained with TBPTT (``--pretrain-*``: a short
run on ``cue_delay?delay=10`` with T = 40, where TBPTT learns quickly), then
loaded and frozen for every compared run (``load_vision_from``,
``freeze_vision``): RTRL trains only the recurrent layer and what is above
it; the stem would otherwise get the one-step input Jacobian only, and in
our runs RTRL from scratch (stem trained that way) stayed at chance even at
delay 10. ``--pretrain-steps 0`` trains every run from scratch instead.
A TBPTT learner with T + 1 < N + 2 never sees the cue and the
query in one rollout, so no gradient links them (the paper's point); RTRL
carries dc/dtheta across rollouts in the sensitivities and does.

Writes into OUT: ``runs/pretrain/`` (the stem's source run), ``runs/<mode>-u<T>-s<seed>/`` (each run's folder with its
``metrics.csv``), ``results.csv`` / ``results.json`` (final success = mean of
the last 100 episodes, steps, seconds per run) and ``success.png`` (success
vs agent steps, one line per run); prints a table.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import textwrap
import time
from pathlib import Path

from fwrl.errors import FwrlError, run_main
from fwrl.launch.plot import read_metrics, series
from fwrl.settings.config import build_config
from fwrl.runner.train import train

MODES = ("rtrl", "bptt")
COLOURS = {"rtrl": "tab:blue", "bptt": "tab:red"}


def parse_configs(text: str) -> list[tuple[str, int]]:
    """``rtrl:10,bptt:10`` -> [("rtrl", 10), ("bptt", 10)]."""
    configs = []
    for item in text.split(","):
        mode, _, unroll = item.strip().partition(":")
        if mode not in MODES or not unroll.isdigit() or int(unroll) < 1:
            raise FwrlError(f"bad configuration {item!r} in --configs; use MODE:UNROLL with MODE one of "
                            f"{', '.join(MODES)} and a positive UNROLL, e.g. rtrl:10,bptt:10.")
        configs.append((mode, int(unroll)))
    return configs


def _config(args, mode: str, delay: int, unroll: int, steps: int, seed: int, vision: str):
    return build_config("quickstart", {
        "env": f"memory:cue_delay?delay={delay}", "core": "elstm",
        "core_options": {"hidden_size": args.hidden, "grad": mode, "forget_bias": args.forget_bias},
        "unroll_length": unroll, "batch_size": args.batch, "num_workers": args.workers,
        "envs_per_worker": args.envs_per_worker, "total_steps": steps, "seed": seed,
        "learning_rate": args.lr, "entropy_cost": args.entropy_cost, "log_interval": args.log_interval,
        "checkpoint_interval": 1e9, "load_vision_from": vision, "freeze_vision": bool(vision),
    })


def pretrain_vision(out: Path, args) -> tuple[str, dict]:
    """TBPTT run whose stem the compared runs load and freeze; returns (checkpoint, summary)."""
    config = _config(args, "bptt", args.pretrain_delay, args.pretrain_unroll, args.pretrain_steps, 1, "")
    start = time.monotonic()
    result = train(config, out / "runs" / "pretrain")
    summary = {"delay": args.pretrain_delay, "unroll": args.pretrain_unroll, "success": result.mean_success,
               "agent_steps": result.agent_steps, "seconds": time.monotonic() - start}
    return str(out / "runs" / "pretrain" / "checkpoint.pt"), summary


def run_config(out: Path, args, mode: str, unroll: int, seed: int, vision: str) -> dict:
    name = f"{mode}-u{unroll}-s{seed}"
    config = _config(args, mode, args.delay, unroll, args.steps, seed, vision)
    start = time.monotonic()
    result = train(config, out / "runs" / name)
    return {"mode": mode, "unroll": unroll, "seed": seed, "success": result.mean_success,
            "agent_steps": result.agent_steps, "updates": result.updates, "episodes": result.episodes,
            "seconds": time.monotonic() - start, "run": name}


def plot(out: Path, rows: list[dict], title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    styles = ["-", "--", ":", "-."]
    unrolls = sorted({r["unroll"] for r in rows})
    for r in rows:
        xs, ys = series(read_metrics(out / "runs" / r["run"]), "mean_success")
        shade = 0.45 + 0.55 * (unrolls.index(r["unroll"]) + 1) / len(unrolls)
        ax.plot(xs, ys, styles[unrolls.index(r["unroll"]) % len(styles)], color=COLOURS[r["mode"]],
                alpha=shade, label=f"{'RTRL' if r['mode'] == 'rtrl' else 'TBPTT'} T={r['unroll']} seed {r['seed']}")
    ax.axhline(0.5, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("agent steps")
    ax.set_ylabel("success (last 100 episodes)")
    ax.set_ylim(0.0, 1.02)
    ax.set_title(textwrap.fill(title, 90), fontsize=8)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path = out / "success.png"
    fig.savefig(path)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("out", help="output folder")
    parser.add_argument("--delay", type=int, default=40)
    parser.add_argument("--configs", default="rtrl:10,bptt:10,rtrl:50,bptt:50", help="MODE:UNROLL list")
    parser.add_argument("--seeds", default="1,2")
    parser.add_argument("--steps", type=int, default=300_000, help="agent steps per run (same for all)")
    parser.add_argument("--hidden", type=int, default=64, help="eLSTM hidden size")
    parser.add_argument("--forget-bias", type=float, default=2.0, help="mean of the eLSTM b_f init")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--entropy-cost", type=float, default=0.01)
    parser.add_argument("--batch", type=int, default=8, help="rollouts per update")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--envs-per-worker", type=int, default=8)
    parser.add_argument("--pretrain-steps", type=int, default=300_000, help="TBPTT stem pretraining (0: none)")
    parser.add_argument("--pretrain-delay", type=int, default=10)
    parser.add_argument("--pretrain-unroll", type=int, default=40)
    parser.add_argument("--log-interval", type=float, default=2.0, help="seconds between curve points")
    args = parser.parse_args(argv)
    configs = parse_configs(args.configs)
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        raise FwrlError(f"--seeds must be comma-separated integers, got {args.seeds!r}.") from None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    vision, pretrain = "", None
    if args.pretrain_steps > 0:
        vision, pretrain = pretrain_vision(out, args)
        print(json.dumps({"pretrain": pretrain}), flush=True)
    rows = []
    for mode, unroll in configs:
        for seed in seeds:
            rows.append(run_config(out, args, mode, unroll, seed, vision))
            print(json.dumps(rows[-1]), flush=True)
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (out / "results.json").write_text(json.dumps({"settings": vars(args), "pretrain": pretrain, "runs": rows}, indent=2))
    title = (f"cue_delay delay={args.delay}, eLSTM H={args.hidden}, forget bias {args.forget_bias}, "
             f"lr {args.lr}, batch {args.batch}, {args.steps:,} steps"
             + (", stem pretrained (TBPTT) + frozen" if vision else ", trained from scratch"))
    png = plot(out, rows, title)
    print(title)
    print(f"{'mode':<6}{'T':>5}{'seed':>6}{'success':>9}{'steps':>10}{'seconds':>9}")
    for r in rows:
        print(f"{r['mode']:<6}{r['unroll']:>5}{r['seed']:>6}{r['success']:>9.3f}{r['agent_steps']:>10}"
              f"{r['seconds']:>9.1f}")
    for mode, unroll in configs:
        mine = [r["success"] for r in rows if (r["mode"], r["unroll"]) == (mode, unroll)]
        print(f"{mode} T={unroll}: mean success {sum(mine) / len(mine):.3f} over seeds {seeds}")
    print(f"curves: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
