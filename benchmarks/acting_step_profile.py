"""Where one acting step of each core's agent goes on the CPU (issue 53).

The agent of a setting of ``benchmarks/cpu_cores.py`` (MinAtar by default: Breakout, 2 workers x 8
envs, so B 16) makes one acting forward (T = 1, no autograd, one torch thread) on synthetic data,
again and again; per core this prints

- the wall microseconds of one step (median of 3 rounds of 200 steps, the cores alternated) and
  its ratio to the LSTM's;
- the torch calls one step makes (a ``TorchFunctionMode`` count: each is Python and dispatch
  overhead, paid whatever the op's size);
- the five ops that take the most self CPU time under ``torch.profiler`` (microseconds per step).

::

    python benchmarks/acting_step_profile.py --out benchmarks/results/cpu_cores/acting_step_profile.md
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cpu_cores  # noqa: E402  (benchmarks/cpu_cores.py: the settings and the synthetic agent step)

CORES = ("lstm", "gru", "delta_net", "linear_transformer", "rdn", "srwm", "delta_rnn", "delta_lstm", "sr_delta_net")


class _CallCount(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


def measure(setting: str, cores: list[str], rounds: int = 3, steps: int = 200) -> list[dict]:
    torch.set_num_threads(1)
    acts = {core: cpu_cores._micro_case(setting, core)[1] for core in cores}
    for act in acts.values():
        for _ in range(30):
            act()
    wall: dict[str, list[float]] = {core: [] for core in cores}
    for _ in range(rounds):
        for core, act in acts.items():
            start = time.perf_counter()
            for _ in range(steps):
                act()
            wall[core].append((time.perf_counter() - start) / steps * 1e6)
    rows = []
    for core, act in acts.items():
        count = _CallCount()
        with count:
            act()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(100):
                act()
        ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:5]
        rows.append({"core": core, "us": sorted(wall[core])[len(wall[core]) // 2], "calls": count.calls,
                     "top": [(e.key.removeprefix("aten::"), e.self_cpu_time_total / 100) for e in ops]})
    return rows


def markdown(rows: list[dict], setting: str) -> str:
    base = next((r["us"] for r in rows if r["core"] == "lstm"), None)
    lines = [f"| core ({setting}) | us per acting step | x lstm | torch calls per step | top ops by self CPU (us per step) |",
             "|---|---|---|---|---|"]
    for r in rows:
        ratio = f"{r['us'] / base:.2f}" if base else ""
        top = ", ".join(f"{name} {us:.0f}" for name, us in r["top"])
        lines.append(f"| {r['core']} | {r['us']:,.0f} | {ratio} | {r['calls']} | {top} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", default="minatar", choices=sorted(cpu_cores.SETTINGS))
    parser.add_argument("--cores", default=",".join(CORES), help="comma-separated cores (default: %(default)s)")
    parser.add_argument("--out", default=None, help="also write the table to this markdown file")
    args = parser.parse_args(argv)
    table = markdown(measure(args.settings, args.cores.split(",")), args.settings)
    print(table, end="")
    if args.out:
        Path(args.out).write_text(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
