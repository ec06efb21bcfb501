"""The self-referential weight matrix on the CPU: a step loop of batched calls and a hand-derived backward.

The maths is ``naive.srwm_reference`` (paper 002 Eq. 5-8 with App. A's four learning rates); only the
way the calls are made differs (``fwrl.kernels.cpu_common``). Every step's keys come from the matrix
itself, so no chunked form applies: the forward and, in grad mode full, the backward are step loops
of about ten torch calls a step, without an autograd record, each call batched over all N = B x H
(batch row, head) matrices [R, D] (R = Dy + 2D + 4: the sub-matrices [W^y; W^q; W^k; W^b] stacked
along the rows).

Forward (:func:`_record`), per step, with O_in_t the offset with the rows that start an episode at t
zeroed, ``W_t = W_slow + O_in_t`` (the paper's W_{t-1}: the matrix step t reads) and a_t = phi(x_t):

    z_t = W_t a_t = [y_t; q_raw; k_raw; b_t]       (Eq. 5: one batched product)
    q_t, k_t = softmax(q_raw), softmax(k_raw)      (one call on both)
    diff_t = W_t (q_t - k_t)                       (Eq. 7 / 10 minus Eq. 6 / 9: v_q - v_k, one product)
    beta_t = sigmoid(b_t);  rate_t = beta_t[row_rate]   (App. A: each row block's own rate)
    u_t = rate_t . diff_t
    O_t = O_in_t + u_t k_t^T                       (Eq. 8 / 11, in place on one running offset)

The forward keeps for the backward every W_t (``Ws`` [T, N, R, D]: 4.5 MB at T 21, B 8, H 8, d 16
in float32, about what autograd kept: each step's W for its products), z_t, q_t and k_t,
[q_t - k_t; a_t], diff_t, beta_t and u_t: the backward reads the matrices instead of undoing the
updates (W_t = W_{t+1} - u_t k_t^T where no row resets), which would lose digits to cancellation
where W is large.

Backward, grad mode ``full`` (:func:`_full_backward`), from the last step down, with G the gradient
of O_t (dO_T at the last step, else the one carried back from step t + 1) and dy_t that of y_t:

    du = G k_t;   w = rate_t . du              (so d v_q = w, d v_k = -w)
    d b_t = sigmoid'(b_t) . [sum over the rows of each rate's block of du . diff_t]
                                               (one product: du times M_t [R, 4], M_t = diag(diff_t)
                                                one_hot(row_rate) diag(sigmoid'))
    dq = W_t^T w;   dk = G^T u_t - W_t^T w     (Eq. 6-8's reads and the key of Eq. 8's outer product)
    d q_raw, d k_raw = softmax'(dq), softmax'(dk)   (one call on both)
    dz = [dy_t; d q_raw; d k_raw; d b_t]
    dW_t = w (q_t - k_t)^T + dz a_t^T          (one product: [w; dz]^T [q_t - k_t; a_t])
    G_{t-1} = keep_t (G + dW_t)                (the identity of O_t = O_in_t + ..., then the reset:
                                                keep_t is 0 on the rows that start an episode at t)

down to dO_0 = G_{-1}. After the loop, in one product each over all steps: da_t = W_t^T dz_t (the
gradient of phi(x_t); autograd takes it through phi) and dW_slow = sum over t and b of dW_t (autograd
takes it through the concatenation of the four slow matrices). In grad mode ``step`` every step
starts from the detached offset, as the reference's ``offset.detach()``: nothing is carried back,
so G = 0 at every step but the last (G = dO_T there, when the final offsets have a gradient): w,
d q_raw, d k_raw and d b_t vanish, dz_t = [dy_t; 0], and the backward (:func:`_step_backward`) is
the last step's body and the products after the loop. The
backward is once differentiable. Its loop runs in Python, holding the GIL between its calls (eleven
a step), where autograd's engine ran the graph of the step loop in C++.

Without autograd (acting, or no input that requires a gradient) the step loop of
:func:`_steps_without_records` keeps nothing: per step the matrix is read once with phi(x_t), once
with q and k together, and updated by one fused call. The reset steps are read on the host once per
call, so this path does not belong in a CUDA graph. Gradients checked against the reference in
float64 with both input maps, and by gradcheck (tests/unit/test_kernels_cpu.py).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as nnF
from torch import Tensor
from torch.autograd.function import once_differentiable

from fwrl.kernels.cpu_common import keep_rows, rank_one_update, reset_steps, rows_times
from fwrl.kernels.feature_maps import apply_feature_map

from .naive import NUM_RATES, Offsets, check_srwm_args, rate_index


class _Records(NamedTuple):
    """What the forward keeps (N = B x H matrices, batch rows first): Ws [T, N, R, D] the matrices
    W_t read at each step (W_slow plus the offset after the step's reset); Z [T, N, R] z_t; QK
    [T, N, 2, D] q_t, k_t; P [T, N, 2, D] [q_t - k_t; a_t]; Diff [T, N, R] W_t (q_t - k_t); Beta
    [T, N, 4] sigmoid(b_t); U [T, N, R] u_t."""

    Ws: Tensor
    Z: Tensor
    QK: Tensor
    P: Tensor
    Diff: Tensor
    Beta: Tensor
    U: Tensor


def _keep(reset: Tensor, dtype: torch.dtype) -> Tensor:
    """[T, B, 1]: 0 where ``reset`` [T, B] starts an episode, else 1."""
    return (~reset).to(dtype).unsqueeze(-1)


def _record(a: Tensor, W_slow: Tensor, offset0: Tensor, keep: Tensor, resets: set[int],
            rows: tuple[int, int, int, int]) -> tuple[_Records, Tensor]:
    """The forward over a = phi(x) [T, B, H, D] with W_slow [H, R, D] from offset0 [B, H, R, D];
    keep [T, B, 1] (0 where a row starts an episode), ``resets`` the steps that have one. Every
    per-step operand is a view made before the loop, every result written in place into a record.
    Returns the records and the final offset [B, H, R, D] (one running tensor, updated in place)."""
    T, B, H, D = a.shape
    Dy, R, N = rows[0], W_slow.shape[1], B * H
    offset = offset0.clone(memory_format=torch.contiguous_format)
    rec = _Records(Ws=a.new_empty(T, N, R, D), Z=a.new_empty(T, N, R), QK=a.new_empty(T, N, 2, D),
                   P=a.new_empty(T, N, 2, D), Diff=a.new_empty(T, N, R), Beta=a.new_empty(T, N, NUM_RATES),
                   U=a.new_empty(T, N, R))
    rec.P[:, :, 1].copy_(a.reshape(T, N, D))
    row_rate = rate_index(rows, a.device)
    offset_rows, offset_mats = offset.view(B, H * R * D), offset.view(N, R, D)
    QK, Diff = rec.QK, rec.Diff
    views = (a.reshape(T, N, 1, D), rec.Ws.view(T, B, H, R, D), rec.Ws.mT, rec.Z.unsqueeze(2),
             rec.Z[..., Dy: Dy + 2 * D].unflatten(-1, (2, D)), rec.Z[..., Dy + 2 * D:], QK, QK[:, :, :1],
             QK[:, :, 1:], rec.P[:, :, :1], Diff.unsqueeze(2), Diff, rec.Beta, rec.U, rec.U.unsqueeze(-1))
    steps = zip(*(v.unbind(0) for v in views))
    for t, (a_t, W_heads, WT, z_t, z_qk, z_b, qk, q, k, q_minus_k, diff_row, diff, beta, u, u_col) in enumerate(steps):
        if t in resets:
            offset_rows.mul_(keep[t])
        torch.add(offset, W_slow, out=W_heads)  # W_t = W_slow + O_in_t
        torch.bmm(a_t, WT, out=z_t)  # Eq. 5
        torch._softmax(z_qk, -1, False, out=qk)  # q_t, k_t (the out of a softmax must be contiguous)
        torch.sub(q, k, out=q_minus_k)
        torch.bmm(q_minus_k, WT, out=diff_row)  # v_q - v_k (Eq. 6-7)
        torch.sigmoid(z_b, out=beta)
        torch.mul(beta.index_select(-1, row_rate), diff, out=u)
        offset_mats.addcmul_(u_col, k)  # Eq. 8
    return rec, offset


class _BackwardOperands(NamedTuple):
    """The whole-sequence operands of the backward, made before its loop: Gs [T, N, 2, R] (slot 0:
    w_t, slot 1: dz_t; written by the loop, dy_t copied in before it), rate [T, N, R] and M
    [T, N, R, 4] (du times M_t is d b_t), gqk [N, 2, D] the buffer of dq and dk."""

    Gs: Tensor
    rate: Tensor
    M: Tensor
    gqk: Tensor


def _operands(rec: _Records, rows: tuple[int, int, int, int], dy: Tensor | None) -> _BackwardOperands:
    """The backward's whole-sequence operands from the records and dy [T, B, H, Dy] (None: no
    gradient reaches y)."""
    T, N, R = rec.Z.shape
    Dy, D = rows[0], rec.P.shape[-1]
    Gs = rec.Z.new_zeros(T, N, 2, R)
    if dy is not None:
        Gs[:, :, 1, :Dy].copy_(dy.reshape(T, N, Dy))
    row_rate = rate_index(rows, rec.Z.device)
    rate = rec.Beta.index_select(-1, row_rate)
    one_hot = nnF.one_hot(row_rate, NUM_RATES).to(rec.Z.dtype)  # [R, 4]
    M = (rec.Diff.unsqueeze(-1) * one_hot).mul_((rec.Beta * (1 - rec.Beta)).unsqueeze(-2))
    return _BackwardOperands(Gs, rate, M, rec.Z.new_empty(N, 2, D))


class _Step(NamedTuple):
    """Step t's operands of the backward, views of the records and of :class:`_BackwardOperands`:
    k [N, 1, D], u [N, 1, R], W [N, R, D], rate [N, 1, R], M [N, R, 4], qk [N, 2, D], P [N, 2, D];
    where the loop writes: w [N, 1, R], db [N, 1, 4], dz_qk [N, 2, D] (the rows of q_raw and k_raw
    in dz) and wdz [N, R, 2] ([w; dz]^T)."""

    k: Tensor
    u: Tensor
    W: Tensor
    rate: Tensor
    M: Tensor
    qk: Tensor
    P: Tensor
    w: Tensor
    db: Tensor
    dz_qk: Tensor
    wdz: Tensor


def _steps(rec: _Records, ops: _BackwardOperands, Dy: int) -> list[_Step]:
    """Every step's :class:`_Step`, made in a few calls (one unbind per whole-sequence view)."""
    D = rec.P.shape[-1]
    dz = ops.Gs[:, :, 1:]  # [T, N, 1, R]
    views = (rec.QK[:, :, 1:], rec.U.unsqueeze(2), rec.Ws, ops.rate.unsqueeze(2), ops.M, rec.QK, rec.P,
             ops.Gs[:, :, :1], dz[..., Dy + 2 * D:], dz[:, :, 0, Dy: Dy + 2 * D].unflatten(-1, (2, D)), ops.Gs.mT)
    return [_Step(*step) for step in zip(*(v.unbind(0) for v in views))]


