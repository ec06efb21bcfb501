"""Reference recurrence of the Recurrent Delta Net (RDN), one step at a time.

Paper 000 (RFWP), Sec. 3.2, Eq. 15-18: the slow net of the Delta Net also
reads the previous output of the fast net through recurrent slow weights::

    s_t    = tanh(h_{t-1})
    q_t    = phi(x_q,t + R_q s_t)                                   (Eq. 17)
    k_t    = phi(x_k,t + R_k s_t)                                   (Eq. 15)
    v_t    = x_v,t + R_v s_t                                        (Eq. 16)
    beta_t = sigmoid(x_b,t + r_b . s_t)                             (Eq. 18)
    W_t    = W_{t-1} + beta_t (v_t - W_{t-1} k_t) k_t^T             (paper 001 Eq. 20-24)
    h_t    = W_t q_t                                                (paper 001 Eq. 25)

``h_t`` is stored raw (tanh is applied when it is read at the next step); the
output of the layer at step t is ``h_t``. phi is softmax in the authors' RL
runs (PAPERS.md §2).

The feed-forward part ``x_q, x_k, x_v, x_b`` (= W_q x, W_k x, W_v x, W_beta x)
does not depend on the state, so the caller computes it for the whole
sequence as one GEMM; only the recurrent matrices enter the loop.

Shapes (per head h, head size d, feature size F = feature_dim(phi, d)):
    xq, xk, xv [T, B, H, d]; xb [T, B, H]
    Rq, Rk, Rv [H, d, d] (R[h] @ s[b, h]); rb [H, d]
    W0 [B, H, d, F]; h0 [B, H, d]; reset [T, B] bool (rows with reset[t]
    start step t from W = 0, h = 0)
Returns (y [T, B, H, d], W_T, h_T).

``grad_mode``: ``full`` back-propagates through (W, h) across the sequence;
``step`` detaches the carried (W, h) at the start of every step (the authors'
RL code ran one step at a time with a detached state).
"""

from __future__ import annotations

import torch
from torch import Tensor

from fwrl.kernels import GRAD_MODES
from fwrl.kernels.feature_maps import apply_feature_map


def rdn_reference(
    xq: Tensor,
    xk: Tensor,
    xv: Tensor,
    xb: Tensor,
    Rq: Tensor,
    Rk: Tensor,
    Rv: Tensor,
    rb: Tensor,
    W0: Tensor,
    h0: Tensor,
    reset: Tensor,
    *,
    feature_map: str = "softmax",
    grad_mode: str = "full",
) -> tuple[Tensor, Tensor, Tensor]:
    """Run the RDN recurrence over T steps; returns (y [T,B,H,d], W_T, h_T)."""
    if grad_mode not in GRAD_MODES:
        raise ValueError(f"unknown grad_mode {grad_mode!r}; valid: {', '.join(GRAD_MODES)}")
    W, h = W0, h0
    ys = []
    for t in range(xq.shape[0]):
        keep = (~reset[t]).to(W.dtype)
        W = W * keep.view(-1, 1, 1, 1)
        h = h * keep.view(-1, 1, 1)
        if grad_mode == "step":
            W, h = W.detach(), h.detach()
        s = torch.tanh(h)
        q = apply_feature_map(feature_map, xq[t] + torch.einsum("hij,bhj->bhi", Rq, s))
        k = apply_feature_map(feature_map, xk[t] + torch.einsum("hij,bhj->bhi", Rk, s))
        v = xv[t] + torch.einsum("hij,bhj->bhi", Rv, s)
        beta = torch.sigmoid(xb[t] + torch.einsum("hj,bhj->bh", rb, s)).unsqueeze(-1)
        vbar = torch.einsum("bhvk,bhk->bhv", W, k)
        W = W + torch.einsum("bhv,bhk->bhvk", beta * (v - vbar), k)
        h = torch.einsum("bhvk,bhk->bhv", W, q)
        ys.append(h)
    return torch.stack(ys), W, h
