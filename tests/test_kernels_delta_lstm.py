"""Fused Triton Delta LSTM against the float64 PyTorch reference (paper 000 App. A.2, Eq. 36-40).

Set up as ``test_kernels_delta_rule.py`` is (interpreter copy of the kernel package,
sm_90 compile-only check; shared pieces in ``kernel_harness.py``).
"""

from __future__ import annotations

import functools

import pytest
import torch

from fwrl.errors import FwrlError
from fwrl.kernels import dispatch
from fwrl.kernels.reference.delta_lstm import delta_lstm_reference
from kernel_harness import (
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

KERNEL = "delta_lstm"
K = load_kernel_module(KERNEL, interpret=True)
NAMES = ("y", "W_T", "c_T", "y_T", "dq", "dk", "dv", "dbeta", "dW0", "dc0", "dy0")


def _inputs(T, B, H, d, *, seed=0, W_scale=0.5):
    """q, k, v, beta, W0, c0, y0 (six matrices per head, REFERENCE order)."""
    g = torch.Generator().manual_seed(seed)

    def randn(*shape, scale=1.0):
        return scale * torch.randn(*shape, generator=g, dtype=torch.float64)

    return [randn(T, B, H, d), randn(T, B, H, 6, d), randn(T, B, H, 6, d), randn(T, B, H, 6),
            randn(B, H, 6, d, d, scale=W_scale), randn(B, H, d), randn(B, H, d)]


def _grads(inputs, seed):
    """Random gradients for y and the final W, c, y."""
    g = torch.Generator().manual_seed(seed)
    q, W0, c0, y0 = inputs[0], inputs[4], inputs[5], inputs[6]
    return [torch.randn(t.shape, generator=g, dtype=torch.float64) for t in (q, W0, c0, y0)]


_run = run_with_grads
_assert_matches = functools.partial(assert_all_close, NAMES)

CASES = [(1, "none"), (1, "start"), (2, "none"), (2, "start"), (2, "mid"), (2, "everywhere"),
         (9, "mid")]


@pytest.mark.parametrize("grad_mode", ["full", "step"])
def test_matches_reference(grad_mode):
    """Values and gradients of every input, with resets at the start, inside the sequence
    (the backward replays the segments before them) and at every step."""
    for T, pattern in CASES:
        inputs = _inputs(T, 2, 1, 16, seed=T)
        reset = resets(T, 2, pattern)
        grads = _grads(inputs, 100 + T)
        ref = _run(delta_lstm_reference, inputs, reset, grads, grad_mode=grad_mode)
        got = _run(K.delta_lstm_triton, inputs, reset, grads, dtype=torch.float32,
                   grad_mode=grad_mode)
        _assert_matches(ref, got, label=f"T={T} resets={pattern} {grad_mode}")


@pytest.mark.parametrize("d", [12, 32])
def test_odd_and_largest_head_dims_and_partial_losses(d):
    """d = 12 (masked lanes) and the largest supported d = 32; only y or only the final
    state in the loss."""
    T = 3
    inputs = _inputs(T, 2, 1, d, seed=d)
    reset = torch.tensor([[False, True], [True, False], [False, True]])
    gy, gW, gc, gyT = _grads(inputs, 7)
    for which, grads in (("y only", [gy, None, None, None]), ("state only", [None, gW, gc, gyT])):
        ref = _run(delta_lstm_reference, inputs, reset, grads)
        got = _run(K.delta_lstm_triton, inputs, reset, grads, dtype=torch.float32)
        _assert_matches(ref, got, label=f"d={d} {which}")


def test_split_sequence_equals_one_call():
    T, T1 = 6, 3
    inputs = [t.float() for t in _inputs(T, 1, 2, 16, seed=8)]
    reset = resets(T, 1, "mid")
    grads = [g.float() for g in _grads(inputs, 3)]

    def loss_of(outs):
        return sum((o * g).sum() for o, g in zip(outs, grads))

    leaves = [t.clone().requires_grad_() for t in inputs]
    outs = K.delta_lstm_triton(*leaves, reset)
    whole = torch.autograd.grad(loss_of(outs), leaves)
    leaves2 = [t.clone().requires_grad_() for t in inputs]
    x, state = leaves2[:4], leaves2[4:]
    y1, *state1 = K.delta_lstm_triton(*(t[:T1] for t in x), *state, reset[:T1])
    y2, *state2 = K.delta_lstm_triton(*(t[T1:] for t in x), *state1, reset[T1:])
    split = torch.autograd.grad(loss_of((torch.cat([y1, y2]), *state2)), leaves2)
    torch.testing.assert_close(torch.cat([y1, y2]), outs[0], atol=0, rtol=0)
    for a, b in zip(state2, outs[1:]):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    for name, a, b in zip(NAMES[4:], whole, split):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5, msg=lambda m: f"{name}: {m}")


