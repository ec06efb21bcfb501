"""eLSTM recurrence (Paper 004, Eq. 5-6) and its exact RTRL gradients (Eq. 8-12).

Per step, element-wise over the hidden units i (x_t has entries x_j):

    u_t = W_z x_t + w_z * c_{t-1} + b_z ,   z_t = tanh(u_t)                (Eq. 5)
    g_t = W_f x_t + w_f * c_{t-1} + b_f ,   f_t = sigmoid(g_t)             (Eq. 5)
    c_t = f_t * c_{t-1} + (1 - f_t) * z_t                                  (Eq. 6)

Local derivatives (REFERENCE §3):

    a_t = dc_t/du_t     = (1 - f_t)(1 - z_t^2)
    b_t = dc_t/dg_t     = (c_{t-1} - z_t) f_t (1 - f_t)         (Eq. 8/11, "f hat")
    d_t = dc_t/dc_{t-1} = f_t + a_t w_z + b_t w_f               (total, one step)

Note: Eq. 9/12 as printed give the factor ``f + w^f * fhat`` only; the path
c_{t-1} -> z_t through w_z adds ``a_t w_z``. Without it RTRL is not exact (the
tests compare against autograd BPTT and fail without that term).

The sensitivities (total derivatives of c_t w.r.t. each recurrent parameter;
c_t[i] depends only on row i of W_z and W_f, so they are [B, H, D] and [B, H]):

    Z_t[i,j] = d_t[i] Z_{t-1}[i,j] + a_t[i] x_t[j]      (dc_t[i]/dW_z[i,j])
    F_t[i,j] = d_t[i] F_{t-1}[i,j] + b_t[i] x_t[j]      (dc_t[i]/dW_f[i,j], Eq. 9/12)
    s_wz_t   = d_t s_wz_{t-1} + a_t c_{t-1}             (dc_t/dw_z)
    s_wf_t   = d_t s_wf_{t-1} + b_t c_{t-1}             (dc_t/dw_f)
    s_bz_t   = d_t s_bz_{t-1} + a_t                     (dc_t/db_z)
    s_bf_t   = d_t s_bf_{t-1} + b_t                     (dc_t/db_f)

and the gradient (Eq. 10/12) is ``dL/dW_z[i,j] = sum_t sum_b delta_t[i] Z_t[i,j]``
with delta_t = dL/dc_t along the direct paths only (output gate, heads), not
through c_{t+1}. A reset before step t (``done[t]``) sets c_{t-1} = 0 and all
sensitivities to 0 for that row (the initial state does not depend on the
parameters).

Two implementations of the same maths:

* :func:`rtrl_reference` -- forward mode, a per-step loop that *is* the
  equations above (used by the tests as the definition).
* :func:`elstm_rtrl` -- a ``torch.autograd.Function`` for the learner and
  inference. Its backward computes the same sum without materialising Z_t for
  every t: unrolling the linear recursion gives
  ``Z_t = (prod_{r<=t} d_r) Z_0 + sum_{s<=t} (prod_{s<r<=t} d_r) a_s x_s^T``, so
  with the reverse accumulation ``e_s = delta_s + d_{s+1} e_{s+1}``

      dL/dW_z = sum_b (d_1 e_1) Z_0 + sum_{s,b} (e_s a_s) x_s^T

  (the same for the others with F_0/b, s_*0, c_{s-1} or 1). This is the RTRL
  gradient exactly (not truncated: Z_0 carries everything before the segment),
  computed with one matrix product instead of T updates of [B, H, D] tensors.
  It saves a, b, d, c_{t-1} ([T, B, H] each), the inputs x and the initial
  sensitivities: O(T*B*H + B*H*D) memory, never O(T*B*H*D). The final
  sensitivities for the next segment are computed the same way.
  The input x gets only the one-step Jacobian ``dc_t/dx_t = a_t W_z + b_t W_f``
  (row-wise), so a vision stem below the eLSTM trains (REFERENCE §3).
"""

from __future__ import annotations

import torch
from torch import Tensor

