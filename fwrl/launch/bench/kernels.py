"""Kernel benchmark: fast-weight recurrences over a rollout, reference vs fused Triton.

``--core`` picks the recurrences (repeatable, or ``all``): ``delta_rule``
(sum / delta rule, paper 001), ``gated_delta_rule`` (Gated DeltaNet, Yang et al.
2025), ``srwm`` (paper 002), ``rdn``, ``delta_rnn`` and ``delta_lstm`` (paper 000). For each core, shape (B, T, H, D; default: the
core's preset shapes, ``CORE_SHAPES``) and input dtype (``--dtype fp32 bf16``)
it times:

- ``reference``: the eager per-step PyTorch loop (each rule's ``naive``, e.g.
  ``fwrl.kernels.rdn.naive``);
- ``compiled``: the same loop through ``torch.compile`` (compile time reported
  separately, as the first call, not in the timings);
- ``triton``: the fused kernel (``fwrl.kernels.<core>.fused_recurrent``), called
  directly (never through dispatch, so it cannot fall back unnoticed); for
  the delta rule and the gated delta rule once per ``--split`` (programs per (batch, head): 1, 2, 4, 8
  or auto); with ``--maxnreg N [N ...]``, once per register cap too (every
  launch of the row, forward and backward, at most N registers per thread:
  ``fwrl.kernels.triton.common.register_cap``; 255: the default), labelled
  ``triton[maxnreg=N]`` or ``triton[split=S,maxnreg=N]``, the row's ``maxnreg`` field N;
- ``fla_recurrent`` and ``fla_chunk`` (delta rule only, when ``fla`` is
  importable): fla-core's ``fused_recurrent_delta_rule`` and
  ``chunk_delta_rule`` (scale 1; chunk takes bf16 only). Episode ends become
  variable-length sequences (``cu_seqlens``; the segment boundaries are found
  on the host before timing), with W0 as the initial state of each row's first
  segment and zero for the others, so they compute the same recurrence; the
  feature maps, the sigmoid and the layout changes run in PyTorch inside the
  timed region (the fused kernel does them itself).

``forward`` runs without autograd (the acting path); ``fwd+bwd`` runs the
forward with inputs requiring grad, then the backward with gradients for the
outputs and the final states (the learner's path). On a GPU, times are medians
of CUDA event timings and memory is the peak allocated during the call beyond
what was allocated before it; ``max error`` compares outputs and final states
with the float64 reference on the same inputs. Each row also gives the
speed-up over the eager reference (for the recurrent cores with the issue's
H100 target: SRWM and Delta RNN 30x, RDN 10x).

``--dry-run`` runs every selected core once at a tiny shape on the CPU (wall
clock, no memory figures): the reference, and the Triton path when the
process was started with ``TRITON_INTERPRET=1`` (the kernels then run in
Triton's interpreter); CI uses it to keep the benchmark from rotting.

Run ``fwrl bench kernels [--core all] [--dtype fp32 bf16] [--split 1 2 auto]
[--maxnreg 255 128] [--json-path PATH]`` (or ``python benchmarks/kernels.py ...``
from the repository root; both call :func:`main`). Timing needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from types import ModuleType

import torch
from torch import Tensor

from fwrl.errors import FwrlError, install_command
from fwrl.kernels.delta_lstm.naive import delta_lstm_reference
from fwrl.kernels.delta_rnn.naive import delta_rnn_reference
from fwrl.kernels.delta_rule.naive import delta_rule_reference
from fwrl.kernels.dispatch import kernel_inputs
from fwrl.kernels.feature_maps import apply_feature_map
from fwrl.kernels.gated_delta_rule.naive import gated_delta_rule_reference
from fwrl.kernels.rdn.naive import rdn_reference
from fwrl.kernels.srwm.naive import srwm_reference

CORES = ("delta_rule", "gated_delta_rule", "srwm", "rdn", "delta_rnn", "delta_lstm", "sr_delta_net")
# The rule of each core where it is not the core's own name: SR-DeltaNet's
# self-referential matrix is the SRWM recurrence with Dy = 3d + 1 output rows (its
# Delta Net layer's q, k, v, beta), which above d = 32 takes the split path.
RULES = {"sr_delta_net": "srwm"}
# Preset shapes (B, T, H, D) per core: rollouts of T = unroll + 1 for a learner
# batch B. Delta rule: Linear Transformer / Delta Net (Atari 4 x 32, ProcGen
# 8 x 16, and a large 8 x 64); SRWM: ProcGen, 8 heads of 16; RDN / Delta RNN:
# Atari 4 x 32 and the larger 8 x 32; Delta LSTM: 4 x 32 (FWPConfig defaults);
# SR-DeltaNet: ProcGen, 8 heads of 16 (the SRWM family's defaults). The gated delta rule: the delta
# rule's shapes (its goal is a time against the delta rule's at the same shape).
CORE_SHAPES = {
    "delta_rule": ((32, 51, 4, 32), (32, 51, 8, 16), (256, 101, 8, 64)),
    "gated_delta_rule": ((32, 51, 4, 32), (32, 51, 8, 16), (256, 101, 8, 64)),
    "srwm": ((32, 51, 8, 16), (256, 101, 8, 16)),
    "rdn": ((32, 51, 4, 32), (256, 101, 8, 32)),
    "delta_rnn": ((32, 51, 4, 32), (256, 101, 8, 32)),
    "delta_lstm": ((32, 51, 4, 32), (256, 101, 4, 32)),
    "sr_delta_net": ((32, 51, 8, 16), (256, 101, 8, 16)),
}
DRY_RUN_SHAPE = (2, 3, 1, 8)
# Speed-up of the fused kernel over the eager reference the issue asks for (H100).
SPEEDUP_TARGETS = {"srwm": 30.0, "rdn": 10.0, "delta_rnn": 30.0}
IMPLEMENTATIONS = ("reference", "compiled", "triton", "fla_recurrent", "fla_chunk")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
SPLITS = ("auto", "1", "2", "4", "8")
# Registers per thread --maxnreg takes (fwrl.kernels.triton.common.REGISTER_CAP_RANGE,
# not imported here: the benchmark parses its arguments without Triton).
MAXNREG_RANGE = (24, 255)
# Fraction of (t, b) entries that start a new episode (resets inside the rollout).
RESET_RATE = 0.02

Runner = Callable[..., tuple[Tensor, ...]]


def _parse_shape(text: str) -> tuple[int, int, int, int]:
    try:
        shape = tuple(int(x) for x in text.split(","))
    except ValueError:
        shape = ()
    if len(shape) != 4 or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"shape {text!r} is not B,T,H,D (four positive ints)")
    return shape  # type: ignore[return-value]


def _parse_maxnreg(text: str) -> int:
    low, high = MAXNREG_RANGE
    try:
        n = int(text)
    except ValueError:
        n = None
    if n is None or not low <= n <= high:
        raise argparse.ArgumentTypeError(
            f"register cap {text!r} is not an int in [{low}, {high}] (registers per thread, "
            "e.g. 64 96 128 168 255; 255 is the default)")
    return n


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are FwrlError: ``fwrl: error: ...`` and exit status 2, as every fwrl command."""

    def error(self, message: str):
        raise FwrlError(f"{message} (see {self.prog} --help)")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="fwrl bench kernels", description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--core", choices=(*CORES, "all"), nargs="+", default=["delta_rule"],
                   help="recurrences to time (default: delta_rule; all: every one)")
    p.add_argument("--shape", type=_parse_shape, action="append", dest="shapes",
                   help="B,T,H,D (repeatable); default: the core's preset shapes: " +
                   "; ".join(f"{c}: " + " ".join(",".join(map(str, s)) for s in shapes)
                             for c, shapes in CORE_SHAPES.items()))
    p.add_argument("--rule", choices=("delta", "sum"), default="delta", help="delta_rule only")
    p.add_argument("--feature-map", choices=("elu1_sumnorm", "softmax", "l2norm"), default=None,
                   help="phi of q, k (default: elu1_sumnorm for delta_rule, l2norm for "
                   "gated_delta_rule, softmax for rdn and delta_rnn; SRWM and Delta LSTM always use "
                   "softmax; l2norm: gated_delta_rule only)")
    p.add_argument("--grad-mode", choices=("full", "step"), default="full")
    p.add_argument("--dtype", choices=tuple(DTYPES), nargs="+", default=["fp32", "bf16"],
                   help="dtypes of the per-step inputs (the state is always fp32); "
                   "default: fp32 bf16")
    p.add_argument("--split", choices=SPLITS, nargs="+", default=["auto"],
                   help="delta_rule's and gated_delta_rule's Triton kernels: programs per (batch, "
                   "head), each owning a block of W's rows; one timed row per value (default: auto)")
    p.add_argument("--maxnreg", type=_parse_maxnreg, nargs="+", metavar="N",
                   help=f"Triton rows: time the fused kernel once per register cap N (an int in "
                   f"[{MAXNREG_RANGE[0]}, {MAXNREG_RANGE[1]}]: every launch at most N registers "
                   "per thread, e.g. 128 for two 8-warp programs per SM; 255 is the default), "
                   "labelled triton[maxnreg=N] or triton[split=S,maxnreg=N] (default: no cap, "
                   "rows labelled triton or triton[split=S])")
    p.add_argument("--impl", choices=IMPLEMENTATIONS, action="append", dest="impls",
                   help="implementations to run (repeatable); default: all available "
                   "(--dry-run: reference and triton)")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--dry-run", action="store_true",
                   help=f"tiny shape {','.join(map(str, DRY_RUN_SHAPE))} on the CPU, one "
                   "repeat: checks that the benchmark runs (Triton through its interpreter "
                   "when started with TRITON_INTERPRET=1)")
    p.add_argument("--json-path", "--json", dest="json_path", metavar="PATH",
                   help="also write the results as JSON (--json: its old name, deprecated)")
    return p



