"""Fused Triton Delta LSTM over a whole rollout (forward and backward).

The maths is ``fwrl.kernels.delta_lstm.naive`` (paper 000, App. A.2,
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

Layout: one program per (batch, head). The rows cannot be split over
programs: every row of the R matrices reads r = f(y_{t-1}), i.e. all of the
previous output.

* d <= 32 (``_forward_kernel``, ``_backward_kernel``): the six [d, d]
  matrices stay in fp32 registers with c and y (and, backwards, their six
  gradients). Each matrix is its own 2D block (a stacked [8, d, d] block lets
  Triton spread the matrix axis within each thread, which replicates every
  per-matrix vector 8 times and spills at d = 32); helpers (``_write``,
  ``_matrix_backward``) apply the same step to each.
* 33 <= d <= 64 (``_forward_streamed_kernel``, ``_backward_streamed_kernel``):
  six matrices are 24,576 fp32 at d = 64 (and twice that with the gradients),
  more than one program's registers. Within a step everything is row-local but
  the vectors q, r = f(y_{t-1}) and the keys (known at the step start) and, in
  the backward, the column reductions d query = M^T d read,
  d k = G^T (b res) - A^T dv and d beta = sum du res b (1 - b). So the matrices
  live in a per-program fp32 scratch in global memory (96 KB at d = 64, 192 KB
  with the gradients, L2-resident: the forward works in place in the W_T output, the backward in
  the rebuilt-state buffer and the G's in the dW_0 output) and each step streams
  them through registers in tiles of BR rows x d columns (``STREAMED``: 32 rows at
  d = 64, forward and backward, so two tiles per matrix and step): per tile and matrix,
  write (res rows = v - M k), read (u, f, o rows), then the c and y rows
  (Eq. 39-40); backwards, the same rows of the cell gradients, G += d read
  query^T, undo the write, and add the tile's share of the column reductions,
  carried in registers over the tiles. Rows of c and y (backwards: dc and the
  carried dy) that the next step reads whole go through a two-slot fp32 scratch
  (read slot t % 2, write the other) with a ``tl.debug_barrier()`` at the end
  of each step (and after a replay), so no thread overwrites a value another
  may still read or reads one before it is written; a matrix tile is
  loaded and stored by the same threads (its layout covers the tile without
  replication, checked by the sm_90 test), so it is updated in place. The tile
  sizes and warps per padded head dim are ``STREAMED``.

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

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

from fwrl.kernels import GRAD_MODES, check_grad_mode
from fwrl.kernels.feature_maps import RECURRENT_SOFTMAX_EPS

from ..triton.common import (
    EMPTY_SEQUENCE, _flag, _matvec, _recurrent_softmax, _recurrent_softmax_backward, _sigmoid,
    _softmax, _softmax_backward, _sum, _vecmat, aligned, launch_options, option_reasons, padded,
    rank_reasons, replay_starts, tensor_reasons,
)
from .naive import MATRICES

NUM_MATRICES = len(MATRICES)  # 6
# Largest head dim the kernels take. Up to 32 the register kernels, with the
# warps (forward, backward) per padded head dim that run them without spilling
# on sm_90 (tests/interpreter/test_kernels_delta_lstm.py).
MAX_HEAD_DIM = 64
WARPS = {16: (2, 4), 32: (8, 8)}
# Head dims above STREAM_ABOVE run the streamed kernels, with (forward row tile,
# forward warps, backward row tile, backward warps) per padded head dim: no spill
# on sm_90 at d = 48 and 64, fp32 and bf16 (tests/interpreter/test_kernels_delta_lstm.py;
# forward 122-127 registers, backward 221-251). Each step is a serial chain of
# (row tiles x 6 matrices) tile-steps, so the tiles are as tall as fits: 32 rows
# (2 tiles per matrix) both ways; backward tiles of 8 rows (192-201 registers)
# made 48 tile-steps a step instead of 12, and 16 rows take all 255 registers.
# Module-level so the tests can force the streamed path at a small head dim
# (e.g. d = 12 in tiles of 4 rows).
STREAM_ABOVE = 32
STREAMED = {64: (32, 8, 32, 8)}


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


# --------------------------------------------------------------------------- streamed (d > 32)


@triton.jit
def _tile_loc(i_bh, m: tl.constexpr, orow, mr, od, md, D: tl.constexpr):
    """Offsets and mask of rows ``orow`` of matrix m of program i_bh in a [B, H, 6, d, d] tensor."""
    return (i_bh * 6 + m) * D * D + orow[:, None] * D + od[None, :], mr[:, None] & md[None, :]


@triton.jit
def _copy_matrices(SRC, DST, i_bh, orr, od, md, D: tl.constexpr, BR: tl.constexpr):
    """DST <- SRC (fp32) for the six matrices of program i_bh, a row tile at a time."""
    for r0 in range(0, 6 * D, BR):
        orow = r0 + orr
        loc = i_bh * 6 * D * D + orow[:, None] * D + od[None, :]
        tm = (orow < 6 * D)[:, None] & md[None, :]
        tl.store(DST + loc, tl.load(SRC + loc, mask=tm, other=0.0).to(tl.float32), mask=tm)


@triton.jit
def _tile_forward(WT, K, V, BETA, REC, row, i_bh, m: tl.constexpr, query, reset, orow, mr,
                  od, md, D: tl.constexpr, STORE: tl.constexpr):
    """Rows ``orow`` of matrix m at one step, in place in WT: the delta-rule write
    (res = v - M_{t-1} k is row-local), then the rows of the read M_t query."""
    loc, tm = _tile_loc(i_bh, m, orow, mr, od, md, D)
    M = tl.where(reset, 0.0, tl.load(WT + loc, mask=tm, other=0.0))
    _, k = _key(K, row, m, od, md, D)
    v = tl.load(V + (row * 6 + m) * D + orow, mask=mr, other=0.0).to(tl.float32)
    res = tl.where(mr, v - _matvec(M, k), 0.0)
    M = M + (_rate(BETA, row, m) * res)[:, None] * k[None, :]
    tl.store(WT + loc, M, mask=tm)
    if STORE:
        tl.store(REC + row * 11 * D + m * D + orow, res, mask=mr)
    return _matvec(M, query)


@triton.jit
def _forward_streamed_kernel(
    Q, K, V, BETA, W0, C0, Y0, RESET,  # inputs
    Y, WT, CT, YT, REC, CARRY,  # outputs (REC only with STORE); CARRY: fp32 [B * H, 2, 2, d]
    T, B, H, D: tl.constexpr,
    BD: tl.constexpr, BR: tl.constexpr, STORE: tl.constexpr, REPS: tl.constexpr,
):
    i_bh = tl.program_id(0).to(tl.int64)
    b = i_bh // H
    od = tl.arange(0, BD)
    md = od < D
    orr = tl.arange(0, BR)
    # WT is the working copy of the matrices; (c, y) alternate between two CARRY
    # slots (read slot t % 2, write the other), so no row is overwritten while
    # another thread may still read it.
    carry = CARRY + i_bh * 4 * D
    _copy_matrices(W0, WT, i_bh, orr, od, md, D, BR)
    tl.store(carry + od, tl.load(C0 + i_bh * D + od, mask=md, other=0.0).to(tl.float32),
             mask=md)
    tl.store(carry + D + od, tl.load(Y0 + i_bh * D + od, mask=md, other=0.0).to(tl.float32),
             mask=md)
    tl.debug_barrier()
    for t in range(T):
        row = t * B * H + i_bh
        reset = tl.load(RESET + t * B + b) != 0
        src = carry + (t % 2) * 2 * D
        dst = carry + ((t + 1) % 2) * 2 * D
        y_prev = tl.where(reset, 0.0, tl.load(src + D + od, mask=md, other=0.0))
        q = _softmax(tl.load(Q + row * D + od, mask=md, other=0.0).to(tl.float32), md)
        r = _recurrent_softmax(y_prev, md, REPS)
        rec = REC + row * 11 * D
        if STORE:
            tl.store(rec + 6 * D + od, y_prev, mask=md)
        for r0 in range(0, D, BR):
            orow = r0 + orr
            mr = orow < D
            # Write every matrix (delta rule), then read it (Eq. 36-38), these rows only.
            u = (_tile_forward(WT, K, V, BETA, REC, row, i_bh, 0, q, reset, orow, mr, od, md, D,
                               STORE)
                 + _tile_forward(WT, K, V, BETA, REC, row, i_bh, 3, r, reset, orow, mr, od, md,
                                 D, STORE))  # Eq. 36
            f = _sigmoid(_tile_forward(WT, K, V, BETA, REC, row, i_bh, 1, q, reset, orow, mr, od,
                                       md, D, STORE)
                         + _tile_forward(WT, K, V, BETA, REC, row, i_bh, 4, r, reset, orow, mr,
                                         od, md, D, STORE))  # Eq. 37
            o = _sigmoid(_tile_forward(WT, K, V, BETA, REC, row, i_bh, 2, q, reset, orow, mr, od,
                                       md, D, STORE)
                         + _tile_forward(WT, K, V, BETA, REC, row, i_bh, 5, r, reset, orow, mr,
                                         od, md, D, STORE))  # Eq. 38
            c_prev = tl.where(reset, 0.0, tl.load(src + orow, mask=mr, other=0.0))
            if STORE:
                tl.store(rec + 7 * D + orow, c_prev, mask=mr)
                tl.store(rec + 8 * D + orow, u, mask=mr)
                tl.store(rec + 9 * D + orow, f, mask=mr)
                tl.store(rec + 10 * D + orow, o, mask=mr)
            c = f * c_prev + (1.0 - f) * u  # Eq. 39
            y = c * o  # Eq. 40
            tl.store(dst + orow, c, mask=mr)
            tl.store(dst + D + orow, y, mask=mr)
            tl.store(Y + row * D + orow, y.to(Y.dtype.element_ty), mask=mr)
        tl.debug_barrier()  # y_t whole (and the matrices written) before step t + 1 reads them
    last = carry + (T % 2) * 2 * D
    tl.store(CT + i_bh * D + od, tl.load(last + od, mask=md, other=0.0), mask=md)
    tl.store(YT + i_bh * D + od, tl.load(last + D + od, mask=md, other=0.0), mask=md)


@triton.jit
def _tile_backward(WORK, DW0, K, BETA, REC, DV, row, i_bh, m: tl.constexpr, query, d_read,
                   reset, orow, mr, od, md, D: tl.constexpr, FULL: tl.constexpr):
    """Rows ``orow`` of matrix m at one step, backwards (``_matrix_backward`` on a row
    tile): the read M_t query, then the write, in place in WORK (M_t -> M_{t-1}, 0 after a
    reset) and DW0 (G). Stores these rows of d v; returns this tile's share of the column
    reductions (d query = M_t^T d read, d k = G^T u - A^T dv) and of d beta / (b (1 - b))."""
    loc, tm = _tile_loc(i_bh, m, orow, mr, od, md, D)
    M = tl.load(WORK + loc, mask=tm, other=0.0)
    G = tl.load(DW0 + loc, mask=tm, other=0.0) + d_read[:, None] * query[None, :]
    d_query = _vecmat(M, d_read)
    _, k = _key(K, row, m, od, md, D)
    beta = _rate(BETA, row, m)
    res = tl.load(REC + row * 11 * D + m * D + orow, mask=mr, other=0.0)
    upd = beta * res
    A = tl.where(reset, 0.0, M - upd[:, None] * k[None, :])
    du = _matvec(G, k)
    dv = beta * du
    dk = _vecmat(G, upd) - _vecmat(A, dv)
    tl.store(DV + (row * 6 + m) * D + orow, dv.to(DV.dtype.element_ty), mask=mr)
    if FULL:
        G = tl.where(reset, 0.0, G - dv[:, None] * k[None, :])
    else:
        G = tl.full(G.shape, 0.0, tl.float32)
    tl.store(DW0 + loc, G, mask=tm)
    tl.store(WORK + loc, A, mask=tm)
    return d_query, dk, _sum(du * res, 0)


@triton.jit
def _key_backward(K, BETA, DK, DBETA, row, m: tl.constexpr, dk, dbeta, od, md, D: tl.constexpr):
    """Stores d (raw key) and d beta of matrix m from the reductions over all rows."""
    _, k = _key(K, row, m, od, md, D)
    beta = _rate(BETA, row, m)
    tl.store(DK + (row * 6 + m) * D + od, _softmax_backward(k, dk).to(DK.dtype.element_ty),
             mask=md)
    tl.store(DBETA + row * 6 + m, (dbeta * beta * (1.0 - beta)).to(DBETA.dtype.element_ty))


@triton.jit
def _replay_tile(W0, WORK, K, BETA, REC, i_bh, m: tl.constexpr, first, start, t, B, H,
                 orow, mr, od, md, D: tl.constexpr):
    """Rows ``orow`` of matrix m before step t: from W0 (or 0) at ``start``, plus the
    recorded updates of steps start..t-1."""
    loc, tm = _tile_loc(i_bh, m, orow, mr, od, md, D)
    M = tl.load(W0 + loc, mask=_flag(tm, first), other=0.0).to(tl.float32)
    for j in range(start, t):  # no reset inside (start, t): a segment
        rj = j * B * H + i_bh
        _, k = _key(K, rj, m, od, md, D)
        res = tl.load(REC + rj * 11 * D + m * D + orow, mask=mr, other=0.0)
        M = M + (_rate(BETA, rj, m) * res)[:, None] * k[None, :]
    tl.store(WORK + loc, M, mask=tm)


@triton.jit
def _backward_streamed_kernel(
    Q, K, BETA, W0, RESET, START, REC, WT,  # forward inputs and records
    DY, DWT, DCT, DYT,  # incoming gradients
    DQ, DK, DV, DBETA, DW0, DC0, DY0, WORK, CARRY,  # outputs; WORK, CARRY: fp32 scratch
    T, B, H, D: tl.constexpr,
    BD: tl.constexpr, BR: tl.constexpr, FULL: tl.constexpr, REPS: tl.constexpr,
):
    i_bh = tl.program_id(0).to(tl.int64)
    b = i_bh // H
    od = tl.arange(0, BD)
    md = od < D
    orr = tl.arange(0, BR)
    # WORK holds M_t (in the end M_0: the rebuilt initial state), DW0 holds G; the
    # carried (dc, dy) alternate between two CARRY slots as in the forward.
    carry = CARRY + i_bh * 4 * D
    _copy_matrices(WT, WORK, i_bh, orr, od, md, D, BR)
    _copy_matrices(DWT, DW0, i_bh, orr, od, md, D, BR)
    tl.store(carry + od, tl.load(DCT + i_bh * D + od, mask=md, other=0.0).to(tl.float32),
             mask=md)
    tl.store(carry + D + od, tl.load(DYT + i_bh * D + od, mask=md, other=0.0).to(tl.float32),
             mask=md)
    tl.debug_barrier()
    for i in range(T):
        t = T - 1 - i
        row = t * B * H + i_bh
        reset = tl.load(RESET + t * B + b) != 0
        src = carry + (i % 2) * 2 * D
        dst = carry + ((i + 1) % 2) * 2 * D
        rec = REC + row * 11 * D
        y_prev = tl.load(rec + 6 * D + od, mask=md, other=0.0)
        q = _softmax(tl.load(Q + row * D + od, mask=md, other=0.0).to(tl.float32), md)
        r = _recurrent_softmax(y_prev, md, REPS)
        dq = tl.full([BD], 0.0, tl.float32)
        dr = tl.full([BD], 0.0, tl.float32)
        dk0 = tl.full([BD], 0.0, tl.float32)
        dk1 = tl.full([BD], 0.0, tl.float32)
        dk2 = tl.full([BD], 0.0, tl.float32)
        dk3 = tl.full([BD], 0.0, tl.float32)
        dk4 = tl.full([BD], 0.0, tl.float32)
        dk5 = tl.full([BD], 0.0, tl.float32)
        db0 = 0.0
        db1 = 0.0
        db2 = 0.0
        db3 = 0.0
        db4 = 0.0
        db5 = 0.0
        for r0 in range(0, D, BR):
            orow = r0 + orr
            mr = orow < D
            c_prev = tl.load(rec + 7 * D + orow, mask=mr, other=0.0)
            u = tl.load(rec + 8 * D + orow, mask=mr, other=0.0)
            f = tl.load(rec + 9 * D + orow, mask=mr, other=0.0)
            o = tl.load(rec + 10 * D + orow, mask=mr, other=0.0)
            # The cell (Eq. 39-40) backwards: gradients of the reads u, f, o (pre-sigmoid).
            dy = (tl.load(DY + row * D + orow, mask=mr, other=0.0).to(tl.float32)
                  + tl.load(src + D + orow, mask=mr, other=0.0))
            dc = tl.load(src + orow, mask=mr, other=0.0) + dy * o
            d_o = dy * (f * c_prev + (1.0 - f) * u) * o * (1.0 - o)
            d_u = dc * (1.0 - f)
            d_f = dc * (c_prev - u) * f * (1.0 - f)
            if FULL:
                tl.store(dst + orow, tl.where(reset, 0.0, dc * f), mask=mr)
            else:
                tl.store(dst + orow, tl.full(dc.shape, 0.0, tl.float32), mask=mr)
            # The reads (Eq. 36-38) and the writes of the six matrices, backwards.
            p, g, s = _tile_backward(WORK, DW0, K, BETA, REC, DV, row, i_bh, 0, q, d_u, reset,
                                     orow, mr, od, md, D, FULL)
            dq += p
            dk0 += g
            db0 += s
            p, g, s = _tile_backward(WORK, DW0, K, BETA, REC, DV, row, i_bh, 1, q, d_f, reset,
                                     orow, mr, od, md, D, FULL)
            dq += p
            dk1 += g
            db1 += s
            p, g, s = _tile_backward(WORK, DW0, K, BETA, REC, DV, row, i_bh, 2, q, d_o, reset,
                                     orow, mr, od, md, D, FULL)
            dq += p
            dk2 += g
            db2 += s
            p, g, s = _tile_backward(WORK, DW0, K, BETA, REC, DV, row, i_bh, 3, r, d_u, reset,
                                     orow, mr, od, md, D, FULL)
            dr += p
            dk3 += g
            db3 += s
            p, g, s = _tile_backward(WORK, DW0, K, BETA, REC, DV, row, i_bh, 4, r, d_f, reset,
                                     orow, mr, od, md, D, FULL)
            dr += p
            dk4 += g
            db4 += s
            p, g, s = _tile_backward(WORK, DW0, K, BETA, REC, DV, row, i_bh, 5, r, d_o, reset,
                                     orow, mr, od, md, D, FULL)
            dr += p
            dk5 += g
            db5 += s
        _key_backward(K, BETA, DK, DBETA, row, 0, dk0, db0, od, md, D)
        _key_backward(K, BETA, DK, DBETA, row, 1, dk1, db1, od, md, D)
        _key_backward(K, BETA, DK, DBETA, row, 2, dk2, db2, od, md, D)
        _key_backward(K, BETA, DK, DBETA, row, 3, dk3, db3, od, md, D)
        _key_backward(K, BETA, DK, DBETA, row, 4, dk4, db4, od, md, D)
        _key_backward(K, BETA, DK, DBETA, row, 5, dk5, db5, od, md, D)
        tl.store(DQ + row * D + od, _softmax_backward(q, dq).to(DQ.dtype.element_ty), mask=md)
        if FULL:
            dy_prev = tl.where(reset, 0.0, _recurrent_softmax_backward(y_prev, dr, md, REPS))
        else:
            dy_prev = tl.full([BD], 0.0, tl.float32)
        tl.store(dst + D + od, dy_prev, mask=md)
        # The matrices before this step (the tiles undid the writes). After a reset at
        # t >= 1: replay the segment that ends at t - 1 from its start (W0, or 0 after a
        # reset), over the zeros the tiles stored.
        start = tl.load(START + t * B + b)
        tl.debug_barrier()
        if start >= 0:
            first = (start == 0) & (tl.load(RESET + b) == 0)
            for r0 in range(0, D, BR):
                orow = r0 + orr
                mr = orow < D
                for m in tl.static_range(6):  # the six matrices; nothing carried between them
                    _replay_tile(W0, WORK, K, BETA, REC, i_bh, m, first, start, t, B, H, orow,
                                 mr, od, md, D)
            tl.debug_barrier()
    last = carry + (T % 2) * 2 * D
    tl.store(DC0 + i_bh * D + od, tl.load(last + od, mask=md, other=0.0), mask=md)
    tl.store(DY0 + i_bh * D + od, tl.load(last + D + od, mask=md, other=0.0), mask=md)


def _block_sizes(d: int) -> tuple[int, int, int]:
    """(BD, forward warps, backward warps) of the register kernels for head dim d (WARPS)."""
    bd = padded(d)
    return (bd, *WARPS[bd])


def _streamed_sizes(d: int) -> tuple[int, int, int, int, int]:
    """(BD, forward row tile, forward warps, backward row tile, backward warps) of the
    streamed kernels for head dim d (STREAMED)."""
    bd = padded(d)
    return (bd, *STREAMED[bd])


def _streams(d: int) -> bool:
    """Whether head dim d runs the streamed kernels (decided from the shape alone)."""
    return d > STREAM_ABOVE


def _forward(q, k, v, beta, W0, c0, y0, reset, *, store: bool):
    T, B, H, D = q.shape
    dev = q.device
    y = torch.empty(T, B, H, D, device=dev, dtype=q.dtype)
    WT = torch.empty(B, H, NUM_MATRICES, D, D, device=dev, dtype=torch.float32)
    cT = torch.empty(B, H, D, device=dev, dtype=torch.float32)
    yT = torch.empty(B, H, D, device=dev, dtype=torch.float32)
    reset8 = aligned(reset.to(device=dev, dtype=torch.int8))
    rec = torch.empty(T, B, H, 11 * D, device=dev, dtype=torch.float32) if store else WT
    if _streams(D):
        bd, br, warps, _, _ = _streamed_sizes(D)
        carry = torch.empty(B * H, 2, 2, D, device=dev, dtype=torch.float32)
        _forward_streamed_kernel[(B * H,)](
            q, k, v, beta, W0, c0, y0, reset8, y, WT, cT, yT, rec, carry, T, B, H, D,
            BD=bd, BR=br, STORE=store, REPS=RECURRENT_SOFTMAX_EPS, **launch_options(warps),
        )
    else:
        bd, warps, _ = _block_sizes(D)
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
    dq, dk, dv, dbeta = (torch.empty_like(x) for x in (q, k, v, beta))
    dW0 = torch.empty_like(WT)
    dc0 = torch.empty(B, H, D, device=q.device, dtype=torch.float32)
    dy0 = torch.empty_like(dc0)
    if _streams(D):
        bd, _, _, br, warps = _streamed_sizes(D)
        rebuilt = torch.empty_like(WT)  # the working copy of the matrices
        carry = torch.empty(B * H, 2, 2, D, device=q.device, dtype=torch.float32)
        _backward_streamed_kernel[(B * H,)](
            q, k, beta, W0, reset8, starts, rec, WT, aligned(dy), aligned(dWT), aligned(dcT),
            aligned(dyT), dq, dk, dv, dbeta, dW0, dc0, dy0, rebuilt, carry, T, B, H, D,
            BD=bd, BR=br, FULL=full, REPS=RECURRENT_SOFTMAX_EPS, **launch_options(warps),
        )
    else:
        bd, _, warps = _block_sizes(D)
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


def supports(inputs: Mapping[str, Any]) -> str | None:
    """None if the fused kernel can run on a call's arguments (``inputs``, by the reference's
    parameter names: ``dispatch.kernel_inputs``), otherwise the reason (with what would avoid it)."""
    reason = (option_reasons(inputs, {"grad_mode": GRAD_MODES})
              or rank_reasons(inputs, ("q",), "[T, B, H, d]"))
    if reason is not None:
        return reason
    T, B, H, D = inputs["q"].shape
    expected = {"k": (T, B, H, NUM_MATRICES, D), "v": (T, B, H, NUM_MATRICES, D),
                "beta": (T, B, H, NUM_MATRICES), "W0": (B, H, NUM_MATRICES, D, D)}
    for name, shape in expected.items():
        if tuple(inputs[name].shape) != shape:
            return f"{name} has shape {tuple(inputs[name].shape)}; expected {shape}"
    if T == 0:
        return EMPTY_SEQUENCE
    if not 1 <= D <= MAX_HEAD_DIM:
        return (f"head dim {D} is larger than the {MAX_HEAD_DIM} the Delta LSTM kernels "
                f"take (use a head_dim of at most {MAX_HEAD_DIM})")
    return tensor_reasons(inputs, ("q", *expected))


def delta_lstm_triton(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, W0: Tensor, c0: Tensor, y0: Tensor,
    reset: Tensor, *, grad_mode: str = "full",
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Fused Delta LSTM (paper 000 App. A.2 Eq. 36-40); returns (y [T, B, H, d] in q's dtype,
    W_T [B, H, 6, d, d], c_T, y_T in fp32).

    Same arguments as ``delta_lstm_reference``; the state is always fp32.
    """
    check_grad_mode(grad_mode)
    args = [aligned(x) for x in (q, k, v, beta, W0, c0, y0)]
    if torch.is_grad_enabled() and any(x.requires_grad for x in args):
        return _DeltaLSTMFunction.apply(*args, reset, grad_mode == "full")
    y, WT, cT, yT, _ = _forward(*args, reset, store=False)
    return y, WT, cT, yT
