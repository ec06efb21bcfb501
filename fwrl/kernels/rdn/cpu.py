"""The Recurrent Delta Net on the CPU: a step loop of batched calls and a hand-derived backward.

The maths is ``naive.rdn_reference`` (paper 000 (RFWP) Eq. 15-18, then the delta rule of paper 001
Eq. 20-25); only the way the calls are made differs. Every step depends on the last through h (the
queries, keys, values and rates read ``s_t = tanh(h_{t-1})``), so no chunked form applies: the
forward and, in grad mode full, the backward are step loops of about ten torch calls a step, without
an autograd record, each call batched over all N = B x H (batch row, head) pairs.

Forward (:func:`_record`), per step, with ``W_in_t`` and ``h_in_t`` the state with the rows that
start an episode at t zeroed, the slow net's part ``x_t = [x_k | x_q | x_v | x_b]`` (concatenated
once per call, keys first) and the recurrent weights stacked into ``R = [R_k; R_q; R_v; r_b]^T``
[H, d, 3d + 1]:

    s_t  = tanh(h_in_t)
    a_t  = x_t + R s_t                      (Eq. 15-18 before phi and sigmoid: one batched product,
                                             [H, B, d] x [H, d, 3d + 1])
    k, q = phi(a_k), phi(a_q);  v = a_v;  b = sigmoid(a_b)        (phi of k and q in one call)
    u_t  = b (v - W_in_t k)                 (v - W_in_t k one call)
    W_t  = W_in_t + u_t k^T;   h_t = W_t q  (paper 001 Eq. 20-25)

Inside, the rows are heads first (n = h B + b: the layout of the product with R, so no step
transposes anything), every per-step operand is a view made before the loop and every result is
written in place into a record. The forward keeps for the backward a_t, phi(k), phi(q), u_t, b, s_t
and every state (``Ws`` [T + 1, N, d, F]: W0, then W_t, each before the next step's reset; 2.9 MB at
T 21, B 8, H 4, d 32 in float32, as much as autograd kept): the backward reads them instead of
undoing the updates as the Triton kernel does (``fused_recurrent``), which loses digits to
cancellation where W is large.

Backward, grad mode ``full`` (:func:`_full_backward`, the Triton kernel's equations), from the last
step down, with dh the whole gradient of h_t (dy_t, plus dh_T at the last step, plus the one through
s_{t+1}) and G that of W_t (dW_T at the last step, else through W_{t+1}) plus dh q^T:

    dr = b G k  (= d a_v);   d a_b = (G^T u) . k (1 - b)  (= (G k) . (v - W_in_t k) b (1 - b))
    dq = W_t^T dh;   dk = G^T u - W_in_t^T dr        (W_{t-1}^T dr and W_t^T dh in one product:
                                                       the states are adjacent in Ws, and dr_t and
                                                       dh_t in the carry)
    d a_k, d a_q = phi'(dk), phi'(dq)                (:func:`_phi_vjp`)
    ds = R^T d a_t                                   (one batched product)
    dh_{t-1} = dy_{t-1} + keep_t (1 - s_t^2) ds
    G_{t-1}  = keep_t (G - dr k^T) + dh_{t-1} q_{t-1}^T   (one product where no row resets at t)

(keep_t: 0 in the rows that start an episode at t, where also W_in_t^T dr = 0), down to
dh0 = keep_0 (1 - s_0^2) ds_0 and dW0 = keep_0 (G_0 - dr_0 k_0^T). The gradient of x is ``d a``, that
of R ``sum over t and b of s_t d a_t^T`` (one batched product per call); autograd takes them through
the concatenations. In grad mode ``step`` every step starts from the detached state, so nothing is
carried back and the backward (:func:`_step_backward`) has no loop: G_t = dh_t q_t^T (plus dW_T at
the last step), so ``dr = b (q . k) dh``, ``G^T u = (dh . u) q``, and the products with W_t and
W_in_t are batched over the steps. The backward is once differentiable. Its loop runs in Python,
holding the GIL between its calls (about a dozen a step), where autograd's engine ran the graph of
the step loop (about three times as many calls) in C++.

Without autograd (acting) one step is :func:`_one_step` (batch rows first, as the inputs and the
state come; W_1 written once, into a new tensor) and longer sequences :func:`_record` without the
states (one matrix updated in place): nothing is kept for a backward. The reset steps are read on
the host once per call, so this path does not belong in a CUDA graph. Gradients checked against the
reference in float64 with every feature map, and by gradcheck (tests/unit/test_kernels_cpu.py).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as nnF
from torch import Tensor
from torch.autograd.function import once_differentiable

from fwrl.kernels import check_grad_mode
from fwrl.kernels.cpu_common import keep_rows, reset_steps
from fwrl.kernels.feature_maps import SUM_NORM_EPS, apply_feature_map, check_feature_map


def _dpfp_nu(feature_map: str) -> int:
    return int(feature_map.split("-")[1])


def _phi_into(feature_map: str, z: Tensor, out: Tensor) -> None:
    """``out`` (contiguous) = phi(z): softmax written straight into it (``torch._softmax``: the
    public call has no ``out``), the other maps copied."""
    if feature_map == "softmax":
        torch._softmax(z, -1, False, out=out)
    else:
        out.copy_(apply_feature_map(feature_map, z))


def _phi_saved(feature_map: str, z: Tensor) -> tuple[Tensor, ...]:
    """What phi's vector-Jacobian product needs besides p = phi(z), from the pre-activations
    z [..., d] of the whole sequence at once (before the backward loop).

    - ``elu1_sumnorm``, p = e / S with e = elu(z) + 1, S = sum e + eps: (elu'(z) / S,);
    - ``dpfp-nu``, p = P / S with P = rep(r) * roll(r) (r = relu([z, -z]), paper 001 Eq. 37):
      (1 / S, roll(r) [..., F], rep(r) [..., F], [z > 0], [z < 0]);
    - ``softmax``, ``identity``: nothing."""
    if feature_map == "elu1_sumnorm":
        e = nnF.elu(z) + 1.0
        return (torch.exp(z.clamp_max(0.0)) / (e.sum(-1, keepdim=True) + SUM_NORM_EPS),)
    if feature_map.startswith("dpfp-"):
        nu = _dpfp_nu(feature_map)
        r = torch.cat([nnF.relu(z), nnF.relu(-z)], dim=-1)
        rolled = torch.cat([torch.roll(r, shifts=i, dims=-1) for i in range(1, nu + 1)], dim=-1)
        repeated = torch.cat([r] * nu, dim=-1)
        inv_sum = 1.0 / ((repeated * rolled).sum(-1, keepdim=True) + SUM_NORM_EPS)
        return inv_sum, rolled, repeated, (z > 0).to(z.dtype), (z < 0).to(z.dtype)
    return ()


def _dpfp_unroll_index(feature_map: str, d: int, device: torch.device) -> Tensor | None:
    """For dpfp-nu, the index into [..., nu 2d] that rolls block i (1-based) back by i: block i of
    ``x[..., index]`` at j is block i of x at (j + i) mod 2d. None for the other maps."""
    if not feature_map.startswith("dpfp-"):
        return None
    j = torch.arange(2 * d, device=device)
    return torch.cat([(i - 1) * 2 * d + (j + i) % (2 * d) for i in range(1, _dpfp_nu(feature_map) + 1)])


def _phi_vjp(feature_map: str, g: Tensor, p: Tensor, saved: tuple[Tensor, ...], out: Tensor,
             index: Tensor | None) -> None:
    """Write into ``out`` [..., d] the gradient of z given g = dL/dphi(z) [..., F] and p = phi(z)
    (``saved``: :func:`_phi_saved` of z; ``index``: :func:`_dpfp_unroll_index`)."""
    if feature_map == "identity":
        out.copy_(g)
    elif feature_map == "softmax":  # p (g - g . p) in one call (softmax's own backward; its
        out.copy_(torch._softmax_backward_data(g, p, -1, p.dtype))  # grad_input must be contiguous)
    elif feature_map == "elu1_sumnorm":  # (g - g . p) elu'(z) / S
        torch.mul(g - torch.linalg.vecdot(g, p).unsqueeze(-1), saved[0], out=out)
    else:  # dpfp: dP = (g - g . p) / S, dr_j = sum_i dP_ij roll_i(r)_j + (dP_i r)_(j+i), relu'
        inv_sum, rolled, repeated, pos, neg = saved
        dP = (g - torch.linalg.vecdot(g, p).unsqueeze(-1)).mul_(inv_sum)
        blocks = (*dP.shape[:-1], _dpfp_nu(feature_map), -1)
        dr = (dP * rolled).view(blocks).sum(-2) + (dP * repeated)[..., index].view(blocks).sum(-2)
        d = out.shape[-1]
        torch.sub(dr[..., :d] * pos, dr[..., d:] * neg, out=out)


class _Records(NamedTuple):
    """What the forward keeps (heads first, N = H x B rows): A [T, H, B, 3d + 1] the pre-activations
    a_t; KQ [T, 2, N, F] phi(k), phi(q); Ws [T + 1, N, d, F] W0, then W_t after each step (before
    any reset of the next); S [T, H, B, d] s_t; Y [T, H, B, d] h_t; u [T, N, 1, d]; b [T, N, 1, 1]."""

    A: Tensor
    KQ: Tensor
    Ws: Tensor
    S: Tensor
    Y: Tensor
    u: Tensor
    b: Tensor


def _record(x: Tensor, R: Tensor, W0: Tensor, h0: Tensor, keep: Tensor, resets: set[int],
            feature_map: str, states: bool = True) -> _Records:
    """The forward over x [T, H, B, 3d + 1] with R [H, d, 3d + 1] from W0 [B, H, d, F], h0 [B, H, d];
    keep [T, 1, B, 1] (0 where a row starts an episode); ``resets`` the steps that have one. Every
    per-step operand is a view made before the loop, every result written in place into a record.
    Without ``states`` (no backward to come) Ws is one matrix, W_T, updated in place."""
    T, H, B, D = x.shape
    d, F = W0.shape[-2:]
    N = H * B
    A, KQ = torch.empty_like(x), x.new_empty(T, 2, N, F)
    Ws = x.new_empty(T + 1 if states else 1, N, d, F)
    Ws[0].view(H, B, d, F).copy_(W0.transpose(0, 1))
    S, Y = x.new_empty(T, H, B, d), x.new_empty(T, H, B, d)
    u, b = x.new_empty(T, N, 1, d), x.new_empty(T, N, 1, 1)
    torch.tanh(h0.transpose(0, 1), out=S[0])
    s_rows = S.view(T, N, 1, d).unbind(0)
    W_in, W_out = (Ws.unbind(0), Ws[1:].unbind(0)) if states else ((Ws[0],) * T, (Ws[0],) * T)
    steps = zip(x.unbind(0), A.unbind(0), A[..., : 2 * d].unflatten(-1, (2, d)).permute(0, 3, 1, 2, 4).unbind(0),
                A[..., 2 * d: 3 * d].reshape(T, N, 1, d).unbind(0), A[..., 3 * d:].reshape(T, N, 1, 1).unbind(0),
                KQ.view(T, 2, H, B, F).unbind(0), KQ[:, 0].unsqueeze(2).unbind(0), KQ[:, 1].unsqueeze(2).unbind(0),
                S.unbind(0), Y.view(T, N, 1, d).unbind(0), u.unbind(0), b.unbind(0), W_in, W_out)
    for t, (x_t, a_t, a_kq, a_v, a_b, kq, k, q, s_t, y_t, u_t, b_t, W, W_t) in enumerate(steps):
        if t in resets:
            s_t.mul_(keep[t])
            W = (W.view(H, B, d * F) * keep[t]).view(N, d, F)
        torch.baddbmm(x_t, s_t, R, out=a_t)
        _phi_into(feature_map, a_kq, kq)
        torch.mul(torch.baddbmm(a_v, k, W.mT, alpha=-1), torch.sigmoid(a_b, out=b_t), out=u_t)
        torch.addcmul(W, u_t.mT, k, out=W_t)
        torch.bmm(q, W_t.mT, out=y_t)
        if t + 1 < T:
            torch.tanh(y_t, out=s_rows[t + 1])
    return _Records(A, KQ, Ws, S, Y, u, b)


def _outputs(rec: _Records) -> tuple[Tensor, Tensor, Tensor]:
    """(y [T, B, H, d], W_T [B, H, d, F], h_T [B, H, d]) from the records, batch rows first again."""
    T, H, B, d = rec.Y.shape
    return (rec.Y.transpose(1, 2).contiguous(), rec.Ws[-1].view(H, B, d, -1).transpose(0, 1).contiguous(),
            rec.Y[T - 1].transpose(0, 1).contiguous())


def _heads_first(g: Tensor | None, shape: tuple[int, ...]) -> Tensor | None:
    """A gradient [B, H, ...] of a state as [N, ...] heads first (a copy), or None."""
    return None if g is None else g.transpose(0, 1).reshape(shape)


def _seed(dy: Tensor | None, dWT: Tensor | None, dhT: Tensor | None, q_last: Tensor, T: int, H: int, B: int,
          d: int) -> tuple[Tensor, Tensor]:
    """The backward's carries before the last step, heads first: Z [2T + 1, N, d] (slot 2t + 2: dy_t,
    plus dh_T in the last; slot 2t + 1 for dr_t and slot 0 for dh_{-1}, zero) and G = dW_T + dh q^T
    of the last step (q_last [N, 1, F])."""
    Z = q_last.new_zeros(2 * T + 1, H * B, d)
    if dy is not None:
        Z[2::2].view(T, H, B, d).copy_(dy.transpose(1, 2))
    if dhT is not None:
        Z[2 * T].view(H, B, d).add_(dhT.transpose(0, 1))
    G = torch.bmm(Z[2 * T].unsqueeze(-1), q_last)
    if dWT is not None:
        G.add_(_heads_first(dWT, G.shape))
    return Z, G


def _full_backward(rec: _Records, R: Tensor, keep: Tensor, resets: set[int], feature_map: str,
                   dy: Tensor | None, dWT: Tensor | None, dhT: Tensor | None, need_W0: bool,
                   need_h0: bool) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Grad mode full: the gradients of a (all steps), W0 and h0, from the last step down. In Z
    (:func:`_seed`) dr_t and dh_t are one operand of the product with the adjacent states
    [W_{t-1}; W_t], and dh_{t-1} and dr_t one of G's update; the per-step operands are views of
    whole-sequence tensors, most of them made before the loop."""
    A, KQ, Ws, S, _, u, b = rec
    T, H, B, D = A.shape
    d, F = Ws.shape[-2:]
    N = H * B
    k, q = KQ.unsqueeze(3).unbind(1)  # [T, N, 1, F]
    Z, G = _seed(dy, dWT, dhT, q[T - 1], T, H, B, d)
    bk, k1b = b * k, (k * (1 - b)).mT  # dr = G (b k);  d a_b = (G^T u) . k (1 - b)
    KQ2 = torch.cat([q.roll(1, 0), -k], dim=2)  # [T, N, 2, F]: [q_{t-1}; -k_t]
    ds2 = (1 - S * S).mul_(keep)  # tanh' and the resets
    saved = _phi_saved(feature_map, A[..., : 2 * d].reshape(T, N, 2, d).transpose(1, 2))
    saved_t, index = list(zip(*(x.unbind(0) for x in saved))) or [()] * T, _dpfp_unroll_index(feature_map, d, A.device)
    dA = torch.empty_like(A)
    pairs = Ws.as_strided((T, 2 * N, d, F), (N * d * F, d * F, F, 1)).unbind(0)  # [W_{t-1}; W_t]
    drdh, dr = Z[1:].view(T, 2 * N, 1, d).unbind(0), Z[1::2].unsqueeze(2).unbind(0)
    dh_in, G_lhs = Z[0::2].unbind(0), Z[: 2 * T].view(T, 2, N, d).permute(0, 2, 3, 1).unbind(0)
    p_t, dA_kq = KQ.unbind(0), dA[..., : 2 * d].reshape(T, N, 2, d).transpose(1, 2).unbind(0)
    dA_v, dA_b = dA[..., 2 * d: 3 * d].reshape(T, N, 1, d).unbind(0), dA[..., 3 * d:].reshape(T, N, 1, 1).unbind(0)
    gkq, ds, RT = A.new_empty(2 * N, 1, F), A.new_empty(H, B, d), R.mT
    gk = gkq.view(2, N, F)[0]
    for t in range(T - 1, -1, -1):
        torch.bmm(bk[t], G.mT, out=dr[t])  # dr = b G k
        Gu = torch.bmm(u[t], G)  # G^T u
        torch.bmm(drdh[t], pairs[t], out=gkq)  # [W_{t-1}^T dr; W_t^T dh = dq]
        if t in resets:
            gk.view(H, B, F).mul_(keep[t])  # W_in_t = 0 in the rows that start at t
        torch.sub(Gu.view(N, F), gk, out=gk)  # dk
        torch.bmm(Gu, k1b[t], out=dA_b[t])
        _phi_vjp(feature_map, gkq.view(2, N, F), p_t[t], saved_t[t], dA_kq[t], index)
        dA_v[t].copy_(dr[t])
        if t == 0:
            break
        torch.bmm(dA[t], RT, out=ds)
        dh_in[t].view(H, B, d).addcmul_(ds, ds2[t])  # dh_{t-1}
        if t in resets:
            G.addcmul_(dr[t].mT, k[t], value=-1).view(H, B, d * F).mul_(keep[t])
            G.addcmul_(dh_in[t].unsqueeze(-1), q[t - 1])
        else:
            G.baddbmm_(G_lhs[t], KQ2[t])  # + dh_{t-1} q_{t-1}^T - dr_t k_t^T
    dh0 = torch.bmm(dA[0], RT).mul_(ds2[0]).transpose(0, 1).contiguous() if need_h0 else None
    if not need_W0:
        return dA, None, dh0
    G.addcmul_(dr[0].mT, k[0], value=-1).view(H, B, d * F).mul_(keep[0])
    return dA, G.view(H, B, d, F).transpose(0, 1).contiguous(), dh0


