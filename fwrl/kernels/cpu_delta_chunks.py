"""Delta-rule writes with known keys, chunk-wide, for the CPU paths of the fast RNNs
(``delta_rnn.cpu``, ``delta_lstm.cpu``); imports none of the rules.

In the Delta RNN and the Delta LSTM (paper 000 Eq. 12 and App. A.2 Eq. 36-40) every fast matrix's
keys, values and rates come from the slow net, so the matrices' writes ``M_t = M_in_t + u_t k_t^T``,
``u_t = b_t (v_t - M_in_t k_t)`` (M_in_t: M_{t-1}, zero in the rows that start an episode at t) do
not depend on the recurrence. Per chunk of C <= ``CHUNK`` steps the write vectors come from one
unit-triangular solve in the WY form of ``delta_rule.chunk`` (:func:`write_vectors`):
``(I + tril(diag(b) K K^T, -1)) U = diag(b) (V - K M_0^T)``, the episodes within the chunk a
block-diagonal mask (:class:`Segments`; a chunk without a reset takes none). Then
``M_t = s0_t M_0 + sum_j L[t, j] u_j k_j^T`` (``L[t, j] = [j <= t, same episode]``, ``s0_t`` = [no
reset of the row up to t]), so reads with known queries are chunk-wide (:func:`known_reads`), and
so is M_C (:func:`final_matrices`). :func:`read_backward` (grad mode full) and
:func:`step_read_backward` (grad mode step) are those reads' hand-derived gradients; the rules'
modules give the derivations. Also here: the recurrent query f (:func:`recurrent_query`) and its
Jacobian's factor (:func:`recurrent_query_jacobian`) that both rules read their R matrices with.

The reset steps are read on the host once per call, so these helpers do not belong in a CUDA graph.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from fwrl.kernels.feature_maps import RECURRENT_SOFTMAX_EPS


CHUNK = 64  # steps per triangular solve (as ``delta_rule.chunk``)


def recurrent_query(h: Tensor, ones: Tensor, out: Tensor | None = None) -> Tensor:
    """f(h) of ``feature_maps.recurrent_softmax`` (exp(h - max) / (sum + eps)) in four calls, as
    softmax(h) / (1 + eps max softmax(h)): the largest term of the softmax is 1 / sum exp(h - max).
    ``ones``: [N, 1] ones."""
    s = torch.softmax(h, dim=-1)
    return torch.div(s, torch.add(ones, s.amax(dim=-1, keepdim=True), alpha=RECURRENT_SOFTMAX_EPS),
                     out=out)


def recurrent_query_jacobian(h_in: Tensor, r: Tensor) -> Tensor:
    """z with f'(h_in) = diag(r) - r z^T for r = f(h_in): z = r + eps max(r) e_argmax / #argmax, the
    path through the max the reference subtracts (1 / (sum + eps) = max(r); amax's gradient is
    shared among ties)."""
    top = (h_in == h_in.amax(dim=-1, keepdim=True)).to(r.dtype)
    return torch.addcmul(r, top / top.sum(-1, keepdim=True), r.amax(dim=-1, keepdim=True),
                         value=RECURRENT_SOFTMAX_EPS)


def keep(x: Tensor, reset_t: Tensor) -> Tensor:
    """``x`` [N, ...] (N = B x heads) with the rows of the batch rows where ``reset_t`` [B] is true
    zeroed (out of place)."""
    B = reset_t.shape[0]
    return (x.reshape(B, -1) * (~reset_t).to(x.dtype).view(B, 1)).view(x.shape)


def add_query_gradient(into: Tensor, g: Tensor, r: Tensor, z: Tensor, reset_t: Tensor | None) -> None:
    """In place: ``into += keep_t J^T g`` for the query r = f(h_in) (J = diag(r) - r z^T,
    :func:`recurrent_query_jacobian`), g [N, d] the gradient of r; ``reset_t`` [B] (None where no row
    resets at this step) zeroes the rows whose episode starts here."""
    s = torch.linalg.vecdot(g, r).unsqueeze(-1)
    if reset_t is not None:
        into.add_(keep(torch.addcmul(g * r, s, z, value=-1.0), reset_t))
    else:
        into.addcmul_(g, r).addcmul_(s, z, value=-1.0)


def chunks(T: int, resets: set[int]) -> Iterator[tuple[int, int, set[int]]]:
    """(start, end, the reset steps in it counted from start) for each chunk of ``CHUNK`` steps."""
    for start in range(0, T, CHUNK):
        end = min(start + CHUNK, T)
        yield start, end, {t - start for t in resets if start <= t < end}


class Segments:
    """The episodes within a chunk of ``reset`` [C, B] that has a reset, as masks for the
    [B, heads, ...] views (:meth:`heads`) of [N, ...] tensors (N = B x heads, batch-row major)."""

    def __init__(self, reset: Tensor, dtype: torch.dtype):
        C, self.B = reset.shape
        segment = reset.t().cumsum(-1)  # [B, C]: the episode of each step within the chunk
        same = (segment.unsqueeze(-1) == segment.unsqueeze(-2)).unsqueeze(1)  # [B, 1, C, C]
        lower = torch.ones(C, C, dtype=torch.bool, device=reset.device).tril()
        self.lower = (same & lower).to(dtype)  # L[t, j]: j <= t in the same episode
        self.strictly = (same & lower.tril(-1)).to(dtype)  # and j < t
        self.from_M0 = (segment == 0).to(dtype).view(self.B, 1, C, 1)  # s0_t
        self.in_last = (segment == segment[:, -1:]).to(dtype).view(self.B, 1, C, 1)
        self.M0_kept = (segment[:, -1] == 0).to(dtype).view(self.B, 1, 1, 1)  # s0_C

    def heads(self, x: Tensor) -> Tensor:
        """[N, ...] -> a [B, heads, ...] view."""
        return x.view(self.B, -1, *x.shape[1:])

    def rows(self, x: Tensor, mask: Tensor) -> Tensor:
        """``x`` [N, ...] times a [B, 1, ...] mask (out of place)."""
        return (self.heads(x) * mask).view(x.shape)


def segments(reset: Tensor, dtype: torch.dtype, resets: set[int]) -> Segments | None:
    """The chunk's :class:`Segments`, or None where no row resets in it (no masks needed)."""
    return Segments(reset, dtype) if resets else None


