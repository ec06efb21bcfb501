"""The gated delta rule in chunked form: a chunk of up to 64 (or 32) steps in a few matrix products, with a
hand-derived backward.

The maths is ``naive`` (Gated DeltaNet, Yang et al. 2025, Eq. 10); the form is the paper's
extended WY representation (Sec. 3.3 and App. A), the delta rule's chunked form
(``fwrl.kernels.delta_rule.chunk``) with the decays of the steps between two rows of a chunk
written into its masks, and episode resets as a block-diagonal mask.

Within a chunk of C steps of one matrix (rows: steps; ``K``, ``Q`` [C, Dk] hold phi(k_t), phi(q_t),
``V`` [C, Dv], ``b`` = sigmoid(beta) [C], ``G_t = g_1 + ... + g_t`` the cumulative log-decay from the
chunk's start), the update is ``S_t = alpha_t S_{t-1} + u_t k_t^T`` with
``u_t = b_t (v_t - alpha_t S_{t-1} k_t)``, so ``S_t = e^{G_t} S_0 + sum_{j <= t} e^{G_t - G_j} u_j k_j^T`` and,
with ``D_tj = e^{G_t - G_j}`` for j <= t (0 above the diagonal) and ``e = e^{G}`` [C]:

    W   = V - diag(e) K S_0^T                  R = diag(b) W
    A   = diag(b) tril(D * K K^T, -1)          (I + A) U = R     (one unit-triangular solve)
    P   = D * Q K^T                            Y = P U + diag(e) Q S_0^T   (y_t = S_t q_t)
    S_C = e_C S_0 + (diag(f) U)^T K            f = D_C. (the last row of D)

``D`` is formed as ``exp`` of the masked differences of G (never a ratio of decays, which would
underflow over a chunk of strong gates). An episode that starts at step s of the chunk (``reset[s]``)
cuts the chunk into segments: ``D`` is zero between steps of different segments, and ``S_0`` reaches
only the steps before the first reset (``e`` is zero from the first reset on: a reset row starts from
S = 0, whose decay is zero). Longer sequences run chunk after chunk, carrying S.

The backward (grad_mode ``full``; ``step`` cuts the gradient through S at every step, which no
chunk-wide product can express: ``cpu.py`` runs it step by step with its own backward), per chunk
from the last, with dY and dS_C (the gradient reaching S_C from later chunks or the final state):

    Z   = K dS_C^T          dU = diag(f) Z + P^T dY        df = rowsum(U * Z)   de_C += <dS_C, S_0>
    dP  = dY U^T            de = rowsum(dY * Q S_0^T) - rowsum(dV * K S_0^T)
    dR  = (I + A)^-T dU     dA = -tril(dR U^T, -1)         dV = diag(b) dR
    db  = rowsum(dR * W) + rowsum(dA * tril(D * K K^T, -1))
    dKK = diag(b) dA * D    dQK = dP * D                   dD = diag(b) dA * K K^T + dP * Q K^T  (+ df on row C)
    dG  = rowsum(dD * D) - colsum(dD * D) + de * e         dg_t = sum_{s >= t} dG_s
    [dQ; dK] = [dQK; dKK] K + [diag(e) dY; -diag(e) dV] S_0,   dK += [dQK; dKK]^T [Q; K] + diag(f) U dS_C
    dS_0 = e_C dS_C + [diag(e) dY; -diag(e) dV]^T [Q; K]

then through the maps applied here: ``dbeta = db b (1 - b)`` and, for phi = l2norm (``n = x r``,
``r = (|x|^2 + eps)^-1/2``), ``dx = r (dn - n (n . dn))`` (another map is differentiated by autograd
before the chunks). An unused output (the final state, mostly) takes no products of zeros.

No division by a decay anywhere, so gates that decay to nothing are harmless. Q and K of a chunk are
one [2C, Dk] matrix per head, so that Q K^T with K K^T, Q S_0^T with K S_0^T and the gradients of Q
with those of K are one product each; the solves take their matrices in the layout LAPACK's batched
solve reads without a copy (measured: 2-3x faster than the row-major call). Agrees with the
reference to round-off (float64: ~1e-15).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from fwrl.kernels.feature_maps import L2_NORM_EPS, apply_feature_map

CHUNK = 64  # steps per chunk at most: [C, C] masks and products per matrix
# ... and with at least MANY_MATRICES (B x H) matrices, where the products of the [C, C] terms outweigh
# the calls a chunk makes, at most SHORT_CHUNK (one update's rule forward and backward, measured: 8% faster at
# B 32, T 41, 21% at B 32, T 64; at B 8, T 51 (N 32) two chunks were 6% slower, at B 16, T 41 even)
SHORT_CHUNK = 32
MANY_MATRICES = 128


def _chunks(T: int, N: int) -> list[tuple[int, int]]:
    """(start, end) of each chunk of T steps of N matrices: as few as hold ``CHUNK`` steps each
    (``SHORT_CHUNK`` from ``MANY_MATRICES``), of equal lengths (within one)."""
    n = -(-T // (SHORT_CHUNK if N >= MANY_MATRICES else CHUNK))
    bounds = [round(i * T / n) for i in range(n + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def _heads(x: Tensor, start: int, end: int) -> Tensor:
    """Steps ``start:end`` of ``x`` [T, B, H, ...] as [B * H, C, ...] (a copy where not already so)."""
    x = x[start:end]
    C, B, H = x.shape[:3]
    return x.permute(1, 2, 0, *range(3, x.dim())).reshape(B * H, C, *x.shape[3:])


def _steps(x: Tensor, B: int) -> Tensor:
    """``x`` [B * H, C, ...] back as a [C, B, H, ...] view."""
    N, C = x.shape[:2]
    return x.view(B, N // B, C, *x.shape[2:]).permute(2, 0, 1, *range(3, x.dim() + 1))


def _decay_masks(g: Tensor, reset: Tensor, B: int) -> tuple[Tensor, Tensor]:
    """``D`` [N, C, C] (``D_tj = e^{G_t - G_j}`` on and below the diagonal within a segment, else 0) and
    ``e`` [N, C] (``e^{G_t}`` before the chunk's first reset, else 0) of one chunk: g [N, C] its
    log-decays, reset [C, B]."""
    N, C = g.shape
    G = g.cumsum(-1)
    D = G.unsqueeze(-1) - G.unsqueeze(-2)  # [N, C, C]
    off = torch.ones(C, C, dtype=torch.bool, device=g.device).triu_(1)  # above the diagonal
    e = G.exp_()
    if bool(reset.any()):  # one host read per chunk
        segment = reset.t().cumsum(-1)  # [B, C]: the episode segment of each step within the chunk
        off = (segment.unsqueeze(-1) != segment.unsqueeze(-2)).logical_or_(off).unsqueeze(1)  # [B, 1, C, C]
        e.view(B, -1, C).mul_((segment == 0).to(g.dtype).unsqueeze(1))
    D.view(B, -1, C, C).masked_fill_(off, float("-inf"))
    return D.exp_(), e


class _ChunkedGatedDeltaRule(torch.autograd.Function):
    """The chunked form over T steps with the backward of the module docstring: q, k [T, B, H, Dk]
    (mapped by phi, or, with ``l2``, to be L2-normalised here), v [T, B, H, Dv], beta (before the
    sigmoid) and g [T, B, H], S0 [B, H, Dv, Dk], reset [T, B]; returns y [T, B, H, Dv] and S_T."""

    @staticmethod
    def forward(ctx, q, k, v, beta, g, S0, reset, l2: bool):
        ctx.set_materialize_grads(False)  # an unused output (S_T, mostly) gets None: no products of zeros
        T, B, H = q.shape[:3]
        N = B * H
        S = S0.reshape(N, *S0.shape[2:])
        ys, saved = [], []
        for start, end in _chunks(T, N):
            C = end - start
            QK = torch.stack([_heads(q, start, end), _heads(k, start, end)], 1).view(N, 2 * C, -1)  # [Q; K]
            # phi = l2norm in place: x / sqrt(|x|^2 + eps) (feature_maps.l2_normalise), r the factor
            r = torch.linalg.vecdot(QK, QK).add_(L2_NORM_EPS).rsqrt_().unsqueeze(-1) if l2 else None
            if l2:
                QK.mul_(r)
            K = QK[:, C:]
            V = _heads(v, start, end)
            b = torch.sigmoid(_heads(beta, start, end)).unsqueeze(-1)  # [N, C, 1]
            D, e = _decay_masks(_heads(g, start, end), reset[start:end], B)
            M = torch.bmm(QK, K.mT)  # [Q K^T; K K^T]
            QS_KS = torch.bmm(QK, S.mT)  # [Q S^T; K S^T]
            KD = torch.mul(M[:, C:], D).tril_(-1)
            A = KD * b
            W = torch.addcmul(V, e.unsqueeze(-1), QS_KS[:, C:], value=-1)
            # U^T (I + A)^T = (b W)^T: the solve that reads both matrices in LAPACK's layout
            U = torch.linalg.solve_triangular(A.mT, (W * b).mT, upper=True, left=False, unitriangular=True).mT
            P = torch.mul(M[:, :C], D)
            ys.append(torch.baddbmm(QS_KS[:, :C] * e.unsqueeze(-1), P, U))
            fU = U * D[:, -1].unsqueeze(-1)  # f = D_C.: each write's decay to the chunk's end
            S_in, S = S, torch.baddbmm(S * e[:, -1].view(N, 1, 1), fU.mT, K)
            saved.append((QK, r, V, b, D, e, M, QS_KS, KD, A, W, U, P, fU, S_in))
        ctx.saved = saved  # intermediate tensors of no input's graph: kept on ctx (not save_for_backward)
        ctx.starts = [start for start, _ in _chunks(T, N)]
        ctx.shape = (T, B, H)
        y = _steps(ys[0], B) if len(ys) == 1 else torch.cat([_steps(y, B) for y in ys])
        return y, S.view(S0.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dST):
        T, B, H = ctx.shape
        N = B * H
        dS = None if dST is None else dST.reshape(N, *dST.shape[2:]).contiguous()  # (an expanded gradient:
        # the batched products would loop over its matrices)
        grads = []
        for index in range(len(ctx.saved) - 1, -1, -1):
            QK, r, V, b, D, e, M, QS_KS, KD, A, W, U, P, fU, S = ctx.saved[index]
            C = D.shape[-1]
            start = ctx.starts[index]
            dY = torch.zeros_like(V) if dy is None else _heads(dy, start, start + C).contiguous()
            e_ = e.unsqueeze(-1)
            if dS is not None:
                Z = torch.bmm(QK[:, C:], dS.mT)
                dU = torch.baddbmm(Z * D[:, -1].unsqueeze(-1), P.mT, dY)
                df = torch.linalg.vecdot(U, Z)
                de_C = torch.linalg.vecdot(dS.flatten(1), S.flatten(1))
            else:
                dU = torch.bmm(P.mT, dY)
            dP = torch.bmm(dY, U.mT)
            # (I + A)^T dR = dU as dR^T (I + A) = dU^T: LAPACK's layout again
            dR = torch.linalg.solve_triangular(A, dU.mT, upper=False, left=False, unitriangular=True).mT
            dA = torch.baddbmm(D, dR, U.mT, beta=0, alpha=-1).tril_(-1)
            dV = dR * b
            db = torch.linalg.vecdot(dR, W).add_(torch.linalg.vecdot(dA, KD))
            db = torch.ops.aten.sigmoid_backward(db, b.squeeze(-1))  # the gradient of beta
            dKD = dA.mul_(b)
            dM = torch.empty_like(M)  # [dQK; dKK]
            torch.mul(dP, D, out=dM[:, :C])
            torch.mul(dKD, D, out=dM[:, C:])
            dD = dKD.mul_(M[:, C:]).addcmul_(dP, M[:, :C])
            if dS is not None:
                dD[:, -1].add_(df)
            dD.mul_(D)
            de = torch.linalg.vecdot(dY, QS_KS[:, :C]).sub_(torch.linalg.vecdot(dV, QS_KS[:, C:]))
            if dS is not None:
                de[:, -1].add_(de_C)
            dG = dD.sum(-1).sub_(dD.sum(-2)).addcmul_(de, e)
            dg = dG.flip(-1).cumsum(-1).flip(-1)
            dN = torch.empty_like(QS_KS)  # [diag(e) dY; -diag(e) dV]: the gradient of [Q S^T; K S^T]
            torch.mul(dY, e_, out=dN[:, :C])
            torch.mul(dV, e_.neg(), out=dN[:, C:])
            dQK = torch.baddbmm(torch.bmm(dM, QK[:, C:]), dN, S)
            dK = torch.bmm(dM.mT, QK)
            if dS is not None:
                dK.baddbmm_(fU, dS)
            dQK[:, C:].add_(dK)
            if r is not None:  # through the l2norm: r (dn - n (n . dn)), n the mapped rows
                dQK.addcmul_(QK, torch.linalg.vecdot(QK, dQK).unsqueeze(-1), value=-1).mul_(r)
            if index > 0 or ctx.needs_input_grad[5]:
                dS = torch.bmm(dN.mT, QK) if dS is None else torch.baddbmm(dS * e[:, -1].view(N, 1, 1), dN.mT, QK)
            else:
                dS = None
            grads.append((dQK[:, :C], dQK[:, C:], dV, db, dg))
        grads.reverse()
        dq, dk, dv, db, dg = ([_steps(chunk[i], B) for chunk in grads] for i in range(5))
        dq, dk, dv, db, dg = (parts[0] if len(parts) == 1 else torch.cat(parts) for parts in (dq, dk, dv, db, dg))
        dS0 = dS.view(B, H, *dS.shape[1:]) if ctx.needs_input_grad[5] and dS is not None else None
        return dq, dk, dv, db, dg, dS0, None, None


def gated_delta_rule_chunked(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor, S0: Tensor,
                             reset: Tensor, feature_map: str = "l2norm") -> tuple[Tensor, Tensor]:
    """The gated delta rule over T steps, chunk by chunk. q, k [T, B, H, Dk], v [T, B, H, Dv], beta
    (before the sigmoid) and g (log-decays) [T, B, H], S0 [B, H, Dv, Dk], reset [T, B]; returns
    y [T, B, H, Dv] and S_T (grad_mode full). phi = l2norm and the sigmoid are applied, and
    differentiated, with the chunks; another feature map by autograd before them."""
    l2 = feature_map == "l2norm"
    if not l2:
        q, k = apply_feature_map(feature_map, q), apply_feature_map(feature_map, k)
    return _ChunkedGatedDeltaRule.apply(q, k, v, beta, g, S0, reset, l2)