# --------------------------------------------------------------------------- inputs


def _inputs(core: str, shape, dtype: torch.dtype, device, seed: int = 0) -> tuple[Tensor, ...]:
    """(*tensors, reset) for ``core``: per-step inputs in ``dtype``, weights and states fp32."""
    B, T, H, D = shape
    g = torch.Generator(device=device).manual_seed(seed)

    def randn(*size, scale=1.0, dt=torch.float32):
        return (scale * torch.randn(*size, generator=g, device=device)).to(dt)

    def zeros(*size):
        return torch.zeros(*size, device=device)

    if core == "delta_rule":  # q, k, v, beta, W0
        tensors = (randn(T, B, H, D, dt=dtype), randn(T, B, H, D, dt=dtype),
                   randn(T, B, H, D, dt=dtype), randn(T, B, H, dt=dtype),
                   randn(B, H, D, D, scale=0.1))
    elif core == "gated_delta_rule":  # q, k, v, beta, g (log-decays -softplus(N(0, 1))), S0
        tensors = (randn(T, B, H, D, dt=dtype), randn(T, B, H, D, dt=dtype),
                   randn(T, B, H, D, dt=dtype), randn(T, B, H, dt=dtype),
                   (-torch.nn.functional.softplus(randn(T, B, H))).to(dtype), randn(B, H, D, D, scale=0.1))
    elif core in ("srwm", "sr_delta_net"):  # x, W_y, W_q, W_k, w_b (std 1/sqrt(D)), zero offsets
        dy = D if core == "srwm" else 3 * D + 1
        slow = tuple(randn(H, rows, D, scale=D**-0.5) for rows in (dy, D, D, 4))
        tensors = (randn(T, B, H, D, dt=dtype), *slow, *(zeros(B, *w.shape) for w in slow))
    elif core == "rdn":  # xq, xk, xv, xb, Rq, Rk, Rv, rb, W0, h0
        tensors = (*(randn(T, B, H, D, dt=dtype) for _ in range(3)), randn(T, B, H, dt=dtype),
                   *(randn(H, D, D, scale=D**-0.5) for _ in range(3)), randn(H, D, scale=D**-0.5),
                   zeros(B, H, D, D), zeros(B, H, D))
    elif core == "delta_rnn":  # q, k, v, beta, kr, vr, betar, W0, R0, h0
        tensors = (*(randn(T, B, H, D, dt=dtype) for _ in range(3)), randn(T, B, H, dt=dtype),
                   randn(T, B, H, D, dt=dtype), randn(T, B, H, D, dt=dtype),
                   randn(T, B, H, dt=dtype), zeros(B, H, D, D), zeros(B, H, D, D), zeros(B, H, D))
    else:  # delta_lstm: q, k, v, beta, W0, c0, y0
        tensors = (randn(T, B, H, D, dt=dtype), randn(T, B, H, 6, D, dt=dtype),
                   randn(T, B, H, 6, D, dt=dtype), randn(T, B, H, 6, dt=dtype),
                   zeros(B, H, 6, D, D), zeros(B, H, D), zeros(B, H, D))
    reset = torch.rand(T, B, generator=g, device=device) < RESET_RATE
    return (*tensors, reset)


