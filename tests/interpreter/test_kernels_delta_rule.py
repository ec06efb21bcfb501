"""Fused Triton sum / delta rule against the float64 PyTorch reference.

The kernels run on CPU through the Triton interpreter: a private copy of
``fwrl.kernels.delta_rule.fused_recurrent`` is imported with ``TRITON_INTERPRET=1`` set
only while it loads (so the module other tests import is left compiled for
GPUs), and the variable is set per test by the autouse ``_interpret`` fixture
(both from ``kernel_harness.py``). Shapes are tiny because the interpreter costs
milliseconds per program per step. A compile-only check builds the shipped
configurations for sm_90 without a GPU.
"""

from __future__ import annotations

import pytest
import torch

from fwrl.kernels import GRAD_MODES
from fwrl.kernels.delta_rule.naive import delta_rule_reference
from kernel_harness import (
    LAUNCH_INTS,
    _interpret,  # noqa: F401  (the autouse fixture: TRITON_INTERPRET=1 in every test)
    assert_all_close,
    compile_sm90,
    launch_specialisation,
    load_kernel_module,
    needs_compiling_triton,
    registers,
    resets,
    skip_without_sm90_toolchain,
    stack_and_local_bytes,
)

KERNEL = "delta_rule"
K = load_kernel_module(KERNEL, interpret=True)
RULES = ("delta", "sum")
FEATURE_MAPS = ("elu1_sumnorm", "softmax")