def test_reversal_rebuilds_the_initial_state():
    """Undoing 30 updates of all six matrices from the fp32 records gives back W0."""
    T = 30
    inputs = [t.float() for t in _inputs(T, 1, 1, 16, seed=21)]
    reset = torch.zeros(T, 1, dtype=torch.bool)
    y, WT, cT, yT, records = K._forward(*inputs, reset, store=True)
    *_, rebuilt = K._backward(*inputs[:5], records, WT, torch.zeros_like(y), torch.zeros_like(WT),
                              torch.zeros_like(cT), torch.zeros_like(yT), full=True, rebuild=True)
    W0 = inputs[4]
    assert (rebuilt - W0).abs().max() <= 1e-5 * W0.abs().max()


def test_extreme_inputs_stay_finite():
    """Logits of +-80, saturated rates and a peaked recurrent softmax."""
    T = 5
    inputs = _inputs(T, 2, 1, 16, seed=13)
    q, k, beta = inputs[0], inputs[1], inputs[3]
    q[:, 0] = 80.0 * torch.sign(q[:, 0])
    k[:, 0] = -80.0
    k[2:4, 1, :, 3] = 80.0
    beta[::2] = 80.0
    beta[1::2] = -80.0
    inputs[6][0] = 80.0
    reset = resets(T, 2, "mid")
    grads = _grads(inputs, 2)
    ref = _run(delta_lstm_reference, inputs, reset, grads)
    got = _run(K.delta_lstm_triton, inputs, reset, grads, dtype=torch.float32)
    _assert_matches(ref, got, atol=1e-4, label="extreme")