# --------------------------------------------------------------------------- implementations


def _flat_srwm(fn: Callable) -> Runner:
    """SRWM functions return (y, (O_y, O_q, O_k, O_b)): flatten to (y, O_y, ...)."""
    def run(x, W_y, W_q, W_k, w_b, O_y, O_q, O_k, O_b, reset, **kwargs):
        y, offsets = fn(x, W_y, W_q, W_k, w_b, (O_y, O_q, O_k, O_b), reset, **kwargs)
        return (y, *offsets)

    return run


REFERENCES: dict[str, Callable] = {
    "delta_rule": delta_rule_reference, "gated_delta_rule": gated_delta_rule_reference,
    "srwm": _flat_srwm(srwm_reference),
    "rdn": rdn_reference, "delta_rnn": delta_rnn_reference, "delta_lstm": delta_lstm_reference,
    "sr_delta_net": _flat_srwm(srwm_reference),
}


def _core_kwargs(core: str, args) -> dict:
    if core == "delta_rule":
        return dict(rule=args.rule, feature_map=_feature_map(core, args), grad_mode=args.grad_mode)
    if core == "gated_delta_rule":
        return dict(feature_map=_feature_map(core, args), grad_mode=args.grad_mode)
    if core in ("srwm", "sr_delta_net"):
        return dict(input_map="softmax", grad_mode=args.grad_mode)
    if core == "delta_lstm":
        return dict(grad_mode=args.grad_mode)
    return dict(feature_map=_feature_map(core, args), grad_mode=args.grad_mode)


