"""The Delta LSTM on the CPU: only the reads and the cell in a step loop, the writes' vectors chunk-wide.

Paper 000 App. A.2 version D (Eq. 36-40), exactly as ``naive.delta_lstm_reference``; only the way
the calls are made differs. As in the Delta RNN's CPU path (``delta_rnn.cpu``; the helpers both take
are in ``fwrl.kernels.cpu_delta_chunks``), the six matrices' keys, values and rates come from the
slow net, so no write depends on the recurrence:

- the write vectors ``u_t = b_t (v_t - M_in_t k_t)`` of all six matrices of every row come from one
  unit-triangular solve per chunk of C <= 64 steps (:func:`write_vectors`, the WY form of
  ``delta_rule.chunk``; the episode resets a block-diagonal mask);
- per step, ``M_t = M_in_t + u_t k_t^T`` for the six in one call (in place), r_t = f(y_in_t)
  (:func:`recurrent_query`, four calls), the reads W_g q_t and R_g r_t in one batched product (a
  row's three W as one [3d, d] matrix read with q_t, its three R as another read with r_t), their
  sum ``pre_t`` (Eq. 36-38 before the squashing), sigmoid(f, o), Eq. 39 as one lerp and Eq. 40.

Backward, grad mode ``full`` (:class:`_FullCell`, one chunk), from the last step down, with dy_t the
whole gradient of y_t (its own and the one through the next step's query) and dc carried
(``c_in_t = keep_t c_{t-1}``):

    dc_t = dc_carried + dy_t o_t
    d pre_t = (dc_t (1 - f_t),  dc_t (c_in_t - u_t) f_t (1 - f_t),  dy_t c_t o_t (1 - o_t))   (u, f, o)
    dc_carried = keep_t dc_t f_t
    dy_{t-1} += keep_t J_t^T sum_g R_g,t^T d pre_g,t    (J_t = f'(y_in_t), :func:`recurrent_query_jacobian`)

(the factors of d pre made for all steps at once, the R writes undone in place), then, batched over
the chunk, :func:`read_backward` with d pre as the gradient of both the W_g and the R_g reads gives
those of the write vectors, the keys, the initial matrices and the W reads' query softmax(q)
(autograd takes the write vectors' through the solve). Grad mode ``step`` (the matrices, c and y
detached at every step) carries nothing, so d pre is batched over all steps and the matrices take
:func:`step_read_backward` (two calls a step). Without a gradient one step (acting) reads all six
matrices with their keys and queries in one product and writes them in one call. Gradients checked
against the reference in float64 (tests/unit/test_kernels_cpu.py).

The reset steps are read on the host once per call, so this path does not belong in a CUDA graph.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fwrl.kernels import check_grad_mode
from fwrl.kernels.cpu_common import reset_steps
from fwrl.kernels.cpu_delta_chunks import (
    add_query_gradient, recurrent_query, recurrent_query_jacobian, keep, chunks, segments,
    write_vectors, read_backward, step_read_backward, written,
)
from fwrl.kernels.feature_maps import RECURRENT_SOFTMAX_EPS


GATES = 3  # u, f, o: W_g read with q, R_g with r (``naive.MATRICES``: the three W, then the three R)


def _loop(qr: Tensor, U: Tensor, k: Tensor, M: Tensor, c: Tensor, y: Tensor, reset: Tensor,
          resets: set[int], out: dict[str, Tensor], undo: bool = False
          ) -> tuple[Tensor, Tensor, Tensor, dict[int, Tensor]]:
    """One chunk: qr [C, N, 2, d] (softmax(q_t) in [:, :, 0]; r_t = f(y_in_t) is written into
    [:, :, 1]), U, k [C, 6N, d] (the write vectors and keys of the six matrices of every row), M
    [6N, d, d], c, y [N, d]. Writes into ``out``: ``y`` [C, N, d] and, where given, ``c`` [C, N, d],
    ``pre`` [C, N, 3d] (u, f, o before the squashing), ``so`` [C, N, 2d] (sigmoid of f, o). M is
    updated in place in a copy. Returns (M_C, c_C, y_C, and for a backward that ``undo``es the writes
    {t: M_{t-1}} at the reset steps)."""
    C, N, _, d = qr.shape
    d3 = GATES * d
    ones = M.new_ones(N, 1)
    M, before = M.clone(memory_format=torch.contiguous_format), {}
    MT = M.view(2 * N, d3, d).mT  # per row, the three W as one [3d, d] matrix, the three R as another

    def steps(name: str, *shape: int) -> list:  # the records' rows of each step (None: not recorded)
        return [None] * C if name not in out else out[name].view(C, *shape).unbind(0)

    rows = zip(qr.unbind(0), U.unsqueeze(-1).unbind(0), k.unsqueeze(-2).unbind(0), out["y"].unbind(0),
               steps("c", N, d), steps("pre", N, d3), steps("so", N, 2 * d))
    for t, (qr_t, u_t, k_t, y_t, c_t, pre_t, so_t) in enumerate(rows):
        if t in resets:
            if undo:
                before[t] = M.clone()
            M.view(reset.shape[1], -1).mul_((~reset[t]).to(M.dtype).unsqueeze(-1))
            c, y = keep(c, reset[t]), keep(y, reset[t])
        recurrent_query(y, ones, qr_t[:, 1])
        M.addcmul_(u_t, k_t)
        reads = torch.bmm(qr_t.view(2 * N, 1, d), MT).view(N, 2, d3)  # W_g q and R_g r
        pre = torch.sum(reads, dim=1, out=pre_t)  # Eq. 36-38 before squashing
        so = torch.sigmoid(pre[:, d:], out=so_t)  # f, o
        c = torch.lerp(pre[:, :d], c, so[:, :d], out=c_t)  # Eq. 39: f c + (1 - f) u
        y = torch.mul(c, so[:, d:], out=y_t)  # Eq. 40
    return M, c, y, before


def _cell_factors(pre: Tensor, so: Tensor, c: Tensor, c_in: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """For all steps [C, N, .]: (the factors of d pre_u, d pre_f from dc as [C, N, 2, d], that of
    d pre_o from dy, f, o)."""
    d = c.shape[-1]
    f, o = so[..., :d], so[..., d:]
    A_c = torch.stack([1 - f, (c_in - pre[..., :d]) * f * (1 - f)], dim=2)
    return A_c, c * o * (1 - o), f, o


def _previous(x0: Tensor, x: Tensor, reset: Tensor, resets: set[int]) -> Tensor:
    """x_in_t = keep_t x_{t-1} for all steps of a chunk (x_{-1} = x0)."""
    x_in = torch.cat([x0.unsqueeze(0), x[:-1]])
    for t in resets:
        x_in[t] = keep(x_in[t], reset[t])
    return x_in


def _per_matrix(x: Tensor) -> Tensor:
    """[C, N, 2, d] (one vector for the W, one for the R matrices of a row) -> [C, 6N, d]."""
    C, N, _, d = x.shape
    return x.unsqueeze(3).expand(C, N, 2, GATES, d).reshape(C, N * 2 * GATES, d)


def _queries(qs: Tensor) -> Tensor:
    """[C, N, 2, d] with softmax(q) in [:, :, 0], for the loop to write r into [:, :, 1]."""
    qr = qs.new_empty(*qs.shape[:2], 2, qs.shape[-1])
    qr[:, :, 0] = qs
    return qr


def _W_query_gradient(dx: Tensor) -> Tensor:
    """The gradient of softmax(q) [C, N, d] from that of every matrix's query [C, 6N, d]."""
    C, _, d = dx.shape
    return dx.view(C, -1, 2, GATES, d)[:, :, 0].sum(2)


