"""Kernel benchmark: fast-weight recurrences over a rollout, reference vs fused Triton.

``--core`` picks the recurrence: ``delta_rule`` (sum / delta rule, the
default), ``srwm`` (paper 002), ``rdn`` or ``delta_rnn`` (paper 000). For each
shape (B, T, H, D) it times, on one CUDA GPU:

- ``reference``: the eager per-step PyTorch loop (``fwrl.kernels.reference``);
- ``compiled``: the same loop through ``torch.compile`` (compile time reported
  separately, not in the timings);
- ``triton``: the fused kernel (``fwrl.kernels.triton.<core>``);
- ``fla`` (delta rule only): fla-core's ``fused_recurrent_delta_rule`` (scale 1) for the delta
  rule, when the ``fla`` package is importable. It has no per-step resets, so
  it runs the same sequence without episode ends; the feature maps and the
  sigmoid are applied in PyTorch inside the timed region (the fused kernel
  computes them itself).

``forward`` runs without autograd (the acting path); ``fwd+bwd`` runs the
forward with inputs requiring grad, then the backward with gradients for the
outputs and the final state (the learner's path). Times are medians of CUDA
event timings; memory is the peak allocated during the call beyond what was
allocated before it; ``max error`` compares outputs and final state with the
float64 reference on the same inputs. For the recurrent cores each row also
gives the speed-up over the eager reference and the issue's target for it on
an H100 (SRWM and Delta RNN 30x, RDN 10x).

Run ``fwrl bench kernels [--core srwm] [--rule delta] [--dtype bf16]`` (or
``python benchmarks/kernels.py ...`` from the repository root; both call
:func:`main`). Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Callable

import torch

from fwrl.errors import FwrlError
from fwrl.kernels.reference.delta_rnn import delta_rnn_reference
from fwrl.kernels.reference.delta_rule import delta_rule_reference
from fwrl.kernels.reference.feature_maps import apply_feature_map
from fwrl.kernels.reference.rdn import rdn_reference
from fwrl.kernels.reference.srwm import srwm_reference

CORES = ("delta_rule", "srwm", "rdn", "delta_rnn")
SHAPES = ((32, 51, 4, 32), (32, 51, 8, 16), (256, 101, 8, 64))
# Default shapes of the recurrent cores: the presets' head sizes (SRWM: ProcGen,
# 8 heads of 16; RDN / Delta RNN: Atari, 4 heads of 32 and the larger 8 x 32).
CORE_SHAPES = {
    "srwm": ((32, 51, 8, 16), (256, 101, 8, 16)),
    "rdn": ((32, 51, 4, 32), (256, 101, 8, 32)),
    "delta_rnn": ((32, 51, 4, 32), (256, 101, 8, 32)),
}
# Speed-up of the fused kernel over the eager reference the issue asks for (H100).
SPEEDUP_TARGETS = {"srwm": 30.0, "rdn": 10.0, "delta_rnn": 30.0}
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
    p.add_argument("--core", choices=CORES, default="delta_rule",
                   help="recurrence to time (default: delta_rule)")
    p.add_argument("--shape", type=_parse_shape, action="append", dest="shapes",
                   help="B,T,H,D (repeatable); default for delta_rule: " +
                   " ".join(",".join(map(str, s)) for s in SHAPES) + "; for the others: " +
                   "; ".join(f"{c}: " + " ".join(",".join(map(str, s)) for s in shapes)
                             for c, shapes in CORE_SHAPES.items()))
    p.add_argument("--rule", choices=("delta", "sum"), default="delta",
                   help="delta_rule only")
    p.add_argument("--feature-map", choices=("elu1_sumnorm", "softmax"), default=None,
                   help="phi of q, k (default: elu1_sumnorm for delta_rule, softmax for "
                   "rdn and delta_rnn; the SRWM always uses softmax)")
    p.add_argument("--grad-mode", choices=("full", "step"), default="full")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="fp32",
                   help="dtype of q, k, v, beta (the state is always fp32)")
    p.add_argument("--impl", choices=IMPLEMENTATIONS, action="append", dest="impls",
                   help="implementations to run (repeatable); default: all available")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    return p


def _inputs(shape, dtype, device, seed=0, core="delta_rule"):
    """(*tensors, reset) for ``core``: per-step inputs in ``dtype``, weights and states fp32."""
    B, T, H, D = shape
    g = torch.Generator(device=device).manual_seed(seed)

    def randn(*size, scale=1.0, dt=torch.float32):
        return (scale * torch.randn(*size, generator=g, device=device)).to(dt)

    if core == "delta_rule":
        tensors = (randn(T, B, H, D, dt=dtype), randn(T, B, H, D, dt=dtype),
                   randn(T, B, H, D, dt=dtype), randn(T, B, H, dt=dtype), randn(B, H, D, D, scale=0.1))
    elif core == "srwm":  # x, W_y, W_q, W_k, w_b (std 1/sqrt(D) as in the core), zero offsets
        slow = tuple(randn(H, rows, D, scale=D**-0.5) for rows in (D, D, D, 4))
        tensors = (randn(T, B, H, D, dt=dtype), *slow,
                   *(torch.zeros(B, *w.shape, device=device) for w in slow))
    elif core == "rdn":  # xq, xk, xv, xb, Rq, Rk, Rv, rb, W0, h0
        tensors = (*(randn(T, B, H, D, dt=dtype) for _ in range(3)), randn(T, B, H, dt=dtype),
                   *(randn(H, D, D, scale=D**-0.5) for _ in range(3)), randn(H, D, scale=D**-0.5),
                   torch.zeros(B, H, D, D, device=device), torch.zeros(B, H, D, device=device))
    else:  # delta_rnn: q, k, v, beta, kr, vr, betar, W0, R0, h0
        tensors = (*(randn(T, B, H, D, dt=dtype) for _ in range(3)), randn(T, B, H, dt=dtype),
                   randn(T, B, H, D, dt=dtype), randn(T, B, H, D, dt=dtype),
                   randn(T, B, H, dt=dtype), torch.zeros(B, H, D, D, device=device),
                   torch.zeros(B, H, D, D, device=device), torch.zeros(B, H, D, device=device))
    reset = torch.rand(T, B, generator=g, device=device) < RESET_RATE
    return (*tensors, reset)


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


def _flat_srwm(fn: Callable) -> Callable:
    """SRWM functions return (y, (O_y, O_q, O_k, O_b)): flatten to (y, O_y, ...)."""
    def run(x, W_y, W_q, W_k, w_b, O_y, O_q, O_k, O_b, reset, **kwargs):
        y, offsets = fn(x, W_y, W_q, W_k, w_b, (O_y, O_q, O_k, O_b), reset, **kwargs)
        return (y, *offsets)

    return run


def _core_functions(core: str) -> tuple[Callable, Callable | None, str]:
    """(reference, Triton function or None, note) for a recurrent core; flat outputs."""
    reference = {"srwm": _flat_srwm(srwm_reference), "rdn": rdn_reference,
                 "delta_rnn": delta_rnn_reference}[core]
    try:
        if core == "srwm":
            from fwrl.kernels.triton.srwm import srwm_triton
            return reference, _flat_srwm(srwm_triton), ""
        if core == "rdn":
            from fwrl.kernels.triton.rdn import rdn_triton
            return reference, rdn_triton, ""
        from fwrl.kernels.triton.delta_rnn import delta_rnn_triton
        return reference, delta_rnn_triton, ""
    except ImportError as exc:
        return reference, None, f"Triton kernel unavailable: {exc}"


def _core_kwargs(args) -> dict:
    if args.core == "srwm":
        return dict(input_map="softmax", grad_mode=args.grad_mode)
    return dict(feature_map=args.feature_map, grad_mode=args.grad_mode)


def _core_runners(args) -> dict[str, tuple[Callable | None, str]]:
    """name -> (function(*tensors, reset) -> outputs, note) for srwm / rdn / delta_rnn."""
    kwargs = _core_kwargs(args)
    reference_fn, triton_fn, note = _core_functions(args.core)
    compiled_fn = torch.compile(reference_fn, dynamic=False)

    def in_input_dtype(fn):
        # The reference computes in one dtype: weights and states follow the inputs.
        def run(*a):
            *tensors, reset = a
            return fn(*(x.to(tensors[0].dtype) for x in tensors), reset, **kwargs)
        return run

    out: dict[str, tuple[Callable | None, str]] = {
        "reference": (in_input_dtype(reference_fn), ""),
        "compiled": (in_input_dtype(compiled_fn), ""),
        "triton": (None if triton_fn is None else (lambda *a: triton_fn(*a, **kwargs)), note),
        "fla": (None, "fla has no kernel for this recurrence"),
    }
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
    *tensors, reset = inputs

    def forward():
        with torch.no_grad():
            fn(*tensors, reset)

    leaves = [x.detach().clone().requires_grad_() for x in tensors]
    with torch.no_grad():
        shapes = [(o.shape, o.dtype) for o in fn(*tensors, reset)]
    # Random gradient for the outputs (y), ones for the final states.
    grads = [torch.randn(shapes[0][0], device=reset.device, dtype=shapes[0][1])]
    grads += [torch.ones(s, device=reset.device, dtype=dt) for s, dt in shapes[1:]]

    def forward_backward():
        outs = fn(*leaves, reset)
        torch.autograd.backward(tuple(outs), [g.to(o.dtype) for g, o in zip(grads, outs)])
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
            "tests run on CPU with: pytest tests/test_kernels_<core>.py"
        )


def _max_error(fn, inputs, args) -> float:
    """Largest |output - reference| (y and final states) against the float64 reference."""
    *tensors, reset = inputs
    with torch.no_grad():
        outs = fn(*tensors, reset)
        wide = [x.double() for x in tensors]
        if args.core == "delta_rule":
            refs = delta_rule_reference(*wide, reset, rule=args.rule,
                                        feature_map=args.feature_map, grad_mode=args.grad_mode)
        else:
            refs = _core_functions(args.core)[0](*wide, reset, **_core_kwargs(args))
    return max((o.double() - r).abs().max().item() for o, r in zip(outs, refs))


def _default_feature_map(args) -> None:
    if args.feature_map is None:
        args.feature_map = "elu1_sumnorm" if args.core == "delta_rule" else "softmax"


def run(args) -> list[dict]:
    _require_gpu()
    _default_feature_map(args)
    device = torch.device("cuda")
    dtype = DTYPES[args.dtype]
    runners = _runners(args) if args.core == "delta_rule" else _core_runners(args)
    impls = args.impls or list(IMPLEMENTATIONS)
    results = []
    for shape in args.shapes or CORE_SHAPES.get(args.core, SHAPES):
        inputs = _inputs(shape, dtype, device, core=args.core)
        reference_ms = {}
        for name in impls:
            fn, note = runners[name]
            row = dict(shape=list(shape), impl=name, core=args.core, rule=args.rule,
                       dtype=args.dtype, feature_map=args.feature_map,
                       grad_mode=args.grad_mode, note=note)
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
            if name == "reference" and "fwd_ms" in row:
                reference_ms = dict(fwd=row["fwd_ms"], fwd_bwd=row["fwd_bwd_ms"])
            if reference_ms and name != "reference" and "fwd_ms" in row:
                row["speedup_fwd"] = reference_ms["fwd"] / row["fwd_ms"]
                row["speedup_fwd_bwd"] = reference_ms["fwd_bwd"] / row["fwd_bwd_ms"]
                if name == "triton" and args.core in SPEEDUP_TARGETS:
                    row["target_speedup"] = SPEEDUP_TARGETS[args.core]
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
    if "speedup_fwd" in row:
        target = (f" (target {row['target_speedup']:.0f}x)" if "target_speedup" in row else "")
        note = (f"  vs reference: fwd {row['speedup_fwd']:.1f}x, fwd+bwd "
                f"{row['speedup_fwd_bwd']:.1f}x{target}") + note
    print(f"{head} fwd {row['fwd_ms']:8.3f} ms {row['fwd_peak_mib']:8.1f} MiB | "
          f"fwd+bwd {row['fwd_bwd_ms']:8.3f} ms {row['fwd_bwd_peak_mib']:8.1f} MiB | "
          f"first call {row['first_call_s']:6.1f} s | "
          f"max error {row.get('max_abs_error', float('nan')):.1e}{note}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point for ``fwrl bench kernels`` and ``benchmarks/kernels.py``."""
    args = _parser().parse_args(argv)
    if args.repeats < 1 or args.warmup < 0:
        raise FwrlError(f"--repeats must be >= 1 and --warmup >= 0 (got {args.repeats}, "
                        f"{args.warmup}).")
    _require_gpu()
    gpu = torch.cuda.get_device_name()
    _default_feature_map(args)
    rule = f"rule {args.rule}, " if args.core == "delta_rule" else ""
    print(f"kernel benchmark: {args.core}, {rule}feature map {args.feature_map}, "
          f"grad_mode {args.grad_mode}, inputs {args.dtype}, GPU {gpu}", flush=True)
    results = run(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(gpu=gpu, results=results), f, indent=2)
    return 0


