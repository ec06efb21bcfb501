"""Delta LSTM core: a fast LSTM with six delta-rule weight matrices.

Paper 000 (RFWP), App. A.2, version D (Eq. 36-40), the version the paper
reports (Table 1): tied input/forget gates, no squashing of the main
transformation, all six fast matrices (W_u, W_f, W_o for the query, R_u,
R_f, R_o for the recurrent query softmax(y_{t-1})) written by their own
delta rule with separate keys, values and learning rates (footnote 3 of the
paper: separate slow weights for each matrix).

Per head the slow net emits ``[q | k_1..k_6 | v_1..v_6 | beta_1..beta_6]``
(13d + 6), matrices in the order of
:data:`fwrl.kernels.delta_lstm.naive.MATRICES`. Queries and keys use
softmax (the only feature map offered: the recurrent query is a softmax, and
the six matrices share one square shape). The recurrence runs in
:func:`fwrl.kernels.delta_lstm.delta_lstm`. The paper reports no Atari run of
this core; with the Atari defaults the agent has about 1.85 M parameters.
"""

from __future__ import annotations

from typing import Literal

from torch import Tensor

from fwrl.kernels.delta_lstm import delta_lstm
from fwrl.kernels.delta_lstm.naive import MATRICES
from fwrl.kernels.dispatch import kernel_layer_name
from fwrl.memory_modules.base import Core, State, register_core
from fwrl.memory_modules.fwp_block import FastWeightLayer, FWPConfig, FWPTransformerCore
from fwrl.utils.settings import redefault


class DeltaLSTMConfig(FWPConfig):
    """FWPConfig with softmax queries and keys (the only choice)."""

    feature_map: Literal["softmax"] = redefault(FWPConfig, "feature_map", "softmax")


class DeltaLSTMLayer(FastWeightLayer):
    """One Delta LSTM layer; state ``W`` [B, H, 6, d, d], ``c`` and ``y`` [B, H, d]."""

    def __init__(self, config: FWPConfig):
        super().__init__()
        d = config.head_dim
        self.num_matrices = len(MATRICES)
        self._add_slow_net(config, per_head=d + self.num_matrices * (2 * d + 1))

    def initial_state(self, batch_size: int, device=None) -> State:
        H, d, M = self.num_heads, self.head_dim, self.num_matrices
        return self._zero_state(batch_size, device, W=(H, M, d, d), c=(H, d), y=(H, d))

    def forward(self, x: Tensor, state: State, done: Tensor) -> tuple[Tensor, State]:
        T, B, _ = x.shape
        H, d, M = self.num_heads, self.head_dim, self.num_matrices
        p = self._per_head(x)
        # split, not slices: the backward of a split is one concatenation, where each slice's writes a
        # zero tensor the size of p
        q, k, v, beta = p.split([d, M * d, M * d, M], dim=-1)
        k, v = k.reshape(T, B, H, M, d), v.reshape(T, B, H, M, d)
        y, W, c, y_last = delta_lstm(
            q, k, v, beta, state["W"], state["c"], state["y"], done, grad_mode=self.grad_mode,
            layer=kernel_layer_name(self),
        )
        return y.reshape(T, B, self.out_size), {"W": W, "c": c, "y": y_last}


@register_core(
    "delta_lstm",
    DeltaLSTMConfig,
    "Delta LSTM: fast LSTM with six delta-rule matrices (RFWP paper App. A.2, Eq. 36-40)",
)
def build_delta_lstm(input_size: int, config: DeltaLSTMConfig) -> Core:
    return FWPTransformerCore(input_size, config, lambda cfg, i: DeltaLSTMLayer(cfg))
