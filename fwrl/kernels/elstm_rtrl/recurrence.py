"""The eLSTM recurrence as the eLSTM core runs it (PyTorch ops on any device; no fused kernel).

The maths (Eq. 5-12, the local derivatives a, b, d and the sensitivities) and the reference that
defines them (:func:`~fwrl.kernels.elstm_rtrl.naive.rtrl_reference`) are in ``naive.py``. Here:

* :func:`elstm_scan` -- the recurrence over T steps, differentiable by autograd (truncated BPTT).
* :func:`elstm_rtrl` -- a ``torch.autograd.Function`` for the learner and
  inference. Its backward computes the gradient (Eq. 10/12) without materialising Z_t for
  every t: unrolling the linear recursion gives
  ``Z_t = (prod_{r<=t} d_r) Z_0 + sum_{s<=t} (prod_{s<r<=t} d_r) a_s x_s^T``, so
  with the reverse accumulation ``e_s = delta_s + d_{s+1} e_{s+1}``

      dL/dW_z = sum_b (d_1 e_1) Z_0 + sum_{s,b} (e_s a_s) x_s^T

  (the same for the others with F_0/b, s_*0, c_{s-1} or 1). This is the RTRL
  gradient exactly (not truncated: Z_0 carries everything before the segment),
  computed with a few matrix products instead of T updates of [B, H, D]
  tensors. The final sensitivities for the next segment are computed the same
  way (seed 1 at the last step). Both walk the steps backwards in blocks of
  ``CHUNK_STEPS``, so the temporaries of the pass are O(CHUNK_STEPS*B*H).

  Memory kept for backward: only the input x and the function's own output c
  (the core's output gate and h = o * c keep those storages for their own
  backward anyway), the [T, B] bool reset mask, and O(1)-in-T tensors (the
  weights, c_0 and the initial sensitivities). Backward recomputes
  c_{t-1} (c shifted by one step, c_0 first, zeroed on resets) and from it
  a, b, d with one GEMM for the z/f pre-activations of all steps plus
  element-wise ops (:func:`recompute_derivatives`), instead of keeping
  a, b, d, c_{t-1} ([T, B, H] each) alive between forward and backward.
  Never O(T*B*H*D).
  The input x gets only the one-step Jacobian ``dc_t/dx_t = a_t W_z + b_t W_f``
  (row-wise), so a vision stem below the eLSTM trains (PAPERS.md §3).
* :func:`advance_sensitivities` -- acting (no autograd): the forward-mode recursions of the
  reference, in fewer calls per step.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .naive import PARAM_KEYS, SENSITIVITY_KEYS, local_derivatives


def elstm_scan(
    x: Tensor, c0: Tensor, W_z: Tensor, W_f: Tensor, w_z: Tensor, w_f: Tensor,
    b_z: Tensor, b_f: Tensor, done: Tensor, *, with_derivatives: bool = False,
):
    """Run Eq. 5-6 over T steps with resets; returns c [T, B, H].

    The input projections of all steps are one matrix product; only the
    element-wise recurrence loops over t. Differentiable by autograd (BPTT).
    With ``with_derivatives`` also returns (a, b, d_eff, c_prev), each
    [T, B, H], where d_eff is d zeroed on rows reset before that step.
    """
    U = x @ W_z.T + b_z
    G = x @ W_f.T + b_f
    c = c0
    cs, As, Bs, Ds, Ps = [], [], [], [], []
    for t in range(x.shape[0]):
        keep = (~done[t]).to(c.dtype)[:, None]
        c_prev = c * keep
        z = torch.tanh(U[t] + w_z * c_prev)
        f = torch.sigmoid(G[t] + w_f * c_prev)
        c = f * c_prev + (1 - f) * z
        cs.append(c)
        if with_derivatives:
            a, b, d = local_derivatives(c_prev, z, f, w_z, w_f)
            As.append(a)
            Bs.append(b)
            Ds.append(d * keep)
            Ps.append(c_prev)
    c_all = torch.stack(cs)
    if not with_derivatives:
        return c_all
    return c_all, torch.stack(As), torch.stack(Bs), torch.stack(Ds), torch.stack(Ps)


def recompute_derivatives(
    x: Tensor, c_all: Tensor, c0: Tensor, W_z: Tensor, W_f: Tensor, w_z: Tensor, w_f: Tensor,
    b_z: Tensor, b_f: Tensor, done: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(a, b, d_eff, c_prev), each [T, B, H], from the inputs and the c sequence.

    The same values :func:`elstm_scan` returns ``with_derivatives``, without the
    sequential loop: c_{t-1} is c shifted by one step (c_0 first) and zeroed on
    rows reset before step t, so the pre-activations of all steps are one GEMM
    (W_z and W_f stacked) and the rest is element-wise.
    """
    H = c_all.shape[-1]
    keep = (~done).to(c_all.dtype)[..., None]  # [T, B, 1]
    c_prev = torch.cat([c0[None], c_all[:-1]]) * keep
    pre = x @ torch.cat([W_z, W_f]).T  # [T, B, 2H]
    z = torch.tanh(pre[..., :H] + b_z + w_z * c_prev)
    f = torch.sigmoid(pre[..., H:] + b_f + w_f * c_prev)
    del pre
    a, b, d = local_derivatives(c_prev, z, f, w_z, w_f)
    return a, b, d * keep, c_prev


