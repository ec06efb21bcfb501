"""Fused Triton Delta RNN against the float64 PyTorch reference (paper 000 Eq. 12).

Set up as ``test_kernels_delta_rule.py`` is (interpreter copy of the kernel module,
sm_90 compile-only check; shared pieces in ``kernel_harness.py``).
"""

from __future__ import annotations

import functools

import pytest
import torch

from fwrl.errors import FwrlError
from fwrl.kernels.delta_rnn import delta_rnn
from fwrl.kernels.delta_rnn.naive import delta_rnn_reference
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

KERNEL = "delta_rnn"
K = load_kernel_module(KERNEL, interpret=True)
NAMES = ("y", "W_T", "R_T", "h_T", "dq", "dk", "dv", "dbeta", "dkr", "dvr", "dbetar", "dW0", "dR0",
         "dh0")


def _inputs(T, B, H, d, dk=None, *, seed=0, W_scale=0.5):
    g = torch.Generator().manual_seed(seed)
    dk = d if dk is None else dk

    def randn(*shape, scale=1.0):
        return scale * torch.randn(*shape, generator=g, dtype=torch.float64)

    return [randn(T, B, H, dk), randn(T, B, H, dk), randn(T, B, H, d), randn(T, B, H),
            randn(T, B, H, d), randn(T, B, H, d), randn(T, B, H),
            randn(B, H, d, dk, scale=W_scale), randn(B, H, d, d, scale=W_scale), randn(B, H, d)]


def _grads(inputs, seed):
    g = torch.Generator().manual_seed(seed)
    v, W0, R0, h0 = inputs[2], inputs[7], inputs[8], inputs[9]
    return [torch.randn(t.shape, generator=g, dtype=torch.float64) for t in (v, W0, R0, h0)]


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
        ref = _run(delta_rnn_reference, inputs, reset, grads, **kwargs)
        got = _run(K.delta_rnn_triton, inputs, reset, grads, dtype=torch.float32, **kwargs)
        _assert_matches(ref, got, label=f"T={T} resets={pattern} {feature_map}")


def test_dpfp_odd_head_dim_and_partial_losses():
    """dpfp-1 applied before the kernel (key features 2d != d), d = 12; only y or only
    the final state in the loss."""
    T = 5
    inputs = _inputs(T, 2, 1, 12, seed=3)
    inputs[7] = 0.5 * torch.randn(2, 1, 12, 24, dtype=torch.float64)
    reset = resets(T, 2, "mid")
    gy, gW, gR, gh = _grads(inputs, 7)
    for which, grads in (("y only", [gy, None, None, None]), ("state only", [None, gW, gR, gh])):
        for feature_map in ("softmax", "dpfp-1"):
            W0 = inputs[7] if feature_map == "dpfp-1" else inputs[7][..., :12]
            case = inputs[:7] + [W0] + inputs[8:]
            g = [x if x is None or x.shape != gW.shape else x[..., :W0.shape[-1]] for x in grads]
            ref = _run(delta_rnn_reference, case, reset, g, feature_map=feature_map)
            got = _run(K.delta_rnn_triton, case, reset, g, dtype=torch.float32,
                       feature_map=feature_map)
            _assert_matches(ref, got, label=f"{which} {feature_map}")


def test_split_sequence_equals_one_call():
    T, T1 = 8, 3
    inputs = [t.float() for t in _inputs(T, 2, 2, 16, seed=8)]
    reset = resets(T, 2, "mid")
    grads = [g.float() for g in _grads(inputs, 3)]

    def loss_of(outs):
        return sum((o * g).sum() for o, g in zip(outs, grads))

    leaves = [t.clone().requires_grad_() for t in inputs]
    outs = K.delta_rnn_triton(*leaves, reset)
    whole = torch.autograd.grad(loss_of(outs), leaves)
    leaves2 = [t.clone().requires_grad_() for t in inputs]
    x, state = leaves2[:7], leaves2[7:]
    y1, *state1 = K.delta_rnn_triton(*(t[:T1] for t in x), *state, reset[:T1])
    y2, *state2 = K.delta_rnn_triton(*(t[T1:] for t in x), *state1, reset[T1:])
    split = torch.autograd.grad(loss_of((torch.cat([y1, y2]), *state2)), leaves2)
    torch.testing.assert_close(torch.cat([y1, y2]), outs[0], atol=0, rtol=0)
    for a, b in zip(state2, outs[1:]):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    for name, a, b in zip(NAMES[4:], whole, split):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5, msg=lambda m: f"{name}: {m}")