def test_low_precision_inputs():
    """bf16 q, k, v, beta with an fp32 state, against the reference on the same rounded inputs."""
    T = 4
    inputs = _inputs(T, 2, 1, 16, seed=4)
    for i in range(4):
        inputs[i] = inputs[i].to(torch.bfloat16).double()
    reset = resets(T, 2, "mid")
    grads = _grads(inputs, 9)
    ref = _run(delta_lstm_reference, inputs, reset, grads)
    leaves = ([t.to(torch.bfloat16).requires_grad_() for t in inputs[:4]]
              + [t.float().requires_grad_() for t in inputs[4:]])
    outs = K.delta_lstm_triton(*leaves, reset)
    assert outs[0].dtype == torch.bfloat16 and all(o.dtype == torch.float32 for o in outs[1:])
    d = torch.autograd.grad(sum((o.double() * g).sum() for o, g in zip(outs, grads)), leaves)
    assert [t.dtype for t in d] == [torch.bfloat16] * 4 + [torch.float32] * 3
    for name, r, g in zip(NAMES, ref, [*outs, *d]):
        # The state is fp32 from the same rounded inputs; y and the gradient of y
        # (hence every input gradient) are rounded to bf16 once.
        exact = name in ("W_T", "c_T", "y_T")
        tol = dict(atol=1e-5, rtol=1e-4) if exact else dict(atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(g.double(), r, **tol, msg=lambda m: f"{name}: {m}")


def test_inference_path_and_determinism():
    T = 3
    inputs = [t.float() for t in _inputs(T, 2, 1, 16, seed=5)]
    reset = resets(T, 2, "mid")
    with torch.no_grad():
        got = K.delta_lstm_triton(*(t[:1] for t in inputs[:4]), *inputs[4:], reset[:1])
        ref = delta_lstm_reference(*(t[:1].double() for t in inputs[:4]),
                                   *(t.double() for t in inputs[4:]), reset[:1])
    for a, b in zip(got, ref):
        torch.testing.assert_close(a.double(), b, atol=1e-6, rtol=1e-5)
    results = []
    for _ in range(2):
        leaves = [t.clone().requires_grad_() for t in inputs]
        y, W, c, yT = K.delta_lstm_triton(*leaves, reset)
        results.append(torch.autograd.grad(y.sum() + W.square().sum() + c.sum() + yT.sum(),
                                           leaves))
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_supports_and_dispatch(monkeypatch):
    inputs = [t.float() for t in _inputs(2, 1, 1, 16)]
    q, k, v, beta, W0 = inputs[:5]
    assert K.supports(q, k, v, beta, W0) is None
    assert "grad_mode" in K.supports(q, k, v, beta, W0, grad_mode="none")
    big = [t.float() for t in _inputs(1, 1, 1, 64)]
    assert "head_dim of at most 32" in K.supports(*big[:5])
    assert "dtype" in K.supports(q.double(), k, v, beta, W0)
    assert "k has shape" in K.supports(q, k[..., :8], v, beta, W0)
    monkeypatch.delenv("TRITON_INTERPRET")
    assert "CUDA" in K.supports(q, k, v, beta, W0)
    reset = torch.zeros(2, 1, dtype=torch.bool)
    monkeypatch.setenv("FWRL_KERNELS", "auto")
    y = dispatch.delta_lstm(*inputs, reset)[0]
    assert torch.equal(y, delta_lstm_reference(*inputs, reset)[0])
    monkeypatch.setenv("FWRL_KERNELS", "triton")
    with pytest.raises(FwrlError, match="no Triton Delta LSTM kernel can run"):
        dispatch.delta_lstm(*inputs, reset)


@needs_compiling_triton
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("d", [16, 32])
def test_cuda_matches_reference(d, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")
    delta_lstm_triton = load_kernel_module(KERNEL, interpret=False).delta_lstm_triton
    T, B, H = 51, 4, 2
    inputs = _inputs(T, B, H, d, seed=d)
    reset = torch.rand(T, B, generator=torch.Generator().manual_seed(d)) < 0.1
    reset[0, 0] = True
    grads = _grads(inputs, 1)
    for grad_mode in ("full", "step"):
        ref = _run(delta_lstm_reference, inputs, reset, grads, grad_mode=grad_mode)
        got = _run(delta_lstm_triton, [t.cuda() for t in inputs], reset.cuda(),
                   [g.cuda() for g in grads], dtype=torch.float32, grad_mode=grad_mode)
        _assert_matches(ref, [g.cpu() for g in got], atol=1e-4, rtol=1e-3, label=grad_mode)


# Shipped configurations: the preset head dim 32 (Atari defaults) and 16.
COMPILE_CASES = [(16, "bf16"), (32, "bf16"), (32, "fp32")]
# The integer arguments of this module's kernels are i32 (the head dim D is a constant).
_compile_sm90 = functools.partial(compile_sm90, ints=("T", "B", "H"))


@needs_compiling_triton
def test_compiles_for_sm90_without_spills():
    skip_without_sm90_toolchain()
    C = load_kernel_module(KERNEL, interpret=False)
    for d, dtype in COMPILE_CASES:
        bd, fwd_warps, bwd_warps = C._block_sizes(d)
        io = {n: f"*{dtype}" for n in ("Q", "K", "V", "BETA", "Y", "DY", "DQ", "DK", "DV",
                                       "DBETA")}
        io.update(RESET="*i8", START="*i32")
        fwd = _compile_sm90(C._forward_kernel, io, dict(D=d, BD=bd, STORE=True, REPS=1e-6),
                            fwd_warps)
        bwd = _compile_sm90(C._backward_kernel, io,
                            dict(D=d, BD=bd, FULL=True, WRITE_REBUILT=False, REPS=1e-6),
                            bwd_warps)
        for name, compiled in (("forward", fwd), ("backward", bwd)):
            stack, local = stack_and_local_bytes(compiled)
            assert stack == 0 and local == 0, (
                f"Delta LSTM {name} kernel for d={d} ({dtype}) spills registers: "
                f"stack {stack} B, local {local} B"
            )
