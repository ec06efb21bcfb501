"""Delta RNN core: a fast RNN whose two weight matrices follow delta rules.

Paper 000 (RFWP), Sec. 3.1, Eq. 12 (version B, App. A.2):

    y_t = W_t phi(q_t) + R_t f(y_{t-1})

W_t is written as in the Delta Net (paper 001 Eq. 20-24) with (q, k, v, beta);
the recurrent fast matrix R_t [d, d] by its own delta rule with (k_r, v_r,
beta_r). f = softmax (denominator + 1e-6). Per head the slow net emits
``[q | k | v | beta | k_r | v_r | beta_r]`` (5d + 2). phi = softmax by
default (PAPERS.md §2). The recurrence runs in
:func:`fwrl.kernels.delta_rnn.delta_rnn`. Atari agent: 1.6 M parameters.
"""

from __future__ import annotations

from typing import Literal

from torch import Tensor

from fwrl.kernels.delta_rnn import delta_rnn
from fwrl.kernels.dispatch import kernel_layer_name
from fwrl.kernels.feature_maps import feature_dim
from fwrl.memory_modules.base import Core, State, register_core
from fwrl.memory_modules.fwp_block import FastWeightLayer, FWPConfig, FWPTransformerCore
from fwrl.memory_modules.linear_transformer import FEATURE_MAP_CHOICES
from fwrl.utils.settings import redefault


class DeltaRNNConfig(FWPConfig):
    """FWPConfig with softmax features by default; phi applies to q and k of W only."""

    feature_map: Literal[FEATURE_MAP_CHOICES] = redefault(FWPConfig, "feature_map", "softmax")


class DeltaRNNLayer(FastWeightLayer):
    """One Delta RNN layer; state ``W`` [B,H,d,F], ``R`` [B,H,d,d], ``h`` [B,H,d]."""

    def __init__(self, config: FWPConfig):
        super().__init__()
        self.feature_map = config.feature_map
        self.key_dim = feature_dim(config.feature_map, config.head_dim)
        self._add_slow_net(config, per_head=5 * config.head_dim + 2)

    def initial_state(self, batch_size: int, device=None) -> State:
        H, d = self.num_heads, self.head_dim
        return self._zero_state(batch_size, device, W=(H, d, self.key_dim), R=(H, d, d), h=(H, d))

    def forward(self, x: Tensor, state: State, done: Tensor) -> tuple[Tensor, State]:
        T, B, _ = x.shape
        d = self.head_dim
        p = self._per_head(x)
        # split, not slices: its backward is one concatenation, a slice's a zero tensor the size of p
        q, k, v, beta, kr, vr, betar = p.split([d, d, d, 1, d, d, 1], dim=-1)
        beta, betar = beta.squeeze(-1), betar.squeeze(-1)
        y, W, R, h = delta_rnn(
            q, k, v, beta, kr, vr, betar, state["W"], state["R"], state["h"], done,
            feature_map=self.feature_map, grad_mode=self.grad_mode,
            layer=kernel_layer_name(self),
        )
        return y.reshape(T, B, self.out_size), {"W": W, "R": R, "h": h}


@register_core(
    "delta_rnn",
    DeltaRNNConfig,
    "Delta RNN: fast RNN with delta-rule W and R (RFWP paper Eq. 12), Transformer block",
)
def build_delta_rnn(input_size: int, config: DeltaRNNConfig) -> Core:
    return FWPTransformerCore(input_size, config, lambda cfg, i: DeltaRNNLayer(cfg))