class _FullCell(torch.autograd.Function):
    """One chunk, grad mode full. qs [C, N, d] (softmax(q)); U, k [C, 6N, d]; M0 [6N, d, d]; c0, y0
    [N, d]; reset [C, B]; resets: its reset steps. Returns y [C, N, d], M_C, c_C."""

    @staticmethod
    def forward(ctx, qs, U, k, M0, c0, y0, reset, resets):
        C, N, d = qs.shape
        qr = _queries(qs)
        new = qs.new_empty
        out = dict(y=new(C, N, d), c=new(C, N, d), pre=new(C, N, GATES * d), so=new(C, N, 2 * d))
        MC, cC, _, before = _loop(qr, U, k, M0, c0, y0, reset, resets, out, undo=True)
        ctx.save_for_backward(qr, U, k, M0, c0, y0, out["c"], out["y"], out["pre"], out["so"], reset, MC)
        ctx.before, ctx.resets = before, resets
        return out["y"], MC, cC

    @staticmethod
    def backward(ctx, dy, dMC, dcC):
        qr, U, k, M0, c0, y0, c, y, pre, so, reset, M = ctx.saved_tensors
        before, resets = ctx.before, ctx.resets
        C, N, d = y.shape
        r = qr[:, :, 1]
        dh = torch.zeros_like(y) if dy is None else dy.clone(memory_format=torch.contiguous_format)
        z = recurrent_query_jacobian(_previous(y0, y, reset, resets), r)
        A_c, A_o, f, o = _cell_factors(pre, so, c, _previous(c0, c, reset, resets))
        dpre = torch.empty_like(pre).view(C, N, GATES, d)
        dc = torch.zeros_like(c0) if dcC is None else dcC
        need_dy0 = ctx.needs_input_grad[5]
        dy0 = torch.zeros_like(y0) if need_dy0 else None
        M = M.clone()
        R = M.view(N, 2, GATES, d, d)[:, 1]  # the R matrices (only their writes are undone)
        U_R = U.view(C, N, 2, GATES, d, 1)[:, :, 1]
        k_R = k.view(C, N, 2, GATES, 1, d)[:, :, 1]
        for t in range(C - 1, -1, -1):
            dy_t = dh[t]
            dc = torch.addcmul(dc, dy_t, o[t])
            torch.mul(dc.unsqueeze(1), A_c[t], out=dpre[t, :, :2])
            torch.mul(dy_t, A_o[t], out=dpre[t, :, 2])
            dc = dc * f[t]  # dc_in_t
            if t in resets:
                dc = keep(dc, reset[t])
            if t > 0 or need_dy0:  # dy_{t-1} += keep_t J_t^T sum_g R_g,t^T d pre_g,t
                g = torch.bmm(dpre[t].view(N, 1, GATES * d), R.reshape(N, GATES * d, d)).view(N, d)
                add_query_gradient(dh[t - 1] if t > 0 else dy0, g, r[t], z[t],
                                   reset[t] if t in resets else None)
            if t > 0 and t in resets:  # R_{t-1}: the matrices kept before the reset, or the writes undone
                R = before[t].view(N, 2, GATES, d, d)[:, 1].clone()
            elif t > 0:
                R.addcmul_(U_R[t], k_R[t], value=-1.0)
        dA = dpre.unsqueeze(2).expand(C, N, 2, GATES, d).reshape(C, -1, d)  # the W and R reads alike
        dU, dk, dM0, dx = read_backward(dA, _per_matrix(qr), k, U, dMC, segments(reset, U.dtype, resets),
                                        ctx.needs_input_grad[3], M0 if ctx.needs_input_grad[0] else None)
        return (None if dx is None else _W_query_gradient(dx)), dU, dk, dM0, dc, dy0, None, None


