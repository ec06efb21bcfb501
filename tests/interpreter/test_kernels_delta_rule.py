"""The fused Triton kernel of the sum rule and the delta rule (paper 001 Eq. 20-25) against its float64 PyTorch reference.

``DELTA_RULE``, this rule's row of the table (``kernel_rule_tests.Rule``), and the shared tests
(``kernel_rule_tests``) run on it, then the checks only this rule has.
"""

from __future__ import annotations

import pytest
import torch

from fwrl.kernels import GRAD_MODES
import kernel_harness
from kernel_harness import (
    LAUNCH_INTS, compile_sm90, launch_specialisation, load_kernel_module, needs_compiling_triton, registers,
    skip_without_sm90_toolchain, stack_and_local_bytes,
)
from kernel_rule_tests import *  # noqa: F403  the shared tests (SHARED_TESTS), run on this rule: pytest_generate_tests
from kernel_rule_tests import (
    Path, Rule, Shape, against_reference, key_features, parametrize_for, randn, reset_pattern, rule_inputs,
)

_interpret = kernel_harness._interpret  # the autouse fixture: TRITON_INTERPRET=1 in every test


def _delta_rule_inputs(T, B, H, d, g, *, dv=None, feature_map="elu1_sumnorm", **_):
    """q, k [T, B, H, d], v [T, B, H, dv], beta, W0 [B, H, dv, key features]."""
    dv = d if dv is None else dv
    return [randn(g, T, B, H, d), randn(g, T, B, H, d), randn(g, T, B, H, dv), randn(g, T, B, H),
            randn(g, B, H, dv, key_features(feature_map, d), scale=0.5)]


def _delta_rule_extreme(inputs):
    """Logits of +-80 (all-zero sum-normalised keys after elu + 1 of -80) and saturated betas."""
    q, k, _, beta, _ = inputs
    q[:, 0] = 80.0 * torch.sign(q[:, 0])
    k[:, 0] = -80.0
    k[2:4, 1] = 80.0
    beta[::2] = 80.0
    beta[1::2] = -80.0


def _delta_rule_rebuild(K, inputs, reset, *, rule="delta", feature_map="elu1_sumnorm", **_):
    q, k, v, beta, W0 = inputs
    delta, code = rule == "delta", K.KERNEL_FEATURE_MAPS[feature_map]
    y, WT, records = K._forward(q, k, v, beta, W0, reset, delta=delta, fmap=code, store=True)
    *_, rebuilt = K._backward(q, k, v, beta, W0, records, WT, torch.zeros_like(y),
                              torch.zeros_like(WT), delta=delta, fmap=code, full=True, rebuild=True)
    return [(rebuilt, W0)]


# Shipped configurations: head dims of the presets and the supported range, split over 1
# program per (batch, head) and over the row blocks ``split`` gives (``--split`` of the
# benchmark, ``auto`` on small grids); (dim, split, rule, dtype). (64, 1, "delta", "fp32") is
# what the H100 timed at the large shape (split auto).
# The stack a backward build under the register cap may keep: on the H200 at 35e8e0f, Triton
# 3.6 kept 24 B of stack (no local memory) in the fp32 backward at head dim 64 under cap 128,
# and that binary ran fwd+bwd 1.43x faster than the uncapped one at (256, 101, 8, 64)
# (benchmarks/results/gpu/kernels-h200-35e8e0f). Anything more, or any stack without a cap,
# fails.
DELTA_RULE_CAPPED_STACK_BYTES = 32
DELTA_RULE_COMPILE_CASES = [(16, 1, "delta", "bf16"), (32, 1, "delta", "bf16"), (32, 2, "delta", "bf16"),
                            (64, 1, "sum", "fp32"), (64, 1, "delta", "fp32"), (64, 2, "delta", "bf16"),
                            (64, 4, "delta", "fp32"), (128, 1, "delta", "fp32"), (128, 8, "delta", "bf16")]


