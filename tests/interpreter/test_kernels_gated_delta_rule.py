"""The fused Triton kernel of the gated delta rule (Gated DeltaNet, Yang et al. 2025, Eq. 10) against its float64 PyTorch reference.

``GATED_DELTA_RULE``, this rule's row of the table (``kernel_rule_tests.Rule``), and the shared tests
(``kernel_rule_tests``) run on it.
"""

from __future__ import annotations

import torch

from fwrl.kernels import GRAD_MODES
import kernel_harness
from kernel_harness import LAUNCH_INTS, compile_sm90
from kernel_rule_tests import *  # noqa: F403  the shared tests (SHARED_TESTS), run on this rule: pytest_generate_tests
from kernel_rule_tests import Path, Rule, Shape, parametrize_for, randn

_interpret = kernel_harness._interpret  # the autouse fixture: TRITON_INTERPRET=1 in every test


def _gated_delta_rule_inputs(T, B, H, d, g, *, dv=None, feature_map="l2norm", **_):
    """q, k [T, B, H, d], v [T, B, H, dv], beta, the log-decays -softplus(N(0, 1)) (alpha from ~0.05
    to ~1), S0 [B, H, dv, d]. With the identity feature map the keys are scaled by 0.2."""
    dv = d if dv is None else dv
    k_scale = 0.2 if feature_map == "identity" else 1.0
    return [randn(g, T, B, H, d), randn(g, T, B, H, d, scale=k_scale), randn(g, T, B, H, dv), randn(g, T, B, H),
            -torch.nn.functional.softplus(randn(g, T, B, H)), randn(g, B, H, dv, d, scale=0.5)]


def _gated_delta_rule_extreme(inputs):
    """Logits of +-80, saturated betas, and gates that forget everything (log-decay -80: alpha = 2e-35,
    which the backward never divides by) on alternate steps, none (0) on the others."""
    q, k, _, beta, g, _ = inputs
    q[:, 0] = 80.0 * torch.sign(q[:, 0])
    k[:, 0] = -80.0
    k[2:4, 1] = 80.0
    beta[::2] = 80.0
    beta[1::2] = -80.0
    g[::2] = -80.0
    g[1::2] = 0.0


def _gated_delta_rule_rebuild(K, inputs, reset, *, feature_map="l2norm", **_):
    """S0 undone from S_T by division alone (one chunk, no budget): with log-decays scaled by 0.01
    (alpha >= ~0.95), so the round-off grows by at most e^(sum of the decays undone)."""
    q, k, v, beta, g, S0 = inputs
    g = 0.01 * g
    code = K.FMAP_CODES[feature_map]
    y, ST, records = K._forward(q, k, v, beta, g, S0, reset, fmap=code, store=True, anchor_every=q.shape[0] + 1)
    *_, rebuilt = K._backward(q, k, v, beta, g, S0, records, ST, torch.zeros_like(y), torch.zeros_like(ST),
                              fmap=code, full=True, rebuild=True, budget=float("inf"))
    return [(rebuilt, S0)]


# (dim, split, dtype) of the sm_90 builds: the head dims of the presets and the supported range, one
# program per (batch, head) and split; the l2norm map (the core's default).
GATED_DELTA_RULE_COMPILE_CASES = [(16, 1, "bf16"), (32, 1, "bf16"), (32, 1, "fp32"), (64, 1, "fp32"), (64, 1, "bf16"),
                                  (64, 2, "bf16"), (128, 1, "fp32"), (128, 8, "bf16")]
# The stack the backward at head dim 64 keeps under the register cap it takes from the delta rule's
# kernel (fused_recurrent.MAXNREG): 8 bytes on sm_90 with Triton 3.9 (uncapped: none; the delta rule's
# capped backward is allowed 32, DELTA_RULE_CAPPED_STACK_BYTES). Anything more, or any stack without
# a cap, fails.
GATED_DELTA_RULE_CAPPED_STACK_BYTES = 8


def _gated_delta_rule_io(dtype):
    io = {n: f"*{dtype}" for n in ("Q", "K", "V", "BETA", "G", "Y", "DY", "DQ", "DK_", "DV_")}
    io.update(RESET="*i8")
    return io


