"""Fused Triton self-referential weight matrix (SRWM) over a whole rollout.

The maths is ``fwrl.kernels.srwm.naive`` (paper 002, Eq. 5-8 with the four
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
weights W = S + O; the offsets O are formed once on entry and exit, and S is
read from memory (where it stays in cache) only at resets, so it takes no
registers. W^q, W^k and W^b cannot be split over programs: each feeds q and
k, which every row's update reads. W^y only reads them, so where the whole
matrix does not fit in registers (SR-DeltaNet, Dy = 3d + 1, at d = 33..64: up
to 325 x 64) ``fused_recurrent_split`` runs [W^q; W^k; W^b] in one program and
W^y's rows split over several (``srwm_triton`` picks the path; ``split_rows``
forces it).

Backward without storing the T matrices: the forward records, per step and in
fp32, r, q, k and beta, so ``u`` is recomputed bit for bit and the update is
undone as ``A = W_t - u k^T`` (no matrix inverse). At a reset at t >= 1 the
matrix before it is rebuilt by replaying the recorded updates of the segment
that ends at t - 1 from S (+ O_0 for the first segment; ``common.replay_starts``:
nothing stored, no host synchronisation). With G = dL/dW_t through the carried
state, dy the output gradient, and g = rate * (G k):

    d beta_m = sum over block m of (G k) * r,   d b~ = d beta * beta (1 - beta)
    d q      = A^T g;   d k = G^T u - A^T g     (then through the softmaxes)
    dz       = [dy; d q~; d k~; d b~];   d x = A^T dz  (then through phi)
    dA       = g (q - k)^T + dz x^T
    dS       = sum over steps of dA   (the slow weights enter every step)
    G_{t-1}  = keep_t (G + dA)   (grad_mode full; 0 for step)

The rows [W^q; W^k; W^b] of each step go through
``fused_recurrent_split._core_step_backward``, shared with the split path's core
kernel: W^y's terms of d q, d k, d x and d beta_y ((A^y)^T g^y, (G^y)^T u^y -
(A^y)^T g^y, (A^y)^T dy, sum (G^y k) * r^y) are formed from W^y's rows here and
passed to it (the replay reads those rows' rates u = beta r with
``fused_recurrent_split._core_rates``).

dS needs no [R, D] accumulator in registers (which is what lets d = 64 and
SR-DeltaNet's Dy = 3d + 1 = 97 at d = 32 run without spilling; ``WARPS`` lists
the block shapes the register kernels take). In grad_mode full the sum
telescopes: G_{t-1} = keep_t (G_t + dA_t), so per (batch row, head)

    sum over t of dA_t = dO_0 - dO_T + sum over the reset steps t of (G_t + dA_t)

and the kernel adds G_t + dA_t into a [R, D] matrix in memory at the (rare)
reset steps only; the wrapper adds dO_0 - dO_T and sums over the batch. In
grad_mode step (G is cut every step) the kernel writes g and dz per step
(fp32) and dS is batched GEMMs over those and the records in PyTorch
(``_slow_grads``, on strided views, nothing copied). Both are deterministic:
no atomics.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

from fwrl.kernels import GRAD_MODES
from fwrl.kernels.feature_maps import apply_feature_map

from ..triton.common import (
    EMPTY_SEQUENCE, _add_rows, _block, _load_rows, _matvec, _pick, _runtime_zero, _sigmoid,
    _softmax, _sum, _vecmat, aligned, launch_options, option_reasons, padded, rank_reasons,
    replay_starts, tensor_reasons,
)
from .fused_recurrent_split import (
    SPLIT_ROWS, _core_rates, _core_step_backward, _load_core_offsets, _num_records,
    _store_core_offsets, offset_buffers, split_backward, split_forward,
)
from .naive import INPUT_MAPS, NUM_RATES, Offsets, check_srwm_args

KERNEL_INPUT_MAPS = {"identity": 0, "softmax": 2}
MIN_HEAD_DIM = 1
MAX_HEAD_DIM = 64
# Warps (forward, backward) per padded block shape (BD, BY) = (head dim, rows of
# W^y), each compiled for sm_90 without spilling registers (the shipped shapes
# are checked by tests/interpreter/test_kernels_srwm.py). It covers the
# SRWM (Dy = d) up to d = 64 and SR-DeltaNet (Dy = 3d + 1) up to d = 32; other
# shapes (SR-DeltaNet at d = 64: Dy = 193, a 325 x 64 matrix) take the split
# path of ``fused_recurrent_split``. The backward takes few warps: its per-row
# vectors are replicated across warps, so more warps cost registers rather than
# save them.
WARPS = {(16, 16): (1, 4), (16, 32): (1, 4), (16, 64): (1, 4), (32, 16): (4, 4),
         (32, 32): (4, 4), (32, 64): (2, 4), (32, 128): (4, 8), (64, 16): (4, 8),
         (64, 32): (4, 8), (64, 64): (8, 8)}


@triton.jit
def _load_blocks(base, zero, D: tl.constexpr, DY: tl.constexpr, BD: tl.constexpr,
                 BY: tl.constexpr):
    """The four sub-matrices [W^y; W^q; W^k; W^b] of one [R, D] matrix at ``base``, fp32.

    For the reads inside the time loop (slow weights at resets and replays).
    ``zero`` is 0 at run time, from a value the compiler cannot see: the address
    tensors then depend on it and are formed at each read, instead of being
    hoisted out of the loop where they would hold registers for all of it.
    """
    py, my = _block(zero, DY, BY, BD, D)
    pq, mq = _block(zero + DY, D, BD, BD, D)
    pk, mk = _block(zero + DY + D, D, BD, BD, D)
    pb, mb = _block(zero + DY + 2 * D, 4, 4, BD, D)
    return (tl.load(base + py, mask=my, other=0.0).to(tl.float32),
            tl.load(base + pq, mask=mq, other=0.0).to(tl.float32),
            tl.load(base + pk, mask=mk, other=0.0).to(tl.float32),
            tl.load(base + pb, mask=mb, other=0.0).to(tl.float32))


@triton.jit
def _slow_plus_offsets(s_base, OY, OQ, OK, OB, i_bh, D: tl.constexpr, DY: tl.constexpr,
                       BD: tl.constexpr, BY: tl.constexpr):
    """The four blocks of W = S + O for program i_bh: S at ``s_base`` ([R, D]) and the
    offsets O^y, O^q, O^k, O^b, each its own [B, H, rows, D] tensor; fp32."""
    Wy, Wq, Wk, Wb = _load_blocks(s_base, 0, D, DY, BD, BY)
    Oq, Ok, Ob = _load_core_offsets(OQ, OK, OB, i_bh, 0, D, BD)
    return (Wy + _load_rows(OY + i_bh * DY * D, 0, DY, BY, BD, D), Wq + Oq, Wk + Ok, Wb + Ob)


@triton.jit
def _forward_kernel(
    X, S, O0Y, O0Q, O0K, O0B, RESET,  # inputs: x [T,B,H,D], slow [H,R,D], offsets [B,H,rows,D]
    Y, OTY, OTQ, OTK, OTB, REC,  # outputs: y, the final offsets, REC (only with STORE)
    T, B, H, D: tl.constexpr, DY: tl.constexpr, NREC: tl.constexpr,
    BD: tl.constexpr, BY: tl.constexpr, FMAP: tl.constexpr, STORE: tl.constexpr,
):
    i_bh = tl.program_id(0).to(tl.int64)
    b = i_bh // H
    h = i_bh % H
    R: tl.constexpr = DY + 2 * D + 4
    od = tl.arange(0, BD)
    oy = tl.arange(0, BY)
    o4 = tl.arange(0, 4)
    md = od < D
    my = oy < DY
    s_base = S + h * R * D
    Wy, Wq, Wk, Wb = _slow_plus_offsets(s_base, O0Y, O0Q, O0K, O0B, i_bh, D, DY, BD, BY)
    for t in range(T):
        row = t * B * H + i_bh
        reset_byte = tl.load(RESET + t * B + b)
        if reset_byte != 0:
            Wy, Wq, Wk, Wb = _load_blocks(s_base, _runtime_zero(reset_byte), D, DY, BD, BY)
        x = tl.load(X + row * D + od, mask=md, other=0.0).to(tl.float32)
        if FMAP == 2:
            x = _softmax(x, md)
        tl.store(Y + row * DY + oy, _matvec(Wy, x).to(Y.dtype.element_ty), mask=my)
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
    Sy, Sq, Sk, Sb = _load_blocks(s_base, 0, D, DY, BD, BY)
    py, mwy = _block(0, DY, BY, BD, D)
    tl.store(OTY + i_bh * DY * D + py, Wy - Sy, mask=mwy)
    _store_core_offsets(OTQ, OTK, OTB, i_bh, Wq - Sq, Wk - Sk, Wb - Sb, D, BD)


@triton.jit
def _backward_kernel(
    X, S, O0Y, O0Q, O0K, O0B, RESET, START, REC,  # forward inputs and records
    OTY, OTQ, OTK, OTB,  # the final offsets the forward returned
    DYOUT, DOTY, DOTQ, DOTK, DOTB,  # incoming gradients: dy [T,B,H,DY], d offsets_T
    DX, DO0Y, DO0Q, DO0K, DO0B, DG, DZ, ACC, REBUILT,  # outputs; for dS, grad_mode step:
    # DG [T,B,H,R] and DZ [T,B,H,2D+4], full: ACC [B,H,R,D] += G + dA at each reset
    T, B, H, D: tl.constexpr, DY: tl.constexpr, NREC: tl.constexpr,
    BD: tl.constexpr, BY: tl.constexpr, FMAP: tl.constexpr, FULL: tl.constexpr,
    WRITE_REBUILT: tl.constexpr,
):
    i_bh = tl.program_id(0).to(tl.int64)
    b = i_bh // H
    h = i_bh % H
    R: tl.constexpr = DY + 2 * D + 4
    od = tl.arange(0, BD)
    oy = tl.arange(0, BY)
    o4 = tl.arange(0, 4)
    md = od < D
    my = oy < DY
    s_base = S + h * R * D
    # W_T = S + O_T (the final offsets are what the forward returned).
    Wy, Wq, Wk, Wb = _slow_plus_offsets(s_base, OTY, OTQ, OTK, OTB, i_bh, D, DY, BD, BY)
    Gy = _load_rows(DOTY + i_bh * DY * D, 0, DY, BY, BD, D)
    Gq, Gk, Gb = _load_core_offsets(DOTQ, DOTK, DOTB, i_bh, 0, D, BD)
    for i in range(T):
        t = T - 1 - i
        row = t * B * H + i_bh
        reset_byte = tl.load(RESET + t * B + b)
        reset = reset_byte != 0
        rec = REC + row * NREC
        q = tl.load(rec + R + od, mask=md, other=0.0)
        k = tl.load(rec + R + D + od, mask=md, other=0.0)
        beta = tl.load(rec + R + 2 * D + o4)
        x_in = tl.load(X + row * D + od, mask=md, other=0.0).to(tl.float32)
        if FMAP == 2:
            x = _softmax(x_in, md)
        else:
            x = tl.where(md, x_in, 0.0)
        # W^y's rows; their terms of d q, d k, d x and d beta_y go to the core rows' step.
        ry = tl.load(rec + oy, mask=my, other=0.0)
        by = _pick(beta, o4, 0)
        uy = by * ry
        # Undo the update: the rows this step read (after its reset; a reset step
        # read the slow weights, loaded exactly rather than rebuilt).
        if reset:
            Ay = _load_rows(s_base, _runtime_zero(reset_byte), DY, BY, BD, D)
        else:
            Ay = Wy - uy[:, None] * k[None, :]
        duy = _matvec(Gy, k)
        gy = by * duy
        dqy = _vecmat(Ay, gy)
        dky = _vecmat(Gy, uy) - dqy
        dzy = tl.load(DYOUT + row * DY + oy, mask=my, other=0.0).to(tl.float32)
        # The core rows [W^q; W^k; W^b]: the step shared with the split path.
        Aq, Ak, Ab, Gq, Gk, Gb = _core_step_backward(
            Wq, Wk, Wb, Gq, Gk, Gb, rec, q, k, beta, x,
            dqy, dky, _vecmat(Ay, dzy), _sum(duy * ry, 0),
            reset_byte, s_base, row, DX, DG, DZ, ACC + i_bh * R * D, D, DY, BD, FMAP, FULL)
        if FULL:
            Gy += gy[:, None] * (q - k)[None, :] + dzy[:, None] * x[None, :]
            if reset:  # G + dA, cut here by the reset: its part of dS
                _add_rows(ACC + i_bh * R * D, _runtime_zero(reset_byte), DY, Gy, BY, BD, D)
            Gy = tl.where(reset, 0.0, Gy)
        else:
            tl.store(DG + row * R + oy, gy, mask=my)
            Gy = tl.full([BY, BD], 0.0, tl.float32)
        # The matrix before this step. After a reset at t >= 1: replay the
        # segment that ends at t - 1 from its start: S, plus O_0 when the
        # segment is the first and step 0 did not reset.
        start = tl.load(START + t * B + b)
        if start >= 0:
            zero = _runtime_zero(reset_byte)
            Wy, Wq, Wk, Wb = _load_blocks(s_base, zero, D, DY, BD, BY)
            if (start == 0) & (tl.load(RESET + b) == 0):
                Oy = _load_rows(O0Y + i_bh * DY * D, zero, DY, BY, BD, D)
                Oq, Ok, Ob = _load_core_offsets(O0Q, O0K, O0B, i_bh, zero, D, BD)
                Wy += Oy
                Wq += Oq
                Wk += Ok
                Wb += Ob
            for j in range(start, t):  # no reset inside (start, t): a segment
                rj = REC + (j * B * H + i_bh) * NREC
                kj = tl.load(rj + R + D + od, mask=md, other=0.0)
                betaj = tl.load(rj + R + 2 * D + o4)
                _, _, _, uqj, ukj, ubj = _core_rates(rj, betaj, D, DY, BD)
                uyj = _pick(betaj, o4, 0) * tl.load(rj + oy, mask=my, other=0.0)
                Wy += uyj[:, None] * kj[None, :]
                Wq += uqj[:, None] * kj[None, :]
                Wk += ukj[:, None] * kj[None, :]
                Wb += ubj[:, None] * kj[None, :]
        else:
            Wy = Ay
            Wq = Aq
            Wk = Ak
            Wb = Ab
    py, mwy = _block(0, DY, BY, BD, D)
    tl.store(DO0Y + i_bh * DY * D + py, Gy, mask=mwy)
    _store_core_offsets(DO0Q, DO0K, DO0B, i_bh, Gq, Gk, Gb, D, BD)
    if WRITE_REBUILT:  # the full matrix before step 0 (S + O_0), for the reversal test
        base = i_bh * R * D
        pq, mwq = _block(DY, D, BD, BD, D)
        pk, mwk = _block(DY + D, D, BD, BD, D)
        pb, mwb = _block(DY + 2 * D, 4, 4, BD, D)
        tl.store(REBUILT + base + py, Wy, mask=mwy)
        tl.store(REBUILT + base + pq, Wq, mask=mwq)
        tl.store(REBUILT + base + pk, Wk, mask=mwk)
        tl.store(REBUILT + base + pb, Wb, mask=mwb)


def _padded(d: int, dy: int) -> tuple[int, int]:
    """(BD, BY): the head dim and the rows of W^y padded to powers of two (16 at least)."""
    return padded(d), padded(dy)


def _split_rows(d: int, dy: int, split_rows: int | None) -> int | None:
    """Rows of W^y per program of the split path, or None for the register path: the
    register path wherever ``WARPS`` has the block shape, unless ``split_rows`` forces
    the split path (a power of two)."""
    if split_rows is not None:
        if split_rows < 1 or split_rows & (split_rows - 1):
            raise ValueError(f"split_rows must be a power of two, got {split_rows}")
        return split_rows
    return None if _padded(d, dy) in WARPS else SPLIT_ROWS


def _block_sizes(d: int, dy: int) -> tuple[int, int, int, int]:
    """(BD, BY, forward warps, backward warps) for head dim d and Dy rows of W^y (WARPS)."""
    bd, by = _padded(d, dy)
    return (bd, by, *WARPS[(bd, by)])


def _forward(x: Tensor, S: Tensor, O0: tuple[Tensor, ...], reset: Tensor, *, fmap: int,
             store: bool, split_rows: int | None = None):
    """y, O_T (four tensors, as O0: ``fused_recurrent_split.offset_buffers``) and (reset
    bytes, replay starts, records); ``split_rows``: the split path
    (``fused_recurrent_split``) with that many rows of W^y per program, None: the register
    path."""
    T, B, H, D = x.shape
    R = S.shape[1]
    DY = R - 2 * D - NUM_RATES
    reset8 = aligned(reset.to(device=x.device, dtype=torch.int8))
    if split_rows is not None:
        y, OT, rec = split_forward(x, S, O0, reset8, fmap=fmap, rows=split_rows)
    else:
        bd, by, warps, _ = _block_sizes(D, DY)
        y = torch.empty(T, B, H, DY, device=x.device, dtype=x.dtype)
        OT = offset_buffers(B, H, D, DY, x.device)
        nrec = _num_records(D, DY)
        rec = (torch.empty(T, B, H, nrec, device=x.device, dtype=torch.float32) if store
               else OT[0])
        _forward_kernel[(B * H,)](
            x, S, *O0, reset8, y, *OT, rec,
            T, B, H, D, DY, nrec,
            BD=bd, BY=by, FMAP=fmap, STORE=store, **launch_options(warps),
        )
    starts = replay_starts(reset8) if store else reset8
    return y, OT, (reset8, starts, rec)


def _backward(x, S, O0, records, OT, dy, dOT, *, fmap: int, full: bool, rebuild: bool = False,
              split_rows: int | None = None):
    reset8, starts, rec = records
    T, B, H, D = x.shape
    R = S.shape[1]
    DY = R - 2 * D - NUM_RATES
    dOT = tuple(aligned(g) for g in dOT)
    # dS = sum over (t, b) of dA_t. grad_mode full: G_{t-1} = keep_t (G_t + dA_t) telescopes,
    # so per row b the sum is dO_0 - dO_T + (G_t + dA_t summed over the reset steps t, which
    # the kernels add into acc): no per-step factors, no GEMM. grad_mode step: the kernels
    # write the factors g and dz of each dA_t and _slow_grads sums their products.
    # (The buffer a mode does not use is passed as any other: the kernels never touch it.)
    if full:
        acc = torch.zeros(B, H, R, D, device=x.device, dtype=torch.float32)
        dg = dz = acc
    else:
        dg = torch.empty(T, B, H, R, device=x.device, dtype=torch.float32)
        dz = torch.empty(T, B, H, 2 * D + NUM_RATES, device=x.device, dtype=torch.float32)
        acc = dg
    if split_rows is not None:
        dx, dO0, rebuilt = split_backward(
            x, S, O0, reset8, starts, rec, OT, dy, dOT, dg, dz, acc,
            fmap=fmap, full=full, rows=split_rows, rebuild=rebuild)
    else:
        bd, by, _, warps = _block_sizes(D, DY)
        dx = torch.empty_like(x)
        dO0 = offset_buffers(B, H, D, DY, x.device)
        rebuilt = (torch.empty(B, H, R, D, device=x.device, dtype=torch.float32) if rebuild
                   else dO0[0])
        _backward_kernel[(B * H,)](
            x, S, *O0, reset8, starts, rec, *OT, aligned(dy), *dOT,
            dx, *dO0, dg, dz, acc, rebuilt,
            T, B, H, D, DY, _num_records(D, DY),
            BD=bd, BY=by, FMAP=fmap, FULL=full, WRITE_REBUILT=rebuild,
            **launch_options(warps),
        )
    if full:
        dS = acc.sum(dim=0)
        del acc
        row0 = 0
        for d0, dT in zip(dO0, dOT):  # + sum over b of dO_0 - dO_T, block by block
            rows = d0.shape[2]
            dS[:, row0 : row0 + rows] += d0.sum(dim=0) - dT.float().sum(dim=0)
            row0 += rows
    else:
        dS = _slow_grads(x, rec, dg, dy, dz, fmap=fmap)
    grads = (dx, dS, dO0)
    return grads + (rebuilt,) if rebuild else grads


# Largest fp32 chunk of phi(x) (bytes) ``_slow_grads`` holds at a time.
PHI_CHUNK_BYTES = 8 * 2**20


def _slow_grads(x: Tensor, rec: Tensor, dg: Tensor, dy: Tensor, dz: Tensor, *,
                fmap: int) -> Tensor:
    """dS [H, R, D] = sum over (t, b) of g (q - k)^T + [dy; dz] phi(x)^T, in fp32.

    Batched GEMMs over the heads on strided views, accumulated in place: g
    ([H, R, T B]) against q and k read from the records ([H, T B, D], the
    difference as two products, not a tensor), and the output block of dS
    against dy, the rest against dz, so neither [dy; dz] nor q - k is formed.
    Every operand has a unit stride and a leading stride of at least its rows,
    which cuBLAS reads in place (``einsum`` copied both operands of each GEMM).
    phi(x) is computed in chunks of at most PHI_CHUNK_BYTES of steps. The sum
    runs in a fixed order: deterministic.
    """
    T, B, H, D = x.shape
    R, DY = dg.shape[-1], dy.shape[-1]
    dS = torch.zeros(H, R, D, device=x.device, dtype=torch.float32)

    def heads(t: Tensor) -> Tensor:  # [n, B, H, c] (c contiguous) -> [H, n B, c], a view
        return t.reshape(t.shape[0] * B, H, t.shape[-1]).transpose(0, 1)

    g = heads(dg).transpose(1, 2)  # [H, R, T B]
    dS.baddbmm_(g, heads(rec[..., R : R + D]))
    dS.baddbmm_(g, heads(rec[..., R + D : R + 2 * D]), alpha=-1.0)
    input_map = "softmax" if fmap == 2 else "identity"
    steps = max(1, min(T, PHI_CHUNK_BYTES // (B * H * D * 4)))
    for t0 in range(0, T, steps):
        t1 = min(T, t0 + steps)
        phi_x = heads(apply_feature_map(input_map, x[t0:t1].float()))
        dS[:, :DY].baddbmm_(heads(dy[t0:t1].float()).transpose(1, 2), phi_x)
        dS[:, DY:].baddbmm_(heads(dz[t0:t1]).transpose(1, 2), phi_x)
        del phi_x  # before the next chunk exists
    return dS


class _SRWMFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, S, O0y, O0q, O0k, O0b, reset, fmap, full, split_rows):
        O0 = (O0y, O0q, O0k, O0b)
        y, OT, records = _forward(x, S, O0, reset, fmap=fmap, store=True, split_rows=split_rows)
        ctx.save_for_backward(x, S, *O0, *OT, *records)
        ctx.options = dict(fmap=fmap, full=full, split_rows=split_rows)
        ctx.dtypes = (S.dtype, *(o.dtype for o in O0))
        return (y, *OT)

    @staticmethod
    def backward(ctx, dy, *dOT):
        x, S, *rest = ctx.saved_tensors
        O0, OT, records = tuple(rest[:4]), tuple(rest[4:8]), rest[8:]
        dx, dS, dO0 = _backward(x, S, O0, records, OT, dy, dOT, **ctx.options)
        return (dx, dS.to(ctx.dtypes[0]), *(g.to(t) for g, t in zip(dO0, ctx.dtypes[1:])),
                None, None, None, None)


def supports(inputs: Mapping[str, Any]) -> str | None:
    """None if the fused kernel can run on a call's arguments (``inputs``, by the reference's
    parameter names: ``dispatch.kernel_inputs``), otherwise the reason (with what would avoid it)."""
    reason = (option_reasons(inputs, {"input_map": INPUT_MAPS, "grad_mode": GRAD_MODES})
              or rank_reasons(inputs, ("x",), "[T, B, H, D]"))
    if reason is not None:
        return reason
    x, W_y = inputs["x"], inputs["W_y"]
    if x.shape[0] == 0:
        return EMPTY_SEQUENCE
    H, D = x.shape[2], x.shape[3]
    if not MIN_HEAD_DIM <= D <= MAX_HEAD_DIM:
        return (f"head dim {D} is larger than the {MAX_HEAD_DIM} the SRWM kernel supports "
                f"(use a head_dim of at most {MAX_HEAD_DIM})")
    if W_y.dim() != 3 or W_y.shape[0] != H or W_y.shape[2] != D or W_y.shape[1] < 1:
        return f"W_y has shape {tuple(W_y.shape)}; expected [{H}, Dy, {D}]"
    for name, rows in (("W_q", D), ("W_k", D), ("w_b", NUM_RATES)):
        if tuple(inputs[name].shape) != (H, rows, D):
            return f"{name} has shape {tuple(inputs[name].shape)}; expected {(H, rows, D)}"
    # Any Dy: shapes without a WARPS entry take the split path (W^y over programs).
    return tensor_reasons(inputs, ("x", "W_y", "W_q", "W_k", "w_b"))


# The keyword-only arguments ``srwm_triton`` takes beyond the reference's: a tuning knob that
# changes no result (beyond round-off); dispatch never passes it (``fwrl bench kernels`` does).
TUNING_KEYWORDS = ("split_rows",)


def srwm_triton(
    x: Tensor, W_y: Tensor, W_q: Tensor, W_k: Tensor, w_b: Tensor, offsets: Offsets, reset: Tensor,
    *, input_map: str = "softmax", grad_mode: str = "full", split_rows: int | None = None,
) -> tuple[Tensor, Offsets]:
    """Fused SRWM (paper 002 Eq. 5-8, App. A); returns (y [T, B, H, Dy] in x's dtype,
    final offsets, fp32).

    Same arguments as ``srwm_reference``. The slow sub-matrices are stacked once per
    call (S [H, R, D], small); the four offsets go to the kernels as they are, and the
    final ones come back as four tensors (no [B, H, R, D] copy either way); the kernel
    state is fp32.
    ``split_rows``: None runs the whole matrix in one program's registers where
    ``WARPS`` has its block shape and otherwise the split path of
    ``fused_recurrent_split`` (W^y over programs, ``SPLIT_ROWS`` rows each: SR-DeltaNet
    at head dims 33..64); a power of two forces the split path with that many rows per
    program.
    """
    check_srwm_args(input_map, grad_mode)
    slow = (W_y, W_q, W_k, w_b)
    rows = tuple(w.shape[1] for w in slow)
    S = aligned(torch.cat(slow, dim=1))  # [H, R, D]: small, read at resets
    O0 = tuple(aligned(o) for o in offsets)  # the kernels take the four tensors as they are
    x = aligned(x)
    fmap = KERNEL_INPUT_MAPS[input_map]
    split = _split_rows(x.shape[3], rows[0], split_rows)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (x, S, *O0)):
        y, *OT = _SRWMFunction.apply(x, S, *O0, reset, fmap, grad_mode == "full", split)
    else:  # inference (typically T = 1): no records (the split path still records q, k, beta)
        y, OT, _ = _forward(x, S, O0, reset, fmap=fmap, store=False, split_rows=split)
    return y, tuple(OT)
