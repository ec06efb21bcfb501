"""The Delta LSTM on the CPU: the recurrence of ``naive`` in fewer, larger calls per step.

Paper 000 App. A.2 version D (Eq. 36-40), exactly as ``naive.delta_lstm_reference``; only the way the
calls are made differs (``fwrl.kernels.cpu_common``): the six fast matrices of every batch row and
head are one batch, read once per step with their keys and queries together (q_t for W_u, W_f, W_o;
r_t = f(y_{t-1}) for R_u, R_f, R_o), the reads after the writes are ``M_t x = M_{t-1} x + u_t (k_t . x)``,
the six writes one fused call, the gates from one ``unbind`` of the reads, and Eq. 39 one ``lerp``.
The recurrent query makes every step depend on the last: the gradient is autograd's through these
calls (its C++ engine, off the GIL).
"""

from __future__ import annotations

import torch
from torch import Tensor

from fwrl.kernels import check_grad_mode
from fwrl.kernels.cpu_common import keep_rows, rank_one_update, reset_steps, rows_times
from fwrl.kernels.feature_maps import recurrent_softmax


def delta_lstm_cpu(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor,
    W0: Tensor, c0: Tensor, y0: Tensor, reset: Tensor,
    *,
    grad_mode: str = "full",
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The Delta LSTM of ``naive.delta_lstm_reference`` (same arguments and results, to round-off)."""
    check_grad_mode(grad_mode)
    T, B, H, d = q.shape
    M = W0.shape[2]  # the six matrices
    N = B * H * M
    q = torch.softmax(q, dim=-1)
    k = torch.softmax(k, dim=-1).reshape(T, N, d)
    v = v.reshape(T, N, d)
    b = torch.sigmoid(beta).reshape(T, N, 1)
    resets = reset_steps(reset)
    W, c, y = W0.reshape(N, d, d), c0, y0
    ys = []
    for t in range(T):
        if t in resets:
            W = keep_rows(W.view(B, H * M * d, d), reset[t]).view(N, d, d)
            c, y = keep_rows(c, reset[t]), keep_rows(y, reset[t])
        if grad_mode == "step":
            W, c, y = W.detach(), c.detach(), y.detach()
        r = recurrent_softmax(y)
        queries = torch.stack([q[t]] * 3 + [r] * 3, dim=2).reshape(N, d)
        Mk, Mx = rows_times(torch.stack([k[t], queries], dim=1), W.mT).unbind(1)
        u = b[t] * (v[t] - Mk)
        W = rank_one_update(W, u, k[t])
        read = torch.addcmul(Mx, u, (k[t] * queries).sum(-1, keepdim=True)).view(B, H, M, d)
        Wu, Wf, Wo, Ru, Rf, Ro = read.unbind(2)
        f = torch.sigmoid(Wf + Rf)  # Eq. 37
        c = torch.lerp(Wu + Ru, c, f)  # Eq. 36, 39: f c_{t-1} + (1 - f) u_t
        y = c * torch.sigmoid(Wo + Ro)  # Eq. 38, 40
        ys.append(y)
    return torch.stack(ys), W.view(B, H, M, d, d), c, y