def _step_backward(rec: _Records, keep: Tensor, resets: set[int], feature_map: str, dy: Tensor | None,
                   dWT: Tensor | None, dhT: Tensor | None) -> Tensor:
    """Grad mode step: the gradient of a (all steps at once; nothing is carried back)."""
    A, KQ, Ws, _, _, u, b = rec
    T, H, B, D = A.shape
    d, F = Ws.shape[-2:]
    N = H * B
    dh = A.new_zeros(T, N, d)
    if dy is not None:
        dh.view(T, H, B, d).copy_(dy.transpose(1, 2))
    if dhT is not None:
        dh[T - 1] += _heads_first(dhT, (N, d))
    k, q = KQ.unbind(1)  # [T, N, F]
    u, b = u.view(T, N, d), b.view(T, N, 1)
    dr = dh * (b * torch.linalg.vecdot(q, k).unsqueeze(-1))  # b G k, G = dh q^T
    Gu = q * torch.linalg.vecdot(dh, u).unsqueeze(-1)  # G^T u
    if dWT is not None:
        dWT = _heads_first(dWT, (N, d, F))
        dr[T - 1] += b[T - 1] * torch.bmm(k[T - 1].unsqueeze(1), dWT.mT).view(N, d)
        Gu[T - 1] += torch.bmm(u[T - 1].unsqueeze(1), dWT).view(N, F)
    dq = torch.bmm(dh.view(T * N, 1, d), Ws[1:].view(T * N, d, F)).view(T, N, F)
    dk_in = torch.bmm(dr.view(T * N, 1, d), Ws[:T].view(T * N, d, F)).view(T, N, F)
    if resets:
        dk_in.view(T, H, B, F).mul_(keep)  # W_in_t = 0 in the rows that start at t
    dA = torch.empty_like(A)
    z_kq = A[..., : 2 * d].reshape(T, N, 2, d).transpose(1, 2)  # [T, 2, N, d]
    _phi_vjp(feature_map, torch.stack([Gu - dk_in, dq], dim=1), KQ,
             _phi_saved(feature_map, z_kq), dA[..., : 2 * d].reshape(T, N, 2, d).transpose(1, 2),
             _dpfp_unroll_index(feature_map, d, A.device))
    dA[..., 2 * d: 3 * d].copy_(dr.view(T, H, B, d))
    torch.linalg.vecdot(Gu, k * (1 - b), out=dA[..., 3 * d].view(T, N))
    return dA


