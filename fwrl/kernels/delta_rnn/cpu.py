"""The Delta RNN on the CPU: only the recurrent read in a step loop, everything else chunk-wide.

Paper 000 Eq. 12, exactly as ``naive.delta_rnn_reference``; only the way the calls are made differs.
The keys, values and rates of both fast matrices come from the slow net, not from y, so neither
matrix's evolution depends on the recurrence y_t = W_t phi(q_t) + R_t f(y_{t-1}); only R's read,
whose query r_t = f(y_{t-1}) is the last output, runs step by step.

Write vectors (the helpers in ``fwrl.kernels.cpu_delta_chunks``, shared with ``delta_lstm.cpu``).
A delta rule's write ``M_t = M_in_t + u_t k_t^T``, ``u_t = b_t (v_t - M_in_t k_t)``
(M_in_t: M_{t-1}, zero in the rows that start an episode at t) takes, per chunk of C <= 64 steps, one
unit-triangular solve in the WY form of ``delta_rule.chunk`` (:func:`write_vectors`):
``(I + tril(diag(b) K K^T, -1)) U = diag(b) (V - K M_0^T)``, the episodes within the chunk a
block-diagonal mask (:class:`Segments`; a chunk without a reset takes none). Then
``M_t = s0_t M_0 + sum_j L[t, j] u_j k_j^T`` (``L[t, j] = [j <= t, same episode]``, ``s0_t`` = [no
reset of the row up to t]), so reads with known queries are chunk-wide (:func:`known_reads`):
``M_t x_t = s0_t M_0 x_t + sum_j L[t, j] (k_j . x_t) u_j``, and so is M_C (:func:`final_matrices`).

- W (keys phi(k), queries phi(q), rates sigmoid(beta)): its reads and W_T chunk-wide
  (:func:`known_chunk`), differentiated by autograd in grad mode full; :class:`StepReads` in step.
- R (keys softmax(k_r), rates sigmoid(beta_r)): U from the solve, then per step ``R_t = R_in_t +
  u_t k_t^T`` (one call, in place), ``r_t = f(h_in_t)`` (:func:`recurrent_query`, four calls; f the
  softmax with 1e-6 in its denominator; h_in_t = y_{t-1} after the reset) and ``y_t = W_t phi(q_t)
  + R_t r_t`` (one batched product).

Backward, grad mode ``full`` (:class:`_FullRead`, one chunk), with dh_t the whole gradient of y_t
(its own and the one through the next step's query), ``J_t = f'(h_in_t) = diag(r_t) - r_t z_t^T``
and ``z_t = r_t + eps max(r_t) e_argmax / #argmax`` (:func:`recurrent_query_jacobian`: the
1e-6-sized path through the max the reference subtracts; amax shares its gradient among ties, as
after a reset, where h_in = 0):

    g_t = R_t^T dh_t;   dh_{t-1} = dy_{t-1} + keep_t (r_t * g_t - (r_t . g_t) z_t)     (the only loop)

(R_{t-1} = R_t - u_t k_t^T undone in place, the matrix before a reset kept by the forward), then
batched over the chunk (:func:`read_backward`, ``last_j`` = [j in the chunk's last episode]):

    du_j = sum_t L[t, j] (r_t . k_j) dh_t + last_j dR_C k_j
    dk_j = sum_t L[t, j] (dh_t . u_j) r_t + last_j dR_C^T u_j
    dR_0 = sum_t s0_t dh_t r_t^T + s0_C dR_C;   d(W_t phi(q_t)) = dh_t;   dh_0 = keep_0 J_0^T R_0^T dh_0

and autograd takes du through the solve (and R_C, y_C into the next chunk). Grad mode ``step`` (the
state detached at the start of every step) carries nothing back: with ``A_t = M_in_t`` a constant
and ``res_t = v_t - A_t k_t`` (:func:`step_read_backward`; da_t the reads' gradient, x_t the query):

    du_t = (k_t . x_t) da_t [+ dM_T k_t at the last step];  dv_t = b_t du_t;  db_t = du_t . res_t
    dk_t = (u_t . da_t) x_t [+ dM_T^T u_t at the last step] - A_t^T dv_t
    dx_t = A_t^T da_t + (u_t . da_t) k_t                  (W's query; R's is detached)

(db_t: the gradient of the rate after its sigmoid), the only loop replaying the writes from M_0 for
the A_t^T products, two calls a step. Without a gradient, one step (acting) is the fewest calls
(:func:`_one_step`), longer sequences the forward above without records. Gradients checked against
the reference in float64 (tests/unit/test_kernels_cpu.py).

The reset steps are read on the host once per call, so this path does not belong in a CUDA graph.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fwrl.kernels import check_grad_mode
from fwrl.kernels.cpu_common import reset_steps
from fwrl.kernels.cpu_delta_chunks import (
    add_query_gradient, recurrent_query, recurrent_query_jacobian, keep, chunks, segments,
    write_vectors, known_reads, final_matrices, known_chunk, read_backward, step_read_backward,
    written,
)
from fwrl.kernels.feature_maps import RECURRENT_SOFTMAX_EPS, apply_feature_map


class StepReads(torch.autograd.Function):
    """Grad mode step of a delta-rule matrix read with known queries (each step from the detached
    state): x, k [T, N, F] (mapped), v [T, N, d], b [T, N, 1] (after the sigmoid), M0 [N, d, F];
    reset [T, B]; resets: its reset steps. Returns the reads [T, N, d] and M_T; the forward is
    chunk-wide, the backward :func:`step_read_backward`."""

    @staticmethod
    def forward(ctx, x, k, v, b, M0, reset, resets):
        reads, Us, res = [], [], []
        M = M0
        for start, end, resets_c in chunks(x.shape[0], resets):
            seg = segments(reset[start:end], x.dtype, resets_c)
            U_c, res_c = write_vectors(k[start:end], v[start:end], b[start:end], M, seg, residuals=True)
            reads.append(known_reads(x[start:end], k[start:end], U_c, M, seg))
            M = final_matrices(k[start:end], U_c, M, seg)
            Us.append(U_c)
            res.append(res_c)
        ctx.save_for_backward(x, k, b, torch.cat(Us), torch.cat(res), M0, reset)
        ctx.resets = resets
        return torch.cat(reads), M

    @staticmethod
    def backward(ctx, dA, dMT):
        x, k, b, U, res, M0, reset = ctx.saved_tensors
        dA = torch.zeros_like(U) if dA is None else dA
        dk, dv, db, dx = step_read_backward(dA, x, k, U, res, b, M0, reset, ctx.resets, dMT,
                                            ctx.needs_input_grad[0])
        return dx, dk, dv, db, None, None, None


def _loop(yW: Tensor, U: Tensor, k: Tensor, R: Tensor, h: Tensor, reset: Tensor, resets: set[int],
          y: Tensor, r_all: Tensor | None = None, undo: bool = False
          ) -> tuple[Tensor, Tensor, dict[int, Tensor]]:
    """R's writes and the recurrent read of one chunk: yW, U, k [C, N, d]; R [N, d, d]; h [N, d];
    ``resets`` the steps of the chunk where some row of ``reset`` [C, B] starts an episode. Writes
    y_t into ``y`` [C, N, d] and, with ``r_all`` (a record for the backward), r_t into it. R is
    updated in place, in a copy of the input (a new tensor per step, kept for the backward, takes
    fresh pages from the OS: slower than undoing the writes there). Returns (R_C, y_C, and for a
    backward that ``undo``es the writes {t: R_{t-1}} at the reset steps, which it cannot undo)."""
    N = R.shape[0]
    ones = R.new_ones(N, 1)
    R, before = R.clone(memory_format=torch.contiguous_format), {}
    RT = R.mT
    rows = zip(yW.unsqueeze(-2).unbind(0), U.unsqueeze(-1).unbind(0), k.unsqueeze(-2).unbind(0),
               y.unsqueeze(-2).unbind(0), [None] * len(y) if r_all is None else r_all.unbind(0))
    for t, (yW_t, u_t, k_t, y_t, r_t) in enumerate(rows):
        if t in resets:
            if undo:
                before[t] = R.clone()
            R.view(reset.shape[1], -1).mul_((~reset[t]).to(R.dtype).unsqueeze(-1))
            h = keep(h, reset[t])
        r = recurrent_query(h, ones, r_t)
        R.addcmul_(u_t, k_t)
        h = torch.baddbmm(yW_t, r.unsqueeze(1), RT, out=y_t).view(N, -1)
    return R, h, before


class _FullRead(torch.autograd.Function):
    """One chunk of R's writes and the recurrent read, grad mode full. yW, U, k [C, N, d];
    R0 [N, d, d]; h0 [N, d]; reset [C, B]; resets: its reset steps. Returns y [C, N, d] and R_C."""

    @staticmethod
    def forward(ctx, yW, U, k, R0, h0, reset, resets):
        y, r = yW.new_empty(yW.shape), yW.new_empty(yW.shape)
        RC, _, before = _loop(yW, U, k, R0, h0, reset, resets, y, r, undo=True)
        ctx.save_for_backward(U, k, h0, r, y, reset, RC)
        ctx.before, ctx.resets = before, resets
        return y, RC

    @staticmethod
    def backward(ctx, dy, dRC):
        U, k, h0, r, y, reset, R = ctx.saved_tensors
        before, resets = ctx.before, ctx.resets
        C, N, d = U.shape
        dh = torch.zeros_like(U) if dy is None else dy.clone(memory_format=torch.contiguous_format)
        h_in = torch.cat([h0.unsqueeze(0), y[:-1]])
        for t in resets:
            h_in[t] = keep(h_in[t], reset[t])
        z = recurrent_query_jacobian(h_in, r)
        need_dh0 = ctx.needs_input_grad[4]
        dh0 = torch.zeros_like(h0) if need_dh0 else None
        R = R.clone()
        dh_rows = dh.unsqueeze(-2).unbind(0)
        for t in range(C - 1, -1 if need_dh0 else 0, -1):  # dh_{t-1} += keep_t J_t^T R_t^T dh_t
            g = torch.bmm(dh_rows[t], R).view(N, d)
            add_query_gradient(dh[t - 1] if t > 0 else dh0, g, r[t], z[t],
                               reset[t] if t in resets else None)
            if t > 0 and t in resets:  # R_{t-1}: the matrix kept before the reset, or the write undone
                R = before[t].clone()
            elif t > 0:
                R.addcmul_(U[t].unsqueeze(-1), k[t].unsqueeze(-2), value=-1.0)
        seg = segments(reset, U.dtype, resets)
        dU, dk, dR0, _ = read_backward(dh, r, k, U, dRC, seg, ctx.needs_input_grad[3])
        return dh, dU, dk, dR0, dh0, None, None


class _StepRead(torch.autograd.Function):
    """R's writes and the recurrent read over the whole sequence, grad mode step (the state detached
    at every step). yW, k, v [T, N, d]; b [T, N, 1]; R0 [N, d, d]; h0 [N, d]; reset [T, B]; resets:
    its reset steps. Returns y [T, N, d] and R_T."""

    @staticmethod
    def forward(ctx, yW, k, v, b, R0, h0, reset, resets):
        y, r = yW.new_empty(yW.shape), yW.new_empty(yW.shape)
        Us, res = [], []
        R, h = R0, h0
        for start, end, resets_c in chunks(yW.shape[0], resets):
            U_c, res_c = write_vectors(k[start:end], v[start:end], b[start:end], R,
                                       segments(reset[start:end], yW.dtype, resets_c), residuals=True)
            R, h, _ = _loop(yW[start:end], U_c, k[start:end], R, h, reset[start:end], resets_c, y[start:end],
                            r[start:end])
            Us.append(U_c)
            res.append(res_c)
        ctx.save_for_backward(torch.cat(Us), torch.cat(res), k, b, r, R0, reset)
        ctx.resets = resets
        return y, R

    @staticmethod
    def backward(ctx, dy, dRT):
        U, res, k, b, r, R0, reset = ctx.saved_tensors
        dy = torch.zeros_like(U) if dy is None else dy
        dk, dv, db, _ = step_read_backward(dy, r, k, U, res, b, R0, reset, ctx.resets, dRT, False)
        return dy, dk, dv, db, None, None, None, None


def _one_step(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, kr: Tensor, vr: Tensor, betar: Tensor,
              W0: Tensor, R0: Tensor, h0: Tensor, reset: Tensor, feature_map: str
              ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One step without a gradient (acting) in the fewest torch calls: phi(q), phi(k), softmax(k_r)
    and softmax(y_{t-1}) in one call (with the softmax feature map), each matrix read with its key
    and query in one product, ``y = W phi(q) + u (phi(k) . phi(q)) + R r + u_r (k_r . r)`` (the
    reads after the writes), one host read (the rows that reset)."""
    _, B, H, d = q.shape
    F = W0.shape[-1]
    N = B * H
    W, R, h = W0.reshape(N, d, F), R0.reshape(N, d, d), h0.reshape(N, d)
    restart = None  # the rows starting an episode: indices (a mask under a trace, written)
    if bool(reset.any()):
        restart = reset[0] if torch.jit.is_tracing() else reset[0].nonzero().flatten()
    if restart is not None:
        h = keep(h, reset[0])
    if feature_map == "softmax":
        x = torch.softmax(torch.stack([q.reshape(N, d), k.reshape(N, d), kr.reshape(N, d), h], dim=1), dim=-1)
        qk, x = x[:, :2], x[:, 2:]  # phi(q), phi(k); softmax(k_r), softmax(h)
    else:
        qk = apply_feature_map(feature_map, torch.stack([q.reshape(N, d), k.reshape(N, d)], dim=1))
        x = torch.softmax(torch.stack([kr.reshape(N, d), h], dim=1), dim=-1)
    k_r, r = x.unbind(1)
    r.div_(r.amax(dim=-1, keepdim=True).mul_(RECURRENT_SOFTMAX_EPS).add_(1.0))  # f(h), in place in x
    WqWk, RkRr = torch.bmm(qk, W.mT), torch.bmm(x, R.mT)
    if restart is not None:  # their matrices start from zero, so do their reads
        WqWk, RkRr = keep(WqWk, reset[0]), keep(RkRr, reset[0])
    (Wq, Wk), (Rk, Rr) = WqWk.unbind(1), RkRr.unbind(1)
    u = torch.sub(v.reshape(N, d), Wk).mul_(torch.sigmoid(beta.reshape(N, 1)))
    ur = torch.sub(vr.reshape(N, d), Rk).mul_(torch.sigmoid(betar.reshape(N, 1)))
    phi_q, phi_k = qk.unbind(1)
    y = torch.addcmul(Wq, u, torch.linalg.vecdot(phi_q, phi_k).unsqueeze(-1)).add_(Rr)
    y.addcmul_(ur, torch.linalg.vecdot(k_r, r).unsqueeze(-1))  # Eq. 12
    W, R = written(W, u, phi_k, restart, B), written(R, ur, k_r, restart, B)
    y = y.view(1, B, H, d)
    return y, W.view(B, H, d, F), R.view(B, H, d, d), y[0]