def across(x: Tensor) -> Tensor:
    """[C, N, D] -> an [N, C, D] view (each matrix's steps as rows; bmm takes the strides)."""
    return x.transpose(0, 1)


def along(x: Tensor) -> Tensor:
    """[N, C, D] -> [C, N, D], contiguous (each step's rows are read many times)."""
    return x.transpose(0, 1).contiguous()


def masked_lower(P: Tensor, seg: Segments | None, strictly: bool = False) -> Tensor:
    """[N, C, C] with the entries outside L (j > t, or another episode; ``strictly``: also j = t)
    zeroed (out of place; multiplied by a mask: a broadcast masked_fill is several times slower)."""
    if seg is None:
        return P.tril(-1 if strictly else 0)
    return seg.rows(P, seg.strictly if strictly else seg.lower)


def write_vectors(k: Tensor, v: Tensor, b: Tensor, M0: Tensor, seg: Segments | None,
                  residuals: bool = False) -> tuple[Tensor, Tensor | None]:
    """A delta rule's write vectors over one chunk: k [C, N, F] (mapped keys), v [C, N, d],
    b [C, N, 1], M0 [N, d, F] (the matrix the chunk starts from), ``seg`` its episodes. Returns
    U = b res and, with ``residuals``, res = v - M_in k, both [C, N, d]; differentiable by autograd."""
    k, v, b = across(k), across(v), across(b)
    KK = masked_lower(torch.bmm(k, k.mT), seg, strictly=True)
    if seg is None:
        res0 = torch.baddbmm(v, k, M0.mT, alpha=-1.0)  # v - M_0 k
    else:
        res0 = v - seg.rows(torch.bmm(k, M0.mT), seg.from_M0)  # M_0 reaches the first episode only
    A, rhs = KK * b, b * res0
    if A.dtype in (torch.float16, torch.bfloat16):  # the CPU's triangular solve takes float32 and 64 only
        U = torch.linalg.solve_triangular(A.float(), rhs.float(), upper=False, unitriangular=True).to(A.dtype)
    else:
        U = torch.linalg.solve_triangular(A, rhs, upper=False, unitriangular=True)
    return along(U), (along(res0 - torch.bmm(KK, U)) if residuals else None)


