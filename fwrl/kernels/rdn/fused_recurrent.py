"""Fused Triton Recurrent Delta Net (RDN) over a whole rollout.

The maths is ``fwrl.kernels.rdn.naive`` (paper 000, Eq. 15-18 with the
delta rule of paper 001 Eq. 20-25). Per (batch row, head), with the recurrent
slow matrices R_q, R_k, R_v [d, d] and r_b [d] of that head:

    s_t  = tanh(h_{t-1})
    q, k = phi(x_q + R_q s), phi(x_k + R_k s);  v = x_v + R_v s
    beta = sigmoid(x_b + r_b . s)
    r_t  = v - W_{t-1} k;   W_t = W_{t-1} + beta r k^T;   h_t = y_t = W_t q

Layout: one program per (batch, head) keeps W in registers for the whole
sequence, and the head's R_q, R_k, R_v, r_b (R is per head, so no program
needs another head's state). W's rows cannot be split over programs:
every row of W_t feeds h_t, hence q, k, v and beta of every row at t + 1. The
feed-forward parts x_q, x_k, x_v, x_b come from one GEMM outside the kernel,
and so does the gradient of R (below).

Backward without the T states: the forward records, per step in fp32, the
pre-activation of k, r_t and the logit of beta (2d + 1 floats), so the update
is undone exactly as ``W_{t-1} = W_t - beta r k^T``. s_t is not recorded when
y is fp32: it is tanh of the stored output y_{t-1} (h_0 at t = 0, zero after a
reset), bit for bit what the forward used; a bf16 or fp16 y is rounded, so
then s_t is recorded too (3d + 1). The pre-activation of q is recomputed as
x_q + R_q s_t (one matvec per step; the forward's value up to the summation
order of R_q s): q takes no part in the undo, so its rounding does not build
up. At a reset at t >= 1 the state before it is rebuilt by replaying the
recorded updates of the segment that ends at t - 1 (``common.replay_starts``;
no state is stored, no host synchronisation). With G = dL/dW_t and
dh = dy_t + (gradient from s_{t+1}):

    d q   = W_t^T dh;   G += dh q^T;   du = G k   (u = beta r)
    d beta = du . r;    dv = beta du;  d k = G^T u - W_{t-1}^T dv
    d z_q, d z_k = phi'(d q), phi'(d k); d z_v = dv; d z_b = d beta beta (1 - beta)
    d s   = R_q^T dz_q + R_k^T dz_k + R_v^T dz_v + r_b dz_b
    G_{t-1}  = keep_t (G - dv k^T);   dh_{t-1} = keep_t (1 - s^2) d s   (full; 0 for step)

The kernel writes dz_q, dz_k, dz_v, dz_b (= the gradients of x_q, x_k, x_v,
x_b); dR_q = sum over (t, b) of dz_q s^T (and likewise dR_k, dR_v, dr_b) is a
batched GEMM in PyTorch (``_recurrent_grads``): deterministic, no atomics. It
reads dz and s in place (strided ``bmm`` operands, no copies) and, where s is
not recorded, rebuilds it from y in chunks of at most S_CHUNK_BYTES.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

from fwrl.errors import unknown_choice
from fwrl.kernels import GRAD_MODES, check_grad_mode
from fwrl.kernels.feature_maps import SUM_NORM_EPS

from ..triton.common import (
    EMPTY_SEQUENCE, KERNEL_FEATURE_MAPS, _flag, _lanes, _matvec, _phi, _phi_backward, _sigmoid,
    _sum, _tanh, _tile, _vecmat, aligned, launch_options, option_reasons, padded, replay_starts,
    tensor_reasons,
)

# Largest head dim the kernels run without spilling registers on sm_90, and
# the warps (forward, backward) per padded head dim that achieve it (checked by
# tests/interpreter/test_kernels_rdn.py). The head dim is a compile-time constant: with a
# known row stride the loads vectorise and Triton picks a layout that keeps
# each per-row vector in a few registers (at d = 64 with a run-time stride the
# same kernels spilled up to 224 bytes).
MAX_HEAD_DIM = 64
WARPS = {16: (1, 2), 32: (4, 8), 64: (8, 16)}


@triton.jit
def _load_r(RQ, RK, RV, RB, hd, od, md, wm, w_loc, D):
    base = hd * D * D
    Rq = tl.load(RQ + base + w_loc, mask=wm, other=0.0).to(tl.float32)
    Rk = tl.load(RK + base + w_loc, mask=wm, other=0.0).to(tl.float32)
    Rv = tl.load(RV + base + w_loc, mask=wm, other=0.0).to(tl.float32)
    rb = tl.load(RB + hd * D + od, mask=md, other=0.0).to(tl.float32)
    return Rq, Rk, Rv, rb


@triton.jit
def _forward_kernel(
    XQ, XK, XV, XB, RQ, RK, RV, RB, W0, H0, RESET,  # inputs
    Y, WT, HT, REC,  # outputs (REC only with STORE)
    T, B, H, D: tl.constexpr,
    BD: tl.constexpr, FMAP: tl.constexpr, STORE: tl.constexpr, KEEP_S: tl.constexpr,
    EPS: tl.constexpr,
):
    i_bh = tl.program_id(0).to(tl.int64)
    b = i_bh // H
    hd = i_bh % H
    od, md = _lanes(0, BD, D)
    wm, w_loc = _tile(od, md, od, md, D)
    Rq, Rk, Rv, rb = _load_r(RQ, RK, RV, RB, hd, od, md, wm, w_loc, D)
    W = tl.load(W0 + i_bh * D * D + w_loc, mask=wm, other=0.0).to(tl.float32)
    h = tl.load(H0 + i_bh * D + od, mask=md, other=0.0).to(tl.float32)
    for t in range(T):
        row = t * B * H + i_bh
        reset = tl.load(RESET + t * B + b) != 0
        W = tl.where(reset, 0.0, W)
        h = tl.where(reset, 0.0, h)
        s = _tanh(h)
        # Write first (k, v, beta), then read (q): each record is stored as soon
        # as it is known, which keeps fewer vectors alive at d = 64.
        zk = tl.load(XK + row * D + od, mask=md, other=0.0).to(tl.float32) + _matvec(Rk, s)
        k = _phi(zk, md, FMAP, EPS)
        v = tl.load(XV + row * D + od, mask=md, other=0.0).to(tl.float32) + _matvec(Rv, s)
        zb = tl.load(XB + row).to(tl.float32) + _sum(rb * s, 0)
        r = tl.where(md, v - _matvec(W, k), 0.0)
        if STORE:
            rec = REC + row * (2 * D + 1 + KEEP_S * D)
            tl.store(rec + od, zk, mask=md)
            tl.store(rec + D + od, r, mask=md)
            tl.store(rec + 2 * D, zb)
            if KEEP_S:
                tl.store(rec + 2 * D + 1 + od, s, mask=md)
        W = W + (_sigmoid(zb) * r)[:, None] * k[None, :]
        zq = tl.load(XQ + row * D + od, mask=md, other=0.0).to(tl.float32) + _matvec(Rq, s)
        h = _matvec(W, _phi(zq, md, FMAP, EPS))
        tl.store(Y + row * D + od, h.to(Y.dtype.element_ty), mask=md)
    tl.store(WT + i_bh * D * D + w_loc, W, mask=wm)
    tl.store(HT + i_bh * D + od, h, mask=md)


@triton.jit
def _recorded_update(REC, row, od, md, D, KEEP_S: tl.constexpr, FMAP: tl.constexpr,
                     EPS: tl.constexpr):
    """(u = beta r, k) of one step from its fp32 record, as the forward computed them."""
    rec = REC + row * (2 * D + 1 + KEEP_S * D)
    k = _phi(tl.load(rec + od, mask=md, other=0.0), md, FMAP, EPS)
    u = _sigmoid(tl.load(rec + 2 * D)) * tl.load(rec + D + od, mask=md, other=0.0)
    return u, k


@triton.jit
def _backward_kernel(
    XQ, RQ, RK, RV, RB, W0, H0, RESET, START, REC, WT, Y,  # forward inputs, records, output
    DY, DWT, DHT,  # incoming gradients
    DXQ, DXK, DXV, DXB, DW0, DH0, REBUILT,  # outputs
    T, B, H, D: tl.constexpr,
    BD: tl.constexpr, FMAP: tl.constexpr, FULL: tl.constexpr, WRITE_REBUILT: tl.constexpr,
    KEEP_S: tl.constexpr, EPS: tl.constexpr,
):
    i_bh = tl.program_id(0).to(tl.int64)
    b = i_bh // H
    hd = i_bh % H
    od, md = _lanes(0, BD, D)
    wm, w_loc = _tile(od, md, od, md, D)
    Rq, Rk, Rv, rb = _load_r(RQ, RK, RV, RB, hd, od, md, wm, w_loc, D)
    W = tl.load(WT + i_bh * D * D + w_loc, mask=wm, other=0.0)
    G = tl.load(DWT + i_bh * D * D + w_loc, mask=wm, other=0.0).to(tl.float32)
    dh = tl.load(DHT + i_bh * D + od, mask=md, other=0.0).to(tl.float32)
    for i in range(T):
        t = T - 1 - i
        row = t * B * H + i_bh
        reset = tl.load(RESET + t * B + b) != 0
        rec = REC + row * (2 * D + 1 + KEEP_S * D)
        zk = tl.load(rec + od, mask=md, other=0.0)
        r = tl.load(rec + D + od, mask=md, other=0.0)
        beta = _sigmoid(tl.load(rec + 2 * D))
        if KEEP_S:
            s = tl.load(rec + 2 * D + 1 + od, mask=md, other=0.0)
        else:
            # s_t = tanh(h_{t-1}) as the forward computed it: h_0 at t = 0, else the
            # stored fp32 output y_{t-1}; zero after a reset.
            h = tl.load(Y + (row - B * H) * D + od, mask=_flag(md, t > 0), other=0.0)
            h = h.to(tl.float32) + tl.load(H0 + i_bh * D + od, mask=_flag(md, t == 0),
                                           other=0.0).to(tl.float32)
            s = _tanh(tl.where(reset, 0.0, h))
        zq = tl.load(XQ + row * D + od, mask=md, other=0.0).to(tl.float32) + _matvec(Rq, s)
        q = _phi(zq, md, FMAP, EPS)
        k = _phi(zk, md, FMAP, EPS)
        dh += tl.load(DY + row * D + od, mask=md, other=0.0).to(tl.float32)
        dq = _vecmat(W, dh)
        G = G + dh[:, None] * q[None, :]
        u = beta * r
        # Undo the update: the state this step started from (after its reset).
        A = tl.where(reset, 0.0, W - u[:, None] * k[None, :])
        du = _matvec(G, k)
        dv = beta * du
        dk = _vecmat(G, u) - _vecmat(A, dv)
        dzq = _phi_backward(zq, dq, md, FMAP, EPS)
        dzk = _phi_backward(zk, dk, md, FMAP, EPS)
        dzb = _sum(du * r, 0) * beta * (1.0 - beta)
        tl.store(DXQ + row * D + od, dzq.to(DXQ.dtype.element_ty), mask=md)
        tl.store(DXK + row * D + od, dzk.to(DXK.dtype.element_ty), mask=md)
        tl.store(DXV + row * D + od, dv.to(DXV.dtype.element_ty), mask=md)
        tl.store(DXB + row, dzb.to(DXB.dtype.element_ty))
        if FULL:
            ds = _vecmat(Rq, dzq) + _vecmat(Rk, dzk) + _vecmat(Rv, dv) + rb * dzb
            dh = tl.where(reset, 0.0, ds * (1.0 - s * s))
            G = tl.where(reset, 0.0, G - dv[:, None] * k[None, :])
        else:
            dh = tl.full([BD], 0.0, tl.float32)
            G = tl.full([BD, BD], 0.0, tl.float32)
        # The state before this step. After a reset at t >= 1: replay the
        # segment that ends at t - 1 from its start (W0, or 0 after a reset).
        start = tl.load(START + t * B + b)
        if start >= 0:
            W = tl.load(W0 + i_bh * D * D + w_loc, mask=_flag(wm, start == 0), other=0.0)
            W = W.to(tl.float32)
            for j in range(start, t):
                W = tl.where(tl.load(RESET + j * B + b) != 0, 0.0, W)
                uj, kj = _recorded_update(REC, j * B * H + i_bh, od, md, D, KEEP_S, FMAP,
                                          EPS)
                W = W + uj[:, None] * kj[None, :]
        else:
            W = A
    tl.store(DW0 + i_bh * D * D + w_loc, G, mask=wm)
    tl.store(DH0 + i_bh * D + od, dh, mask=md)
    if WRITE_REBUILT:
        tl.store(REBUILT + i_bh * D * D + w_loc, W, mask=wm)


def _block_sizes(d: int) -> tuple[int, int, int]:
    """(BD, forward warps, backward warps) for head dim d (WARPS)."""
    bd = padded(d)
    return (bd, *WARPS[bd])


# Largest fp32 s chunk (bytes) ``_s_chunks`` rebuilds from y at a time for the dR GEMM.
S_CHUNK_BYTES = 8 * 2**20


def _keeps_s(y: Tensor) -> bool:
    """Whether the records hold s_t: only where y is rounded (not fp32), so tanh(y_{t-1})
    would not be the s_t the forward used."""
    return y.dtype != torch.float32


def _forward(xq, xk, xv, xb, Rq, Rk, Rv, rb, W0, h0, reset, *, fmap: int, store: bool):
    T, B, H, D = xq.shape
    bd, warps, _ = _block_sizes(D)
    dev = xq.device
    y = torch.empty(T, B, H, D, device=dev, dtype=xv.dtype)
    WT = torch.empty(B, H, D, D, device=dev, dtype=torch.float32)
    hT = torch.empty(B, H, D, device=dev, dtype=torch.float32)
    reset8 = aligned(reset.to(device=dev, dtype=torch.int8))
    keep_s = _keeps_s(y)
    # Per step: zk, r, zb (and s where y is rounded); see the module docstring.
    floats = 2 * D + 1 + (D if keep_s else 0)
    rec = torch.empty(T, B, H, floats, device=dev, dtype=torch.float32) if store else WT
    _forward_kernel[(B * H,)](
        xq, xk, xv, xb, Rq, Rk, Rv, rb, W0, h0, reset8,
        y, WT, hT, rec, T, B, H, D,
        BD=bd, FMAP=fmap, STORE=store, KEEP_S=keep_s, EPS=SUM_NORM_EPS,
        **launch_options(warps),
    )
    starts = replay_starts(reset8) if store else reset8
    return y, WT, hT, (reset8, starts, rec)


def _backward(xq, xk, xv, xb, Rq, Rk, Rv, rb, W0, h0, records, WT, y, dy, dWT, dhT, *,
              fmap: int, full: bool, rebuild: bool = False):
    reset8, starts, rec = records
    T, B, H, D = xq.shape
    bd, _, warps = _block_sizes(D)
    keep_s = _keeps_s(y)
    # fp32 pre-activation gradients: the dR GEMM below reads them unrounded.
    dxq, dxk, dxv, dxb = (torch.empty_like(x, dtype=torch.float32) for x in (xq, xk, xv, xb))
    dW0 = torch.empty(B, H, D, D, device=xq.device, dtype=torch.float32)
    dh0 = torch.empty(B, H, D, device=xq.device, dtype=torch.float32)
    rebuilt = torch.empty_like(dW0) if rebuild else dW0
    _backward_kernel[(B * H,)](
        xq, Rq, Rk, Rv, rb, W0, h0, reset8, starts, rec, WT, y, aligned(dy), aligned(dWT),
        aligned(dhT), dxq, dxk, dxv, dxb, dW0, dh0, rebuilt, T, B, H, D,
        BD=bd, FMAP=fmap, FULL=full, WRITE_REBUILT=rebuild, KEEP_S=keep_s,
        EPS=SUM_NORM_EPS, **launch_options(warps),
    )
    dRq, dRk, dRv, drb = _recurrent_grads(dxq, dxk, dxv, dxb,
                                          _s_chunks(rec, y, h0, reset8, keep_s))
    grads = (dxq.to(xq.dtype), dxk.to(xk.dtype), dxv.to(xv.dtype), dxb.to(xb.dtype),
             dRq.to(Rq.dtype), dRk.to(Rk.dtype), dRv.to(Rv.dtype), drb.to(rb.dtype), dW0, dh0)
    return grads + (rebuilt,) if rebuild else grads


def _s_chunks(rec: Tensor, y: Tensor, h0: Tensor, reset8: Tensor,
              keep_s: bool) -> Iterator[tuple[int, Tensor]]:
    """(t0, s[t0:t1]) in order over the sequence: s_t = tanh(h_{t-1}) in fp32, [t1 - t0, B, H, d].

    Recorded: one view of the records. Otherwise rebuilt from the fp32 output y
    (h_0 at t = 0, zero after a reset), at most S_CHUNK_BYTES at a time, so the
    GEMM never holds a [T, B, H, d] copy.
    """
    T, B, H, D = y.shape
    if keep_s:
        yield 0, rec[..., 2 * D + 1:]
        return
    steps = max(1, min(T, S_CHUNK_BYTES // (B * H * D * 4)))
    for t0 in range(0, T, steps):
        t1 = min(T, t0 + steps)
        if t0 == 0:
            s = torch.empty(t1, B, H, D, device=y.device, dtype=torch.float32)
            s[0] = h0
            s[1:] = y[: t1 - 1]
            s.tanh_()
        else:
            s = torch.tanh(y[t0 - 1 : t1 - 1])
        yield t0, s.masked_fill_(reset8[t0:t1, :, None, None] != 0, 0.0)
        del s  # before the next chunk exists: one chunk alive at a time


def _recurrent_grads(dxq: Tensor, dxk: Tensor, dxv: Tensor, dxb: Tensor,
                     chunks: Iterable[tuple[int, Tensor]]) -> tuple[Tensor, ...]:
    """(dR_q, dR_k, dR_v, dr_b) = sums over (t, b) of dz s^T, in fp32, summed over the
    chunks of s in order (deterministic).

    Each chunk is one batched GEMM per matrix over the heads, on strided views of
    dz ([H, d, n B]) and s ([H, n B, d]): both are layouts cuBLAS reads in place
    (one unit stride and a leading stride of at least d), so nothing is copied
    (``einsum`` copied both operands: 101 MiB at (256, 101, 8, 64)).
    """
    T, B, H, D = dxq.shape
    dR = torch.zeros(3, H, D, D, device=dxq.device, dtype=torch.float32)
    drb = torch.zeros(H, 1, D, device=dxq.device, dtype=torch.float32)
    for t0, s in chunks:
        n = s.shape[0]
        s_heads = s.reshape(n * B, H, D).transpose(0, 1)  # a view: s is [n, B, H, >= d]
        for i, dz in enumerate((dxq, dxk, dxv)):
            dR[i].baddbmm_(dz[t0 : t0 + n].view(n * B, H, D).permute(1, 2, 0), s_heads)
        drb.baddbmm_(dxb[t0 : t0 + n].view(n * B, H).t().unsqueeze(1), s_heads)
        del s, s_heads  # before the next chunk exists
    return dR[0], dR[1], dR[2], drb.squeeze(1)


class _RDNFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, xq, xk, xv, xb, Rq, Rk, Rv, rb, W0, h0, reset, fmap, full):
        y, WT, hT, records = _forward(xq, xk, xv, xb, Rq, Rk, Rv, rb, W0, h0, reset,
                                      fmap=fmap, store=True)
        # y is an output (saving it costs no memory): the backward rebuilds s_t from it.
        ctx.save_for_backward(xq, xk, xv, xb, Rq, Rk, Rv, rb, W0, h0, WT, y, *records)
        ctx.options = dict(fmap=fmap, full=full)
        ctx.state_dtypes = (W0.dtype, h0.dtype)
        return y, WT, hT

    @staticmethod
    def backward(ctx, dy, dWT, dhT):
        xq, xk, xv, xb, Rq, Rk, Rv, rb, W0, h0, WT, y, *records = ctx.saved_tensors
        *grads, dW0, dh0 = _backward(xq, xk, xv, xb, Rq, Rk, Rv, rb, W0, h0, records, WT, y, dy,
                                     dWT, dhT, **ctx.options)
        return (*grads, dW0.to(ctx.state_dtypes[0]), dh0.to(ctx.state_dtypes[1]),
                None, None, None)


def supports(inputs: Mapping[str, Any]) -> str | None:
    """None if the fused kernel can run on a call's arguments (``inputs``, by the reference's
    parameter names: ``dispatch.kernel_inputs``), otherwise the reason (with what would avoid it)."""
    if inputs["feature_map"] not in KERNEL_FEATURE_MAPS:
        return (f"feature map {inputs['feature_map']!r} is not one the RDN kernel computes "
                f"(use feature_map {', '.join(KERNEL_FEATURE_MAPS)})")
    if (reason := option_reasons(inputs, {"grad_mode": GRAD_MODES})) is not None:
        return reason
    xq, xk, xv, xb = inputs["xq"], inputs["xk"], inputs["xv"], inputs["xb"]
    if xq.dim() != 4 or xq.shape != xk.shape or xq.shape != xv.shape or xb.shape != xq.shape[:3]:
        return (f"shapes xq {tuple(xq.shape)}, xk {tuple(xk.shape)}, xv {tuple(xv.shape)}, "
                f"xb {tuple(xb.shape)} do not match [T, B, H, d] / [T, B, H]")
    if xq.shape[0] == 0:
        return EMPTY_SEQUENCE
    d = xq.shape[-1]
    if not 1 <= d <= MAX_HEAD_DIM:
        return (f"head dim {d} is larger than the {MAX_HEAD_DIM} the RDN kernel supports "
                f"(use a head_dim of at most {MAX_HEAD_DIM})")
    return tensor_reasons(inputs, ("xq", "xk", "xv", "xb", "Rq", "W0"))


def rdn_triton(
    xq: Tensor, xk: Tensor, xv: Tensor, xb: Tensor, Rq: Tensor, Rk: Tensor, Rv: Tensor, rb: Tensor,
    W0: Tensor, h0: Tensor, reset: Tensor, *, feature_map: str = "softmax",
    grad_mode: str = "full",
) -> tuple[Tensor, Tensor, Tensor]:
    """Fused RDN (paper 000 Eq. 15-18); returns (y [T, B, H, d] in xv's dtype, W_T, h_T
    in fp32).

    Same arguments as ``rdn_reference``; the state is always fp32.
    """
    if feature_map not in KERNEL_FEATURE_MAPS:
        raise unknown_choice("feature map for the Triton RDN kernel", feature_map,
                             KERNEL_FEATURE_MAPS)
    check_grad_mode(grad_mode)
    args = [aligned(x) for x in (xq, xk, xv, xb, Rq, Rk, Rv, rb, W0, h0)]
    fmap = KERNEL_FEATURE_MAPS[feature_map]
    if torch.is_grad_enabled() and any(x.requires_grad for x in args):
        return _RDNFunction.apply(*args, reset, fmap, grad_mode == "full")
    y, WT, hT, _ = _forward(*args, reset, fmap=fmap, store=False)
    return y, WT, hT
