"""Fused Triton gated delta rule over a whole rollout (one launch per layer, forward and backward).

The maths is ``fwrl.kernels.gated_delta_rule.naive`` (Gated DeltaNet, Yang et al. 2025, Eq. 10, read
after the write), with ``d_t = alpha_t = exp(g_t)`` (0 on the rows that start an episode at t):

    A_t = d_t S_{t-1},   r_t = v_t - A_t phi(k_t),   S_t = A_t + sigma(beta_t) r_t phi(k_t)^T,
    y_t = S_t phi(q_t)

Layout as the delta rule's kernel (``fwrl.kernels.delta_rule.fused_recurrent``): one program per
(batch, head, block of BV rows of S), the rows carried in registers in fp32 for the whole sequence,
the feature maps (``l2norm``, ``elu1_sumnorm``, ``softmax``, ``identity``), the sigmoid and the exp
computed in the kernel; ``split`` programs per (batch, head) as there.

Backward without storing the T states. The forward writes the fp32 record ``r_t`` per step (so
``u_t = sigma(beta_t) r_t`` is recomputed bit for bit and the write is undone exactly as a subtraction,
``A_t = S_t - u_t phi(k_t)^T``) and, every ``ANCHOR_EVERY`` steps, the state itself (an anchor: the
state before the first step of each chunk but the first, whose is S_0). Undoing the decay,
``S_{t-1} = A_t / alpha_t``, multiplies the round-off of S_t by 1 / alpha_t: the backward divides while
the decays it has undone since the last exact state sum to at most ``DECAY_BUDGET`` in log space (so
the round-off grows by at most e^DECAY_BUDGET), and otherwise, and at every episode start (where
S_{t-1} is not in S_t at all), rebuilds S_{t-1} by replaying the recorded writes from its chunk's
anchor (at most ANCHOR_EVERY - 1 steps). A chunk's reversal starts from an exact state (S_T, or the
next chunk's anchor), so a gate that decays to nothing costs replays but never accuracy. Memory kept
for backward: the T x Dv records and ceil(T / ANCHOR_EVERY) - 1 states per (batch, head), sized by the
shapes alone: no host synchronisation, and a call can be captured in a CUDA graph.

Gradients, with ``G_t = dS_t + dy_t phi(q_t)^T``, ``b_t = sigma(beta_t)`` and ``w_t = b_t du_t``:

    d phi(q_t) = S_t^T dy_t
    du_t       = G_t phi(k_t)
    dv_t       = w_t
    d beta_t   = (du_t . r_t) b_t (1 - b_t)
    d phi(k_t) = G_t^T u_t - A_t^T w_t
    dA_t       = G_t - w_t phi(k_t)^T
    dg_t       = <dA_t, A_t>                      (= alpha_t <dA_t, S_{t-1}>: no division)
    dS_{t-1}   = d_t dA_t                          (grad_mode full; 0 for step)

Partial sums over row blocks (d phi(q), d phi(k), d beta, dg) are written separately and added
afterwards in a fixed order: no atomics, bitwise-deterministic results.
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
from fwrl.kernels.feature_maps import L2_NORM_EPS, SUM_NORM_EPS, feature_dim

from ..triton.common import (
    EMPTY_SEQUENCE, KERNEL_FEATURE_MAPS, _l2norm, _l2norm_backward, _lanes, _matvec, _phi,
    _phi_backward, _sigmoid, _sum, _tile, _vecmat, aligned, launch_options, option_reasons, padded,
    rank_reasons, tensor_reasons, warps_for,
)

# Feature maps of q and k computed in the kernel, and their codes (3: l2norm, this kernel's own).
FEATURE_MAPS = ("l2norm", "elu1_sumnorm", "softmax", "identity")
FMAP_CODES = {**KERNEL_FEATURE_MAPS, "l2norm": 3}
MAX_HEAD_DIM = 128
# Largest S block one program keeps in registers (elements), and the programs per (batch, head)
# ``split`` may ask for (as the delta rule's kernel).
MAX_BLOCK_ELEMENTS = 4096
SPLITS = (1, 2, 4, 8)
MIN_AUTO_ROWS = 16
# Steps per chunk: the forward stores the state before each chunk but the first (an anchor); the
# backward replays from it at most ANCHOR_EVERY - 1 steps. The log-decay the backward may undo by
# division before it replays instead (round-off grows by at most e^DECAY_BUDGET between exact states).
ANCHOR_EVERY = 16
DECAY_BUDGET = 4.0
# Registers per thread of both kernels at head dims of at least CAPPED_FROM_DIM (``launch_options``): the
# delta rule kernel's cap, which its A/B on H100 and H200 found 1.44x faster at (256, 101, 8, 64) (twice
# the programs per SM; ``fwrl.kernels.delta_rule.fused_recurrent``). Taken by analogy, not yet timed
# for this kernel (``fwrl bench kernels --core gated_delta_rule --maxnreg 255 128`` on a GPU): under it
# the d = 64 backward keeps 8 bytes of stack on sm_90, every other build none; uncapped, none spills.
MAXNREG = 128
CAPPED_FROM_DIM = 64


def register_cap_for(dk: int, dv: int) -> int | None:
    """The register cap of a launch at head dims (dk, dv): ``MAXNREG`` from ``CAPPED_FROM_DIM`` on,
    else none."""
    return MAXNREG if max(dk, dv) >= CAPPED_FROM_DIM else None


@triton.jit
def _map(x, mask, FMAP: tl.constexpr, EPS: tl.constexpr):
    """phi of one row: l2norm (3) or a map of ``common._phi`` (0 identity, 1 elu1_sumnorm, 2 softmax)."""
    if FMAP == 3:
        out = _l2norm(x, mask, EPS)
    else:
        out = _phi(x, mask, FMAP, EPS)
    return out


@triton.jit
def _map_backward(x, dphi, mask, FMAP: tl.constexpr, EPS: tl.constexpr):
    if FMAP == 3:
        out = _l2norm_backward(x, dphi, mask, EPS)
    else:
        out = _phi_backward(x, dphi, mask, FMAP, EPS)
    return out


@triton.jit
def _forward_kernel(
    Q, K, V, BETA, G, S0, RESET,  # inputs
    Y, ST, REC, ANCH,  # outputs (REC and ANCH only with STORE)
    T, B, H, DK, DV, CHUNK,
    BK: tl.constexpr, BV: tl.constexpr, FMAP: tl.constexpr, STORE: tl.constexpr, EPS: tl.constexpr,
):
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    b = i_bh // H
    BH = B * H
    ok, mk = _lanes(0, BK, DK)
    ov, mv = _lanes(i_v * BV, BV, DV)
    wm, w_loc = _tile(ov, mv, ok, mk, DK)
    S = tl.load(S0 + i_bh * DV * DK + w_loc, mask=wm, other=0.0).to(tl.float32)
    for t in range(T):
        row = t * BH + i_bh  # index of (t, b, h)
        if STORE:
            if (t > 0) & (t % CHUNK == 0):  # the anchor of the chunk that starts at t
                tl.store(ANCH + ((t // CHUNK - 1) * BH + i_bh) * DV * DK + w_loc, S, mask=wm)
        reset = tl.load(RESET + t * B + b) != 0
        decay = tl.where(reset, 0.0, tl.exp(tl.load(G + row).to(tl.float32)))
        S = S * decay
        k = _map(tl.load(K + row * DK + ok, mask=mk, other=0.0).to(tl.float32), mk, FMAP, EPS)
        q = _map(tl.load(Q + row * DK + ok, mask=mk, other=0.0).to(tl.float32), mk, FMAP, EPS)
        v = tl.load(V + row * DV + ov, mask=mv, other=0.0).to(tl.float32)
        r = v - _matvec(S, k)
        if STORE:
            tl.store(REC + row * DV + ov, r, mask=mv)
        u = _sigmoid(tl.load(BETA + row).to(tl.float32)) * r
        S = S + u[:, None] * k[None, :]
        tl.store(Y + row * DV + ov, _matvec(S, q).to(Y.dtype.element_ty), mask=mv)
    tl.store(ST + i_bh * DV * DK + w_loc, S, mask=wm)


@triton.jit
def _backward_kernel(
    Q, K, V, BETA, G, S0, RESET, REC, ANCH, ST,  # forward inputs and records
    DY, DST,  # incoming gradients
    DQ, DK_, DV_, DBETA, DG, DS0, REBUILT,  # outputs
    T, B, H, DK, DV, CHUNK, BUDGET,
    BK: tl.constexpr, BV: tl.constexpr, FMAP: tl.constexpr, FULL: tl.constexpr,
    FUSE_FMAP: tl.constexpr, WRITE_REBUILT: tl.constexpr, EPS: tl.constexpr,
):
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    b = i_bh // H
    BH = B * H
    TBH = T * BH
    ok, mk = _lanes(0, BK, DK)
    ov, mv = _lanes(i_v * BV, BV, DV)
    wm, w_loc = _tile(ov, mv, ok, mk, DK)
    S = tl.load(ST + i_bh * DV * DK + w_loc, mask=wm, other=0.0)
    dS = tl.load(DST + i_bh * DV * DK + w_loc, mask=wm, other=0.0).to(tl.float32)
    undone = tl.full([], 0.0, tl.float32)  # the log-decay undone by division since the last exact state
    for i in range(T):
        t = T - 1 - i
        row = t * BH + i_bh
        reset = tl.load(RESET + t * B + b) != 0
        g = tl.load(G + row).to(tl.float32)
        alpha = tl.exp(g)
        decay = tl.where(reset, 0.0, alpha)
        xk = tl.load(K + row * DK + ok, mask=mk, other=0.0).to(tl.float32)
        xq = tl.load(Q + row * DK + ok, mask=mk, other=0.0).to(tl.float32)
        k = _map(xk, mk, FMAP, EPS)
        q = _map(xq, mk, FMAP, EPS)
        dy = tl.load(DY + row * DV + ov, mask=mv, other=0.0).to(tl.float32)
        beta = _sigmoid(tl.load(BETA + row).to(tl.float32))
        r = tl.load(REC + row * DV + ov, mask=mv, other=0.0)
        u = beta * r
        Gt = dS + dy[:, None] * q[None, :]
        dq = _vecmat(S, dy)
        A = S - u[:, None] * k[None, :]  # the decayed state this step wrote to
        du = _matvec(Gt, k)
        w = beta * du
        dk = _vecmat(Gt, u) - _vecmat(A, w)
        dA = Gt - w[:, None] * k[None, :]
        tl.store(DBETA + i_v * TBH + row, _sum(du * r, 0) * beta * (1.0 - beta))
        tl.store(DG + i_v * TBH + row, _sum(_sum(dA * A, 1), 0))
        tl.store(DV_ + row * DV + ov, w.to(DV_.dtype.element_ty), mask=mv)
        if FUSE_FMAP:
            dq = _map_backward(xq, dq, mk, FMAP, EPS)
            dk = _map_backward(xk, dk, mk, FMAP, EPS)
        tl.store(DQ + (i_v * TBH + row) * DK + ok, dq.to(DQ.dtype.element_ty), mask=mk)
        tl.store(DK_ + (i_v * TBH + row) * DK + ok, dk.to(DK_.dtype.element_ty), mask=mk)
        if FULL:
            dS = dA * decay
        else:
            dS = tl.full([BV, BK], 0.0, tl.float32)
        # The state before this step, S_{t-1}.
        start = t - t % CHUNK  # the first step of this step's chunk
        if t == 0:
            if WRITE_REBUILT:  # the reversal tests: S_0 by undoing the decay of step 0
                S = A / alpha
        elif t == start:  # the anchor: exact
            S = tl.load(ANCH + ((t // CHUNK - 1) * BH + i_bh) * DV * DK + w_loc, mask=wm, other=0.0)
            undone = tl.full([], 0.0, tl.float32)
        elif reset | (undone - g > BUDGET):  # replay the chunk's recorded steps start .. t - 1
            if start == 0:
                S = tl.load(S0 + i_bh * DV * DK + w_loc, mask=wm, other=0.0).to(tl.float32)
            else:
                S = tl.load(ANCH + ((start // CHUNK - 1) * BH + i_bh) * DV * DK + w_loc, mask=wm, other=0.0)
            for j in range(start, t):
                rj = j * BH + i_bh
                dj = tl.where(tl.load(RESET + j * B + b) != 0, 0.0, tl.exp(tl.load(G + rj).to(tl.float32)))
                kj = _map(tl.load(K + rj * DK + ok, mask=mk, other=0.0).to(tl.float32), mk, FMAP, EPS)
                uj = _sigmoid(tl.load(BETA + rj).to(tl.float32)) * tl.load(REC + rj * DV + ov, mask=mv, other=0.0)
                S = S * dj
                S = S + uj[:, None] * kj[None, :]
            undone = tl.full([], 0.0, tl.float32)
        else:  # undo the decay: the round-off grows by 1 / alpha
            S = A / alpha
            undone = undone - g
    tl.store(DS0 + i_bh * DV * DK + w_loc, dS.to(DS0.dtype.element_ty), mask=wm)
    if WRITE_REBUILT:
        tl.store(REBUILT + i_bh * DV * DK + w_loc, S, mask=wm)


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
    dx = _map_backward(x, dphi, md, FMAP, EPS)
    tl.store(DX + row * D + od, dx.to(DX.dtype.element_ty), mask=md)


def _eps(fmap: int) -> float:
    """The epsilon of a map code: l2norm's, or sum normalisation's (the others read none)."""
    return L2_NORM_EPS if fmap == FMAP_CODES["l2norm"] else SUM_NORM_EPS


def _block_sizes(dk: int, dv: int, split: int = 1) -> tuple[int, int, int, int]:
    """(BK, BV, forward warps, backward warps): all of a key row, BV rows of S per program, at most
    MAX_BLOCK_ELEMENTS / BK of them (the delta rule's kernel's sizes)."""
    bk = padded(dk)
    bv = min(max(1, triton.next_power_of_2(triton.cdiv(dv, split))), MAX_BLOCK_ELEMENTS // bk)
    return bk, bv, warps_for(bk * bv, 512, high=4), warps_for(bk * bv, 512)


def choose_split(split: int | str, batch_heads: int, dv: int, device: torch.device) -> int:
    """Programs per (batch, head) for ``split`` (1, 2, 4, 8 or "auto": the fewest that give at least
    one program per SM, each keeping at least MIN_AUTO_ROWS rows of S; 1 off CUDA)."""
    if split != "auto":
        if split not in SPLITS:
            raise unknown_choice("gated delta-rule split", split, (*SPLITS, "auto"))
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


def _anchors(T: int, anchor_every: int) -> int:
    """States the forward stores per (batch, head): one per chunk but the first."""
    return max(0, triton.cdiv(T, anchor_every) - 1)


def _forward(q, k, v, beta, g, S0, reset, *, fmap, store, split=1, anchor_every=None):
    T, B, H, DK = q.shape
    DV = v.shape[-1]
    anchor_every = ANCHOR_EVERY if anchor_every is None else anchor_every
    bk, bv, num_warps, _ = _block_sizes(DK, DV, split)
    y = torch.empty(T, B, H, DV, device=q.device, dtype=v.dtype)
    ST = torch.empty(B, H, DV, DK, device=q.device, dtype=torch.float32)
    reset8 = aligned(reset.to(device=q.device, dtype=torch.int8))
    n_anchors = _anchors(T, anchor_every) if store else 0
    rec = torch.empty(T, B, H, DV, device=q.device, dtype=torch.float32) if store else ST  # ST: not written
    anchors = (torch.empty(n_anchors, B, H, DV, DK, device=q.device, dtype=torch.float32) if n_anchors
               else ST)  # not written
    _forward_kernel[(triton.cdiv(DV, bv), B * H)](
        q, k, v, beta, g, S0, reset8,
        y, ST, rec, anchors,
        T, B, H, DK, DV, anchor_every,
        BK=bk, BV=bv, FMAP=fmap, STORE=store, EPS=_eps(fmap),
        **launch_options(num_warps, register_cap_for(DK, DV)),
    )
    return y, ST, (reset8, rec, anchors, anchor_every)


def _backward(q, k, v, beta, g, S0, records, ST, dy, dST, *, fmap, full, split=1, rebuild=False,
              budget=None):
    reset8, rec, anchors, anchor_every = records
    T, B, H, DK = q.shape
    DV = v.shape[-1]
    budget = DECAY_BUDGET if budget is None else budget
    bk, bv, _, num_warps = _block_sizes(DK, DV, split)
    nv = triton.cdiv(DV, bv)
    fuse = nv == 1
    if fuse:
        dq, dk = torch.empty_like(q), torch.empty_like(k)
    else:
        dq = torch.empty(nv, T, B, H, DK, device=q.device, dtype=torch.float32)
        dk = torch.empty_like(dq)
    dv = torch.empty_like(v)
    dbeta = torch.empty(nv, T, B, H, device=q.device, dtype=torch.float32)
    dg = torch.empty_like(dbeta)
    dS0 = torch.empty(B, H, DV, DK, device=q.device, dtype=torch.float32)
    rebuilt = torch.empty_like(dS0) if rebuild else dS0
    _backward_kernel[(nv, B * H)](
        q, k, v, beta, g, S0, reset8, rec, anchors, ST,
        aligned(dy), aligned(dST),
        dq, dk, dv, dbeta, dg, dS0, rebuilt,
        T, B, H, DK, DV, anchor_every, float(budget),
        BK=bk, BV=bv, FMAP=fmap, FULL=full, FUSE_FMAP=fuse, WRITE_REBUILT=rebuild, EPS=_eps(fmap),
        **launch_options(num_warps, register_cap_for(DK, DV)),
    )
    if not fuse:
        dq = _feature_map_backward(q, dq, fmap)
        dk = _feature_map_backward(k, dk, fmap)
    dbeta = (dbeta[0] if nv == 1 else dbeta.sum(0)).to(beta.dtype)
    dg = (dg[0] if nv == 1 else dg.sum(0)).to(g.dtype)
    grads = (dq, dk, dv, dbeta, dg, dS0.to(S0.dtype))
    return grads + (rebuilt,) if rebuild else grads


def _feature_map_backward(x: Tensor, dphi_parts: Tensor, fmap: int) -> Tensor:
    nv, T, B, H, D = dphi_parts.shape
    dx = torch.empty_like(x)
    n = T * B * H
    _feature_map_backward_kernel[(n,)](
        x, dphi_parts, dx, n, nv, D,
        BD=padded(D), FMAP=fmap, EPS=_eps(fmap), **launch_options(1),
    )
    return dx


class _GatedDeltaRuleFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, beta, g, S0, reset, fmap, full, split):
        y, ST, records = _forward(q, k, v, beta, g, S0, reset, fmap=fmap, store=True, split=split)
        reset8, rec, anchors, anchor_every = records
        ctx.save_for_backward(q, k, v, beta, g, S0, ST, reset8, rec, anchors)
        ctx.options = dict(fmap=fmap, full=full, split=split)
        ctx.anchor_every = anchor_every
        return y, ST

    @staticmethod
    def backward(ctx, dy, dST):
        q, k, v, beta, g, S0, ST, reset8, rec, anchors = ctx.saved_tensors
        records = (reset8, rec, anchors, ctx.anchor_every)
        dq, dk, dv, dbeta, dg, dS0 = _backward(q, k, v, beta, g, S0, records, ST, dy, dST, **ctx.options)
        return dq, dk, dv, dbeta, dg, dS0, None, None, None, None


def supports(inputs: Mapping[str, Any]) -> str | None:
    """None if the fused kernel can run on a call's arguments (``inputs``, by the reference's
    parameter names: ``dispatch.kernel_inputs``), otherwise the reason (with what would avoid it)."""
    reason = (option_reasons(inputs, {"feature_map": FEATURE_MAPS, "grad_mode": GRAD_MODES})
              or rank_reasons(inputs, ("q", "k", "v"), "[T, B, H, D]"))
    if reason is not None:
        return reason
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    if q.shape != k.shape or v.shape[:3] != q.shape[:3]:
        return f"shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not match"
    if q.shape[0] == 0:
        return EMPTY_SEQUENCE
    dk, dv = feature_dim(inputs["feature_map"], q.shape[-1]), v.shape[-1]
    if not (1 <= dk <= MAX_HEAD_DIM and 1 <= dv <= MAX_HEAD_DIM):
        return (f"head dims (key {dk}, value {dv}) are outside the supported range 1..{MAX_HEAD_DIM} "
                f"(use a head_dim of at most {MAX_HEAD_DIM})")
    return tensor_reasons(inputs, ("q", "k", "v"))


# The keyword-only arguments ``gated_delta_rule_triton`` takes beyond the reference's: a tuning knob that
# changes no result (beyond round-off); dispatch never passes it (``fwrl bench kernels`` does).
TUNING_KEYWORDS = ("split",)


def gated_delta_rule_triton(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor, S0: Tensor, reset: Tensor, *,
    feature_map: str = "l2norm", grad_mode: str = "full", split: int | str = 1,
) -> tuple[Tensor, Tensor]:
    """Fused gated delta rule (Gated DeltaNet Eq. 10); returns (y [T,B,H,Dv] in v's dtype,
    S_T [B,H,Dv,Dk] fp32).

    Same arguments as ``gated_delta_rule_reference``; the state is always fp32. ``split`` (1, 2, 4,
    8 or "auto"): programs per (batch, head), each owning a block of S's rows, as the delta rule's
    kernel's.
    """
    if grad_mode not in GRAD_MODES:
        raise unknown_choice("grad_mode", grad_mode, GRAD_MODES)
    if feature_map not in FEATURE_MAPS:
        raise unknown_choice("feature map for the Triton gated delta-rule kernel", feature_map, FEATURE_MAPS)
    q, k, v, beta, g, S0 = (aligned(x) for x in (q, k, v, beta, g, S0))
    fmap = FMAP_CODES[feature_map]
    n_split = choose_split(split, q.shape[1] * q.shape[2], v.shape[-1], q.device)
    if torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v, beta, g, S0)):
        return _GatedDeltaRuleFunction.apply(q, k, v, beta, g, S0, reset, fmap, grad_mode == "full", n_split)
    # Inference (typically T = 1): no records, no autograd.
    y, ST, _ = _forward(q, k, v, beta, g, S0, reset, fmap=fmap, store=False, split=n_split)
    return y, ST