def _step_vjp(G: Tensor, step: _Step, dq: Tensor, dk: Tensor, gqk: Tensor) -> None:
    """Step t's own backward given G [N, R, D], the gradient of O_t: writes w_t and d q_raw, d k_raw,
    d b_t into dz_t (dy_t already there); dq, dk are the halves of the buffer gqk."""
    du = torch.bmm(step.k, G.mT)  # G k_t [N, 1, R]
    Gu = torch.bmm(step.u, G)  # G^T u_t [N, 1, D]
    torch.mul(du, step.rate, out=step.w)
    step.db.copy_(torch.bmm(du, step.M))  # d b_t (the out of a product, a slice, would run per matrix)
    dq.copy_(torch.bmm(step.w, step.W))  # W_t^T w
    torch.sub(Gu, dq, out=dk)  # G^T u_t - W_t^T w
    step.dz_qk.copy_(torch._softmax_backward_data(gqk, step.qk, -1, G.dtype))


def _full_backward(rec: _Records, ops: _BackwardOperands, keep: Tensor, resets: set[int], Dy: int,
                   dOT: Tensor | None) -> Tensor:
    """Grad mode full: fills ``ops.Gs`` from the last step down and returns the gradient of the
    initial offset [N, R, D] (G_{-1})."""
    T, N, R, D = rec.Ws.shape
    B = keep.shape[1]
    G = rec.Ws.new_zeros(N, R, D) if dOT is None else dOT.reshape(N, R, D).clone(memory_format=torch.contiguous_format)
    G_rows, dq, dk = G.view(B, -1), ops.gqk[:, :1], ops.gqk[:, 1:]
    for t, step in reversed(list(enumerate(_steps(rec, ops, Dy)))):
        _step_vjp(G, step, dq, dk, ops.gqk)
        G.baddbmm_(step.wdz, step.P)  # + dW_t = w (q_t - k_t)^T + dz a_t^T
        if t in resets:
            G_rows.mul_(keep[t])
    return G