def test_head_dim_64():
    """The largest supported head dim, with a reset at t = 1 (the backward replays the
    one-step segment before it from W0, R0)."""
    T = 3
    inputs = _inputs(T, 1, 1, 64, seed=64)
    reset = torch.tensor([[False], [True], [False]])
    grads = _grads(inputs, 64)
    ref = _run(delta_rnn_reference, inputs, reset, grads)
    got = _run(K.delta_rnn_triton, inputs, reset, grads, dtype=torch.float32)
    _assert_matches(ref, got, label="d=64")


def test_reversal_rebuilds_the_initial_state():
    """Undoing 100 updates of W and R from the fp32 records gives back W0, R0."""
    T = 100
    inputs = [t.float() for t in _inputs(T, 1, 1, 16, seed=21)]
    reset = torch.zeros(T, 1, dtype=torch.bool)
    y, WT, RT, hT, records = K._forward(*inputs, reset, fmap=2, store=True)
    *_, rebuilt_W, rebuilt_R = K._backward(
        *inputs[:9], records, WT, RT, torch.zeros_like(y), torch.zeros_like(WT),
        torch.zeros_like(RT), torch.zeros_like(hT), fmap=2, full=True, rebuild=True)
    for rebuilt, init in ((rebuilt_W, inputs[7]), (rebuilt_R, inputs[8])):
        assert (rebuilt - init).abs().max() <= 1e-5 * init.abs().max()


def test_extreme_inputs_stay_finite():
    """Logits of +-80 and saturated betas."""
    T = 6
    inputs = _inputs(T, 2, 1, 16, seed=13)
    q, k, beta, kr, betar = (inputs[i] for i in (0, 1, 3, 4, 6))
    q[:, 0] = 80.0 * torch.sign(q[:, 0])
    k[:, 0] = -80.0
    k[2:4, 1] = 80.0
    kr[:, 1] = 80.0 * torch.sign(kr[:, 1])
    beta[::2] = 80.0
    beta[1::2] = -80.0
    betar[::2] = -80.0
    betar[1::2] = 80.0
    inputs[9][0] = 80.0  # a peaked recurrent softmax at step 0
    reset = resets(T, 2, "mid")
    grads = _grads(inputs, 2)
    for feature_map in ("softmax", "elu1_sumnorm"):
        ref = _run(delta_rnn_reference, inputs, reset, grads, feature_map=feature_map)
        got = _run(K.delta_rnn_triton, inputs, reset, grads, dtype=torch.float32,
                   feature_map=feature_map)
        _assert_matches(ref, got, atol=1e-4, label=feature_map)