def _feature_map(core: str, args) -> str:
    if args.feature_map is not None:
        if args.feature_map == "l2norm" and core != "gated_delta_rule":
            raise FwrlError(f"--feature-map l2norm is gated_delta_rule's only; {core} takes elu1_sumnorm or softmax")
        return args.feature_map
    return {"delta_rule": "elu1_sumnorm", "gated_delta_rule": "l2norm"}.get(core, "softmax")


def _in_input_dtype(fn: Callable, kwargs: dict) -> Runner:
    """The reference computes in one dtype: weights and states follow the inputs."""
    def run(*a):
        *tensors, reset = a
        return tuple(fn(*(x.to(tensors[0].dtype) for x in tensors), reset, **kwargs))

    return run


def _triton_runners(core: str, args, inputs) -> dict[str, tuple[Runner | None, str, dict]]:
    """name -> (runner, note, extra row fields) for the fused kernel (one per split for
    the delta rule, each once per --maxnreg cap); runner None where the kernel cannot run
    (the note says why)."""
    runners = _uncapped_triton_runners(core, args, inputs)
    if not args.maxnreg:
        return runners
    return {_capped(name, cap): (fn, note, dict(extra, maxnreg=cap))
            for name, (fn, note, extra) in runners.items()
            for cap in dict.fromkeys(args.maxnreg)}


