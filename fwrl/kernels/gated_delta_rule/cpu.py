"""The gated delta rule on the CPU: few large ops per step and a hand-derived backward.

The maths is ``naive`` (Gated DeltaNet, Yang et al. 2025, Eq. 10, read after the write), run as the
delta rule's CPU path runs paper 001's (``fwrl.kernels.delta_rule.cpu``): everything that does not
carry the state runs once over the whole sequence (the feature maps, the sigmoid and the decays
``alpha_t = exp(g_t)`` by autograd before the loop; the reads ``y_t = S_t q_t`` and every input
gradient after it), and a step is four batched calls with no autograd record. ``grad_mode`` ``full``
with a gradient learns in chunked form (``chunk.py``, the paper's Sec. 3.3, with its own hand-derived
backward), which takes q, k and beta before phi and the sigmoid (l2norm and the sigmoid are applied,
and differentiated, with its chunks).

Forward, per step, with N = B x H matrices ``S`` [N, Dv, Dk], ``k = phi(k_t)``, ``q = phi(q_t)``,
``b = sigmoid(beta_t)`` and the decay ``d_t = alpha_t keep_t`` (``keep_t = 0`` on the rows that start
an episode at t: the reset folded into the decay):

    A_t  = d_t S_{t-1}             (the decayed state; kept)
    Ak_t = A_t k                    (kept: r_t = v_t - Ak_t)
    u_t  = b (v_t - Ak_t)
    S_t  = A_t + u_t k^T
    y_t  = A_t q + u_t (k . q)      (= S_t q, batched over t after the loop)

Backward, from the last step down, with ``G_t = dS_t + dy_t q^T`` (``dS_t`` the gradient that reaches
S_t from later steps, or from the final state):

    du_t     = G_t k                              (the only loop: G_t needs G_{t+1})
    dA_t     = G_t - b du_t k^T
    dS_{t-1} = d_t dA_t                           (grad_mode step: 0)

then, batched: ``dq = A^T dy + k (u . dy)``, ``dk = G^T u - A^T (b du)``, ``dv = b du``,
``db = du . r`` and ``dg_t = alpha_t <dA_t, S_in_t> = <dA_t, A_t> = <G_t, A_t> - (b du_t) . Ak_t``
(no division by alpha, so a gate that decays to nothing is harmless). The states ``A_t`` and ``G_t``
are kept ([T, N, Dv, Dk] each), as the delta rule's CPU path keeps its own.

The reset steps never reach the host here (they are in the decays), but the chunked form and
``_one_step`` read them (``reset.any``), so this path does not belong in a CUDA graph; it runs on any
device and is the default for CPU tensors (``fwrl.kernels.dispatch``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from fwrl.kernels import check_grad_mode
from fwrl.kernels.cpu_common import matvec, vecmat
from fwrl.kernels.feature_maps import adjacent_pair, apply_feature_map, check_feature_map

from .chunk import gated_delta_rule_chunked


def _forward_loop(q: Tensor, k: Tensor, v: Tensor, b: Tensor, decay: Tensor, S0: Tensor
                  ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The recurrence on mapped inputs: q, k [T, N, Dk], v [T, N, Dv], b [T, N, 1], decay [T, N, 1, 1]
    (the reset folded in), S0 [N, Dv, Dk]; returns y, S_T and the records A [T, N, Dv, Dk], Ak, u."""
    T = q.shape[0]
    A = q.new_empty((T, *S0.shape))
    Ak, u = torch.empty_like(v), torch.empty_like(v)
    bv, minus_b = b * v, -b
    kT = k.unsqueeze(-2)
    S = S0
    for t in range(T):
        torch.mul(S, decay[t], out=A[t])
        matvec(A[t], k[t], out=Ak[t])
        torch.addcmul(bv[t], minus_b[t], Ak[t], out=u[t])
        S = torch.addcmul(A[t], u[t].unsqueeze(-1), kT[t])
    y = torch.addcmul(matvec(A, q), u, (k * q).sum(-1, keepdim=True))
    return y, S, A, Ak, u


