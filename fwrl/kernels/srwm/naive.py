"""Reference recurrence of the self-referential weight matrix (SRWM), per step.

Paper 002 (Irie et al. 2022), Sec. 3 and App. A, multi-head with four
self-invented learning rates. Per head, the SRWM is split into sub-matrices
``W = [W^y; W^q; W^k; W^b]`` (rows: Dy, D, D, 4; columns: D) and at step t:

    y_t, q_t, k_t, b_t = W_{t-1} phi(x_t)                      (Eq. 5)
    q_t <- softmax(q_t), k_t <- softmax(k_t), beta_t = sigmoid(b_t) in R^4
    for M in (y, q, k, b), with its own rate beta_{M,t}:
        M^k_t = W^M_{t-1} k_t                                  (Eq. 6 / Eq. 9)
        M^q_t = W^M_{t-1} q_t                                  (Eq. 7 / Eq. 10)
        W^M_t = W^M_{t-1} + beta_{M,t} (M^q_t - M^k_t) k_t^T   (Eq. 8 / Eq. 11)

The output ``y_t`` is read with the pre-update weights ``W_{t-1}`` (Eq. 5),
and every read (Eq. 5-7) happens before any write (Eq. 8). ``phi`` on the
input is softmax in the RL experiments and the identity in the supervised
ones (App. B, "Sequence processing components").

Only the initial matrices (the slow weights) are trained; the recurrent state
is the offset ``W_t - W_slow`` per sub-matrix, so a reset (``reset[t]``: row
starts a new episode at step t) zeroes the offsets and the row continues from
the slow weights.

Shapes: x [T, B, H, D]; W_y [H, Dy, D], W_q [H, D, D], W_k [H, D, D],
w_b [H, 4, D]; offsets (O_y, O_q, O_k, O_b), each [B, H, rows, D];
reset [T, B] bool. Returns y [T, B, H, Dy] and the final offsets.

``grad_mode``: ``full`` back-propagates through the offsets across the whole
sequence; ``step`` cuts the gradient through the carried offsets at every
step (as the authors' RL code did), so the slow weights only get the gradient
of each step's own computation.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fwrl.errors import unknown_choice
from fwrl.kernels import check_grad_mode
from fwrl.kernels.feature_maps import apply_feature_map

INPUT_MAPS = ("softmax", "identity")
NUM_RATES = 4  # one learning rate per sub-matrix y, q, k, b (App. A)

Offsets = tuple[Tensor, Tensor, Tensor, Tensor]


def check_srwm_args(input_map: str, grad_mode: str) -> None:
    if input_map not in INPUT_MAPS:
        raise unknown_choice("SRWM input map", input_map, INPUT_MAPS)
    check_grad_mode(grad_mode)


def rate_index(rows: tuple[int, int, int, int], device=None) -> Tensor:
    """For each row of the stacked W, which of the four learning rates updates it (filled on the
    device: no upload, no host sync, so a CUDA graph can capture it)."""
    return torch.cat([torch.full((size,), rate, dtype=torch.long, device=device) for rate, size in enumerate(rows)])


def srwm_step(
    x_t: Tensor, W: Tensor, rows: tuple[int, int, int, int], row_rate: Tensor
) -> tuple[Tensor, Tensor]:
    """One SRWM step (Eq. 5-8 with App. A's four rates) on an already mapped input.

    x_t = phi(x_t) [B, H, D]; W = W_{t-1} [B, H, R, D], the sub-matrices
    [W^y; W^q; W^k; W^b] stacked along the rows (R = Dy + 2D + 4, sizes in
    ``rows``); ``row_rate`` = ``rate_index(rows)``. Returns y_t [B, H, Dy]
    (read with W_{t-1}) and the update W_t - W_{t-1}.
    """
    y, q, k, b = (W @ x_t.unsqueeze(-1)).squeeze(-1).split(rows, dim=-1)  # Eq. 5
    q = torch.softmax(q, dim=-1)
    k = torch.softmax(k, dim=-1)
    beta = torch.sigmoid(b)  # [B, H, 4]: one rate per sub-matrix (App. A)
    v_q, v_k = (W @ torch.stack([q, k], dim=-1)).unbind(-1)  # Eq. 7 / 10 and Eq. 6 / 9
    rate = beta.index_select(-1, row_rate)  # [B, H, R]
    delta = (rate * (v_q - v_k)).unsqueeze(-1) * k.unsqueeze(-2)  # Eq. 8 / 11, per row block
    return y, delta


def srwm_reference(
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
    """Run the SRWM over T steps; returns (y [T, B, H, Dy], final offsets)."""
    check_srwm_args(input_map, grad_mode)
    slow = (W_y, W_q, W_k, w_b)
    rows = tuple(w.shape[1] for w in slow)
    W_slow = torch.cat(slow, dim=1)  # [H, R, D]
    offset = torch.cat(tuple(offsets), dim=2)  # [B, H, R, D]
    row_rate = rate_index(rows, W_slow.device)
    phi_x = apply_feature_map(input_map, x)
    ys = []
    for t in range(x.shape[0]):
        offset = offset * (~reset[t]).to(offset.dtype).view(-1, 1, 1, 1)
        if grad_mode == "step":
            offset = offset.detach()
        y, delta = srwm_step(phi_x[t], W_slow + offset, rows, row_rate)
        offset = offset + delta
        ys.append(y)
    return torch.stack(ys), tuple(offset.split(rows, dim=2))
