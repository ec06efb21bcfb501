"""The Delta RNN on the CPU: the recurrence of ``naive`` in fewer, larger calls per step.

Paper 000 Eq. 12, exactly as ``naive.delta_rnn_reference``; only the way the calls are made differs
(``fwrl.kernels.cpu_common``). phi(q), phi(k), softmax(k_r), the rates and ``k_t . q_t`` are taken for
all steps at once; per step each fast matrix is read once with its key and query together (``W k``,
``W q``; ``R k_r``, ``R f(y_{t-1})``), the reads after the writes are ``M_t x = M_{t-1} x +
u_t (k_t . x)``, and each write is one fused call. The recurrent query f(y_{t-1}) makes every step
depend on the last: the gradient is autograd's through these calls (its C++ engine, off the GIL).
"""

from __future__ import annotations

import torch
from torch import Tensor

from fwrl.kernels import check_grad_mode
from fwrl.kernels.cpu_common import keep_rows, rank_one_update, reset_steps, rows_times
from fwrl.kernels.feature_maps import apply_feature_map, recurrent_softmax


def delta_rnn_cpu(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor,
    kr: Tensor, vr: Tensor, betar: Tensor,
    W0: Tensor, R0: Tensor, h0: Tensor, reset: Tensor,
    *,
    feature_map: str = "softmax",
    grad_mode: str = "full",
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The Delta RNN of ``naive.delta_rnn_reference`` (same arguments and results, to round-off)."""
    check_grad_mode(grad_mode)
    T, B, H, d = q.shape
    F = W0.shape[-1]
    N = B * H
    qk = torch.stack([apply_feature_map(feature_map, q), apply_feature_map(feature_map, k)], dim=3)
    qk = qk.reshape(T, N, 2, F)  # phi(q_t), phi(k_t) of every step
    kq = (qk[:, :, 0] * qk[:, :, 1]).sum(-1, keepdim=True)  # k_t . q_t: W_t q_t = W_{t-1} q_t + u_t (k_t . q_t)
    kr = torch.softmax(kr, dim=-1).reshape(T, N, d)
    b, br = torch.sigmoid(beta).reshape(T, N, 1), torch.sigmoid(betar).reshape(T, N, 1)
    v, vr = v.reshape(T, N, d), vr.reshape(T, N, d)
    resets = reset_steps(reset)
    W, R, h = W0.reshape(N, d, F), R0.reshape(N, d, d), h0.reshape(N, d)
    ys = []
    for t in range(T):
        if t in resets:
            W = keep_rows(W.view(B, H * d, F), reset[t]).view(N, d, F)
            R = keep_rows(R.view(B, H * d, d), reset[t]).view(N, d, d)
            h = keep_rows(h.view(B, H * d), reset[t]).view(N, d)
        if grad_mode == "step":
            W, R, h = W.detach(), R.detach(), h.detach()
        Wq, Wk = rows_times(qk[t], W.mT).unbind(1)
        u = b[t] * (v[t] - Wk)
        W = rank_one_update(W, u, qk[t, :, 1])
        r = recurrent_softmax(h)  # f(y_{t-1})
        Rk, Rr = rows_times(torch.stack([kr[t], r], dim=1), R.mT).unbind(1)
        ur = br[t] * (vr[t] - Rk)
        R = rank_one_update(R, ur, kr[t])
        h = torch.addcmul(Wq, u, kq[t]) + torch.addcmul(Rr, ur, (kr[t] * r).sum(-1, keepdim=True))  # Eq. 12
        ys.append(h)
    y = torch.stack(ys).view(T, B, H, d)
    return y, W.view(B, H, d, F), R.view(B, H, d, d), h.view(B, H, d)