def known_reads(x: Tensor, k: Tensor, U: Tensor, M0: Tensor, seg: Segments | None) -> Tensor:
    """The reads M_t x_t after the write of one chunk, x, k [C, N, F], U [C, N, d], M0 [N, d, F]:
    [C, N, d]."""
    x, k, U = across(x), across(k), across(U)
    from_M0 = torch.bmm(x, M0.mT)
    if seg is not None:
        from_M0 = seg.rows(from_M0, seg.from_M0)
    return along(torch.baddbmm(from_M0, masked_lower(torch.bmm(x, k.mT), seg), U))


def final_matrices(k: Tensor, U: Tensor, M0: Tensor, seg: Segments | None) -> Tensor:
    """M_C = s0_C M_0 + sum_j last_j u_j k_j^T of one chunk, k [C, N, F], U [C, N, d], M0 [N, d, F]."""
    k, U = across(k), across(U)
    if seg is None:
        return torch.baddbmm(M0, U.mT, k)
    return torch.baddbmm(seg.rows(M0, seg.M0_kept), seg.rows(U, seg.in_last).mT, k)


def known_chunk(x: Tensor, k: Tensor, v: Tensor, b: Tensor, M0: Tensor, seg: Segments | None
                ) -> tuple[Tensor, Tensor]:
    """One chunk of a delta-rule matrix read with known queries: x, k [C, N, F] (mapped), v [C, N, d],
    b [C, N, 1], M0 [N, d, F]. Returns the reads M_t x_t [C, N, d] and M_C (autograd differentiates
    it where a gradient is wanted: grad mode full)."""
    U, _ = write_vectors(k, v, b, M0, seg)
    return known_reads(x, k, U, M0, seg), final_matrices(k, U, M0, seg)


def read_backward(dA: Tensor, x: Tensor, k: Tensor, U: Tensor, dMC: Tensor | None,
                  seg: Segments | None, need_dM0: bool, M0: Tensor | None = None
                  ) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    """Grad mode full: the gradients of the write vectors U, the keys k, M_0 and (given M0) the
    queries x of one chunk of reads a_t = M_t x_t, given dA [C, N, d] (of the reads) and dMC (of M_C,
    or None); x, k [C, N, F], U [C, N, d]. Returns dU [C, N, d], dk [C, N, F], dM_0 [N, d, F] (None
    unless ``need_dM0``) and dx [C, N, F] (None without M0): ``dx_t = M_t^T dA_t = s0_t M_0^T dA_t +
    sum_j L[t, j] (dA_t . u_j) k_j``."""
    dA, x, k, U = across(dA), across(x), across(k), across(U)
    P = masked_lower(torch.bmm(x, k.mT), seg)  # [N, C, C]: x_t . k_j
    Q = masked_lower(torch.bmm(dA, U.mT), seg)  # dA_t . u_j
    if dMC is None:
        dU, dk = torch.bmm(P.mT, dA), torch.bmm(Q.mT, x)
    elif seg is None:
        dU = torch.baddbmm(torch.bmm(k, dMC.mT), P.mT, dA)
        dk = torch.baddbmm(torch.bmm(U, dMC), Q.mT, x)
    else:
        dU = torch.baddbmm(seg.rows(torch.bmm(k, dMC.mT), seg.in_last), P.mT, dA)
        dk = torch.baddbmm(seg.rows(torch.bmm(U, dMC), seg.in_last), Q.mT, x)
    dM0 = None
    if need_dM0:
        if seg is None:
            dM0 = torch.bmm(dA.mT, x) if dMC is None else torch.baddbmm(dMC, dA.mT, x)
        else:
            dM0 = torch.bmm(seg.rows(dA, seg.from_M0).mT, x)
            if dMC is not None:
                dM0 += seg.rows(dMC, seg.M0_kept)
    dx = None
    if M0 is not None:
        from_M0 = torch.bmm(dA, M0) if seg is None else seg.rows(torch.bmm(dA, M0), seg.from_M0)
        dx = along(torch.baddbmm(from_M0, Q, k))
    return along(dU), along(dk), dM0, dx


