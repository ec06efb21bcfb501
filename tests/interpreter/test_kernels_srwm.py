"""Fused Triton SRWM against the float64 PyTorch reference (paper 002, Eq. 5-8).

Set up as ``test_kernels_delta_rule.py`` is (interpreter copy of the kernel module,
sm_90 compile-only check; shared pieces in ``kernel_harness.py``). Both paths are
tested: the whole matrix in one program's registers, and the split path of
``fused_recurrent_split`` (W^y's rows over programs), forced at small head dims with
``split_rows`` and taken on its own by SR-DeltaNet at d = 64 (Dy = 193).
"""

from __future__ import annotations

import functools

import pytest
import torch

from fwrl.errors import FwrlError
from fwrl.kernels.srwm import srwm
from fwrl.kernels.srwm.naive import srwm_reference
from kernel_harness import (
    LAUNCH_INTS,
    _interpret,  # noqa: F401  (the autouse fixture: TRITON_INTERPRET=1 in every test)
    assert_all_close,
    compile_sm90,
    load_kernel_module,
    needs_compiling_triton,
    resets,
    run_with_grads,
    skip_without_sm90_toolchain,
    stack_and_local_bytes,
)

KERNEL = "srwm"
K = load_kernel_module(KERNEL, interpret=True)
NAMES = ("y", "O_y", "O_q", "O_k", "O_b", "dx", "dW_y", "dW_q", "dW_k", "dw_b",
         "dO_y", "dO_q", "dO_k", "dO_b")


def _inputs(T, B, H, d, dy=None, *, seed=0, x_scale=1.0, offset_scale=0.3):
    """x, the slow weights (std 1/sqrt(d) as in the core) and non-zero offsets."""
    g = torch.Generator().manual_seed(seed)
    dy = d if dy is None else dy
    x = x_scale * torch.randn(T, B, H, d, generator=g, dtype=torch.float64)
    slow = [torch.randn(H, rows, d, generator=g, dtype=torch.float64) / d**0.5
            for rows in (dy, d, d, 4)]
    offsets = [offset_scale * torch.randn(B, *w.shape, generator=g, dtype=torch.float64)
               for w in slow]
    return [x, *slow, *offsets]


def _grads(inputs, seed):
    """Random output gradients for y and the four final offsets."""
    g = torch.Generator().manual_seed(seed)
    x, W_y = inputs[0], inputs[1]
    gy = torch.randn(*x.shape[:3], W_y.shape[1], generator=g, dtype=torch.float64)
    return [gy] + [torch.randn(o.shape, generator=g, dtype=torch.float64) for o in inputs[5:]]


def _run(fn, inputs, reset, grads, dtype=None, **kwargs):
    """[y, *final offsets, *input gradients] of ``fn``; inputs: x, 4 slow weights, 4 offsets."""

    def flat(x, W_y, W_q, W_k, w_b, O_y, O_q, O_k, O_b, reset, **kwargs):
        y, offsets = fn(x, W_y, W_q, W_k, w_b, (O_y, O_q, O_k, O_b), reset, **kwargs)
        return [y, *offsets]

    return run_with_grads(flat, inputs, reset, grads, dtype, **kwargs)


_assert_matches = functools.partial(assert_all_close, NAMES)


CASES = [(1, "none", "softmax"), (1, "start", "identity"), (2, "none", "identity"),
         (2, "start", "softmax"), (2, "mid", "softmax"), (2, "everywhere", "identity"),
         (17, "mid", "softmax")]


@pytest.mark.parametrize("grad_mode", ["full", "step"])
def test_matches_reference(grad_mode):
    for T, pattern, input_map in CASES:
        inputs = _inputs(T, 2, 1, 16, seed=T)
        reset = resets(T, 2, pattern)
        grads = _grads(inputs, 100 + T)
        kwargs = dict(input_map=input_map, grad_mode=grad_mode)
        ref = _run(srwm_reference, inputs, reset, grads, **kwargs)
        got = _run(K.srwm_triton, inputs, reset, grads, dtype=torch.float32, **kwargs)
        _assert_matches(ref, got, label=f"T={T} resets={pattern} {input_map}")