def test_low_precision_inputs():
    """bf16 inputs with an fp32 state, against the reference on the same rounded inputs."""
    T = 5
    inputs = _inputs(T, 2, 1, 16, seed=4)
    for i in range(7):
        inputs[i] = inputs[i].to(torch.bfloat16).double()
    reset = resets(T, 2, "mid")
    grads = _grads(inputs, 9)
    ref = _run(delta_rnn_reference, inputs, reset, grads)
    leaves = ([t.to(torch.bfloat16).requires_grad_() for t in inputs[:7]]
              + [t.float().requires_grad_() for t in inputs[7:]])
    outs = K.delta_rnn_triton(*leaves, reset)
    assert outs[0].dtype == torch.bfloat16 and all(o.dtype == torch.float32 for o in outs[1:])
    d = torch.autograd.grad(sum((o.double() * g).sum() for o, g in zip(outs, grads)), leaves)
    assert [t.dtype for t in d] == [torch.bfloat16] * 7 + [torch.float32] * 3
    for name, r, g in zip(NAMES, ref, [*outs, *d]):
        # The state is fp32 from the same rounded inputs; y and the gradient of y
        # (hence every input gradient) are rounded to bf16 once.
        exact = name in ("W_T", "R_T", "h_T")
        tol = dict(atol=1e-5, rtol=1e-4) if exact else dict(atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(g.double(), r, **tol, msg=lambda m: f"{name}: {m}")


def test_inference_path_and_determinism():
    T = 3
    inputs = [t.float() for t in _inputs(T, 2, 1, 16, seed=5)]
    reset = resets(T, 2, "mid")
    with torch.no_grad():
        got = K.delta_rnn_triton(*(t[:1] for t in inputs[:7]), *inputs[7:], reset[:1])
        ref = delta_rnn_reference(*(t[:1].double() for t in inputs[:7]),
                                  *(t.double() for t in inputs[7:]), reset[:1])
    for a, b in zip(got, ref):
        torch.testing.assert_close(a.double(), b, atol=1e-6, rtol=1e-5)
    results = []
    for _ in range(2):
        leaves = [t.clone().requires_grad_() for t in inputs]
        y, W, R, h = K.delta_rnn_triton(*leaves, reset)
        results.append(torch.autograd.grad(y.sum() + W.square().sum() + R.sum() + h.sum(), leaves))
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_supports_and_dispatch(monkeypatch):
    inputs = [t.float() for t in _inputs(2, 1, 1, 16)]
    q, k, v, kr, vr = (inputs[i] for i in (0, 1, 2, 4, 5))
    assert K.supports(q, k, v, kr, vr) is None
    assert "feature map" in K.supports(q, k, v, kr, vr, feature_map="relu")
    assert "grad_mode" in K.supports(q, k, v, kr, vr, grad_mode="none")
    big = torch.zeros(2, 1, 1, 128)
    assert "head_dim of at most 64" in K.supports(big, big, big, big, big)
    d64 = torch.zeros(2, 1, 1, 64)
    assert K.supports(d64, d64, d64, d64, d64) is None
    assert "128" in K.supports(torch.zeros(2, 1, 1, 32), torch.zeros(2, 1, 1, 32),
                               torch.zeros(2, 1, 1, 32), torch.zeros(2, 1, 1, 32),
                               torch.zeros(2, 1, 1, 32), feature_map="dpfp-2")
    assert "dtype" in K.supports(q.double(), k, v, kr, vr)
    assert "match" in K.supports(q, k[..., :8], v, kr, vr)
    monkeypatch.delenv("TRITON_INTERPRET")
    assert "CUDA" in K.supports(q, k, v, kr, vr)
    reset = torch.zeros(2, 1, dtype=torch.bool)
    monkeypatch.setenv("FWRL_KERNELS", "auto")
    y = delta_rnn(*inputs, reset)[0]
    # CPU tensors take the rule's CPU path under auto: the reference's values to round-off
    torch.testing.assert_close(y, delta_rnn_reference(*inputs, reset)[0], rtol=1e-5, atol=1e-6)
    monkeypatch.setenv("FWRL_KERNELS", "triton")
    with pytest.raises(FwrlError, match="no Triton Delta RNN kernel can run"):
        delta_rnn(*inputs, reset)


@needs_compiling_triton
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("d", [16, 32, 64])
def test_cuda_matches_reference(d, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")
    delta_rnn_triton = load_kernel_module(KERNEL, interpret=False).delta_rnn_triton
    T, B, H = 51, 4, 2
    inputs = _inputs(T, B, H, d, seed=d)
    reset = torch.rand(T, B, generator=torch.Generator().manual_seed(d)) < 0.1
    reset[0, 0] = True
    grads = _grads(inputs, 1)
    for grad_mode in ("full", "step"):
        ref = _run(delta_rnn_reference, inputs, reset, grads, grad_mode=grad_mode)
        got = _run(delta_rnn_triton, [t.cuda() for t in inputs], reset.cuda(),
                   [g.cuda() for g in grads], dtype=torch.float32, grad_mode=grad_mode)
        _assert_matches(ref, [g.cpu() for g in got], atol=1e-4, rtol=1e-3, label=grad_mode)


# Shipped configurations: d = 16 and 32 with softmax keys, dpfp-1 keys at d = 32, and
# the largest supported head dim, 64.
COMPILE_CASES = [(16, 16, "bf16"), (32, 32, "fp32"), (32, 64, "bf16"), (32, 64, "fp32"),
                 (64, 64, "bf16"), (64, 64, "fp32")]
# The integer arguments of this module's kernels (T, B, H; D and DK constant) take the values
# of the benchmark's large shape, specialised as a launch specialises them.
_compile_sm90 = functools.partial(compile_sm90, ints=LAUNCH_INTS)


@needs_compiling_triton
def test_compiles_for_sm90_without_spills():
    skip_without_sm90_toolchain()
    C = load_kernel_module(KERNEL, interpret=False)
    for d, dk, dtype in COMPILE_CASES:
        bd, bk, fwd_warps, bwd_warps = C._block_sizes(d, dk)
        io = {n: f"*{dtype}" for n in ("Q", "K", "V", "BETA", "KR", "VR", "BETAR", "Y", "DY", "DQ",
                                       "DK_", "DV", "DBETA", "DKR", "DVR", "DBETAR")}
        io.update(RESET="*i8", START="*i32")
        eps = dict(EPS=1e-5, REPS=1e-6)
        sizes = dict(D=d, DK=dk, BD=bd, BK=bk, FMAP=2, **eps)
        fwd = _compile_sm90(C._forward_kernel, io, dict(sizes, STORE=True), fwd_warps)
        bwd = _compile_sm90(C._backward_kernel, io, dict(sizes, FULL=True, WRITE_REBUILT=False),
                            bwd_warps)
        for name, compiled in (("forward", fwd), ("backward", bwd)):
            stack, local = stack_and_local_bytes(compiled)
            assert stack == 0 and local == 0, (
                f"Delta RNN {name} kernel for d={d}, key features {dk} ({dtype}) spills registers: "
                f"stack {stack} B, local {local} B"
            )
