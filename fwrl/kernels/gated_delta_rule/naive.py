"""Reference gated delta rule (Gated DeltaNet), per step.

Yang, Kautz & Hatamizadeh, "Gated Delta Networks: Improving Mamba2 with Delta Rule", ICLR 2025
(arXiv 2412.06464; PAPERS.md §7), Eq. 10: the fast-weight matrix is decayed by a gate
``alpha_t = exp(g_t)`` in (0, 1] before each delta-rule write,

    S_t = alpha_t S_{t-1} (I - b_t k_t k_t^T) + b_t v_t k_t^T
        = A_t + b_t (v_t - A_t k_t) k_t^T,     A_t = alpha_t S_{t-1}
    y_t = S_t q_t                                (read after the write, as fwrl's delta rule)

with ``k_t = phi(k_t)``, ``q_t = phi(q_t)`` (``l2norm`` in the paper, Sec. 3.4) and
``b_t = sigmoid(beta_t)``. ``g_t = log alpha_t`` is the gate in log space, as the authors' code
takes it (``-exp(A_log) softplus(W_a x_t + dt_bias)``, Mamba2's parameterisation, formed by the
layer); ``g_t = 0`` for every t gives the delta rule of paper 001 (Eq. 23-25) exactly.

Shapes: q, k [T, B, H, Dk]; v [T, B, H, Dv]; beta and g [T, B, H] (beta pre-sigmoid, g <= 0);
S [B, H, Dv, Dk]; reset [T, B] bool: rows with reset[t] start step t from S = 0 (so its decay
acts on zero).

``grad_mode``: ``full`` back-propagates through S across the sequence; ``step`` cuts the gradient
through the carried S at every step (after the reset, before the decay: g_t still gets the gradient
of its own step, as sigmoid(beta_t) does).
"""

from __future__ import annotations

import torch
from torch import Tensor

from fwrl.kernels.feature_maps import apply_feature_map


def gated_delta_rule_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    g: Tensor,
    S0: Tensor,
    reset: Tensor,
    *,
    feature_map: str = "l2norm",
    grad_mode: str = "full",
) -> tuple[Tensor, Tensor]:
    """Run the gated delta rule over T steps; returns (y [T,B,H,Dv], S_T)."""
    q = apply_feature_map(feature_map, q)
    k = apply_feature_map(feature_map, k)
    S = S0
    ys = []
    for t in range(q.shape[0]):
        keep = (~reset[t]).to(S.dtype).view(-1, 1, 1, 1)
        S = S * keep
        if grad_mode == "step":
            S = S.detach()
        S = torch.exp(g[t]).view(*g.shape[1:], 1, 1) * S  # A_t = alpha_t S_{t-1}
        vbar = torch.einsum("bhvk,bhk->bhv", S, k[t])
        b = torch.sigmoid(beta[t]).unsqueeze(-1)
        S = S + torch.einsum("bhv,bhk->bhvk", b * (v[t] - vbar), k[t])
        ys.append(torch.einsum("bhvk,bhk->bhv", S, q[t]))
    return torch.stack(ys), S