class _GatedDeltaRule(torch.autograd.Function):
    """The recurrence on mapped inputs with the backward of the module docstring: q, k [T, N, Dk],
    v [T, N, Dv], b [T, N, 1], g [T, N], S0 [N, Dv, Dk], keep [T, N] (0 where a row resets);
    returns y [T, N, Dv] and S_T."""

    @staticmethod
    def forward(ctx, q, k, v, b, g, S0, keep, full: bool):
        T, N = g.shape
        decay = (torch.exp(g) * keep).view(T, N, 1, 1)
        y, ST, A, Ak, u = _forward_loop(q, k, v, b, decay, S0)
        ctx.save_for_backward(q, k, v, b, decay, A, Ak, u)
        ctx.full = full
        return y, ST

    @staticmethod
    def backward(ctx, dy, dST):
        q, k, v, b, decay, A, Ak, u = ctx.saved_tensors
        T = q.shape[0]
        dy = torch.zeros_like(u) if dy is None else dy
        G = torch.empty_like(A)  # G[t]: the gradient of S_t
        du = torch.empty_like(u)
        if ctx.full:
            kT, qT, dyc = k.unsqueeze(-2), q.unsqueeze(-2), dy.unsqueeze(-1)
            b_kT = b.unsqueeze(-1) * kT  # [T, N, 1, Dk]: b k^T, so dA_t = G_t - du_t (b k^T)
            carry = dST if dST is not None else torch.zeros_like(A[0])
            for t in range(T - 1, -1, -1):
                torch.addcmul(carry, dyc[t], qT[t], out=G[t])
                matvec(G[t], k[t], out=du[t])
                carry = torch.addcmul(G[t], du[t].unsqueeze(-1), b_kT[t], value=-1).mul_(decay[t])
            dS0 = carry if ctx.needs_input_grad[5] else None
        else:  # the carried S is cut at every step: only dS_T reaches back, into the last step
            torch.mul(dy.unsqueeze(-1), q.unsqueeze(-2), out=G)
            if dST is not None:
                G[T - 1].add_(dST)
            matvec(G, k, out=du)
            dS0 = None
        w = b * du  # the gradient of v
        dq = torch.addcmul(vecmat(dy, A), k, (u * dy).sum(-1, keepdim=True))
        dk = vecmat(u, G).sub_(vecmat(w, A))
        db = (du * (v - Ak)).sum(-1, keepdim=True)
        dg = (G * A).sum((-1, -2)).sub_((w * Ak).sum(-1))
        return dq, dk, w, db, dg, dS0, None, None


def _one_step(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor, S0: Tensor, reset: Tensor,
              feature_map: str) -> tuple[Tensor, Tensor]:
    """One step without a gradient (acting) in the fewest torch calls: phi of q and k in one call
    where they are adjacent slices, the decay with the reset folded in, A q and A k in one product,
    ``y = A q + u (k . q)``, the write in place on the decayed copy A (one pass over the state more
    than the delta rule's step, not two), no host read but whether a row resets, no size arithmetic
    (a trace of the step replays every call). Arguments as :func:`gated_delta_rule_cpu` with T = 1."""
    _, B, H, Dk = q.shape
    Dv, F = S0.shape[-2:]
    pair = adjacent_pair(q, k)
    qk = apply_feature_map(feature_map, (torch.stack([q, k], -2) if pair is None else pair).reshape(-1, 2, Dk))
    decay = torch.exp(g).view(B, H, 1, 1)
    if bool(reset.any()):
        decay = decay.masked_fill(reset.view(B, 1, 1, 1), 0)
    A = (S0 * decay).view(-1, Dv, F)
    Aq, Ak = torch.bmm(qk, A.mT).unbind(1)  # [N, Dv] each
    u = (v.reshape(-1, Dv) - Ak).mul_(torch.sigmoid(beta).reshape(-1, 1))
    phi_q, phi_k = qk.unbind(1)
    y = torch.addcmul(Aq, u, torch.linalg.vecdot(phi_q, phi_k).unsqueeze(-1))
    S = A.addcmul_(u.unsqueeze(-1), phi_k.unsqueeze(-2))
    return y.view(1, B, H, Dv), S.view(B, H, Dv, F)


def gated_delta_rule_cpu(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor, S0: Tensor, reset: Tensor, *,
    feature_map: str = "l2norm", grad_mode: str = "full",
) -> tuple[Tensor, Tensor]:
    """The gated delta rule of ``naive.gated_delta_rule_reference`` (same arguments, same results to
    round-off) with the hand-derived backward above (``grad_mode`` step, and full on one step) or the
    chunked form (``grad_mode`` full over several steps)."""
    check_grad_mode(grad_mode)
    check_feature_map(feature_map)
    T, B, H, Dk = q.shape
    needs_grad = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v, beta, g, S0))
    if T == 1 and not needs_grad:
        return _one_step(q, k, v, beta, g, S0, reset, feature_map)
    if needs_grad and grad_mode == "full" and T > 1:
        return gated_delta_rule_chunked(q, k, v, beta, g, S0, reset, feature_map)
    Dv = v.shape[-1]
    N = B * H
    phi_q = apply_feature_map(feature_map, q)
    phi_k = apply_feature_map(feature_map, k)
    b = torch.sigmoid(beta)
    if grad_mode == "step":
        S0 = S0.detach()
    keep = (~reset).to(S0.dtype).view(T, B, 1).expand(T, B, H).reshape(T, N)
    args = (phi_q.reshape(T, N, -1), phi_k.reshape(T, N, -1), v.reshape(T, N, Dv), b.reshape(T, N, 1),
            g.reshape(T, N), S0.reshape(N, Dv, -1), keep)
    if needs_grad:
        y, ST = _GatedDeltaRule.apply(*args, grad_mode == "full")
    else:
        q_, k_, v_, b_, g_, S0_, keep_ = args
        y, ST, *_ = _forward_loop(q_, k_, v_, b_, (torch.exp(g_) * keep_).view(T, N, 1, 1), S0_)
    return y.view(T, B, H, Dv), ST.view(B, H, Dv, -1)