SENSITIVITY_KEYS = ("Z", "F", "s_wz", "s_wf", "s_bz", "s_bf")
PARAM_KEYS = ("W_z", "W_f", "w_z", "w_f", "b_z", "b_f")
# which parameter each sensitivity belongs to
SENSITIVITY_OF = dict(zip(PARAM_KEYS, SENSITIVITY_KEYS))


def initial_sensitivities(
    batch_size: int, hidden_size: int, input_size: int, *, dtype=None, device=None
) -> dict[str, Tensor]:
    """Zero sensitivities: Z, F [B, H, D]; s_wz, s_wf, s_bz, s_bf [B, H]."""
    big = (batch_size, hidden_size, input_size)
    small = (batch_size, hidden_size)
    return {
        key: torch.zeros(big if key in ("Z", "F") else small, dtype=dtype, device=device)
        for key in SENSITIVITY_KEYS
    }


def elstm_cell(
    x_t: Tensor, c_prev: Tensor, W_z: Tensor, W_f: Tensor, w_z: Tensor, w_f: Tensor,
    b_z: Tensor, b_f: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    """One eLSTM step (Eq. 5-6): returns (c_t, z_t, f_t); x_t [B, D], c_prev [B, H]."""
    z = torch.tanh(x_t @ W_z.T + w_z * c_prev + b_z)
    f = torch.sigmoid(x_t @ W_f.T + w_f * c_prev + b_f)
    return f * c_prev + (1 - f) * z, z, f


def local_derivatives(
    c_prev: Tensor, z: Tensor, f: Tensor, w_z: Tensor, w_f: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """(a, b, d) of one step: dc/du, dc/dg and the diagonal dc_t/dc_{t-1}."""
    a = (1 - f) * (1 - z * z)
    b = (c_prev - z) * f * (1 - f)
    return a, b, f + a * w_z + b * w_f


def rtrl_reference(
    x: Tensor,
    c0: Tensor,
    sens0: dict[str, Tensor],
    params: dict[str, Tensor],
    done: Tensor,
    delta: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor], dict[str, Tensor]]:
    """Forward-mode RTRL over T steps, literally the sensitivity recursions.

    x [T, B, D], c0 [B, H], sens0 as :func:`initial_sensitivities`, params
    with keys ``PARAM_KEYS``, done [T, B] bool, delta [T, B, H] = dL/dc_t along
    direct paths (optional). Returns (c [T, B, H], final sensitivities,
    gradients {param: sum_t delta_t . dc_t/dparam}).
    """
    p = params
    c = c0
    sens = dict(sens0)
    grads = {key: torch.zeros_like(p[key]) for key in PARAM_KEYS}
    cs = []
    for t in range(x.shape[0]):
        keep = (~done[t]).to(c.dtype)
        c_prev = c * keep[:, None]
        sens = {k: v * keep.view(-1, *([1] * (v.dim() - 1))) for k, v in sens.items()}
        c, z, f = elstm_cell(x[t], c_prev, p["W_z"], p["W_f"], p["w_z"], p["w_f"], p["b_z"], p["b_f"])
        a, b, d = local_derivatives(c_prev, z, f, p["w_z"], p["w_f"])
        sens = {
            "Z": d[:, :, None] * sens["Z"] + a[:, :, None] * x[t][:, None, :],
            "F": d[:, :, None] * sens["F"] + b[:, :, None] * x[t][:, None, :],
            "s_wz": d * sens["s_wz"] + a * c_prev,
            "s_wf": d * sens["s_wf"] + b * c_prev,
            "s_bz": d * sens["s_bz"] + a,
            "s_bf": d * sens["s_bf"] + b,
        }
        if delta is not None:
            for key in ("W_z", "W_f"):
                grads[key] += (delta[t][:, :, None] * sens[SENSITIVITY_OF[key]]).sum(0)
            for key in ("w_z", "w_f", "b_z", "b_f"):
                grads[key] += (delta[t] * sens[SENSITIVITY_OF[key]]).sum(0)
        cs.append(c)
    return torch.stack(cs), sens, grads


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


def _suffix_weights(d_eff: Tensor, seed: Tensor) -> tuple[Tensor, Tensor]:
    """Reverse accumulation through the diagonal recursion.

    Returns (e [T, B, H], e0 [B, H]) with e_t = seed_t + d_{t+1} e_{t+1} and
    e0 = d_1 e_1, the weight that multiplies the initial sensitivities.
    """
    e = torch.empty_like(seed)
    acc = torch.zeros_like(seed[0])
    for t in range(seed.shape[0] - 1, -1, -1):
        acc = seed[t] + acc
        e[t] = acc
        acc = d_eff[t] * acc
    return e, acc


class _ElstmRTRL(torch.autograd.Function):
    """Exact RTRL for the eLSTM recurrence; see the module docstring."""

    @staticmethod
    def forward(ctx, x, W_z, W_f, w_z, w_f, b_z, b_f, done, c0, Z0, F0, s_wz0, s_wf0, s_bz0, s_bf0):
        with torch.no_grad():
            c_all, a, b, d_eff, c_prev = elstm_scan(
                x, c0, W_z, W_f, w_z, w_f, b_z, b_f, done, with_derivatives=True
            )
            # final sensitivities: the same sums with delta = 1 at the last step, per row
            seed = torch.zeros_like(a)
            seed[-1] = 1
            weight, w0 = _suffix_weights(d_eff, seed)
            wa, wb = weight * a, weight * b
            Z_T = w0[:, :, None] * Z0 + torch.einsum("tbh,tbd->bhd", wa, x)
            F_T = w0[:, :, None] * F0 + torch.einsum("tbh,tbd->bhd", wb, x)
            s_wz = w0 * s_wz0 + (wa * c_prev).sum(0)
            s_wf = w0 * s_wf0 + (wb * c_prev).sum(0)
            s_bz = w0 * s_bz0 + wa.sum(0)
            s_bf = w0 * s_bf0 + wb.sum(0)
        ctx.save_for_backward(x, W_z, W_f, a, b, d_eff, c_prev, Z0, F0, s_wz0, s_wf0, s_bz0, s_bf0)
        ctx.mark_non_differentiable(Z_T, F_T, s_wz, s_wf, s_bz, s_bf)
        return c_all, Z_T, F_T, s_wz, s_wf, s_bz, s_bf

    @staticmethod
    def backward(ctx, delta, *_unused):
        x, W_z, W_f, a, b, d_eff, c_prev, Z0, F0, s_wz0, s_wf0, s_bz0, s_bf0 = ctx.saved_tensors
        need = ctx.needs_input_grad
        e, e0 = _suffix_weights(d_eff, delta)
        ea, eb = e * a, e * b
        x2 = x.reshape(-1, x.shape[-1])  # [T*B, D]
        g_x = g_Wz = g_Wf = g_wz = g_wf = g_bz = g_bf = None
        if need[0]:
            g_x = (delta * a) @ W_z + (delta * b) @ W_f
        if need[1]:
            g_Wz = ea.reshape(x2.shape[0], -1).T @ x2 + torch.einsum("bh,bhd->hd", e0, Z0)
        if need[2]:
            g_Wf = eb.reshape(x2.shape[0], -1).T @ x2 + torch.einsum("bh,bhd->hd", e0, F0)
        if need[3]:
            g_wz = (ea * c_prev).sum((0, 1)) + (e0 * s_wz0).sum(0)
        if need[4]:
            g_wf = (eb * c_prev).sum((0, 1)) + (e0 * s_wf0).sum(0)
        if need[5]:
            g_bz = ea.sum((0, 1)) + (e0 * s_bz0).sum(0)
        if need[6]:
            g_bf = eb.sum((0, 1)) + (e0 * s_bf0).sum(0)
        # no gradient into done, the initial c or the initial sensitivities:
        # RTRL carries the past in the sensitivities, not in a graph.
        return g_x, g_Wz, g_Wf, g_wz, g_wf, g_bz, g_bf, None, None, None, None, None, None, None, None


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
    sens0 receive no gradient.
    """
    out = _ElstmRTRL.apply(
        x, *(params[k] for k in PARAM_KEYS), done, c0.detach(),
        *(sens0[k].detach() for k in SENSITIVITY_KEYS),
    )
    return out[0], dict(zip(SENSITIVITY_KEYS, out[1:]))
