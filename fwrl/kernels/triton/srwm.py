"""Fused Triton self-referential weight matrix (SRWM) over a whole rollout.

The maths is ``fwrl.kernels.reference.srwm`` (paper 002, Eq. 5-8 with the four
learning rates of App. A, Eq. 9-11). Per (batch row, head), with the stacked
matrix ``W = [W^y; W^q; W^k; W^b]`` (rows Dy, D, D, 4) and A = W_{t-1} after
the step's reset (a reset puts W back to the slow weights S):

    x     = phi(x_t)                       (softmax or identity)
    z     = A x = [y; q~; k~; b~]          (Eq. 5; y_t is the output)
    q, k  = softmax(q~), softmax(k~);  beta = sigmoid(b~) in R^4
    r     = A q - A k = A (q - k)          (Eq. 6-7, both reads use W_{t-1})
    u     = rate * r                       (rate: beta_y, beta_q, beta_k, beta_b by row block)
    W_t   = A + u k^T                      (Eq. 8)

Layout: one program per (batch, head) holds the whole matrix in registers, in
four blocks (Wy [BY, BD], Wq, Wk [BD, BD], Wb [4, BD]) so that no block is
padded to the power of two of the total row count; the input map, both
softmaxes and the sigmoids run in the kernel. The kernel carries the full
weights W = S + O; the offsets O are formed once on entry and exit.

Backward without storing the T matrices: the forward records, per step and in
fp32, r, q, k and beta, so ``u`` is recomputed bit for bit and the update is
undone as ``A = W_t - u k^T`` (no matrix inverse). Pre-reset states of resets
at t >= 1 are kept, as in ``fwrl.kernels.triton.delta_rule``. With G = dL/dW_t
through the carried state, dy the output gradient, and g = rate * (G k):

    d beta_m = sum over block m of (G k) * r,   d b~ = d beta * beta (1 - beta)
    d q      = A^T g;   d k = G^T u - A^T g     (then through the softmaxes)
    dz       = [dy; d q~; d k~; d b~];   d x = A^T dz  (then through phi)
    dA       = g (q - k)^T + dz x^T
    dS      += dA  (every step; the slow weights enter every step)
    G_{t-1}  = keep_t (G + dA)   (grad_mode full; 0 for step)

The per-(batch, head) partials of dS are added over the batch afterwards in a
fixed order: no atomics, deterministic results.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor

from fwrl.errors import unknown_choice
from fwrl.kernels.reference.srwm import GRAD_MODES, INPUT_MAPS, NUM_RATES

KERNEL_INPUT_MAPS = {"identity": 0, "softmax": 2}
INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MIN_HEAD_DIM = 1
# Largest head dim whose forward and backward keep the matrix (and, in the
# backward, its gradient and the slow-weight gradient) in registers without
# spilling on sm_90 (checked by tests/test_kernels_srwm.py).
MAX_HEAD_DIM = 32
# The same bound on the padded matrix ((BY + 2 BD + 4) x BD elements): the
# SRWM at d = 32 (3200) fits, SR-DeltaNet's Dy = 3d + 1 = 97 at d = 32 (6272)
# spills, so it runs on the reference.
MAX_MATRIX_ELEMENTS = 4096

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

# Only Triton builtins and tl.reduce with the standard combine functions: the
# library wrappers are jit functions themselves (see triton/delta_rule.py for
# why this keeps a copy of the module built for the interpreter usable).
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
def _softmax(x, mask):
    xm = tl.where(mask, x, -float("inf"))
    e = tl.where(mask, tl.exp(xm - _max(xm, 0)), 0.0)
    return e / _sum(e, 0)


@triton.jit
def _softmax_backward(p, dp):
    """Gradient w.r.t. the logits given p = softmax and dp = dL/dp (0 on masked lanes)."""
    return p * (dp - _sum(dp * p, 0))


@triton.jit
def _matvec(A, x):
    return _sum(A * x[None, :], 1)


@triton.jit
def _vecmat(A, g):
    return _sum(A * g[:, None], 0)


@triton.jit
def _pick(vec, idx, i: tl.constexpr):
    """Element i of a small vector as a scalar."""
    return _sum(tl.where(idx == i, vec, 0.0), 0)


@triton.jit
def _block(row0, rows, BR: tl.constexpr, BD: tl.constexpr, D):
    """Offsets and mask of rows [row0, row0 + rows) of a [*, D] matrix, as [BR, BD]."""
    orr = tl.arange(0, BR)
    od = tl.arange(0, BD)
    return (row0 + orr[:, None]) * D + od[None, :], (orr[:, None] < rows) & (od[None, :] < D)


@triton.jit
def _where_flag(mask, flag, BR: tl.constexpr, BD: tl.constexpr):
    """mask & flag for a scalar flag, broadcast by hand: the CPU interpreter
    rejects a mask made by broadcasting a scalar inside ``&``."""
    return mask & ((tl.full([BR, BD], 0, tl.int32) + flag.to(tl.int32)) != 0)


@triton.jit
def _forward_kernel(
    X, S, O0, RESET, SLOT,  # inputs: x [T,B,H,D], slow [H,R,D], offsets [B,H,R,D]
    Y, OT, REC, PRE,  # outputs (REC, PRE only with STORE)
    T, B, H, D, DY, NREC,
    BD: tl.constexpr, BY: tl.constexpr, FMAP: tl.constexpr, STORE: tl.constexpr,
):
    i_bh = tl.program_id(0).to(tl.int64)
    b = i_bh // H
    h = i_bh % H
    R = DY + 2 * D + 4
    od = tl.arange(0, BD)
    oy = tl.arange(0, BY)
    o4 = tl.arange(0, 4)
    md = od < D
    my = oy < DY
    s_base = S + h * R * D
    o_base = O0 + i_bh * R * D
    py, mwy = _block(0, DY, BY, BD, D)
    pq, mwq = _block(DY, D, BD, BD, D)
    pk, mwk = _block(DY + D, D, BD, BD, D)
    pb, mwb = _block(DY + 2 * D, 4, 4, BD, D)
    Sy = tl.load(s_base + py, mask=mwy, other=0.0).to(tl.float32)
    Sq = tl.load(s_base + pq, mask=mwq, other=0.0).to(tl.float32)
    Sk = tl.load(s_base + pk, mask=mwk, other=0.0).to(tl.float32)
    Sb = tl.load(s_base + pb, mask=mwb, other=0.0).to(tl.float32)
    Wy = Sy + tl.load(o_base + py, mask=mwy, other=0.0).to(tl.float32)
    Wq = Sq + tl.load(o_base + pq, mask=mwq, other=0.0).to(tl.float32)
    Wk = Sk + tl.load(o_base + pk, mask=mwk, other=0.0).to(tl.float32)
    Wb = Sb + tl.load(o_base + pb, mask=mwb, other=0.0).to(tl.float32)
    for t in range(T):
        row = t * B * H + i_bh
        reset = tl.load(RESET + t * B + b) != 0
        if STORE:
            slot = tl.load(SLOT + t * B + b)
            pre = PRE + (tl.maximum(slot, 0).to(tl.int64) * B * H + i_bh) * R * D
            keep = slot >= 0
            tl.store(pre + py, Wy, mask=_where_flag(mwy, keep, BY, BD))
            tl.store(pre + pq, Wq, mask=_where_flag(mwq, keep, BD, BD))
            tl.store(pre + pk, Wk, mask=_where_flag(mwk, keep, BD, BD))
            tl.store(pre + pb, Wb, mask=_where_flag(mwb, keep, 4, BD))
        Wy = tl.where(reset, Sy, Wy)
        Wq = tl.where(reset, Sq, Wq)
        Wk = tl.where(reset, Sk, Wk)
        Wb = tl.where(reset, Sb, Wb)
        x = tl.load(X + row * D + od, mask=md, other=0.0).to(tl.float32)
        if FMAP == 2:
            x = _softmax(x, md)
        y = _matvec(Wy, x)
        q = _softmax(_matvec(Wq, x), md)
        k = _softmax(_matvec(Wk, x), md)
        beta = _sigmoid(_matvec(Wb, x))
        qk = q - k
        ry = _matvec(Wy, qk)
        rq = _matvec(Wq, qk)
        rk = _matvec(Wk, qk)
        rb = _matvec(Wb, qk)
        if STORE:
            rec = REC + row * NREC
            tl.store(rec + oy, ry, mask=my)
            tl.store(rec + DY + od, rq, mask=md)
            tl.store(rec + DY + D + od, rk, mask=md)
            tl.store(rec + DY + 2 * D + o4, rb)
            tl.store(rec + R + od, q, mask=md)
            tl.store(rec + R + D + od, k, mask=md)
            tl.store(rec + R + 2 * D + o4, beta)
        Wy = Wy + (_pick(beta, o4, 0) * ry)[:, None] * k[None, :]
        Wq = Wq + (_pick(beta, o4, 1) * rq)[:, None] * k[None, :]
        Wk = Wk + (_pick(beta, o4, 2) * rk)[:, None] * k[None, :]
        Wb = Wb + (_pick(beta, o4, 3) * rb)[:, None] * k[None, :]
        tl.store(Y + row * DY + oy, y.to(Y.dtype.element_ty), mask=my)
    t_base = OT + i_bh * R * D
    tl.store(t_base + py, Wy - Sy, mask=mwy)
    tl.store(t_base + pq, Wq - Sq, mask=mwq)
    tl.store(t_base + pk, Wk - Sk, mask=mwk)
    tl.store(t_base + pb, Wb - Sb, mask=mwb)


@triton.jit
def _backward_kernel(
    X, S, RESET, SLOT, REC, PRE, OT,  # forward inputs and records
    DYOUT, DOT,  # incoming gradients: dy [T,B,H,DY], d offsets_T [B,H,R,D]
    DX, DO0, DS, REBUILT,  # outputs (DS: per-(b, h) partials [B,H,R,D])
    T, B, H, D, DY, NREC,
    BD: tl.constexpr, BY: tl.constexpr, FMAP: tl.constexpr, FULL: tl.constexpr,
    WRITE_REBUILT: tl.constexpr,
):
    i_bh = tl.program_id(0).to(tl.int64)
    b = i_bh // H
    h = i_bh % H
    R = DY + 2 * D + 4
    od = tl.arange(0, BD)
    oy = tl.arange(0, BY)
    o4 = tl.arange(0, 4)
    md = od < D
    my = oy < DY
    s_base = S + h * R * D
    py, mwy = _block(0, DY, BY, BD, D)
    pq, mwq = _block(DY, D, BD, BD, D)
    pk, mwk = _block(DY + D, D, BD, BD, D)
    pb, mwb = _block(DY + 2 * D, 4, 4, BD, D)
    t_base = OT + i_bh * R * D
    # W_T = S + O_T (the final offsets are what the forward returned).
    Wy = tl.load(s_base + py, mask=mwy, other=0.0).to(tl.float32) + tl.load(t_base + py, mask=mwy, other=0.0)
    Wq = tl.load(s_base + pq, mask=mwq, other=0.0).to(tl.float32) + tl.load(t_base + pq, mask=mwq, other=0.0)
    Wk = tl.load(s_base + pk, mask=mwk, other=0.0).to(tl.float32) + tl.load(t_base + pk, mask=mwk, other=0.0)
    Wb = tl.load(s_base + pb, mask=mwb, other=0.0).to(tl.float32) + tl.load(t_base + pb, mask=mwb, other=0.0)
    g_base = DOT + i_bh * R * D
    Gy = tl.load(g_base + py, mask=mwy, other=0.0).to(tl.float32)
    Gq = tl.load(g_base + pq, mask=mwq, other=0.0).to(tl.float32)
    Gk = tl.load(g_base + pk, mask=mwk, other=0.0).to(tl.float32)
    Gb = tl.load(g_base + pb, mask=mwb, other=0.0).to(tl.float32)
    dSy = tl.full([BY, BD], 0.0, tl.float32)
    dSq = tl.full([BD, BD], 0.0, tl.float32)
    dSk = tl.full([BD, BD], 0.0, tl.float32)
    dSb = tl.full([4, BD], 0.0, tl.float32)
    for i in range(T):
        t = T - 1 - i
        row = t * B * H + i_bh
        reset = tl.load(RESET + t * B + b) != 0
        rec = REC + row * NREC
        ry = tl.load(rec + oy, mask=my, other=0.0)
        rq = tl.load(rec + DY + od, mask=md, other=0.0)
        rk = tl.load(rec + DY + D + od, mask=md, other=0.0)
        rb = tl.load(rec + DY + 2 * D + o4)
        q = tl.load(rec + R + od, mask=md, other=0.0)
        k = tl.load(rec + R + D + od, mask=md, other=0.0)
        beta = tl.load(rec + R + 2 * D + o4)
        by = _pick(beta, o4, 0)
        bq = _pick(beta, o4, 1)
        bk = _pick(beta, o4, 2)
        bb = _pick(beta, o4, 3)
        uy = by * ry
        uq = bq * rq
        uk = bk * rk
        ub = bb * rb
        # Undo the update: the matrix this step read (after its reset; a reset
        # step read the slow weights, loaded exactly rather than rebuilt).
        Ay = Wy - uy[:, None] * k[None, :]
        Aq = Wq - uq[:, None] * k[None, :]
        Ak = Wk - uk[:, None] * k[None, :]
        Ab = Wb - ub[:, None] * k[None, :]
        Ay = tl.where(reset, tl.load(s_base + py, mask=_where_flag(mwy, reset, BY, BD), other=0.0).to(tl.float32), Ay)
        Aq = tl.where(reset, tl.load(s_base + pq, mask=_where_flag(mwq, reset, BD, BD), other=0.0).to(tl.float32), Aq)
        Ak = tl.where(reset, tl.load(s_base + pk, mask=_where_flag(mwk, reset, BD, BD), other=0.0).to(tl.float32), Ak)
        Ab = tl.where(reset, tl.load(s_base + pb, mask=_where_flag(mwb, reset, 4, BD), other=0.0).to(tl.float32), Ab)
        x_in = tl.load(X + row * D + od, mask=md, other=0.0).to(tl.float32)
        if FMAP == 2:
            x = _softmax(x_in, md)
        else:
            x = tl.where(md, x_in, 0.0)
        duy = _matvec(Gy, k)
        duq = _matvec(Gq, k)
        duk = _matvec(Gk, k)
        dub = _matvec(Gb, k)
        dk = _vecmat(Gy, uy) + _vecmat(Gq, uq) + _vecmat(Gk, uk) + _vecmat(Gb, ub)
        dbeta = tl.where(o4 == 0, _sum(duy * ry, 0), 0.0)
        dbeta += tl.where(o4 == 1, _sum(duq * rq, 0), 0.0)
        dbeta += tl.where(o4 == 2, _sum(duk * rk, 0), 0.0)
        dbeta += tl.where(o4 == 3, _sum(dub * rb, 0), 0.0)
        gy = by * duy
        gq = bq * duq
        gk = bk * duk
        gb = bb * dub
        dq = _vecmat(Ay, gy) + _vecmat(Aq, gq) + _vecmat(Ak, gk) + _vecmat(Ab, gb)
        dk = dk - dq
        dzy = tl.load(DYOUT + row * DY + oy, mask=my, other=0.0).to(tl.float32)
        dzq = _softmax_backward(q, dq)
        dzk = _softmax_backward(k, dk)
        dzb = dbeta * beta * (1.0 - beta)
        dx = _vecmat(Ay, dzy) + _vecmat(Aq, dzq) + _vecmat(Ak, dzk) + _vecmat(Ab, dzb)
        if FMAP == 2:
            dx = _softmax_backward(x, dx)
        tl.store(DX + row * D + od, dx.to(DX.dtype.element_ty), mask=md)
        qk = q - k
        dAy = gy[:, None] * qk[None, :] + dzy[:, None] * x[None, :]
        dAq = gq[:, None] * qk[None, :] + dzq[:, None] * x[None, :]
        dAk = gk[:, None] * qk[None, :] + dzk[:, None] * x[None, :]
        dAb = gb[:, None] * qk[None, :] + dzb[:, None] * x[None, :]
        dSy += dAy
        dSq += dAq
        dSk += dAk
        dSb += dAb
        if FULL:
            Gy = tl.where(reset, 0.0, Gy + dAy)
            Gq = tl.where(reset, 0.0, Gq + dAq)
            Gk = tl.where(reset, 0.0, Gk + dAk)
            Gb = tl.where(reset, 0.0, Gb + dAb)
        else:
            Gy = tl.full([BY, BD], 0.0, tl.float32)
            Gq = tl.full([BD, BD], 0.0, tl.float32)
            Gk = tl.full([BD, BD], 0.0, tl.float32)
            Gb = tl.full([4, BD], 0.0, tl.float32)
        # The matrix before this step: kept by the forward if the row was reset.
        slot = tl.load(SLOT + t * B + b)
        pre = PRE + (tl.maximum(slot, 0).to(tl.int64) * B * H + i_bh) * R * D
        kept = slot >= 0
        Wy = tl.where(kept, tl.load(pre + py, mask=_where_flag(mwy, kept, BY, BD), other=0.0), Ay)
        Wq = tl.where(kept, tl.load(pre + pq, mask=_where_flag(mwq, kept, BD, BD), other=0.0), Aq)
        Wk = tl.where(kept, tl.load(pre + pk, mask=_where_flag(mwk, kept, BD, BD), other=0.0), Ak)
        Wb = tl.where(kept, tl.load(pre + pb, mask=_where_flag(mwb, kept, 4, BD), other=0.0), Ab)
    base = i_bh * R * D
    tl.store(DO0 + base + py, Gy, mask=mwy)
    tl.store(DO0 + base + pq, Gq, mask=mwq)
    tl.store(DO0 + base + pk, Gk, mask=mwk)
    tl.store(DO0 + base + pb, Gb, mask=mwb)
    tl.store(DS + base + py, dSy, mask=mwy)
    tl.store(DS + base + pq, dSq, mask=mwq)
    tl.store(DS + base + pk, dSk, mask=mwk)
    tl.store(DS + base + pb, dSb, mask=mwb)
    if WRITE_REBUILT:  # the full matrix before step 0 (S + O_0), for the reversal test
        tl.store(REBUILT + base + py, Wy, mask=mwy)
        tl.store(REBUILT + base + pq, Wq, mask=mwq)
        tl.store(REBUILT + base + pk, Wk, mask=mwk)
        tl.store(REBUILT + base + pb, Wb, mask=mwb)


def _block_sizes(d: int, dy: int) -> tuple[int, int, int, int]:
    """(BD, BY, forward warps, backward warps) for head dim d and Dy rows of W^y."""
    bd = max(16, triton.next_power_of_2(d))
    by = max(16, triton.next_power_of_2(dy))
    elements = (by + 2 * bd + 4) * bd
    fwd_warps = min(8, max(1, triton.next_power_of_2(elements // 512)))
    bwd_warps = min(8, max(2, triton.next_power_of_2(elements // 256)))
    return bd, by, fwd_warps, bwd_warps


def _reset_slots(reset: Tensor) -> tuple[Tensor, int]:
    """Per (t, b): index of the kept pre-reset matrix, or -1; and the most any row keeps."""
    r = reset.to(torch.int32)
    slots = torch.full_like(r, -1)
    if r.shape[0] < 2:
        return slots, 0
    count = torch.cumsum(r[1:], dim=0)
    slots[1:] = torch.where(r[1:] != 0, count - 1, slots[1:])
    return slots, int(count[-1].max().item())


def _num_records(d: int, dy: int) -> int:
    """fp32 numbers recorded per step: r (Dy + 2D + 4), q, k (D each), beta (4)."""
    return dy + 4 * d + 2 * NUM_RATES


def _forward(x: Tensor, S: Tensor, O0: Tensor, reset: Tensor, *, fmap: int, store: bool):
    T, B, H, D = x.shape
    R = S.shape[1]
    DY = R - 2 * D - NUM_RATES
    bd, by, warps, _ = _block_sizes(D, DY)
    y = torch.empty(T, B, H, DY, device=x.device, dtype=x.dtype)
    OT = torch.empty(B, H, R, D, device=x.device, dtype=torch.float32)
    reset8 = reset.to(device=x.device, dtype=torch.int8).contiguous()
    nrec = _num_records(D, DY)
    if store:
        slots, n_pre = _reset_slots(reset8)
        rec = torch.empty(T, B, H, nrec, device=x.device, dtype=torch.float32)
        pre = torch.empty(max(n_pre, 1), B, H, R, D, device=x.device, dtype=torch.float32)
    else:
        slots, rec, pre = reset8, OT, OT
    _forward_kernel[(B * H,)](
        x, S, O0, reset8, slots, y, OT, rec, pre,
        T, B, H, D, DY, nrec,
        BD=bd, BY=by, FMAP=fmap, STORE=store, num_warps=warps, enable_fp_fusion=True,
    )
    return y, OT, (reset8, slots, rec, pre)


def _backward(x, S, records, OT, dy, dOT, *, fmap: int, full: bool, rebuild: bool = False):
    reset8, slots, rec, pre = records
    T, B, H, D = x.shape
    R = S.shape[1]
    DY = R - 2 * D - NUM_RATES
    bd, by, _, warps = _block_sizes(D, DY)
    dx = torch.empty_like(x)
    dO0 = torch.empty(B, H, R, D, device=x.device, dtype=torch.float32)
    dS = torch.empty_like(dO0)
    rebuilt = torch.empty_like(dO0) if rebuild else dO0
    _backward_kernel[(B * H,)](
        x, S, reset8, slots, rec, pre, OT, dy.contiguous(), dOT.contiguous(),
        dx, dO0, dS, rebuilt,
        T, B, H, D, DY, _num_records(D, DY),
        BD=bd, BY=by, FMAP=fmap, FULL=full, WRITE_REBUILT=rebuild,
        num_warps=warps, enable_fp_fusion=True,
    )
    grads = (dx, dS.sum(0), dO0)
    return grads + (rebuilt,) if rebuild else grads


class _SRWMFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, S, O0, reset, fmap, full):
        y, OT, records = _forward(x, S, O0, reset, fmap=fmap, store=True)
        ctx.save_for_backward(x, S, OT, *records)
        ctx.options = dict(fmap=fmap, full=full)
        ctx.dtypes = (S.dtype, O0.dtype)
        return y, OT

    @staticmethod
    def backward(ctx, dy, dOT):
        x, S, OT, *records = ctx.saved_tensors
        if dy is None:
            dy = torch.zeros(*x.shape[:3], S.shape[1] - 2 * x.shape[3] - NUM_RATES,
                             device=x.device, dtype=x.dtype)
        if dOT is None:
            dOT = torch.zeros_like(OT)
        dx, dS, dO0 = _backward(x, S, records, OT, dy, dOT, **ctx.options)
        return dx, dS.to(ctx.dtypes[0]), dO0.to(ctx.dtypes[1]), None, None, None


def supports(
    x: Tensor, W_y: Tensor, W_q: Tensor, W_k: Tensor, w_b: Tensor,
    *, input_map: str = "softmax", grad_mode: str = "full",
) -> str | None:
    """None if the fused kernel can run on these inputs, otherwise the reason."""
    if input_map not in INPUT_MAPS:
        return f"input map {input_map!r} is not one of {', '.join(INPUT_MAPS)}"
    if grad_mode not in GRAD_MODES:
        return f"grad_mode {grad_mode!r} is not one of {', '.join(GRAD_MODES)}"
    for name, t in (("x", x), ("W_y", W_y), ("W_q", W_q), ("W_k", W_k), ("w_b", w_b)):
        if t.device.type != "cuda" and not (t.device.type == "cpu" and _interpreting()):
            return (f"{name} is on {t.device.type}; the kernel needs CUDA tensors "
                    "(or TRITON_INTERPRET=1 when this module was imported, for CPU tests)")
        if t.dtype not in INPUT_DTYPES:
            return f"{name} has dtype {t.dtype}; supported: float32, bfloat16, float16"
    if x.dim() != 4:
        return f"x has shape {tuple(x.shape)}; expected [T, B, H, D]"
    if x.shape[0] == 0:
        return "the sequence is empty (T = 0)"
    H, D = x.shape[2], x.shape[3]
    if not MIN_HEAD_DIM <= D <= MAX_HEAD_DIM:
        return (f"head dim {D} is outside the range the SRWM kernel keeps in registers "
                f"({MIN_HEAD_DIM}..{MAX_HEAD_DIM})")
    if W_y.dim() != 3 or W_y.shape[0] != H or W_y.shape[2] != D or W_y.shape[1] < 1:
        return f"W_y has shape {tuple(W_y.shape)}; expected [{H}, Dy, {D}]"
    bd, by, _, _ = _block_sizes(D, W_y.shape[1])
    if (by + 2 * bd + NUM_RATES) * bd > MAX_MATRIX_ELEMENTS:
        return (f"the SRWM matrix of {W_y.shape[1] + 2 * D + NUM_RATES} x {D} (padded "
                f"{by + 2 * bd + NUM_RATES} x {bd}) is larger than the {MAX_MATRIX_ELEMENTS} "
                "elements the kernel keeps in registers")
    for name, t, rows in (("W_q", W_q, D), ("W_k", W_k, D), ("w_b", w_b, NUM_RATES)):
        if tuple(t.shape) != (H, rows, D):
            return f"{name} has shape {tuple(t.shape)}; expected {(H, rows, D)}"
    return None


def _interpreting() -> bool:
    return INTERPRETED and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def srwm_triton(
    x: Tensor,
    W_y: Tensor,
    W_q: Tensor,
    W_k: Tensor,
    w_b: Tensor,
    offsets: tuple[Tensor, Tensor, Tensor, Tensor],
    reset: Tensor,
    *,
    input_map: str = "softmax",
    grad_mode: str = "full",
) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor, Tensor]]:
    """Fused SRWM; returns (y [T, B, H, Dy] in x's dtype, final offsets, fp32).

    Same arguments as ``srwm_reference``. The sub-matrices are stacked once per
    call (S [H, R, D], offsets [B, H, R, D]); the kernel state is fp32.
    """
    if input_map not in INPUT_MAPS:
        raise unknown_choice("SRWM input map", input_map, INPUT_MAPS)
    if grad_mode not in GRAD_MODES:
        raise unknown_choice("gradient mode", grad_mode, GRAD_MODES)
    slow = (W_y, W_q, W_k, w_b)
    rows = tuple(w.shape[1] for w in slow)
    S = torch.cat(slow, dim=1).contiguous()
    O0 = torch.cat(tuple(offsets), dim=2).contiguous()
    x = x.contiguous()
    fmap = KERNEL_INPUT_MAPS[input_map]
    if torch.is_grad_enabled() and any(t.requires_grad for t in (x, S, O0)):
        y, OT = _SRWMFunction.apply(x, S, O0, reset, fmap, grad_mode == "full")
    else:  # inference (typically T = 1): no records, no synchronisation
        y, OT, _ = _forward(x, S, O0, reset, fmap=fmap, store=False)
    return y, tuple(OT.split(rows, dim=2))
