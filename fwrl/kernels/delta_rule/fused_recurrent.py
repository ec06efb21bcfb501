"""Fused Triton sum rule / delta rule over a whole rollout (one launch per layer).

The maths is ``fwrl.kernels.delta_rule.naive`` (paper 001, Eq. 20-21 for
the sum rule and Eq. 23-25 for the delta rule, read after the update):

    vbar_t = W_{t-1} phi(k_t)
    W_t    = W_{t-1} + sigma(beta_t) (v_t - vbar_t) phi(k_t)^T      (delta)
    W_t    = W_{t-1} + v_t phi(k_t)^T                               (sum)
    y_t    = W_t phi(q_t)

Layout: one program per (batch, head, block of BV rows of W). The rows of W
evolve independently given phi(k_t), phi(q_t) and sigma(beta_t), so a block
of rows is carried in registers in fp32 for the whole sequence; the feature
maps and the sigmoid are computed in the kernel. ``split`` sets how many
programs share one (batch, head): 1 keeps W in one program where it fits,
2 / 4 / 8 give each program 1/2, 1/4, 1/8 of the rows (exact: no row reads
another), ``auto`` splits until the grid covers the GPU's SMs (a rollout of
B 32 x H 4 is 128 programs of one head each, fewer than an H100's 132 SMs).

Backward, without storing the T states: the forward writes, per step, the
fp32 record ``r_t = v_t - vbar_t`` (delta rule; the sum rule needs none), so
``u_t = sigma(beta_t) r_t`` is recomputed bit for bit and the update is undone
exactly as a subtraction, ``W_{t-1} = W_t - u_t phi(k_t)^T``; no inverse of
``(I - beta k k^T)`` is ever formed, so saturated betas and one-hot keys are
harmless. A reset at t >= 1 makes W_{t-1} unrecoverable from W_t, so the
backward rebuilds it by replaying the recorded updates ``u_j phi(k_j)^T`` of
the episode segment that ends at t - 1, from that segment's start (W0 or 0;
``common.replay_starts``): no state is stored, the memory kept for backward is
the T x Dv records (plus the inputs), and sizes follow from shapes, so a call
has no host synchronisation and can be captured in a CUDA graph. Replaying
costs at most one rank-1 update per step (segments are disjoint).
Gradients, with ``G_t = dW_t + dy_t phi(q_t)^T`` and ``u_t = b_t (v_t - vbar_t)``:

    d phi(q_t) = W_t^T dy_t
    du_t       = G_t phi(k_t)
    dv_t       = b_t du_t                       (sum rule: dv_t = du_t)
    d beta_t   = (du_t . r_t) b_t (1 - b_t)
    d phi(k_t) = G_t^T u_t - b_t W_{t-1}^T du_t
    dW_{t-1}   = keep_t (G_t - b_t du_t phi(k_t)^T)   (grad_mode full; 0 for step)

Partial sums over row blocks are written separately and added afterwards in a
fixed order: no atomics, bitwise-deterministic results.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

from fwrl.errors import unknown_choice
from fwrl.kernels import GRAD_MODES
from fwrl.kernels.feature_maps import SUM_NORM_EPS, apply_feature_map, feature_dim

from ..triton.common import (
    EMPTY_SEQUENCE, KERNEL_FEATURE_MAPS, _flag, _lanes, _matvec, _phi, _phi_backward, _sigmoid,
    _sum, _tile, _vecmat, aligned, launch_options, option_reasons, padded, rank_reasons,
    replay_starts, tensor_reasons, warps_for,
)

RULES = ("delta", "sum")
# Feature maps computed inside the kernel (KERNEL_FEATURE_MAPS); "dpfp-N" is
# applied in PyTorch before the kernel (which then runs with the identity map).
FEATURE_MAPS = ("elu1_sumnorm", "softmax", "identity", "dpfp-1", "dpfp-2", "dpfp-3")
MAX_HEAD_DIM = 128
# Largest W block one program keeps in registers (elements).
MAX_BLOCK_ELEMENTS = 4096
# Programs per (batch, head) that ``split="auto"`` may use, and the fewest rows
# of W it leaves to one program.
SPLITS = (1, 2, 4, 8)
MIN_AUTO_ROWS = 16
# Registers per thread of the forward and backward kernels (``launch_options``) at head dims of at
# least ``CAPPED_FROM_DIM``. The GPU suite's A/B (``fwrl bench kernels --maxnreg 255 128``, fp32
# fwd+bwd, each pair side by side; benchmarks/results/gpu/) found the cap of 128 about 1.5x faster at
# (256, 101, 8, 64) on H200 and H100 boxes: twice the programs per SM. At (32, 51, 4, 32) it was a
# wash, and Triton 3.6 spills the bf16 backward at head dim 32 under it, so smaller heads keep the
# uncapped binary.
MAXNREG = 128
CAPPED_FROM_DIM = 64


def register_cap_for(dk: int, dv: int) -> int | None:
    """The register cap of a launch at head dims (dk, dv): ``MAXNREG`` from ``CAPPED_FROM_DIM`` on,
    else none (``launch_options`` then gives each thread what a block's share allows)."""
    return MAXNREG if max(dk, dv) >= CAPPED_FROM_DIM else None


@triton.jit
def _forward_kernel(
    Q, K, V, BETA, W0, RESET,  # inputs
    Y, WT, REC,  # outputs (REC only with STORE and DELTA)
    T, B, H, DK, DV,
    BK: tl.constexpr, BV: tl.constexpr, FMAP: tl.constexpr, DELTA: tl.constexpr,
    STORE: tl.constexpr, EPS: tl.constexpr,
):
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    b = i_bh // H
    ok, mk = _lanes(0, BK, DK)
    ov, mv = _lanes(i_v * BV, BV, DV)
    wm, w_loc = _tile(ov, mv, ok, mk, DK)
    W = tl.load(W0 + i_bh * DV * DK + w_loc, mask=wm, other=0.0).to(tl.float32)
    for t in range(T):
        row = t * B * H + i_bh  # index of (t, b, h)
        W = tl.where(tl.load(RESET + t * B + b) != 0, 0.0, W)
        k = _phi(tl.load(K + row * DK + ok, mask=mk, other=0.0).to(tl.float32), mk, FMAP, EPS)
        q = _phi(tl.load(Q + row * DK + ok, mask=mk, other=0.0).to(tl.float32), mk, FMAP, EPS)
        v = tl.load(V + row * DV + ov, mask=mv, other=0.0).to(tl.float32)
        if DELTA:
            r = v - _matvec(W, k)
            if STORE:
                tl.store(REC + row * DV + ov, r, mask=mv)
            u = _sigmoid(tl.load(BETA + row).to(tl.float32)) * r
        else:
            u = v
        W = W + u[:, None] * k[None, :]
        tl.store(Y + row * DV + ov, _matvec(W, q).to(Y.dtype.element_ty), mask=mv)
    tl.store(WT + i_bh * DV * DK + w_loc, W, mask=wm)


@triton.jit
def _update(K, V, BETA, REC, row, ok, ov, mk, mv, DK, DV,
            FMAP: tl.constexpr, DELTA: tl.constexpr, EPS: tl.constexpr):
    """(u, phi(k)) of one step, recomputed from the inputs and the fp32 record:
    W_t = W_{t-1} + u phi(k)^T, bit for bit as in the forward."""
    k = _phi(tl.load(K + row * DK + ok, mask=mk, other=0.0).to(tl.float32), mk, FMAP, EPS)
    if DELTA:
        r = tl.load(REC + row * DV + ov, mask=mv, other=0.0)
        u = _sigmoid(tl.load(BETA + row).to(tl.float32)) * r
    else:
        u = tl.load(V + row * DV + ov, mask=mv, other=0.0).to(tl.float32)
    return u, k


@triton.jit
def _backward_kernel(
    Q, K, V, BETA, W0, RESET, START, REC, WT,  # forward inputs and records
    DY, DWT,  # incoming gradients
    DQ, DK_, DV_, DBETA, DW0, REBUILT,  # outputs
    T, B, H, DK, DV,
    BK: tl.constexpr, BV: tl.constexpr, FMAP: tl.constexpr, DELTA: tl.constexpr,
    FULL: tl.constexpr, FUSE_FMAP: tl.constexpr, WRITE_REBUILT: tl.constexpr,
    EPS: tl.constexpr,
):
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    b = i_bh // H
    TBH = T * B * H
    ok, mk = _lanes(0, BK, DK)
    ov, mv = _lanes(i_v * BV, BV, DV)
    wm, w_loc = _tile(ov, mv, ok, mk, DK)
    W = tl.load(WT + i_bh * DV * DK + w_loc, mask=wm, other=0.0)
    dW = tl.load(DWT + i_bh * DV * DK + w_loc, mask=wm, other=0.0).to(tl.float32)
    for i in range(T):
        t = T - 1 - i
        row = t * B * H + i_bh
        reset = tl.load(RESET + t * B + b) != 0
        xk = tl.load(K + row * DK + ok, mask=mk, other=0.0).to(tl.float32)
        xq = tl.load(Q + row * DK + ok, mask=mk, other=0.0).to(tl.float32)
        q = _phi(xq, mk, FMAP, EPS)
        dy = tl.load(DY + row * DV + ov, mask=mv, other=0.0).to(tl.float32)
        G = dW + dy[:, None] * q[None, :]
        dq = _vecmat(W, dy)
        k = _phi(xk, mk, FMAP, EPS)
        if DELTA:
            beta = _sigmoid(tl.load(BETA + row).to(tl.float32))
            r = tl.load(REC + row * DV + ov, mask=mv, other=0.0)
            u = beta * r
        else:
            u = tl.load(V + row * DV + ov, mask=mv, other=0.0).to(tl.float32)
        # Undo the update: the state this step started from (after its reset).
        A = tl.where(reset, 0.0, W - u[:, None] * k[None, :])
        du = _matvec(G, k)
        dk = _vecmat(G, u)
        if DELTA:
            dvbar = -beta * du
            dv = beta * du
            tl.store(DBETA + i_v * TBH + row, _sum(du * r, 0) * beta * (1.0 - beta))
            dk += _vecmat(A, dvbar)
            dA = G + dvbar[:, None] * k[None, :]
        else:
            dv = du
            dA = G
        tl.store(DV_ + row * DV + ov, dv.to(DV_.dtype.element_ty), mask=mv)
        if FUSE_FMAP:
            dq = _phi_backward(xq, dq, mk, FMAP, EPS)
            dk = _phi_backward(xk, dk, mk, FMAP, EPS)
        tl.store(DQ + (i_v * TBH + row) * DK + ok, dq.to(DQ.dtype.element_ty), mask=mk)
        tl.store(DK_ + (i_v * TBH + row) * DK + ok, dk.to(DK_.dtype.element_ty), mask=mk)
        if FULL:
            dW = tl.where(reset, 0.0, dA)
        else:
            dW = tl.full([BV, BK], 0.0, tl.float32)
        # The state before this step. After a reset at t >= 1: replay the
        # segment that ends at t - 1 from its start (W0, or 0 after a reset).
        start = tl.load(START + t * B + b)
        if start >= 0:
            W = tl.load(W0 + i_bh * DV * DK + w_loc, mask=_flag(wm, start == 0), other=0.0)
            W = W.to(tl.float32)
            for j in range(start, t):
                W = tl.where(tl.load(RESET + j * B + b) != 0, 0.0, W)
                uj, kj = _update(K, V, BETA, REC, j * B * H + i_bh, ok, ov, mk, mv, DK, DV,
                                 FMAP, DELTA, EPS)
                W = W + uj[:, None] * kj[None, :]
        else:
            W = A
    tl.store(DW0 + i_bh * DV * DK + w_loc, dW.to(DW0.dtype.element_ty), mask=wm)
    if WRITE_REBUILT:
        tl.store(REBUILT + i_bh * DV * DK + w_loc, W, mask=wm)


@triton.jit
def _feature_map_backward_kernel(
    X, DPHI, DX, N, NV, D,
    BD: tl.constexpr, FMAP: tl.constexpr, EPS: tl.constexpr,
):
    """dx for one row from the partial d phi(x) of NV row blocks, added in order."""
    row = tl.program_id(0).to(tl.int64)
    od = tl.arange(0, BD)
    md = od < D
    x = tl.load(X + row * D + od, mask=md, other=0.0).to(tl.float32)
    dphi = tl.full([BD], 0.0, tl.float32)
    for j in range(NV):
        dphi += tl.load(DPHI + (j * N + row) * D + od, mask=md, other=0.0)
    dx = _phi_backward(x, dphi, md, FMAP, EPS)
    tl.store(DX + row * D + od, dx.to(DX.dtype.element_ty), mask=md)


def _block_sizes(dk: int, dv: int, split: int = 1) -> tuple[int, int, int, int]:
    """(BK, BV, forward warps, backward warps): all of a key row, BV rows of W per program.

    BV covers ``ceil(dv / split)`` rows, at most MAX_BLOCK_ELEMENTS / BK of them
    (head dim 128: four programs of 32 rows even at split 1). The warps keep
    both kernels free of spills on sm_90 (``tests/interpreter/test_kernels_delta_rule.py``).
    """
    bk = padded(dk)
    bv = min(max(1, triton.next_power_of_2(triton.cdiv(dv, split))), MAX_BLOCK_ELEMENTS // bk)
    return bk, bv, warps_for(bk * bv, 512, high=4), warps_for(bk * bv, 512)


def choose_split(split: int | str, batch_heads: int, dv: int, device: torch.device) -> int:
    """Programs per (batch, head) for ``split`` (1, 2, 4, 8 or "auto").

    ``auto``: the fewest that give at least one program per SM of the GPU, each
    keeping at least MIN_AUTO_ROWS rows of W; 1 off CUDA.
    """
    if split != "auto":
        if split not in SPLITS:
            raise unknown_choice("delta-rule split", split, (*SPLITS, "auto"))
        return int(split)
    if device.type != "cuda":
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    chosen = 1
    for s in SPLITS[1:]:
        if batch_heads * chosen >= sms or triton.cdiv(dv, s) < MIN_AUTO_ROWS:
            break
        chosen = s
    return chosen


def _forward(q, k, v, beta, W0, reset, *, delta, fmap, store, split=1):
    T, B, H, DK = q.shape
    DV = v.shape[-1]
    bk, bv, num_warps, _ = _block_sizes(DK, DV, split)
    y = torch.empty(T, B, H, DV, device=q.device, dtype=v.dtype)
    WT = torch.empty(B, H, DV, DK, device=q.device, dtype=torch.float32)
    reset8 = aligned(reset.to(device=q.device, dtype=torch.int8))
    if store and delta:
        rec = torch.empty(T, B, H, DV, device=q.device, dtype=torch.float32)
    else:
        rec = WT  # not written
    _forward_kernel[(triton.cdiv(DV, bv), B * H)](
        q, k, v, beta if delta else q, W0, reset8,
        y, WT, rec,
        T, B, H, DK, DV,
        BK=bk, BV=bv, FMAP=fmap, DELTA=delta, STORE=store, EPS=SUM_NORM_EPS,
        **launch_options(num_warps, register_cap_for(DK, DV)),
    )
    starts = replay_starts(reset8) if store else reset8
    return y, WT, (reset8, starts, rec)


def _backward(q, k, v, beta, W0, records, WT, dy, dWT, *, delta, fmap, full,
              split=1, rebuild=False):
    reset8, starts, rec = records
    T, B, H, DK = q.shape
    DV = v.shape[-1]
    bk, bv, _, num_warps = _block_sizes(DK, DV, split)
    nv = triton.cdiv(DV, bv)
    fuse = nv == 1
    if fuse:
        dq, dk = torch.empty_like(q), torch.empty_like(k)
    else:
        dq = torch.empty(nv, T, B, H, DK, device=q.device, dtype=torch.float32)
        dk = torch.empty_like(dq)
    dv = torch.empty_like(v)
    dbeta = torch.empty(nv, T, B, H, device=q.device, dtype=torch.float32) if delta else None
    dW0 = torch.empty(B, H, DV, DK, device=q.device, dtype=torch.float32)
    rebuilt = torch.empty_like(dW0) if rebuild else dW0
    _backward_kernel[(nv, B * H)](
        q, k, v, beta if delta else q, W0, reset8, starts, rec, WT,
        aligned(dy), aligned(dWT),
        dq, dk, dv, dbeta if delta else dW0, dW0, rebuilt,
        T, B, H, DK, DV,
        BK=bk, BV=bv, FMAP=fmap, DELTA=delta, FULL=full, FUSE_FMAP=fuse,
        WRITE_REBUILT=rebuild, EPS=SUM_NORM_EPS, **launch_options(num_warps, register_cap_for(DK, DV)),
    )
    if not fuse:
        dq = _feature_map_backward(q, dq, fmap)
        dk = _feature_map_backward(k, dk, fmap)
    if delta:
        dbeta = (dbeta[0] if nv == 1 else dbeta.sum(0)).to(beta.dtype)
    grads = (dq, dk, dv, dbeta, dW0.to(W0.dtype))
    return grads + (rebuilt,) if rebuild else grads


def _feature_map_backward(x: Tensor, dphi_parts: Tensor, fmap: int) -> Tensor:
    nv, T, B, H, D = dphi_parts.shape
    dx = torch.empty_like(x)
    n = T * B * H
    _feature_map_backward_kernel[(n,)](
        x, dphi_parts, dx, n, nv, D,
        BD=padded(D), FMAP=fmap, EPS=SUM_NORM_EPS, **launch_options(1),
    )
    return dx


class _DeltaRuleFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, beta, W0, reset, delta, fmap, full, split):
        y, WT, records = _forward(
            q, k, v, beta, W0, reset, delta=delta, fmap=fmap, store=True, split=split
        )
        ctx.save_for_backward(q, k, v, beta, W0, WT, *records)
        ctx.options = dict(delta=delta, fmap=fmap, full=full, split=split)
        return y, WT

    @staticmethod
    def backward(ctx, dy, dWT):
        q, k, v, beta, W0, WT, *records = ctx.saved_tensors
        dq, dk, dv, dbeta, dW0 = _backward(q, k, v, beta, W0, records, WT, dy, dWT, **ctx.options)
        return dq, dk, dv, dbeta, dW0, None, None, None, None, None


def supports(inputs: Mapping[str, Any]) -> str | None:
    """None if the fused kernel can run on a call's arguments (``inputs``, by the reference's
    parameter names: ``dispatch.kernel_inputs``), otherwise the reason (with what would avoid it)."""
    feature_map = inputs["feature_map"]
    reason = (option_reasons(inputs, {"rule": RULES, "feature_map": FEATURE_MAPS, "grad_mode": GRAD_MODES})
              or rank_reasons(inputs, ("q", "k", "v"), "[T, B, H, D]"))
    if reason is not None:
        return reason
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    if q.shape != k.shape or v.shape[:3] != q.shape[:3]:
        return f"shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not match"
    if q.shape[0] == 0:
        return EMPTY_SEQUENCE
    dk, dv = feature_dim(feature_map, q.shape[-1]), v.shape[-1]
    if not (1 <= dk <= MAX_HEAD_DIM and 1 <= dv <= MAX_HEAD_DIM):
        return (f"head dims (key feature {dk}, value {dv}) are outside the supported "
                f"range 1..{MAX_HEAD_DIM} (use a head_dim, and a feature map size, of at most "
                f"{MAX_HEAD_DIM})")
    return tensor_reasons(inputs, ("q", "k", "v"))


# The keyword-only arguments ``delta_rule_triton`` takes beyond the reference's: a tuning knob that
# changes no result (beyond round-off); dispatch never passes it (``fwrl bench kernels`` does).
TUNING_KEYWORDS = ("split",)


def delta_rule_triton(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor | None, W0: Tensor, reset: Tensor, *,
    rule: str = "delta", feature_map: str = "elu1_sumnorm", grad_mode: str = "full",
    split: int | str = 1,
) -> tuple[Tensor, Tensor]:
    """Fused sum / delta rule (paper 001 Eq. 20-25); returns (y [T,B,H,Dv] in v's
    dtype, W_T [B,H,Dv,Dk] fp32).

    Same arguments as ``delta_rule_reference``; the state is always fp32.
    ``split`` (1, 2, 4, 8 or "auto"): programs per (batch, head), each owning a
    block of W's rows (see the module docstring); results do not depend on it
    beyond the order of the dq / dk additions. The default, 1, is what training
    runs until GPU timings (``fwrl bench kernels --split 1 2 4 auto``) show
    another to be faster.
    """
    if rule not in RULES:
        raise unknown_choice("fast-weight rule", rule, RULES)
    if grad_mode not in GRAD_MODES:
        raise unknown_choice("grad_mode", grad_mode, GRAD_MODES)
    if feature_map not in FEATURE_MAPS:
        raise unknown_choice("feature map for the Triton delta-rule kernel", feature_map,
                             FEATURE_MAPS)
    if feature_map not in KERNEL_FEATURE_MAPS:  # dpfp-N: outside the kernel
        q, k = apply_feature_map(feature_map, q), apply_feature_map(feature_map, k)
        feature_map = "identity"
    delta = rule == "delta"
    if delta and beta is None:
        raise ValueError("the delta rule needs beta [T, B, H]")
    q, k, v, W0 = aligned(q), aligned(k), aligned(v), aligned(W0)
    beta = aligned(beta) if delta else None
    fmap = KERNEL_FEATURE_MAPS[feature_map]
    n_split = choose_split(split, q.shape[1] * q.shape[2], v.shape[-1], q.device)
    tensors = (q, k, v, beta, W0) if delta else (q, k, v, W0)
    if torch.is_grad_enabled() and any(x.requires_grad for x in tensors):
        return _DeltaRuleFunction.apply(
            q, k, v, beta, W0, reset, delta, fmap, grad_mode == "full", n_split
        )
    # Inference (typically T = 1): no records, no autograd.
    y, WT, _ = _forward(q, k, v, beta, W0, reset, delta=delta, fmap=fmap, store=False,
                        split=n_split)
    return y, WT
