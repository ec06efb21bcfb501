"""Fused Triton Delta LSTM over a whole rollout (forward and backward).

The maths is ``fwrl.kernels.reference.delta_lstm`` (paper 000, App. A.2,
version D, Eq. 36-40). Per (batch row, head), six fast matrices
M = (W_u, W_f, W_o, R_u, R_f, R_o), each written by its own delta rule
(paper 001 Eq. 20-24) before it is read:

    k_m = softmax(k_m);  b_m = sigmoid(beta_m)
    res_m = v_m - M_m k_m;   M_m <- M_m + b_m res_m k_m^T
    q = softmax(q);  r = f(y_{t-1})            (f: softmax with 1e-6 in the denominator)
    u = W_u q + R_u r                          (Eq. 36)
    f = sigmoid(W_f q + R_f r)                 (Eq. 37)
    o = sigmoid(W_o q + R_o r)                 (Eq. 38)
    c = f c_{t-1} + (1 - f) u                  (Eq. 39)
    y = c o                                    (Eq. 40)

Layout: one program per (batch, head) keeps the six [d, d] matrices in fp32
registers, with c and y. Each matrix is its own 2D block (a stacked
[8, d, d] block lets Triton spread the matrix axis within each thread, which
replicates every per-matrix vector 8 times and spills at d = 32); helpers
(``_write``, ``_matrix_backward``) apply the same step to each. The rows
cannot be split over programs: every row of the R matrices reads
r = f(y_{t-1}), i.e. all of the previous output. Head dims up to 32 (the
presets' size); at 64 the matrices and their gradients would not fit in one
program's registers.

Backward without the T states: the forward records, per step in fp32, the six
residuals res_m, y_{t-1}, c_{t-1} (after the reset) and u, f, o, so each
update is undone exactly as ``M_{t-1} = M_t - b res k^T``; at a reset at
t >= 1 the matrices before it are rebuilt by replaying the recorded updates
of the segment that ends at t - 1 (``common.replay_starts``: nothing stored,
no host synchronisation). With G_m = dL/dM_m,t, dc and dy the gradients
carried from step t + 1:

    dy  += dy_t;  do = dy c;  dc += dy o
    du = dc (1 - f);  df = dc (c_{t-1} - u);  dc_{t-1} = dc f
    d read = (du, df f (1 - f), do o (1 - o)) for (W, R) alike
    G_m += d read_m query_m^T;  d query_m = M_m^T d read_m      (query: q for W, r for R)
    per matrix (u_m = b_m res_m, A_m = M_{t-1}):
        du_m = G_m k_m;  dv_m = b_m du_m;  d beta_m = (du_m . res_m) b_m (1 - b_m)
        d k_m = G_m^T u_m - A_m^T dv_m;  G_m <- keep_t (G_m - dv_m k_m^T)
    dy_{t-1} = keep_t f'(y_{t-1})^T (sum over R of d query);  dc_{t-1} = keep_t dc f
    (grad_mode step: nothing is carried to step t - 1)

No atomics: every program writes its own rows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from fwrl.errors import unknown_choice
from fwrl.kernels.reference.delta_lstm import GRAD_MODES, MATRICES
from fwrl.kernels.reference.delta_rnn import RECURRENT_SOFTMAX_EPS

from .common import (
    _flag, _matvec, _recurrent_softmax, _recurrent_softmax_backward, _sigmoid, _softmax,
    _softmax_backward, _sum, _vecmat, aligned, launch_options, replay_starts, tensor_reasons,
)

NUM_MATRICES = len(MATRICES)  # 6
# Largest head dim the kernels run without spilling registers on sm_90, with
# the warps (forward, backward) per padded head dim (tests/test_kernels_delta_lstm.py).
MAX_HEAD_DIM = 32
WARPS = {16: (2, 4), 32: (8, 8)}


@triton.jit
def _key(K, row, m: tl.constexpr, od, md, D: tl.constexpr):
    """(raw key, softmax key) of matrix m at one step."""
    xk = tl.load(K + (row * 6 + m) * D + od, mask=md, other=0.0).to(tl.float32)
    return xk, _softmax(xk, md)


@triton.jit
def _rate(BETA, row, m: tl.constexpr):
    return _sigmoid(tl.load(BETA + row * 6 + m).to(tl.float32))


@triton.jit
def _write(M, K, V, BETA, row, m: tl.constexpr, od, md, D: tl.constexpr):
    """The delta-rule write of matrix m (paper 001 Eq. 20-24): (M_t, res = v - M_{t-1} k)."""
    _, k = _key(K, row, m, od, md, D)
    v = tl.load(V + (row * 6 + m) * D + od, mask=md, other=0.0).to(tl.float32)
    res = tl.where(md, v - _matvec(M, k), 0.0)
    return M + (_rate(BETA, row, m) * res)[:, None] * k[None, :], res


@triton.jit
def _replay(M, K, BETA, REC, row, m: tl.constexpr, od, md, D: tl.constexpr):
    """M + b res k^T of matrix m at one step, from the inputs and the fp32 record."""
    _, k = _key(K, row, m, od, md, D)
    res = tl.load(REC + row * 11 * D + m * D + od, mask=md, other=0.0)
    return M + (_rate(BETA, row, m) * res)[:, None] * k[None, :]


@triton.jit
def _load_matrix(base, m: tl.constexpr, w_loc, wm, D: tl.constexpr):
    return tl.load(base + m * D * D + w_loc, mask=wm, other=0.0).to(tl.float32)


@triton.jit
def _matrix_backward(M, G, K, BETA, REC, DK, DV, DBETA, row, m: tl.constexpr, query, d_read,
                     reset, od, md, D: tl.constexpr):
    """One matrix at one step, backwards: the read M query (gradient d_read), then the
    delta-rule write. Stores d k, d v, d beta; returns (M_{t-1} (0 after a reset), the
    gradient w.r.t. M_{t-1} before the reset, d query)."""
    G = G + d_read[:, None] * query[None, :]
    d_query = _vecmat(M, d_read)
    xk, k = _key(K, row, m, od, md, D)
    beta = _rate(BETA, row, m)
    res = tl.load(REC + row * 11 * D + m * D + od, mask=md, other=0.0)
    upd = beta * res
    A = tl.where(reset, 0.0, M - upd[:, None] * k[None, :])
    du = _matvec(G, k)
    dv = beta * du
    dk = _vecmat(G, upd) - _vecmat(A, dv)
    tl.store(DK + (row * 6 + m) * D + od, _softmax_backward(k, dk).to(DK.dtype.element_ty),
             mask=md)
    tl.store(DV + (row * 6 + m) * D + od, dv.to(DV.dtype.element_ty), mask=md)
    tl.store(DBETA + row * 6 + m, (_sum(du * res, 0) * beta * (1.0 - beta)).to(DBETA.dtype.element_ty))
    return A, G - dv[:, None] * k[None, :], d_query


@triton.jit
def _forward_kernel(
    Q, K, V, BETA, W0, C0, Y0, RESET,  # inputs
    Y, WT, CT, YT, REC,  # outputs (REC only with STORE)
    T, B, H, D: tl.constexpr,
    BD: tl.constexpr, STORE: tl.constexpr, REPS: tl.constexpr,
):
    i_bh = tl.program_id(0).to(tl.int64)
    b = i_bh // H
    od = tl.arange(0, BD)
    md = od < D
    wm = md[:, None] & md[None, :]
    w_loc = od[:, None] * D + od[None, :]
    base = W0 + i_bh * 6 * D * D
    Wu = _load_matrix(base, 0, w_loc, wm, D)
    Wf = _load_matrix(base, 1, w_loc, wm, D)
    Wo = _load_matrix(base, 2, w_loc, wm, D)
    Ru = _load_matrix(base, 3, w_loc, wm, D)
    Rf = _load_matrix(base, 4, w_loc, wm, D)
    Ro = _load_matrix(base, 5, w_loc, wm, D)
    c = tl.load(C0 + i_bh * D + od, mask=md, other=0.0).to(tl.float32)
    y = tl.load(Y0 + i_bh * D + od, mask=md, other=0.0).to(tl.float32)
    for t in range(T):
        row = t * B * H + i_bh
        reset = tl.load(RESET + t * B + b) != 0
        Wu = tl.where(reset, 0.0, Wu)
        Wf = tl.where(reset, 0.0, Wf)
        Wo = tl.where(reset, 0.0, Wo)
        Ru = tl.where(reset, 0.0, Ru)
        Rf = tl.where(reset, 0.0, Rf)
        Ro = tl.where(reset, 0.0, Ro)
        c = tl.where(reset, 0.0, c)
        y = tl.where(reset, 0.0, y)
        # Write every matrix (delta rule), then read it (Eq. 36-38).
        Wu, res_wu = _write(Wu, K, V, BETA, row, 0, od, md, D)
        Wf, res_wf = _write(Wf, K, V, BETA, row, 1, od, md, D)
        Wo, res_wo = _write(Wo, K, V, BETA, row, 2, od, md, D)
        Ru, res_ru = _write(Ru, K, V, BETA, row, 3, od, md, D)
        Rf, res_rf = _write(Rf, K, V, BETA, row, 4, od, md, D)
        Ro, res_ro = _write(Ro, K, V, BETA, row, 5, od, md, D)
        q = _softmax(tl.load(Q + row * D + od, mask=md, other=0.0).to(tl.float32), md)
        r = _recurrent_softmax(y, md, REPS)
        u = _matvec(Wu, q) + _matvec(Ru, r)  # Eq. 36
        f = _sigmoid(_matvec(Wf, q) + _matvec(Rf, r))  # Eq. 37
        o = _sigmoid(_matvec(Wo, q) + _matvec(Ro, r))  # Eq. 38
        if STORE:
            rec = REC + row * 11 * D
            tl.store(rec + od, res_wu, mask=md)
            tl.store(rec + D + od, res_wf, mask=md)
            tl.store(rec + 2 * D + od, res_wo, mask=md)
            tl.store(rec + 3 * D + od, res_ru, mask=md)
            tl.store(rec + 4 * D + od, res_rf, mask=md)
            tl.store(rec + 5 * D + od, res_ro, mask=md)
            tl.store(rec + 6 * D + od, y, mask=md)
            tl.store(rec + 7 * D + od, c, mask=md)
            tl.store(rec + 8 * D + od, u, mask=md)
            tl.store(rec + 9 * D + od, f, mask=md)
            tl.store(rec + 10 * D + od, o, mask=md)
        c = f * c + (1.0 - f) * u  # Eq. 39
        y = c * o  # Eq. 40
        tl.store(Y + row * D + od, y.to(Y.dtype.element_ty), mask=md)
    out = WT + i_bh * 6 * D * D
    tl.store(out + w_loc, Wu, mask=wm)
    tl.store(out + D * D + w_loc, Wf, mask=wm)
    tl.store(out + 2 * D * D + w_loc, Wo, mask=wm)
    tl.store(out + 3 * D * D + w_loc, Ru, mask=wm)
    tl.store(out + 4 * D * D + w_loc, Rf, mask=wm)
    tl.store(out + 5 * D * D + w_loc, Ro, mask=wm)
    tl.store(CT + i_bh * D + od, c, mask=md)
    tl.store(YT + i_bh * D + od, y, mask=md)


@triton.jit
def _backward_kernel(
    Q, K, BETA, W0, RESET, START, REC, WT,  # forward inputs and records
    DY, DWT, DCT, DYT,  # incoming gradients
    DQ, DK, DV, DBETA, DW0, DC0, DY0, REBUILT,  # outputs
    T, B, H, D: tl.constexpr,
    BD: tl.constexpr, FULL: tl.constexpr, WRITE_REBUILT: tl.constexpr, REPS: tl.constexpr,
):
    i_bh = tl.program_id(0).to(tl.int64)
    b = i_bh // H
    od = tl.arange(0, BD)
    md = od < D
    wm = md[:, None] & md[None, :]
    w_loc = od[:, None] * D + od[None, :]
    base = WT + i_bh * 6 * D * D
    Wu = _load_matrix(base, 0, w_loc, wm, D)
    Wf = _load_matrix(base, 1, w_loc, wm, D)
    Wo = _load_matrix(base, 2, w_loc, wm, D)
    Ru = _load_matrix(base, 3, w_loc, wm, D)
    Rf = _load_matrix(base, 4, w_loc, wm, D)
    Ro = _load_matrix(base, 5, w_loc, wm, D)
    base = DWT + i_bh * 6 * D * D
    Gwu = _load_matrix(base, 0, w_loc, wm, D)
    Gwf = _load_matrix(base, 1, w_loc, wm, D)
    Gwo = _load_matrix(base, 2, w_loc, wm, D)
    Gru = _load_matrix(base, 3, w_loc, wm, D)
    Grf = _load_matrix(base, 4, w_loc, wm, D)
    Gro = _load_matrix(base, 5, w_loc, wm, D)
    dc = tl.load(DCT + i_bh * D + od, mask=md, other=0.0).to(tl.float32)
    dy_carry = tl.load(DYT + i_bh * D + od, mask=md, other=0.0).to(tl.float32)
    for i in range(T):
        t = T - 1 - i
        row = t * B * H + i_bh
        reset = tl.load(RESET + t * B + b) != 0
        rec = REC + row * 11 * D
        y_prev = tl.load(rec + 6 * D + od, mask=md, other=0.0)
        c_prev = tl.load(rec + 7 * D + od, mask=md, other=0.0)
        u = tl.load(rec + 8 * D + od, mask=md, other=0.0)
        f = tl.load(rec + 9 * D + od, mask=md, other=0.0)
        o = tl.load(rec + 10 * D + od, mask=md, other=0.0)
        q = _softmax(tl.load(Q + row * D + od, mask=md, other=0.0).to(tl.float32), md)
        r = _recurrent_softmax(y_prev, md, REPS)
        # The cell (Eq. 39-40) backwards: gradients of the reads u, f, o (pre-sigmoid).
        dy = tl.load(DY + row * D + od, mask=md, other=0.0).to(tl.float32) + dy_carry
        dc = dc + dy * o
        d_o = dy * (f * c_prev + (1.0 - f) * u) * o * (1.0 - o)
        d_u = dc * (1.0 - f)
        d_f = dc * (c_prev - u) * f * (1.0 - f)
        dc_prev = dc * f
        # The reads (Eq. 36-38) and the writes of the six matrices, backwards.
        Wu, Gwu, dq = _matrix_backward(Wu, Gwu, K, BETA, REC, DK, DV, DBETA, row, 0, q, d_u,
                                       reset, od, md, D)
        Wf, Gwf, dq_f = _matrix_backward(Wf, Gwf, K, BETA, REC, DK, DV, DBETA, row, 1, q, d_f,
                                         reset, od, md, D)
        Wo, Gwo, dq_o = _matrix_backward(Wo, Gwo, K, BETA, REC, DK, DV, DBETA, row, 2, q, d_o,
                                         reset, od, md, D)
        Ru, Gru, dr = _matrix_backward(Ru, Gru, K, BETA, REC, DK, DV, DBETA, row, 3, r, d_u,
                                       reset, od, md, D)
        Rf, Grf, dr_f = _matrix_backward(Rf, Grf, K, BETA, REC, DK, DV, DBETA, row, 4, r, d_f,
                                         reset, od, md, D)
        Ro, Gro, dr_o = _matrix_backward(Ro, Gro, K, BETA, REC, DK, DV, DBETA, row, 5, r, d_o,
                                         reset, od, md, D)
        dq = dq + dq_f + dq_o
        tl.store(DQ + row * D + od, _softmax_backward(q, dq).to(DQ.dtype.element_ty), mask=md)
        if FULL:
            Gwu = tl.where(reset, 0.0, Gwu)
            Gwf = tl.where(reset, 0.0, Gwf)
            Gwo = tl.where(reset, 0.0, Gwo)
            Gru = tl.where(reset, 0.0, Gru)
            Grf = tl.where(reset, 0.0, Grf)
            Gro = tl.where(reset, 0.0, Gro)
            dc = tl.where(reset, 0.0, dc_prev)
            dy_carry = tl.where(reset, 0.0,
                                _recurrent_softmax_backward(y_prev, dr + dr_f + dr_o, md, REPS))
        else:
            Gwu = tl.full([BD, BD], 0.0, tl.float32)
            Gwf = tl.full([BD, BD], 0.0, tl.float32)
            Gwo = tl.full([BD, BD], 0.0, tl.float32)
            Gru = tl.full([BD, BD], 0.0, tl.float32)
            Grf = tl.full([BD, BD], 0.0, tl.float32)
            Gro = tl.full([BD, BD], 0.0, tl.float32)
            dc = tl.full([BD], 0.0, tl.float32)
            dy_carry = tl.full([BD], 0.0, tl.float32)
        # The matrices before this step (_matrix_backward undid the writes). After a
        # reset at t >= 1: replay the segment that ends at t - 1 from its start (W0,
        # or 0 after a reset).
        start = tl.load(START + t * B + b)
        if start >= 0:
            first = (start == 0) & (tl.load(RESET + b) == 0)
            base = W0 + i_bh * 6 * D * D
            Wu = _load_matrix(base, 0, w_loc, _flag(wm, first), D)
            Wf = _load_matrix(base, 1, w_loc, _flag(wm, first), D)
            Wo = _load_matrix(base, 2, w_loc, _flag(wm, first), D)
            Ru = _load_matrix(base, 3, w_loc, _flag(wm, first), D)
            Rf = _load_matrix(base, 4, w_loc, _flag(wm, first), D)
            Ro = _load_matrix(base, 5, w_loc, _flag(wm, first), D)
            for j in range(start, t):  # no reset inside (start, t): a segment
                rj = j * B * H + i_bh
                Wu = _replay(Wu, K, BETA, REC, rj, 0, od, md, D)
                Wf = _replay(Wf, K, BETA, REC, rj, 1, od, md, D)
                Wo = _replay(Wo, K, BETA, REC, rj, 2, od, md, D)
                Ru = _replay(Ru, K, BETA, REC, rj, 3, od, md, D)
                Rf = _replay(Rf, K, BETA, REC, rj, 4, od, md, D)
                Ro = _replay(Ro, K, BETA, REC, rj, 5, od, md, D)
    out = DW0 + i_bh * 6 * D * D
    tl.store(out + w_loc, Gwu, mask=wm)
    tl.store(out + D * D + w_loc, Gwf, mask=wm)
    tl.store(out + 2 * D * D + w_loc, Gwo, mask=wm)
    tl.store(out + 3 * D * D + w_loc, Gru, mask=wm)
    tl.store(out + 4 * D * D + w_loc, Grf, mask=wm)
    tl.store(out + 5 * D * D + w_loc, Gro, mask=wm)
    tl.store(DC0 + i_bh * D + od, dc, mask=md)
    tl.store(DY0 + i_bh * D + od, dy_carry, mask=md)
    if WRITE_REBUILT:
        out = REBUILT + i_bh * 6 * D * D
        tl.store(out + w_loc, Wu, mask=wm)
        tl.store(out + D * D + w_loc, Wf, mask=wm)
        tl.store(out + 2 * D * D + w_loc, Wo, mask=wm)
        tl.store(out + 3 * D * D + w_loc, Ru, mask=wm)
        tl.store(out + 4 * D * D + w_loc, Rf, mask=wm)
        tl.store(out + 5 * D * D + w_loc, Ro, mask=wm)


def _block_sizes(d: int) -> tuple[int, int, int]:
    """(BD, forward warps, backward warps) for head dim d (WARPS)."""
    bd = max(16, triton.next_power_of_2(d))
    return (bd, *WARPS[bd])


def _forward(q, k, v, beta, W0, c0, y0, reset, *, store: bool):
    T, B, H, D = q.shape
    bd, warps, _ = _block_sizes(D)
    dev = q.device
    y = torch.empty(T, B, H, D, device=dev, dtype=q.dtype)
    WT = torch.empty(B, H, NUM_MATRICES, D, D, device=dev, dtype=torch.float32)
    cT = torch.empty(B, H, D, device=dev, dtype=torch.float32)
    yT = torch.empty(B, H, D, device=dev, dtype=torch.float32)
    reset8 = aligned(reset.to(device=dev, dtype=torch.int8))
    rec = torch.empty(T, B, H, 11 * D, device=dev, dtype=torch.float32) if store else WT
    _forward_kernel[(B * H,)](
        q, k, v, beta, W0, c0, y0, reset8, y, WT, cT, yT, rec, T, B, H, D,
        BD=bd, STORE=store, REPS=RECURRENT_SOFTMAX_EPS, **launch_options(warps),
    )
    starts = replay_starts(reset8) if store else reset8
    return y, WT, cT, yT, (reset8, starts, rec)


def _backward(q, k, v, beta, W0, records, WT, dy, dWT, dcT, dyT, *, full: bool,
              rebuild: bool = False):
    reset8, starts, rec = records
    T, B, H, D = q.shape
    bd, _, warps = _block_sizes(D)
    dq, dk, dv, dbeta = (torch.empty_like(x) for x in (q, k, v, beta))
    dW0 = torch.empty_like(WT)
    dc0 = torch.empty(B, H, D, device=q.device, dtype=torch.float32)
    dy0 = torch.empty_like(dc0)
    rebuilt = torch.empty_like(WT) if rebuild else dW0
    _backward_kernel[(B * H,)](
        q, k, beta, W0, reset8, starts, rec, WT, aligned(dy), aligned(dWT), aligned(dcT),
        aligned(dyT), dq, dk, dv, dbeta, dW0, dc0, dy0, rebuilt, T, B, H, D,
        BD=bd, FULL=full, WRITE_REBUILT=rebuild, REPS=RECURRENT_SOFTMAX_EPS,
        **launch_options(warps),
    )
    grads = (dq, dk, dv, dbeta, dW0, dc0, dy0)
    return grads + (rebuilt,) if rebuild else grads


class _DeltaLSTMFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, beta, W0, c0, y0, reset, full):
        y, WT, cT, yT, records = _forward(q, k, v, beta, W0, c0, y0, reset, store=True)
        ctx.save_for_backward(q, k, v, beta, W0, WT, *records)
        ctx.full = full
        ctx.state_dtypes = (W0.dtype, c0.dtype, y0.dtype)
        return y, WT, cT, yT

    @staticmethod
    def backward(ctx, dy, dWT, dcT, dyT):
        q, k, v, beta, W0, WT, *records = ctx.saved_tensors
        *grads, dW0, dc0, dy0 = _backward(q, k, v, beta, W0, records, WT, dy, dWT, dcT, dyT,
                                          full=ctx.full)
        states = tuple(g.to(dt) for g, dt in zip((dW0, dc0, dy0), ctx.state_dtypes))
        return (*grads, *states, None, None)


def supports(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, W0: Tensor, *, grad_mode: str = "full",
) -> str | None:
    """None if the fused kernel can run on these inputs, otherwise the reason (with
    what would avoid it)."""
    if grad_mode not in GRAD_MODES:
        return f"grad_mode {grad_mode!r} is not one of {', '.join(GRAD_MODES)}"
    if q.dim() != 4:
        return f"q has shape {tuple(q.shape)}; expected [T, B, H, d]"
    T, B, H, D = q.shape
    expected = {"k": (T, B, H, NUM_MATRICES, D), "v": (T, B, H, NUM_MATRICES, D),
                "beta": (T, B, H, NUM_MATRICES), "W0": (B, H, NUM_MATRICES, D, D)}
    for name, x in (("k", k), ("v", v), ("beta", beta), ("W0", W0)):
        if tuple(x.shape) != expected[name]:
            return f"{name} has shape {tuple(x.shape)}; expected {expected[name]}"
    if T == 0:
        return "the sequence is empty (T = 0)"
    if not 1 <= D <= MAX_HEAD_DIM:
        return (f"head dim {D} is larger than the {MAX_HEAD_DIM} the Delta LSTM kernel "
                f"keeps in registers (use a head_dim of at most {MAX_HEAD_DIM})")
    return tensor_reasons((("q", q), ("k", k), ("v", v), ("beta", beta), ("W0", W0)))


def delta_lstm_triton(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor,
    W0: Tensor, c0: Tensor, y0: Tensor, reset: Tensor,
    *, grad_mode: str = "full",
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Fused Delta LSTM (paper 000 App. A.2 Eq. 36-40); returns (y [T, B, H, d] in q's dtype,
    W_T [B, H, 6, d, d], c_T, y_T in fp32).

    Same arguments as ``delta_lstm_reference``; the state is always fp32.
    """
    if grad_mode not in GRAD_MODES:
        raise unknown_choice("gradient mode", grad_mode, GRAD_MODES)
    args = [aligned(x) for x in (q, k, v, beta, W0, c0, y0)]
    if torch.is_grad_enabled() and any(x.requires_grad for x in args):
        return _DeltaLSTMFunction.apply(*args, reset, grad_mode == "full")
    y, WT, cT, yT, _ = _forward(*args, reset, store=False)
    return y, WT, cT, yT