def _inputs(T, B, H, dk, dv=None, *, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    dv = dk if dv is None else dv
    q = scale * torch.randn(T, B, H, dk, generator=g, dtype=torch.float64)
    k = scale * torch.randn(T, B, H, dk, generator=g, dtype=torch.float64)
    v = torch.randn(T, B, H, dv, generator=g, dtype=torch.float64)
    beta = torch.randn(T, B, H, generator=g, dtype=torch.float64)
    W0 = 0.5 * torch.randn(B, H, dv, dk, generator=g, dtype=torch.float64)
    return q, k, v, beta, W0


def _run(fn, inputs, reset, grads, dtype=None, device="cpu", **kwargs):
    """Outputs of ``fn`` and gradients of <y, gy> + <W_T, gW> for every input (on CPU)."""
    leaves = [x.detach().to(device, dtype or x.dtype).requires_grad_() for x in inputs]
    y, WT = fn(*leaves, reset.to(device), **kwargs)
    gy, gW = grads
    loss = 0.0
    if gy is not None:
        loss = loss + (y.double() * gy.to(device)).sum()
    if gW is not None:
        loss = loss + (WT.double() * gW.to(device)).sum()
    d = torch.autograd.grad(loss, leaves, allow_unused=True)
    d = [torch.zeros_like(x) if g is None else g for x, g in zip(leaves, d)]
    return y.cpu(), WT.cpu(), [g.cpu() for g in d]


def _assert_matches(ref, got, **tolerance_and_label):
    """``ref`` and ``got`` are ``_run`` results: (y, W_T, input gradients)."""
    names = ("y", "W_T", "dq", "dk", "dv", "dbeta", "dW0")
    (y_r, W_r, d_r), (y_g, W_g, d_g) = ref, got
    assert_all_close(names, (y_r, W_r, *d_r), (y_g, W_g, *d_g), **tolerance_and_label)


CASES = [(1, "none"), (1, "start"), (2, "none"), (2, "start"), (2, "mid"), (2, "everywhere"),
         (17, "none"), (17, "start"), (17, "mid"), (17, "everywhere")]


@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
@pytest.mark.parametrize("grad_mode", GRAD_MODES)
@pytest.mark.parametrize("rule", RULES)
def test_matches_reference(rule, grad_mode, feature_map):
    kwargs = dict(rule=rule, feature_map=feature_map, grad_mode=grad_mode)
    for T, pattern in CASES:
        inputs = _inputs(T, 2, 1, 16, seed=T)
        reset = resets(T, 2, pattern)
        g = torch.Generator().manual_seed(100 + T)
        grads = (torch.randn(T, 2, 1, 16, generator=g, dtype=torch.float64),
                 torch.randn(2, 1, 16, 16, generator=g, dtype=torch.float64))
        ref = _run(delta_rule_reference, inputs, reset, grads, **kwargs)
        got = _run(K.delta_rule_triton, inputs, reset, grads, dtype=torch.float32, **kwargs)
        _assert_matches(ref, got, label=f"T={T} resets={pattern}")


@pytest.mark.parametrize("which", ["final_state_only", "outputs_only"])
def test_partial_losses(which):
    """Only W_T (or only y) feeds the loss: the other incoming gradient is absent."""
    T = 5
    inputs = _inputs(T, 2, 2, 16, seed=3)
    reset = resets(T, 2, "mid")
    g = torch.Generator().manual_seed(7)
    gy = torch.randn(T, 2, 2, 16, generator=g, dtype=torch.float64)
    gW = torch.randn(2, 2, 16, 16, generator=g, dtype=torch.float64)
    grads = (None, gW) if which == "final_state_only" else (gy, None)
    for grad_mode in GRAD_MODES:
        kwargs = dict(rule="delta", feature_map="elu1_sumnorm", grad_mode=grad_mode)
        ref = _run(delta_rule_reference, inputs, reset, grads, **kwargs)
        got = _run(K.delta_rule_triton, inputs, reset, grads, dtype=torch.float32, **kwargs)
        _assert_matches(ref, got, label=f"{which} {grad_mode}")


@pytest.mark.parametrize("rule", RULES)
def test_odd_head_dims_and_row_blocks(rule):
    """Non-power-of-two Dk != Dv, W split over several row blocks (partials added)."""
    T = 4
    inputs = _inputs(T, 1, 2, 20, 24, seed=11)
    reset = resets(T, 1, "mid")
    g = torch.Generator().manual_seed(5)
    grads = (torch.randn(T, 1, 2, 24, generator=g, dtype=torch.float64),
             torch.randn(1, 2, 24, 20, generator=g, dtype=torch.float64))
    for feature_map, split in (("elu1_sumnorm", 1), ("softmax", 2), ("elu1_sumnorm", 2)):
        kwargs = dict(rule=rule, feature_map=feature_map, grad_mode="full")
        ref = _run(delta_rule_reference, inputs, reset, grads, **kwargs)
        got = _run(K.delta_rule_triton, inputs, reset, grads, dtype=torch.float32,
                   split=split, **kwargs)
        _assert_matches(ref, got, label=f"{feature_map} split={split}")


@pytest.mark.parametrize("dim,split", [(64, 4), (32, 8)])
def test_rows_split_over_programs(dim, split):
    """W's rows over ``split`` programs per (batch, head) (16 and 4 rows each), the dq / dk
    partials added afterwards: the same values and gradients, with resets."""
    T = 3
    inputs = _inputs(T, 1, 1, dim, seed=dim)
    reset = torch.tensor([[False], [True], [False]])
    g = torch.Generator().manual_seed(dim)
    grads = (torch.randn(T, 1, 1, dim, generator=g, dtype=torch.float64),
             torch.randn(1, 1, dim, dim, generator=g, dtype=torch.float64))
    kwargs = dict(rule="delta", feature_map="softmax", grad_mode="full")
    assert K._block_sizes(dim, dim, split)[1] == dim // split
    ref = _run(delta_rule_reference, inputs, reset, grads, **kwargs)
    got = _run(K.delta_rule_triton, inputs, reset, grads, dtype=torch.float32, split=split,
               **kwargs)
    _assert_matches(ref, got, label=f"dim={dim} split={split}")


def test_auto_split_fills_the_sms(monkeypatch):
    """auto: the fewest programs per (batch, head) that give one per SM (132 on an H100),
    keeping at least 16 rows each; 1 off CUDA."""

    class H100:
        multi_processor_count = 132

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: H100)
    cuda = torch.device("cuda")
    assert K.choose_split("auto", 32 * 4, 32, cuda) == 2  # 128 programs < 132
    assert K.choose_split("auto", 32 * 8, 32, cuda) == 1  # 256 already
    assert K.choose_split("auto", 8 * 2, 64, cuda) == 4  # 16 -> 64 programs, 16 rows each
    assert K.choose_split("auto", 32 * 4, 16, cuda) == 1  # 8 rows would be too few
    assert K.choose_split("auto", 32 * 4, 32, torch.device("cpu")) == 1
    assert K.choose_split(4, 32 * 8, 32, cuda) == 4
    with pytest.raises(Exception, match="split"):
        K.choose_split(3, 1, 32, cuda)


