"""The GRU of ``naive`` on the CPU: the input's products for all steps at once, seven torch calls a
step, and a hand-derived backward whose weight gradients are two large products after the loop.

Why: ``nn.GRU`` runs a whole sequence in one fused call, but a rollout of B columns has an episode
start every few steps somewhere (POPGym's episodes are 51 steps: at B 32, 18 starts in T 41), and
each start cuts the sequence (``memory_modules.base.run_in_segments``), so on the CPU it ran as
many short calls, each with its own autograd record and small per-step products for every
weight gradient. Here the resets are a multiply at the steps that have one (read on the host once),
the products with the input (forward ``W_i x``, backward ``dx`` and ``dW_i``) and with the carried
state (``dW_h``) run once over all T x B rows, and only the recurrent product ``W_h h`` and its
transpose stay in the step loop.

Forward, per step t, with ``h`` the state step t starts from (zero in the rows that reset at t),
``gi_t = W_i x_t + b_i`` (all steps, one product) and the [B, 3H] recurrent part ``gh_t``:

    gh_t = W_h h + b_h
    rz_t = sigmoid(gi_t[r, z] + gh_t[r, z])            (r_t, z_t)
    n_t  = tanh(gi_t[n] + r_t * gh_t[n])
    h_t  = n_t + z_t * (h - n_t)

Backward, from the last step down, with ``dh`` the gradient of h_t (its output's plus what came back
from step t + 1), and, computed for all steps before the loop, ``A = (1 - z)(1 - n^2)``,
``C = gh[n] r (1 - r)`` and ``E = (h_in - n) z (1 - z)`` (h_in: the state each step started from):

    dpre_n = dh A                       (the gradient of gi[n], and of gh[n] times r)
    dpre_r = dpre_n C
    dpre_z = dh E
    dh_in  = dh z + [dpre_r, dpre_z, dpre_n r] W_h      (zeroed in the rows that reset at t)

then, batched: ``dW_h = dgh^T h_in``, ``db_h = sum dgh``, ``dx = dgi W_i``, ``dW_i = dgi^T x``,
``db_i = sum dgi`` (dgi = [dpre_r, dpre_z, dpre_n]). Agrees with the reference to round-off
(float64 ~1e-15; ``tests/unit/test_gru_cpu.py``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from fwrl.kernels.cpu_common import reset_steps


def _forward(gi: Tensor, h0: Tensor, keep: Tensor, resets: set[int], w_hh_t: Tensor, b_hh: Tensor,
             gh: Tensor, rz: Tensor, n: Tensor, y: Tensor) -> Tensor:
    """Fill ``gh`` [T, B, 3H], ``rz`` [T, B, 2H], ``n`` and ``y`` [T, B, H] step by step; returns h_T."""
    H = h0.shape[-1]
    h = h0
    for t in range(gi.shape[0]):
        if t in resets:
            h = h * keep[t]
        torch.addmm(b_hh, h, w_hh_t, out=gh[t])
        torch.sigmoid(torch.add(gi[t, :, :2 * H], gh[t, :, :2 * H]), out=rz[t])
        torch.addcmul(gi[t, :, 2 * H:], rz[t, :, :H], gh[t, :, 2 * H:], out=n[t]).tanh_()
        h = torch.addcmul(n[t], rz[t, :, H:], h - n[t], out=y[t])
    return h


class _GRU(torch.autograd.Function):
    """One GRU layer over T steps: x [T, B, D], h0 [B, H], keep [T, B, 1] (0 where a row resets),
    the layer's weights; returns y [T, B, H] and h_T."""

    @staticmethod
    def forward(ctx, x, h0, keep, w_ih, w_hh, b_ih, b_hh, resets: set[int]):
        T, B, D = x.shape
        H = h0.shape[-1]
        gi = torch.addmm(b_ih, x.reshape(T * B, D), w_ih.t()).view(T, B, 3 * H)
        gh, rz = x.new_empty(T, B, 3 * H), x.new_empty(T, B, 2 * H)
        n, y = x.new_empty(T, B, H), x.new_empty(T, B, H)
        hT = _forward(gi, h0, keep, resets, w_hh.t(), b_hh, gh, rz, n, y)
        ctx.save_for_backward(x, h0, keep, w_ih, w_hh, gh, rz, n, y)
        ctx.resets = resets
        return y, hT.clone() if T > 0 else h0.clone()

    @staticmethod
    def backward(ctx, dy, dhT):
        x, h0, keep, w_ih, w_hh, gh, rz, n, y = ctx.saved_tensors
        T, B, H = y.shape
        h_in = torch.cat([h0.unsqueeze(0), y[:-1]]) * keep  # the state each step started from
        r, z = rz[..., :H], rz[..., H:]
        A = (1 - z) * (1 - n * n)
        C = gh[..., 2 * H:] * r * (1 - r)
        E = (h_in - n) * z * (1 - z)
        dgi, dgh = x.new_empty(T, B, 3 * H), x.new_empty(T, B, 3 * H)
        carry = dhT if dhT is not None else torch.zeros_like(h0)
        for t in range(T - 1, -1, -1):
            dh = carry if dy is None else dy[t] + carry
            dpre_n = torch.mul(dh, A[t], out=dgi[t, :, 2 * H:])
            torch.mul(dpre_n, C[t], out=dgh[t, :, :H])
            torch.mul(dh, E[t], out=dgh[t, :, H:2 * H])
            torch.mul(dpre_n, r[t], out=dgh[t, :, 2 * H:])
            carry = torch.addmm(dh * z[t], dgh[t], w_hh)
            if t in ctx.resets:
                carry = carry * keep[t]
        dgi[..., :2 * H] = dgh[..., :2 * H]
        dgi2, dgh2 = dgi.view(T * B, 3 * H), dgh.view(T * B, 3 * H)
        x2 = x.reshape(T * B, -1)
        dx = (dgi2 @ w_ih).view(x.shape) if ctx.needs_input_grad[0] else None
        dw_ih = dgi2.t() @ x2 if ctx.needs_input_grad[3] else None
        dw_hh = dgh2.t() @ h_in.view(T * B, H) if ctx.needs_input_grad[4] else None
        db_ih = dgi2.sum(0) if ctx.needs_input_grad[5] else None
        db_hh = dgh2.sum(0) if ctx.needs_input_grad[6] else None
        return dx, carry, None, dw_ih, dw_hh, db_ih, db_hh, None


def gru_cpu(x: Tensor, h0: Tensor, reset: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor,
            b_hh: Tensor) -> tuple[Tensor, Tensor]:
    """``naive.gru_reference`` (same arguments, same results to round-off), with the backward above
    where a gradient is needed, and the forward alone (no records) where none is (acting)."""
    T, B, D = x.shape
    H = h0.shape[-1]
    resets = reset_steps(reset) if T > 1 else ({0} if bool(reset.any()) else set())
    keep = (~reset).to(x.dtype).unsqueeze(-1)
    needs_grad = torch.is_grad_enabled() and any(
        t.requires_grad for t in (x, h0, w_ih, w_hh, b_ih, b_hh))
    if needs_grad:
        return _GRU.apply(x, h0, keep, w_ih, w_hh, b_ih, b_hh, resets)
    gi = torch.addmm(b_ih, x.reshape(T * B, D), w_ih.t()).view(T, B, 3 * H)
    gh, rz = x.new_empty(T, B, 3 * H), x.new_empty(T, B, 2 * H)
    n, y = x.new_empty(T, B, H), x.new_empty(T, B, H)
    hT = _forward(gi, h0, keep, resets, w_hh.t(), b_hh, gh, rz, n, y)
    return y, hT
