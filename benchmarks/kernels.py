"""Kernel benchmark: the sum / delta rule over a rollout, reference vs fused Triton.

For each shape (B, T, H, D) it times, on one CUDA GPU:

- ``reference``: the eager per-step PyTorch loop (``fwrl.kernels.reference``);
- ``compiled``: the same loop through ``torch.compile`` (compile time reported
  separately, not in the timings);
- ``triton``: the fused kernel (``fwrl.kernels.triton.delta_rule``);
- ``fla``: fla-core's ``fused_recurrent_delta_rule`` (scale 1) for the delta
  rule, when the ``fla`` package is importable. It has no per-step resets, so
  it runs the same sequence without episode ends; the feature maps and the
  sigmoid are applied in PyTorch inside the timed region (the fused kernel
  computes them itself).

``forward`` runs without autograd (the acting path); ``fwd+bwd`` runs the
forward with inputs requiring grad, then the backward with gradients for the
outputs and the final state (the learner's path). Times are medians of CUDA
event timings; memory is the peak allocated during the call beyond what was
allocated before it; ``max error`` compares outputs and final state with the
float64 reference on the same inputs.

Run from the repository root: ``python -m benchmarks.kernels [--rule delta]
[--dtype bf16]`` (also
``fwrl bench kernels``, which calls :func:`main`). Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Callable

import torch

from fwrl.errors import FwrlError
from fwrl.kernels.reference.delta_rule import delta_rule_reference
from fwrl.kernels.reference.feature_maps import apply_feature_map

SHAPES = ((32, 51, 4, 32), (32, 51, 8, 16), (256, 101, 8, 64))
IMPLEMENTATIONS = ("reference", "compiled", "triton", "fla")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# Fraction of (t, b) entries that start a new episode (resets inside the rollout).
RESET_RATE = 0.02


def _parse_shape(text: str) -> tuple[int, int, int, int]:
    try:
        shape = tuple(int(x) for x in text.split(","))
    except ValueError:
        shape = ()
    if len(shape) != 4 or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"shape {text!r} is not B,T,H,D (four positive ints)")
    return shape  # type: ignore[return-value]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fwrl bench kernels", description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", type=_parse_shape, action="append", dest="shapes",
                   help="B,T,H,D (repeatable); default: " +
                   " ".join(",".join(map(str, s)) for s in SHAPES))
    p.add_argument("--rule", choices=("delta", "sum"), default="delta")
    p.add_argument("--feature-map", choices=("elu1_sumnorm", "softmax"), default="elu1_sumnorm")
    p.add_argument("--grad-mode", choices=("full", "step"), default="full")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="fp32",
                   help="dtype of q, k, v, beta (the state is always fp32)")
    p.add_argument("--impl", choices=IMPLEMENTATIONS, action="append", dest="impls",
                   help="implementations to run (repeatable); default: all available")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    return p


def _inputs(shape, dtype, device, seed=0):
    B, T, H, D = shape
    g = torch.Generator(device=device).manual_seed(seed)
    q, k, v = (torch.randn(T, B, H, D, generator=g, device=device).to(dtype) for _ in range(3))
    beta = torch.randn(T, B, H, generator=g, device=device).to(dtype)
    W0 = 0.1 * torch.randn(B, H, D, D, generator=g, device=device)
    reset = torch.rand(T, B, generator=g, device=device) < RESET_RATE
    return q, k, v, beta, W0, reset


def _fla_runner(rule: str, feature_map: str) -> Callable | None:
    """fla-core's fused recurrent delta rule wrapped to our layout, or None."""
    if rule != "delta":
        return None
    try:
        from fla.ops.delta_rule import fused_recurrent_delta_rule
    except ImportError:
        return None

    def run(q, k, v, beta, W0, reset):
        # fla: [B, T, H, D] inputs, post-sigmoid beta, state [B, H, Dk, Dv]; no resets.
        q, k = apply_feature_map(feature_map, q), apply_feature_map(feature_map, k)
        y, WT = fused_recurrent_delta_rule(
            q=q.transpose(0, 1), k=k.transpose(0, 1), v=v.transpose(0, 1),
            beta=torch.sigmoid(beta).transpose(0, 1), scale=1.0,
            initial_state=W0.transpose(-1, -2).to(q.dtype), output_final_state=True,
        )
        return y.transpose(0, 1), WT

    return run


def _runners(args) -> dict[str, tuple[Callable | None, str]]:
    """name -> (function(q, k, v, beta, W0, reset) -> (y, W_T), note)."""
    kwargs = dict(rule=args.rule, feature_map=args.feature_map, grad_mode=args.grad_mode)

    def reference(q, k, v, beta, W0, reset):
        # The reference computes in the input dtype; give it a matching state.
        return delta_rule_reference(q, k, v, beta, W0.to(q.dtype), reset, **kwargs)

    compiled_fn = torch.compile(delta_rule_reference, dynamic=False)

    def compiled(q, k, v, beta, W0, reset):
        return compiled_fn(q, k, v, beta, W0.to(q.dtype), reset, **kwargs)

    out: dict[str, tuple[Callable | None, str]] = {
        "reference": (reference, ""), "compiled": (compiled, ""),
    }
    try:
        from fwrl.kernels.triton.delta_rule import delta_rule_triton
    except ImportError as exc:
        out["triton"] = (None, f"Triton kernel unavailable: {exc}")
    else:
        out["triton"] = (lambda *a: delta_rule_triton(*a, **kwargs), "")
    fla = _fla_runner(args.rule, args.feature_map)
    if fla is not None:
        note = "no resets (fla has none)" + ("; grad_mode full only" if args.grad_mode != "full"
                                              else "")
        out["fla"] = (fla, note)
    else:
        out["fla"] = (None, "fla not importable" if args.rule == "delta" else
                      "fla has no sum-rule recurrence here")
    return out