class _RDN(torch.autograd.Function):
    """The recurrence on x [T, H, B, 3d + 1] (the slow net's part, heads first) and R [H, d, 3d + 1]
    from W0 [B, H, d, F] and h0 [B, H, d]; returns y [T, B, H, d], W_T, h_T."""

    @staticmethod
    def forward(ctx, x, R, W0, h0, reset, resets, feature_map, full):
        keep = _keep(reset, x.dtype)
        rec = _record(x, R, W0, h0, keep, resets, feature_map)
        ctx.save_for_backward(R, keep, *rec)
        ctx.resets, ctx.feature_map, ctx.full = resets, feature_map, full
        ctx.set_materialize_grads(False)
        return _outputs(rec)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dWT, dhT):
        R, keep, *saved = ctx.saved_tensors
        rec = _Records(*saved)
        if ctx.full:
            dA, dW0, dh0 = _full_backward(rec, R, keep, ctx.resets, ctx.feature_map, dy, dWT, dhT,
                                          ctx.needs_input_grad[2], ctx.needs_input_grad[3])
        else:  # W0 and h0 are detached (every step starts from the detached state)
            dA, dW0, dh0 = _step_backward(rec, keep, ctx.resets, ctx.feature_map, dy, dWT, dhT), None, None
        dR = torch.einsum("thbi,thbj->hij", rec.S, dA) if ctx.needs_input_grad[1] else None
        return dA, dR, dW0, dh0, None, None, None, None


