"""Reference recurrence of the Delta LSTM (a fast LSTM), one step at a time.

Paper 000 (RFWP), App. A.2, version D (Eq. 36-40), the version the paper
reports: six fast matrices, each written by its own delta rule (paper 001
Eq. 20-24) with its own key, value and learning rate from the slow net, and
tied input/forget gates::

    r_t = f(y_{t-1})                                   f = softmax (+1e-6, as Delta RNN)
    u_t = W_t   q_t + R_t   r_t                        (Eq. 36, no squashing)
    f_t = sigmoid(W_f,t q_t + R_f,t r_t)               (Eq. 37)
    o_t = sigmoid(W_o,t q_t + R_o,t r_t)               (Eq. 38)
    c_t = f_t * c_{t-1} + (1 - f_t) * u_t              (Eq. 39)
    y_t = c_t * o_t                                    (Eq. 40)

Every matrix M is updated before it is read (as in Eq. 12):
``M_t = M_{t-1} + sigmoid(beta_M) (v_M - M_{t-1} softmax(k_M)) softmax(k_M)^T``.
The query q_t is softmax(q_t); all keys go through softmax so that they match
the (softmax) queries they are read with.

The six matrices are stacked on one axis in the order
``MATRICES = (W_u, W_f, W_o, R_u, R_f, R_o)``: the first three are read with
q_t, the last three with r_t.

Shapes: q [T, B, H, d]; k, v [T, B, H, 6, d]; beta [T, B, H, 6] (pre-sigmoid);
W0 [B, H, 6, d, d]; c0, y0 [B, H, d]; reset [T, B] bool (rows with reset[t]
start step t from all-zero matrices, c = 0, y = 0).
Returns (y [T, B, H, d], W_T, c_T, y_T).

``grad_mode``: ``full`` back-propagates through (W, c, y) across the
sequence; ``step`` detaches them at the start of every step.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fwrl.kernels import GRAD_MODES
from fwrl.kernels.feature_maps import recurrent_softmax

MATRICES = ("W_u", "W_f", "W_o", "R_u", "R_f", "R_o")


def delta_lstm_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    W0: Tensor,
    c0: Tensor,
    y0: Tensor,
    reset: Tensor,
    *,
    grad_mode: str = "full",
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Run the Delta LSTM recurrence over T steps; returns (y, W_T, c_T, y_T)."""
    if grad_mode not in GRAD_MODES:
        raise ValueError(f"unknown grad_mode {grad_mode!r}; valid: {', '.join(GRAD_MODES)}")
    q = torch.softmax(q, dim=-1)
    k = torch.softmax(k, dim=-1)
    W, c, y = W0, c0, y0
    ys = []
    for t in range(q.shape[0]):
        keep = (~reset[t]).to(W.dtype)
        W = W * keep.view(-1, 1, 1, 1, 1)
        c = c * keep.view(-1, 1, 1)
        y = y * keep.view(-1, 1, 1)
        if grad_mode == "step":
            W, c, y = W.detach(), c.detach(), y.detach()
        b = torch.sigmoid(beta[t]).unsqueeze(-1)
        vbar = torch.einsum("bhmvk,bhmk->bhmv", W, k[t])
        W = W + torch.einsum("bhmv,bhmk->bhmvk", b * (v[t] - vbar), k[t])
        r = recurrent_softmax(y)
        queries = torch.stack([q[t]] * 3 + [r] * 3, dim=2)
        read = torch.einsum("bhmvk,bhmk->bhmv", W, queries)
        u = read[:, :, 0] + read[:, :, 3]
        f = torch.sigmoid(read[:, :, 1] + read[:, :, 4])
        o = torch.sigmoid(read[:, :, 2] + read[:, :, 5])
        c = f * c + (1 - f) * u
        y = c * o
        ys.append(y)
    return torch.stack(ys), W, c, y