def _measure(step: Callable[[], None], warmup: int, repeats: int) -> tuple[float, int]:
    """(median milliseconds, peak extra bytes) of ``step`` on the current GPU."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    peak = torch.cuda.max_memory_allocated() - base
    return statistics.median(times), peak


def _bench_one(fn, inputs, args) -> dict:
    q, k, v, beta, W0, reset = inputs

    def forward():
        with torch.no_grad():
            fn(q, k, v, beta, W0, reset)

    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v, beta, W0)]
    gy = torch.randn_like(v)

    def forward_backward():
        y, WT = fn(*leaves, reset)
        torch.autograd.backward((y, WT), (gy, torch.ones_like(WT)))
        for x in leaves:
            x.grad = None

    t0 = time.perf_counter()
    forward_backward()  # first call: compilation / autotuning
    torch.cuda.synchronize()
    first_s = time.perf_counter() - t0
    fwd_ms, fwd_mem = _measure(forward, args.warmup, args.repeats)
    fb_ms, fb_mem = _measure(forward_backward, args.warmup, args.repeats)
    return dict(first_call_s=first_s, fwd_ms=fwd_ms, fwd_peak_mib=fwd_mem / 2**20,
                fwd_bwd_ms=fb_ms, fwd_bwd_peak_mib=fb_mem / 2**20)


def _require_gpu() -> None:
    if not torch.cuda.is_available():
        raise FwrlError(
            "the kernel benchmark needs a CUDA GPU (it times GPU kernels), and PyTorch sees "
            "none here. Run it on a machine with an NVIDIA GPU; the kernels' correctness "
            "tests run on CPU with: pytest tests/test_kernels_delta_rule.py"
        )


def _max_error(fn, inputs, args) -> float:
    """Largest |y - y_ref| + |W_T - W_ref| against the float64 reference on the same inputs."""
    q, k, v, beta, W0, reset = inputs
    with torch.no_grad():
        y, WT = fn(q, k, v, beta, W0, reset)
        y_ref, W_ref = delta_rule_reference(
            *(x.double() for x in (q, k, v, beta, W0)), reset,
            rule=args.rule, feature_map=args.feature_map, grad_mode=args.grad_mode,
        )
    return max((y.double() - y_ref).abs().max().item(), (WT.double() - W_ref).abs().max().item())


def run(args) -> list[dict]:
    _require_gpu()
    device = torch.device("cuda")
    dtype = DTYPES[args.dtype]
    runners = _runners(args)
    impls = args.impls or list(IMPLEMENTATIONS)
    results = []
    for shape in args.shapes or SHAPES:
        inputs = _inputs(shape, dtype, device)
        for name in impls:
            fn, note = runners[name]
            row = dict(shape=list(shape), impl=name, rule=args.rule, dtype=args.dtype,
                       feature_map=args.feature_map, grad_mode=args.grad_mode, note=note)
            if fn is None:
                row["skipped"] = note
            else:
                try:
                    if name != "fla":  # fla runs without resets: not the same sequence
                        row["max_abs_error"] = _max_error(fn, inputs, args)
                    row.update(_bench_one(fn, inputs, args))
                except torch.cuda.OutOfMemoryError:
                    torch.cuda.empty_cache()
                    row["skipped"] = "out of GPU memory"
                except TypeError as exc:
                    if name != "fla":
                        raise
                    row["skipped"] = f"this fla version has another signature: {exc}"
            results.append(row)
            _print_row(row)
    return results


def _print_row(row: dict) -> None:
    B, T, H, D = row["shape"]
    head = f"B={B:<4d} T={T:<4d} H={H:<2d} D={D:<4d} {row['impl']:<10s}"
    if "skipped" in row:
        print(f"{head} skipped: {row['skipped']}", flush=True)
        return
    note = f"  ({row['note']})" if row["note"] else ""
    print(f"{head} fwd {row['fwd_ms']:8.3f} ms {row['fwd_peak_mib']:8.1f} MiB | "
          f"fwd+bwd {row['fwd_bwd_ms']:8.3f} ms {row['fwd_bwd_peak_mib']:8.1f} MiB | "
          f"first call {row['first_call_s']:6.1f} s | "
          f"max error {row.get('max_abs_error', float('nan')):.1e}{note}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point for ``fwrl bench kernels`` and ``python -m benchmarks.kernels``."""
    args = _parser().parse_args(argv)
    if args.repeats < 1 or args.warmup < 0:
        raise FwrlError(f"--repeats must be >= 1 and --warmup >= 0 (got {args.repeats}, "
                        f"{args.warmup}).")
    _require_gpu()
    gpu = torch.cuda.get_device_name()
    print(f"kernel benchmark: rule {args.rule}, feature map {args.feature_map}, "
          f"grad_mode {args.grad_mode}, inputs {args.dtype}, GPU {gpu}", flush=True)
    results = run(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(gpu=gpu, results=results), f, indent=2)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except FwrlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