def delta_rnn_cpu(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, kr: Tensor, vr: Tensor, betar: Tensor,
    W0: Tensor, R0: Tensor, h0: Tensor, reset: Tensor, *, feature_map: str = "softmax",
    grad_mode: str = "full",
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The Delta RNN of ``naive.delta_rnn_reference`` (same arguments and results, to round-off)."""
    check_grad_mode(grad_mode)
    T, B, H, d = q.shape
    N = B * H
    F = W0.shape[-1]
    needs_grad = torch.is_grad_enabled() and any(
        x.requires_grad for x in (q, k, v, beta, kr, vr, betar, W0, R0, h0))
    if not needs_grad and T == 1:
        return _one_step(q, k, v, beta, kr, vr, betar, W0, R0, h0, reset, feature_map)
    resets = reset_steps(reset)
    phi_q = apply_feature_map(feature_map, q).reshape(T, N, F)
    phi_k = apply_feature_map(feature_map, k).reshape(T, N, F)
    b, v = torch.sigmoid(beta).reshape(T, N, 1), v.reshape(T, N, d)
    kr, vr = torch.softmax(kr, dim=-1).reshape(T, N, d), vr.reshape(T, N, d)
    br = torch.sigmoid(betar).reshape(T, N, 1)
    W, R, h = W0.reshape(N, d, F), R0.reshape(N, d, d), h0.reshape(N, d)
    if needs_grad and grad_mode == "step":
        yW, W = StepReads.apply(phi_q, phi_k, v, b, W.detach(), reset, resets)
        y, R = _StepRead.apply(yW, kr, vr, br, R.detach(), h.detach(), reset, resets)
    else:  # grad mode full (autograd through the chunk-wide parts), or no gradient
        ys = []
        for start, end, resets_c in chunks(T, resets):
            seg = segments(reset[start:end], phi_q.dtype, resets_c)
            yW, W = known_chunk(phi_q[start:end], phi_k[start:end], v[start:end], b[start:end], W, seg)
            U, _ = write_vectors(kr[start:end], vr[start:end], br[start:end], R, seg)
            if needs_grad:
                y, R = _FullRead.apply(yW, U, kr[start:end], R, h, reset[start:end], resets_c)
                h = y[-1]
            else:
                y = torch.empty_like(yW)
                R, h, _ = _loop(yW, U, kr[start:end], R, h, reset[start:end], resets_c, y)
            ys.append(y)
        y = ys[0] if len(ys) == 1 else torch.cat(ys)
    y = y.view(T, B, H, d)
    return y, W.view(B, H, d, F), R.view(B, H, d, d), y[-1]
