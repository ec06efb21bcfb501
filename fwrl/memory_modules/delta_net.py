"""Delta Net core: a fast-weight programmer with the delta rule.

Paper 001 (Schlag et al. 2021), Sec. 4.2, Eq. 20-25: per head the slow net
emits ``[q | k | v | beta]``; the fast matrix corrects the value currently
stored under the key instead of adding to it:

    vbar_t = W_{t-1} phi(k_t)                                   (Eq. 20)
    W_t    = W_{t-1} + sigmoid(beta_t) (v_t - vbar_t) phi(k_t)^T  (Eq. 21-24)
    y_t    = W_t phi(q_t)                                       (Eq. 25)

phi as for the Linear Transformer (``elu1_sumnorm`` default, sum-normalised,
Eq. 29; ``softmax``; ``dpfp-1/2/3``, Eq. 37). Atari agent: 1.5 M parameters.
"""

from __future__ import annotations

from typing import ClassVar

from fwrl.memory_modules.base import Core, register_core
from fwrl.memory_modules.fwp_block import FWPTransformerCore
from fwrl.memory_modules.linear_transformer import LinearTransformerConfig, SlowNetFastWeightLayer


class DeltaNetConfig(LinearTransformerConfig):
    """Same options as the Linear Transformer (feature map default elu1_sumnorm); small heads behind
    the Atari stems (the delta rule's state is bounded, and its first updates are gentle with them)."""

    small_heads_on_atari: ClassVar[bool] = True


@register_core(
    "delta_net",
    DeltaNetConfig,
    "Delta Net: delta-rule fast weights (paper 001 Eq. 20-25), Transformer block",
)
def build_delta_net(input_size: int, config: DeltaNetConfig) -> Core:
    return FWPTransformerCore(input_size, config, lambda cfg, i: SlowNetFastWeightLayer(cfg, "delta"))