def _delta_rule_io(dtype):
    io = {n: f"*{dtype}" for n in ("Q", "K", "V", "BETA", "Y", "DY", "DQ", "DK_", "DV_")}
    io.update(RESET="*i8", START="*i32")
    return io


def _delta_rule_sm90_builds(C):
    """The forward/backward kernels under the register cap their launches pass
    (``register_cap_for``), at the values a launch at the benchmark's large shape passes (every
    head dim here marked divisible by 16), and the feature-map backward of head dim 128 split
    8 ways (N = T * B * H rows)."""
    for dim, split, rule, dtype in DELTA_RULE_COMPILE_CASES:
        bk, bv, fwd_warps, bwd_warps = C._block_sizes(dim, dim, split)
        common = dict(BK=bk, BV=bv, FMAP=1, DELTA=rule == "delta", EPS=1e-5)
        ints = dict(LAUNCH_INTS, DK=dim, DV=dim)
        cap = C.register_cap_for(dim, dim)
        label = f"kernel for head dim {dim}, split {split} ({rule}, {dtype}, register cap {cap})"
        yield (f"forward {label}", compile_sm90(C._forward_kernel, _delta_rule_io(dtype),
                                               dict(common, STORE=True), fwd_warps, ints, cap), None)
        backward = dict(common, FULL=True, FUSE_FMAP=bv >= dim, WRITE_REBUILT=False)
        yield (f"backward {label}", compile_sm90(C._backward_kernel, _delta_rule_io(dtype), backward,
                                                bwd_warps, ints, cap), None,
               DELTA_RULE_CAPPED_STACK_BYTES if cap else 0)
    rows = LAUNCH_INTS["T"] * LAUNCH_INTS["B"] * LAUNCH_INTS["H"]
    yield ("feature-map backward kernel for head dim 128 split 8",
           compile_sm90(C._feature_map_backward_kernel, {"X": "*bf16", "DX": "*bf16"},
                        dict(BD=128, FMAP=1, EPS=1e-5), 1, dict(N=rows, NV=8, D=128)), None)


DELTA_RULE = Rule(
    name="delta_rule",
    inputs=("q", "k", "v", "beta", "W0"),
    outputs=("y", "W_T"),
    n_steps=4,
    n_state=1,
    make_inputs=_delta_rule_inputs,
    paths=(Path("registers", taken=lambda K: K._block_sizes(16, 16)[1] >= 16),),
    option_groups={f"{rule}-{fmap}": (dict(rule=rule, feature_map=fmap),)
                   for rule in ("delta", "sum") for fmap in ("elu1_sumnorm", "softmax")},
    shapes=(
        *(Shape(f"H=2-{grad_mode}", T=5, B=2, H=2, d=16, options=dict(grad_mode=grad_mode))
          for grad_mode in GRAD_MODES),
        *(Shape(f"dk=20-dv=24-{rule}", T=4, B=1, H=2, d=20, sizes=dict(dv=24), options=dict(rule=rule),
                losses=("all",)) for rule in ("delta", "sum")),
        # dpfp-1 is applied outside the kernel (it doubles the key features: W0 is [16, 16])
        Shape("dpfp-1", T=3, B=1, H=1, d=8, sizes=dict(dv=16), options=dict(feature_map="dpfp-1"),
              losses=("all",)),
    ),
    extreme=_delta_rule_extreme,
    extreme_options=tuple((dict(rule=rule, feature_map=fmap), True)
                          for rule in ("delta", "sum") for fmap in ("elu1_sumnorm", "softmax")),
    rebuild=_delta_rule_rebuild,
    max_head_dim=128,
    bad_options=((dict(rule="oja"), "rule"), (dict(feature_map="relu"), "feature_map")),
    accepted_sizes=(),
    refused_sizes=((dict(d=32, feature_map="dpfp-3"), "192"),),  # 6 * 32 key features
    mismatch=(1, "match"),
    error=r"FWRL_KERNELS=triton but .*delta.rule kernel",
    cuda_sizes=tuple(dict(d=d) for d in (16, 32, 64, 128)),
    sm90_builds=_delta_rule_sm90_builds,
    low_precision=(torch.bfloat16, torch.float16),
)

