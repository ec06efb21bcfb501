"""eLSTM recurrence (Paper 004, Eq. 5-6) and its exact RTRL gradients (Eq. 8-12): the PyTorch reference.

Per step, element-wise over the hidden units i (x_t has entries x_j):

    u_t = W_z x_t + w_z * c_{t-1} + b_z ,   z_t = tanh(u_t)                (Eq. 5)
    g_t = W_f x_t + w_f * c_{t-1} + b_f ,   f_t = sigmoid(g_t)             (Eq. 5)
    c_t = f_t * c_{t-1} + (1 - f_t) * z_t                                  (Eq. 6)

Local derivatives (PAPERS.md §3):

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

:func:`rtrl_reference` is the definition: forward mode, a per-step loop that *is* the equations
above (the tests compare the core's path against it and against autograd BPTT). The core runs
``recurrence.py`` (the same maths without the [B, H, D] sensitivities of every step), which takes
the keys and :func:`local_derivatives` from here.
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