# steps per block of the reverse pass: its temporaries are [CHUNK_STEPS, B, H]
CHUNK_STEPS = 16


def _reverse_sums(
    x: Tensor, c_all: Tensor, c0: Tensor, params: tuple[Tensor, ...], done: Tensor,
    delta: Tensor | None, *, per_row: bool, need_x: bool = False,
) -> tuple[Tensor, tuple[Tensor, ...], Tensor | None]:
    """The reverse accumulation of the module docstring, in blocks of CHUNK_STEPS steps.

    e_t = delta_t + d_{t+1} e_{t+1} (e_{T+1} = 0); with ``delta=None`` the seed
    is 1 at the last step and 0 elsewhere (e_t = prod_{t<r<=T} d_r, the weights
    of the final sensitivities). Walking the steps backwards block by block,
    a, b, d, c_{t-1} of a block are recomputed (:func:`recompute_derivatives`)
    and folded into the sums at once, so the temporaries never span all T steps.

    Returns (e0 = d_1 e_1 [B, H], the sums of e a x^T, e b x^T, e a c_{t-1},
    e b c_{t-1}, e a, e b over steps (and over rows unless ``per_row``), and
    with ``need_x`` the one-step input gradient (delta a) W_z + (delta b) W_f).
    """
    T, B, D = x.shape
    H = c_all.shape[-1]
    W_z, W_f = params[0], params[1]
    sums: list[Tensor | None] = [None] * 6  # the first block's terms start the sums (no zeros)
    red = (0,) if per_row else (0, 1)
    g_x = torch.empty_like(x) if need_x else None
    acc = x.new_zeros(B, H) if delta is not None else x.new_ones(B, H)
    for stop in range(T, 0, -CHUNK_STEPS):
        start = max(stop - CHUNK_STEPS, 0)
        c_before = c0 if start == 0 else c_all[start - 1]
        a, b, d_eff, c_prev = recompute_derivatives(
            x[start:stop], c_all[start:stop], c_before, *params, done[start:stop]
        )
        e = torch.empty_like(a)
        for t in range(stop - start - 1, -1, -1):
            if delta is not None:
                acc = acc + delta[start + t]
            e[t] = acc
            acc = d_eff[t] * acc
        ea, eb = e * a, e * b
        xc = x[start:stop]
        # sum over the block's steps (and rows) of e a x^T, e b x^T: products that
        # accumulate in place, so no [B, H, D] temporary per block
        if per_row:  # [B, H, t] @ [B, t, D]
            lhs, rhs = (ea.permute(1, 2, 0), eb.permute(1, 2, 0)), xc.transpose(0, 1)
            product, accumulate = torch.bmm, Tensor.baddbmm_
        else:  # [H, t*B] @ [t*B, D]
            lhs, rhs = (ea.reshape(-1, H).T, eb.reshape(-1, H).T), xc.reshape(-1, D)
            product, accumulate = torch.mm, Tensor.addmm_
        for i in range(2):
            sums[i] = product(lhs[i], rhs) if sums[i] is None else accumulate(sums[i], lhs[i], rhs)
        small = ((ea * c_prev).sum(red), (eb * c_prev).sum(red), ea.sum(red), eb.sum(red))
        for i, term in enumerate(small, start=2):
            sums[i] = term if sums[i] is None else sums[i].add_(term)
        if g_x is not None:
            dc = delta[start:stop]
            g_x[start:stop] = (dc * a) @ W_z + (dc * b) @ W_f
    return acc, tuple(sums), g_x


