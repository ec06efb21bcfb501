"""Reference sum rule (Linear Transformer) and delta rule (Delta Net), per step.

Paper 001: Linear Transformer as a fast weight programmer (sum rule, Eq. 20-21
with the read after the update) and the delta rule (Eq. 23-25):

    vbar_t = W_{t-1} phi(k_t)
    W_t    = W_{t-1} + sigma(beta_t) (v_t - vbar_t) phi(k_t)^T      (delta)
    W_t    = W_{t-1} + v_t phi(k_t)^T                               (sum)
    y_t    = W_t phi(q_t)

Shapes: q, k [T, B, H, Dk]; v [T, B, H, Dv]; beta [T, B, H] (pre-sigmoid;
unused by the sum rule); W [B, H, Dv, Dk]; reset [T, B] bool: rows with
reset[t] start step t from W = 0.

``grad_mode``: ``full`` back-propagates through W across the sequence;
``step`` cuts the gradient through the carried W at every step (the original
authors' RL code ran one step at a time with a detached state).
"""

from __future__ import annotations

import torch
from torch import Tensor

from fwrl.kernels.feature_maps import apply_feature_map


def delta_rule_reference(
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
) -> tuple[Tensor, Tensor]:
    """Run the fast-weight recurrence over T steps; returns (y [T,B,H,Dv], W_T)."""
    q = apply_feature_map(feature_map, q)
    k = apply_feature_map(feature_map, k)
    W = W0
    ys = []
    for t in range(q.shape[0]):
        keep = (~reset[t]).to(W.dtype).view(-1, 1, 1, 1)
        W = W * keep
        if grad_mode == "step":
            W = W.detach()
        if rule == "delta":
            vbar = torch.einsum("bhvk,bhk->bhv", W, k[t])
            b = torch.sigmoid(beta[t]).unsqueeze(-1)
            W = W + torch.einsum("bhv,bhk->bhvk", b * (v[t] - vbar), k[t])
        elif rule == "sum":
            W = W + torch.einsum("bhv,bhk->bhvk", v[t], k[t])
        else:
            raise ValueError(f"unknown rule {rule!r}; valid: delta, sum")
        ys.append(torch.einsum("bhvk,bhk->bhv", W, q[t]))
    return torch.stack(ys), W
