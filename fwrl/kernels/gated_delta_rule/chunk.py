"""The gated delta rule in chunked form: a chunk of up to 64 steps in a few matrix products.

The maths is ``naive`` (Gated DeltaNet, Yang et al. 2025, Eq. 10); the form is the paper's
extended WY representation (Sec. 3.3 and App. A), the delta rule's chunked form
(``fwrl.kernels.delta_rule.chunk``) with the decays of the steps between two rows of a chunk
written into its masks, and episode resets as a block-diagonal mask.

Within a chunk of C steps of one matrix (rows: steps; ``K``, ``Q`` [C, Dk] hold phi(k_t), phi(q_t),
``V`` [C, Dv], ``b`` = sigmoid(beta) [C], ``G_t = g_1 + ... + g_t`` the cumulative log-decay from the
chunk's start), the update is ``S_t = alpha_t S_{t-1} + u_t k_t^T`` with
``u_t = b_t (v_t - alpha_t S_{t-1} k_t)``, so ``S_t = e^{G_t} S_0 + sum_{j <= t} e^{G_t - G_j} u_j k_j^T`` and,
with ``D_tj = e^{G_t - G_j}`` for j <= t (0 above the diagonal) and ``e = e^{G}`` [C]:

    u_t = b_t (v_t - e_t S_0 k_t - sum_{j < t} D_tj (k_j . k_t) u_j)
    =>  (I + tril(diag(b) (D * K K^T), -1)) U = diag(b) (V - diag(e) K S_0^T)   (one unit-triangular solve)
    Y   = diag(e) Q S_0^T + (D * Q K^T) U                                     (y_t = S_t q_t)
    S_C = e_C S_0 + (diag(D_C.) U)^T K

``D`` is formed as ``exp`` of the masked differences of G (never a ratio of decays, which would
underflow over a chunk of strong gates). An episode that starts at step s of the chunk (``reset[s]``)
cuts the chunk into segments: ``D`` is zero between steps of different segments, and ``S_0`` reaches
only the steps before the first reset (a reset row starts from S = 0, whose decay is zero). Longer
sequences run chunk after chunk, carrying S.

Everything is differentiated by autograd, so it serves ``grad_mode`` ``full``; ``step`` cuts the
gradient through S at every step, which no chunk-wide product can express (``cpu.py`` runs it step
by step with its own backward). Agrees with the reference to round-off (float64: ~1e-15).
"""

from __future__ import annotations

import torch
from torch import Tensor

CHUNK = 64  # steps per chunk: [C, C] masks and products per matrix


def _chunk(q: Tensor, k: Tensor, v: Tensor, b: Tensor, g: Tensor, S0: Tensor, reset: Tensor
           ) -> tuple[Tensor, Tensor]:
    """One chunk. q, k [B, H, C, Dk] (mapped), v [B, H, C, Dv], b [B, H, C, 1], g [B, H, C],
    S0 [B, H, Dv, Dk], reset [C, B]; returns Y [B, H, C, Dv] and S_C."""
    B, H, C = q.shape[:3]
    segment = reset.t().cumsum(-1)  # [B, C]: the episode segment of each step within the chunk
    same = (segment.unsqueeze(-1) == segment.unsqueeze(-2)).unsqueeze(1)  # [B, 1, C, C]
    lower = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    G = g.cumsum(-1)  # [B, H, C]
    # D_tj = exp(G_t - G_j) on and below the diagonal within a segment, 0 elsewhere (masked before exp)
    D = (G.unsqueeze(-1) - G.unsqueeze(-2)).masked_fill(~(same & lower), float("-inf")).exp()
    from_S0 = G.exp().unsqueeze(-1) * (segment == 0).to(q.dtype).view(B, 1, C, 1)  # e_t, 0 after a reset
    S0_T = S0.transpose(-1, -2)
    A = (k @ k.transpose(-1, -2) * D).tril(-1) * b  # the solve reads a unit diagonal
    U = torch.linalg.solve_triangular(A, b * (v - from_S0 * (k @ S0_T)), upper=False, unitriangular=True)
    Y = (q @ k.transpose(-1, -2) * D) @ U + from_S0 * (q @ S0_T)
    in_last = segment == segment[:, -1:]  # [B, C]
    to_end = (G[..., -1:] - G).masked_fill(~in_last.unsqueeze(1), float("-inf")).exp()  # D_Cj [B, H, C]
    S0_kept = G[..., -1].exp().view(B, H, 1, 1) * (segment[:, -1] == 0).to(q.dtype).view(B, 1, 1, 1)
    SC = S0_kept * S0 + (to_end.unsqueeze(-1) * U).transpose(-1, -2) @ k
    return Y, SC


def gated_delta_rule_chunked(q: Tensor, k: Tensor, v: Tensor, b: Tensor, g: Tensor, S0: Tensor,
                             reset: Tensor) -> tuple[Tensor, Tensor]:
    """The gated delta rule over T steps, chunk by chunk. q, k [T, B, H, Dk] mapped by phi,
    v [T, B, H, Dv], b = sigmoid(beta) and g (log-decays) [T, B, H], S0 [B, H, Dv, Dk], reset [T, B];
    returns y [T, B, H, Dv] and S_T (grad_mode full)."""
    T = q.shape[0]
    heads = lambda x: x.permute(1, 2, 0, 3)  # noqa: E731  [T, B, H, D] -> [B, H, T, D]
    q, k, v = heads(q), heads(k), heads(v)
    b = b.permute(1, 2, 0).unsqueeze(-1)
    g = g.permute(1, 2, 0)
    S, ys = S0, []
    for start in range(0, T, CHUNK):
        end = min(start + CHUNK, T)
        y, S = _chunk(q[:, :, start:end], k[:, :, start:end], v[:, :, start:end], b[:, :, start:end],
                      g[:, :, start:end], S, reset[start:end])
        ys.append(y)
    y = ys[0] if len(ys) == 1 else torch.cat(ys, dim=2)
    return y.permute(2, 0, 1, 3), S