pytest_generate_tests = parametrize_for(DELTA_RULE)


# =========================================================================== only this rule


_DR = DELTA_RULE.K


@pytest.mark.parametrize("dk,dv,split,rule,feature_map,T,H,reset", [
    (20, 24, 2, rule, fmap, 4, 2, "mid") for rule in ("delta", "sum") for fmap in ("elu1_sumnorm", "softmax")
] + [(64, 64, 4, "delta", "softmax", 3, 1, "alternating"), (32, 32, 8, "delta", "softmax", 3, 1, "alternating")])
def test_delta_rule_rows_split_over_programs(dk, dv, split, rule, feature_map, T, H, reset):
    """W's rows over ``split`` programs per (batch, head) (Dk != Dv odd sizes, a partly masked
    last block; 16 and 4 rows each at 64 and 32), the dq / dk partials (and the feature-map
    backward) added afterwards: the reference's values and gradients, with resets."""
    assert -(-dv // _DR._block_sizes(dk, dv, split)[1]) == split
    options = dict(rule=rule, feature_map=feature_map)
    inputs = rule_inputs(DELTA_RULE, T, 1, H, dk, seed=dk, dv=dv, **options)
    against_reference(DELTA_RULE, inputs, reset_pattern(T, 1, reset), seed=dk, options=options,
                       kernel_options=dict(split=split), label=f"dk={dk} dv={dv} split={split} {options}")


def test_delta_rule_auto_split_fills_the_sms(monkeypatch):
    """auto: the fewest programs per (batch, head) that give one per SM (132 on an H100),
    keeping at least 16 rows each; 1 off CUDA."""

    class H100:
        multi_processor_count = 132

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: H100)
    cuda = torch.device("cuda")
    assert _DR.choose_split("auto", 32 * 4, 32, cuda) == 2  # 128 programs < 132
    assert _DR.choose_split("auto", 32 * 8, 32, cuda) == 1  # 256 already
    assert _DR.choose_split("auto", 8 * 2, 64, cuda) == 4  # 16 -> 64 programs, 16 rows each
    assert _DR.choose_split("auto", 32 * 4, 16, cuda) == 1  # 8 rows would be too few
    assert _DR.choose_split("auto", 32 * 4, 32, torch.device("cpu")) == 1
    assert _DR.choose_split(4, 32 * 8, 32, cuda) == 4
    with pytest.raises(Exception, match="split"):
        _DR.choose_split(3, 1, 32, cuda)


@pytest.mark.parametrize("rule", ["delta", "sum"])
def test_delta_rule_dpfp_of_zero_keys_stays_finite(rule):
    """dpfp of all-zero keys is all zero (sum-normalised: 0 / (0 + eps)), applied outside the
    kernel; only y in the loss."""
    T = 6
    options = dict(rule=rule, feature_map="dpfp-1")
    inputs = rule_inputs(DELTA_RULE, T, 2, 1, 16, seed=13, **options)
    inputs[1] = torch.zeros_like(inputs[1])
    against_reference(DELTA_RULE, inputs, reset_pattern(T, 2, "mid"), seed=2, options=options, losses="y only",
                       label="dpfp zero keys")


def test_delta_rule_backward_memory_follows_from_shapes():
    """What the forward keeps for backward has the same sizes whatever the resets (no
    pre-reset states sized by a count read from the device)."""
    T = 6
    inputs = [x.float() for x in rule_inputs(DELTA_RULE, T, 2, 1, 16, seed=6)]
    kept = {}
    for pattern in ("none", "mid", "everywhere"):
        *_, records = _DR._forward(*inputs, reset_pattern(T, 2, pattern), delta=True, fmap=1, store=True)
        kept[pattern] = [tuple(r.shape) for r in records]
        assert sum(r.numel() for r in records) == T * 2 * (1 + 1 + 16)  # reset, start, r
    assert kept["none"] == kept["mid"] == kept["everywhere"]