def test_dpfp_applied_outside_the_kernel():
    T = 3
    q, k, v, beta, _ = _inputs(T, 1, 1, 8, 16, seed=2)
    W0 = 0.5 * torch.randn(1, 1, 16, 16, dtype=torch.float64)  # dpfp-1 doubles Dk
    inputs = (q, k, v, beta, W0)
    reset = resets(T, 1, "mid")
    g = torch.Generator().manual_seed(1)
    grads = (torch.randn(T, 1, 1, 16, generator=g, dtype=torch.float64),
             torch.randn(1, 1, 16, 16, generator=g, dtype=torch.float64))
    kwargs = dict(rule="delta", feature_map="dpfp-1", grad_mode="full")
    ref = _run(delta_rule_reference, inputs, reset, grads, **kwargs)
    got = _run(K.delta_rule_triton, inputs, reset, grads, dtype=torch.float32, **kwargs)
    _assert_matches(ref, got)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_inputs(dtype):
    """bf16/fp16 q, k, v, beta with an fp32 state, against the reference on the same
    rounded inputs (in float64)."""
    T = 6
    q, k, v, beta, W0 = _inputs(T, 2, 1, 16, seed=4)
    q, k, v, beta = (x.to(dtype).double() for x in (q, k, v, beta))
    reset = resets(T, 2, "mid")
    g = torch.Generator().manual_seed(9)
    grads = (torch.randn(T, 2, 1, 16, generator=g, dtype=torch.float64),
             torch.randn(2, 1, 16, 16, generator=g, dtype=torch.float64))
    kwargs = dict(rule="delta", feature_map="elu1_sumnorm", grad_mode="full")
    ref = _run(delta_rule_reference, (q, k, v, beta, W0), reset, grads, **kwargs)
    leaves = [x.to(dtype).requires_grad_() for x in (q, k, v, beta)]
    leaves.append(W0.float().requires_grad_())
    y, WT = K.delta_rule_triton(*leaves, reset, **kwargs)
    assert y.dtype == dtype and WT.dtype == torch.float32
    loss = (y.double() * grads[0]).sum() + (WT.double() * grads[1]).sum()
    d = torch.autograd.grad(loss, leaves)
    assert [x.dtype for x in d] == [dtype] * 4 + [torch.float32]
    torch.testing.assert_close(WT.double(), ref[1], atol=1e-5, rtol=1e-4)
    # Outputs and input gradients are rounded to the input dtype once.
    _assert_matches(ref, (y, WT, d), atol=2e-2, rtol=2e-2, label=str(dtype))