def _capped(name: str, cap: int) -> str:
    """``triton`` -> ``triton[maxnreg=128]``, ``triton[split=2]`` ->
    ``triton[split=2,maxnreg=128]``."""
    label = f"maxnreg={cap}"
    return f"{name[:-1]},{label}]" if name.endswith("]") else f"{name}[{label}]"


def _register_cap(cap: int | None):
    """The context that caps the registers of the fused kernels' launches at ``cap``."""
    if cap is None:
        return contextlib.nullcontext()
    from fwrl.kernels.triton.common import register_cap

    return register_cap(cap)


def _fused(kernel: str) -> tuple[ModuleType, Runner]:
    """The fused module of rule ``kernel`` (``fwrl.kernels.<kernel>.fused_recurrent``) and its
    kernel, with flat outputs; importing it imports Triton (ImportError without it)."""
    if kernel == "delta_rule":
        import fwrl.kernels.delta_rule.fused_recurrent as fused

        return fused, fused.delta_rule_triton
    if kernel == "gated_delta_rule":
        import fwrl.kernels.gated_delta_rule.fused_recurrent as fused

        return fused, fused.gated_delta_rule_triton
    if kernel == "srwm":
        import fwrl.kernels.srwm.fused_recurrent as fused

        return fused, _flat_srwm(fused.srwm_triton)
    if kernel == "rdn":
        import fwrl.kernels.rdn.fused_recurrent as fused

        return fused, fused.rdn_triton
    if kernel == "delta_rnn":
        import fwrl.kernels.delta_rnn.fused_recurrent as fused

        return fused, fused.delta_rnn_triton
    import fwrl.kernels.delta_lstm.fused_recurrent as fused

    return fused, fused.delta_lstm_triton


def _uncapped_triton_runners(core: str, args,
                             inputs) -> dict[str, tuple[Runner | None, str, dict]]:
    kwargs = _core_kwargs(core, args)
    kernel = RULES.get(core, core)
    try:
        module, fn = _fused(kernel)
    except ImportError as exc:
        return {"triton": (None, f"Triton kernel unavailable ({exc}); install Triton with: "
                                 f"{install_command('kernels')}", {})}
    *tensors, reset = inputs
    # the call's arguments as the reference takes them (the SRWM's four offsets as one tuple)
    arguments = (*tensors[:5], tuple(tensors[5:9])) if kernel == "srwm" else tuple(tensors)
    reference = {"delta_rule": delta_rule_reference, "gated_delta_rule": gated_delta_rule_reference,
                 "srwm": srwm_reference, "rdn": rdn_reference, "delta_rnn": delta_rnn_reference,
                 "delta_lstm": delta_lstm_reference}[kernel]
    reason = module.supports(kernel_inputs(reference, (*arguments, reset), kwargs))
    if reason is not None:
        return {"triton": (None, f"the kernel cannot run here: {reason}", {})}
    if core not in ("delta_rule", "gated_delta_rule"):
        return {"triton": (lambda *a: tuple(fn(*a, **kwargs)), "", {})}
    runners = {}
    for split in args.split:
        value = split if split == "auto" else int(split)
        n = module.choose_split(value, tensors[0].shape[1] * tensors[0].shape[2],
                                tensors[2].shape[-1], tensors[0].device)
        runners[f"triton[split={split}]"] = (
            lambda *a, value=value: tuple(fn(*a, split=value, **kwargs)), "",
            dict(split=split, programs_per_head=n))
    return runners