class _StepCell(torch.autograd.Function):
    """The whole sequence, grad mode step (the matrices, c and y detached at every step).
    qs [T, N, d] (softmax(q)); k, v [T, 6N, d]; b [T, 6N, 1]; M0 [6N, d, d]; c0, y0 [N, d];
    reset [T, B]; resets: its reset steps. Returns y [T, N, d], M_T, c_T."""

    @staticmethod
    def forward(ctx, qs, k, v, b, M0, c0, y0, reset, resets):
        T, N, d = qs.shape
        qr = _queries(qs)
        new = qs.new_empty
        out = dict(y=new(T, N, d), c=new(T, N, d), pre=new(T, N, GATES * d), so=new(T, N, 2 * d))
        Us, res = [], []
        M, c, y = M0, c0, y0
        for start, end, resets_c in chunks(T, resets):
            U_c, res_c = write_vectors(k[start:end], v[start:end], b[start:end], M,
                                       segments(reset[start:end], qs.dtype, resets_c), residuals=True)
            M, c, y, _ = _loop(qr[start:end], U_c, k[start:end], M, c, y, reset[start:end], resets_c,
                               {name: x[start:end] for name, x in out.items()})
            Us.append(U_c)
            res.append(res_c)
        ctx.save_for_backward(qr, torch.cat(Us), torch.cat(res), k, b, M0, c0, out["c"], out["pre"],
                              out["so"], reset)
        ctx.resets = resets
        return out["y"], M, c

    @staticmethod
    def backward(ctx, dy, dMT, dcT):
        qr, U, res, k, b, M0, c0, c, pre, so, reset = ctx.saved_tensors
        T, N, d = c.shape
        dy = torch.zeros_like(c) if dy is None else dy
        A_c, A_o, _, o = _cell_factors(pre, so, c, _previous(c0, c, reset, ctx.resets))
        dc = dy * o
        if dcT is not None:
            dc[-1] += dcT
        dpre = torch.cat([dc.unsqueeze(2) * A_c, (dy * A_o).unsqueeze(2)], dim=2)  # [T, N, 3, d]
        dA = dpre.unsqueeze(2).expand(T, N, 2, GATES, d).reshape(T, -1, d)  # the W and R reads alike
        dk, dv, db, dx = step_read_backward(dA, _per_matrix(qr), k, U, res, b, M0, reset, ctx.resets, dMT,
                                            ctx.needs_input_grad[0])
        return (None if dx is None else _W_query_gradient(dx)), dk, dv, db, None, None, None, None, None


