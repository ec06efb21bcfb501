"""The sum / delta rule on the CPU: few large ops per step and a hand-derived backward.

The maths is ``naive`` (paper 001, Eq. 20-21 for the sum rule, Eq. 23-25 for the delta rule,
read after the update). The reference's per-step einsums and autograd's record of each cost
tens of small torch calls per step; here a step is four (the delta rule) or one (the sum rule)
batched matrix calls with no autograd record, and everything that does not carry the state runs
once over the whole sequence: the feature maps and the sigmoid (by autograd, before the loop),
the reads ``y_t = W_t phi(q_t)`` and every input gradient (after it).

Forward, per step, with N = B x H matrices ``W`` [N, Dv, Dk], ``k = phi(k_t)``, ``q = phi(q_t)``,
``b = sigmoid(beta_t)``, and the rows that start an episode at t zeroed first (``W_in_t``):

    r_t = v_t - W_in_t k         (delta; the sum rule has no r and u_t = v_t)
    u_t = b r_t
    W_t = W_in_t + u_t k^T
    y_t = W_in_t q + u_t (k . q)  (= W_t q, batched over t after the loop)

Backward, from the last step down, with ``G_t = dW_t + dy_t q^T`` (``dW_t`` the gradient that
reaches W_t from later steps, or from the final state):

    du_t    = G_t k                              (the only loop: G_t needs G_{t+1})
    dW_in_t = G_t - b du_t k^T                    (sum rule: G_t)
    dW_{t-1} = keep_t dW_in_t                      (grad_mode step: 0)

then, batched: ``dq = W_in^T dy + k (u . dy)``, ``dk = G^T u - W_in^T (b du)``, ``dv = b du``
(sum rule: ``du``), ``db = du . r``. The states ``W_in_t`` and ``G_t`` are kept ([T, N, Dv, Dk]
each, 2.8 MB at T 21, B 8, H 4, d 32 in float32): memory is cheap on the CPU, where the fused
GPU kernel recomputes them instead.

The reset steps are read on the host once per call (``reset.any(1)``), so this path does not
belong in a CUDA graph; it runs on any device, and is the default for CPU tensors
(``fwrl.kernels.dispatch``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from fwrl.kernels import check_grad_mode
from fwrl.kernels.cpu_common import reset_steps
from fwrl.kernels.feature_maps import adjacent_pair, apply_feature_map

from .chunk import delta_rule_chunked

RULES = ("delta", "sum")


def keep_masks(reset: Tensor, dtype: torch.dtype) -> Tensor:
    """``1 - reset`` as [T, B, 1, 1, 1] in ``dtype``: multiplies a [B, H, ., .] view of the states."""
    return (~reset).to(dtype).view(*reset.shape, 1, 1, 1)


def _matvec(W: Tensor, x: Tensor, out: Tensor | None = None) -> Tensor:
    """W x: W [..., Dv, Dk], x [..., Dk] -> [..., Dv], as the row vector x^T times W^T. torch's CPU
    bmm takes that form to its batched GEMM (17 us for 64 matrices of 32 x 32 here), where W times a
    column vector runs a loop of small GEMMs (118 us) and a product and a sum take 50 us."""
    return torch.matmul(x.unsqueeze(-2), W.mT, out=None if out is None else out.unsqueeze(-2)).squeeze(-2)


def _vecmat(x: Tensor, W: Tensor, out: Tensor | None = None) -> Tensor:
    """W^T x: x [..., Dv], W [..., Dv, Dk] -> [..., Dk] (the row vector x^T times W)."""
    return torch.matmul(x.unsqueeze(-2), W, out=None if out is None else out.unsqueeze(-2)).squeeze(-2)


def _forward_loop(q: Tensor, k: Tensor, v: Tensor, b: Tensor | None, W_in: Tensor, keep: Tensor,
                  resets: set[int], heads: int) -> tuple[Tensor, Tensor | None, Tensor]:
    """Fill ``W_in`` [T + 1, N, Dv, Dk] (``W_in[0]`` holds W0 on entry) step by step; returns y and
    the records r (delta rule) and u [T, N, Dv]."""
    T, N = q.shape[:2]
    kT = k.unsqueeze(-2)  # [T, N, 1, Dk]
    if b is None:
        r, u = None, v
    else:
        r, u = torch.empty_like(v), torch.empty_like(v)
    y = torch.empty_like(v)
    reset_at = resets
    for t in range(T):
        if t in reset_at:
            W_in[t].view(N // heads, heads, *W_in.shape[2:]).mul_(keep[t])
        if b is not None:
            torch.sub(v[t], _matvec(W_in[t], k[t]), out=r[t])
            torch.mul(r[t], b[t], out=u[t])
        torch.addcmul(W_in[t], u[t].unsqueeze(-1), kT[t], out=W_in[t + 1])
        _matvec(W_in[t + 1], q[t], out=y[t])
    return y, r, u


class _DeltaRule(torch.autograd.Function):
    """The recurrence on mapped inputs: q, k [T, N, Dk], v [T, N, Dv], b [T, N, 1] or None (sum
    rule), W0 [N, Dv, Dk], keep [T, B, 1, 1, 1] (N = B x heads); returns y [T, N, Dv] and W_T."""

    @staticmethod
    def forward(ctx, q, k, v, b, W0, keep, resets: set[int], heads: int, full: bool):
        T = q.shape[0]
        W_in = q.new_empty((T + 1, *W0.shape))  # W_in[t]: the matrix step t starts from
        W_in[0] = W0
        y, r, u = _forward_loop(q, k, v, b, W_in, keep, resets, heads)
        ctx.save_for_backward(q, k, b, W_in, u, r, keep)
        ctx.resets, ctx.heads, ctx.full = resets, heads, full
        return y, W_in[T].clone()

    @staticmethod
    def backward(ctx, dy, dWT):
        q, k, b, W_in, u, r, keep = ctx.saved_tensors
        T, N = q.shape[:2]
        heads = ctx.heads
        dy = torch.zeros_like(u) if dy is None else dy
        G = torch.empty_like(W_in[:T])  # G[t]: the gradient of W_t
        du = torch.empty_like(u)
        a = du if b is None else torch.empty_like(u)
        dq, dk = torch.empty_like(q), torch.empty_like(k)
        kT, qT, dyc = k.unsqueeze(-2), q.unsqueeze(-2), dy.unsqueeze(-1)
        if ctx.full:
            carry = dWT if dWT is not None else torch.zeros_like(W_in[0])
            reset_at = ctx.resets
            for t in range(T - 1, -1, -1):
                torch.addcmul(carry, dyc[t], qT[t], out=G[t])
                _matvec(G[t], k[t], out=du[t])
                _vecmat(u[t], G[t], out=dk[t])
                if b is None:
                    carry = G[t]
                else:
                    torch.mul(du[t], b[t], out=a[t])
                    dk[t].sub_(_vecmat(a[t], W_in[t]))
                    carry = torch.addcmul(G[t], a[t].unsqueeze(-1), kT[t], value=-1)
                _vecmat(dy[t], W_in[t], out=dq[t])
                if t in reset_at:
                    carry = (carry.view(N // heads, heads, *carry.shape[1:]) * keep[t]).view(carry.shape)
            dW0 = carry if ctx.needs_input_grad[4] else None
        else:  # the carried W is cut at every step: only dW_T reaches back, into the last step
            torch.mul(dyc, qT, out=G)
            if dWT is not None:
                G[T - 1].add_(dWT)
            _matvec(G, k, out=du)
            dW0 = None
            _vecmat(u, G, out=dk)
            _vecmat(dy, W_in[:T], out=dq)
            if b is not None:
                torch.mul(du, b, out=a)
                dk.sub_(_vecmat(a, W_in[:T]))
        # dq_t = W_t^T dy_t = W_in_t^T dy_t + k_t (u_t . dy_t); dk_t = G_t^T u_t - b_t W_in_t^T du_t
        dq.add_(k * (u * dy).sum(-1, keepdim=True))
        if b is None:
            return dq, dk, du, None, dW0, None, None, None, None
        db = (du * r).sum(-1, keepdim=True)
        return dq, dk, a, db, dW0, None, None, None, None


def _run_without_grad(q, k, v, b, W0, keep, resets, heads):
    """The forward alone (no input needs a gradient) over T > 1 steps: no records for a backward."""
    W_in = q.new_empty((q.shape[0] + 1, *W0.shape))
    W_in[0] = W0
    y, _, _ = _forward_loop(q, k, v, b, W_in, keep, resets, heads)
    return y, W_in[-1]


def _one_step(q: Tensor, k: Tensor, v: Tensor, beta: Tensor | None, W0: Tensor, reset: Tensor,
              feature_map: str) -> tuple[Tensor, Tensor]:
    """One step without a gradient (acting) in the fewest torch calls: at these sizes each call
    costs more than its arithmetic, and on the CPU each one hands the GIL to the learner thread.
    phi of q and k in one call where they are adjacent slices, W q and W k in one product,
    ``y = W_1 q = W q + u (k . q)``, no host read but whether a row resets. Arguments as
    :func:`delta_rule_cpu` with T = 1."""
    _, B, H, Dk = q.shape
    Dv, F = W0.shape[-2:]
    N = B * H
    pair = adjacent_pair(q, k)
    qk = apply_feature_map(feature_map, (torch.stack([q, k], -2) if pair is None else pair).view(N, 2, Dk))
    W = W0.reshape(N, Dv, F)
    if bool(reset.any()):
        W = W0.masked_fill(reset.view(B, 1, 1, 1), 0).view(N, Dv, F)
    WqWk = torch.bmm(qk, W.mT)  # [N, 2, Dv]
    u = v.reshape(N, Dv)  # the sum rule's; the delta rule's is sigmoid(beta) (v - W k)
    if beta is not None:
        u = (u - WqWk[:, 1]).mul_(torch.sigmoid(beta.reshape(N, 1)))
    phi_k = qk[:, 1]
    y = torch.addcmul(WqWk[:, 0], u, (qk[:, 0] * phi_k).sum(-1, keepdim=True))
    W = torch.addcmul(W, u.unsqueeze(-1), phi_k.unsqueeze(-2))
    return y.view(1, B, H, Dv), W.view(B, H, Dv, F)


def delta_rule_cpu(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor | None, W0: Tensor, reset: Tensor, *,
    rule: str = "delta", feature_map: str = "elu1_sumnorm", grad_mode: str = "full",
) -> tuple[Tensor, Tensor]:
    """The sum / delta rule of ``naive.delta_rule_reference`` (same arguments, same results to
    round-off) with the hand-derived backward above."""
    if rule not in RULES:
        raise ValueError(f"unknown rule {rule!r}; valid: {', '.join(RULES)}")
    check_grad_mode(grad_mode)
    T, B, H, Dk = q.shape
    needs_grad = torch.is_grad_enabled() and any(
        x is not None and x.requires_grad for x in (q, k, v, beta, W0))
    if T == 1 and not needs_grad:
        return _one_step(q, k, v, beta if rule == "delta" else None, W0, reset, feature_map)
    Dv = v.shape[-1]
    N = B * H
    phi_q = apply_feature_map(feature_map, q).reshape(T, N, -1)
    phi_k = apply_feature_map(feature_map, k).reshape(T, N, -1)
    b = torch.sigmoid(beta).reshape(T, N, 1) if rule == "delta" else None
    keep = keep_masks(reset, W0.dtype)
    if grad_mode == "step":
        W0 = W0.detach()
    if needs_grad and grad_mode == "full" and T > 1:
        return delta_rule_chunked(phi_q.view(T, B, H, -1), phi_k.view(T, B, H, -1), v,
                                  None if b is None else b.view(T, B, H), W0, reset)
    args = (phi_q, phi_k, v.reshape(T, N, Dv), b, W0.reshape(N, Dv, -1), keep, reset_steps(reset), H)
    y, WT = _DeltaRule.apply(*args, grad_mode == "full") if needs_grad else _run_without_grad(*args)
    return y.view(T, B, H, Dv), WT.view(B, H, Dv, -1)