def _segments(reset: Tensor) -> tuple[list[int], list[int], list[int], list[int]]:
    """Episode segments of the rows, batch-major, for fla's variable-length inputs: lengths,
    the index of each row's first segment (W0 as its initial state, unless reset at 0), the
    rows whose first segment starts from W0, and the index of each row's last segment."""
    T, B = reset.shape
    r = reset.cpu()
    lengths, first, from_w0, last = [], [], [], []
    for b in range(B):
        starts = [0] + [t for t in range(1, T) if r[t, b]] + [T]
        first.append(len(lengths))
        if not r[0, b]:
            from_w0.append(b)
        lengths += [e - s for s, e in zip(starts, starts[1:])]
        last.append(len(lengths) - 1)
    return lengths, first, from_w0, last


def _fla_runners(args, inputs, dtype) -> dict[str, tuple[Runner | None, str, dict]]:
    """fla-core's delta-rule kernels wrapped to our layout and resets (see the docstring)."""
    names = ("fla_recurrent", "fla_chunk")
    if args.rule != "delta":
        return {n: (None, "fla has no sum-rule recurrence here", {}) for n in names}
    try:
        from fla.ops.delta_rule import chunk_delta_rule, fused_recurrent_delta_rule
    except ImportError as exc:
        return {n: (None, f"fla not importable ({exc})", {}) for n in names}
    feature_map = _feature_map("delta_rule", args)
    *_, reset = inputs
    lengths, first, from_w0, last = _segments(reset)  # host work, before timing
    device = reset.device
    cu_seqlens = torch.tensor([0, *lengths], device=device).cumsum(0)
    w0_rows = torch.tensor(from_w0, device=device, dtype=torch.long)
    w0_slots = torch.tensor([first[b] for b in from_w0], device=device, dtype=torch.long)
    last_slots = torch.tensor(last, device=device, dtype=torch.long)

    def wrap(fla_fn):
        def run(q, k, v, beta, W0, reset):
            T, B, H, _ = q.shape
            q, k = apply_feature_map(feature_map, q), apply_feature_map(feature_map, k)

            def flat(x):  # [T, B, H, ...] -> [1, B*T, H, ...]
                return x.transpose(0, 1).reshape(1, B * T, *x.shape[2:])

            h0 = W0.new_zeros(len(lengths), H, W0.shape[-1], W0.shape[-2], dtype=q.dtype)
            h0[w0_slots] = W0[w0_rows].transpose(-1, -2).to(q.dtype)
            y, hT = fla_fn(flat(q), flat(k), flat(v), flat(torch.sigmoid(beta)), scale=1.0,
                           initial_state=h0, output_final_state=True, cu_seqlens=cu_seqlens)
            return y.view(B, T, *y.shape[2:]).transpose(0, 1), hT[last_slots].transpose(-1, -2)

        return run

    out = {"fla_recurrent": (wrap(fused_recurrent_delta_rule), "", {})}
    out["fla_chunk"] = ((None, "fla's chunk_delta_rule takes bf16 only", {})
                        if dtype == torch.float32 else (wrap(chunk_delta_rule), "", {}))
    return out


def _runners(core: str, args, inputs, dtype) -> dict[str, tuple[Runner | None, str, dict]]:
    kwargs = _core_kwargs(core, args)
    reference = REFERENCES[core]
    out: dict[str, tuple[Runner | None, str, dict]] = {
        "reference": (_in_input_dtype(reference, kwargs), "", {}),
    }
    if "compiled" in args.impls:
        out["compiled"] = (_in_input_dtype(torch.compile(reference, dynamic=False), kwargs), "",
                           {})
    if "triton" in args.impls:
        out.update(_triton_runners(core, args, inputs))
    if core == "delta_rule" and {"fla_recurrent", "fla_chunk"} & set(args.impls):
        out.update({k: v for k, v in _fla_runners(args, inputs, dtype).items()
                    if k in args.impls})
    return out


