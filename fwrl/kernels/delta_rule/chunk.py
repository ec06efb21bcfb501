"""The sum / delta rule in chunked form: a chunk of up to 64 steps in a few matrix products.

The maths is ``naive`` (paper 001 Eq. 20-25); the form is the WY representation of the delta
rule's products of Householder-like factors (Bischof & Van Loan 1987), as Yang et al. 2024
("Parallelizing Linear Transformers with the Delta Rule over Sequence Length", NeurIPS) use it
for chunked Delta Net training, with episode resets as a block-diagonal mask.

Within a chunk of C steps of one matrix (rows: steps; ``K``, ``Q`` [C, Dk] hold phi(k_t), phi(q_t),
``V`` [C, Dv], ``b`` = sigmoid(beta) [C]), the delta rule's update is ``W_t = W_{t-1} + u_t k_t^T``
with ``u_t = b_t (v_t - W_{t-1} k_t)``, so ``W_t = W_0 + sum_{j <= t} u_j k_j^T`` and

    u_t = b_t (v_t - W_0 k_t - sum_{j < t} (k_j . k_t) u_j)
    =>  (I + tril(diag(b) K K^T, -1)) U = diag(b) (V - K W_0^T)     (one unit-triangular solve)
    Y   = Q W_0^T + tril(Q K^T) U                                     (y_t = W_t q_t: read after the write)
    W_C = W_0 + U^T K

The sum rule is the same with ``U = V`` and no solve. An episode that starts at step s of the
chunk (``reset[s]``) cuts the chunk into segments: the products between steps of different
segments are masked out, and ``W_0`` reaches only the steps before the first reset (the rows of a
reset start from W = 0). Longer sequences run chunk after chunk, carrying W.

Everything is differentiated by autograd (about 40 torch calls per chunk, forward and backward,
against tens per step for the reference), so it serves ``grad_mode`` ``full``; ``step`` cuts
the gradient through W at every step, which no chunk-wide product can express (``cpu.py`` runs
it step by step). Agrees with the reference to round-off (float64: ~1e-15; the keys of every
feature map but ``identity`` are sum-normalised, so ``|A_ij| < 1`` and the solve is
well-conditioned).
"""

from __future__ import annotations

import torch
from torch import Tensor

CHUNK = 64  # steps per chunk: [C, C] masks and products per matrix


def _chunk(q: Tensor, k: Tensor, v: Tensor, b: Tensor | None, W0: Tensor, reset: Tensor
           ) -> tuple[Tensor, Tensor]:
    """One chunk. q, k [B, H, C, Dk] (mapped), v [B, H, C, Dv], b [B, H, C, 1] or None (sum rule),
    W0 [B, H, Dv, Dk], reset [C, B]; returns Y [B, H, C, Dv] and W_C."""
    B, H, C = q.shape[:3]
    segment = reset.t().cumsum(-1)  # [B, C]: the episode segment of each step within the chunk
    same = (segment.unsqueeze(-1) == segment.unsqueeze(-2)).unsqueeze(1)  # [B, 1, C, C]
    lower = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    starts_from_W0 = (segment == 0).to(q.dtype).view(B, 1, C, 1)
    in_last = (segment == segment[:, -1:]).to(q.dtype).view(B, 1, C, 1)
    W0_T = W0.transpose(-1, -2)
    if b is None:
        U = v
    else:
        strictly = same & lower.logical_xor(torch.eye(C, dtype=torch.bool, device=q.device))
        A = torch.where(strictly, k @ k.transpose(-1, -2), 0.0) * b  # the solve reads a unit diagonal
        U = torch.linalg.solve_triangular(A, b * (v - starts_from_W0 * (k @ W0_T)), upper=False,
                                          unitriangular=True)
    Y = torch.where(same & lower, q @ k.transpose(-1, -2), 0.0) @ U + starts_from_W0 * (q @ W0_T)
    W0_kept = (segment[:, -1] == 0).to(q.dtype).view(B, 1, 1, 1)  # no reset in the chunk
    WC = W0_kept * W0 + (in_last * U).transpose(-1, -2) @ k
    return Y, WC


def delta_rule_chunked(q: Tensor, k: Tensor, v: Tensor, b: Tensor | None, W0: Tensor, reset: Tensor
                       ) -> tuple[Tensor, Tensor]:
    """The sum (``b`` None) or delta rule over T steps, chunk by chunk. q, k [T, B, H, Dk] mapped
    by phi, v [T, B, H, Dv], b = sigmoid(beta) [T, B, H], W0 [B, H, Dv, Dk], reset [T, B];
    returns y [T, B, H, Dv] and W_T (grad_mode full)."""
    T = q.shape[0]
    heads = lambda x: x.permute(1, 2, 0, 3)  # noqa: E731  [T, B, H, D] -> [B, H, T, D]
    q, k, v = heads(q), heads(k), heads(v)
    b = None if b is None else b.permute(1, 2, 0).unsqueeze(-1)
    W, ys = W0, []
    for start in range(0, T, CHUNK):
        end = min(start + CHUNK, T)
        y, W = _chunk(q[:, :, start:end], k[:, :, start:end], v[:, :, start:end],
                      None if b is None else b[:, :, start:end], W, reset[start:end])
        ys.append(y)
    y = ys[0] if len(ys) == 1 else torch.cat(ys, dim=2)
    return y.permute(2, 0, 1, 3), W