def test_split_sequence_equals_one_call():
    T, T1 = 9, 4
    inputs = _inputs(T, 2, 2, 16, seed=8)
    reset = resets(T, 2, "mid")
    g = torch.Generator().manual_seed(3)
    gy = torch.randn(T, 2, 2, 16, generator=g, dtype=torch.float64).float()
    gW = torch.randn(2, 2, 16, 16, generator=g, dtype=torch.float64).float()
    for rule in RULES:
        kwargs = dict(rule=rule, feature_map="elu1_sumnorm", grad_mode="full")
        leaves = [x.float().requires_grad_() for x in inputs]
        y, WT = K.delta_rule_triton(*leaves, reset, **kwargs)
        whole = torch.autograd.grad((y * gy).sum() + (WT * gW).sum(), leaves, allow_unused=True)

        leaves2 = [x.float().requires_grad_() for x in inputs]
        q, k, v, beta, W0 = leaves2
        y1, W1 = K.delta_rule_triton(q[:T1], k[:T1], v[:T1], beta[:T1], W0, reset[:T1], **kwargs)
        y2, W2 = K.delta_rule_triton(q[T1:], k[T1:], v[T1:], beta[T1:], W1, reset[T1:], **kwargs)
        y12 = torch.cat([y1, y2])
        split = torch.autograd.grad((y12 * gy).sum() + (W2 * gW).sum(), leaves2,
                                    allow_unused=True)
        torch.testing.assert_close(y12, y, atol=0, rtol=0)  # same operations, same order
        torch.testing.assert_close(W2, WT, atol=0, rtol=0)
        for a, b in zip(whole, split):
            if a is None or b is None:
                assert a is None and b is None and rule == "sum"
                continue
            torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("fmap", ["elu1_sumnorm", "softmax"])
def test_reversal_rebuilds_the_initial_state(rule, fmap):
    """Undoing 100 updates from the fp32 records gives back W0 (relative 1e-5)."""
    T = 100
    q, k, v, beta, W0 = (x.float() for x in _inputs(T, 1, 1, 16, seed=21))
    reset = torch.zeros(T, 1, dtype=torch.bool)
    delta, code = rule == "delta", K.KERNEL_FEATURE_MAPS[fmap]
    y, WT, records = K._forward(q, k, v, beta, W0, reset, delta=delta, fmap=code, store=True)
    *_, rebuilt = K._backward(q, k, v, beta, W0, records, WT, torch.zeros_like(y),
                              torch.zeros_like(WT), delta=delta, fmap=code, full=True,
                              rebuild=True)
    assert (rebuilt - W0).abs().max() <= 1e-5 * W0.abs().max()


@pytest.mark.parametrize("rule", RULES)
def test_extreme_inputs_stay_finite(rule):
    """Logits of +-80, saturated betas, all-zero keys under sum normalisation."""
    T = 6
    q, k, v, beta, W0 = _inputs(T, 2, 1, 16, seed=13)
    q[:, 0] = 80.0 * torch.sign(q[:, 0])
    k[:, 0] = -80.0
    k[2:4, 1] = 80.0
    beta[::2] = 80.0
    beta[1::2] = -80.0
    reset = resets(T, 2, "mid")
    g = torch.Generator().manual_seed(2)
    grads = (torch.randn(T, 2, 1, 16, generator=g, dtype=torch.float64),
             torch.randn(2, 1, 16, 16, generator=g, dtype=torch.float64))
    for feature_map in ("elu1_sumnorm", "softmax"):
        kwargs = dict(rule=rule, feature_map=feature_map, grad_mode="full")
        ref = _run(delta_rule_reference, (q, k, v, beta, W0), reset, grads, **kwargs)
        got = _run(K.delta_rule_triton, (q, k, v, beta, W0), reset, grads,
                   dtype=torch.float32, **kwargs)
        _assert_matches(ref, got, atol=1e-4, label=feature_map)
    zero_k = torch.zeros_like(k)  # dpfp of zeros is all zero: 0 / (0 + eps)
    kwargs = dict(rule=rule, feature_map="dpfp-1", grad_mode="full")
    W0d = 0.5 * torch.ones(2, 1, 16, 32, dtype=torch.float64)
    ref = _run(delta_rule_reference, (q, zero_k, v, beta, W0d), reset, grads[:1] + (None,),
               **kwargs)
    got = _run(K.delta_rule_triton, (q, zero_k, v, beta, W0d), reset, grads[:1] + (None,),
               dtype=torch.float32, **kwargs)
    _assert_matches(ref, got, label="dpfp zero keys")


