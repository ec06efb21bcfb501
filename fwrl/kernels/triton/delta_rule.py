"""Fused Triton sum rule / delta rule over a whole rollout (one launch per layer).

The maths is ``fwrl.kernels.reference.delta_rule`` (paper 001, Eq. 20-21 for
the sum rule and Eq. 23-25 for the delta rule, read after the update):

    vbar_t = W_{t-1} phi(k_t)
    W_t    = W_{t-1} + sigma(beta_t) (v_t - vbar_t) phi(k_t)^T      (delta)
    W_t    = W_{t-1} + v_t phi(k_t)^T                               (sum)
    y_t    = W_t phi(q_t)

Layout: one program per (batch, head, block of BV rows of W). The rows of W
evolve independently given phi(k_t), phi(q_t) and sigma(beta_t), so a block
of rows is carried in registers in fp32 for the whole sequence; the feature
maps and the sigmoid are computed in the kernel.

Backward, without storing the T states: the forward writes, per step, the
fp32 record ``r_t = v_t - vbar_t`` (delta rule; the sum rule needs none), so
``u_t = sigma(beta_t) r_t`` is recomputed bit for bit and the update is undone
exactly as a subtraction, ``W_{t-1} = W_t - u_t phi(k_t)^T``; no inverse of
``(I - beta k k^T)`` is ever formed, so saturated betas and one-hot keys are
harmless. A reset makes the previous state unrecoverable from the current one,
so the forward also keeps the pre-reset state of every reset at t >= 1 (these
are few: episode ends inside the rollout). Gradients, with ``G_t = dW_t +
dy_t phi(q_t)^T`` and ``u_t = b_t (v_t - vbar_t)``:

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

import os

import torch
import triton
import triton.language as tl
from torch import Tensor

from fwrl.errors import unknown_choice
from fwrl.kernels.reference.feature_maps import SUM_NORM_EPS, apply_feature_map, feature_dim

RULES = ("delta", "sum")
GRAD_MODES = ("full", "step")
# Feature maps computed inside the kernel; "dpfp-N" is applied in PyTorch
# before the kernel (which then runs with the identity map).
KERNEL_FEATURE_MAPS = {"identity": 0, "elu1_sumnorm": 1, "softmax": 2}
FEATURE_MAPS = ("elu1_sumnorm", "softmax", "identity", "dpfp-1", "dpfp-2", "dpfp-3")
INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_HEAD_DIM = 128
# Largest W block one program keeps in registers (elements).
MAX_BLOCK_ELEMENTS = 4096

# Whether the kernels below were built for the CPU interpreter (decided by
# Triton when this module is imported).
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# The kernels use only Triton builtins and ``tl.reduce`` with the combine
# functions of ``tl.sum`` / ``tl.max``: the library wrappers (``tl.sum``,
# ``tl.sigmoid``, ``tl.zeros``...) are themselves jit functions, which the CPU
# interpreter can only run when Triton itself was imported with
# TRITON_INTERPRET=1; this way a copy of this module built for the interpreter
# works in a process where Triton was imported for GPUs (and the other way round).
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
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _phi(x, mask, FMAP: tl.constexpr, EPS: tl.constexpr):
    """Feature map of one row (masked lanes give 0)."""
    if FMAP == 1:  # elu(x) + 1, then sum normalisation
        e = tl.where(x > 0, x + 1.0, tl.exp(tl.minimum(x, 0.0)))
        e = tl.where(mask, e, 0.0)
        out = e / (_sum(e, 0) + EPS)
    elif FMAP == 2:  # softmax
        xm = tl.where(mask, x, -float("inf"))
        e = tl.exp(xm - _max(xm, 0))
        e = tl.where(mask, e, 0.0)
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
        phi = e / s
        de = (dphi - _sum(dphi * phi, 0)) / s
        dx = de * tl.where(x > 0, 1.0, ex)
    elif FMAP == 2:
        xm = tl.where(mask, x, -float("inf"))
        e = tl.exp(xm - _max(xm, 0))
        e = tl.where(mask, e, 0.0)
        phi = e / _sum(e, 0)
        dx = phi * (dphi - _sum(dphi * phi, 0))
    else:
        dx = dphi
    return tl.where(mask, dx, 0.0)


@triton.jit
def _forward_kernel(
    Q, K, V, BETA, W0, RESET, SLOT,  # inputs
    Y, WT, REC, PRE,  # outputs (REC, PRE only with STORE)
    T, B, H, DK, DV,
    BK: tl.constexpr, BV: tl.constexpr, FMAP: tl.constexpr, DELTA: tl.constexpr,
    STORE: tl.constexpr, EPS: tl.constexpr,
):
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    b = i_bh // H
    ok = tl.arange(0, BK)
    ov = i_v * BV + tl.arange(0, BV)
    mk = ok < DK
    mv = ov < DV
    wm = mv[:, None] & mk[None, :]
    w_loc = ov[:, None] * DK + ok[None, :]
    W = tl.load(W0 + i_bh * DV * DK + w_loc, mask=wm, other=0.0).to(tl.float32)
    for t in range(T):
        row = t * B * H + i_bh  # index of (t, b, h)
        reset = tl.load(RESET + t * B + b) != 0
        if STORE:
            slot = tl.load(SLOT + t * B + b)
            pre = PRE + (tl.maximum(slot, 0).to(tl.int64) * B * H + i_bh) * DV * DK
            # The scalar condition is broadcast by hand: the CPU interpreter
            # rejects a mask made by broadcasting a scalar inside ``&``.
            keep = wm & (tl.full([BV, BK], 0, tl.int32) + slot >= 0)
            tl.store(pre + w_loc, W, mask=keep)
        W = tl.where(reset, 0.0, W)
        k = _phi(tl.load(K + row * DK + ok, mask=mk, other=0.0).to(tl.float32), mk, FMAP, EPS)
        q = _phi(tl.load(Q + row * DK + ok, mask=mk, other=0.0).to(tl.float32), mk, FMAP, EPS)
        v = tl.load(V + row * DV + ov, mask=mv, other=0.0).to(tl.float32)
        if DELTA:
            beta = _sigmoid(tl.load(BETA + row).to(tl.float32))
            r = v - _sum(W * k[None, :], 1)
            if STORE:
                tl.store(REC + row * DV + ov, r, mask=mv)
            u = beta * r
        else:
            u = v
        W = W + u[:, None] * k[None, :]
        y = _sum(W * q[None, :], 1)
        tl.store(Y + row * DV + ov, y.to(Y.dtype.element_ty), mask=mv)
    tl.store(WT + i_bh * DV * DK + w_loc, W, mask=wm)


@triton.jit
def _backward_kernel(
    Q, K, V, BETA, RESET, SLOT, REC, PRE, WT,  # forward inputs and records
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
    ok = tl.arange(0, BK)
    ov = i_v * BV + tl.arange(0, BV)
    mk = ok < DK
    mv = ov < DV
    wm = mv[:, None] & mk[None, :]
    w_loc = ov[:, None] * DK + ok[None, :]
    W = tl.load(WT + i_bh * DV * DK + w_loc, mask=wm, other=0.0)
    dW = tl.load(DWT + i_bh * DV * DK + w_loc, mask=wm, other=0.0).to(tl.float32)
    for i in range(T):
        t = T - 1 - i
        row = t * B * H + i_bh
        reset = tl.load(RESET + t * B + b) != 0
        xk = tl.load(K + row * DK + ok, mask=mk, other=0.0).to(tl.float32)
        xq = tl.load(Q + row * DK + ok, mask=mk, other=0.0).to(tl.float32)
        k = _phi(xk, mk, FMAP, EPS)
        q = _phi(xq, mk, FMAP, EPS)
        dy = tl.load(DY + row * DV + ov, mask=mv, other=0.0).to(tl.float32)
        G = dW + dy[:, None] * q[None, :]
        dq = _sum(W * dy[:, None], 0)
        if DELTA:
            beta = _sigmoid(tl.load(BETA + row).to(tl.float32))
            r = tl.load(REC + row * DV + ov, mask=mv, other=0.0)
            u = beta * r
        else:
            u = tl.load(V + row * DV + ov, mask=mv, other=0.0).to(tl.float32)
        # Undo the update: the state this step started from (after its reset).
        A = tl.where(reset, 0.0, W - u[:, None] * k[None, :])
        du = _sum(G * k[None, :], 1)
        dk = _sum(G * u[:, None], 0)
        if DELTA:
            dvbar = -beta * du
            dv = beta * du
            dbeta = _sum(du * r, 0) * beta * (1.0 - beta)
            tl.store(DBETA + i_v * TBH + row, dbeta)
            dk += _sum(A * dvbar[:, None], 0)
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
        # The state before this step: kept by the forward if the row was reset.
        slot = tl.load(SLOT + t * B + b)
        pre = PRE + (tl.maximum(slot, 0).to(tl.int64) * B * H + i_bh) * DV * DK
        kept = wm & (tl.full([BV, BK], 0, tl.int32) + slot >= 0)  # (see the forward)
        W = tl.where(slot >= 0, tl.load(pre + w_loc, mask=kept, other=0.0), A)
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


def _block_sizes(dk: int, dv: int, block_v: int | None) -> tuple[int, int, int]:
    """(BK, BV, num_warps): all of a key row, BV rows of W per program."""
    bk = max(16, triton.next_power_of_2(dk))
    bv = max(16, triton.next_power_of_2(dv))
    bv = min(bv, MAX_BLOCK_ELEMENTS // bk) if block_v is None else block_v
    elements = bk * bv
    num_warps = min(8, max(1, elements // 512))
    return bk, bv, num_warps


def _reset_slots(reset: Tensor) -> tuple[Tensor, int]:
    """Per (t, b): index of the kept pre-reset state, or -1; and the most any row keeps.

    Resets at t = 0 need none (the state before them is W0). Sizing the buffer
    reads one number from the device (one synchronisation per training call).
    """
    r = reset.to(torch.int32)
    slots = torch.full_like(r, -1)
    if r.shape[0] < 2:
        return slots, 0
    count = torch.cumsum(r[1:], dim=0)
    slots[1:] = torch.where(r[1:] != 0, count - 1, slots[1:])
    return slots, int(count[-1].max().item())


def _forward(q, k, v, beta, W0, reset, *, delta, fmap, store, block_v=None):
    T, B, H, DK = q.shape
    DV = v.shape[-1]
    bk, bv, num_warps = _block_sizes(DK, DV, block_v)
    y = torch.empty(T, B, H, DV, device=q.device, dtype=v.dtype)
    WT = torch.empty(B, H, DV, DK, device=q.device, dtype=torch.float32)
    reset8 = reset.to(device=q.device, dtype=torch.int8).contiguous()
    if store:
        slots, n_pre = _reset_slots(reset8)
        rec = torch.empty(T, B, H, DV, device=q.device, dtype=torch.float32) if delta else WT
        pre = torch.empty(max(n_pre, 1), B, H, DV, DK, device=q.device, dtype=torch.float32)
    else:
        slots, rec, pre = reset8, WT, WT
    _forward_kernel[(triton.cdiv(DV, bv), B * H)](
        q, k, v, beta if delta else q, W0, reset8, slots,
        y, WT, rec, pre,
        T, B, H, DK, DV,
        BK=bk, BV=bv, FMAP=fmap, DELTA=delta, STORE=store, EPS=SUM_NORM_EPS,
        num_warps=num_warps, enable_fp_fusion=True,
    )
    return y, WT, (reset8, slots, rec, pre)


def _backward(q, k, v, beta, W0, records, WT, dy, dWT, *, delta, fmap, full,
              block_v=None, rebuild=False):
    reset8, slots, rec, pre = records
    T, B, H, DK = q.shape
    DV = v.shape[-1]
    bk, bv, num_warps = _block_sizes(DK, DV, block_v)
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
        q, k, v, beta if delta else q, reset8, slots, rec, pre, WT,
        dy.contiguous(), dWT.contiguous(),
        dq, dk, dv, dbeta if delta else dW0, dW0, rebuilt,
        T, B, H, DK, DV,
        BK=bk, BV=bv, FMAP=fmap, DELTA=delta, FULL=full, FUSE_FMAP=fuse,
        WRITE_REBUILT=rebuild, EPS=SUM_NORM_EPS, num_warps=num_warps, enable_fp_fusion=True,
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
        BD=max(16, triton.next_power_of_2(D)), FMAP=fmap, EPS=SUM_NORM_EPS, num_warps=1,
        enable_fp_fusion=True,
    )
    return dx


class _DeltaRuleFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, beta, W0, reset, delta, fmap, full, block_v):
        y, WT, records = _forward(
            q, k, v, beta, W0, reset, delta=delta, fmap=fmap, store=True, block_v=block_v
        )
        ctx.save_for_backward(q, k, v, beta, W0, WT, *records)
        ctx.options = dict(delta=delta, fmap=fmap, full=full, block_v=block_v)
        return y, WT

    @staticmethod
    def backward(ctx, dy, dWT):
        q, k, v, beta, W0, WT, *records = ctx.saved_tensors
        dq, dk, dv, dbeta, dW0 = _backward(q, k, v, beta, W0, records, WT, dy, dWT, **ctx.options)
        return dq, dk, dv, dbeta, dW0, None, None, None, None, None


def supports(
    q: Tensor, k: Tensor, v: Tensor, *, rule: str = "delta",
    feature_map: str = "elu1_sumnorm", grad_mode: str = "full",
) -> str | None:
    """None if the fused kernel can run on these inputs, otherwise the reason."""
    if rule not in RULES:
        return f"rule {rule!r} is not one of {', '.join(RULES)}"
    if feature_map not in FEATURE_MAPS:
        return f"feature map {feature_map!r} is not one of {', '.join(FEATURE_MAPS)}"
    if grad_mode not in GRAD_MODES:
        return f"grad_mode {grad_mode!r} is not one of {', '.join(GRAD_MODES)}"
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.device.type != "cuda" and not (x.device.type == "cpu" and _interpreting()):
            return (f"{name} is on {x.device.type}; the kernel needs CUDA tensors "
                    "(or TRITON_INTERPRET=1 when this module was imported, for CPU tests)")
        if x.dtype not in INPUT_DTYPES:
            return f"{name} has dtype {x.dtype}; supported: float32, bfloat16, float16"
        if x.dim() != 4:
            return f"{name} has shape {tuple(x.shape)}; expected [T, B, H, D]"
    if q.shape != k.shape or v.shape[:3] != q.shape[:3]:
        return f"shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not match"
    if q.shape[0] == 0:
        return "the sequence is empty (T = 0)"
    dk, dv = feature_dim(feature_map, q.shape[-1]), v.shape[-1]
    if not (1 <= dk <= MAX_HEAD_DIM and 1 <= dv <= MAX_HEAD_DIM):
        return (f"head dims (key feature {dk}, value {dv}) are outside the supported "
                f"range 1..{MAX_HEAD_DIM}")
    return None


def _interpreting() -> bool:
    return INTERPRETED and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def delta_rule_triton(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor | None,
    W0: Tensor,
    reset: Tensor,
    *,
    rule: str = "delta",
    feature_map: str = "elu1_sumnorm",
    grad_mode: str = "full",
    block_v: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Fused sum / delta rule; returns (y [T,B,H,Dv] in v's dtype, W_T [B,H,Dv,Dk] fp32).

    Same arguments as ``delta_rule_reference``; the state is always fp32.
    ``block_v`` (rows of W per program) is for tests and benchmarks.
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
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    beta = beta.contiguous() if delta else None
    W0 = W0.contiguous()
    fmap = KERNEL_FEATURE_MAPS[feature_map]
    tensors = (q, k, v, beta, W0) if delta else (q, k, v, W0)
    if torch.is_grad_enabled() and any(x.requires_grad for x in tensors):
        return _DeltaRuleFunction.apply(
            q, k, v, beta, W0, reset, delta, fmap, grad_mode == "full", block_v
        )
    # Inference (typically T = 1): no records, no synchronisation, no autograd.
    y, WT, _ = _forward(q, k, v, beta, W0, reset, delta=delta, fmap=fmap, store=False,
                        block_v=block_v)
    return y, WT
