"""Fused Triton Recurrent Delta Net against the float64 PyTorch reference (paper 000 Eq. 15-18).

Set up as ``test_kernels_delta_rule.py`` is (interpreter copy of the kernel module,
sm_90 compile-only check; shared pieces in ``kernel_harness.py``).
"""

from __future__ import annotations

import functools

import pytest
import torch

from fwrl.errors import FwrlError
from fwrl.kernels.rdn import rdn
from fwrl.kernels.rdn.naive import rdn_reference
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

KERNEL = "rdn"
K = load_kernel_module(KERNEL, interpret=True)
NAMES = ("y", "W_T", "h_T", "dxq", "dxk", "dxv", "dxb", "dRq", "dRk", "dRv", "drb", "dW0", "dh0")


def _inputs(T, B, H, d, *, seed=0):
    g = torch.Generator().manual_seed(seed)

    def randn(*shape, scale=1.0):
        return scale * torch.randn(*shape, generator=g, dtype=torch.float64)

    return [randn(T, B, H, d), randn(T, B, H, d), randn(T, B, H, d), randn(T, B, H),
            randn(H, d, d, scale=d**-0.5), randn(H, d, d, scale=d**-0.5),
            randn(H, d, d, scale=d**-0.5), randn(H, d, scale=d**-0.5),
            randn(B, H, d, d, scale=0.5), randn(B, H, d)]


def _grads(inputs, seed):
    g = torch.Generator().manual_seed(seed)
    xq, W0, h0 = inputs[0], inputs[8], inputs[9]
    return [torch.randn(t.shape, generator=g, dtype=torch.float64) for t in (xq, W0, h0)]


_run = run_with_grads
_assert_matches = functools.partial(assert_all_close, NAMES)


CASES = [(1, "none", "softmax"), (1, "start", "elu1_sumnorm"), (2, "none", "identity"),
         (2, "start", "softmax"), (2, "mid", "elu1_sumnorm"), (2, "everywhere", "softmax"),
         (17, "mid", "softmax")]


@pytest.mark.parametrize("grad_mode", ["full", "step"])
def test_matches_reference(grad_mode):
    for T, pattern, feature_map in CASES:
        inputs = _inputs(T, 2, 2, 16, seed=T)
        if feature_map == "identity":  # keep |k|^2 small: the delta rule is then contractive
            inputs[1] = 0.2 * inputs[1]
        reset = resets(T, 2, pattern)
        grads = _grads(inputs, 100 + T)
        kwargs = dict(feature_map=feature_map, grad_mode=grad_mode)
        ref = _run(rdn_reference, inputs, reset, grads, **kwargs)
        got = _run(K.rdn_triton, inputs, reset, grads, dtype=torch.float32, **kwargs)
        _assert_matches(ref, got, label=f"T={T} resets={pattern} {feature_map}")


def test_odd_head_dim_and_partial_losses():
    T = 5
    inputs = _inputs(T, 2, 1, 12, seed=3)
    reset = resets(T, 2, "mid")
    gy, gW, gh = _grads(inputs, 7)
    for which, grads in (("y only", [gy, None, None]), ("state only", [None, gW, gh])):
        ref = _run(rdn_reference, inputs, reset, grads)
        got = _run(K.rdn_triton, inputs, reset, grads, dtype=torch.float32)
        _assert_matches(ref, got, label=which)


def test_head_dim_64():
    """The largest supported head dim (registers laid out for d = 64), with a reset at t = 1
    (the backward replays the one-step segment before it)."""
    T = 3
    inputs = _inputs(T, 1, 1, 64, seed=64)
    reset = torch.tensor([[False], [True], [False]])
    grads = _grads(inputs, 64)
    ref = _run(rdn_reference, inputs, reset, grads)
    got = _run(K.rdn_triton, inputs, reset, grads, dtype=torch.float32)
    _assert_matches(ref, got, label="d=64")


def test_rebuilt_s_in_chunks(monkeypatch):
    """With y in fp32, s_t is not recorded: the dR GEMM rebuilds it from y (h_0 at t = 0,
    zero after a reset) one chunk at a time. Chunks of one and of three steps (the last one
    short) give the reference's gradients, and the records hold 2d + 1 floats per step."""
    T, d = 7, 16
    inputs = _inputs(T, 2, 2, d, seed=5)
    reset = resets(T, 2, "mid")
    grads = _grads(inputs, 9)
    ref = _run(rdn_reference, inputs, reset, grads)
    step_bytes = 2 * 2 * d * 4
    for steps in (1, 3):
        monkeypatch.setattr(K, "S_CHUNK_BYTES", steps * step_bytes)
        got = _run(K.rdn_triton, inputs, reset, grads, dtype=torch.float32)
        _assert_matches(ref, got, label=f"chunks of {steps} steps")
    f32 = [t.float() for t in inputs]
    *_, (_, _, rec) = K._forward(*f32, reset, fmap=2, store=True)
    assert rec.shape == (T, 2, 2, 2 * d + 1)
    bf16 = [t.bfloat16() if t.dim() >= 3 and t.shape[0] == T else t.float() for t in inputs]
    *_, (_, _, rec) = K._forward(*bf16, reset, fmap=2, store=True)
    assert rec.shape == (T, 2, 2, 3 * d + 1), "a bf16 y is rounded: s is recorded"