def _keep(reset: Tensor, dtype: torch.dtype) -> Tensor:
    """[T, 1, B, 1]: 0 where ``reset`` [T, B] starts an episode, else 1 (heads first)."""
    return (~reset).to(dtype).view(reset.shape[0], 1, reset.shape[1], 1)


def _one_step(x: Tensor, R: Tensor, W0: Tensor, h0: Tensor, reset: Tensor, feature_map: str
              ) -> tuple[Tensor, Tensor, Tensor]:
    """One step without a gradient (acting) in the fewest calls, batch rows first as the inputs and
    the state come (x [1, B, H, 3d + 1], N = B x H): the calls of :func:`_record` without records,
    and W_1 written once, into a new tensor."""
    _, B, H, _ = x.shape
    d, F = W0.shape[-2:]
    N = B * H
    W, h = W0.reshape(N, d, F), h0
    restart = bool(reset.any())
    if restart:
        W, h = keep_rows(W.view(B, H * d, F), reset[0]).view(N, d, F), keep_rows(h, reset[0])
    a = torch.baddbmm(x[0].transpose(0, 1), torch.tanh(h).transpose(0, 1), R).transpose(0, 1)
    kq = x.new_empty(B, H, 2, F)
    _phi_into(feature_map, a[..., : 2 * d].unflatten(-1, (2, d)), kq)
    k, q = kq.view(N, 2, F).split(1, dim=1)
    u = torch.baddbmm(a[..., 2 * d: 3 * d].reshape(N, 1, d), k, W.mT, alpha=-1)
    u.view(B, H, d).mul_(torch.sigmoid(a[..., 3 * d:]))
    W = W.addcmul_(u.mT, k) if restart else torch.addcmul(W, u.mT, k)  # after a reset W is a copy
    y = torch.bmm(q, W.mT).view(1, B, H, d)
    return y, W.view(B, H, d, F), y[0].clone()


