"""Reference recurrence of the Delta RNN (a fast RNN), one step at a time.

Paper 000 (RFWP), Sec. 3.1, Eq. 12 (version B of App. A.2):

    y_t = W_t q_t + R_t f(y_{t-1})

Both fast matrices are written by their own delta rule (paper 001 Eq. 20-24)
with keys, values and learning rates from the slow net:

    W_t = W_{t-1} + sigmoid(beta_t)   (v_t   - W_{t-1} phi(k_t))   phi(k_t)^T
    R_t = R_{t-1} + sigmoid(beta_r,t) (v_r,t - R_{t-1} s(k_r,t))   s(k_r,t)^T
    y_t = W_t phi(q_t) + R_t f(y_{t-1})

s is the softmax and f the softmax with 1e-6 added to its denominator
(``fwrl.kernels.feature_maps.recurrent_softmax``, PAPERS.md §2), so the
recurrent query and keys are positive and sum to (about) one, as the delta rule
needs. With y_0 = 0 the first recurrent query is
uniform. phi (the feature map of q and k) is softmax in the authors' runs.

Shapes: q, k, v, kr, vr [T, B, H, d]; beta, betar [T, B, H] (pre-sigmoid);
W0 [B, H, d, F] (F = feature_dim(phi, d)); R0 [B, H, d, d]; h0 [B, H, d];
reset [T, B] bool (rows with reset[t] start step t from W = R = 0, y = 0).
Returns (y [T, B, H, d], W_T, R_T, h_T).

``grad_mode``: ``full`` back-propagates through (W, R, h) across the
sequence; ``step`` detaches them at the start of every step.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fwrl.kernels import GRAD_MODES
from fwrl.kernels.feature_maps import apply_feature_map, recurrent_softmax


def delta_rnn_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    kr: Tensor,
    vr: Tensor,
    betar: Tensor,
    W0: Tensor,
    R0: Tensor,
    h0: Tensor,
    reset: Tensor,
    *,
    feature_map: str = "softmax",
    grad_mode: str = "full",
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Run the Delta RNN recurrence over T steps; returns (y, W_T, R_T, h_T)."""
    if grad_mode not in GRAD_MODES:
        raise ValueError(f"unknown grad_mode {grad_mode!r}; valid: {', '.join(GRAD_MODES)}")
    q = apply_feature_map(feature_map, q)
    k = apply_feature_map(feature_map, k)
    kr = torch.softmax(kr, dim=-1)
    W, R, h = W0, R0, h0
    ys = []
    for t in range(q.shape[0]):
        keep = (~reset[t]).to(W.dtype)
        W = W * keep.view(-1, 1, 1, 1)
        R = R * keep.view(-1, 1, 1, 1)
        h = h * keep.view(-1, 1, 1)
        if grad_mode == "step":
            W, R, h = W.detach(), R.detach(), h.detach()
        b = torch.sigmoid(beta[t]).unsqueeze(-1)
        W = W + torch.einsum("bhv,bhk->bhvk", b * (v[t] - torch.einsum("bhvk,bhk->bhv", W, k[t])), k[t])
        br = torch.sigmoid(betar[t]).unsqueeze(-1)
        R = R + torch.einsum("bhv,bhk->bhvk", br * (vr[t] - torch.einsum("bhvk,bhk->bhv", R, kr[t])), kr[t])
        h = torch.einsum("bhvk,bhk->bhv", W, q[t]) + torch.einsum("bhvk,bhk->bhv", R, recurrent_softmax(h))
        ys.append(h)
    return torch.stack(ys), W, R, h
