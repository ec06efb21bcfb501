"""The GRU recurrence with episode resets, per step: the PyTorch reference.

Cho et al. 2014 ("Learning Phrase Representations using RNN Encoder-Decoder for Statistical
Machine Translation", EMNLP), Eq. 5-8, in the form ``torch.nn.GRU`` computes (the reset gate
multiplies the recurrent product after its bias, as cuDNN does):

    r_t = sigmoid(W_ir x_t + b_ir + W_hr h + b_hr)
    z_t = sigmoid(W_iz x_t + b_iz + W_hz h + b_hz)
    n_t = tanh(W_in x_t + b_in + r_t * (W_hn h + b_hn))
    h_t = (1 - z_t) * n_t + z_t * h

with ``h`` = h_{t-1}, or 0 in the rows whose episode starts at step t (``reset[t]``). The weights
are ``nn.GRU``'s of one layer: ``w_ih`` [3H, D] and ``w_hh`` [3H, H] stacked (r, z, n), biases
[3H]. Shapes: x [T, B, D], h0 [B, H], reset [T, B] bool; returns (h_t for every t [T, B, H], h_T).
"""

from __future__ import annotations

import torch
from torch import Tensor


def gru_reference(x: Tensor, h0: Tensor, reset: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor,
                  b_hh: Tensor) -> tuple[Tensor, Tensor]:
    """One GRU layer over T steps, a step at a time (autograd differentiates it)."""
    h, ys = h0, []
    for t in range(x.shape[0]):
        h = h * (~reset[t]).to(h.dtype).unsqueeze(-1)
        i_r, i_z, i_n = (x[t] @ w_ih.t() + b_ih).chunk(3, dim=-1)
        h_r, h_z, h_n = (h @ w_hh.t() + b_hh).chunk(3, dim=-1)
        r = torch.sigmoid(i_r + h_r)
        z = torch.sigmoid(i_z + h_z)
        n = torch.tanh(i_n + r * h_n)
        h = (1 - z) * n + z * h
        ys.append(h)
    return torch.stack(ys), h