@pytest.mark.parametrize("grad_mode", ["full", "step"])
def test_split_path_matches_reference(grad_mode):
    """The split path forced at d = 4 with Dy = 13 (SR-DeltaNet's 3d + 1) in chunks of 4
    rows (the last chunk holds one row), over the reset patterns and input maps."""
    for T, pattern, input_map in CASES:
        inputs = _inputs(T, 2, 1, 4, 13, seed=T)
        reset = resets(T, 2, pattern)
        grads = _grads(inputs, 100 + T)
        kwargs = dict(input_map=input_map, grad_mode=grad_mode)
        ref = _run(srwm_reference, inputs, reset, grads, **kwargs)
        got = _run(K.srwm_triton, inputs, reset, grads, dtype=torch.float32, split_rows=4,
                   **kwargs)
        _assert_matches(ref, got, label=f"split T={T} resets={pattern} {input_map}")


@pytest.mark.parametrize("split_rows", [None, 4])
def test_sr_delta_net_shape_and_partial_losses(split_rows):
    """Dy = 3d + 1 (SR-DeltaNet's y-part), odd head dim, two heads; only y or only the
    final offsets in the loss. The split path at d = 5: Dy = 16, four full chunks."""
    T, d = 5, (12 if split_rows is None else 5)
    inputs = _inputs(T, 2, 2, d, 3 * d + 1, seed=3)
    reset = resets(T, 2, "mid")
    grads = _grads(inputs, 7)
    for which, g in (("outputs only", [grads[0]] + [None] * 4), ("offsets only", [None] + grads[1:])):
        ref = _run(srwm_reference, inputs, reset, g)
        got = _run(K.srwm_triton, inputs, reset, g, dtype=torch.float32, split_rows=split_rows)
        _assert_matches(ref, got, label=which)


@pytest.mark.parametrize("d,dy,grad_mode", [(32, 97, "full"), (64, 64, "full"),
                                            (64, 193, "full"), (64, 193, "step"),
                                            (40, 121, "full")])
def test_large_heads(d, dy, grad_mode):
    """SR-DeltaNet's SRWM at d = 32 (Dy = 3d + 1), the SRWM at its largest head dim, and
    SR-DeltaNet at d = 64 and 40 (the split path, taken on its own), with resets (the
    backward replays row 0 from S + O_0 at t = 1, row 1 from S at t = 2)."""
    T = 3
    inputs = _inputs(T, 2, 1, d, dy, seed=d)
    reset = torch.tensor([[False, True], [True, False], [False, True]])
    grads = _grads(inputs, d)
    expected_rows = K.SPLIT_ROWS if dy == 3 * d + 1 and d > 32 else None
    assert K._split_rows(d, dy, None) == expected_rows
    ref = _run(srwm_reference, inputs, reset, grads, grad_mode=grad_mode)
    got = _run(K.srwm_triton, inputs, reset, grads, dtype=torch.float32, grad_mode=grad_mode)
    _assert_matches(ref, got, label=f"d={d} Dy={dy} {grad_mode}")


def test_split_sequence_equals_one_call():
    T, T1 = 8, 3
    inputs = [t.float() for t in _inputs(T, 2, 2, 16, seed=8)]
    reset = resets(T, 2, "mid")
    grads = [g.float() for g in _grads(inputs, 3)]

    def loss_of(y, offsets):
        return sum((o * g).sum() for o, g in zip([y, *offsets], grads))

    leaves = [t.clone().requires_grad_() for t in inputs]
    y, offs = K.srwm_triton(leaves[0], *leaves[1:5], tuple(leaves[5:]), reset)
    whole = torch.autograd.grad(loss_of(y, offs), leaves)

    leaves2 = [t.clone().requires_grad_() for t in inputs]
    x, slow, o0 = leaves2[0], leaves2[1:5], tuple(leaves2[5:])
    y1, o1 = K.srwm_triton(x[:T1], *slow, o0, reset[:T1])
    y2, o2 = K.srwm_triton(x[T1:], *slow, o1, reset[T1:])
    split = torch.autograd.grad(loss_of(torch.cat([y1, y2]), o2), leaves2)
    torch.testing.assert_close(torch.cat([y1, y2]), y, atol=1e-6, rtol=1e-5)
    for a, b in zip(offs, o2):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5)
    for name, a, b in zip(NAMES[5:], whole, split):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("split_rows", [None, 32])
