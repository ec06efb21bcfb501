"""Peak memory of the fused kernels' forward + backward, planned on the CPU (no GPU needed).

``python benchmarks/kernel_memory.py [--core all] [--shape B,T,H,D ...] [--dtype fp32 bf16]
[--split auto] [--against benchmarks/results/gpu/kernels-h100/kernels.json] [--json-path PATH]``

What a fused kernel's call holds in memory does not depend on what its
kernels compute: the wrappers allocate every output, record, scratch and
gradient buffer with PyTorch, and the kernels only write into them. So this
script runs each core's fused path (``fwrl.kernels.<rule>.fused_recurrent``, exactly as
``fwrl bench kernels`` calls it: inputs from ``fwrl.launch.bench.kernels._inputs``,
leaves that require grad, a backward with gradients for every output) on the
CPU with every Triton launch skipped, and reads the peak of live tensor bytes
from ``torch.profiler``'s allocator events (``profile_memory=True``: each
allocation and free of the CPU allocator, in time order). That peak, above
what was live before the call, is what the GPU benchmark reports as
``fwd_bwd_peak_mib`` (``torch.cuda.max_memory_allocated`` above the memory
allocated before the call), up to the CUDA caching allocator's 512-byte
rounding and ops whose CPU and CUDA implementations allocate different
temporaries. The H100 run of c7ffd00 measured 572.08 MiB for rdn at
(256, 101, 8, 64); the plan of that commit gives the same figure.

With ``--against JSON`` (a ``kernels.json`` of the GPU suite, or a
``fwrl bench kernels --json-path`` file), each row also shows the fused peak
that run measured and its eager reference's peak, and the ratio of the
eager peak to the planned one (the issue's memory goal: >= 20x).

The kernels' values are garbage here (nothing runs them), so the timings and
errors of ``fwrl bench kernels`` are not reproduced: memory only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from argparse import Namespace
from pathlib import Path

# The wrappers accept CPU tensors only under Triton's interpreter (read when
# fwrl.kernels.triton.common is imported, so before any fused kernel is): its launches are
# skipped too.
os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from fwrl.errors import FwrlError, run_main  # noqa: E402
from fwrl.launch.bench import kernels as kb  # noqa: E402

# The goal shapes (B, T, H, D), as the GPU suite times them.
GOAL_SHAPES = ((32, 51, 4, 32), (256, 101, 8, 64))
MIB = 2.0**20


@contextlib.contextmanager
def launches_skipped():
    """Every Triton kernel launch inside the context returns without running (compiled or
    interpreted): the wrappers still allocate every buffer they would hand the kernel."""
    import triton.runtime.jit as jit

    classes = [jit.JITFunction]
    with contextlib.suppress(ImportError):
        from triton.runtime.interpreter import InterpretedFunction

        classes.append(InterpretedFunction)
    saved = [(cls, cls.run) for cls in classes]
    try:
        for cls in classes:
            cls.run = lambda self, *args, **kwargs: None
        yield
    finally:
        for cls, run in saved:
            cls.run = run


def peak_bytes(fn) -> int:
    """Peak of live CPU tensor bytes while ``fn`` runs, above those live when it starts."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())
    live = peak = 0
    for event in events:
        live += event.nbytes()
        peak = max(peak, live)
    return peak


def plan(core: str, shape, dtype_name: str, split: str) -> dict:
    """One row: the planned fwd and fwd+bwd peaks (MiB) of ``core``'s fused path."""
    args = Namespace(rule="delta", feature_map=None, grad_mode="full", split=[split], maxnreg=None)
    inputs = kb._inputs(core, shape, kb.DTYPES[dtype_name], torch.device("cpu"))
    runners = kb._uncapped_triton_runners(core, args, inputs)
    (name, (fn, note, _)), = runners.items()
    row = dict(core=core, shape="x".join(map(str, shape)), dtype=dtype_name, impl=name)
    if fn is None:
        return dict(row, skipped=note)
    *tensors, reset = inputs
    leaves = [x.detach().clone().requires_grad_() for x in tensors]
    with torch.no_grad():
        outs = fn(*tensors, reset)
    grads = [torch.zeros_like(o) for o in outs]

    def forward():
        with torch.no_grad():
            fn(*tensors, reset)

    def forward_backward():
        result = fn(*leaves, reset)
        torch.autograd.backward(tuple(result), grads)
        for x in leaves:
            x.grad = None

    forward_backward()  # first call outside the profile, as the benchmark's warm-up
    return dict(row, fwd_peak_mib=peak_bytes(forward) / MIB,
                fwd_bwd_peak_mib=peak_bytes(forward_backward) / MIB)


