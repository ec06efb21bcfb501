"""Fused SRWM with W^y split over programs by rows (SR-DeltaNet at head dims 33..64).

Same maths as ``fused_recurrent.py`` (paper 002, Eq. 5-8 with the four learning
rates of App. A, Eq. 9-11); per (batch row, head), with A = W_{t-1} after the
step's reset (a reset puts W back to the slow weights S):

    x          = phi(x_t)                                      (softmax or identity)
    [q~; k~; b~] = [A^q; A^k; A^b] x                           (Eq. 5)
    q, k       = softmax(q~), softmax(k~);  beta = sigmoid(b~) in R^4
    r^M        = A^M (q - k),  W^M_t = A^M + beta_M r^M k^T    for M in q, k, b  (Eq. 6-8)
    y          = A^y x,  r^y = A^y (q - k),  W^y_t = A^y + beta_y r^y k^T        (Eq. 5-8)

The block ``C = [W^q; W^k; W^b]`` (2D + 4 rows, at most 132 x 64) is a closed
system: q, k and beta come from C x, and C's own update reads only C. W^y
(Dy rows: 3d + 1 = 193 for SR-DeltaNet at d = 64, too many for one program's
registers) is driven by x, q, k and beta_y but never feeds back, and each of
its rows is independent of the others given them. So:

* forward: ``_core_forward_kernel`` (one program per (batch, head), C in
  registers) records per step, in fp32, r^q, r^k, r^b, q, k and beta (the
  record layout of ``fused_recurrent.py``); then ``_y_forward_kernel`` (grid
  (batch x head, Dy / BC)) carries BC rows of W^y per program, reads x, q, k,
  beta_y, writes y and records r^y for its rows.

* backward, in reverse order, without stored matrices (each kernel undoes its
  own rows' updates, A = W_t - u k^T with u = beta r, loads S at a reset and
  replays the segment before a reset at t >= 1 from S (+ O_0) with
  ``common.replay_starts``, as ``fused_recurrent.py`` does).
  ``_y_backward_kernel`` carries G^y = dL/dW^y_t for its rows; with dy the
  output gradient, u = beta_y r^y and g = beta_y (G^y k):

      d beta_y = sum over the rows of (G^y k) * r^y
      d q      = (A^y)^T g,   d k = (G^y)^T u - (A^y)^T g,   d x = (A^y)^T dy
      dA^y     = g (q - k)^T + dy x^T,   G^y_{t-1} = keep_t (G^y + dA^y)  (0 for grad_mode step)

  Each program writes its rows' partial d q, d k, d x (before phi's
  backward) and d beta_y per step; the wrapper launches the chunks one after
  the other and adds each one's partials into one sum as it ends
  (deterministic, no atomics, and one partial buffer alive, not one per
  chunk). ``_core_backward_kernel`` then runs the backward of
  ``fused_recurrent.py`` on C, adding those sums to its own d q, d k, d beta
  and d x before the softmax / sigmoid / phi backward.

One step of C's backward (undo or load S, the gradients, W^y's terms added,
the writes of d x, g and dz, and G's update) is ``_core_step_backward``, which
both ``_core_backward_kernel`` and ``fused_recurrent._backward_kernel`` call:
W^y's terms of d q, d k, d x and d beta_y are its inputs, here the sums over
the chunks, there computed from W^y's rows in registers. Both replays read C's rates
u = beta r of a record with ``_core_rates``.

dS is formed as in ``fused_recurrent.py``: by telescoping in grad_mode full
(each kernel adds G + dA of its rows at reset steps into one [R, D] matrix per
(batch row, head)), by GEMMs over per-step g and dz in grad_mode step
(``fused_recurrent._slow_grads``).

``fused_recurrent.py`` imports ``_num_records``, ``_core_step_backward`` and
``_core_rates`` from here (this module is the lower of the two).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..triton.common import (
    _add_rows, _block, _load_rows, _matvec, _pick, _runtime_zero, _sigmoid, _softmax,
    _softmax_backward, _sum, _vecmat, aligned, launch_options, padded, warps_for,
)
from .naive import NUM_RATES

# Rows of W^y per program of the split kernels (a power of two). 64 rows at
# d = 64 compile for sm_90 without spilling (tests/interpreter/test_kernels_srwm.py checks
# the shipped shapes) and give 4 programs per (batch, head) at Dy = 193.
SPLIT_ROWS = 64
# Warps (forward, backward) of the C = [W^q; W^k; W^b] kernels per padded head
# dim, and of the W^y chunk kernels per (padded head dim, rows per program);
# the chunk kernels of other (forced) chunk sizes take ``warps_for``.
CORE_WARPS = {16: (1, 4), 32: (4, 4), 64: (4, 8)}
Y_WARPS = {(16, 64): (1, 2), (32, 64): (2, 4), (64, 64): (4, 4)}


@triton.jit
def _load_core(base, row0, D: tl.constexpr, BD: tl.constexpr):
    """W^q, W^k, W^b of the stacked matrix at ``base`` (they start at row ``row0`` = Dy)."""
    return (_load_rows(base, row0, D, BD, BD, D), _load_rows(base, row0 + D, D, BD, BD, D),
            _load_rows(base, row0 + 2 * D, 4, 4, BD, D))


@triton.jit
def _load_core_offsets(OQ, OK, OB, i_bh, zero, D: tl.constexpr, BD: tl.constexpr):
    """Program i_bh's O^q, O^k, O^b (or their gradients), each its own [B, H, rows, D]
    tensor, fp32; ``zero``: 0, see ``common._runtime_zero``."""
    return (_load_rows(OQ + i_bh * D * D, zero, D, BD, BD, D),
            _load_rows(OK + i_bh * D * D, zero, D, BD, BD, D),
            _load_rows(OB + i_bh * 4 * D, zero, 4, 4, BD, D))


@triton.jit
def _store_core_offsets(OQ, OK, OB, i_bh, Vq, Vk, Vb, D: tl.constexpr, BD: tl.constexpr):
    """Stores program i_bh's O^q, O^k, O^b (or their gradients): the inverse of
    ``_load_core_offsets``."""
    pq, mq = _block(0, D, BD, BD, D)
    pb, mb = _block(0, 4, 4, BD, D)
    tl.store(OQ + i_bh * D * D + pq, Vq, mask=mq)
    tl.store(OK + i_bh * D * D + pq, Vk, mask=mq)
    tl.store(OB + i_bh * 4 * D + pb, Vb, mask=mb)


@triton.jit
def _core_forward_kernel(
    X, S, O0Q, O0K, O0B, RESET,  # inputs: x [T,B,H,D], slow [H,R,D], offsets O^q, O^k, O^b
    OTQ, OTK, OTB, REC,  # outputs: final offsets O^q, O^k, O^b, records (all but r^y)
    T, B, H, D: tl.constexpr, DY: tl.constexpr, NREC: tl.constexpr,
    BD: tl.constexpr, FMAP: tl.constexpr,
):
    i_bh = tl.program_id(0).to(tl.int64)
    b = i_bh // H
    h = i_bh % H
    R: tl.constexpr = DY + 2 * D + 4
    od = tl.arange(0, BD)
    o4 = tl.arange(0, 4)
    md = od < D
    s_base = S + h * R * D
    Sq, Sk, Sb = _load_core(s_base, DY, D, BD)
    Oq, Ok, Ob = _load_core_offsets(O0Q, O0K, O0B, i_bh, 0, D, BD)
    Wq = Sq + Oq
    Wk = Sk + Ok
    Wb = Sb + Ob
    for t in range(T):
        row = t * B * H + i_bh
        reset_byte = tl.load(RESET + t * B + b)
        if reset_byte != 0:
            Wq, Wk, Wb = _load_core(s_base, DY + _runtime_zero(reset_byte), D, BD)
        x = tl.load(X + row * D + od, mask=md, other=0.0).to(tl.float32)
        if FMAP == 2:
            x = _softmax(x, md)
        q = _softmax(_matvec(Wq, x), md)
        k = _softmax(_matvec(Wk, x), md)
        beta = _sigmoid(_matvec(Wb, x))
        qk = q - k
        rq = _matvec(Wq, qk)
        rk = _matvec(Wk, qk)
        rb = _matvec(Wb, qk)
        rec = REC + row * NREC
        tl.store(rec + DY + od, rq, mask=md)
        tl.store(rec + DY + D + od, rk, mask=md)
        tl.store(rec + DY + 2 * D + o4, rb)
        tl.store(rec + R + od, q, mask=md)
        tl.store(rec + R + D + od, k, mask=md)
        tl.store(rec + R + 2 * D + o4, beta)
        Wq = Wq + (_pick(beta, o4, 1) * rq)[:, None] * k[None, :]
        Wk = Wk + (_pick(beta, o4, 2) * rk)[:, None] * k[None, :]
        Wb = Wb + (_pick(beta, o4, 3) * rb)[:, None] * k[None, :]
    Sq, Sk, Sb = _load_core(s_base, DY, D, BD)
    _store_core_offsets(OTQ, OTK, OTB, i_bh, Wq - Sq, Wk - Sk, Wb - Sb, D, BD)


@triton.jit
def _y_forward_kernel(
    X, S, O0Y, RESET, REC,  # inputs (O0Y: the offsets O^y [B,H,DY,D]; REC: q, k, beta of the
    # core kernel)
    Y, OTY,  # outputs: y [T,B,H,DY] and the final O^y (rows of this chunk); r^y into REC
    T, B, H, D: tl.constexpr, DY: tl.constexpr, NREC: tl.constexpr,
    BD: tl.constexpr, BC: tl.constexpr, FMAP: tl.constexpr,
):
    i_bh = tl.program_id(0).to(tl.int64)
    row0 = tl.program_id(1) * BC  # this program's rows of W^y: [row0, row0 + BC) and < DY
    b = i_bh // H
    h = i_bh % H
    R: tl.constexpr = DY + 2 * D + 4
    od = tl.arange(0, BD)
    oc = tl.arange(0, BC)
    md = od < D
    rows = DY - row0
    mc = oc < rows
    s_base = S + h * R * D
    W = (_load_rows(s_base, row0, rows, BC, BD, D)
         + _load_rows(O0Y + i_bh * DY * D, row0, rows, BC, BD, D))
    for t in range(T):
        row = t * B * H + i_bh
        reset_byte = tl.load(RESET + t * B + b)
        if reset_byte != 0:
            W = _load_rows(s_base, row0 + _runtime_zero(reset_byte), rows, BC, BD, D)
        x = tl.load(X + row * D + od, mask=md, other=0.0).to(tl.float32)
        if FMAP == 2:
            x = _softmax(x, md)
        rec = REC + row * NREC
        q = tl.load(rec + R + od, mask=md, other=0.0)
        k = tl.load(rec + R + D + od, mask=md, other=0.0)
        by = tl.load(rec + R + 2 * D)
        tl.store(Y + row * DY + row0 + oc, _matvec(W, x).to(Y.dtype.element_ty), mask=mc)
        r = _matvec(W, q - k)
        tl.store(rec + row0 + oc, r, mask=mc)
        W = W + (by * r)[:, None] * k[None, :]
    p, m = _block(row0, rows, BC, BD, D)
    tl.store(OTY + i_bh * DY * D + p, W - _load_rows(s_base, row0, rows, BC, BD, D), mask=m)


@triton.jit(do_not_specialize=["CHUNK"])
def _y_backward_kernel(
    X, S, O0Y, RESET, START, REC, OTY,  # forward inputs and records (O^y: [B,H,DY,D])
    DYOUT, DOTY,  # incoming gradients: dy [T,B,H,DY], d O^y_T [B,H,DY,D]
    DO0Y, DG, PART, ACC, REBUILT,  # outputs (PART [T,B,H,3D+1]: this chunk's partial dq, dk,
    # dx, dbeta_y; step: DG [T,B,H,R] rows 0..DY; full: ACC rows 0..DY += G + dA at resets)
    CHUNK, T, B, H, D: tl.constexpr, DY: tl.constexpr, NREC: tl.constexpr,
    BD: tl.constexpr, BC: tl.constexpr, FMAP: tl.constexpr, FULL: tl.constexpr,
    WRITE_REBUILT: tl.constexpr,
):
    i_bh = tl.program_id(0).to(tl.int64)
    row0 = CHUNK * BC
    b = i_bh // H
    h = i_bh % H
    R: tl.constexpr = DY + 2 * D + 4
    NP: tl.constexpr = 3 * D + 1
    od = tl.arange(0, BD)
    oc = tl.arange(0, BC)
    md = od < D
    rows = DY - row0
    mc = oc < rows
    s_base = S + h * R * D
    o_base = O0Y + i_bh * DY * D
    # W^y_T = S + O_T (the final offsets are what the forward returned).
    W = (_load_rows(s_base, row0, rows, BC, BD, D)
         + _load_rows(OTY + i_bh * DY * D, row0, rows, BC, BD, D))
    G = _load_rows(DOTY + i_bh * DY * D, row0, rows, BC, BD, D)
    for i in range(T):
        t = T - 1 - i
        row = t * B * H + i_bh
        reset_byte = tl.load(RESET + t * B + b)
        reset = reset_byte != 0
        rec = REC + row * NREC
        r = tl.load(rec + row0 + oc, mask=mc, other=0.0)
        q = tl.load(rec + R + od, mask=md, other=0.0)
        k = tl.load(rec + R + D + od, mask=md, other=0.0)
        by = tl.load(rec + R + 2 * D)
        u = by * r
        # The rows this step read (a reset step read S, loaded exactly).
        if reset:
            A = _load_rows(s_base, row0 + _runtime_zero(reset_byte), rows, BC, BD, D)
        else:
            A = W - u[:, None] * k[None, :]
        x_in = tl.load(X + row * D + od, mask=md, other=0.0).to(tl.float32)
        if FMAP == 2:
            x = _softmax(x_in, md)
        else:
            x = tl.where(md, x_in, 0.0)
        du = _matvec(G, k)
        g = by * du
        dq = _vecmat(A, g)
        dz = tl.load(DYOUT + row * DY + row0 + oc, mask=mc, other=0.0).to(tl.float32)
        part = PART + row * NP
        tl.store(part + od, dq, mask=md)
        tl.store(part + D + od, _vecmat(G, u) - dq, mask=md)
        tl.store(part + 2 * D + od, _vecmat(A, dz), mask=md)
        tl.store(part + 3 * D, _sum(du * r, 0))
        if FULL:
            G += g[:, None] * (q - k)[None, :] + dz[:, None] * x[None, :]
            if reset:  # G + dA, cut here by the reset: its part of dS
                _add_rows(ACC + i_bh * R * D, row0 + _runtime_zero(reset_byte), rows, G,
                          BC, BD, D)
            G = tl.where(reset, 0.0, G)
        else:
            tl.store(DG + row * R + row0 + oc, g, mask=mc)
            G = tl.full([BC, BD], 0.0, tl.float32)
        # The rows before this step. After a reset at t >= 1: replay the segment
        # that ends at t - 1 from its start (S, plus O_0 for the first segment
        # when step 0 did not reset).
        start = tl.load(START + t * B + b)
        if start >= 0:
            zero = _runtime_zero(reset_byte)
            W = _load_rows(s_base, row0 + zero, rows, BC, BD, D)
            if (start == 0) & (tl.load(RESET + b) == 0):
                W += _load_rows(o_base, row0 + zero, rows, BC, BD, D)
            for j in range(start, t):  # no reset inside (start, t): a segment
                rj = REC + (j * B * H + i_bh) * NREC
                kj = tl.load(rj + R + D + od, mask=md, other=0.0)
                uj = tl.load(rj + R + 2 * D) * tl.load(rj + row0 + oc, mask=mc, other=0.0)
                W += uj[:, None] * kj[None, :]
        else:
            W = A
    p, m = _block(row0, rows, BC, BD, D)
    tl.store(DO0Y + i_bh * DY * D + p, G, mask=m)
    if WRITE_REBUILT:  # the rows before step 0 (S + O_0), for the reversal test
        tl.store(REBUILT + i_bh * R * D + p, W, mask=m)


@triton.jit
def _core_rates(rec, beta, D: tl.constexpr, DY: tl.constexpr, BD: tl.constexpr):
    """r^q, r^k, r^b of the record at ``rec`` and u^M = beta_M r^M (``beta``: the step's four
    rates), for M in q, k, b."""
    od = tl.arange(0, BD)
    o4 = tl.arange(0, 4)
    md = od < D
    rq = tl.load(rec + DY + od, mask=md, other=0.0)
    rk = tl.load(rec + DY + D + od, mask=md, other=0.0)
    rb = tl.load(rec + DY + 2 * D + o4)
    return (rq, rk, rb,
            _pick(beta, o4, 1) * rq, _pick(beta, o4, 2) * rk, _pick(beta, o4, 3) * rb)


@triton.jit
def _core_step_backward(
    Wq, Wk, Wb, Gq, Gk, Gb,  # the core rows of W_t and of G = dL/dW_t
    rec, q, k, beta, x,  # the step's record (r^q, r^k, r^b are read here), q, k, beta, phi(x_t)
    ext_dq, ext_dk, ext_dx, ext_dbeta_y,  # W^y's terms of d q, d k, d x (before phi), d beta_y
    reset_byte, s_base, row, DX, DG, DZ, acc,
    D: tl.constexpr, DY: tl.constexpr, BD: tl.constexpr, FMAP: tl.constexpr,
    FULL: tl.constexpr,
):
    """One step of the backward of the core rows C = [W^q; W^k; W^b] (both backward kernels:
    ``fused_recurrent._backward_kernel`` and ``_core_backward_kernel``).

    Undoes the step's update (A = W - u k^T; the slow weights S at ``s_base``, loaded
    exactly, at a reset), forms the gradients of the module docstrings from G, adds W^y's
    terms (``ext_*``: (A^y)^T g^y, (G^y)^T u^y - (A^y)^T g^y, (A^y)^T dy and
    sum (G^y k) * r^y) before the softmax / sigmoid / phi backward, writes d x of step
    ``row`` and returns (A^q, A^k, A^b) and G_{t-1} = keep_t (G + dA) (0 for grad_mode step).
    For dS: grad_mode full adds G + dA of a reset step into the core rows of the program's
    [R, D] matrix at ``acc`` (``fused_recurrent._backward``: dS by telescoping); grad_mode step
    writes the core rows of g and dz = [d q~; d k~; d b~] of the step (dS by GEMMs).
    """
    R: tl.constexpr = DY + 2 * D + 4
    NZ: tl.constexpr = 2 * D + 4
    od = tl.arange(0, BD)
    o4 = tl.arange(0, 4)
    md = od < D
    reset = reset_byte != 0
    rq, rk, rb, uq, uk, ub = _core_rates(rec, beta, D, DY, BD)
    if reset:
        Aq, Ak, Ab = _load_core(s_base, DY + _runtime_zero(reset_byte), D, BD)
    else:
        Aq = Wq - uq[:, None] * k[None, :]
        Ak = Wk - uk[:, None] * k[None, :]
        Ab = Wb - ub[:, None] * k[None, :]
    duq = _matvec(Gq, k)
    duk = _matvec(Gk, k)
    dub = _matvec(Gb, k)
    dbeta = tl.where(o4 == 0, ext_dbeta_y, 0.0)
    dbeta += tl.where(o4 == 1, _sum(duq * rq, 0), 0.0)
    dbeta += tl.where(o4 == 2, _sum(duk * rk, 0), 0.0)
    dbeta += tl.where(o4 == 3, _sum(dub * rb, 0), 0.0)
    gq = _pick(beta, o4, 1) * duq
    gk = _pick(beta, o4, 2) * duk
    gb = _pick(beta, o4, 3) * dub
    dq = _vecmat(Aq, gq) + _vecmat(Ak, gk) + _vecmat(Ab, gb)
    dk = _vecmat(Gq, uq) + _vecmat(Gk, uk) + _vecmat(Gb, ub) - dq + ext_dk
    dq += ext_dq
    dzq = _softmax_backward(q, dq)
    dzk = _softmax_backward(k, dk)
    dzb = dbeta * beta * (1.0 - beta)
    dx = _vecmat(Aq, dzq) + _vecmat(Ak, dzk) + _vecmat(Ab, dzb) + ext_dx
    if FMAP == 2:
        dx = _softmax_backward(x, dx)
    tl.store(DX + row * D + od, dx.to(DX.dtype.element_ty), mask=md)
    if FULL:
        qk = q - k
        Gq += gq[:, None] * qk[None, :] + dzq[:, None] * x[None, :]
        Gk += gk[:, None] * qk[None, :] + dzk[:, None] * x[None, :]
        Gb += gb[:, None] * qk[None, :] + dzb[:, None] * x[None, :]
        if reset:  # G + dA, cut here by the reset: its part of dS
            zero = _runtime_zero(reset_byte)
            _add_rows(acc, DY + zero, D, Gq, BD, BD, D)
            _add_rows(acc, DY + D + zero, D, Gk, BD, BD, D)
            _add_rows(acc, DY + 2 * D + zero, 4, Gb, 4, BD, D)
        Gq = tl.where(reset, 0.0, Gq)
        Gk = tl.where(reset, 0.0, Gk)
        Gb = tl.where(reset, 0.0, Gb)
    else:
        # The factors of dA = g (q - k)^T + dz x^T, for the dS GEMMs.
        dg = DG + row * R
        tl.store(dg + DY + od, gq, mask=md)
        tl.store(dg + DY + D + od, gk, mask=md)
        tl.store(dg + DY + 2 * D + o4, gb)
        dz = DZ + row * NZ
        tl.store(dz + od, dzq, mask=md)
        tl.store(dz + D + od, dzk, mask=md)
        tl.store(dz + 2 * D + o4, dzb)
        Gq = tl.full([BD, BD], 0.0, tl.float32)
        Gk = tl.full([BD, BD], 0.0, tl.float32)
        Gb = tl.full([4, BD], 0.0, tl.float32)
    return Aq, Ak, Ab, Gq, Gk, Gb


@triton.jit
def _core_backward_kernel(
    X, S, O0Q, O0K, O0B, RESET, START, REC, OTQ, OTK, OTB,  # forward inputs and records
    EXT, DOTQ, DOTK, DOTB,  # summed gradients from W^y's rows [T,B,H,3D+1]; d O^q_T, ...
    DX, DO0Q, DO0K, DO0B, DG, DZ, ACC, REBUILT,  # outputs; grad_mode step: DG [T,B,H,R]
    # rows Dy..R and DZ [T,B,H,2D+4], full: ACC [B,H,R,D] rows Dy..R += G + dA at each reset
    T, B, H, D: tl.constexpr, DY: tl.constexpr, NREC: tl.constexpr,
    BD: tl.constexpr, FMAP: tl.constexpr, FULL: tl.constexpr, WRITE_REBUILT: tl.constexpr,
):
    i_bh = tl.program_id(0).to(tl.int64)
    b = i_bh // H
    h = i_bh % H
    R: tl.constexpr = DY + 2 * D + 4
    NP: tl.constexpr = 3 * D + 1
    od = tl.arange(0, BD)
    o4 = tl.arange(0, 4)
    md = od < D
    s_base = S + h * R * D
    Sq, Sk, Sb = _load_core(s_base, DY, D, BD)
    Oq, Ok, Ob = _load_core_offsets(OTQ, OTK, OTB, i_bh, 0, D, BD)
    Wq = Sq + Oq
    Wk = Sk + Ok
    Wb = Sb + Ob
    Gq, Gk, Gb = _load_core_offsets(DOTQ, DOTK, DOTB, i_bh, 0, D, BD)
    for i in range(T):
        t = T - 1 - i
        row = t * B * H + i_bh
        reset_byte = tl.load(RESET + t * B + b)
        rec = REC + row * NREC
        q = tl.load(rec + R + od, mask=md, other=0.0)
        k = tl.load(rec + R + D + od, mask=md, other=0.0)
        beta = tl.load(rec + R + 2 * D + o4)
        ext = EXT + row * NP  # W^y's terms, summed over its chunks
        ext_dq = tl.load(ext + od, mask=md, other=0.0)
        ext_dk = tl.load(ext + D + od, mask=md, other=0.0)
        ext_dx = tl.load(ext + 2 * D + od, mask=md, other=0.0)
        ext_dbeta_y = tl.load(ext + 3 * D)
        x_in = tl.load(X + row * D + od, mask=md, other=0.0).to(tl.float32)
        if FMAP == 2:
            x = _softmax(x_in, md)
        else:
            x = tl.where(md, x_in, 0.0)
        Aq, Ak, Ab, Gq, Gk, Gb = _core_step_backward(
            Wq, Wk, Wb, Gq, Gk, Gb, rec, q, k, beta, x, ext_dq, ext_dk, ext_dx, ext_dbeta_y,
            reset_byte, s_base, row, DX, DG, DZ, ACC + i_bh * R * D, D, DY, BD, FMAP, FULL)
        # The rows before this step. After a reset at t >= 1: replay the segment
        # that ends at t - 1 from its start (S, plus O_0 for the first segment
        # when step 0 did not reset).
        start = tl.load(START + t * B + b)
        if start >= 0:
            zero = _runtime_zero(reset_byte)
            Wq, Wk, Wb = _load_core(s_base, DY + zero, D, BD)
            if (start == 0) & (tl.load(RESET + b) == 0):
                Iq, Ik, Ib = _load_core_offsets(O0Q, O0K, O0B, i_bh, zero, D, BD)
                Wq += Iq
                Wk += Ik
                Wb += Ib
            for j in range(start, t):  # no reset inside (start, t): a segment
                rj = REC + (j * B * H + i_bh) * NREC
                kj = tl.load(rj + R + D + od, mask=md, other=0.0)
                _, _, _, uqj, ukj, ubj = _core_rates(rj, tl.load(rj + R + 2 * D + o4), D, DY, BD)
                Wq += uqj[:, None] * kj[None, :]
                Wk += ukj[:, None] * kj[None, :]
                Wb += ubj[:, None] * kj[None, :]
        else:
            Wq = Aq
            Wk = Ak
            Wb = Ab
    _store_core_offsets(DO0Q, DO0K, DO0B, i_bh, Gq, Gk, Gb, D, BD)
    if WRITE_REBUILT:
        base = i_bh * R * D
        pq, mwq = _block(DY, D, BD, BD, D)
        pk, mwk = _block(DY + D, D, BD, BD, D)
        pb, mwb = _block(DY + 2 * D, 4, 4, BD, D)
        tl.store(REBUILT + base + pq, Wq, mask=mwq)
        tl.store(REBUILT + base + pk, Wk, mask=mwk)
        tl.store(REBUILT + base + pb, Wb, mask=mwb)


def _num_records(d: int, dy: int) -> int:
    """fp32 numbers recorded per step: r (Dy + 2D + 4), q, k (D each), beta (4)."""
    return dy + 4 * d + 2 * NUM_RATES


def split_config(d: int, rows: int) -> tuple[int, tuple[int, int], tuple[int, int]]:
    """(BD, core kernel warps (fwd, bwd), W^y chunk kernel warps (fwd, bwd)) for head dim d
    and ``rows`` rows of W^y per program."""
    bd = padded(d)
    y_warps = Y_WARPS.get((bd, rows))
    if y_warps is None:  # a forced chunk size (tests): warps for its block
        y_warps = (warps_for(rows * bd, 1024), warps_for(rows * bd, 512))
    return bd, CORE_WARPS[bd], y_warps


def offset_buffers(B: int, H: int, D: int, DY: int, device) -> tuple[Tensor, ...]:
    """Uninitialised fp32 (O^y, O^q, O^k, O^b), [B, H, rows, D] each (rows Dy, D, D, 4): the
    offsets and their gradients are four tensors, as the callers hold them, never stacked
    (a stacked copy in, and the concatenation of their gradients out, would each take one
    more [B, H, R, D])."""
    return tuple(torch.empty(B, H, rows, D, device=device, dtype=torch.float32)
                 for rows in (DY, D, D, NUM_RATES))


def split_forward(x: Tensor, S: Tensor, O0: tuple[Tensor, ...], reset8: Tensor, *, fmap: int,
                  rows: int):
    """y [T,B,H,Dy] (x's dtype), the final offsets O_T (``offset_buffers``, fp32) and the
    records [T,B,H,NREC] (fp32; always written: the W^y kernel reads q, k, beta from them)."""
    T, B, H, D = x.shape
    R = S.shape[1]
    DY = R - 2 * D - NUM_RATES
    bd, (core_warps, _), (y_warps, _) = split_config(D, rows)
    nrec = _num_records(D, DY)
    y = torch.empty(T, B, H, DY, device=x.device, dtype=x.dtype)
    OT = offset_buffers(B, H, D, DY, x.device)
    rec = torch.empty(T, B, H, nrec, device=x.device, dtype=torch.float32)
    _core_forward_kernel[(B * H,)](
        x, S, *O0[1:], reset8, *OT[1:], rec, T, B, H, D, DY, nrec,
        BD=bd, FMAP=fmap, **launch_options(core_warps),
    )
    _y_forward_kernel[(B * H, triton.cdiv(DY, rows))](
        x, S, O0[0], reset8, rec, y, OT[0], T, B, H, D, DY, nrec,
        BD=bd, BC=rows, FMAP=fmap, **launch_options(y_warps),
    )
    return y, OT, rec


def split_backward(x, S, O0, reset8, starts, rec, OT, dy, dOT, dg, dz, acc, *, fmap: int,
                   full: bool, rows: int, rebuild: bool):
    """dx, dO_0 (``offset_buffers``; O0, OT and dOT are four tensors too) and (only with
    ``rebuild``) the rebuilt S + O_0 [B,H,R,D], from the W^y chunk kernel, a sum over its
    chunks and the core kernel; for dS (``fused_recurrent._backward``), full:
    G + dA of every reset step added into ``acc`` [B,H,R,D], step: g into ``dg`` [T,B,H,R]
    and dz = [d q~; d k~; d b~] into ``dz`` [T,B,H,2D+4] (the others: any tensor, unused)."""
    T, B, H, D = x.shape
    R = S.shape[1]
    DY = R - 2 * D - NUM_RATES
    bd, (_, core_warps), (_, y_warps) = split_config(D, rows)
    nrec = _num_records(D, DY)
    chunks = triton.cdiv(DY, rows)
    dx = torch.empty_like(x)
    dO0 = offset_buffers(B, H, D, DY, x.device)
    rebuilt = (torch.empty(B, H, R, D, device=x.device, dtype=torch.float32) if rebuild
               else dO0[0])
    dy = aligned(dy)
    # One launch per chunk of W^y's rows, each summed into ext as it ends (chunk 0 writes
    # ext itself): two [T, B, H, 3D + 1] buffers at most, not one per chunk, and the
    # order of the sum is fixed (deterministic, no atomics).
    ext = torch.empty(T, B, H, 3 * D + 1, device=x.device, dtype=torch.float32)
    part = torch.empty_like(ext) if chunks > 1 else ext
    for chunk in range(chunks):
        _y_backward_kernel[(B * H,)](
            x, S, O0[0], reset8, starts, rec, OT[0], dy, dOT[0],
            dO0[0], dg, ext if chunk == 0 else part, acc, rebuilt,
            chunk, T, B, H, D, DY, nrec,
            BD=bd, BC=rows, FMAP=fmap, FULL=full, WRITE_REBUILT=rebuild,
            **launch_options(y_warps),
        )
        if chunk:
            ext += part
    del part
    _core_backward_kernel[(B * H,)](
        x, S, *O0[1:], reset8, starts, rec, *OT[1:], ext, *dOT[1:],
        dx, *dO0[1:], dg, dz, acc, rebuilt,
        T, B, H, D, DY, nrec,
        BD=bd, FMAP=fmap, FULL=full, WRITE_REBUILT=rebuild, **launch_options(core_warps),
    )
    return dx, dO0, rebuilt