def _gated_delta_rule_sm90_builds(C):
    """The forward and backward kernels under the register cap their launches pass, at the values a
    launch at the benchmark's large shape passes (anchors every ANCHOR_EVERY steps, the default decay
    budget), and the feature-map backward of head dim 128 split 8 ways."""
    for dim, split, dtype in GATED_DELTA_RULE_COMPILE_CASES:
        bk, bv, fwd_warps, bwd_warps = C._block_sizes(dim, dim, split)
        common = dict(BK=bk, BV=bv, FMAP=C.FMAP_CODES["l2norm"], EPS=C._eps(C.FMAP_CODES["l2norm"]))
        ints = dict(LAUNCH_INTS, DK=dim, DV=dim, CHUNK=C.ANCHOR_EVERY)
        cap = C.register_cap_for(dim, dim)
        label = f"kernel for head dim {dim}, split {split} ({dtype}, register cap {cap})"
        yield (f"forward {label}", compile_sm90(C._forward_kernel, _gated_delta_rule_io(dtype),
                                               dict(common, STORE=True), fwd_warps, ints, cap), None)
        backward = dict(common, FULL=True, FUSE_FMAP=bv >= dim, WRITE_REBUILT=False)
        yield (f"backward {label}", compile_sm90(C._backward_kernel, _gated_delta_rule_io(dtype), backward, bwd_warps,
                                                dict(ints, BUDGET=C.DECAY_BUDGET), cap), None,
               GATED_DELTA_RULE_CAPPED_STACK_BYTES if cap else 0)
    rows = LAUNCH_INTS["T"] * LAUNCH_INTS["B"] * LAUNCH_INTS["H"]
    yield ("feature-map backward kernel for head dim 128 split 8",
           compile_sm90(C._feature_map_backward_kernel, {"X": "*bf16", "DX": "*bf16"},
                        dict(BD=128, FMAP=C.FMAP_CODES["l2norm"], EPS=1e-6), 1, dict(N=rows, NV=8, D=128)), None)


GATED_DELTA_RULE = Rule(
    name="gated_delta_rule",
    inputs=("q", "k", "v", "beta", "g", "S0"),
    outputs=("y", "S_T"),
    n_steps=5,
    n_state=1,
    make_inputs=_gated_delta_rule_inputs,
    paths=(
        # one chunk at these T: S_{t-1} by division, replays at the episode starts
        Path("divide", taken=lambda K: K.ANCHOR_EVERY == 16 and K.DECAY_BUDGET == 4.0),
        # anchors every 3 steps (loaded at each chunk's start) and a budget of 0.5 (alpha >= 0.61 on
        # the steps undone by division): replays wherever the decays are strong
        Path("anchors-and-replays", patch=dict(ANCHOR_EVERY=3, DECAY_BUDGET=0.5), reversal_steps=12,
             taken=lambda K: K.ANCHOR_EVERY == 3),
    ),
    option_groups={"l2norm": (dict(feature_map="l2norm"),),
                   "other-maps": tuple(dict(feature_map=f) for f in ("elu1_sumnorm", "softmax", "identity"))},
    shapes=(
        *(Shape(f"H=2-{grad_mode}", T=5, B=2, H=2, d=16, options=dict(grad_mode=grad_mode)) for grad_mode in GRAD_MODES),
        Shape("dk=20-dv=24", T=4, B=1, H=2, d=20, sizes=dict(dv=24), losses=("all",)),
        # the largest head dim: four row blocks (the feature-map backward kernel adds their d phi)
        Shape("d=128", T=3, B=1, H=1, d=128, reset="alternating", losses=("all",),
              taken=lambda K: K._block_sizes(128, 128)[1] == 32),
    ),
    extreme=_gated_delta_rule_extreme,
    extreme_options=((dict(feature_map="l2norm"), True), (dict(feature_map="elu1_sumnorm"), True)),
    rebuild=_gated_delta_rule_rebuild,
    max_head_dim=128,
    bad_options=((dict(feature_map="dpfp-1"), "feature_map"),),
    accepted_sizes=(dict(dv=24),),
    refused_sizes=((dict(d=16, dv=129), "value 129"),),
    mismatch=(1, "match"),
    error=r"FWRL_KERNELS=triton but no Triton gated delta rule kernel",
    cuda_sizes=tuple(dict(d=d) for d in (16, 32, 64, 128)),
    sm90_builds=_gated_delta_rule_sm90_builds,
    low_precision=(torch.bfloat16, torch.float16),
)

pytest_generate_tests = parametrize_for(GATED_DELTA_RULE)
