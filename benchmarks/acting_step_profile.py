"""Where one acting step of each core's agent goes on the CPU (issue 53).

The agent of a setting of ``benchmarks/cpu_cores.py`` (MinAtar by default: Breakout, 2 workers x 8
envs, so B 16) makes one acting forward (T = 1, no autograd, one torch thread) on synthetic data,
again and again; per core this prints

- the wall microseconds of one step (median of 3 rounds of 200 steps, the cores alternated) and
  its ratio to the LSTM's;
- the torch calls one step makes (a ``TorchFunctionMode`` count: each is Python and dispatch
  overhead, paid whatever the op's size);
- the five ops that take the most self CPU time under ``torch.profiler`` (microseconds per step);
- for a core that steps in Python, the same step with the core replayed from its TorchScript trace
  (``--acting-trace``, ``fwrl.agents.traced_core``), alternated with the eager step, and the ratio.

glibc's allocator keeps freed memory as ``fwrl train`` has it (``fwrl.utils.allocator``).

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
    from fwrl.agents.traced_core import TracedCoreStep
    from fwrl.utils.allocator import keep_freed_memory

    torch.set_num_threads(1)
    keep_freed_memory()
    acts = {core: cpu_cores._micro_case(setting, core)[1] for core in cores}
    traced = {core: TracedCoreStep(act.core) for core, act in acts.items() if act.core.python_recurrence}
    runs = [(core, act, None) for core, act in acts.items()] + [(core, acts[core], step) for core, step in traced.items()]
    for _, act, core_step in runs:
        for _ in range(30):
            act(core_step)
    wall: dict[tuple[str, bool], list[float]] = {(core, core_step is not None): [] for core, _, core_step in runs}
    for _ in range(rounds):
        for core, act, core_step in runs:
            start = time.perf_counter()
            for _ in range(steps):
                act(core_step)
            wall[core, core_step is not None].append((time.perf_counter() - start) / steps * 1e6)
    rows = []
    for core, act in acts.items():
        count = _CallCount()
        with count:
            act()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(100):
                act()
        ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:5]
        median = {key: sorted(times)[len(times) // 2] for key, times in wall.items()}
        rows.append({"core": core, "us": median[core, False], "traced_us": median.get((core, True)),
                     "calls": count.calls,
                     "top": [(e.key.removeprefix("aten::"), e.self_cpu_time_total / 100) for e in ops]})
    return rows


def markdown(rows: list[dict], setting: str) -> str:
    base = next((r["us"] for r in rows if r["core"] == "lstm"), None)
    lines = [f"| core ({setting}) | us per acting step | x lstm | traced: us | traced x eager | traced x lstm | "
             "torch calls per step | top ops by self CPU (us per step) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = f"{r['us'] / base:.2f}" if base else ""
        traced = r["traced_us"]
        cells = ((f"{traced:,.0f}", f"{traced / r['us']:.2f}", f"{traced / base:.2f}" if base else "")
                 if traced is not None else ("", "", ""))
        top = ", ".join(f"{name} {us:.0f}" for name, us in r["top"])
        lines.append(f"| {r['core']} | {r['us']:,.0f} | {ratio} | {' | '.join(cells)} | {r['calls']} | {top} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", default="minatar", choices=sorted(cpu_cores.SETTINGS))
    parser.add_argument("--cores", default=",".join(CORES), help="comma-separated cores (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of 200 steps per core (default: 3)")
    parser.add_argument("--out", default=None, help="also write the table to this markdown file")
    args = parser.parse_args(argv)
    table = markdown(measure(args.settings, args.cores.split(","), rounds=args.rounds), args.settings)
    print(table, end="")
    if args.out:
        Path(args.out).write_text(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