def test_reversal_rebuilds_the_initial_state(split_rows):
    """Undoing 100 self-modifications from the fp32 records gives back S + O_0 (on the
    split path: every chunk of W^y and the core rows)."""
    T = 100
    x, *rest = (t.float() for t in _inputs(T, 1, 1, 16, 3 * 16 + 1, seed=21))
    S = torch.cat(rest[:4], dim=1)
    O0 = tuple(rest[4:])
    reset = torch.zeros(T, 1, dtype=torch.bool)
    y, OT, records = K._forward(x, S, O0, reset, fmap=2, store=True, split_rows=split_rows)
    *_, rebuilt = K._backward(x, S, O0, records, OT, torch.zeros_like(y),
                              tuple(torch.zeros_like(o) for o in OT),
                              fmap=2, full=True, rebuild=True, split_rows=split_rows)
    W0 = S + torch.cat(O0, dim=2)
    assert (rebuilt - W0).abs().max() <= 1e-5 * W0.abs().max()


@pytest.mark.parametrize("split_rows", [None, 8])
def test_extreme_inputs_stay_finite(split_rows):
    """Input logits of +-80, saturated rates (sigmoid of +-80) and peaked q, k."""
    T = 6
    inputs = _inputs(T, 2, 1, 16, seed=13)
    x = inputs[0]
    x[:, 0] = 80.0 * torch.sign(x[:, 0])
    x[::2, 1] = -80.0
    w_b = inputs[4]
    w_b[0, :2] = 400.0  # beta_y, beta_q -> 1 (the softmaxed x sums to one)
    w_b[0, 2:] = -400.0  # beta_k, beta_b -> 0
    reset = resets(T, 2, "mid")
    grads = _grads(inputs, 2)
    for input_map in ("softmax", "identity"):
        ref = _run(srwm_reference, inputs, reset, grads, input_map=input_map)
        got = _run(K.srwm_triton, inputs, reset, grads, dtype=torch.float32, input_map=input_map,
                   split_rows=split_rows)
        if input_map == "softmax":
            _assert_matches(ref, got, atol=1e-4, label=input_map)
        else:  # logits of +-80 times weights: only finiteness is meaningful here
            for name, g in zip(NAMES, got):
                assert torch.isfinite(g).all(), f"{input_map}: {name} is not finite"