def step_read_backward(dA: Tensor, x: Tensor, k: Tensor, U: Tensor, res: Tensor, b: Tensor,
                       M0: Tensor, reset: Tensor, resets: set[int], dMT: Tensor | None, need_dx: bool
                       ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Grad mode step: the gradients of the keys, values, rates (after the sigmoid) and queries of
    reads a_t = M_t x_t = A_t x_t + u_t (k_t . x_t), A_t = M_in_t a constant: dA, U, res, v
    [T, N, d]; x, k [T, N, F]; b [T, N, 1]; M0 [N, d, F]; dMT (of M_T) or None. The A_t are replayed
    from M0 (two calls a step). Returns (dk, dv, db, dx or None)."""
    T, N, F = k.shape
    d = U.shape[-1]
    du = dA * torch.linalg.vecdot(k, x).unsqueeze(-1)
    ua = torch.linalg.vecdot(U, dA).unsqueeze(-1)
    dk = x * ua
    if dMT is not None:
        du[-1] += torch.bmm(k[-1].unsqueeze(1), dMT.mT).view(N, d)
        dk[-1] += torch.bmm(U[-1].unsqueeze(1), dMT).view(N, F)
    dv = b * du
    db = torch.linalg.vecdot(du, res).unsqueeze(-1)
    rows = torch.stack([dv, dA], dim=2) if need_dx else dv.unsqueeze(2)  # [T, N, 1 or 2, d]
    A_rows = rows.new_empty(*rows.shape[:-1], F)  # A_t^T dv_t (, A_t^T dA_t)
    A = M0.clone(memory_format=torch.contiguous_format)
    steps = zip(U.unsqueeze(-1).unbind(0), k.unsqueeze(-2).unbind(0), rows.unbind(0), A_rows.unbind(0))
    for t, (u_t, k_t, rows_t, out_t) in enumerate(steps):
        if t in resets:
            A.view(reset.shape[1], -1).mul_((~reset[t]).to(A.dtype).unsqueeze(-1))
        torch.bmm(rows_t, A, out=out_t)
        A.addcmul_(u_t, k_t)
    dk -= A_rows[:, :, 0]
    dx = torch.addcmul(A_rows[:, :, 1], ua, k) if need_dx else None
    return dk, dv, db, dx


def written(M: Tensor, u: Tensor, k: Tensor, rows: Tensor | None, B: int) -> Tensor:
    """``M + u k^T`` for each of the N = B x heads matrices M [N, a, b] (u [N, a], k [N, b]), out of
    place, with the matrices of the batch rows ``rows`` written from zero (``u k^T``) instead:

    - ``rows`` None: no row starts an episode;
    - their indices: the sum for every row, then those rows overwritten (masking M first would copy
      every matrix into a fresh MB-sized tensor on every step with a reset);
    - under a TorchScript trace (``fwrl.agents.traced_core``, whose replay must serve any number of
      them) a [B] mask: M with those rows zeroed, then the sum in place: two passes over M, where a
      ``torch.where`` of ``u k^T`` over every row took four (one torch thread on the 2-core CPU: 88-90
      against 92-110 us for 64 matrices of 32 x 32, 448-494 against 457-562 us for 384). The same
      values as the index path (a zeroed row plus ``u k^T`` is ``u k^T``)."""
    if rows is not None and rows.dtype == torch.bool:
        out = M.reshape(B, -1).masked_fill(rows.view(B, 1), 0.0).view(M.shape)
        return out.addcmul_(u.unsqueeze(-1), k.unsqueeze(-2))
    out = torch.addcmul(M, u.unsqueeze(-1), k.unsqueeze(-2))
    if rows is not None:
        u4, k4 = u.view(B, -1, u.shape[-1], 1), k.view(B, -1, 1, k.shape[-1])
        out.view(B, -1, *M.shape[1:])[rows] = u4[rows] * k4[rows]
    return out
