"""Fused Triton Delta RNN over a whole rollout.

The maths is ``fwrl.kernels.reference.delta_rnn`` (paper 000, Eq. 12, version
B of App. A.2). Per (batch row, head), two fast matrices written by their own
delta rule (paper 001 Eq. 20-24) and a recurrent read:

    W_t = W_{t-1} + sigmoid(beta_t)  (v_t  - W_{t-1} k_t)  k_t^T     k = phi(k), q = phi(q)
    R_t = R_{t-1} + sigmoid(beta_r)  (v_r  - R_{t-1} kr_t) kr_t^T    kr = softmax(kr)
    y_t = h_t = W_t q_t + R_t f(h_{t-1})                            f: softmax, 1e-6 in the denominator

Layout: one program per (batch, head) keeps W [d, F] and R [d, d] in
registers for the whole sequence; phi, the softmaxes, f and the sigmoids run in
the kernel (``dpfp-N`` is applied in PyTorch first, the kernel then uses the
identity on F = 2 N d features).

Backward without the T states: the forward records, per step in fp32, the
residuals r_W = v - W k, r_R = v_r - R kr and h_{t-1} (after the reset), so
both updates are undone exactly as subtractions; pre-reset states of resets at
t >= 1 are kept. With G_W, G_R = dL/dW_t, dL/dR_t and dh = dy_t + (gradient
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

import os

import torch
import triton
import triton.language as tl
from torch import Tensor

from fwrl.errors import unknown_choice
from fwrl.kernels.reference.delta_rnn import GRAD_MODES, RECURRENT_SOFTMAX_EPS
from fwrl.kernels.reference.feature_maps import (
    FEATURE_MAPS, SUM_NORM_EPS, apply_feature_map, feature_dim,
)

KERNEL_FEATURE_MAPS = {"identity": 0, "elu1_sumnorm": 1, "softmax": 2}
INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Largest head dim (and key feature size) whose backward keeps W, R and their
# gradients in registers without spilling on sm_90 (tests/test_kernels_delta_rnn.py).
MAX_HEAD_DIM = 32
MAX_KEY_DIM = 64

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

# Only Triton builtins and tl.reduce with the standard combine functions (see
# triton/delta_rule.py: keeps a copy built for the interpreter usable).
_SUM_COMBINE = tl.standard._sum_combine
_MAX_COMBINE = tl.standard._elementwise_max


@triton.jit
def _sum(x, axis: tl.constexpr):
    return tl.reduce(x, axis, _SUM_COMBINE)


@triton.jit
def _max(x, axis: tl.constexpr):
    return tl.reduce(x, axis, _MAX_COMBINE)


@triton.jit
def _sigmoid(x):
    e = tl.exp(-tl.abs(x))  # no overflow for large |x|
    return tl.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


@triton.jit
def _phi(x, mask, FMAP: tl.constexpr, EPS: tl.constexpr):
    """Feature map of one row (masked lanes give 0); FMAP 2 is the softmax."""
    if FMAP == 1:  # elu(x) + 1, then sum normalisation
        e = tl.where(mask, tl.where(x > 0, x + 1.0, tl.exp(tl.minimum(x, 0.0))), 0.0)
        out = e / (_sum(e, 0) + EPS)
    elif FMAP == 2:
        xm = tl.where(mask, x, -float("inf"))
        e = tl.where(mask, tl.exp(xm - _max(xm, 0)), 0.0)
        out = e / _sum(e, 0)
    else:
        out = tl.where(mask, x, 0.0)
    return out


@triton.jit
def _phi_backward(x, dphi, mask, FMAP: tl.constexpr, EPS: tl.constexpr):
    """Gradient w.r.t. x of one row, given the gradient w.r.t. phi(x)."""
    if FMAP == 1:
        ex = tl.exp(tl.minimum(x, 0.0))
        e = tl.where(mask, tl.where(x > 0, x + 1.0, ex), 0.0)
        s = _sum(e, 0) + EPS
        de = (dphi - _sum(dphi * e / s, 0)) / s
        dx = de * tl.where(x > 0, 1.0, ex)
    elif FMAP == 2:
        p = _phi(x, mask, 2, EPS)
        dx = p * (dphi - _sum(dphi * p, 0))
    else:
        dx = dphi
    return tl.where(mask, dx, 0.0)


@triton.jit
def _recurrent_softmax(h, mask, EPS: tl.constexpr):
    hm = tl.where(mask, h, -float("inf"))
    e = tl.where(mask, tl.exp(hm - _max(hm, 0)), 0.0)
    return e / (_sum(e, 0) + EPS)


@triton.jit
def _recurrent_softmax_backward(h, df, mask, EPS: tl.constexpr):
    """d f(h) / d h applied to df, with f = e / (sum e + eps), e = exp(h - max h).

    The max is not constant under the eps: its gradient goes, like amax's,
    evenly to the entries equal to the max.
    """
    hm = tl.where(mask, h, -float("inf"))
    m = _max(hm, 0)
    e = tl.where(mask, tl.exp(hm - m), 0.0)
    denom = _sum(e, 0) + EPS
    f = e / denom
    fdf = _sum(f * df, 0)
    dh = f * (df - fdf)
    at_max = mask & (hm == m)
    dm = -EPS / denom * fdf
    dh += tl.where(at_max, dm / _sum(at_max.to(tl.float32), 0), 0.0)
    return tl.where(mask, dh, 0.0)


@triton.jit
def _matvec(A, x):
    return _sum(A * x[None, :], 1)


@triton.jit
def _vecmat(A, g):
    return _sum(A * g[:, None], 0)


@triton.jit
def _flag(mask, flag, BR: tl.constexpr, BC: tl.constexpr):
    """mask & flag for a scalar flag, broadcast by hand (the CPU interpreter
    rejects a mask made by broadcasting a scalar inside ``&``)."""
    return mask & ((tl.full([BR, BC], 0, tl.int32) + flag.to(tl.int32)) != 0)


@triton.jit
def _forward_kernel(
    Q, K, V, BETA, KR, VR, BETAR, W0, R0, H0, RESET, SLOT,  # inputs
    Y, WT, RT, HT, REC, PREW, PRER,  # outputs (REC, PRE* only with STORE)
    T, B, H, D, DK,
    BD: tl.constexpr, BK: tl.constexpr, FMAP: tl.constexpr, STORE: tl.constexpr,
    EPS: tl.constexpr, REPS: tl.constexpr,
):
    i_bh = tl.program_id(0).to(tl.int64)
    b = i_bh // H
    od = tl.arange(0, BD)
    ok = tl.arange(0, BK)
    md = od < D
    mk = ok < DK
    wm = md[:, None] & mk[None, :]
    w_loc = od[:, None] * DK + ok[None, :]
    rm = md[:, None] & md[None, :]
    r_loc = od[:, None] * D + od[None, :]
    W = tl.load(W0 + i_bh * D * DK + w_loc, mask=wm, other=0.0).to(tl.float32)
    R = tl.load(R0 + i_bh * D * D + r_loc, mask=rm, other=0.0).to(tl.float32)
    h = tl.load(H0 + i_bh * D + od, mask=md, other=0.0).to(tl.float32)
    for t in range(T):
        row = t * B * H + i_bh
        reset = tl.load(RESET + t * B + b) != 0
        if STORE:
            slot = tl.load(SLOT + t * B + b)
            n = tl.maximum(slot, 0).to(tl.int64) * B * H + i_bh
            tl.store(PREW + n * D * DK + w_loc, W, mask=_flag(wm, slot >= 0, BD, BK))
            tl.store(PRER + n * D * D + r_loc, R, mask=_flag(rm, slot >= 0, BD, BD))
        W = tl.where(reset, 0.0, W)
        R = tl.where(reset, 0.0, R)
        h = tl.where(reset, 0.0, h)
        q = _phi(tl.load(Q + row * DK + ok, mask=mk, other=0.0).to(tl.float32), mk, FMAP, EPS)
        k = _phi(tl.load(K + row * DK + ok, mask=mk, other=0.0).to(tl.float32), mk, FMAP, EPS)
        kr = _phi(tl.load(KR + row * D + od, mask=md, other=0.0).to(tl.float32), md, 2, EPS)
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
    Q, K, BETA, KR, BETAR, RESET, SLOT, REC, PREW, PRER, WT, RT,  # inputs and records
    DY, DWT, DRT, DHT,  # incoming gradients
    DQ, DK_, DV, DBETA, DKR, DVR, DBETAR, DW0, DR0, DH0, REBUILT_W, REBUILT_R,  # outputs
    T, B, H, D, DK,
    BD: tl.constexpr, BK: tl.constexpr, FMAP: tl.constexpr, FULL: tl.constexpr,
    WRITE_REBUILT: tl.constexpr, EPS: tl.constexpr, REPS: tl.constexpr,
):
    i_bh = tl.program_id(0).to(tl.int64)
    b = i_bh // H
    od = tl.arange(0, BD)
    ok = tl.arange(0, BK)
    md = od < D
    mk = ok < DK
    wm = md[:, None] & mk[None, :]
    w_loc = od[:, None] * DK + ok[None, :]
    rm = md[:, None] & md[None, :]
    r_loc = od[:, None] * D + od[None, :]
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
        kr = _phi(xkr, md, 2, EPS)
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
        dkr = _phi_backward(xkr, dkr, md, 2, EPS)
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
        # The states before this step: kept by the forward if the row was reset.
        slot = tl.load(SLOT + t * B + b)
        n = tl.maximum(slot, 0).to(tl.int64) * B * H + i_bh
        kept = slot >= 0
        W = tl.where(kept, tl.load(PREW + n * D * DK + w_loc, mask=_flag(wm, kept, BD, BK), other=0.0), AW)
        R = tl.where(kept, tl.load(PRER + n * D * D + r_loc, mask=_flag(rm, kept, BD, BD), other=0.0), AR)
    tl.store(DW0 + i_bh * D * DK + w_loc, GW, mask=wm)
    tl.store(DR0 + i_bh * D * D + r_loc, GR, mask=rm)
    tl.store(DH0 + i_bh * D + od, dh, mask=md)
    if WRITE_REBUILT:
        tl.store(REBUILT_W + i_bh * D * DK + w_loc, W, mask=wm)
        tl.store(REBUILT_R + i_bh * D * D + r_loc, R, mask=rm)


def _block_sizes(d: int, dk: int) -> tuple[int, int, int, int]:
    """(BD, BK, forward warps, backward warps)."""
    bd = max(16, triton.next_power_of_2(d))
    bk = max(16, triton.next_power_of_2(dk))
    elements = bd * (bk + bd)
    warps = (min(8, max(1, triton.next_power_of_2(elements // n))) for n in (512, 256))
    return (bd, bk, *warps)


def _reset_slots(reset: Tensor) -> tuple[Tensor, int]:
    """Per (t, b): index of the kept pre-reset state, or -1; and the most any row keeps."""
    r = reset.to(torch.int32)
    slots = torch.full_like(r, -1)
    if r.shape[0] < 2:
        return slots, 0
    count = torch.cumsum(r[1:], dim=0)
    slots[1:] = torch.where(r[1:] != 0, count - 1, slots[1:])
    return slots, int(count[-1].max().item())


def _forward(q, k, v, beta, kr, vr, betar, W0, R0, h0, reset, *, fmap: int, store: bool):
    T, B, H, D = v.shape
    DK = q.shape[-1]
    bd, bk, warps, _ = _block_sizes(D, DK)
    dev = v.device
    y = torch.empty(T, B, H, D, device=dev, dtype=v.dtype)
    WT = torch.empty(B, H, D, DK, device=dev, dtype=torch.float32)
    RT = torch.empty(B, H, D, D, device=dev, dtype=torch.float32)
    hT = torch.empty(B, H, D, device=dev, dtype=torch.float32)
    reset8 = reset.to(device=dev, dtype=torch.int8).contiguous()
    if store:
        slots, n_pre = _reset_slots(reset8)
        rec = torch.empty(T, B, H, 3 * D, device=dev, dtype=torch.float32)
        pre_w = torch.empty(max(n_pre, 1), B, H, D, DK, device=dev, dtype=torch.float32)
        pre_r = torch.empty(max(n_pre, 1), B, H, D, D, device=dev, dtype=torch.float32)
    else:
        slots, rec, pre_w, pre_r = reset8, WT, WT, RT
    _forward_kernel[(B * H,)](
        q, k, v, beta, kr, vr, betar, W0, R0, h0, reset8, slots,
        y, WT, RT, hT, rec, pre_w, pre_r, T, B, H, D, DK,
        BD=bd, BK=bk, FMAP=fmap, STORE=store, EPS=SUM_NORM_EPS, REPS=RECURRENT_SOFTMAX_EPS,
        num_warps=warps, enable_fp_fusion=True,
    )
    return y, WT, RT, hT, (reset8, slots, rec, pre_w, pre_r)


def _backward(q, k, v, beta, kr, vr, betar, records, WT, RT, dy, dWT, dRT, dhT, *, fmap: int,
              full: bool, rebuild: bool = False):
    reset8, slots, rec, pre_w, pre_r = records
    T, B, H, D = v.shape
    DK = q.shape[-1]
    bd, bk, _, warps = _block_sizes(D, DK)
    grads = [torch.empty_like(x) for x in (q, k, v, beta, kr, vr, betar)]
    dW0, dR0, dh0 = torch.empty_like(WT), torch.empty_like(RT), torch.empty(B, H, D, device=v.device)
    rebuilt = (torch.empty_like(WT), torch.empty_like(RT)) if rebuild else (dW0, dR0)
    _backward_kernel[(B * H,)](
        q, k, beta, kr, betar, reset8, slots, rec, pre_w, pre_r, WT, RT,
        dy.contiguous(), dWT.contiguous(), dRT.contiguous(), dhT.contiguous(),
        *grads, dW0, dR0, dh0, *rebuilt, T, B, H, D, DK,
        BD=bd, BK=bk, FMAP=fmap, FULL=full, WRITE_REBUILT=rebuild, EPS=SUM_NORM_EPS,
        REPS=RECURRENT_SOFTMAX_EPS, num_warps=warps, enable_fp_fusion=True,
    )
    out = (*grads, dW0, dR0, dh0)
    return out + rebuilt if rebuild else out


class _DeltaRNNFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, beta, kr, vr, betar, W0, R0, h0, reset, fmap, full):
        y, WT, RT, hT, records = _forward(q, k, v, beta, kr, vr, betar, W0, R0, h0, reset,
                                          fmap=fmap, store=True)
        ctx.save_for_backward(q, k, v, beta, kr, vr, betar, WT, RT, *records)
        ctx.options = dict(fmap=fmap, full=full)
        ctx.state_dtypes = (W0.dtype, R0.dtype, h0.dtype)
        return y, WT, RT, hT

    @staticmethod
    def backward(ctx, dy, dWT, dRT, dhT):
        q, k, v, beta, kr, vr, betar, WT, RT, *records = ctx.saved_tensors
        dy = torch.zeros_like(v) if dy is None else dy
        dWT = torch.zeros_like(WT) if dWT is None else dWT
        dRT = torch.zeros_like(RT) if dRT is None else dRT
        dhT = torch.zeros(RT.shape[:3], device=RT.device) if dhT is None else dhT
        *grads, dW0, dR0, dh0 = _backward(q, k, v, beta, kr, vr, betar, records, WT, RT,
                                          dy, dWT, dRT, dhT, **ctx.options)
        states = tuple(g.to(dt) for g, dt in zip((dW0, dR0, dh0), ctx.state_dtypes))
        return (*grads, *states, None, None, None)


def supports(
    q: Tensor, k: Tensor, v: Tensor, kr: Tensor, vr: Tensor,
    *, feature_map: str = "softmax", grad_mode: str = "full",
) -> str | None:
    """None if the fused kernel can run on these inputs, otherwise the reason."""
    if feature_map not in FEATURE_MAPS:
        return f"feature map {feature_map!r} is not one of {', '.join(FEATURE_MAPS)}"
    if grad_mode not in GRAD_MODES:
        return f"grad_mode {grad_mode!r} is not one of {', '.join(GRAD_MODES)}"
    for name, x in (("q", q), ("k", k), ("v", v), ("kr", kr), ("vr", vr)):
        if x.device.type != "cuda" and not (x.device.type == "cpu" and _interpreting()):
            return (f"{name} is on {x.device.type}; the kernel needs CUDA tensors "
                    "(or TRITON_INTERPRET=1 when this module was imported, for CPU tests)")
        if x.dtype not in INPUT_DTYPES:
            return f"{name} has dtype {x.dtype}; supported: float32, bfloat16, float16"
        if x.dim() != 4:
            return f"{name} has shape {tuple(x.shape)}; expected [T, B, H, d]"
    if q.shape != k.shape or not v.shape == kr.shape == vr.shape or q.shape[:3] != v.shape[:3]:
        return (f"shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, "
                f"kr {tuple(kr.shape)}, vr {tuple(vr.shape)} do not match")
    if q.shape[0] == 0:
        return "the sequence is empty (T = 0)"
    d, dk = v.shape[-1], feature_dim(feature_map, q.shape[-1])
    if not (1 <= d <= MAX_HEAD_DIM and 1 <= dk <= MAX_KEY_DIM):
        return (f"head dims (value {d}, key feature {dk}) are outside the range the Delta RNN "
                f"kernel keeps in registers (1..{MAX_HEAD_DIM}, key 1..{MAX_KEY_DIM})")
    return None


def _interpreting() -> bool:
    return INTERPRETED and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def delta_rnn_triton(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor,
    kr: Tensor, vr: Tensor, betar: Tensor,
    W0: Tensor, R0: Tensor, h0: Tensor, reset: Tensor,
    *, feature_map: str = "softmax", grad_mode: str = "full",
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Fused Delta RNN; returns (y [T, B, H, d] in v's dtype, W_T, R_T, h_T in fp32).

    Same arguments as ``delta_rnn_reference``; the state is always fp32.
    """
    if feature_map not in FEATURE_MAPS:
        raise unknown_choice("feature map for the Triton Delta RNN kernel", feature_map,
                             FEATURE_MAPS)
    if grad_mode not in GRAD_MODES:
        raise unknown_choice("gradient mode", grad_mode, GRAD_MODES)
    if feature_map not in KERNEL_FEATURE_MAPS:  # dpfp-N: outside the kernel
        q, k = apply_feature_map(feature_map, q), apply_feature_map(feature_map, k)
        feature_map = "identity"
    args = [x.contiguous() for x in (q, k, v, beta, kr, vr, betar, W0, R0, h0)]
    fmap = KERNEL_FEATURE_MAPS[feature_map]
    if torch.is_grad_enabled() and any(x.requires_grad for x in args):
        return _DeltaRNNFunction.apply(*args, reset, fmap, grad_mode == "full")
    y, WT, RT, hT, _ = _forward(*args, reset, fmap=fmap, store=False)
    return y, WT, RT, hT
