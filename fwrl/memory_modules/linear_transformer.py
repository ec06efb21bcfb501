"""Linear Transformer core: a fast-weight programmer with the sum rule.

Paper 001 (Schlag et al. 2021), Sec. 3: a linear Transformer layer is a fast
weight programmer. Per head, the slow net (one Linear, no bias) emits
``[q | k | v]`` and the fast weight matrix is written by the sum rule and read
after the write (Eq. 17 and 19):

    W_t = W_{t-1} + v_t phi(k_t)^T
    y_t = W_t phi(q_t)

with the denominator of Eq. 18-19 replaced by sum normalisation of phi
(Eq. 29), as the RL runs did (PAPERS.md §2). phi: ``elu1_sumnorm`` (ELU + 1,
Eq. 30, then Eq. 29; default), ``softmax`` or ``dpfp-1/2/3`` (Eq. 37).

The layer sits in the shared Transformer-style block
(:class:`~fwrl.memory_modules.fwp_block.FWPTransformerCore`). Atari defaults
(RFWP paper Sec. 4.4): 2 layers, hidden 128, 4 heads of 32, feed-forward 512;
the whole agent has 1.5 M parameters.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
from torch import Tensor, nn

from fwrl.kernels.delta_rule import delta_rule
from fwrl.kernels.dispatch import kernel_layer_name
from fwrl.kernels.feature_maps import feature_dim
from fwrl.memory_modules.base import Core, State, register_core
from fwrl.memory_modules.fwp_block import FastWeightLayer, FWPConfig, FWPTransformerCore
from fwrl.utils.settings import redefault

# The feature maps a user can pick for LT / Delta Net (``identity`` is for tests).
FEATURE_MAP_CHOICES = ("elu1_sumnorm", "softmax", "dpfp-1", "dpfp-2", "dpfp-3")


class LinearTransformerConfig(FWPConfig):
    """FWPConfig with the feature maps of paper 001 (Sec. 5) as choices."""

    feature_map: Literal[FEATURE_MAP_CHOICES] = redefault(FWPConfig, "feature_map", "elu1_sumnorm")
    # The sum rule's state only grows: with small heads at scale 1 the first update on Pong frames
    # (tests/learning/test_learning_stability.py, nature stem) moves the value by 1.13 and it drifts
    # 4.2 from the returns (every other fast-weight core: 0.62-0.73 and 1.4-1.8; at 0.1: 0.55 / 2.0).
    small_heads_on_atari: ClassVar[bool] = False


class SlowNetFastWeightLayer(FastWeightLayer):
    """A feed-forward slow net programming one fast matrix per head (LT, Delta Net).

    ``rule="sum"``: per-head slice ``[q | k | v]`` (3d), sum rule (paper 001 Eq. 17).
    ``rule="delta"``: per-head slice ``[q | k | v | beta]`` (3d + 1), delta rule
    (paper 001 Eq. 20-25). The recurrence runs through
    :func:`fwrl.kernels.delta_rule.delta_rule` over the whole sequence.
    State: ``W`` [B, H, d, F] with F = feature size of phi.
    """

    def __init__(self, config: FWPConfig, rule: str):
        super().__init__()
        self.rule = rule
        self.num_heads = config.num_heads
        self.head_dim = config.head_dim
        self.feature_map = config.feature_map
        self.grad_mode = config.grad_mode
        self.key_dim = feature_dim(config.feature_map, config.head_dim)
        self.per_head = 3 * config.head_dim + (1 if rule == "delta" else 0)
        self.slow_net = nn.Linear(config.hidden_size, config.num_heads * self.per_head, bias=False)
        self.out_size = config.num_heads * config.head_dim

    def initial_state(self, batch_size: int, device=None) -> State:
        shape = (batch_size, self.num_heads, self.head_dim, self.key_dim)
        return {"W": torch.zeros(shape, device=device, dtype=self.slow_net.weight.dtype)}

    def forward(self, x: Tensor, state: State, done: Tensor) -> tuple[Tensor, State]:
        T, B, _ = x.shape
        d = self.head_dim
        p = self.slow_net(x).view(T, B, self.num_heads, self.per_head)
        # split, not slices: its backward is one concatenation, a slice's a zero tensor the size of p
        q, k, v, *rest = p.split([d, d, d] + ([1] if self.rule == "delta" else []), dim=-1)
        beta = rest[0].squeeze(-1) if rest else None
        y, W = delta_rule(
            q, k, v, beta, state["W"], done,
            rule=self.rule, feature_map=self.feature_map, grad_mode=self.grad_mode,
            layer=kernel_layer_name(self),
        )
        return y.reshape(T, B, self.out_size), {"W": W}


@register_core(
    "linear_transformer",
    LinearTransformerConfig,
    "Linear Transformer: sum-rule fast weights (paper 001 Eq. 17, 29), Transformer block",
)
def build_linear_transformer(input_size: int, config: LinearTransformerConfig) -> Core:
    return FWPTransformerCore(input_size, config, lambda cfg, i: SlowNetFastWeightLayer(cfg, "sum"))