@pytest.mark.parametrize("dtype,split_rows", [(torch.bfloat16, None), (torch.bfloat16, 4)])
def test_low_precision_inputs(dtype, split_rows):
    """bf16 x with fp32 slow weights and state, against the reference on the same rounded x."""
    T = 5
    inputs = _inputs(T, 2, 1, 16, 10, seed=4)
    inputs[0] = inputs[0].to(dtype).double()
    reset = resets(T, 2, "mid")
    grads = _grads(inputs, 9)
    ref = _run(srwm_reference, inputs, reset, grads)
    leaves = [inputs[0].to(dtype).requires_grad_()] + [t.float().requires_grad_() for t in inputs[1:]]
    y, offs = K.srwm_triton(leaves[0], *leaves[1:5], tuple(leaves[5:]), reset,
                            split_rows=split_rows)
    assert y.dtype == dtype and all(o.dtype == torch.float32 for o in offs)
    loss = sum((o.double() * g).sum() for o, g in zip([y, *offs], grads))
    d = torch.autograd.grad(loss, leaves)
    assert d[0].dtype == dtype and all(g.dtype == torch.float32 for g in d[1:])
    got = [y, *offs, *d]
    for name, r, g in zip(NAMES, ref, got):
        # The state is fp32 from the same rounded x; y and the gradient of y
        # (hence every input gradient) are rounded to bf16 once.
        tol = dict(atol=1e-5, rtol=1e-4) if name.startswith("O_") else dict(atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(g.double(), r, **tol, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("split_rows", [None, 16])
def test_inference_path_and_determinism(split_rows):
    T = 3
    inputs = [t.float() for t in _inputs(T, 2, 1, 16, 3 * 16 + 1, seed=5)]
    reset = resets(T, 2, "mid")
    with torch.no_grad():
        y, offs = K.srwm_triton(inputs[0][:1], *inputs[1:5], tuple(inputs[5:]), reset[:1],
                                split_rows=split_rows)
        y_r, offs_r = srwm_reference(inputs[0][:1].double(), *(t.double() for t in inputs[1:5]),
                                     tuple(t.double() for t in inputs[5:]), reset[:1])
    for a, b in zip([y, *offs], [y_r, *offs_r]):
        torch.testing.assert_close(a.double(), b, atol=1e-6, rtol=1e-5)
    results = []
    for _ in range(2):
        leaves = [t.clone().requires_grad_() for t in inputs]
        y, offs = K.srwm_triton(leaves[0], *leaves[1:5], tuple(leaves[5:]), reset,
                                split_rows=split_rows)
        results.append(torch.autograd.grad(y.sum() + sum(o.square().sum() for o in offs), leaves))
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_supports_and_dispatch(monkeypatch):
    x, *slow_off = _inputs(2, 1, 1, 16)
    x, slow = x.float(), [t.float() for t in slow_off[:4]]
    assert K.supports(x, *slow) is None
    assert "input map" in K.supports(x, *slow, input_map="elu")
    assert "grad_mode" in K.supports(x, *slow, grad_mode="none")
    big = [t.float() for t in _inputs(1, 1, 1, 128)]
    assert "head_dim of at most 64" in K.supports(big[0], *big[1:5])
    assert K.supports(*[t.float() for t in _inputs(1, 1, 1, 64)][:5]) is None
    wide = [t.float() for t in _inputs(1, 1, 1, 32, 97)]  # SR-DeltaNet at d = 32
    assert K.supports(wide[0], *wide[1:5]) is None
    wider = [t.float() for t in _inputs(1, 1, 1, 64, 193)]  # SR-DeltaNet at d = 64
    assert K.supports(wider[0], *wider[1:5]) is None  # the split path
    beyond = [t.float() for t in _inputs(1, 1, 1, 65, 196)]  # SR-DeltaNet at d = 65
    assert "head_dim of at most 64" in K.supports(beyond[0], *beyond[1:5])
    assert K._split_rows(32, 97, None) is None and K._split_rows(33, 100, None) == K.SPLIT_ROWS
    with pytest.raises(ValueError, match="power of two"):
        K._split_rows(16, 49, 3)
    assert "dtype" in K.supports(x.double(), *slow)
    assert "W_q" in K.supports(x, slow[0], slow[1][:, :8], *slow[2:])
    monkeypatch.delenv("TRITON_INTERPRET")
    assert "CUDA" in K.supports(x, *slow)
    # Dispatch: CPU tensors take the CPU path under auto (the reference's values), an error under triton.
    offsets = tuple(t.float() for t in slow_off[4:])
    reset = torch.zeros(2, 1, dtype=torch.bool)
    monkeypatch.setenv("FWRL_KERNELS", "auto")
    y, _ = srwm(x, *slow, offsets, reset)
    y_r, _ = srwm_reference(x, *slow, offsets, reset)
    torch.testing.assert_close(y, y_r, rtol=1e-5, atol=1e-6)
    monkeypatch.setenv("FWRL_KERNELS", "triton")
    with pytest.raises(FwrlError, match="no Triton SRWM kernel can run"):
        srwm(x, *slow, offsets, reset)


@needs_compiling_triton
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("d,dy", [(16, 16), (16, 49), (32, 32), (32, 97), (64, 64), (64, 193)])
def test_cuda_matches_reference(d, dy, monkeypatch):
    """On a GPU: the compiled kernels at rollout-like shapes, both grad modes (SR-DeltaNet
    at d = 64, Dy = 193, on the split path)."""
    monkeypatch.delenv("TRITON_INTERPRET")
    srwm_triton = load_kernel_module(KERNEL, interpret=False).srwm_triton
    T, B, H = 51, 4, 2
    inputs = _inputs(T, B, H, d, dy, seed=d)
    reset = torch.rand(T, B, generator=torch.Generator().manual_seed(d)) < 0.1
    reset[0, 0] = True
    grads = _grads(inputs, 1)
    for grad_mode in ("full", "step"):
        ref = _run(srwm_reference, inputs, reset, grads, grad_mode=grad_mode)
        cuda_inputs = [t.cuda() for t in inputs]
        got = _run(srwm_triton, cuda_inputs, reset.cuda(), [g.cuda() for g in grads],
                   dtype=torch.float32, grad_mode=grad_mode)
        _assert_matches(ref, [g.cpu() for g in got], atol=1e-4, rtol=1e-3, label=grad_mode)


# Shipped configurations: SRWM and SR-DeltaNet at the preset head dim 16, both at
# d = 32 (SR-DeltaNet's Dy = 3d + 1 = 97), SR-DeltaNet at d = 20 (the one block
# shape, 32 x 64, that needs fewer forward warps) and the SRWM at its largest head
# dim, 64.
COMPILE_CASES = [(16, 16, "bf16"), (16, 49, "fp32"), (32, 32, "bf16"), (32, 97, "bf16"),
                 (32, 97, "fp32"), (20, 61, "bf16"), (64, 64, "bf16"), (64, 64, "fp32")]
# The integer arguments of this module's kernels (T, B, H; D, DY, NREC constant) take the values
# of the benchmark's large shape, specialised as a launch specialises them.
_compile_sm90 = functools.partial(compile_sm90, ints=LAUNCH_INTS)


@needs_compiling_triton
def test_compiles_for_sm90_without_spills():
    skip_without_sm90_toolchain()
    C = load_kernel_module(KERNEL, interpret=False)
    for d, dy, dtype in COMPILE_CASES:
        bd, by, fwd_warps, bwd_warps = C._block_sizes(d, dy)
        io = {n: f"*{dtype}" for n in ("X", "Y", "DX", "DYOUT")}
        io.update(RESET="*i8", START="*i32")
        sizes = dict(D=d, DY=dy, NREC=C._num_records(d, dy), BD=bd, BY=by, FMAP=2)
        fwd = _compile_sm90(C._forward_kernel, io, dict(sizes, STORE=True), fwd_warps)
        bwd = _compile_sm90(C._backward_kernel, io, dict(sizes, FULL=True, WRITE_REBUILT=False),
                            bwd_warps)
        for name, compiled in (("forward", fwd), ("backward", bwd)):
            stack, local = stack_and_local_bytes(compiled)
            assert stack == 0 and local == 0, (
                f"SRWM {name} kernel for d={d}, Dy={dy} ({dtype}) spills registers: "
                f"stack {stack} B, local {local} B"
            )


# The split path (fused_recurrent_split) as the dispatch takes it: SR-DeltaNet at d = 64
# (Dy = 193) and d = 40 (Dy = 121), and shapes beyond WARPS at head dims 16 and
# 32 (padded Dy of 256), with the default rows per program.
SPLIT_COMPILE_CASES = [(64, 193, "fp32"), (64, 193, "bf16"), (40, 121, "bf16"),
                       (16, 200, "fp32"), (24, 200, "bf16")]


@needs_compiling_triton
def test_split_kernels_compile_for_sm90_without_spills():
    skip_without_sm90_toolchain()
    C = load_kernel_module(KERNEL, interpret=False)
    P = C.split_forward.__globals__  # the fused_recurrent_split module of the same package copy
    for d, dy, dtype in SPLIT_COMPILE_CASES:
        rows = C._split_rows(d, dy, None)
        assert rows == C.SPLIT_ROWS, f"d={d}, Dy={dy} does not take the split path"
        bd, core_warps, y_warps = P["split_config"](d, rows)
        io = {n: f"*{dtype}" for n in ("X", "Y", "DX", "DYOUT")}
        io.update(RESET="*i8", START="*i32")
        sizes = dict(D=d, DY=dy, NREC=C._num_records(d, dy), BD=bd, FMAP=2)
        bwd = dict(FULL=True, WRITE_REBUILT=False)
        kernels = (
            ("core forward", P["_core_forward_kernel"], sizes, core_warps[0]),
            ("core backward", P["_core_backward_kernel"], dict(sizes, **bwd), core_warps[1]),
            ("W^y forward", P["_y_forward_kernel"], dict(sizes, BC=rows), y_warps[0]),
            ("W^y backward", P["_y_backward_kernel"], dict(sizes, BC=rows, **bwd), y_warps[1]),
        )
        for name, kernel, constexprs, warps in kernels:
            # the W^y backward runs one launch per chunk: its index, a run-time int
            ints = dict(LAUNCH_INTS, CHUNK=3) if "CHUNK" in kernel.arg_names else LAUNCH_INTS
            stack, local = stack_and_local_bytes(
                compile_sm90(kernel, io, constexprs, warps, ints=ints))
            assert stack == 0 and local == 0, (
                f"SRWM split {name} kernel for d={d}, Dy={dy} ({dtype}, {warps} warps) spills "
                f"registers: stack {stack} B, local {local} B"
            )
