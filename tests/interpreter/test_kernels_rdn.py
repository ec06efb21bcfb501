"""The fused Triton kernel of the Recurrent Delta Net (paper 000 Eq. 15-18) against its float64 PyTorch reference.

``RDN``, this rule's row of the table (``kernel_rule_tests.Rule``), and the shared tests
(``kernel_rule_tests``) run on it, then the checks only this rule has.
"""

from __future__ import annotations

import torch

import kernel_harness
from kernel_rule_tests import *  # noqa: F403  the shared tests (SHARED_TESTS), run on this rule: pytest_generate_tests
from kernel_rule_tests import (
    FAST_RNN_EXTREME_OPTIONS, FAST_RNN_FEATURE_MAPS, Path, Rule, Shape, against_reference, parametrize_for,
    randn, reset_pattern, rule_inputs, sm90_pairs,
)

_interpret = kernel_harness._interpret  # the autouse fixture: TRITON_INTERPRET=1 in every test


def _rdn_inputs(T, B, H, d, g, *, feature_map="softmax", **_):
    """xq, xk, xv, xb, the recurrent weights Rq, Rk, Rv [H, d, d], rb [H, d] (std 1/sqrt(d)),
    W0 [B, H, d, d], h0. With the identity feature map the keys are scaled by 0.2."""
    r = d**-0.5
    k_scale = 0.2 if feature_map == "identity" else 1.0
    return [randn(g, T, B, H, d), randn(g, T, B, H, d, scale=k_scale), randn(g, T, B, H, d),
            randn(g, T, B, H), randn(g, H, d, d, scale=r), randn(g, H, d, d, scale=r),
            randn(g, H, d, d, scale=r), randn(g, H, d, scale=r), randn(g, B, H, d, d, scale=0.5),
            randn(g, B, H, d)]


def _rdn_extreme(inputs):
    """Pre-activations of +-80 and saturated betas."""
    xq, xk, _, xb = inputs[:4]
    xq[:, 0] = 80.0 * torch.sign(xq[:, 0])
    xk[:, 0] = -80.0
    xk[2:4, 1] = 80.0
    xb[::2] = 80.0
    xb[1::2] = -80.0


def _rdn_rebuild(K, inputs, reset, *, feature_map="softmax", **_):
    fmap = K.KERNEL_FEATURE_MAPS[feature_map]
    y, WT, hT, records = K._forward(*inputs, reset, fmap=fmap, store=True)
    *_, rebuilt = K._backward(*inputs, records, WT, y, torch.zeros_like(y), torch.zeros_like(WT),
                              torch.zeros_like(hT), fmap=fmap, full=True, rebuild=True)
    return [(rebuilt, inputs[8])]


def _rdn_sm90_builds(C):
    """The Atari defaults (d = 32 at hidden 128 / 4 heads and the larger config), d = 16 and
    the largest head dim, 64; s is recorded where y is rounded (fused_recurrent._keeps_s)."""
    def constexprs(C, case):
        d, dtype = case
        bd, fwd_warps, bwd_warps = C._block_sizes(d)
        sizes = dict(D=d, BD=bd, FMAP=2, KEEP_S=dtype != "fp32", EPS=1e-5)
        return (dict(sizes, STORE=True), fwd_warps), (dict(sizes, FULL=True, WRITE_REBUILT=False), bwd_warps)

    cases = [(16, "bf16"), (32, "fp32"), (32, "bf16"), (64, "bf16"), (64, "fp32")]
    io = ("XQ", "XK", "XV", "XB", "Y", "DY", "DXQ", "DXK", "DXV", "DXB")
    yield from sm90_pairs(C, "RDN", cases, io, constexprs, lambda c: f"d={c[0]} ({c[1]})")


RDN = Rule(
    name="rdn",
    inputs=("xq", "xk", "xv", "xb", "Rq", "Rk", "Rv", "rb", "W0", "h0"),
    outputs=("y", "W_T", "h_T"),
    n_steps=4,
    n_state=2,
    make_inputs=_rdn_inputs,
    paths=(Path("registers"),),
    option_groups=FAST_RNN_FEATURE_MAPS,
    shapes=(
        Shape("d=12", T=5, B=2, H=2, d=12),
        # the largest head dim (registers laid out for d = 64); the backward replays the
        # one-step segment before the reset at t = 1
        Shape("d=64", T=3, B=1, H=1, d=64, reset="alternating", losses=("all",)),
    ),
    extreme=_rdn_extreme,
    extreme_options=FAST_RNN_EXTREME_OPTIONS,
    rebuild=_rdn_rebuild,
    max_head_dim=64,
    bad_options=((dict(feature_map="dpfp-1"), "dpfp-1"),),
    accepted_sizes=(),
    refused_sizes=(),
    mismatch=(1, "match"),
    error="no Triton RDN kernel can run",
    cuda_sizes=tuple(dict(d=d) for d in (16, 32, 64)),
    sm90_builds=_rdn_sm90_builds,
)

pytest_generate_tests = parametrize_for(RDN)


# =========================================================================== only this rule


def test_rdn_rebuilt_s_in_chunks(monkeypatch):
    """With y in fp32, s_t is not recorded: the dR GEMM rebuilds it from y (h_0 at t = 0,
    zero after a reset) one chunk at a time. Chunks of one and of three steps (the last one
    short) give the reference's gradients, and the records hold 2d + 1 floats per step
    (3d + 1 with a bf16 y, which is rounded: s is recorded)."""
    K, T, d = RDN.K, 7, 16
    inputs = rule_inputs(RDN, T, 2, 2, d, seed=5)
    reset = reset_pattern(T, 2, "mid")
    step_bytes = 2 * 2 * d * 4
    for steps in (1, 3):
        monkeypatch.setattr(K, "S_CHUNK_BYTES", steps * step_bytes)
        against_reference(RDN, inputs, reset, seed=9, label=f"chunks of {steps} steps")
    *_, (_, _, rec) = K._forward(*(t.float() for t in inputs), reset, fmap=2, store=True)
    assert rec.shape == (T, 2, 2, 2 * d + 1)
    bf16 = [t.bfloat16() if i < RDN.n_steps else t.float() for i, t in enumerate(inputs)]
    *_, (_, _, rec) = K._forward(*bf16, reset, fmap=2, store=True)
    assert rec.shape == (T, 2, 2, 3 * d + 1), "a bf16 y is rounded: s is recorded"