# --------------------------------------------------------------------------- timing


def _measure(step: Callable[[], None], warmup: int, repeats: int,
             device: torch.device) -> tuple[float, float | None]:
    """(median milliseconds, peak extra MiB or None off CUDA) of ``step``."""
    for _ in range(warmup):
        step()
    if device.type != "cuda":
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            step()
            times.append(1e3 * (time.perf_counter() - t0))
        return statistics.median(times), None
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
    return statistics.median(times), (torch.cuda.max_memory_allocated() - base) / 2**20


def _bench_one(fn: Runner, inputs, args, device) -> dict:
    *tensors, reset = inputs

    def forward():
        with torch.no_grad():
            fn(*tensors, reset)

    leaves = [x.detach().clone().requires_grad_() for x in tensors]
    with torch.no_grad():
        outs = fn(*tensors, reset)
    g = torch.Generator(device=device).manual_seed(1)
    # Random gradient for the outputs (y), ones for the final states.
    grads = [torch.randn(outs[0].shape, generator=g, device=device).to(outs[0].dtype)]
    grads += [torch.ones_like(o) for o in outs[1:]]

    def forward_backward():
        result = fn(*leaves, reset)
        torch.autograd.backward(tuple(result), [gr.to(o.dtype) for gr, o in zip(grads, result)])
        for x in leaves:
            x.grad = None

    t0 = time.perf_counter()
    forward_backward()  # first call: compilation / autotuning
    if device.type == "cuda":
        torch.cuda.synchronize()
    first_s = time.perf_counter() - t0
    fwd_ms, fwd_mem = _measure(forward, args.warmup, args.repeats, device)
    fb_ms, fb_mem = _measure(forward_backward, args.warmup, args.repeats, device)
    return dict(first_call_s=first_s, fwd_ms=fwd_ms, fwd_peak_mib=fwd_mem,
                fwd_bwd_ms=fb_ms, fwd_bwd_peak_mib=fb_mem)


def _max_error(core: str, fn: Runner, inputs, args) -> float:
    """Largest |output - reference| (y and final states) against the float64 reference."""
    *tensors, reset = inputs
    with torch.no_grad():
        outs = fn(*tensors, reset)
        refs = REFERENCES[core](*(x.double() for x in tensors), reset, **_core_kwargs(core, args))
    return max((o.double() - r).abs().max().item() for o, r in zip(outs, refs))


def _require_gpu() -> None:
    if not torch.cuda.is_available():
        raise FwrlError(
            "the kernel benchmark needs a CUDA GPU (it times GPU kernels), and PyTorch sees "
            "none here. Run it on a machine with an NVIDIA GPU, or check that it runs with "
            "--dry-run (tiny shapes on the CPU); the kernels' correctness tests run on CPU "
            "with: pytest tests/interpreter/test_kernels_<core>.py"
        )


def _cores(args) -> list[str]:
    return list(CORES) if "all" in args.core else list(dict.fromkeys(args.core))


def run(args: argparse.Namespace) -> list[dict]:
    """Time every selected core, shape, dtype and implementation; one dict per row."""
    if args.dry_run:
        device = torch.device("cpu")
        args.impls = args.impls or ["reference", "triton"]
        args.repeats, args.warmup = 1, 0
    else:
        _require_gpu()
        device = torch.device("cuda")
        args.impls = args.impls or list(IMPLEMENTATIONS)
    results = []
    for core in _cores(args):
        shapes = [DRY_RUN_SHAPE] if args.dry_run else (args.shapes or CORE_SHAPES[core])
        for dtype_name in args.dtype:
            dtype = DTYPES[dtype_name]
            for shape in shapes:
                results += _bench_shape(core, shape, dtype_name, dtype, device, args)
    return results


