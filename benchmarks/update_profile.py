"""Where one learner update of each core's agent goes on the CPU (issue 53).

The agent of a setting of ``benchmarks/cpu_cores.py`` (MinAtar by default: Breakout, B 8, T 20) makes
one learner update on a synthetic batch (forward over T + 1 steps, the IMPALA loss, backward, RMSProp
step; one torch thread, glibc keeping freed memory as ``fwrl train``'s update process does); per core
this prints

- the wall milliseconds of one update (median of 3 rounds of 5, the cores alternated) and its ratio
  to the LSTM's;
- the agent's parameters (the dense layers' arithmetic grows with them);
- the self CPU per update under ``torch.profiler`` of the products (``mm``, ``addmm``, ``bmm``,
  ``baddbmm`` and their in-place forms: the dense layers and the recurrences' batched reads) and of
  everything else, and the calls per update;
- the five ops that take the most self CPU (ms per update, with their calls per update).

The profiler adds a few microseconds to each call, so its per-op times are larger than the wall
figures, the more so for a core of many small calls.

::

    python benchmarks/update_profile.py --out benchmarks/results/cpu_cores/update_profile.md
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cpu_cores  # noqa: E402  (benchmarks/cpu_cores.py: the settings and the synthetic update)

CORES = ("lstm", "gru", "delta_net", "rdn", "srwm", "delta_rnn", "delta_lstm", "sr_delta_net", "elstm:grad=rtrl")
PRODUCTS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addmm_", "aten::baddbmm_"}
PROFILED_UPDATES = 5


def measure(setting: str, cores: list[str], rounds: int = 3) -> list[dict]:
    from fwrl.utils.allocator import keep_freed_memory

    torch.set_num_threads(1)
    keep_freed_memory()
    cases = {core: cpu_cores._micro_case(setting, core) for core in cores}
    walls: dict[str, list[float]] = {core: [] for core in cores}
    for _ in range(rounds):
        for core, (update, _) in cases.items():
            walls[core].append(cpu_cores._timed(update, 5))
    rows = []
    for core, (update, act) in cases.items():
        update()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(PROFILED_UPDATES):
                update()
        ops = [e for e in prof.key_averages() if e.key.startswith("aten::")]
        own = {e.key: (e.self_cpu_time_total / 1e3 / PROFILED_UPDATES, e.count / PROFILED_UPDATES) for e in ops}
        products = sum(ms for key, (ms, _) in own.items() if key in PRODUCTS)
        rows.append({
            "core": core, "update_ms": statistics.median(walls[core]),
            "parameters": sum(p.numel() for p in act.core.parameters()),
            "products_ms": products, "other_ms": sum(ms for ms, _ in own.values()) - products,
            "calls": sum(n for _, n in own.values()),
            "top": sorted(((key, ms, n) for key, (ms, n) in own.items()), key=lambda t: -t[1])[:5],
        })
    return rows


def markdown(setting: str, rows: list[dict]) -> str:
    """One setting's section: the table of ``measure``'s rows."""
    base = next((r["update_ms"] for r in rows if r["core"] == "lstm"), None)
    lines = [f"## {setting}", "", f"`{' '.join(cpu_cores.SETTINGS[setting])}`", "",
             "| core | update ms | x lstm | core parameters | products ms | other ops ms | calls per update "
             "| top ops by self CPU (ms per update, calls) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = f"{r['update_ms'] / base:.2f}" if base else ""
        top = ", ".join(f"{key.removeprefix('aten::')} {ms:.1f} ({n:.0f})" for key, ms, n in r["top"])
        lines.append(f"| {r['core']} | {r['update_ms']:.1f} | {ratio} | {r['parameters']:,} | {r['products_ms']:.1f} | "
                     f"{r['other_ms']:.1f} | {r['calls']:,.0f} | {top} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", nargs="+", default=["minatar"], choices=list(cpu_cores.SETTINGS))
    parser.add_argument("--cores", default=",".join(CORES), help="comma-separated name[:key=value] specs")
    parser.add_argument("--out", type=Path, help="write the markdown here (one section per setting)")
    args = parser.parse_args(argv)
    command = "python benchmarks/update_profile.py " + " ".join(sys.argv[1:] if argv is None else argv)
    parts = [f"# One learner update of each core on the CPU (issue 53), {time.strftime('%Y-%m-%d')}\n\n"
             f"`{command}`\n\nOne torch thread, synthetic batch. Wall: median of 3 rounds of 5 updates, the "
             f"cores alternated. Profiled: self CPU per update under torch.profiler ({PROFILED_UPDATES} updates; "
             "it adds microseconds to every call). Products: mm, addmm, bmm, baddbmm (the dense layers and the "
             "recurrences' batched reads).\n"]
    for setting in args.settings:
        parts.append(markdown(setting, measure(setting, args.cores.split(","))))
        print(parts[-1], flush=True)
    if args.out:
        args.out.write_text("\n".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
