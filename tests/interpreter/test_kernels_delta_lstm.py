"""Fused Triton Delta LSTM against the float64 PyTorch reference (paper 000 App. A.2, Eq. 36-40).

Set up as ``test_kernels_delta_rule.py`` is (interpreter copy of the kernel package,
sm_90 compile-only check; shared pieces in ``kernel_harness.py``). The tests marked
with the ``head_dim`` fixture run twice: the register kernels (d = 16) and the streamed
kernels of head dims 33..64, forced at d = 10 in row tiles of 4 (forward) and 8
(backward), so that several tiles and a partly masked last tile are exercised; the
streamed kernels also run at their real head dims (40, 64) at tiny shapes.
"""

from __future__ import annotations

import functools
import re

import pytest
import torch

from fwrl.errors import FwrlError
from fwrl.kernels.delta_lstm import delta_lstm
from fwrl.kernels.delta_lstm.naive import delta_lstm_reference
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

KERNEL = "delta_lstm"
K = load_kernel_module(KERNEL, interpret=True)
NAMES = ("y", "W_T", "c_T", "y_T", "dq", "dk", "dv", "dbeta", "dW0", "dc0", "dy0")


def _inputs(T, B, H, d, *, seed=0, W_scale=0.5):
    """q, k, v, beta, W0, c0, y0 (six matrices per head, in naive.MATRICES' order)."""
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


@pytest.fixture(params=["registers", "streamed"])
def head_dim(request, monkeypatch):
    """The head dim of a small case: 16 for the register kernels; 10 for the streamed
    kernels, forced at that size (forward tiles of 4 rows, backward tiles of 8)."""
    if request.param == "streamed":
        monkeypatch.setattr(K, "STREAM_ABOVE", 0)
        monkeypatch.setattr(K, "STREAMED", {16: (4, 1, 8, 2)})
        assert K._streams(10)
        return 10
    assert not K._streams(16)
    return 16


CASES = [(1, "none"), (1, "start"), (2, "none"), (2, "start"), (2, "mid"), (2, "everywhere"),
         (9, "mid")]


@pytest.mark.parametrize("grad_mode", ["full", "step"])
def test_matches_reference(grad_mode, head_dim):
    """Values and gradients of every input, with resets at the start, inside the sequence
    (the backward replays the segments before them) and at every step."""
    for T, pattern in CASES:
        inputs = _inputs(T, 2, 1, head_dim, seed=T)
        reset = resets(T, 2, pattern)
        grads = _grads(inputs, 100 + T)
        ref = _run(delta_lstm_reference, inputs, reset, grads, grad_mode=grad_mode)
        got = _run(K.delta_lstm_triton, inputs, reset, grads, dtype=torch.float32,
                   grad_mode=grad_mode)
        _assert_matches(ref, got, label=f"T={T} resets={pattern} {grad_mode}")


@pytest.mark.parametrize("d", [12, 32, 40, 64])
def test_odd_and_largest_head_dims_and_partial_losses(d):
    """d = 12 (masked lanes), the largest register d = 32, and the streamed kernels at
    d = 40 (masked lanes and rows) and the largest supported d = 64; only y or only the
    final state in the loss."""
    assert K._streams(d) == (d > 32)
    T = 3 if d <= 40 else 2
    inputs = _inputs(T, 2, 1, d, seed=d)
    reset = torch.tensor([[False, True], [True, False], [False, True]])[:T]
    gy, gW, gc, gyT = _grads(inputs, 7)
    for which, grads in (("y only", [gy, None, None, None]), ("state only", [None, gW, gc, gyT])):
        ref = _run(delta_lstm_reference, inputs, reset, grads)
        got = _run(K.delta_lstm_triton, inputs, reset, grads, dtype=torch.float32)
        _assert_matches(ref, got, label=f"d={d} {which}")


def test_split_sequence_equals_one_call(head_dim):
    T, T1 = 6, 3
    inputs = [t.float() for t in _inputs(T, 1, 2, head_dim, seed=8)]
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


def test_reversal_rebuilds_the_initial_state(head_dim):
    """Undoing 30 (streamed: 12) updates of all six matrices from the fp32 records gives
    back W0."""
    T = 30 if head_dim == 16 else 12
    inputs = [t.float() for t in _inputs(T, 1, 1, head_dim, seed=21)]
    reset = torch.zeros(T, 1, dtype=torch.bool)
    y, WT, cT, yT, records = K._forward(*inputs, reset, store=True)
    *_, rebuilt = K._backward(*inputs[:5], records, WT, torch.zeros_like(y), torch.zeros_like(WT),
                              torch.zeros_like(cT), torch.zeros_like(yT), full=True, rebuild=True)
    W0 = inputs[4]
    assert (rebuilt - W0).abs().max() <= 1e-5 * W0.abs().max()


def test_extreme_inputs_stay_finite(head_dim):
    """Logits of +-80, saturated rates and a peaked recurrent softmax."""
    T = 5
    inputs = _inputs(T, 2, 1, head_dim, seed=13)
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


def test_low_precision_inputs(head_dim):
    """bf16 q, k, v, beta with an fp32 state, against the reference on the same rounded inputs
    (the streamed kernels carry y_{t-1} in fp32, not through the bf16 output)."""
    T = 4
    inputs = _inputs(T, 2, 1, head_dim, seed=4)
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