class _ElstmRTRL(torch.autograd.Function):
    """Exact RTRL for the eLSTM recurrence; see the module docstring."""

    @staticmethod
    def forward(ctx, x, W_z, W_f, w_z, w_f, b_z, b_f, done, c0, Z0, F0, s_wz0, s_wf0, s_bz0, s_bf0):
        params = (W_z, W_f, w_z, w_f, b_z, b_f)
        with torch.no_grad():
            c_all = elstm_scan(x, c0, *params, done)
            # final sensitivities: the same sums with delta = 1 at the last step, per row
            w0, sums, _ = _reverse_sums(x, c_all, c0, params, done, None, per_row=True)
            # in place on the fresh sums: no further [B, H, D] temporaries
            Z_T = sums[0].addcmul_(w0[:, :, None], Z0)
            F_T = sums[1].addcmul_(w0[:, :, None], F0)
            s_wz, s_wf, s_bz, s_bf = (w0 * s0 + s for s0, s in zip((s_wz0, s_wf0, s_bz0, s_bf0), sums[2:]))
        # only x and the output c grow with T, and the output gate keeps both
        # anyway; a, b, d and c_{t-1} are recomputed in backward
        ctx.save_for_backward(x, c_all, done, c0, *params, Z0, F0, s_wz0, s_wf0, s_bz0, s_bf0)
        ctx.mark_non_differentiable(Z_T, F_T, s_wz, s_wf, s_bz, s_bf)
        return c_all, Z_T, F_T, s_wz, s_wf, s_bz, s_bf

    @staticmethod
    def backward(ctx, delta, *_unused):
        x, c_all, done, c0, *rest = ctx.saved_tensors
        params, sens0 = tuple(rest[:6]), rest[6:]
        need = ctx.needs_input_grad
        e0, sums, g_x = _reverse_sums(x, c_all, c0, params, done, delta, per_row=False, need_x=need[0])
        grads = []
        for i, (s, s0) in enumerate(zip(sums, sens0), start=1):  # W_z, W_f, w_z, w_f, b_z, b_f
            carried = torch.einsum("bh,bhd->hd", e0, s0) if s0.dim() == 3 else (e0 * s0).sum(0)
            grads.append(s + carried if need[i] else None)
        # no gradient into done, the initial c or the initial sensitivities:
        # RTRL carries the past in the sensitivities, not in a graph.
        return (g_x, *grads, None, None, None, None, None, None, None, None)


def advance_sensitivities(
    x: Tensor,
    c0: Tensor,
    sens0: dict[str, Tensor],
    params: dict[str, Tensor],
    done: Tensor,
) -> tuple[Tensor, dict[str, Tensor]]:
    """c and the sensitivities over T steps in forward mode, without autograd: acting, where the
    sensitivities only advance (T = 1). The recursions of the reference (``naive.rtrl_reference``)
    with the input projections of all steps in one product and each step's [B, H, D] updates as one
    product and one fused multiply-add (the Function's reverse sums are built for learning: per-row
    batched products of a T-step block, several times the calls for one step)."""
    p = params
    U = x @ torch.cat([p["W_z"], p["W_f"]]).T  # [T, B, 2H]
    H = c0.shape[-1]
    keeps = (~done).to(c0.dtype).unsqueeze(-1)  # [T, B, 1]: no host read (a CUDA graph captures acting)
    c, sens, cs = c0, dict(sens0), []
    for t in range(x.shape[0]):
        c_prev = c * keeps[t]
        z = torch.tanh(U[t, :, :H] + p["b_z"] + p["w_z"] * c_prev)
        f = torch.sigmoid(U[t, :, H:] + p["b_f"] + p["w_f"] * c_prev)
        c = torch.lerp(z, c_prev, f)  # f c_{t-1} + (1 - f) z
        a, b, d = local_derivatives(c_prev, z, f, p["w_z"], p["w_f"])
        d = d * keeps[t]  # a reset row starts its sensitivities from zero
        x_t = x[t].unsqueeze(1)
        sens = {
            "Z": (d.unsqueeze(-1) * sens["Z"]).addcmul_(a.unsqueeze(-1), x_t),
            "F": (d.unsqueeze(-1) * sens["F"]).addcmul_(b.unsqueeze(-1), x_t),
            "s_wz": torch.addcmul(a * c_prev, d, sens["s_wz"]),
            "s_wf": torch.addcmul(b * c_prev, d, sens["s_wf"]),
            "s_bz": torch.addcmul(a, d, sens["s_bz"]),
            "s_bf": torch.addcmul(b, d, sens["s_bf"]),
        }
        cs.append(c)
    return torch.stack(cs), sens


def elstm_rtrl(
    x: Tensor,
    c0: Tensor,
    sens0: dict[str, Tensor],
    params: dict[str, Tensor],
    done: Tensor,
) -> tuple[Tensor, dict[str, Tensor]]:
    """eLSTM over T steps with exact RTRL gradients for the recurrent parameters.

    x [T, B, D], c0 [B, H], sens0 (keys ``SENSITIVITY_KEYS``), params (keys
    ``PARAM_KEYS``), done [T, B] bool. Returns (c [T, B, H], final
    sensitivities). Backpropagating a loss into c fills the gradients of the
    six recurrent parameters with sum_t delta_t . dc_t/dtheta (carried
    sensitivities included) and gives x the one-step Jacobian only; c0 and
    sens0 receive no gradient. Without autograd (acting) the forward-mode recursions run instead
    (:func:`advance_sensitivities`: the same values, in fewer calls for a step).
    """
    if not torch.is_grad_enabled():
        return advance_sensitivities(x, c0, sens0, params, done)
    out = _ElstmRTRL.apply(
        x, *(params[k] for k in PARAM_KEYS), done, c0.detach(),
        *(sens0[k].detach() for k in SENSITIVITY_KEYS),
    )
    return out[0], dict(zip(SENSITIVITY_KEYS, out[1:]))
