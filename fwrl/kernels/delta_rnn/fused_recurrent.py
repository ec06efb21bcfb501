"""Fused Triton Delta RNN over a whole rollout.

The maths is ``fwrl.kernels.delta_rnn.naive`` (paper 000, Eq. 12, version
B of App. A.2). Per (batch row, head), two fast matrices written by their own
delta rule (paper 001 Eq. 20-24) and a recurrent read:

    W_t = W_{t-1} + sigmoid(beta_t)  (v_t  - W_{t-1} k_t)  k_t^T     k = phi(k), q = phi(q)
    R_t = R_{t-1} + sigmoid(beta_r)  (v_r  - R_{t-1} kr_t) kr_t^T    kr = softmax(kr)
    y_t = h_t = W_t q_t + R_t f(h_{t-1})                            f: softmax, 1e-6 in the denominator

Layout: one program per (batch, head) keeps W [d, F] and R [d, d] in
registers for the whole sequence; phi, the softmaxes, f and the sigmoids run in
the kernel (``dpfp-N`` is applied in PyTorch first, the kernel then uses the
identity on F = 2 N d features). The rows cannot be split over programs: all
of h_t = W_t q_t + R_t f(h_{t-1}) is read back through f at step t + 1.

Backward without the T states: the forward records, per step in fp32, the
residuals r_W = v - W k, r_R = v_r - R kr and h_{t-1} (after the reset), so
both updates are undone exactly as subtractions. At a reset at t >= 1 the
states before it are rebuilt by replaying the recorded updates of the segment
that ends at t - 1 (``common.replay_starts``: nothing stored, no host
synchronisation). With G_W, G_R = dL/dW_t, dL/dR_t and dh = dy_t + (gradient
from step t + 1):

    d q = W_t^T dh;  d f = R_t^T dh;  G_W += dh q^T;  G_R += dh f^T
    per matrix M in (W, R) with key k, residual r and rate b:
        du = G_M k;  dv = b du;  d beta = (du . r) b (1 - b)
        d k = G_M^T (b r) - M_{t-1}^T dv;  G_{M,t-1} = keep_t (G_M - dv k^T)
    dh_{t-1} = keep_t f'(h_{t-1})^T d f        (grad_mode full; 0 for step)

where f' includes the (1e-6-sized) path through the max the reference
subtracts. No atomics: every program writes its own rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

from fwrl.errors import unknown_choice
from fwrl.kernels import GRAD_MODES, check_grad_mode
from fwrl.kernels.feature_maps import (
    FEATURE_MAPS, RECURRENT_SOFTMAX_EPS, SUM_NORM_EPS, apply_feature_map, feature_dim,
)

from ..triton.common import (
    EMPTY_SEQUENCE, FMAP_SOFTMAX, KERNEL_FEATURE_MAPS, _flag, _lanes, _matvec, _phi, _phi_backward,
    _recurrent_softmax, _recurrent_softmax_backward, _sigmoid, _sum, _tile, _vecmat, aligned,
    launch_options, option_reasons, padded, rank_reasons, replay_starts, tensor_reasons,
)

# Largest head dim (and key feature size) the kernels run without spilling
# registers on sm_90, with the warps (forward, backward) per padded (head dim,
# key feature size) that achieve it (tests/interpreter/test_kernels_delta_rnn.py). Both
# sizes are compile-time constants (vectorised loads, compact layouts).
MAX_HEAD_DIM = 64
MAX_KEY_DIM = 64
WARPS = {(16, 16): (1, 2), (16, 32): (2, 4), (16, 64): (4, 8), (32, 32): (4, 8),
         (32, 64): (8, 8), (64, 64): (8, 8)}


@triton.jit
def _forward_kernel(
    Q, K, V, BETA, KR, VR, BETAR, W0, R0, H0, RESET,  # inputs
    Y, WT, RT, HT, REC,  # outputs (REC only with STORE)
    T, B, H, D: tl.constexpr, DK: tl.constexpr,
    BD: tl.constexpr, BK: tl.constexpr, FMAP: tl.constexpr, STORE: tl.constexpr,
    EPS: tl.constexpr, REPS: tl.constexpr,
):
    i_bh = tl.program_id(0).to(tl.int64)
    b = i_bh // H
    od, md = _lanes(0, BD, D)
    ok, mk = _lanes(0, BK, DK)
    wm, w_loc = _tile(od, md, ok, mk, DK)
    rm, r_loc = _tile(od, md, od, md, D)
    W = tl.load(W0 + i_bh * D * DK + w_loc, mask=wm, other=0.0).to(tl.float32)
    R = tl.load(R0 + i_bh * D * D + r_loc, mask=rm, other=0.0).to(tl.float32)
    h = tl.load(H0 + i_bh * D + od, mask=md, other=0.0).to(tl.float32)
    for t in range(T):
        row = t * B * H + i_bh
        reset = tl.load(RESET + t * B + b) != 0
        W = tl.where(reset, 0.0, W)
        R = tl.where(reset, 0.0, R)
        h = tl.where(reset, 0.0, h)
        q = _phi(tl.load(Q + row * DK + ok, mask=mk, other=0.0).to(tl.float32), mk, FMAP, EPS)
        k = _phi(tl.load(K + row * DK + ok, mask=mk, other=0.0).to(tl.float32), mk, FMAP, EPS)
        kr = _phi(tl.load(KR + row * D + od, mask=md, other=0.0).to(tl.float32), md,
                  FMAP_SOFTMAX, EPS)
        v = tl.load(V + row * D + od, mask=md, other=0.0).to(tl.float32)
        vr = tl.load(VR + row * D + od, mask=md, other=0.0).to(tl.float32)
        rw = tl.where(md, v - _matvec(W, k), 0.0)
        rr = tl.where(md, vr - _matvec(R, kr), 0.0)
        f = _recurrent_softmax(h, md, REPS)
        if STORE:
            rec = REC + row * 3 * D
            tl.store(rec + od, rw, mask=md)
            tl.store(rec + D + od, rr, mask=md)
            tl.store(rec + 2 * D + od, h, mask=md)
        W = W + (_sigmoid(tl.load(BETA + row).to(tl.float32)) * rw)[:, None] * k[None, :]
        R = R + (_sigmoid(tl.load(BETAR + row).to(tl.float32)) * rr)[:, None] * kr[None, :]
        h = _matvec(W, q) + _matvec(R, f)
        tl.store(Y + row * D + od, h.to(Y.dtype.element_ty), mask=md)
    tl.store(WT + i_bh * D * DK + w_loc, W, mask=wm)
    tl.store(RT + i_bh * D * D + r_loc, R, mask=rm)
    tl.store(HT + i_bh * D + od, h, mask=md)


@triton.jit
def _backward_kernel(
    Q, K, BETA, KR, BETAR, W0, R0, RESET, START, REC, WT, RT,  # inputs and records
    DY, DWT, DRT, DHT,  # incoming gradients
    DQ, DK_, DV, DBETA, DKR, DVR, DBETAR, DW0, DR0, DH0, REBUILT_W, REBUILT_R,  # outputs
    T, B, H, D: tl.constexpr, DK: tl.constexpr,
    BD: tl.constexpr, BK: tl.constexpr, FMAP: tl.constexpr, FULL: tl.constexpr,
    WRITE_REBUILT: tl.constexpr, EPS: tl.constexpr, REPS: tl.constexpr,
):
    i_bh = tl.program_id(0).to(tl.int64)
    b = i_bh // H
    od, md = _lanes(0, BD, D)
    ok, mk = _lanes(0, BK, DK)
    wm, w_loc = _tile(od, md, ok, mk, DK)
    rm, r_loc = _tile(od, md, od, md, D)
    W = tl.load(WT + i_bh * D * DK + w_loc, mask=wm, other=0.0)
    R = tl.load(RT + i_bh * D * D + r_loc, mask=rm, other=0.0)
    GW = tl.load(DWT + i_bh * D * DK + w_loc, mask=wm, other=0.0).to(tl.float32)
    GR = tl.load(DRT + i_bh * D * D + r_loc, mask=rm, other=0.0).to(tl.float32)
    dh = tl.load(DHT + i_bh * D + od, mask=md, other=0.0).to(tl.float32)
    for i in range(T):
        t = T - 1 - i
        row = t * B * H + i_bh
        reset = tl.load(RESET + t * B + b) != 0
        xq = tl.load(Q + row * DK + ok, mask=mk, other=0.0).to(tl.float32)
        xk = tl.load(K + row * DK + ok, mask=mk, other=0.0).to(tl.float32)
        xkr = tl.load(KR + row * D + od, mask=md, other=0.0).to(tl.float32)
        q = _phi(xq, mk, FMAP, EPS)
        k = _phi(xk, mk, FMAP, EPS)
        kr = _phi(xkr, md, FMAP_SOFTMAX, EPS)
        rec = REC + row * 3 * D
        rw = tl.load(rec + od, mask=md, other=0.0)
        rr = tl.load(rec + D + od, mask=md, other=0.0)
        hp = tl.load(rec + 2 * D + od, mask=md, other=0.0)
        f = _recurrent_softmax(hp, md, REPS)
        bw = _sigmoid(tl.load(BETA + row).to(tl.float32))
        br = _sigmoid(tl.load(BETAR + row).to(tl.float32))
        dh += tl.load(DY + row * D + od, mask=md, other=0.0).to(tl.float32)
        dq = _vecmat(W, dh)
        df = _vecmat(R, dh)
        GW = GW + dh[:, None] * q[None, :]
        GR = GR + dh[:, None] * f[None, :]
        uw = bw * rw
        ur = br * rr
        # Undo both updates: the states this step started from (after its reset).
        AW = tl.where(reset, 0.0, W - uw[:, None] * k[None, :])
        AR = tl.where(reset, 0.0, R - ur[:, None] * kr[None, :])
        duw = _matvec(GW, k)
        dur = _matvec(GR, kr)
        dvw = bw * duw
        dvr = br * dur
        dk = _vecmat(GW, uw) - _vecmat(AW, dvw)
        dkr = _vecmat(GR, ur) - _vecmat(AR, dvr)
        tl.store(DBETA + row, _sum(duw * rw, 0) * bw * (1.0 - bw))
        tl.store(DBETAR + row, _sum(dur * rr, 0) * br * (1.0 - br))
        tl.store(DV + row * D + od, dvw.to(DV.dtype.element_ty), mask=md)
        tl.store(DVR + row * D + od, dvr.to(DVR.dtype.element_ty), mask=md)
        dq = _phi_backward(xq, dq, mk, FMAP, EPS)
        dk = _phi_backward(xk, dk, mk, FMAP, EPS)
        dkr = _phi_backward(xkr, dkr, md, FMAP_SOFTMAX, EPS)
        tl.store(DQ + row * DK + ok, dq.to(DQ.dtype.element_ty), mask=mk)
        tl.store(DK_ + row * DK + ok, dk.to(DK_.dtype.element_ty), mask=mk)
        tl.store(DKR + row * D + od, dkr.to(DKR.dtype.element_ty), mask=md)
        if FULL:
            dh = tl.where(reset, 0.0, _recurrent_softmax_backward(hp, df, md, REPS))
            GW = tl.where(reset, 0.0, GW - dvw[:, None] * k[None, :])
            GR = tl.where(reset, 0.0, GR - dvr[:, None] * kr[None, :])
        else:
            dh = tl.full([BD], 0.0, tl.float32)
            GW = tl.full([BD, BK], 0.0, tl.float32)
            GR = tl.full([BD, BD], 0.0, tl.float32)
        # The states before this step. After a reset at t >= 1: replay the
        # segment that ends at t - 1 from its start (W0, R0, or 0 after a reset).
        start = tl.load(START + t * B + b)
        if start >= 0:
            first = start == 0
            W = tl.load(W0 + i_bh * D * DK + w_loc, mask=_flag(wm, first), other=0.0)
            R = tl.load(R0 + i_bh * D * D + r_loc, mask=_flag(rm, first), other=0.0)
            W = W.to(tl.float32)
            R = R.to(tl.float32)
            for j in range(start, t):
                rj = j * B * H + i_bh
                keep = tl.load(RESET + j * B + b) == 0
                kj = _phi(tl.load(K + rj * DK + ok, mask=mk, other=0.0).to(tl.float32), mk,
                          FMAP, EPS)
                krj = _phi(tl.load(KR + rj * D + od, mask=md, other=0.0).to(tl.float32), md,
                           FMAP_SOFTMAX, EPS)
                uwj = (_sigmoid(tl.load(BETA + rj).to(tl.float32))
                       * tl.load(REC + rj * 3 * D + od, mask=md, other=0.0))
                urj = (_sigmoid(tl.load(BETAR + rj).to(tl.float32))
                       * tl.load(REC + rj * 3 * D + D + od, mask=md, other=0.0))
                W = tl.where(keep, W, 0.0) + uwj[:, None] * kj[None, :]
                R = tl.where(keep, R, 0.0) + urj[:, None] * krj[None, :]
        else:
            W = AW
            R = AR
    tl.store(DW0 + i_bh * D * DK + w_loc, GW, mask=wm)
    tl.store(DR0 + i_bh * D * D + r_loc, GR, mask=rm)
    tl.store(DH0 + i_bh * D + od, dh, mask=md)
    if WRITE_REBUILT:
        tl.store(REBUILT_W + i_bh * D * DK + w_loc, W, mask=wm)
        tl.store(REBUILT_R + i_bh * D * D + r_loc, R, mask=rm)


def _block_sizes(d: int, dk: int) -> tuple[int, int, int, int]:
    """(BD, BK, forward warps, backward warps) for head dim d and key features dk (WARPS)."""
    bd = padded(d)
    bk = padded(dk)
    fwd, bwd = WARPS[(min(bd, bk), max(bd, bk))]
    return bd, bk, fwd, bwd


def _forward(q, k, v, beta, kr, vr, betar, W0, R0, h0, reset, *, fmap: int, store: bool):
    T, B, H, D = v.shape
    DK = q.shape[-1]
    bd, bk, warps, _ = _block_sizes(D, DK)
    dev = v.device
    y = torch.empty(T, B, H, D, device=dev, dtype=v.dtype)
    WT = torch.empty(B, H, D, DK, device=dev, dtype=torch.float32)
    RT = torch.empty(B, H, D, D, device=dev, dtype=torch.float32)
    hT = torch.empty(B, H, D, device=dev, dtype=torch.float32)
    reset8 = aligned(reset.to(device=dev, dtype=torch.int8))
    rec = torch.empty(T, B, H, 3 * D, device=dev, dtype=torch.float32) if store else WT
    _forward_kernel[(B * H,)](
        q, k, v, beta, kr, vr, betar, W0, R0, h0, reset8,
        y, WT, RT, hT, rec, T, B, H, D, DK,
        BD=bd, BK=bk, FMAP=fmap, STORE=store, EPS=SUM_NORM_EPS, REPS=RECURRENT_SOFTMAX_EPS,
        **launch_options(warps),
    )
    starts = replay_starts(reset8) if store else reset8
    return y, WT, RT, hT, (reset8, starts, rec)


def _backward(q, k, v, beta, kr, vr, betar, W0, R0, records, WT, RT, dy, dWT, dRT, dhT, *,
              fmap: int, full: bool, rebuild: bool = False):
    reset8, starts, rec = records
    T, B, H, D = v.shape
    DK = q.shape[-1]
    bd, bk, _, warps = _block_sizes(D, DK)
    grads = [torch.empty_like(x) for x in (q, k, v, beta, kr, vr, betar)]
    dW0, dR0, dh0 = torch.empty_like(WT), torch.empty_like(RT), torch.empty(B, H, D, device=v.device)
    rebuilt = (torch.empty_like(WT), torch.empty_like(RT)) if rebuild else (dW0, dR0)
    _backward_kernel[(B * H,)](
        q, k, beta, kr, betar, W0, R0, reset8, starts, rec, WT, RT,
        aligned(dy), aligned(dWT), aligned(dRT), aligned(dhT),
        *grads, dW0, dR0, dh0, *rebuilt, T, B, H, D, DK,
        BD=bd, BK=bk, FMAP=fmap, FULL=full, WRITE_REBUILT=rebuild, EPS=SUM_NORM_EPS,
        REPS=RECURRENT_SOFTMAX_EPS, **launch_options(warps),
    )
    out = (*grads, dW0, dR0, dh0)
    return out + rebuilt if rebuild else out


class _DeltaRNNFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, beta, kr, vr, betar, W0, R0, h0, reset, fmap, full):
        y, WT, RT, hT, records = _forward(q, k, v, beta, kr, vr, betar, W0, R0, h0, reset,
                                          fmap=fmap, store=True)
        ctx.save_for_backward(q, k, v, beta, kr, vr, betar, W0, R0, WT, RT, *records)
        ctx.options = dict(fmap=fmap, full=full)
        ctx.state_dtypes = (W0.dtype, R0.dtype, h0.dtype)
        return y, WT, RT, hT

    @staticmethod
    def backward(ctx, dy, dWT, dRT, dhT):
        q, k, v, beta, kr, vr, betar, W0, R0, WT, RT, *records = ctx.saved_tensors
        *grads, dW0, dR0, dh0 = _backward(q, k, v, beta, kr, vr, betar, W0, R0, records, WT, RT,
                                          dy, dWT, dRT, dhT, **ctx.options)
        states = tuple(g.to(dt) for g, dt in zip((dW0, dR0, dh0), ctx.state_dtypes))
        return (*grads, *states, None, None, None)


def supports(inputs: Mapping[str, Any]) -> str | None:
    """None if the fused kernel can run on a call's arguments (``inputs``, by the reference's
    parameter names: ``dispatch.kernel_inputs``), otherwise the reason (with what would avoid it)."""
    steps = ("q", "k", "v", "kr", "vr")
    reason = (option_reasons(inputs, {"feature_map": FEATURE_MAPS, "grad_mode": GRAD_MODES})
              or rank_reasons(inputs, steps, "[T, B, H, d]"))
    if reason is not None:
        return reason
    q, k, v, kr, vr = (inputs[name] for name in steps)
    if q.shape != k.shape or not v.shape == kr.shape == vr.shape or q.shape[:3] != v.shape[:3]:
        return (f"shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, "
                f"kr {tuple(kr.shape)}, vr {tuple(vr.shape)} do not match")
    if q.shape[0] == 0:
        return EMPTY_SEQUENCE
    d, dk = v.shape[-1], feature_dim(inputs["feature_map"], q.shape[-1])
    if not (1 <= d <= MAX_HEAD_DIM and 1 <= dk <= MAX_KEY_DIM):
        return (f"head dims (value {d}, key feature {dk}) are larger than the Delta RNN kernel "
                f"supports ({MAX_HEAD_DIM}, key {MAX_KEY_DIM}; use a head_dim of at most "
                f"{MAX_HEAD_DIM} with feature map softmax or elu1_sumnorm, or a dpfp feature "
                f"map of at most {MAX_KEY_DIM} features)")
    return tensor_reasons(inputs, steps)


def delta_rnn_triton(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, kr: Tensor, vr: Tensor, betar: Tensor,
    W0: Tensor, R0: Tensor, h0: Tensor, reset: Tensor, *, feature_map: str = "softmax",
    grad_mode: str = "full",
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Fused Delta RNN (paper 000 Eq. 12); returns (y [T, B, H, d] in v's dtype, W_T, R_T,
    h_T in fp32).

    Same arguments as ``delta_rnn_reference``; the state is always fp32.
    """
    if feature_map not in FEATURE_MAPS:
        raise unknown_choice("feature map for the Triton Delta RNN kernel", feature_map,
                             FEATURE_MAPS)
    check_grad_mode(grad_mode)
    if feature_map not in KERNEL_FEATURE_MAPS:  # dpfp-N: outside the kernel
        q, k = apply_feature_map(feature_map, q), apply_feature_map(feature_map, k)
        feature_map = "identity"
    args = [aligned(x) for x in (q, k, v, beta, kr, vr, betar, W0, R0, h0)]
    fmap = KERNEL_FEATURE_MAPS[feature_map]
    if torch.is_grad_enabled() and any(x.requires_grad for x in args):
        return _DeltaRNNFunction.apply(*args, reset, fmap, grad_mode == "full")
    y, WT, RT, hT, _ = _forward(*args, reset, fmap=fmap, store=False)
    return y, WT, RT, hT
