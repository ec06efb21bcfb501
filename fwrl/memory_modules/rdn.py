"""Recurrent Delta Net (RDN) core: the Delta Net's slow net also reads the past.

Paper 000 (RFWP), Sec. 3.2, Eq. 15-18: the query, key, value and learning rate
of each head get a recurrent term from the previous fast-net output h_{t-1}:

    s_t = tanh(h_{t-1})
    q_t = softmax(W_q x_t + R_q s_t)            (Eq. 17)
    k_t = softmax(W_k x_t + R_k s_t)            (Eq. 15)
    v_t = W_v x_t + R_v s_t                     (Eq. 16)
    beta_t = sigmoid(W_b x_t + r_b . s_t)       (Eq. 18)

then the delta rule of the Delta Net (paper 001 Eq. 20-25), h_t = W_t q_t.
``W_q, W_k, W_v, W_b`` are the per-head slices of ``slow_net`` (one GEMM over
the whole sequence); ``R_q, R_k, R_v`` [H, d, d] and ``r_b`` [H, d] are per head
and enter the recurrence (:func:`fwrl.kernels.rdn.rdn`).

Initialisation (PAPERS.md §2): R_q, R_k, R_v, r_b ~ N(0, 1/sqrt(d)), read as
mean 0 and *standard deviation* 1/sqrt(d) (variance 1/d): with s in (-1, 1)^d
this keeps R s of order one, like PyTorch's own fan-in scaling.
Everything else uses PyTorch defaults.

Atari (RFWP paper Sec. 4.4): the defaults (2 layers, hidden 128, 4 heads of
32, feed-forward 512) give a 1.5 M-parameter agent. The larger RDN of the
paper (3.4 M parameters) is
``--core rdn --core-opt num_layers=4 hidden_size=256 num_heads=8 head_dim=32``
(feed-forward stays 512).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor, nn

from fwrl.kernels.dispatch import kernel_layer_name
from fwrl.kernels.feature_maps import feature_dim
from fwrl.kernels.rdn import rdn
from fwrl.memory_modules.base import Core, State, normal_init_, register_core
from fwrl.memory_modules.fwp_block import FastWeightLayer, FWPConfig, FWPTransformerCore
from fwrl.memory_modules.linear_transformer import FEATURE_MAP_CHOICES
from fwrl.utils.settings import redefault

class RDNConfig(FWPConfig):
    """FWPConfig with softmax features by default (PAPERS.md §2)."""

    feature_map: Literal[FEATURE_MAP_CHOICES] = redefault(FWPConfig, "feature_map", "softmax")


class RDNLayer(FastWeightLayer):
    """One RDN layer; state ``W`` [B, H, d, F] and raw output ``h`` [B, H, d]."""

    def __init__(self, config: FWPConfig):
        super().__init__()
        H, d = config.num_heads, config.head_dim
        self.feature_map = config.feature_map
        self.key_dim = feature_dim(config.feature_map, d)
        self._add_slow_net(config, per_head=3 * d + 1)
        self.R_q = nn.Parameter(torch.empty(H, d, d))
        self.R_k = nn.Parameter(torch.empty(H, d, d))
        self.R_v = nn.Parameter(torch.empty(H, d, d))
        self.r_b = nn.Parameter(torch.empty(H, d))
        for p in (self.R_q, self.R_k, self.R_v, self.r_b):
            normal_init_(p, 1.0 / math.sqrt(d))

    def initial_state(self, batch_size: int, device=None) -> State:
        H, d = self.num_heads, self.head_dim
        return self._zero_state(batch_size, device, W=(H, d, self.key_dim), h=(H, d))

    def forward(self, x: Tensor, state: State, done: Tensor) -> tuple[Tensor, State]:
        T, B, _ = x.shape
        d = self.head_dim
        p = self._per_head(x)
        # split, not slices: its backward is one concatenation, a slice's a zero tensor the size of p
        q, k, v, beta = p.split([d, d, d, 1], dim=-1)
        y, W, h = rdn(
            q, k, v, beta.squeeze(-1),
            self.R_q, self.R_k, self.R_v, self.r_b, state["W"], state["h"], done,
            feature_map=self.feature_map, grad_mode=self.grad_mode,
            layer=kernel_layer_name(self),
        )
        return y.reshape(T, B, self.out_size), {"W": W, "h": h}


@register_core(
    "rdn",
    RDNConfig,
    "Recurrent Delta Net (RFWP paper Eq. 15-18); larger Atari RDN: "
    "num_layers=4 hidden_size=256 num_heads=8 head_dim=32",
)
def build_rdn(input_size: int, config: RDNConfig) -> Core:
    return FWPTransformerCore(input_size, config, lambda cfg, i: RDNLayer(cfg))