def test_backward_memory_follows_from_shapes():
    """What the forward keeps for backward has the same sizes whatever the resets (no
    pre-reset states sized by a count read from the device), and replaying the segments
    before resets rebuilds the states exactly as the forward made them."""
    T = 6
    inputs = [x.float() for x in _inputs(T, 2, 1, 16, seed=6)]
    kept = {}
    for pattern in ("none", "mid", "everywhere"):
        reset = resets(T, 2, pattern)
        *_, records = K._forward(*inputs, reset, delta=True, fmap=1, store=True)
        kept[pattern] = [tuple(r.shape) for r in records]
        assert sum(r.numel() for r in records) == T * 2 * (1 + 1 + 16)  # reset, start, r
    assert kept["none"] == kept["mid"] == kept["everywhere"]


def test_replay_starts():
    """Per (t, b): for a reset at t >= 1, the start of the segment that ends at t - 1 (the
    last reset before t, or 0); -1 elsewhere. Against the definition, on random resets."""
    reset = torch.rand(40, 5, generator=torch.Generator().manual_seed(0)) < 0.3
    reset[0, 0] = True
    expected = torch.full(reset.shape, -1, dtype=torch.int32)
    for b in range(reset.shape[1]):
        last = 0
        for t in range(reset.shape[0]):
            if t >= 1 and reset[t, b]:
                expected[t, b] = last
            if reset[t, b]:
                last = t
    assert torch.equal(K.replay_starts(reset), expected)