def test_split_sequence_equals_one_call():
    T, T1 = 8, 3
    inputs = [t.float() for t in _inputs(T, 2, 2, 16, seed=8)]
    reset = resets(T, 2, "mid")
    grads = [g.float() for g in _grads(inputs, 3)]

    def loss_of(outs):
        return sum((o * g).sum() for o, g in zip(outs, grads))

    leaves = [t.clone().requires_grad_() for t in inputs]
    outs = K.rdn_triton(*leaves, reset)
    whole = torch.autograd.grad(loss_of(outs), leaves)
    leaves2 = [t.clone().requires_grad_() for t in inputs]
    x, R, (W0, h0) = leaves2[:4], leaves2[4:8], leaves2[8:]
    y1, W1, h1 = K.rdn_triton(*(t[:T1] for t in x), *R, W0, h0, reset[:T1])
    y2, W2, h2 = K.rdn_triton(*(t[T1:] for t in x), *R, W1, h1, reset[T1:])
    split = torch.autograd.grad(loss_of((torch.cat([y1, y2]), W2, h2)), leaves2)
    torch.testing.assert_close(torch.cat([y1, y2]), outs[0], atol=0, rtol=0)
    torch.testing.assert_close(W2, outs[1], atol=0, rtol=0)
    for name, a, b in zip(NAMES[3:], whole, split):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5, msg=lambda m: f"{name}: {m}")


def test_reversal_rebuilds_the_initial_state():
    """Undoing 100 updates from the fp32 records gives back W0 (relative 1e-5)."""
    T = 100
    inputs = [t.float() for t in _inputs(T, 1, 1, 16, seed=21)]
    reset = torch.zeros(T, 1, dtype=torch.bool)
    y, WT, hT, records = K._forward(*inputs, reset, fmap=2, store=True)
    *_, rebuilt = K._backward(*inputs, records, WT, y, torch.zeros_like(y), torch.zeros_like(WT),
                              torch.zeros_like(hT), fmap=2, full=True, rebuild=True)
    W0 = inputs[8]
    assert (rebuilt - W0).abs().max() <= 1e-5 * W0.abs().max()


def test_extreme_inputs_stay_finite():
    """Pre-activations of +-80 and saturated betas."""
    T = 6
    inputs = _inputs(T, 2, 1, 16, seed=13)
    xq, xk, xb = inputs[0], inputs[1], inputs[3]
    xq[:, 0] = 80.0 * torch.sign(xq[:, 0])
    xk[:, 0] = -80.0
    xk[2:4, 1] = 80.0
    xb[::2] = 80.0
    xb[1::2] = -80.0
    reset = resets(T, 2, "mid")
    grads = _grads(inputs, 2)
    for feature_map in ("softmax", "elu1_sumnorm"):
        ref = _run(rdn_reference, inputs, reset, grads, feature_map=feature_map)
        got = _run(K.rdn_triton, inputs, reset, grads, dtype=torch.float32, feature_map=feature_map)
        _assert_matches(ref, got, atol=1e-4, label=feature_map)