def _one_step(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, W0: Tensor, c0: Tensor, y0: Tensor,
              reset: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One step without a gradient (acting) in the fewest torch calls: the softmax of every key and
    query in one call, the six matrices of every row read with their keys and queries in one product
    and written in one call, the reads after the writes (``M_1 x = M x + u (k . x)``), one host read
    (the rows that reset)."""
    _, B, H, d = q.shape
    N = B * H
    M = 2 * GATES
    W, c, y = W0.reshape(N * M, d, d), c0, y0
    restart = None  # the rows starting an episode: indices (a mask under a trace, written)
    if bool(reset.any()):
        restart = reset[0] if torch.jit.is_tracing() else reset[0].nonzero().flatten()
    if restart is not None:
        c, y = keep(c0, reset[0]), keep(y0, reset[0])
    queries = torch.cat([q.reshape(N, 1, d).expand(N, GATES, d), y.reshape(N, 1, d).expand(N, GATES, d)],
                        dim=1)
    x = torch.softmax(torch.stack([k.reshape(N, M, d), queries], dim=2), dim=-1)  # [N, 6, 2, d]: key, query
    r = x[:, GATES:, 1]
    r.div_(r.amax(dim=-1, keepdim=True).mul_(RECURRENT_SOFTMAX_EPS).add_(1.0))  # f(y), in place in x
    x = x.view(N * M, 2, d)
    WkWx = torch.bmm(x, W.mT)
    if restart is not None:  # their matrices start from zero, so do their reads
        WkWx = keep(WkWx, reset[0])
    Wk, Wx = WkWx.unbind(1)
    keys, queries = x.unbind(1)
    u = torch.sub(v.reshape(N * M, d), Wk).mul_(torch.sigmoid(beta.reshape(N * M, 1)))
    read = torch.addcmul(Wx, u, torch.linalg.vecdot(keys, queries).unsqueeze(-1)).view(B, H, 2, GATES, d)
    W = written(W, u, keys, restart, B)
    pre = read[:, :, 0] + read[:, :, 1]  # [B, H, 3, d]: W_g q + R_g r
    so = torch.sigmoid(pre[:, :, 1:])
    c = torch.lerp(pre[:, :, 0], c, so[:, :, 0])  # Eq. 39
    y = c * so[:, :, 1]  # Eq. 40
    return y.unsqueeze(0), W.view(B, H, M, d, d), c, y


def delta_lstm_cpu(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, W0: Tensor, c0: Tensor, y0: Tensor,
    reset: Tensor, *, grad_mode: str = "full",
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The Delta LSTM of ``naive.delta_lstm_reference`` (same arguments and results, to round-off)."""
    check_grad_mode(grad_mode)
    T, B, H, d = q.shape
    N, NM = B * H, B * H * 2 * GATES
    needs_grad = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v, beta, W0, c0, y0))
    if not needs_grad and T == 1:
        return _one_step(q, k, v, beta, W0, c0, y0, reset)
    resets = reset_steps(reset)
    qs = torch.softmax(q, dim=-1).reshape(T, N, d)
    k, v = torch.softmax(k, dim=-1).reshape(T, NM, d), v.reshape(T, NM, d)
    b = torch.sigmoid(beta).reshape(T, NM, 1)
    M, c, y_last = W0.reshape(NM, d, d), c0.reshape(N, d), y0.reshape(N, d)
    if needs_grad and grad_mode == "step":
        y, M, c = _StepCell.apply(qs, k, v, b, M.detach(), c.detach(), y_last.detach(), reset, resets)
    else:  # grad mode full (autograd through the solves), or no gradient
        ys = []
        for start, end, resets_c in chunks(T, resets):
            U, _ = write_vectors(k[start:end], v[start:end], b[start:end], M,
                                 segments(reset[start:end], q.dtype, resets_c))
            if needs_grad:
                y, M, c = _FullCell.apply(qs[start:end], U, k[start:end], M, c, y_last, reset[start:end],
                                          resets_c)
                y_last = y[-1]
            else:
                y = qs.new_empty(end - start, N, d)
                M, c, y_last, _ = _loop(_queries(qs[start:end]), U, k[start:end], M, c, y_last,
                                        reset[start:end], resets_c, {"y": y})
            ys.append(y)
        y = ys[0] if len(ys) == 1 else torch.cat(ys)
    y = y.view(T, B, H, d)
    return y, M.view(B, H, 2 * GATES, d, d), c.view(B, H, d), y[-1]
