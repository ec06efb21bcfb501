"""The self-referential weight matrix on the CPU: the recurrence of ``naive`` in fewer, larger calls.

Paper 002 Eq. 5-8 with App. A's four learning rates, exactly as ``naive.srwm_reference``; only the
way the calls are made differs (``fwrl.kernels.cpu_common``): per step, the stacked matrix
``W_{t-1} = W_slow + offset`` of every batch row and head is read once with phi(x_t) (Eq. 5: y, q,
k, b in one product), then once with q and k together (Eq. 6-7), the four rates spread over the
rows by one index, and the update of Eq. 8 is one fused call. Every step's keys come from the matrix
itself, so no chunked form applies: the gradient is autograd's through these calls (its C++
engine, off the GIL). Without autograd (acting) the same loop keeps nothing for a backward.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fwrl.kernels.cpu_common import keep_rows, rank_one_update, reset_steps, rows_times
from fwrl.kernels.feature_maps import apply_feature_map

from .naive import Offsets, check_srwm_args, rate_index


def srwm_cpu(
    x: Tensor,
    W_y: Tensor,
    W_q: Tensor,
    W_k: Tensor,
    w_b: Tensor,
    offsets: Offsets,
    reset: Tensor,
    *,
    input_map: str = "softmax",
    grad_mode: str = "full",
) -> tuple[Tensor, Offsets]:
    """The SRWM recurrence of ``naive.srwm_reference`` (same arguments and results, to round-off)."""
    check_srwm_args(input_map, grad_mode)
    T, B, H, D = x.shape
    slow = (W_y, W_q, W_k, w_b)
    rows = tuple(w.shape[1] for w in slow)
    Dy, R = rows[0], sum(rows)
    N = B * H
    W_slow = torch.cat(slow, dim=1)  # [H, R, D]
    offset = torch.cat(tuple(offsets), dim=2).reshape(N, R, D)  # [N, R, D]
    row_rate = rate_index(rows, W_slow.device)
    phi_x = apply_feature_map(input_map, x).reshape(T, N, 1, D)
    resets = reset_steps(reset)
    ys = []
    for t in range(T):
        if t in resets:
            offset = keep_rows(offset.view(B, H * R, D), reset[t]).view(N, R, D)
        if grad_mode == "step":
            offset = offset.detach()
        W = (W_slow + offset.view(B, H, R, D)).view(N, R, D)  # W_{t-1}
        y, qk, b = rows_times(phi_x[t], W.mT).view(N, R).split([Dy, 2 * D, 4], dim=-1)  # Eq. 5
        qk = torch.softmax(qk.reshape(N, 2, D), dim=-1)
        v_q, v_k = rows_times(qk, W.mT).unbind(1)  # Eq. 7 / 10 and Eq. 6 / 9: [N, R] each
        rate = torch.sigmoid(b).index_select(-1, row_rate)  # [N, R]: each row's own rate (App. A)
        offset = rank_one_update(offset, rate * (v_q - v_k), qk[:, 1])  # Eq. 8 / 11
        ys.append(y)
    y = torch.stack(ys).view(T, B, H, Dy)
    return y, tuple(offset.view(B, H, R, D).split(rows, dim=2))