def test_inference_path_and_determinism():
    T = 3
    inputs = [x.float() for x in _inputs(T, 2, 1, 16, seed=5)]
    reset = resets(T, 2, "mid")
    kwargs = dict(rule="delta", feature_map="softmax", grad_mode="full")
    with torch.no_grad():
        y, WT = K.delta_rule_triton(*[x[:1] for x in inputs[:4]], inputs[4], reset[:1], **kwargs)
        y_ref, W_ref = delta_rule_reference(*[x[:1].double() for x in inputs[:4]],
                                            inputs[4].double(), reset[:1], **kwargs)
    torch.testing.assert_close(y.double(), y_ref, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(WT.double(), W_ref, atol=1e-6, rtol=1e-5)
    grads = []
    for _ in range(2):
        leaves = [x.clone().requires_grad_() for x in inputs]
        y, WT = K.delta_rule_triton(*leaves, reset, **kwargs)
        grads.append(torch.autograd.grad(y.sum() + WT.square().sum(), leaves))
    for a, b in zip(*grads):
        assert torch.equal(a, b)


def test_supports_gives_reasons(monkeypatch):
    x = torch.zeros(2, 1, 1, 16)
    assert K.supports(x, x, x) is None  # interpreter on CPU
    assert "rule" in K.supports(x, x, x, rule="oja")
    assert "grad_mode" in K.supports(x, x, x, grad_mode="none")
    assert "feature map" in K.supports(x, x, x, feature_map="relu")
    big = torch.zeros(2, 1, 1, 129)
    assert "129" in K.supports(big, big, x)
    assert "192" in K.supports(torch.zeros(2, 1, 1, 32), torch.zeros(2, 1, 1, 32), x,
                               feature_map="dpfp-3")
    assert "dtype" in K.supports(x.double(), x.double(), x.double())
    assert "match" in K.supports(x, torch.zeros(2, 1, 1, 8), x)
    monkeypatch.delenv("TRITON_INTERPRET")
    assert "CUDA" in K.supports(x, x, x)
    compiled = load_kernel_module(KERNEL, interpret=False)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert "CUDA" in compiled.supports(x, x, x)  # built for GPUs: no CPU runs
    with pytest.raises(Exception, match="rule"):
        K.delta_rule_triton(x, x, x, x[..., 0], x[0].expand(1, 1, 16, 16), x[..., 0, 0] > 0,
                            rule="oja")


@needs_compiling_triton
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dim", [16, 32, 64, 128])
def test_cuda_matches_reference(dim, monkeypatch):
    """On a GPU: the compiled kernels at rollout-like shapes, both rules and grad modes."""
    monkeypatch.delenv("TRITON_INTERPRET")
    delta_rule_triton = load_kernel_module(KERNEL, interpret=False).delta_rule_triton
    T, B, H = 51, 4, 2
    inputs = _inputs(T, B, H, dim, seed=dim)
    reset = torch.rand(T, B, generator=torch.Generator().manual_seed(dim)) < 0.1
    reset[0, 0] = True
    g = torch.Generator().manual_seed(1)
    grads = (torch.randn(T, B, H, dim, generator=g, dtype=torch.float64),
             torch.randn(B, H, dim, dim, generator=g, dtype=torch.float64))
    for rule in RULES:
        for grad_mode in GRAD_MODES:
            for feature_map in FEATURE_MAPS:
                kwargs = dict(rule=rule, feature_map=feature_map, grad_mode=grad_mode)
                ref = _run(delta_rule_reference, inputs, reset, grads, **kwargs)
                got = _run(delta_rule_triton, inputs, reset, grads, dtype=torch.float32,
                           device="cuda", **kwargs)
                _assert_matches(ref, got, atol=1e-4, rtol=1e-3, label=str(kwargs))


# Shipped configurations: head dims of the presets and the supported range, split
# over 1 program per (batch, head) and over the row blocks ``split`` gives
# (``--split`` of the benchmark, ``auto`` on small grids); (dim, split, rule, dtype).
# (64, 1, "delta", "fp32") is what the H100 timed at the large shape (split auto).
COMPILE_CASES = [(16, 1, "delta", "bf16"), (32, 1, "delta", "bf16"), (32, 2, "delta", "bf16"),
                 (64, 1, "sum", "fp32"), (64, 1, "delta", "fp32"), (64, 2, "delta", "bf16"),
                 (64, 4, "delta", "fp32"), (128, 1, "delta", "fp32"), (128, 8, "delta", "bf16")]


@needs_compiling_triton
def test_compile_checks_specialise_as_the_launcher():
    """The sm_90 checks compile the kernel a launch compiles: the harness's signature,
    constants and attributes equal those of Triton's own launcher path (the binder of
    ``JITFunction.run`` and ``_pack_args``) for the same argument values; DK, DV and B
    divisible by 16 are marked so, T = H = 1 become constants."""
    skip_without_sm90_toolchain()
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import MockTensor, create_function_from_signature

    C = load_kernel_module(KERNEL, interpret=False)
    kernel = C._backward_kernel
    target = GPUTarget("cuda", 90, 64)
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    io = {"Q": "*bf16", "RESET": "*i8", "START": "*i32"}
    dtypes = {"*bf16": torch.bfloat16, "*i8": torch.int8, "*i32": torch.int32}
    constexprs = dict(BK=64, BV=64, FMAP=1, DELTA=True, FULL=True, FUSE_FMAP=True,
                      WRITE_REBUILT=False, EPS=1e-5)
    for ints in (dict(LAUNCH_INTS, DK=64, DV=64), dict(T=1, B=3, H=1, DK=20, DV=48)):
        args = [ints[n] if n in ints else MockTensor(dtypes.get(io.get(n), torch.float32))
                for n in kernel.arg_names if n not in constexprs]
        launch = dict(constexprs, num_warps=8, enable_fp_fusion=True)  # as launch_options gives
        bound, specialization, options = binder(*args, **launch)
        _, signature, consts, attrs = kernel._pack_args(backend, launch, bound, specialization,
                                                        options)
        ours = launch_specialisation(kernel, target, io, constexprs, ints)
        assert ours[0] == signature, ints
        assert {(kernel.arg_names.index(k),): v for k, v in ours[1].items()} == consts, ints
        assert ours[2] == attrs, ints
        divisible = {n for n in ints
                     if attrs[(kernel.arg_names.index(n),)] == [["tt.divisibility", 16]]}
        assert divisible == ({"B", "DK", "DV"} if ints["T"] > 1 else {"DV"}), ints
        assert ("T" in ours[1]) == (ints["T"] == 1)


@needs_compiling_triton
def test_compiles_for_sm90_without_spills():
    """Compile-only: the forward/backward kernels for sm_90 (no GPU needed), under the register
    cap their launches pass (``register_cap_for``: 128 from head dim 64 on). Every case is
    compiled before the test fails, so one run names every spilling build."""
    skip_without_sm90_toolchain()
    C = load_kernel_module(KERNEL, interpret=False)
    assert [C.register_cap_for(d, d) for d in (16, 32, 64, 128)] == [None, None, 128, 128]
    spills = []
    for dim, split, rule, dtype in COMPILE_CASES:
        bk, bv, fwd_warps, bwd_warps = C._block_sizes(dim, dim, split)
        io = {n: f"*{dtype}" for n in ("Q", "K", "V", "BETA", "Y", "DY", "DQ", "DK_", "DV_")}
        io.update(RESET="*i8", START="*i32")
        common = dict(BK=bk, BV=bv, FMAP=1, DELTA=rule == "delta", EPS=1e-5)
        # The values a launch at the benchmark's large shape passes, specialised as the
        # launcher specialises them: every head dim here is marked divisible by 16.
        ints = dict(LAUNCH_INTS, DK=dim, DV=dim)
        cap = C.register_cap_for(dim, dim)
        fwd = compile_sm90(C._forward_kernel, io, dict(common, STORE=True), fwd_warps, ints, cap)
        bwd = compile_sm90(
            C._backward_kernel, io,
            dict(common, FULL=True, FUSE_FMAP=bv >= dim, WRITE_REBUILT=False), bwd_warps, ints, cap,
        )
        for name, compiled in (("forward", fwd), ("backward", bwd)):
            stack, local = stack_and_local_bytes(compiled)
            if stack or local:
                spills.append(f"{name} kernel for head dim {dim}, split {split} ({rule}, {dtype}, "
                              f"register cap {cap}): stack {stack} B, local {local} B")
    assert not spills, "builds that spill registers:\n" + "\n".join(spills)
    # The feature-map backward of head dim 128 split 8 ways (N = T * B * H rows).
    rows = LAUNCH_INTS["T"] * LAUNCH_INTS["B"] * LAUNCH_INTS["H"]
    fmap_bwd = compile_sm90(C._feature_map_backward_kernel, {"X": "*bf16", "DX": "*bf16"},
                            dict(BD=128, FMAP=1, EPS=1e-5), 1, dict(N=rows, NV=8, D=128))
    assert stack_and_local_bytes(fmap_bwd) == (0, 0)


@needs_compiling_triton
def test_register_cap_reaches_the_compiled_kernel():
    """``common.register_cap`` (``fwrl bench kernels --maxnreg``) changes the binary: the
    backward the H100 timed at the large shape (d = 64, split 1, fp32, 8 warps) takes 159
    registers by default and fits 128 without spilling (two programs per SM)."""
    skip_without_sm90_toolchain()
    C = load_kernel_module(KERNEL, interpret=False)
    common = C.launch_options.__globals__  # the common module of the same package copy
    bk, bv, _, bwd_warps = C._block_sizes(64, 64, 1)
    io = {n: "*fp32" for n in ("Q", "K", "V", "BETA", "Y", "DY", "DQ", "DK_", "DV_")}
    io.update(RESET="*i8", START="*i32")
    constexprs = dict(BK=bk, BV=bv, FMAP=1, DELTA=True, EPS=1e-5, FULL=True, FUSE_FMAP=True,
                      WRITE_REBUILT=False)
    ints = dict(LAUNCH_INTS, DK=64, DV=64)

    def backward():
        return compile_sm90(C._backward_kernel, io, constexprs, bwd_warps, ints)

    assert registers(backward()) > 128
    with common["register_cap"](128):
        capped = backward()
    assert registers(capped) <= 128 and stack_and_local_bytes(capped) == (0, 0)