def test_delta_rule_replay_starts():
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
    assert torch.equal(_DR.replay_starts(reset), expected)


@needs_compiling_triton
def test_delta_rule_compile_checks_specialise_as_the_launcher():
    """The sm_90 checks compile the kernel a launch compiles: the harness's signature,
    constants and attributes equal those of Triton's own launcher path (the binder of
    ``JITFunction.run`` and ``_pack_args``) for the same argument values; DK, DV and B
    divisible by 16 are marked so, T = H = 1 become constants."""
    skip_without_sm90_toolchain()
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import MockTensor, create_function_from_signature

    kernel = load_kernel_module("delta_rule", interpret=False)._backward_kernel
    target = GPUTarget("cuda", 90, 64)
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    io = {"Q": "*bf16", "RESET": "*i8", "START": "*i32"}
    dtypes = {"*bf16": torch.bfloat16, "*i8": torch.int8, "*i32": torch.int32}
    constexprs = dict(BK=64, BV=64, FMAP=1, DELTA=True, FULL=True, FUSE_FMAP=True, WRITE_REBUILT=False,
                      EPS=1e-5)
    for ints in (dict(LAUNCH_INTS, DK=64, DV=64), dict(T=1, B=3, H=1, DK=20, DV=48)):
        args = [ints[n] if n in ints else MockTensor(dtypes.get(io.get(n), torch.float32))
                for n in kernel.arg_names if n not in constexprs]
        launch = dict(constexprs, num_warps=8, enable_fp_fusion=True)  # as launch_options gives
        bound, specialization, options = binder(*args, **launch)
        _, signature, consts, attrs = kernel._pack_args(backend, launch, bound, specialization, options)
        ours = launch_specialisation(kernel, target, io, constexprs, ints)
        assert ours[0] == signature, ints
        assert {(kernel.arg_names.index(k),): v for k, v in ours[1].items()} == consts, ints
        assert ours[2] == attrs, ints
        divisible = {n for n in ints if attrs[(kernel.arg_names.index(n),)] == [["tt.divisibility", 16]]}
        assert divisible == ({"B", "DK", "DV"} if ints["T"] > 1 else {"DV"}), ints
        assert ("T" in ours[1]) == (ints["T"] == 1)


@needs_compiling_triton
def test_delta_rule_register_cap_reaches_the_compiled_kernel():
    """Launches cap registers at 128 from head dim 64 on (``register_cap_for``), and
    ``common.register_cap`` (``fwrl bench kernels --maxnreg``) changes the binary: the
    backward the H100 timed at the large shape (d = 64, split 1, fp32, 8 warps) takes 159
    registers by default and fits 128 without spilling (two programs per SM)."""
    skip_without_sm90_toolchain()
    C = load_kernel_module("delta_rule", interpret=False)
    assert [C.register_cap_for(d, d) for d in (16, 32, 64, 128)] == [None, None, 128, 128]
    common = C.launch_options.__globals__  # the common module of the same package copy
    bk, bv, _, bwd_warps = C._block_sizes(64, 64, 1)
    constexprs = dict(BK=bk, BV=bv, FMAP=1, DELTA=True, EPS=1e-5, FULL=True, FUSE_FMAP=True, WRITE_REBUILT=False)

    def backward():
        return compile_sm90(C._backward_kernel, _delta_rule_io("fp32"), constexprs, bwd_warps,
                            dict(LAUNCH_INTS, DK=64, DV=64))

    assert registers(backward()) > 128
    with common["register_cap"](128):
        capped = backward()
    assert registers(capped) <= 128 and stack_and_local_bytes(capped) == (0, 0)
