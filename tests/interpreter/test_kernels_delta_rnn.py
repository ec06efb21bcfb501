"""The fused Triton kernel of the Delta RNN (paper 000 Eq. 12) against its float64 PyTorch reference.

``DELTA_RNN``, this rule's row of the table (``kernel_rule_tests.Rule``), and the shared tests
(``kernel_rule_tests``) run on it.
"""

from __future__ import annotations

import torch

import kernel_harness
from kernel_rule_tests import *  # noqa: F403  the shared tests (SHARED_TESTS), run on this rule: pytest_generate_tests
from kernel_rule_tests import (
    FAST_RNN_EXTREME_OPTIONS, FAST_RNN_FEATURE_MAPS, Path, Rule, Shape, key_features, parametrize_for, randn,
    sm90_pairs,
)

_interpret = kernel_harness._interpret  # the autouse fixture: TRITON_INTERPRET=1 in every test


def _delta_rnn_inputs(T, B, H, d, g, *, feature_map="softmax", **_):
    """q, k, v, beta, kr, vr, betar, W0 [B, H, d, key features], R0 [B, H, d, d], h0. With the
    identity feature map the keys are scaled by 0.2 (the delta rule is then contractive)."""
    k_scale = 0.2 if feature_map == "identity" else 1.0
    return [randn(g, T, B, H, d), randn(g, T, B, H, d, scale=k_scale), randn(g, T, B, H, d),
            randn(g, T, B, H), randn(g, T, B, H, d), randn(g, T, B, H, d), randn(g, T, B, H),
            randn(g, B, H, d, key_features(feature_map, d), scale=0.5),
            randn(g, B, H, d, d, scale=0.5), randn(g, B, H, d)]


def _delta_rnn_extreme(inputs):
    """Logits of +-80, saturated betas and a peaked recurrent softmax at step 0."""
    q, k, _, beta, kr, _, betar, _, _, h0 = inputs
    q[:, 0] = 80.0 * torch.sign(q[:, 0])
    k[:, 0] = -80.0
    k[2:4, 1] = 80.0
    kr[:, 1] = 80.0 * torch.sign(kr[:, 1])
    beta[::2] = 80.0
    beta[1::2] = -80.0
    betar[::2] = -80.0
    betar[1::2] = 80.0
    h0[0] = 80.0


def _delta_rnn_rebuild(K, inputs, reset, *, feature_map="softmax", **_):
    """W0 and R0, undone from W_T, R_T."""
    fmap = K.KERNEL_FEATURE_MAPS[feature_map]
    y, WT, RT, hT, records = K._forward(*inputs, reset, fmap=fmap, store=True)
    *_, rebuilt_W, rebuilt_R = K._backward(
        *inputs[:9], records, WT, RT, torch.zeros_like(y), torch.zeros_like(WT),
        torch.zeros_like(RT), torch.zeros_like(hT), fmap=fmap, full=True, rebuild=True)
    return [(rebuilt_W, inputs[7]), (rebuilt_R, inputs[8])]


def _delta_rnn_sm90_builds(C):
    """d = 16 and 32 with softmax keys, dpfp-1 keys at d = 32, and the largest head dim, 64;
    (d, key features, dtype)."""
    def constexprs(C, case):
        d, dk, _ = case
        bd, bk, fwd_warps, bwd_warps = C._block_sizes(d, dk)
        sizes = dict(D=d, DK=dk, BD=bd, BK=bk, FMAP=2, EPS=1e-5, REPS=1e-6)
        return (dict(sizes, STORE=True), fwd_warps), (dict(sizes, FULL=True, WRITE_REBUILT=False), bwd_warps)

    cases = [(16, 16, "bf16"), (32, 32, "fp32"), (32, 64, "bf16"), (32, 64, "fp32"), (64, 64, "bf16"),
             (64, 64, "fp32")]
    io = ("Q", "K", "V", "BETA", "KR", "VR", "BETAR", "Y", "DY", "DQ", "DK_", "DV", "DBETA", "DKR", "DVR",
          "DBETAR")
    yield from sm90_pairs(C, "Delta RNN", cases, io, constexprs,
                           lambda c: f"d={c[0]}, key features {c[1]} ({c[2]})")


DELTA_RNN = Rule(
    name="delta_rnn",
    inputs=("q", "k", "v", "beta", "kr", "vr", "betar", "W0", "R0", "h0"),
    outputs=("y", "W_T", "R_T", "h_T"),
    n_steps=7,
    n_state=3,
    make_inputs=_delta_rnn_inputs,
    paths=(Path("registers"),),
    option_groups=FAST_RNN_FEATURE_MAPS,
    shapes=(
        Shape("d=12", T=5, B=2, H=2, d=12),
        Shape("d=12-dpfp-1", T=5, B=2, H=1, d=12, options=dict(feature_map="dpfp-1")),  # 24 key features
        # the largest head dim; the backward replays the one-step segment before t = 1 from W0, R0
        Shape("d=64", T=3, B=1, H=1, d=64, reset="alternating", losses=("all",)),
    ),
    extreme=_delta_rnn_extreme,
    extreme_options=FAST_RNN_EXTREME_OPTIONS,
    rebuild=_delta_rnn_rebuild,
    max_head_dim=64,
    bad_options=((dict(feature_map="relu"), "feature_map"),),
    accepted_sizes=(),
    refused_sizes=((dict(d=32, feature_map="dpfp-2"), "128"),),  # 4 * 32 key features
    mismatch=(1, "match"),
    error="no Triton Delta RNN kernel can run",
    cuda_sizes=tuple(dict(d=d) for d in (16, 32, 64)),
    sm90_builds=_delta_rnn_sm90_builds,
)

pytest_generate_tests = parametrize_for(DELTA_RNN)
