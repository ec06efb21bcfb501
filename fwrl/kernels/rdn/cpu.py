"""The Recurrent Delta Net on the CPU: the recurrence of ``naive`` in a dozen batched calls per step.

Paper 000 (RFWP) Eq. 15-18, then the delta rule of paper 001 (Eq. 20-25), exactly as
``naive.rdn_reference``; only the way the calls are made differs (``fwrl.kernels.cpu_common``):

- the four recurrent projections ``R_q s, R_k s, R_v s, r_b . s`` are one batched product per step
  (the slow weights stacked into ``[H, d, 3d + 1]``, every batch row at once), added to the slow
  net's part ``[x_q | x_k | x_v | x_b]`` of that step (concatenated once per call);
- ``W_{t-1} q_t`` and ``W_{t-1} k_t`` are one product; the read after the write is
  ``h_t = W_t q_t = W_{t-1} q_t + u_t (k_t . q_t)`` with ``u_t = beta_t (v_t - W_{t-1} k_t)``, and
  the write ``W_t = W_{t-1} + u_t k_t^T`` one fused call;
- phi maps q and k together; slices are ``split`` / ``unbind`` views.

Every step depends on the last through ``h`` (the queries, keys, values and rates read
``tanh(h_{t-1})``), so no chunked form applies: the gradient is autograd's through these calls
(its C++ engine, off the GIL). Without autograd (acting) the same loop keeps nothing for a backward.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fwrl.kernels import check_grad_mode
from fwrl.kernels.cpu_common import keep_rows, rank_one_update, reset_steps, rows_times
from fwrl.kernels.feature_maps import apply_feature_map


def rdn_cpu(
    xq: Tensor, xk: Tensor, xv: Tensor, xb: Tensor,
    Rq: Tensor, Rk: Tensor, Rv: Tensor, rb: Tensor,
    W0: Tensor, h0: Tensor, reset: Tensor,
    *,
    feature_map: str = "softmax",
    grad_mode: str = "full",
) -> tuple[Tensor, Tensor, Tensor]:
    """The RDN recurrence of ``naive.rdn_reference`` (same arguments and results, to round-off)."""
    check_grad_mode(grad_mode)
    T, B, H, d = xq.shape
    F = W0.shape[-1]
    N = B * H
    x = torch.cat([xq, xk, xv, xb.unsqueeze(-1)], dim=-1)  # [T, B, H, 3d + 1]: the slow net's part
    R = torch.cat([Rq, Rk, Rv, rb.unsqueeze(1)], dim=1).mT  # [H, d, 3d + 1]: s -> R s for each head
    resets = reset_steps(reset)
    W, h = W0.reshape(N, d, F), h0
    ys = []
    for t in range(T):
        if t in resets:
            W = keep_rows(W.view(B, H * d, F), reset[t]).view(N, d, F)
            h = keep_rows(h, reset[t])
        if grad_mode == "step":
            W, h = W.detach(), h.detach()
        s = torch.tanh(h)  # [B, H, d]
        a = x[t] + rows_times(s.transpose(0, 1), R).transpose(0, 1)  # Eq. 15-18 before phi, sigmoid
        qk, v, b = a.reshape(N, 3 * d + 1).split([2 * d, d, 1], dim=-1)
        qk = apply_feature_map(feature_map, qk.reshape(N, 2, d))  # [N, 2, F]: phi(q), phi(k)
        Wq, Wk = rows_times(qk, W.mT).unbind(1)
        q, k = qk.unbind(1)
        u = torch.sigmoid(b) * (v - Wk)
        h = torch.addcmul(Wq, u, (q * k).sum(-1, keepdim=True)).view(B, H, d)  # W_t q_t
        W = rank_one_update(W, u, k)
        ys.append(h)
    return torch.stack(ys), W.view(B, H, d, F), h
