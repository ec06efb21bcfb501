"""Sum rule (Linear Transformer) and delta rule (Delta Net), paper 001 Eq. 20-25: ``delta_rule``."""

from __future__ import annotations

from torch import Tensor

from fwrl.kernels.dispatch import Fused, dispatch

from .cpu import delta_rule_cpu
from .naive import delta_rule_reference


def delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor | None,
    W0: Tensor,
    reset: Tensor,
    *,
    rule: str = "delta",
    feature_map: str = "elu1_sumnorm",
    grad_mode: str = "full",
    layer: str | None = None,
) -> tuple[Tensor, Tensor]:
    """Sum / delta rule over a whole sequence (paper 001 Eq. 20-25; see ``naive``)."""
    return dispatch(
        "delta_rule", delta_rule_reference, _fused, (q, k, v, beta, W0, reset),
        dict(rule=rule, feature_map=feature_map, grad_mode=grad_mode), (q, k, v),
        "the delta-rule kernel cannot run", layer, cpu=delta_rule_cpu,
    )


def _fused() -> Fused:
    from .fused_recurrent import delta_rule_triton, supports

    return Fused(delta_rule_triton, supports)