def _step_backward(rec: _Records, ops: _BackwardOperands, Dy: int, dOT: Tensor | None) -> None:
    """Grad mode step: only the last step has a G (dO_T); every other step's gradient is dy_t's."""
    if dOT is not None:
        T, N, R, D = rec.Ws.shape
        _step_vjp(dOT.reshape(N, R, D), _steps(rec, ops, Dy)[T - 1], ops.gqk[:, :1], ops.gqk[:, 1:], ops.gqk)


class _SRWM(torch.autograd.Function):
    """The recurrence on a = phi(x) [T, B, H, D] and W_slow [H, R, D] from offset0 [B, H, R, D];
    returns y [T, B, H, Dy] and the final offset [B, H, R, D]."""

    @staticmethod
    def forward(ctx, a, W_slow, offset0, reset, resets, rows, full):
        keep = _keep(reset, a.dtype)
        rec, offset = _record(a, W_slow, offset0, keep, resets, rows)
        ctx.save_for_backward(keep, *rec)
        ctx.resets, ctx.rows, ctx.full = resets, rows, full
        ctx.set_materialize_grads(False)
        T, B, H, _ = a.shape
        return rec.Z[..., : rows[0]].reshape(T, B, H, rows[0]), offset

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dOT):
        keep, *saved = ctx.saved_tensors
        rec, rows = _Records(*saved), ctx.rows
        T, N, R, D = rec.Ws.shape
        B = keep.shape[1]
        ops = _operands(rec, rows, dy)
        if ctx.full:
            dO0 = _full_backward(rec, ops, keep, ctx.resets, rows[0], dOT)
        else:  # the initial offset is detached (every step starts from the detached offset)
            _step_backward(rec, ops, rows[0], dOT)
            dO0 = None
        da = dW_slow = None
        if ctx.needs_input_grad[0]:  # da_t = W_t^T dz_t, all steps in one product
            da = torch.bmm(ops.Gs[:, :, 1].reshape(T * N, 1, R), rec.Ws.view(T * N, R, D)).view(T, B, -1, D)
        if ctx.needs_input_grad[1]:  # sum over t and b of [w; dz]^T [q - k; a]
            H = N // B
            dW_slow = torch.einsum("tbhir,tbhid->hrd", ops.Gs.view(T, B, H, 2, R), rec.P.view(T, B, H, 2, D))
        dO0 = dO0.view(B, -1, R, D) if dO0 is not None and ctx.needs_input_grad[2] else None
        return da, dW_slow, dO0, None, None, None, None