def rdn_cpu(
    xq: Tensor, xk: Tensor, xv: Tensor, xb: Tensor, Rq: Tensor, Rk: Tensor, Rv: Tensor, rb: Tensor,
    W0: Tensor, h0: Tensor, reset: Tensor, *, feature_map: str = "softmax",
    grad_mode: str = "full",
) -> tuple[Tensor, Tensor, Tensor]:
    """The RDN recurrence of ``naive.rdn_reference`` (same arguments and results, to round-off) with
    the hand-derived backward above."""
    check_grad_mode(grad_mode)
    check_feature_map(feature_map)
    if grad_mode == "step":  # the reference detaches the carried state at every step, the first too
        W0, h0 = W0.detach(), h0.detach()
    R = torch.cat([Rk, Rq, Rv, rb.unsqueeze(1)], dim=1).mT  # [H, d, 3d + 1]: s -> R s per head
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (xq, xk, xv, xb, R, W0, h0))
    if not needs_grad and xq.shape[0] == 1:
        return _one_step(torch.cat([xk, xq, xv, xb.unsqueeze(-1)], dim=-1), R, W0, h0, reset, feature_map)
    x = torch.cat([xk.transpose(1, 2), xq.transpose(1, 2), xv.transpose(1, 2), xb.transpose(1, 2).unsqueeze(-1)],
                  dim=-1)  # [T, H, B, 3d + 1]: heads first
    if needs_grad:
        return _RDN.apply(x, R, W0, h0, reset, reset_steps(reset), feature_map, grad_mode == "full")
    return _outputs(_record(x, R, W0, h0, _keep(reset, x.dtype), reset_steps(reset), feature_map, states=False))
