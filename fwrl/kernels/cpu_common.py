"""What the rules' CPU paths share (``fwrl/kernels/<rule>/cpu.py``), importing none of the rules.

The CPU paths run the maths of each rule's ``naive.py`` in fewer, larger torch calls per step: the
recurrent matrices of all batch rows and heads as one batch of ``N = B x H`` matrices, matrix-vector
products as a batch of row vectors times the transposed matrices (:func:`rows_times`: torch's CPU
``bmm`` takes that form to its batched GEMM, where a matrix times a column vector runs a loop of small
GEMMs, 3-7x slower at 32 x 32), reads that share a matrix in one product, slices taken with ``split``
and ``unbind`` (autograd's backward of those is one concatenation, where a slice or an index writes a
zero tensor of the whole input per use), and the episode resets applied only at the steps that have
one (read on the host once per call: these paths do not belong in a CUDA graph).

Where a rule's gradient is left to autograd, its backward runs in autograd's C++ engine, off the GIL
that the acting thread needs.
"""

from __future__ import annotations

import torch
from torch import Tensor


def reset_steps(reset: Tensor) -> set[int]:
    """The steps at which some row of ``reset`` [T, B] starts a new episode (one host read)."""
    return set(reset.any(dim=1).nonzero().flatten().tolist())


def keep_rows(state: Tensor, reset_t: Tensor) -> Tensor:
    """``state`` [B, ...] with the rows where ``reset_t`` [B] is true zeroed (out of place)."""
    return state * (~reset_t).to(state.dtype).view(-1, *([1] * (state.dim() - 1)))


def rows_times(x: Tensor, M: Tensor) -> Tensor:
    """``x_i^T M`` for each of N rows: x [N, r, a] (r row vectors per matrix), M [N, a, b] -> [N, r, b].
    ``rows_times(x, W.mT)`` is W x for each row of x."""
    return torch.bmm(x, M)


def rank_one_update(W: Tensor, u: Tensor, k: Tensor) -> Tensor:
    """``W + u k^T`` for each of N matrices: W [N, a, b], u [N, a], k [N, b] (one fused call)."""
    return torch.addcmul(W, u.unsqueeze(-1), k.unsqueeze(-2))


def matvec(W: Tensor, x: Tensor, out: Tensor | None = None) -> Tensor:
    """``W x`` for each matrix: W [..., a, b], x [..., b] -> [..., a], as the row vector x^T times W^T
    (the batched GEMM of :func:`rows_times`; ``out`` [..., a] receives it where given)."""
    return torch.matmul(x.unsqueeze(-2), W.mT, out=None if out is None else out.unsqueeze(-2)).squeeze(-2)


def vecmat(x: Tensor, W: Tensor, out: Tensor | None = None) -> Tensor:
    """``W^T x`` for each matrix: x [..., a], W [..., a, b] -> [..., b] (the row vector x^T times W)."""
    return torch.matmul(x.unsqueeze(-2), W, out=None if out is None else out.unsqueeze(-2)).squeeze(-2)