def test_low_precision_inputs():
    """bf16 x with fp32 R and state, against the reference on the same rounded inputs."""
    T = 5
    inputs = _inputs(T, 2, 1, 16, seed=4)
    for i in range(4):
        inputs[i] = inputs[i].to(torch.bfloat16).double()
    reset = resets(T, 2, "mid")
    grads = _grads(inputs, 9)
    ref = _run(rdn_reference, inputs, reset, grads)
    leaves = ([t.to(torch.bfloat16).requires_grad_() for t in inputs[:4]]
              + [t.float().requires_grad_() for t in inputs[4:]])
    outs = K.rdn_triton(*leaves, reset)
    assert outs[0].dtype == torch.bfloat16 and outs[1].dtype == outs[2].dtype == torch.float32
    d = torch.autograd.grad(sum((o.double() * g).sum() for o, g in zip(outs, grads)), leaves)
    assert [t.dtype for t in d] == [torch.bfloat16] * 4 + [torch.float32] * 6
    for name, r, g in zip(NAMES, ref, [*outs, *d]):
        # The state is fp32 from the same rounded inputs; y and the gradient of y
        # (hence every input gradient) are rounded to bf16 once.
        tol = dict(atol=1e-5, rtol=1e-4) if name in ("W_T", "h_T") else dict(atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(g.double(), r, **tol, msg=lambda m: f"{name}: {m}")


def test_inference_path_and_determinism():
    T = 3
    inputs = [t.float() for t in _inputs(T, 2, 1, 16, seed=5)]
    reset = resets(T, 2, "mid")
    with torch.no_grad():
        got = K.rdn_triton(*(t[:1] for t in inputs[:4]), *inputs[4:], reset[:1])
        ref = rdn_reference(*(t[:1].double() for t in inputs[:4]),
                            *(t.double() for t in inputs[4:]), reset[:1])
    for a, b in zip(got, ref):
        torch.testing.assert_close(a.double(), b, atol=1e-6, rtol=1e-5)
    results = []
    for _ in range(2):
        leaves = [t.clone().requires_grad_() for t in inputs]
        y, W, h = K.rdn_triton(*leaves, reset)
        results.append(torch.autograd.grad(y.sum() + W.square().sum() + h.sum(), leaves))
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_supports_and_dispatch(monkeypatch):
    inputs = [t.float() for t in _inputs(2, 1, 1, 16)]
    xq, xk, xv, xb, Rq, W0 = (inputs[i] for i in (0, 1, 2, 3, 4, 8))
    assert K.supports(xq, xk, xv, xb, Rq, W0) is None
    assert "dpfp-1" in K.supports(xq, xk, xv, xb, Rq, W0, feature_map="dpfp-1")
    assert "grad_mode" in K.supports(xq, xk, xv, xb, Rq, W0, grad_mode="none")
    big = torch.zeros(2, 1, 1, 128)
    assert "head_dim of at most 64" in K.supports(big, big, big, xb, Rq, W0)
    assert "dtype" in K.supports(xq.double(), xk, xv, xb, Rq, W0)
    assert "match" in K.supports(xq, xk[..., :8], xv, xb, Rq, W0)
    monkeypatch.delenv("TRITON_INTERPRET")
    assert "CUDA" in K.supports(xq, xk, xv, xb, Rq, W0)
    reset = torch.zeros(2, 1, dtype=torch.bool)
    monkeypatch.setenv("FWRL_KERNELS", "auto")
    y, _, _ = rdn(*inputs, reset)
    # CPU tensors take the rule's CPU path under auto: the reference's values to round-off
    torch.testing.assert_close(y, rdn_reference(*inputs, reset)[0], rtol=1e-5, atol=1e-6)
    monkeypatch.setenv("FWRL_KERNELS", "triton")
    with pytest.raises(FwrlError, match="no Triton RDN kernel can run"):
        rdn(*inputs, reset)


@needs_compiling_triton
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("d", [16, 32, 64])
def test_cuda_matches_reference(d, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")
    rdn_triton = load_kernel_module(KERNEL, interpret=False).rdn_triton
    T, B, H = 51, 4, 2
    inputs = _inputs(T, B, H, d, seed=d)
    reset = torch.rand(T, B, generator=torch.Generator().manual_seed(d)) < 0.1
    reset[0, 0] = True
    grads = _grads(inputs, 1)
    for grad_mode in ("full", "step"):
        ref = _run(rdn_reference, inputs, reset, grads, grad_mode=grad_mode)
        got = _run(rdn_triton, [t.cuda() for t in inputs], reset.cuda(), [g.cuda() for g in grads],
                   dtype=torch.float32, grad_mode=grad_mode)
        _assert_matches(ref, [g.cpu() for g in got], atol=1e-4, rtol=1e-3, label=grad_mode)


# Shipped configurations: the Atari defaults (d = 32 at hidden 128 / 4 heads and
# the larger config), d = 16 and the largest supported head dim, 64.
COMPILE_CASES = [(16, "bf16"), (32, "fp32"), (32, "bf16"), (64, "bf16"), (64, "fp32")]
# The integer arguments of this module's kernels (T, B, H; the head dim D constant) take the values
# of the benchmark's large shape, specialised as a launch specialises them.
_compile_sm90 = functools.partial(compile_sm90, ints=LAUNCH_INTS)


@needs_compiling_triton
def test_compiles_for_sm90_without_spills():
    skip_without_sm90_toolchain()
    C = load_kernel_module(KERNEL, interpret=False)
    for d, dtype in COMPILE_CASES:
        bd, fwd_warps, bwd_warps = C._block_sizes(d)
        io = {n: f"*{dtype}" for n in ("XQ", "XK", "XV", "XB", "Y", "DY", "DXQ", "DXK", "DXV", "DXB")}
        io.update(RESET="*i8", START="*i32")
        keep_s = dtype != "fp32"  # s is recorded where y is rounded (fused_recurrent._keeps_s)
        fwd = _compile_sm90(C._forward_kernel, io,
                            dict(D=d, BD=bd, FMAP=2, STORE=True, KEEP_S=keep_s, EPS=1e-5),
                            fwd_warps)
        bwd = _compile_sm90(C._backward_kernel, io,
                            dict(D=d, BD=bd, FMAP=2, FULL=True, WRITE_REBUILT=False,
                                 KEEP_S=keep_s, EPS=1e-5),
                            bwd_warps)
        for name, compiled in (("forward", fwd), ("backward", bwd)):
            stack, local = stack_and_local_bytes(compiled)
            assert stack == 0 and local == 0, (
                f"RDN {name} kernel for d={d} ({dtype}) spills registers: "
                f"stack {stack} B, local {local} B"
            )