def measured(path: str | None) -> dict:
    """(core, shape, dtype, impl) -> fwd_bwd_peak_mib of a GPU run's JSON rows."""
    if not path:
        return {}
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise FwrlError(f"--against {path!r} is not a readable kernels JSON ({exc})") from exc
    rows = data["rows"] if isinstance(data, dict) else data
    out = {}
    for r in rows:
        if r.get("fwd_bwd_peak_mib") is None or not isinstance(r.get("shape"), (list, str)):
            continue
        shape = r["shape"] if isinstance(r["shape"], str) else "x".join(map(str, r["shape"]))
        impl = "triton" if str(r["impl"]).startswith("triton") and "maxnreg" not in str(r["impl"]) \
            else r["impl"]
        out.setdefault((r["core"], shape, r["dtype"], impl), r["fwd_bwd_peak_mib"])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--core", choices=(*kb.CORES, "all"), nargs="+", default=["all"])
    parser.add_argument("--shape", type=kb._parse_shape, action="append", dest="shapes",
                        help="B,T,H,D (repeatable); default: " +
                        " ".join(",".join(map(str, s)) for s in GOAL_SHAPES))
    parser.add_argument("--dtype", choices=tuple(kb.DTYPES), nargs="+", default=["fp32"])
    parser.add_argument("--split", choices=kb.SPLITS, default="auto",
                        help="delta_rule's programs per (batch, head); auto is 1 off CUDA "
                        "(the H100 took 2 at the small shape)")
    parser.add_argument("--against", metavar="JSON",
                        help="a GPU run's kernels.json: show its measured peaks and the ratio "
                        "of its eager peak to the planned fused one")
    parser.add_argument("--json-path", metavar="PATH", help="also write the rows as JSON")
    args = parser.parse_args(argv)
    cores = kb._cores(args)
    gpu = measured(args.against)
    rows = []
    print(f"{'core':<13} {'dtype':<5} {'shape':<13} {'fwd MiB':>9} {'fwd+bwd MiB':>12}"
          + (f" {'measured':>9} {'eager':>9} {'eager/plan':>10}" if gpu else ""), flush=True)
    with launches_skipped():
        for core in cores:
            for dtype_name in args.dtype:
                for shape in args.shapes or GOAL_SHAPES:
                    row = plan(core, shape, dtype_name, args.split)
                    key = (core, row["shape"], dtype_name)
                    if (eager := gpu.get((*key, "reference"))) is not None:
                        row["eager_measured_mib"] = eager
                    if (fused := gpu.get((*key, "triton"))) is not None:
                        row["fused_measured_mib"] = fused
                    rows.append(row)
                    _print(row, bool(gpu))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


def _print(row: dict, against: bool) -> None:
    head = f"{row['core']:<13} {row['dtype']:<5} {row['shape']:<13}"
    if "skipped" in row:
        print(f"{head} skipped: {row['skipped']}", flush=True)
        return
    line = f"{head} {row['fwd_peak_mib']:9.1f} {row['fwd_bwd_peak_mib']:12.1f}"
    if against:
        fused, eager = row.get("fused_measured_mib"), row.get("eager_measured_mib")
        line += f" {fused:9.1f}" if fused is not None else f" {'-':>9}"
        line += (f" {eager:9.1f} {eager / row['fwd_bwd_peak_mib']:9.1f}x" if eager is not None
                 else f" {'-':>9} {'-':>10}")
    print(line, flush=True)


if __name__ == "__main__":
    sys.exit(run_main(main))