def test_inference_path_and_determinism(head_dim):
    T = 3
    inputs = [t.float() for t in _inputs(T, 2, 1, head_dim, seed=5)]
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
    for d in (33, 48, 64):  # the streamed kernels
        assert K.supports(*[t.float() for t in _inputs(1, 1, 1, d)][:5]) is None
    big = [t.float() for t in _inputs(1, 1, 1, 65)]
    assert "head_dim of at most 64" in K.supports(*big[:5])
    assert "dtype" in K.supports(q.double(), k, v, beta, W0)
    assert "k has shape" in K.supports(q, k[..., :8], v, beta, W0)
    monkeypatch.delenv("TRITON_INTERPRET")
    assert "CUDA" in K.supports(q, k, v, beta, W0)
    reset = torch.zeros(2, 1, dtype=torch.bool)
    monkeypatch.setenv("FWRL_KERNELS", "auto")
    y = delta_lstm(*inputs, reset)[0]
    # CPU tensors take the rule's CPU path under auto: the reference's values to round-off
    torch.testing.assert_close(y, delta_lstm_reference(*inputs, reset)[0], rtol=1e-5, atol=1e-6)
    monkeypatch.setenv("FWRL_KERNELS", "triton")
    with pytest.raises(FwrlError, match="no Triton Delta LSTM kernel can run"):
        delta_lstm(*inputs, reset)


@needs_compiling_triton
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("d", [16, 32, 48, 64])
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


# Shipped configurations: the preset head dim 32 (Atari defaults) and 16 (register
# kernels); 48 and 64 (streamed kernels).
COMPILE_CASES = [(16, "bf16"), (32, "bf16"), (32, "fp32")]
STREAMED_COMPILE_CASES = [(48, "fp32"), (48, "bf16"), (64, "fp32"), (64, "bf16")]
# The integer arguments of this module's kernels (T, B, H; the head dim D constant) take the values
# of the benchmark's large shape, specialised as a launch specialises them.
_compile_sm90 = functools.partial(compile_sm90, ints=LAUNCH_INTS)


def _io_types(dtype):
    io = {n: f"*{dtype}" for n in ("Q", "K", "V", "BETA", "Y", "DY", "DQ", "DK", "DV", "DBETA")}
    io.update(RESET="*i8", START="*i32")
    return io


def _assert_no_spills(compiled, label):
    stack, local = stack_and_local_bytes(compiled)
    assert stack == 0 and local == 0, (
        f"Delta LSTM {label} spills registers: stack {stack} B, local {local} B"
    )


_BLOCKED = re.compile(r"#(\w+) = #ttg\.blocked<\{sizePerThread = \[([\d, ]+)\], "
                      r"threadsPerWarp = \[([\d, ]+)\], warpsPerCTA = \[([\d, ]+)\]")


def _assert_tiles_owned_once(compiled, br, bd, label):
    """The streamed kernels update each matrix tile in place (load, then store the same
    addresses, no barrier between): every [BR, BD] fp32 tile load and store must use one
    layout that gives each element to exactly one thread (no replica may read an element
    another thread has already overwritten)."""
    ttgir = compiled.asm["ttgir"]
    layouts = {name: [[int(x) for x in part.split(",")] for part in parts]
               for name, *parts in _BLOCKED.findall(ttgir)}
    used = set(re.findall(rf"tt\.(?:load|store) .*: tensor<{br}x{bd}x!tt\.ptr<f32>, #(\w+)>",
                          ttgir))
    assert len(used) == 1, f"{label}: tile loads and stores use the layouts {used}"
    (name,) = used
    spt, tpw, wpc = layouts[name]
    covered = [a * b * c for a, b, c in zip(spt, tpw, wpc)]
    assert covered[0] <= br and covered[1] <= bd, (
        f"{label}: layout {name} covers {covered} > the [{br}, {bd}] tile (replicated)"
    )


@needs_compiling_triton
def test_compiles_for_sm90_without_spills():
    skip_without_sm90_toolchain()
    C = load_kernel_module(KERNEL, interpret=False)
    for d, dtype in COMPILE_CASES:
        assert not C._streams(d)
        bd, fwd_warps, bwd_warps = C._block_sizes(d)
        fwd = _compile_sm90(C._forward_kernel, _io_types(dtype),
                            dict(D=d, BD=bd, STORE=True, REPS=1e-6), fwd_warps)
        bwd = _compile_sm90(C._backward_kernel, _io_types(dtype),
                            dict(D=d, BD=bd, FULL=True, WRITE_REBUILT=False, REPS=1e-6),
                            bwd_warps)
        _assert_no_spills(fwd, f"forward kernel for d={d} ({dtype})")
        _assert_no_spills(bwd, f"backward kernel for d={d} ({dtype})")
    for d, dtype in STREAMED_COMPILE_CASES:
        assert C._streams(d)
        bd, fwd_rows, fwd_warps, bwd_rows, bwd_warps = C._streamed_sizes(d)
        fwd = _compile_sm90(C._forward_streamed_kernel, _io_types(dtype),
                            dict(D=d, BD=bd, BR=fwd_rows, STORE=True, REPS=1e-6), fwd_warps)
        bwd = _compile_sm90(C._backward_streamed_kernel, _io_types(dtype),
                            dict(D=d, BD=bd, BR=bwd_rows, FULL=True, REPS=1e-6), bwd_warps)
        for label, compiled, rows in (("forward", fwd, fwd_rows), ("backward", bwd, bwd_rows)):
            label = f"streamed {label} kernel for d={d} ({dtype})"
            _assert_no_spills(compiled, label)
            _assert_tiles_owned_once(compiled, rows, bd, label)
