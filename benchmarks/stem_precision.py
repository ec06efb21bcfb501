"""The frame stems' time in float32 and under bfloat16 autocast (``--stem-precision``), on the CPU.

Per stem and batch of frames N: the acting forward (no autograd) and the learner's forward and
backward, timed as the CPU time of the timing thread with torch on one thread (so a busy machine
slows the figures less than wall time would, and each is one core's work), the minimum over
``--repeats`` after one warm-up call; and the relative error of bfloat16's features against
float32's. Channels-last frames, as the agent gives them.

    python benchmarks/stem_precision.py --out benchmarks/results/cpu_cores/stem_precision.md
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path
from typing import Callable

import torch

from fwrl.agents.model import make_stem
from fwrl.utils.files import atomic_write_text

SHAPES = {"impala": (3, 64, 64), "nature": (4, 84, 84)}


def thread_seconds(fn: Callable[[], object], repeats: int) -> float:
    """The least thread CPU time of ``repeats`` calls of ``fn``, after one warm-up call."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.thread_time()
        fn()
        best = min(best, time.thread_time() - start)
    return best


def measure(stem_name: str, frames: int, repeats: int) -> dict:
    torch.manual_seed(0)
    stem = make_stem(stem_name, SHAPES[stem_name]).to(memory_format=torch.channels_last)
    x = torch.rand(frames, *SHAPES[stem_name]).contiguous(memory_format=torch.channels_last)
    row = {"stem": stem_name, "frames": frames}
    for precision in ("float32", "bfloat16"):
        autocast = precision == "bfloat16"

        def forward():
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                return stem(x).float()

        def forward_backward():
            stem.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                y = stem(x)
            y.float().sum().backward()

        row[f"{precision}_forward_ms"] = 1e3 * thread_seconds(forward, repeats)
        row[f"{precision}_update_ms"] = 1e3 * thread_seconds(forward_backward, max(1, repeats // 2))
        row[f"{precision}_features"] = forward()
    a, b = row.pop("float32_features"), row.pop("bfloat16_features")
    row["relative_error"] = float((a - b).norm() / a.norm())
    return row


def report(rows: list[dict], command: str) -> str:
    cpu_flags = open("/proc/cpuinfo").read() if Path("/proc/cpuinfo").exists() else ""
    native = [f for f in ("avx512_bf16", "amx_bf16") if f in cpu_flags]
    lines = ["# The frame stems in float32 and bfloat16 (`--stem-precision`), CPU", "",
             f"`{command}`", "",
             f"torch {torch.__version__}, {platform.processor() or platform.machine()}, native bf16: "
             f"{', '.join(native) or 'none'}; one torch thread, CPU time of the timing thread (min of repeats), "
             "channels-last frames. forward: no autograd (acting); update: forward and backward (learner).", "",
             "| stem | frames | float32 forward ms | bfloat16 forward ms | ratio | float32 update ms | "
             "bfloat16 update ms | ratio | features' relative error |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['stem']} | {r['frames']} | {r['float32_forward_ms']:.1f} | {r['bfloat16_forward_ms']:.1f} | "
            f"{r['float32_forward_ms'] / r['bfloat16_forward_ms']:.2f}x | {r['float32_update_ms']:.1f} | "
            f"{r['bfloat16_update_ms']:.1f} | {r['float32_update_ms'] / r['bfloat16_update_ms']:.2f}x | "
            f"{r['relative_error']:.4f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stems", default="impala,nature")
    parser.add_argument("--frames", default="8,32,160", help="comma-separated batch sizes N")
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--out", type=Path, default=None, help="write the table here (Markdown)")
    args = parser.parse_args(argv)
    stems = args.stems.split(",")
    unknown = [s for s in stems if s not in SHAPES]
    if unknown:
        print(f"stem_precision: error: unknown stem {unknown[0]!r}; choose from {', '.join(SHAPES)}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    rows = []
    for stem in stems:
        for frames in (int(n) for n in args.frames.split(",")):
            rows.append(measure(stem, frames, args.repeats))
            print(f"{stem} N={frames}: done", flush=True)
    text = report(rows, "python benchmarks/stem_precision.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