def _steps_without_records(phi_x: Tensor, W_slow: Tensor, offset: Tensor, reset: Tensor,
                           rows: tuple[int, int, int, int]) -> tuple[Tensor, Tensor]:
    """The forward without autograd (acting): per step the matrix read once with phi(x_t) (Eq. 5),
    once with q and k together (Eq. 6-7), the four rates spread over the rows by one index, and the
    update of Eq. 8 one fused call; nothing kept. Returns y [T, B, H, Dy] and the final offset
    [B, H, R, D]."""
    T, B, H, D = phi_x.shape
    Dy, R, N = rows[0], W_slow.shape[1], B * H
    offset = offset.reshape(N, R, D)
    row_rate = rate_index(rows, W_slow.device)
    phi_x = phi_x.reshape(T, N, 1, D)
    resets = reset_steps(reset)
    ys = []
    for t in range(T):
        if t in resets:
            offset = keep_rows(offset.view(B, H * R, D), reset[t]).view(N, R, D)
        W = (W_slow + offset.view(B, H, R, D)).view(N, R, D)  # W_{t-1}
        y, qk, b = rows_times(phi_x[t], W.mT).view(N, R).split([Dy, 2 * D, NUM_RATES], dim=-1)  # Eq. 5
        qk = torch.softmax(qk.reshape(N, 2, D), dim=-1)
        v_q, v_k = rows_times(qk, W.mT).unbind(1)  # Eq. 7 / 10 and Eq. 6 / 9: [N, R] each
        rate = torch.sigmoid(b).index_select(-1, row_rate)  # [N, R]: each row's own rate (App. A)
        offset = rank_one_update(offset, rate * (v_q - v_k), qk[:, 1])  # Eq. 8 / 11
        ys.append(y)
    return torch.stack(ys).view(T, B, H, Dy), offset.view(B, H, R, D)


def srwm_cpu(
    x: Tensor, W_y: Tensor, W_q: Tensor, W_k: Tensor, w_b: Tensor, offsets: Offsets, reset: Tensor,
    *, input_map: str = "softmax", grad_mode: str = "full",
) -> tuple[Tensor, Offsets]:
    """The SRWM recurrence of ``naive.srwm_reference`` (same arguments and results, to round-off)
    with the hand-derived backward above."""
    check_srwm_args(input_map, grad_mode)
    slow = (W_y, W_q, W_k, w_b)
    rows = tuple(w.shape[1] for w in slow)
    W_slow = torch.cat(slow, dim=1)  # [H, R, D]
    offset = torch.cat(tuple(offsets), dim=2)  # [B, H, R, D]
    if grad_mode == "step":  # the reference detaches the carried offset at every step, the first too
        offset = offset.detach()
    phi_x = apply_feature_map(input_map, x)
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (phi_x, W_slow, offset))
    if needs_grad:
        y, offset = _SRWM.apply(phi_x, W_slow, offset, reset, reset_steps(reset), rows, grad_mode == "full")
    else:
        y, offset = _steps_without_records(phi_x, W_slow, offset, reset, rows)
    return y, tuple(offset.split(rows, dim=2))