def _bench_shape(core, shape, dtype_name, dtype, device, args) -> list[dict]:
    inputs = _inputs(core, shape, dtype, device)
    rows, reference_ms = [], {}
    for name, (fn, note, extra) in _runners(core, args, inputs, dtype).items():
        row = dict(core=core, shape=list(shape), impl=name, dtype=dtype_name, note=note,
                   **extra, **_core_kwargs(core, args))
        if fn is None:
            row["skipped"] = note
        else:
            try:
                # The cap covers the backward too (autograd launches it outside fn).
                with _register_cap(extra.get("maxnreg")):
                    row["max_abs_error"] = _max_error(core, fn, inputs, args)
                    row.update(_bench_one(fn, inputs, args, device))
            except torch.cuda.OutOfMemoryError:
                torch.cuda.empty_cache()
                row["skipped"] = "out of GPU memory"
            except TypeError as exc:
                if not name.startswith("fla"):
                    raise
                row["skipped"] = f"this fla version has another signature: {exc}"
        if name == "reference" and "fwd_ms" in row:
            reference_ms = dict(fwd=row["fwd_ms"], fwd_bwd=row["fwd_bwd_ms"])
        if reference_ms and name != "reference" and "fwd_ms" in row:
            row["speedup_fwd"] = reference_ms["fwd"] / row["fwd_ms"]
            row["speedup_fwd_bwd"] = reference_ms["fwd_bwd"] / row["fwd_bwd_ms"]
            if name.startswith("triton") and core in SPEEDUP_TARGETS:
                row["target_speedup"] = SPEEDUP_TARGETS[core]
        rows.append(row)
        _print_row(row)
    return rows


def _mib(value: float | None) -> str:
    return "     n/a" if value is None else f"{value:8.1f}"


def _print_row(row: dict) -> None:
    B, T, H, D = row["shape"]
    head = (f"{row['core']:<10s} {row['dtype']:<4s} B={B:<4d} T={T:<4d} H={H:<2d} D={D:<4d} "
            f"{row['impl']:<18s}")
    if "skipped" in row:
        print(f"{head} skipped: {row['skipped']}", flush=True)
        return
    note = f"  ({row['note']})" if row["note"] else ""
    if "speedup_fwd" in row:
        target = (f" (target {row['target_speedup']:.0f}x)" if "target_speedup" in row else "")
        note = (f"  vs reference: fwd {row['speedup_fwd']:.1f}x, fwd+bwd "
                f"{row['speedup_fwd_bwd']:.1f}x{target}") + note
    print(f"{head} fwd {row['fwd_ms']:8.3f} ms {_mib(row['fwd_peak_mib'])} MiB | "
          f"fwd+bwd {row['fwd_bwd_ms']:8.3f} ms {_mib(row['fwd_bwd_peak_mib'])} MiB | "
          f"first call {row['first_call_s']:6.1f} s | "
          f"max error {row.get('max_abs_error', math.nan):.1e}{note}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point for ``fwrl bench kernels`` and ``benchmarks/kernels.py``."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _parser().parse_args(argv)
    if any(a == "--json" or a.startswith("--json=") for a in argv):
        print("fwrl bench kernels: --json is deprecated, use --json-path (the name of every fwrl bench)",
              file=sys.stderr)
    if args.repeats < 1 or args.warmup < 0:
        raise FwrlError(f"--repeats must be >= 1 and --warmup >= 0 (got {args.repeats}, "
                        f"{args.warmup}).")
    if args.dry_run:
        device_name = "cpu (dry run)"
    else:
        _require_gpu()
        device_name = torch.cuda.get_device_name()
    rule = f", rule {args.rule}" if "delta_rule" in _cores(args) else ""
    print(f"kernel benchmark: {', '.join(_cores(args))}{rule}, grad_mode {args.grad_mode}, "
          f"inputs {' '.join(args.dtype)}, device {device_name}", flush=True)
    results = run(args)
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(dict(device=device_name, results=results), f, indent=2)
    return 0
